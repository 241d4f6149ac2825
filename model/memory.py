"""Per-stage GPU memory (GiB, 2**30 bytes).

- Weights, gradients, optimizer state: bytes per parameter from the framework's table
  (`param_bytes`: Megatron-LM's distributed-optimizer table, DeepSpeed's ZeRO table, FSDP2's fp32
  shards), divided by the shard group as the ZeRO stage says; ZeRO-3 adds the gathered layer,
  the prefetched one and a layer's full gradient, and Megatron-FSDP (ZeRO-2/3) its double
  buffers of two layers each for gathered weights and reduced gradients
  (`megatron_fsdp_units`).
  FP8 adds Transformer Engine's cached FP8 weight copies per linear-layer weight: the FP8
  weight and its transpose (1 byte each) on Hopper, the one copy on Blackwell, row- and
  column-wise copies with their scales for the block recipes (model/fp8.py `Fp8Bytes`).
- Activations per layer per micro-batch: Korthikanti et al. 2022, Sec. 4 and Table 2, tensor by
  tensor (`layer_tensors`), generalized to grouped-query attention and gated MLPs. For a GPT
  block with eager attention it reduces exactly to their sbh(10 + 24/t + 5as/(ht)),
  sbh(34 + 5as/h)/t with sequence parallelism, 34sbh/t or sbh(10 + 24/t) with selective
  recompute, and 2sbh for full recompute (/t with SP).
  - FlashAttention never stores the s x s scores (the 5as/h term), only the per-row log-sum-exp
    in fp32 (4 bytes x heads x s x b / t); recomputing the attention core ("selective") then
    frees nothing but that.
  - A model trained without dropout (Llama family) stores no dropout masks.
  - FP8 saves each linear layer's input as its 1-byte cast (Transformer Engine saves the FP8
    input for the weight gradient; the block recipes their scales beside it: model/fp8.py);
    the attention output is kept in 16 bits as well for the attention backward.
- Micro-batches in flight per stage come from walking the schedule's own order
  (1F1B: min(p - s, m); GPipe: m; interleaved: Megatron's warm-up count), chunk by chunk.
- Embedding stage: the embedding dropout mask (and the input of an embedding norm); output
  stage: final norm and projection inputs and fp32 logits for the loss (Korthikanti et al.
  Sec. 4.3: 4sbh/t (1 + V/h) with SP; what each framework's loss keeps, LOSS_BYTES_PER_LOGIT),
  and the loss step's peak.
  DeepSpeed's pipeline engine also keeps every in-flight micro-batch's stage output (2sbh; the
  logits on the last stage) and, without TP, its received input beside the clone it runs on.
- Working memory: full recompute rebuilds one layer's activations during its backward;
  selective recompute with eager attention rebuilds one layer's scores.
- Allowance: `Overheads.context_gib` plus `Overheads.fragmentation` times the tensors counted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .communication import deepep_buffer_bytes, hybridep_buffer_bytes
from .fp8 import Fp8Bytes
from .plan import (Shape, deepspeed_pipe_partitioned, dispatch_tokens, layer_params,
                   num_microbatches)
from .schedule import CompiledSchedule
from .specs import JobSpec, ModelSpec, Options, Overheads

GIB = float(2 ** 30)
# Bytes per logit of the loss step, from the 16-bit logits to the end of their backward, as
# (kept from the forward to the backward, peak over the step):
# - torchtitan (loss_fn: F.cross_entropy(pred.flatten(0, 1).float()), pred deleted before the
#   backward), measured by probe/loss_memory.py (tests/test_probe.py holds these figures to the
#   installed PyTorch). Eager, ATen's log_softmax and nll_loss keep the fp32 log-softmax and
#   peak in the backward beside the nll and log-softmax gradients (3 x 4); TP's loss_parallel
#   (torch/distributed/tensor/parallel/loss.py) also materializes zeros_like(x), exp(x) and
#   their sum before the product (4 x 4). Under torch.compile (torchtitan's default since
#   v0.1.0) the loss keeps the 16-bit logits and recomputes the rest;
# - Megatron-LM (unfused vocab_parallel_cross_entropy, its default), measured by
#   bench/activation_memory.py on Megatron-LM's own function: the fp32 copy it works on in
#   place (4) beside the caller's bf16 logits (2); in the backward the fp32 gradient (the
#   softmax's storage) and its cast to the logits' dtype (4 + 2). Its fused native path
#   (--cross-entropy-loss-fusion, JobSpec.fused_loss) keeps 4 and peaks at 10 (torch.compile'd
#   helpers, not in place), measured by the same bench.
# DeepSpeed (Megatron-DeepSpeed's older copy of Megatron's function) is not measured: its kept
# fp32 logits only (Korthikanti et al. Sec. 4.3).
LOSS_BYTES_PER_LOGIT = {
    "torchtitan": (4.0, 12.0), "torchtitan-loss-parallel": (4.0, 16.0),
    "torchtitan-compiled": (2.0, 4.0), "torchtitan-compiled-loss-parallel": (4.0, 10.0),
    "megatron": (4.0, 6.0), "megatron-fused": (4.0, 10.0), "deepspeed": (4.0, 4.0),
}


def loss_path(job: JobSpec, shape: Shape) -> str:
    """The key of LOSS_BYTES_PER_LOGIT the job's loss runs."""
    if job.framework != "torchtitan":
        return job.framework + ("-fused" if job.fused_loss else "")
    return ("torchtitan" + ("-compiled" if job.loss_compiled else "")
            + ("-loss-parallel" if shape.tp > 1 else ""))


