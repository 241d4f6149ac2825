"""The three inputs kept apart: the hardware (GPU), the network (model) and the training job.

The cluster lives in `model.cluster`, the parallel plan in `model.plan`. Every spec is a small
frozen dataclass validated at construction; a bad value raises `SpecError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .errors import SpecError

PRECISIONS = ("fp16", "bf16", "fp32")
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved")


def _positive(value, name: str, source: str | None, *, integer: bool = False, allow_zero=False):
    ok_type = isinstance(value, int) and not isinstance(value, bool) if integer else isinstance(
        value, (int, float)) and not isinstance(value, bool)
    if not ok_type or value != value or (value < 0 if allow_zero else value <= 0):
        kind = "a positive integer" if integer else "a positive number"
        raise SpecError(f"must be {kind}, got {value!r}", source=source, field=name)


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator type, from its datasheet (see data/gpus.json for the citations).

    `efficiency` is the achievable fraction of dense peak for transformer-layer GEMMs in a
    Megatron-style training step; data/gpus.json says how each default was set.
    """

    name: str
    peak_tflops: Mapping[str, float]  # dense tensor-core TFLOP/s by precision
    memory_gib: float
    hbm_gb_per_s: float
    nvlink_gb_per_s: float  # per-GPU, one direction, datasheet
    efficiency: float
    source: str = ""

    def __post_init__(self):
        src = f"GPU '{self.name}'"
        _positive(self.memory_gib, "memory_gib", src)
        _positive(self.hbm_gb_per_s, "hbm_gb_per_s", src)
        _positive(self.nvlink_gb_per_s, "nvlink_gb_per_s", src)
        if not 0 < self.efficiency <= 1:
            raise SpecError(f"must be in (0, 1], got {self.efficiency!r}", source=src,
                            field="efficiency")
        for p, v in self.peak_tflops.items():
            if p not in PRECISIONS:
                raise SpecError(f"unknown precision '{p}'; use one of {', '.join(PRECISIONS)}",
                                source=src, field="peak_tflops")
            _positive(v, f"peak_tflops.{p}", src)

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s for `precision`; raises if the GPU has no such tensor core."""
        if precision not in self.peak_tflops:
            have = ", ".join(sorted(self.peak_tflops))
            raise SpecError(f"{self.name} has no {precision} peak (it has: {have}); "
                            "choose another precision", source="job", field="precision")
        return self.peak_tflops[precision] * 1e12


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer. Parameter counts follow Narayanan et al. 2021 eq. (2),
    generalized to grouped-query attention and gated (SwiGLU) MLPs."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    gated_mlp: bool = False
    tied_embeddings: bool = False
    source: str = ""

    def __post_init__(self):
        src = f"model '{self.name}'" if not self.source.endswith(".json") else self.source
        for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
                  "vocab_size", "seq_length"):
            _positive(getattr(self, f), f, src, integer=True)
        if self.hidden_size % self.num_heads:
            raise SpecError(f"hidden_size {self.hidden_size} is not a multiple of num_heads "
                            f"{self.num_heads}", source=src, field="num_heads")
        if self.num_heads % self.num_kv_heads:
            raise SpecError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads "
                            f"{self.num_kv_heads}", source=src, field="num_kv_heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def params_per_layer(self) -> int:
        """Weights of one block: QKV, output projection, MLP, two norms (Narayanan eq. 2)."""
        h = self.hidden_size
        attn = h * (h + 2 * self.kv_dim) + h * h
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn_hidden_size
        return attn + mlp + 4 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        out = 0 if self.tied_embeddings else self.embedding_params
        return self.num_layers * self.params_per_layer + self.embedding_params + out

    def layer_flops_fwd(self, tokens: int, seq: int) -> float:
        """Forward FLOPs of one block for `tokens` tokens in sequences of length `seq`.

        Narayanan et al. 2021 eq. (3) terms (2 FLOPs per multiply-add): QKV and output
        projections 2*T*h*(2h + 2*kv_dim), attention scores and values 4*T*s*h, MLP
        2*T*h*ffn*(3 if gated else 2). For MHA with ffn = 4h this is 24*T*h^2 + 4*T*s*h.
        """
        h = self.hidden_size
        proj = 2 * tokens * h * (2 * h + 2 * self.kv_dim)
        attn = 4 * tokens * seq * h
        mlp = 2 * tokens * h * self.ffn_hidden_size * (3 if self.gated_mlp else 2)
        return float(proj + attn + mlp)

    def attention_core_flops_fwd(self, tokens: int, seq: int) -> float:
        """The QK^T and attention-times-V part, which selective recompute redoes
        (Korthikanti et al. 2022 Sec. 5)."""
        return float(4 * tokens * seq * self.hidden_size)

    def logits_flops_fwd(self, tokens: int) -> float:
        """Output projection to the vocabulary: 2*T*h*V (Narayanan et al. 2021 eq. 3)."""
        return float(2 * tokens * self.hidden_size * self.vocab_size)


@dataclass(frozen=True)
class JobSpec:
    """What to train: batch, sequence length, precision. Adam with fp32 master weights.

    `distributed_optimizer`: True/False forces it; None lets the solver choose (the plan
    carries the decision the estimator uses).
    """

    global_batch: int
    seq_length: int
    precision: str = "bf16"
    distributed_optimizer: bool | None = None
    source: str = "job"

    def __post_init__(self):
        _positive(self.global_batch, "global_batch", self.source, integer=True)
        _positive(self.seq_length, "seq_length", self.source, integer=True)
        if self.precision not in PRECISIONS:
            raise SpecError(f"unknown precision '{self.precision}'; use one of "
                            f"{', '.join(PRECISIONS)}", source=self.source, field="precision")

    # Bytes per parameter, from Megatron-LM's distributed-optimizer table
    # (docs/source/api-guide/dist_optimizer.md: fp16 20 -> 4+16/d, bf16 18 -> 6+12/d,
    # fp32 16 -> 8+8/d). "replicated" stays on every data-parallel rank, "shardable" is divided
    # by the data-parallel degree when the distributed optimizer is on.
    @property
    def weight_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def grad_bytes(self) -> int:
        """Gradient buffer: fp16 grads for fp16; fp32 main_grad for bf16 (Megatron sets
        accumulate_allreduce_grads_in_fp32 for bf16); fp32 for fp32."""
        return 2 if self.precision == "fp16" else 4

    @property
    def optimizer_bytes(self) -> int:
        """fp32 master weights + Adam m and v (+ an fp32 gradient copy for fp16)."""
        return {"fp16": 16, "bf16": 12, "fp32": 8}[self.precision]

    @property
    def activation_bytes(self) -> int:
        """Korthikanti et al. 2022 count 16-bit activations; fp32 doubles them."""
        return 4 if self.precision == "fp32" else 2


@dataclass(frozen=True)
class Overheads:
    """Memory the formulas do not see, and fixed per-iteration costs. All configurable.

    - `context_gib`: CUDA context, cuBLAS/NCCL workspaces and communication buffers, per GPU.
    - `fragmentation`: allocator cache and fragmentation, as a fraction of the tensors counted.
    Defaults fitted to the BLOOM nvidia-smi readings in the reference set: the grid search in
    bench/calibrate_overheads.py minimizes the worst relative error over those runs while every
    published out-of-memory run stays above 80 GiB and every run that ran stays within it.
    """

    context_gib: float = 2.5
    fragmentation: float = 0.15
    latency_overhead_ms: float = 0.0

    def __post_init__(self):
        _positive(self.context_gib, "context_gib", "overheads", allow_zero=True)
        _positive(self.fragmentation, "fragmentation", "overheads", allow_zero=True)
        _positive(self.latency_overhead_ms, "latency_overhead_ms", "overheads", allow_zero=True)


@dataclass(frozen=True)
class Options:
    """Modelling switches; the defaults follow Megatron-LM.

    - `blocking_p2p`: Megatron-LM's pipeline send/recv is blocking (batched isend/irecv then
      wait), so the sender waits for its transfer; that puts communication on the critical path
      of every 1F1B cycle (Pipette, Yim et al. 2024, Sec. III). False models fully overlapped
      asynchronous transfers.
    - `overlap_grad_reduce`: the gradient reduction overlaps the last micro-batch's backward
      (Megatron --overlap-grad-reduce); off by default, as in Megatron-LM.
    """

    blocking_p2p: bool = True
    overlap_grad_reduce: bool = False
    overheads: Overheads = field(default_factory=Overheads)
