"""Per-stage GPU memory (GiB, 2**30 bytes).

- Weights, gradients, optimizer state: bytes per parameter from Megatron-LM's distributed
  optimizer table (see `JobSpec`), optimizer state divided by DP with the distributed optimizer.
- Activations per layer per micro-batch: Korthikanti et al. 2022, Sec. 4 and Table 2, generalized
  term by term to grouped-query attention and gated MLPs (for a GPT block it reduces exactly to
  their sbh(10 + 24/t + 5as/(ht)), sbh(34 + 5as/h)/t with sequence parallelism, 34sbh/t or
  sbh(10 + 24/t) with selective recompute, and 2sbh for full recompute, /t with SP).
- Micro-batches in flight per stage come from walking the schedule's own order
  (1F1B: min(p - s, m); GPipe: m; interleaved: Megatron's warm-up count), chunk by chunk.
- Embedding stage: the embedding dropout mask; output stage: final norm and projection inputs and
  fp32 logits for the loss, 4sbh/t (1 + V/h) with SP (Korthikanti et al. Sec. 4.3).
- Working memory: full recompute rebuilds one layer's activations during its backward.
- Allowance: `Overheads.context_gib` plus `Overheads.fragmentation` times the tensors counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import Shape
from .schedule import CompiledSchedule
from .specs import JobSpec, ModelSpec, Options

GIB = float(2 ** 30)


def layer_activation_bytes(model: ModelSpec, job: JobSpec, shape: Shape,
                           recompute: str | None = None) -> float:
    """Stored activations of one transformer layer for one micro-batch on one GPU."""
    recompute = shape.recompute if recompute is None else recompute
    s, b, h, t = job.seq_length, shape.micro_batch, model.hidden_size, shape.tp
    sp = shape.sequence_parallel
    scale = job.activation_bytes / 2  # Korthikanti et al. count 2-byte activations
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sp else 1) * scale
    kv = model.kv_dim / h
    ffn = model.ffn_hidden_size / h
    # replicated across TP ranks unless sequence parallel: two norm inputs (2+2), QKV input (2),
    # MLP input (2), two dropout masks (1+1)
    replicated = 10 * sbh
    # split across TP ranks: Q (2), K and V (2 kv each), output-projection input (2),
    # MLP activation input (2 ffn; gated: gate and up outputs, 4 ffn) and down-projection input
    split = sbh * (2 + 4 * kv + 2 + (4 if model.gated_mlp else 2) * ffn + 2 * ffn)
    attn = 5 * model.num_heads * s * s * b  # softmax out (2), dropout mask (1) and out (2)
    total = replicated / (t if sp else 1) + split / t
    if recompute == "none":
        total += attn / t
    return total * scale


@dataclass(frozen=True)
class StageMemory:
    """One GPU of one pipeline stage, GiB."""

    weights_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    inflight: tuple[int, ...]  # micro-batches stored per chunk at the peak
    working_gib: float
    allowance_gib: float

    @property
    def total_gib(self) -> float:
        return (self.weights_gib + self.grads_gib + self.optimizer_gib + self.activations_gib
                + self.working_gib + self.allowance_gib)


class MemoryModel:
    """Memory per stage as a function of the layer split; linear in the layer counts for a
    fixed schedule, which the MILP relies on (`coefficients`)."""

    def __init__(self, model: ModelSpec, job: JobSpec, shape: Shape, cs: CompiledSchedule,
                 options: Options):
        self.model, self.job, self.shape, self.cs, self.options = model, job, shape, cs, options
        s, b, h, t = job.seq_length, shape.micro_batch, model.hidden_size, shape.tp
        sp_div = t if shape.sequence_parallel else 1
        scale = job.activation_bytes / 2
        self.act_layer = layer_activation_bytes(model, job, shape)
        self.emb_act = s * b * h / sp_div * scale  # embedding dropout mask
        # final norm input, projection input, fp32 logits for the loss
        self.head_act = (4 * s * b * h / sp_div + 4 * s * b * model.vocab_size / t) * scale
        if shape.recompute == "full":
            self.work = layer_activation_bytes(model, job, shape, "none")
        elif shape.recompute == "selective":
            self.work = 5 * model.num_heads * s * s * b / t * scale
        else:
            self.work = 0.0
        opt_div = shape.dp if shape.distributed_optimizer else 1
        self.bytes_per_param = (job.weight_bytes, job.grad_bytes, job.optimizer_bytes / opt_div)

    def chunk_act_bytes(self, j: int, layers: int) -> float:
        a = layers * self.act_layer
        if j == 0:
            a += self.emb_act
        if j == self.shape.num_virtual - 1:
            a += self.head_act
        return a

    def stage(self, s: int, params: float, layers: tuple[int, ...]) -> StageMemory:
        sh = self.shape
        chunk_bytes = [self.chunk_act_bytes(c * sh.pp + s, layers[c * sh.pp + s])
                       for c in range(sh.chunks)]
        best, best_counts, best_work = -1.0, None, 0.0
        for kind, _c, counts in self.cs.inflight_profile(s):
            act = float(sum(n * cb for n, cb in zip(counts, chunk_bytes)))
            work = self.work if kind == "B" else 0.0
            if act + work > best:
                best, best_counts, best_work = act + work, tuple(int(x) for x in counts), work
        wb, gb, ob = self.bytes_per_param
        tensors = params * (wb + gb + ob) + best
        o = self.options.overheads
        return StageMemory(params * wb / GIB, params * gb / GIB, params * ob / GIB,
                           (best - best_work) / GIB, best_counts, best_work / GIB,
                           o.context_gib + o.fragmentation * tensors / GIB)