def param_bytes(job: JobSpec, shape: Shape) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes per parameter on one GPU.

    - Megatron-LM and DeepSpeed: the framework's mixed-precision table (`JobSpec`).
    - torchtitan (FSDP2 with bf16 compute): the sharded parameters are the fp32 master copy,
      gradients are fp32 (reduce_dtype float32), Adam keeps two fp32 moments: 4 + 4 + 8
      (PyTorch FSDP2 fully_shard with MixedPrecisionPolicy; torchtitan's defaults).
    - Sharding (ZeRO, Rajbhandari et al. 2020 Sec. 5; FSDP): stage 1 divides the optimizer
      state by the shard group, stage 2 also the gradients, stage 3 also the weights; the
      shard group is the whole data-parallel group, or `shard_size` ranks with HSDP.
    """
    if job.framework == "torchtitan":
        w, g, o = 4.0, 4.0, 8.0
    else:
        w, g, o = float(job.weight_bytes), float(job.grad_bytes), float(job.optimizer_bytes)
    d = shape.shard_group if shape.zero else 1
    w, g, o = (w / d if shape.zero >= 3 else w, g / d if shape.zero >= 2 else g,
               o / d if shape.zero >= 1 else o)
    if keeps_unsharded(job, shape):
        # ... plus the gathered bf16 weights and their unsharded gradients, accumulated over
        # the micro-batches in the reduce dtype (fp32; FSDP2's FSDPParam accumulates unsharded
        # gradients in reduce_dtype when gradient sync is off)
        w, g = w + gathered_weight_bytes(job), g + job.reduce_bytes
    return w, g, o


def keeps_unsharded(job: JobSpec, shape: Shape) -> bool:
    """torchtitan with FSDP2 and pipeline parallelism does not reshard after the forward
    (reshard_after_forward off when PP is on: torchtitan/models/llama/parallelize_llama.py,
    apply_fsdp), so each stage gathers its weights once per step and keeps them, and their
    gradients, unsharded until the step's single reduce-scatter."""
    return job.framework == "torchtitan" and shape.zero >= 3 and shape.pp > 1


def fp8_params_apply(job: JobSpec, shape: Shape) -> bool:
    """Whether the plan keeps its FP8 linear weights in FP8 only (JobSpec.fp8_param_gather):
    FP8 linear layers and Megatron-LM's distributed optimizer (arguments.py asserts it)."""
    return job.fp8_param_gather and shape.fp8 and shape.zero in (1, 2)


def fp8_param_gather_note(job: JobSpec, shape: Shape) -> str | None:
    """The line that says a job's FP8 weights do not apply to a plan (no FP8, or no
    distributed optimizer: `fp8_params_apply`), or None: the flag applies where it can, and a
    plan it does not reach is priced, and emitted, with 16-bit weights."""
    if not job.fp8_param_gather or fp8_params_apply(job, shape):
        return None
    return ("fp8_param_gather: the plan has no FP8 or no distributed optimizer, so its "
            "weights stay 16-bit, as priced (the flag applies to plans with both)")


def fp8_weight_copy_bytes(job: JobSpec, shape: Shape, fb: Fp8Bytes | None) -> float:
    """Bytes per linear-layer weight on top of the 16-bit weight (`param_bytes`):
    - Transformer Engine caches the FP8 weight copies (Megatron-LM, NeMo): `fb.weight_copy`,
      the weight and its transpose on Hopper, 2 (model/fp8.py);
    - with FP8 parameters (--fp8-param-gather: the weight is a Transformer Engine Float8Tensor
      created under fp8_model_init, its 1-byte data plus, on Hopper, the 1-byte transpose the
      backward uses; MXFP8's two copies with their scales) these bytes are the weight: no
      16-bit copy, so 2 - 2 = 0 on top on Hopper, 1 - 2 with the per-tensor recipes on
      Blackwell, 2 + 2/32 - 2 with MXFP8. The fp32 main weight stays in the distributed
      optimizer's state (optimizer bytes, unchanged);
    - torchao's float8 (torchtitan) casts each weight when used, caching nothing across
      micro-batches: 0."""
    if not shape.fp8 or not job.transformer_engine or fb is None:
        return 0.0
    if fp8_params_apply(job, shape):
        return fb.weight_copy - job.weight_bytes
    return fb.weight_copy


def gathered_weight_bytes(job: JobSpec) -> int:
    """Bytes per parameter a ZeRO-3 / FSDP all-gather moves and materializes: the compute
    precision (FSDP2's param_dtype bf16; Megatron-FSDP and DeepSpeed gather 16-bit weights),
    4 for fp32 training."""
    return 4 if job.precision == "fp32" else 2


def megatron_fsdp_units(zero: int, layers: int) -> tuple[int, int]:
    """(layers of weights gathered whole, layers of unsharded gradients held) at Megatron-FSDP's
    peak, as the emitted runs set it up: with its double buffer (--fsdp-double-buffer, which
    NVIDIA's Megatron-Bridge performance recipes turn on for Megatron-FSDP, and NCCL user
    buffers force), two persistent buffers of FSDP units (transformer layers) for the gathered
    weights and two for the gradients being reduce-scattered: the prefetch stops and the
    reduce-scatter queue waits where a third unit would be needed
    (megatron_fsdp/param_and_grad_buffer.py AllGatherPipeline.all_gather_params
    need_skip_prefetch, GradReducePipeline._enforce_double_buffer_limit). Without it the
    prefetch runs to half a communication unit of max(1e9, 2 layers) elements and the queue to
    one (4 layers of weights, 5 of gradients for Llama-3 8B at TP 1), which is not priced
    (formats/megatron_args.py refuses such a log). ZeRO-2 keeps whole weights, so gathers
    none. At most the model's `layers`."""
    return (min(layers, 2) if zero >= 3 else 0), min(layers, 2)


def layer_tensors(model: ModelSpec, job: JobSpec, shape: Shape, fp8_saved_bytes: float = 1.0
                  ) -> list[tuple[str, float, bool]]:
    """Tensors one layer stores for its backward without recompute, per micro-batch, as
    (name, bytes per token of the sequence x micro-batch, split across TP ranks?). Tensors not
    split are replicated on every TP rank unless sequence parallelism splits them too;
    attention scores are returned separately by `attention_score_bytes`.
    `fp8_saved_bytes`: what an FP8 linear layer keeps of an input element (model/fp8.py
    `Fp8Bytes.saved_input`: 1, and the scales of the block recipes)."""
    h = model.hidden_size
    a16 = float(job.activation_bytes)  # 2 bytes in Korthikanti et al.'s count
    lin = fp8_saved_bytes if shape.fp8 else a16  # what a linear layer keeps of its input
    ffn = model.ffn_hidden_size
    gated = 2 if model.gated_mlp else 1
    out = [
        ("norm1 input", a16 * h, False),
        ("qkv input", lin * h, False),
        ("q", a16 * model.q_dim, True),
        ("k, v", a16 * model.kv_widths, True),
        ("attention output", a16 * model.o_dim + (lin * model.o_dim if shape.fp8 else 0.0),
         True),
        ("norm2 input", a16 * h, False),
    ]
    if model.is_mla:  # the latents (norm inputs) and the up projections' inputs, whole per
        # TP rank; with SP each rank's 1/t sequence shard (Megatron-LM's
        # multi_latent_attention.py: "kv_compressed: [s / TP, b, kv_lora_rank]", the
        # column-parallel up projections keeping their local input and gathering it again)
        ql, kvl = model.mla_q_lora_rank, model.mla_kv_lora_rank
        out += [("kv latent", a16 * (kvl + model.mla_qk_rope_dim) + lin * kvl, False)]
        if ql:
            out += [("q latent", (a16 + lin) * ql, False)]
    if model.is_moe:  # per token: the router's input and fp32 probabilities, and k copies
        # k routed copies per token, times the capacity factor (padded expert inputs)
        k = model.moe_topk * job.moe_capacity_factor
        fe, fs = model.expert_ffn, model.moe_shared_experts * model.expert_ffn
        # the routed copies an expert-TP group holds: with expert TP = TP and sequence
        # parallelism each TP rank gathers its group's tokens (etp x its 1/t share). The
        # router's probabilities multiply the activation's output inside the expert MLP
        # (megatron/core/transformer/moe/experts.py, TEGroupedMLP bias_act_func), so the
        # combine keeps no copy of the experts' outputs for their gradient
        g = shape.expert_tp if shape.sequence_parallel else 1
        # the router is no Transformer Engine layer: it keeps its 16-bit input under FP8 too
        # (moe_utils.py RouterGatingLinearFunction.forward: save_for_backward(inp, ...))
        out += [("router input", a16 * h, False),
                ("router probabilities", 4.0 * model.num_experts, False),
                ("expert inputs", lin * h * k * g, False),
                ("expert activation inputs", a16 * gated * fe * k, True),
                ("expert fc2 inputs", lin * fe * k, True)]
        if fs:
            out += [("shared activation input", a16 * gated * fs, True),
                    ("shared fc2 input", lin * fs, True)]
    else:
        out += [
            ("fc1 input", lin * h, False),
            ("activation input", a16 * ffn * gated, True),
            ("fc2 input", lin * ffn, True),
        ]
    if model.dropout:
        out += [("dropout masks", 2.0 * h, False)]  # 1 byte each, after attention and MLP
    if job.attention == "flash":
        # log-sum-exp per query row and head, fp32 (FlashAttention-2 saves it for backward)
        out += [("attention lse", 4.0 * model.num_heads, True)]
    return out


def attention_score_bytes(model: ModelSpec, job: JobSpec, shape: Shape) -> float:
    """Eager attention's stored s x s tensors per layer and micro-batch on one GPU: softmax
    output (2 bytes), and with dropout its mask (1) and output (2): Korthikanti's 5as^2b/t."""
    if job.attention == "flash":
        return 0.0
    per_score = job.activation_bytes / 2 * (5 if model.dropout else 2)
    s, b = job.seq_length, shape.micro_batch  # (context parallelism requires flash)
    return per_score * model.num_heads * s * s * b / shape.tp


def cp_chunk_bytes(model: ModelSpec, job: JobSpec, shape: Shape) -> float:
    """One context-parallel rank's K and V chunk of one layer and micro-batch: b s / cp
    tokens, kv_dim / t channels each in the activation precision (latent attention: its
    up-projected keys and values). torchtitan before v0.2.2 repeats K and V to every query
    head before SDPA (`repeat_kv` in models/llama/model.py at ba24697, 2024-12, to
    models/llama3/model/model.py at v0.2.1; `JobSpec.repeat_kv`): q_dim / t wide each."""
    width = model.kv_widths
    if job.repeat_kv and not model.is_mla:
        width = 2 * model.q_dim
    tokens = shape.micro_batch * job.seq_length // shape.cp
    return tokens * width / shape.tp * job.activation_bytes


def cp_gather_work_bytes(model: ModelSpec, job: JobSpec, shape: Shape) -> float:
    """What torchtitan's context parallelism holds during one layer's attention backward
    (PyTorch's `_templated_ring_attention_backward`; model/costs.py `_cp_exchange_ms`): every
    rank's K/V chunk, gathered (cp chunks; with the alltoall rotation, `Shape.cp_alltoall`,
    the chunk in use and the next: 2), the fp32 K and V gradient accumulators (2 chunks'
    bytes) and the fp32 gradients on their way to and from the neighbours (2 + 2).
    Megatron-LM's p2p ring double-buffers one chunk: not counted."""
    if job.framework != "torchtitan" or shape.cp <= 1:
        return 0.0
    held = 2 if shape.cp_alltoall else shape.cp
    return (held + 6) * cp_chunk_bytes(model, job, shape)


def op_sac_tensors(model: ModelSpec, job: JobSpec, shape: Shape
                   ) -> list[tuple[str, float, bool]]:
    """What torchtitan's per-op selective activation checkpointing keeps of one layer (its
    "selective" mode, selective_ac_option "op"; torchtitan/models/llama/parallelize_llama.py,
    _apply_ac_to_transformer_block): the block's input, the outputs of the attention kernel
    (and its log-sum-exp) and of every other matrix multiply, counted in call order q, k, v,
    o, w1, w3, w2 (the 1st, 3rd, 5th and 7th are kept: q, v, w1, w2), and the outputs of TP's
    reduce-scatters. A row-parallel multiply's output is the full hidden size on every TP rank
    (partial sums before the reduce-scatter).

    Under torch.compile (`job.compile`) the partitioner keeps, of what the policy marks, only
    what the backward reads: the MLP's last multiply (w2) feeds nothing but the residual add,
    so its output is not kept. Measured by bench/activation_memory.py on torchtitan's own
    block (Llama 3 8B proportions, TP 1): 7.78 hidden-size tensors per token eager, 6.78
    compiled, this count to the byte. With TP the w2 output's reduce-scatter feeds only the
    same add and goes the same way (the rule, not measured: one rank)."""
    h, kv, ffn = model.hidden_size, model.kv_dim, model.ffn_hidden_size
    a = float(job.activation_bytes)
    q = model.q_dim
    out = [("block input", a * h, False), ("q", a * q, True), ("v", a * kv, True),
           ("attention output", a * q, True), ("attention lse", 4.0 * model.num_heads, True),
           ("w1 output", a * ffn, True)]
    compiled = job.compile  # (only torchtitan runs per-op SAC; only it may be uncompiled)
    mm_out = [("w2 output", a * h, False)] if model.gated_mlp and not compiled else []
    if shape.tp > 1:
        out += [("reduce-scatter outputs", (1 if compiled else 2) * a * h, False)]
        # the row-parallel output before its reduce-scatter is not split by sequence
        # parallelism either
        mm_out = [(n, b * shape.tp if shape.sequence_parallel else b, f)
                  for n, b, f in mm_out]
    return out + mm_out


def layer_activation_bytes(model: ModelSpec, job: JobSpec, shape: Shape,
                           recompute: str | None = None, fp8_saved_bytes: float = 1.0) -> float:
    """Stored activations of one transformer layer for one micro-batch on one GPU
    (`fp8_saved_bytes`: as `layer_tensors`)."""
    recompute = shape.recompute if recompute is None else recompute
    # context parallelism keeps 1/cp of every sequence's tokens (and their activations)
    s, b, h, t = job.seq_length // shape.cp, shape.micro_batch, model.hidden_size, shape.tp
    sp = shape.sequence_parallel
    tokens = s * b
    if recompute == "full":  # only the layer's input
        return job.activation_bytes * tokens * h / (t if sp else 1)
    if recompute == "selective" and job.framework == "torchtitan":
        return sum(per_token * tokens / (t if (split or sp) else 1)
                   for _n, per_token, split in op_sac_tensors(model, job, shape))
    total = 0.0
    for name, per_token, split in layer_tensors(model, job, shape, fp8_saved_bytes):
        if recompute == "selective" and name == "attention lse":
            continue  # the recomputed core keeps nothing of its own
        total += per_token * tokens / (t if (split or sp) else 1)
    if recompute == "none":
        total += attention_score_bytes(model, job, shape)
    return total


def dispatcher_buffer_gib(model: ModelSpec, job: JobSpec, shape: Shape,
                          nvlink_domain: int) -> float:
    """GiB one GPU holds for the MoE token dispatcher outside PyTorch's allocator, with the
    flex dispatcher and expert parallelism: DeepEP's buffer (communication.
    deepep_buffer_bytes), HybridEP's (hybridep_buffer_bytes, for the tokens a rank
    dispatches: plan.dispatch_tokens; `nvlink_domain` the GPUs of a node, its NVLink
    domain); 0 otherwise
    (NCCL's all-to-all works in the allocator's tensors and the communicator's own buffers,
    inside `Overheads.context_gib`). Charged to every stage: Megatron-Core creates the buffer
    at a stage's first dispatch, so a stage holding only a model's leading dense layers has
    none, which this over-counts (it keeps the memory a constant per stage, as the MILP's
    rows take it; such a stage is rarely the fullest)."""
    if not (model.is_moe and shape.ep > 1 and job.moe_dispatcher != "alltoall"):
        return 0.0
    if job.moe_dispatcher == "deepep":
        return deepep_buffer_bytes(shape.ep, model.hidden_size, job.activation_bytes) / GIB
    return hybridep_buffer_bytes(dispatch_tokens(job, shape), model.hidden_size,
                                 model.num_experts, shape.ep, nvlink_domain) / GIB


def nvlink_domain(cluster) -> int:
    """The GPUs of one NVLink domain the flex dispatchers' buffers are sized for: the
    cluster's node size, the smallest where nodes differ (the dispatchers' groups are
    placed inside a node or over whole nodes: plan.deepep_block_ok)."""
    return min(nd.num_gpus for nd in cluster.node_kinds)


def plan_overheads(model: ModelSpec, job: JobSpec, shape: Shape, options: Options,
                   cluster) -> Overheads:
    """The options' memory overheads for one shape on `cluster`: its dispatcher's buffers
    (dispatcher_buffer_gib) join the CUDA context as memory outside the allocator. What the
    estimator's StageMemory adds, and what every memory check of the search uses."""
    return _with_buffers(options.overheads,
                         dispatcher_buffer_gib(model, job, shape, nvlink_domain(cluster)))


def _with_buffers(o: Overheads, buffer_gib: float) -> Overheads:
    """The overheads with the dispatcher's buffers beside the CUDA context (plan_overheads)."""
    return dataclasses.replace(o, context_gib=o.context_gib + buffer_gib) if buffer_gib else o


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
    context_gib: float = 0.0  # the part of the allowance outside the allocator (Overheads)
    dispatcher_gib: float = 0.0  # of which the MoE dispatcher's buffers (DeepEP)

    @property
    def total_gib(self) -> float:
        return (self.weights_gib + self.grads_gib + self.optimizer_gib + self.activations_gib
                + self.working_gib + self.allowance_gib)

    @property
    def reserved_gib(self) -> float:
        """What PyTorch's caching allocator holds at the peak (torch.cuda.memory_stats
        'reserved_bytes.all.peak', torchtitan's memory monitor): the tensors and the
        fragmentation allowance, without the CUDA context."""
        return self.total_gib - self.context_gib


class MemoryModel:
    """Memory per stage as a function of the layer split; linear in the layer counts for a
    fixed schedule, which the MILP relies on (`layer_static_bytes`, `const_static_bytes`,
    `chunk_act_bytes`)."""

    def __init__(self, model: ModelSpec, job: JobSpec, shape: Shape, cs: CompiledSchedule,
                 options: Options, fp8: Fp8Bytes | None = None, *, cluster):
        """`fp8`: the FP8 recipe's bytes on the plan's GPUs (model/fp8.py
        `cluster_fp8_bytes`), needed where the shape runs FP8 linear layers."""
        self.model, self.job, self.shape, self.cs, self.options = model, job, shape, cs, options
        # `cluster`: the flex dispatchers' buffers depend on its nodes (nvlink_domain)
        self.dispatcher_gib = dispatcher_buffer_gib(model, job, shape, nvlink_domain(cluster))
        self.overheads = _with_buffers(options.overheads, self.dispatcher_gib)  # plan_overheads
        if shape.fp8 and fp8 is None:
            raise ValueError("an FP8 shape needs the recipe's bytes (model/fp8.py)")
        self.fp8b = fp8
        saved = fp8.saved_input if fp8 is not None else 1.0
        s, b, h, t = job.seq_length // shape.cp, shape.micro_batch, model.hidden_size, shape.tp
        sp_div = t if shape.sequence_parallel else 1
        a16 = job.activation_bytes
        self.act_layer = layer_activation_bytes(model, job, shape, fp8_saved_bytes=saved)
        # embedding dropout mask (1 byte); an embedding norm keeps its input for its backward
        self.emb_act = (s * b * h / sp_div if model.dropout else 0.0) + (
            a16 * s * b * h / sp_div if model.embedding_norm else 0.0)
        # final norm input, projection input, what the loss keeps of the logits for its
        # backward (fp32 logits in Korthikanti et al.'s count; LOSS_BYTES_PER_LOGIT)
        kept, peak = LOSS_BYTES_PER_LOGIT[loss_path(job, shape)]
        logits = s * b * model.vocab_size / t
        self.head_act = 2 * a16 * s * b * h / sp_div + kept * logits
        # DeepSpeed's pipeline engine (deepspeed/runtime/pipe/engine.py, _exec_forward_pass)
        # keeps each in-flight micro-batch's stage output in its pipe buffers until the
        # backward (num_pipe_buffers), whole on every tensor rank, or its sequence shard with
        # sequence parallelism; the last stage's output is its logits, its vocabulary shard in
        # fp32 (Megatron-DeepSpeed's pipeline models end in float16_to_fp32 under fp16 and
        # bf16: GPTModelPipe's specs). Where the engine does not partition the passed tensors
        # (plan.deepspeed_pipe_partitioned: no TP, sequence parallelism, experts) a stage's
        # received input also stays in its buffer while the forward runs on a clone of it;
        # partitioned, it is gathered into the buffer the forward uses. Megatron-LM frees a
        # stage's output once sent
        ds_pipe = job.framework == "deepspeed" and shape.pp > 1
        self.pipe_out = a16 * s * b * h / sp_div if ds_pipe else 0.0
        self.pipe_logits = 4.0 * s * b * model.vocab_size / t if ds_pipe else 0.0
        # ... and its backward returns before it frees its output buffer (engine.py
        # _exec_backward_pass: `if self.is_last_stage(): ... return`), so the previous
        # micro-batch's logits stay in the other of its two buffers (num_pipe_buffers, at
        # least 2) until a forward overwrites them: one more output beside the current one
        # from the second micro-batch on
        self.pipe_stale = self.pipe_logits if cs.m > 1 else 0.0
        self.pipe_in = (a16 * s * b * h / sp_div if ds_pipe and not deepspeed_pipe_partitioned(
            model, shape) else 0.0)
        # the loss step at its peak, beyond what it keeps (in head_act)
        self.loss_work = (peak - kept) * logits
        # leading dense layers (virtual stage 0): their activations instead of MoE ones
        self.first_dense = model.first_dense_layers
        self.dense_act_delta = (self.first_dense * (layer_activation_bytes(
            model.dense_layer_model, job, shape, fp8_saved_bytes=saved) - self.act_layer)
            if self.first_dense else 0.0)
        if shape.recompute == "full" or (shape.recompute == "selective"
                                         and job.framework == "torchtitan"):
            # the backward rebuilds one layer's activations (per-op SAC: all but what it
            # kept, counted whole here)
            self.work = layer_activation_bytes(model, job, shape, "none", saved)
            if self.first_dense:
                self.work = max(self.work, layer_activation_bytes(model.dense_layer_model, job,
                                                                  shape, "none", saved))
        elif shape.recompute == "selective":
            self.work = attention_score_bytes(model, job, shape)
        else:
            self.work = 0.0
        # the backward's attention under torchtitan's context parallelism (gathered K/V)
        self.work += cp_gather_work_bytes(model, job, shape)
        # the expert-parallel all-to-all overlap (Shape.ep_comm_overlap, PP 1): a step runs the
        # next micro-batch's layer i forward beside this one's layer n - 1 - i backward, whose
        # activations are freed after it, so a backward moment holds one more layer
        # (model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run); with one
        # micro-batch a step nothing is paired
        if shape.ep_comm_overlap and num_microbatches(job, shape) > 1:
            self.work += self.act_layer
        self.bytes_per_param = param_bytes(job, shape)
        per_param = sum(self.bytes_per_param)
        fp8 = self.fp8_copy = fp8_weight_copy_bytes(job, shape, self.fp8b)
        # expert parallelism: a layer's routed experts are split over EP (and expert TP), and
        # their sharded gradients / optimizer state over the expert-data-parallel group,
        # `expert_shard_factor` times finer than the data-parallel shard (Megatron-LM's
        # distributed optimizer shards expert buffers over that group)
        lp = layer_params(model, shape)  # the split the cost model uses
        self._plain = not lp.split  # every parameter split and sharded alike
        self.layer_expert_params = lp.experts if lp.split else 0.0
        self.layer_linear_params = lp.linear
        wb, gb, ob = self.bytes_per_param
        factor = lp.expert_shard_factor - 1
        self.expert_grad_extra = factor * gb if shape.zero >= 2 else 0.0
        self.expert_opt_extra = factor * ob if shape.zero >= 1 else 0.0
        # weights, grads, optimizer state (and FP8 copies) of one layer on one GPU
        if self._plain and not model.tp_replicated_params_per_layer:
            # (the arithmetic as before expert parallelism)
            self.layer_static_bytes = (model.params_per_layer * per_param
                                       + model.linear_params_per_layer * fp8) / t
        else:
            self.layer_static_bytes = (
                lp.total * per_param + lp.linear * fp8 + self.layer_expert_params
                * (self.expert_grad_extra + self.expert_opt_extra))
        self._per_param = per_param
        # stage 0's leading dense layers: FP8 copies of their own linear weights instead of
        # the MoE layers', and no expert shards (their parameters are in `params`)
        self.first_dense_fp8 = (self.first_dense * fp8 * (
            model.dense_layer_model.layer_params_per_gpu(t, linear=True) - lp.linear)
            if self.first_dense else 0.0)
        self.first_dense_static = self.first_dense_fp8 - self.first_dense * \
            self.layer_expert_params * (self.expert_grad_extra + self.expert_opt_extra)
        # ZeRO-3 / FSDP: the layer being computed and the one prefetched are gathered whole,
        # and a layer's full gradient exists until it is reduce-scattered (Megatron-FSDP
        # holds two of each: megatron_fsdp_units)
        # (DeepSpeed gathers module by module, so its unit is the largest weight matrix:
        # partition_parameters.py gathers each submodule's parameters when it runs)
        unit = model.params_per_layer if job.framework != "deepspeed" else max(
            model.hidden_size * (model.hidden_size + 2 * model.kv_dim),
            model.ffn_hidden_size * model.hidden_size * (2 if model.gated_mlp else 1))
        per_gpu = (model.layer_params_per_gpu(t) if job.framework != "deepspeed" else
                   unit / t)
        if job.framework == "megatron" and shape.zero >= 2:
            gathered, reducing = megatron_fsdp_units(shape.zero, model.num_layers)
        else:
            gathered, reducing = (2, 1) if shape.zero >= 3 and not keeps_unsharded(
                job, shape) else (0, 0)
        self.transient = per_gpu * (gathered * gathered_weight_bytes(job)
                                    + reducing * job.reduce_bytes)

    def stage_work(self, s: int) -> float:
        """Transient bytes at a backward moment of stage s: a layer's recompute, and on the
        last stage the loss step's, whichever is larger (they do not overlap)."""
        return max(self.work, self.loss_work) if s == self.shape.pp - 1 else self.work

    def const_static_bytes(self, params_without_layers: float, stage: int = -1) -> float:
        """Bytes of a stage that do not grow with its layers: the parameters outside its
        layers (embedding, output layer, final norm, stage 0's dense-layer difference; their
        count on one GPU given) and the ZeRO-3 gathering buffers."""
        return params_without_layers * self._per_param + self.transient + (
            self.first_dense_static if stage == 0 else 0.0) + self.held_bytes(stage)

    def held_bytes(self, stage: int) -> float:
        """Activation bytes a stage holds at every moment whatever its schedule: DeepSpeed's
        stale logits on the last stage (pipe_stale). Counted in `stage` and, for the MILP and
        the bounds, in `const_static_bytes` alike."""
        return self.pipe_stale if stage == self.shape.pp - 1 else 0.0

    def chunk_act_bytes(self, j: int, layers: int) -> float:
        a = layers * self.act_layer
        if j == 0:
            a += self.emb_act + self.dense_act_delta
        else:
            a += self.pipe_in
        if j == self.shape.num_virtual - 1:
            a += self.head_act + self.pipe_logits
        else:
            a += self.pipe_out
        return a

    def stage(self, s: int, params: float, layers: tuple[int, ...]) -> StageMemory:
        sh = self.shape
        chunk_bytes = np.array([self.chunk_act_bytes(c * sh.pp + s, layers[c * sh.pp + s])
                                for c in range(sh.chunks)])
        # the peak over every moment of the schedule that can be one (first one on ties)
        is_b, counts = self.cs.inflight_arrays(s)
        work = self.stage_work(s)
        total = counts @ chunk_bytes + np.where(is_b, work, 0.0) + self.held_bytes(s)
        i = int(np.argmax(total))
        best = float(total[i])
        best_counts = tuple(int(x) for x in counts[i])
        best_work = work if is_b[i] else 0.0
        wb, gb, ob = self.bytes_per_param
        n_layers = sum(layers[c * sh.pp + s] for c in range(sh.chunks))
        fp8_bytes = n_layers * self.layer_linear_params * self.fp8_copy
        if s == 0:  # the leading dense layers' own FP8 copies
            fp8_bytes += self.first_dense_fp8
        experts = (n_layers - (self.first_dense if s == 0 else 0)) * self.layer_expert_params
        grads = params * gb + experts * self.expert_grad_extra
        opt = params * ob + experts * self.expert_opt_extra
        tensors = (params * (wb + gb + ob) if self._plain else params * wb + grads + opt) + \
            fp8_bytes + best + self.transient
        o = self.overheads
        return StageMemory((params * wb + fp8_bytes) / GIB, grads / GIB, opt / GIB,
                           (best - best_work) / GIB, best_counts,
                           (best_work + self.transient) / GIB,
                           o.context_gib + o.fragmentation * tensors / GIB, o.context_gib,
                           self.dispatcher_gib)
