"""The three inputs kept apart: the hardware (GPU), the network (model) and the training job.

The cluster lives in `model.cluster`, the parallel plan in `model.plan`. Every spec is a small
frozen dataclass validated at construction; a bad value raises `SpecError` naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Mapping

from .errors import SpecError

PRECISIONS = ("fp16", "bf16", "fp32")  # the job's base (parameter and activation) precision
PEAK_KINDS = ("fp16", "bf16", "fp32", "fp8")  # tensor-core peaks a GPU preset may list
ATTENTION = ("flash", "eager")
FRAMEWORKS = ("megatron", "deepspeed", "torchtitan")  # whose byte rules apply


def priced_as(framework: str) -> str:
    """The job framework (FRAMEWORKS) whose estimate describes a run of `framework`: NeMo runs
    Megatron-Core, so Megatron-LM's; a DeepSpeed pipeline log is DeepSpeed's."""
    return {"nemo": "megatron", "deepspeed-pipe": "deepspeed"}.get(framework, framework)
# Transformer Engine's FP8 scaling recipes (Megatron-LM --fp8-recipe; model/fp8.py): per-tensor
# delayed and current ("tensorwise") scaling, MXFP8 blocks of 32 (Blackwell) and 1 x 128 / 128 x
# 128 blocks ("blockwise", Hopper)
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")
# mixture-of-experts token dispatchers priced (JobSpec.moe_dispatcher): Megatron-Core's
# alltoall dispatcher (NCCL all-to-all of one copy per routed expert), and its flex dispatcher
# with the DeepEP or HybridEP backend (one copy per destination GPU, one network crossing per
# destination node: model/communication.py hierarchical_dispatch_ms)
MOE_DISPATCHERS = ("alltoall", "deepep", "hybridep")
POSITION_EMBEDDINGS = ("learned", "rope", "alibi")
NORMS = ("layernorm", "rmsnorm")
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved")


def _positive(value, name: str, source: str | None, *, integer: bool = False, allow_zero=False):
    ok_type = isinstance(value, int) and not isinstance(value, bool) if integer else isinstance(
        value, (int, float)) and not isinstance(value, bool)
    if (not ok_type or value != value or abs(value) == float("inf")
            or (value < 0 if allow_zero else value <= 0)):
        kind = ("a positive integer" if integer else "a positive, finite number") if not \
            allow_zero else ("an integer, 0 or more" if integer else "a finite number, 0 or more")
        raise SpecError(f"must be {kind}, got {value!r}", source=source, field=name)


# A large FP8 GEMM's fraction of the FP8 peak against a bf16 GEMM's fraction of the bf16 peak,
# for a GPU without its own fp8_gemm_efficiency: 0.78, fitted on the reference set's one Float8
# run (bench/fit_h100_500w.py: torchao float8, tensor-wise dynamic scaling, its amax
# reductions included, H100). Hopper's FP8 tensor cores do not reach twice the bf16 rate in
# practice; outside Hopper the same ratio is an assumption (each preset's curve_source says so)
FP8_GEMM_RATIO = 0.78


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator type: datasheet figures (data/gpus.json cites each) and the few named
    parameters of the per-operation roofline (model/compute.py):

    - `gemm_efficiency`: fraction of dense peak a large, well-shaped GEMM reaches; smaller
      GEMMs lose more through tile and wave quantization over `sm_count` multiprocessors;
    - `attention_efficiency`: fraction of dense peak of the FlashAttention kernels;
    - `hbm_efficiency`: fraction of the datasheet HBM bandwidth element-wise kernels reach;
    - `kernel_overhead_us`: the gap each kernel adds (launch, prologue, tail);
    - `fp8_gemm_efficiency`: fraction of the dense FP8 peak a large FP8 GEMM reaches, with
      its scaling overheads; None: FP8_GEMM_RATIO x `gemm_efficiency` (`fp8_efficiency`).
    `curve_source` says where they come from (a fit on published runs, or an assumption).
    """

    name: str
    peak_tflops: Mapping[str, float]  # dense tensor-core TFLOP/s by precision
    memory_gib: float
    hbm_gb_per_s: float
    nvlink_gb_per_s: float  # per-GPU, one direction, datasheet
    sm_count: int
    gemm_efficiency: float
    attention_efficiency: float
    hbm_efficiency: float
    kernel_overhead_us: float
    source: str = ""
    curve_source: str = ""
    fp8_gemm_efficiency: float | None = None
    # CUDA compute capability (major.minor, e.g. 9.0 Hopper, 10.0 B200): which FP8 recipes
    # Transformer Engine runs and how it lays out their copies (model/fp8.py); None for a GPU
    # without one (AMD), read as Hopper's rules for the per-tensor recipes
    compute_capability: float | None = None

    def __post_init__(self):
        src = f"GPU '{self.name}'"
        cc = self.compute_capability
        if cc is not None and (not isinstance(cc, (int, float)) or isinstance(cc, bool)
                               or not 1.0 <= cc < 100.0):
            raise SpecError(f"must be a CUDA compute capability such as 9.0, got {cc!r}",
                            source=src, field="compute_capability")
        _positive(self.memory_gib, "memory_gib", src)
        _positive(self.hbm_gb_per_s, "hbm_gb_per_s", src)
        _positive(self.nvlink_gb_per_s, "nvlink_gb_per_s", src)
        _positive(self.sm_count, "sm_count", src, integer=True)
        _positive(self.kernel_overhead_us, "kernel_overhead_us", src, allow_zero=True)
        for f in ("gemm_efficiency", "attention_efficiency", "hbm_efficiency",
                  "fp8_gemm_efficiency"):
            v = getattr(self, f)
            if v is None and f == "fp8_gemm_efficiency":
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= 1:
                raise SpecError(f"must be in (0, 1], got {v!r}", source=src, field=f)
        for p, v in self.peak_tflops.items():
            if p not in PEAK_KINDS:
                raise SpecError(f"unknown precision '{p}'; use one of {', '.join(PEAK_KINDS)}",
                                source=src, field="peak_tflops")
            _positive(v, f"peak_tflops.{p}", src)

    @property
    def fp8_efficiency(self) -> float:
        """The FP8 GEMMs' fraction of the FP8 peak: `fp8_gemm_efficiency`, or where the GPU
        has none, FP8_GEMM_RATIO x the bf16 GEMMs' fraction of the bf16 peak."""
        if self.fp8_gemm_efficiency is not None:
            return self.fp8_gemm_efficiency
        return FP8_GEMM_RATIO * self.gemm_efficiency

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s for `precision`; raises if the GPU has no such tensor core."""
        if precision not in self.peak_tflops:
            have = ", ".join(sorted(self.peak_tflops))
            raise SpecError(f"{self.name} has no {precision} tensor-core peak (it has: {have}); "
                            "choose another precision", source="job", field="precision")
        return self.peak_tflops[precision] * 1e12

    @property
    def hbm_bytes_per_ms(self) -> float:
        """Achievable HBM bandwidth in bytes per millisecond."""
        return self.hbm_gb_per_s * self.hbm_efficiency * 1e6


# Upper bounds of a job: sequences per step (frameworks count samples in 32 bits) and tokens
# per sequence
MAX_GLOBAL_BATCH = 2**31
MAX_SEQ_LENGTH = 2**24

# Upper bounds of a model's sizes, with the reason: far beyond any trained model, small enough
# that the estimator's arithmetic and loops stay exact and quick
MODEL_BOUNDS = {
    "num_layers": (10_000, "the largest trained models have a few hundred"),
    "hidden_size": (1 << 20, "the largest trained models have ~25,000"),
    "num_heads": (1 << 16, "the largest trained models have a few hundred"),
    "num_kv_heads": (1 << 16, "at most num_heads"),
    "ffn_hidden_size": (1 << 22, "the largest trained models have ~100,000"),
    "vocab_size": (10_000_000, "the largest tokenizers have ~260,000 entries"),
    "seq_length": (1 << 24, "16M tokens, beyond any trained context"),
    "num_experts": (1 << 16, "the largest mixtures have a few hundred experts"),
    "moe_ffn_hidden_size": (1 << 22, "as ffn_hidden_size"),
    "kv_channels": (1 << 16, "heads are at most a few hundred wide"),
}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer. Parameter counts follow Narayanan et al. 2021 eq. (2),
    generalized to grouped-query attention, gated (SwiGLU) MLPs, RMSNorm and bias-free layers.

    Architecture fields the cost model reads: `position_embedding` (learned absolute positions
    add s*h weights and an add; RoPE rotates q and k), `norm`, `bias` (linear-layer biases) and
    `dropout` (hidden and attention dropout, whose masks are stored: Llama-family training sets
    both to 0), `embedding_norm` (a LayerNorm right after the embedding, as BLOOM has)."""

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
    position_embedding: str = "learned"
    norm: str = "layernorm"
    bias: bool = True
    # biases on the query, key and value projections only (Qwen2 and Qwen1.5/2-MoE; Megatron-LM
    # --add-qkv-bias, which --add-bias-linear implies): q + 2 kv weights per layer, their adds
    # in the GEMMs' epilogues (not timed)
    qkv_bias: bool = False
    dropout: bool = True
    embedding_norm: bool = False
    # per-head RMSNorm on queries and keys before attention (Qwen3: q_norm / k_norm). Not
    # priced: 2 x head_dim weights and two norms of s x h elements per layer, under 0.1% of
    # a layer's time and memory; carried so that the emitted model is the model
    qk_norm: bool = False
    # sliding-window attention (Mistral 7B v0.1, Phi-3): each query attends to the
    # `sliding_window` latest keys, its own included (Hugging Face's sliding_window,
    # transformers masking_utils: key > query - W; Megatron-LM --window-size W-1,0); 0: full
    # causal attention. `window_full_every` N > 0: layers N, 2N, ... (counted from 1) attend
    # fully, the others over the window (Megatron-LM --window-attn-skip-freq N,
    # core/transformer/utils.py is_layer_window_attention; Hugging Face's layer_types with a
    # full layer every N); 0: every layer slides
    sliding_window: int = 0
    window_full_every: int = 0
    # mixture of experts (every layer's MLP; 0 experts = dense): routed experts, experts per
    # token (top-k), each expert's FFN width (0: ffn_hidden_size), shared experts always run
    num_experts: int = 0
    moe_topk: int = 0
    moe_ffn_hidden_size: int = 0
    moe_shared_experts: int = 0
    # one attention head's width when it is not hidden_size / num_heads (Megatron-LM
    # --kv-channels, Hugging Face head_dim; Qwen3 has 128-wide heads on a 2048 or 4096 hidden
    # size); 0: hidden_size / num_heads
    kv_channels: int = 0
    # leading dense layers of a mixture of experts (DeepSeek's first_k_dense_replace): the
    # first k blocks have a dense MLP of ffn_hidden_size, the rest routed experts; a plan keeps
    # them in its first virtual stage (plan.validate_shape)
    first_dense_layers: int = 0
    # multi-head latent attention (DeepSeek-V2/V3; Megatron-LM MultiLatentAttention): K and
    # V come from a kv_lora_rank-wide latent (plus a shared qk_rope_head_dim rotary key), the
    # queries from a q_lora_rank latent (0: directly from the hidden state); kv_channels is
    # the non-rotary query/key head width, mla_v_head_dim the value head width. 0: ordinary
    # attention
    mla_kv_lora_rank: int = 0
    mla_q_lora_rank: int = 0
    mla_qk_rope_dim: int = 0
    mla_v_head_dim: int = 0
    # rotary embeddings: the base (Hugging Face rope_theta; 0 = not given, the framework's
    # default 10000 applies) and the fraction of each head's width rotated (GPT-NeoX 0.25);
    # they change neither weights nor cost, only what the emitted arguments build
    rope_base: float = 0.0
    rotary_percent: float = 1.0
    # the norms' epsilon (Hugging Face rms_norm_eps / layer_norm_eps; Megatron-LM
    # --norm-epsilon); 0 = not given, the frameworks' default 1e-5 applies. Not priced: it
    # changes no FLOP or byte, only the emitted model's numerics (Qwen and DeepSeek use 1e-6)
    norm_eps: float = 0.0
    source: str = ""
    # what the model's source sets that neither the cost model prices nor the emitters write
    # (formats/hf_config.py: a sliding attention window, DeepSeek's multi-token prediction and
    # router settings), one "key value: what differs" line each; said wherever the model is
    # estimated or emitted, never dropped in silence
    unmodelled: tuple[str, ...] = ()

    def unmodelled_at(self, seq_length: int) -> tuple[str, ...]:
        """`unmodelled` for a job of this sequence length: a sliding window no shorter than the
        sequence is full causal attention, which is what is priced and emitted."""
        def moot(x: str) -> bool:
            key, _, val = x.split(":")[0].partition(" ")
            return key == "sliding_window" and val.isdigit() and int(val) >= seq_length
        return tuple(x for x in self.unmodelled if not moot(x))

    @property
    def origin(self) -> str:
        """Where the model came from, for a message: its config.json, or its preset name."""
        return self.source if self.source.endswith(".json") else f"model '{self.name}'"

    def __post_init__(self):
        src = self.origin if isinstance(self.source, str) else f"model '{self.name}'"
        if not isinstance(self.unmodelled, tuple) or not all(
                isinstance(x, str) for x in self.unmodelled):
            raise SpecError("must be a list of strings", source=src, field="unmodelled")
        for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
                  "vocab_size", "seq_length"):
            _positive(getattr(self, f), f, src, integer=True)
        for f in ("num_experts", "moe_topk", "moe_ffn_hidden_size", "moe_shared_experts",
                  "kv_channels", "first_dense_layers", "mla_kv_lora_rank", "mla_q_lora_rank",
                  "mla_qk_rope_dim", "mla_v_head_dim", "sliding_window", "window_full_every"):
            _positive(getattr(self, f), f, src, integer=True, allow_zero=True)
        if self.window_full_every and not self.sliding_window:
            raise SpecError("window_full_every needs a sliding_window (the window the other "
                            "layers attend over)", source=src, field="window_full_every")
        if self.window_full_every == 1:
            raise SpecError("window_full_every 1 makes every layer attend fully: drop "
                            "sliding_window instead, or give N > 1 (layers N, 2N, ... full)",
                            source=src, field="window_full_every")
        if self.sliding_window and self.is_mla:
            raise SpecError("a sliding window with latent attention (MLA) is not modelled",
                            source=src, field="sliding_window")
        for f, hi in MODEL_BOUNDS.items():
            if getattr(self, f) > hi[0]:
                raise SpecError(f"is {getattr(self, f):,}; at most {hi[0]:,} ({hi[1]})",
                                source=src, field=f)
        _positive(self.rope_base, "rope_base", src, allow_zero=True)
        _positive(self.rotary_percent, "rotary_percent", src)
        _positive(self.norm_eps, "norm_eps", src, allow_zero=True)
        if self.norm_eps >= 0.1:
            raise SpecError(f"norm_eps is {self.norm_eps:g}; a norm's epsilon is a small "
                            "number such as 1e-5 or 1e-6", source=src, field="norm_eps")
        if not isinstance(self.name, str) or not isinstance(self.source, str):
            raise SpecError("the model name must be a string", source=src, field="name")
        if not 0 < self.rotary_percent <= 1:
            raise SpecError(f"rotary_percent is {self.rotary_percent}; it is the fraction of "
                            "a head's width that is rotated, in (0, 1]", source=src,
                            field="rotary_percent")
        if self.mla_kv_lora_rank and not (self.kv_channels and self.mla_qk_rope_dim and
                                          self.mla_v_head_dim and
                                          self.num_kv_heads == self.num_heads):
            raise SpecError("latent attention needs kv_channels (the non-rotary head width), "
                            "mla_qk_rope_dim, mla_v_head_dim and num_kv_heads = num_heads",
                            source=src, field="mla_kv_lora_rank")
        if (self.mla_q_lora_rank or self.mla_qk_rope_dim or self.mla_v_head_dim) and \
                not self.mla_kv_lora_rank:
            raise SpecError("mla_* fields need mla_kv_lora_rank > 0 (latent attention)",
                            source=src, field="mla_kv_lora_rank")
        if self.first_dense_layers and (self.num_experts <= 1 or
                                        self.first_dense_layers >= self.num_layers):
            raise SpecError(f"first_dense_layers {self.first_dense_layers} needs a mixture of "
                            "experts with more layers than that", source=src,
                            field="first_dense_layers")
        if self.num_experts == 1 and (self.moe_shared_experts or self.moe_topk > 1 or (
                self.moe_ffn_hidden_size and self.moe_ffn_hidden_size != self.ffn_hidden_size)):
            raise SpecError("a single expert is the dense MLP: give ffn_hidden_size, no shared "
                            "experts, top-k 1", source=src, field="num_experts")
        if self.num_experts:
            if not 1 <= self.moe_topk <= self.num_experts:
                raise SpecError(f"moe_topk {self.moe_topk} must be between 1 and num_experts "
                                f"{self.num_experts}", source=src, field="moe_topk")
            if self.bias:
                raise SpecError("mixture-of-experts layers with linear biases are not "
                                "modelled; set bias false (Mixtral, Qwen MoE, DeepSeek have "
                                "none)", source=src, field="bias")
        elif self.moe_topk or self.moe_shared_experts:
            raise SpecError("moe_topk and moe_shared_experts need num_experts > 0", source=src,
                            field="num_experts")
        if self.hidden_size % self.num_heads and not self.kv_channels:
            raise SpecError(f"hidden_size {self.hidden_size} is not a multiple of num_heads "
                            f"{self.num_heads}", source=src, field="num_heads")
        if self.num_heads % self.num_kv_heads:
            raise SpecError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads "
                            f"{self.num_kv_heads}", source=src, field="num_kv_heads")
        for f, allowed in (("position_embedding", POSITION_EMBEDDINGS), ("norm", NORMS)):
            if getattr(self, f) not in allowed:
                raise SpecError(f"unknown {f} {getattr(self, f)!r}; use one of "
                                f"{', '.join(allowed)}", source=src, field=f)
        for f in ("gated_mlp", "tied_embeddings", "bias", "qkv_bias", "dropout",
                  "embedding_norm", "qk_norm"):
            if not isinstance(getattr(self, f), bool):
                raise SpecError(f"must be true or false, got {getattr(self, f)!r}", source=src,
                                field=f)

    @property
    def windowed_layers(self) -> int:
        """Layers that attend over the sliding window (the rest attend fully)."""
        if not self.sliding_window:
            return 0
        n = self.window_full_every
        return self.num_layers - (self.num_layers // n if n else 0)

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_heads

    @property
    def is_mla(self) -> bool:
        return self.mla_kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """A query's (and key's) head width: with latent attention the non-rotary part plus
        the rotary one."""
        return self.head_dim + self.mla_qk_rope_dim

    @property
    def q_dim(self) -> int:
        """Width of the queries: heads x head width, the hidden size unless `kv_channels`
        says otherwise (or latent attention's wider query heads)."""
        return self.num_heads * self.qk_head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the keys (= of the values) of ordinary attention."""
        return self.num_kv_heads * self.head_dim

    @property
    def kv_widths(self) -> int:
        """Keys plus values per token as the attention core reads them (2 kv_dim; latent
        attention: its up-projected per-head keys and values)."""
        if self.is_mla:
            return self.num_heads * (self.qk_head_dim + self.mla_v_head_dim)
        return 2 * self.kv_dim

    @property
    def o_dim(self) -> int:
        """Width of the attention output (the output projection's input)."""
        return self.num_heads * self.mla_v_head_dim if self.is_mla else self.q_dim

    # cached: read per stage of every shape the search bounds
    @cached_property
    def attention_linear_params(self) -> int:
        """Weights of one block's attention projections. Ordinary: QKV h (q + 2 kv) and output
        q h. Latent (Megatron-LM MultiLatentAttention): query down h x q_lora and up
        q_lora x heads (nope + rope), or directly h x heads (nope + rope); key/value down
        h x (kv_lora + rope) and up kv_lora x heads (nope + v); output heads v x h."""
        h = self.hidden_size
        if not self.is_mla:
            return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        ql, kvl = self.mla_q_lora_rank, self.mla_kv_lora_rank
        q = h * ql + ql * self.q_dim if ql else h * self.q_dim
        kv = h * (kvl + self.mla_qk_rope_dim) + kvl * self.num_heads * (
            self.head_dim + self.mla_v_head_dim)
        return q + kv + self.o_dim * h

    @property
    def is_moe(self) -> bool:
        """Routed experts: more than one (a single expert needs no router: it is the dense
        MLP, of width `expert_ffn`)."""
        return self.num_experts > 1

    @property
    def expert_ffn(self) -> int:
        """One expert's FFN width (Mixtral's intermediate_size; Qwen/DeepSeek's
        moe_intermediate_size)."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    def _mlp_params(self, ffn: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * ffn

    @cached_property
    def linear_params_per_layer(self) -> int:
        """Weights of the linear layers of one block (QKV, output projection, MLP up (and
        gate), MLP down; with experts: every routed and shared expert's MLP and the router):
        the GEMM weights, which FP8 caches a copy of."""
        h = self.hidden_size
        attn = self.attention_linear_params
        if self.is_moe:
            return (attn + h * self.num_experts + (self.num_experts + self.moe_shared_experts)
                    * self._mlp_params(self.expert_ffn))
        return attn + self._mlp_params(self.ffn_hidden_size)

    @cached_property
    def expert_params_per_layer(self) -> int:
        """Weights of one block's routed experts (0 for a dense model): the part expert
        parallelism divides (the router and shared experts are replicated like the dense
        layers; Megatron-LM's MoELayer)."""
        return self.num_experts * self._mlp_params(self.expert_ffn) if self.is_moe else 0

    @cached_property
    def active_linear_params_per_layer(self) -> int:
        """The linear weights one token passes through: attention, the router, its top-k
        experts and the shared ones (= linear_params_per_layer for a dense model)."""
        if not self.is_moe:
            return self.linear_params_per_layer
        h = self.hidden_size
        return (self.attention_linear_params + h * self.num_experts
                + (self.moe_topk + self.moe_shared_experts) * self._mlp_params(self.expert_ffn))

    @cached_property
    def params_per_layer(self) -> int:
        """Weights of one block: the linear layers, their biases and two norms (Narayanan
        eq. 2 has 12h^2 + 13h for a GPT block: 4h of LayerNorm, 9h of biases)."""
        h = self.hidden_size
        norms = 2 * (2 * h if self.norm == "layernorm" else h)
        if self.is_mla:  # the latents' norms (query latent, key/value latent)
            norms += self.mla_q_lora_rank + self.mla_kv_lora_rank
        qkv = self.q_dim + 2 * self.kv_dim
        biases = (qkv + h + (2 if self.gated_mlp else 1) * self.ffn_hidden_size + h if self.bias
                  else qkv if self.qkv_bias else 0)
        return self.linear_params_per_layer + norms + biases

    @cached_property
    def tp_replicated_linear_params_per_layer(self) -> int:
        """Linear weights of one block that every tensor-parallel rank holds whole: latent
        attention's down-projections (Megatron-LM's TE layer spec builds linear_q_down_proj and
        linear_kv_down_proj as plain linears, MultiLatentAttention sets parallel_mode
        'duplicated': megatron/core/transformer/multi_latent_attention.py) and the router
        (moe/router.py TopKRouter: one E x h weight, not split). 0 for other models."""
        h = self.hidden_size
        down = (h * self.mla_q_lora_rank + h * (self.mla_kv_lora_rank + self.mla_qk_rope_dim)
                if self.is_mla else 0)
        return down + (h * self.num_experts if self.is_moe else 0)

    @cached_property
    def tp_replicated_params_per_layer(self) -> int:
        """tp_replicated_linear_params_per_layer and the latents' norms (whole on every TP
        rank, as the down-projections they follow). The ordinary blocks' norms are split with
        the rest (2h of ~12h^2: below 1e-4 of a layer), as before."""
        norms = self.mla_q_lora_rank + self.mla_kv_lora_rank if self.is_mla else 0
        return self.tp_replicated_linear_params_per_layer + norms

    def layer_params_per_gpu(self, tp: int, linear: bool = False) -> float:
        """One block's weights (`linear`: its linear weights) on one of `tp` tensor-parallel
        ranks: the split ones divided by tp, the replicated ones whole (bit for bit P / tp
        where none is replicated)."""
        full = self.linear_params_per_layer if linear else self.params_per_layer
        rep = (self.tp_replicated_linear_params_per_layer if linear else
               self.tp_replicated_params_per_layer)
        return full / tp if not rep else (full - rep) / tp + rep

    @property
    def tensors_per_layer(self) -> int:
        """Parameter tensors of one block as Megatron-style code declares them: fused QKV,
        output projection, fused MLP up (and gate), MLP down; a bias each; two norms (weight,
        and bias for LayerNorm)."""
        mlp = 2 if not self.is_moe else 1 + 2 * (self.num_experts + self.moe_shared_experts)
        biases = 4 if self.bias else 1 if self.qkv_bias else 0
        return 2 + mlp + biases + 2 * (2 if self.norm == "layernorm" else 1)

    @property
    def embedding_params(self) -> int:
        """Input embedding: the vocabulary table, plus the position table when learned, plus
        the embedding norm."""
        pos = self.seq_length * self.hidden_size if self.position_embedding == "learned" else 0
        norm = self.final_norm_params if self.embedding_norm else 0
        return self.vocab_size * self.hidden_size + pos + norm

    @property
    def output_params(self) -> int:
        """Output layer (its own weight unless tied to the input embedding)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def final_norm_params(self) -> int:
        return 2 * self.hidden_size if self.norm == "layernorm" else self.hidden_size

    @cached_property
    def dense_layer_model(self) -> "ModelSpec":
        """The model whose blocks are this one's leading dense layers (dense MLP of
        ffn_hidden_size); `params_per_layer` and friends of this one are its MoE layers'.
        Built once per model (the per-stage parameter and memory counts ask for it often, and
        a ModelSpec validates itself when built)."""
        from dataclasses import replace
        return replace(self, num_experts=0, moe_topk=0, moe_ffn_hidden_size=0,
                       moe_shared_experts=0, first_dense_layers=0)

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers

    @property
    def total_params(self) -> int:
        k = self.first_dense_layers
        dense = k * self.dense_layer_model.params_per_layer if k else 0
        return (self.moe_layers * self.params_per_layer + dense + self.embedding_params
                + self.output_params + self.final_norm_params)

    @property
    def active_params(self) -> int:
        """Parameters one token uses (a mixture of experts' 'active' count)."""
        return self.total_params - self.moe_layers * (self.linear_params_per_layer
                                                      - self.active_linear_params_per_layer)

    def model_flops_fwd(self, tokens: int, seq: int) -> float:
        """Forward FLOPs of every block (the leading dense ones at their own count)."""
        k = self.first_dense_layers
        dense = k * self.dense_layer_model.layer_flops_fwd(tokens, seq) if k else 0.0
        return self.moe_layers * self.layer_flops_fwd(tokens, seq) + dense

    def layer_flops_fwd(self, tokens: int, seq: int) -> float:
        """Forward FLOPs of one block for `tokens` tokens in sequences of length `seq`.

        Narayanan et al. 2021 eq. (3) terms (2 FLOPs per multiply-add): QKV and output
        projections 2*T*h*(2h + 2*kv_dim), attention scores and values 4*T*s*h, MLP
        2*T*h*ffn*(3 if gated else 2). For MHA with ffn = 4h this is 24*T*h^2 + 4*T*s*h.
        The attention term counts the full s x s product, as eq. (3) does, also where a causal
        kernel skips the masked half (model/compute.py times that separately). With heads
        narrower or wider than h / a (`kv_channels`), the query width q replaces h in the
        query, output-projection and attention terms; latent attention counts its own
        projections (2 T x their weights) and scores over qk-wide, values over v-wide heads."""
        h, q = self.hidden_size, self.q_dim
        if self.is_mla:
            proj = 2 * tokens * self.attention_linear_params
        else:
            proj = 2 * tokens * h * (2 * q + 2 * self.kv_dim)
        attn = self.attention_core_flops_fwd(tokens, seq)
        if self.is_moe:  # the router, then each token's top-k and the shared experts
            mlp = 2 * tokens * (h * self.num_experts + (self.moe_topk + self.moe_shared_experts)
                                * self._mlp_params(self.expert_ffn))
        else:
            mlp = 2 * tokens * self._mlp_params(self.ffn_hidden_size)
        return float(proj + attn + mlp)

    def attention_core_flops_fwd(self, tokens: int, seq: int) -> float:
        """The QK^T and attention-times-V part, which selective recompute redoes
        (Korthikanti et al. 2022 Sec. 5)."""
        if self.is_mla:
            return float(2 * tokens * seq * self.num_heads * (self.qk_head_dim
                                                              + self.mla_v_head_dim))
        return float(4 * tokens * seq * self.q_dim)

    def logits_flops_fwd(self, tokens: int) -> float:
        """Output projection to the vocabulary: 2*T*h*V (Narayanan et al. 2021 eq. 3)."""
        return float(2 * tokens * self.hidden_size * self.vocab_size)


@dataclass(frozen=True)
class JobSpec:
    """What to train: batch, sequence length, precision, attention kernel. Adam with fp32
    master weights.

    - `precision`: the base precision of parameters and activations (fp32, fp16, bf16).
    - `fp8`: FP8 linear layers (Transformer Engine with `fp8_recipe`, torchao float8):
      True forces them, False forbids them, None lets the solver choose; the plan carries the
      decision (`Shape.fp8`). FP8 runs over a bf16 or fp16 base.
    - `attention`: "flash" (FlashAttention / cuDNN fused attention: the s x s scores are never
      stored) or "eager" (scores, softmax and its dropout materialized, as Megatron-LM's fused
      softmax kernels did before FlashAttention).
    - `zero`: the data-parallel sharding stage (0-3) the job fixes, or None to let the solver
      choose; `distributed_optimizer` True / False is the same as zero 1 / 0 (Megatron-LM's
      distributed optimizer is ZeRO-1).
    - `framework`: whose byte rules the weights, gradients and optimizer state follow
      (Megatron-LM's mixed-precision optimizer, DeepSpeed's, or torchtitan's FSDP2 with fp32
      sharded parameters) and how pipeline transfers are sent (model/costs.py).
    - `compile`: torchtitan's torch.compile of each transformer block (its `compile` switch):
      True fuses the element-wise kernels, False runs them as eager PyTorch kernel by kernel
      (model/compute.py), and compiled blocks keep less for the backward under per-op
      selective checkpointing (model/memory.py `op_sac_tensors`). Megatron-LM, NeMo and
      DeepSpeed always run fused kernels, so there it must stay True.
    """

    global_batch: int
    seq_length: int
    precision: str = "bf16"
    distributed_optimizer: bool | None = None
    fp8: bool | None = False
    attention: str = "flash"
    framework: str = "megatron"
    zero: int | None = None
    # Megatron-LM --grad-reduce-in-bf16: bf16 main gradients, accumulated and reduced in bf16
    # instead of fp32 (the Megatron-Bridge performance recipes' grad_reduce_in_fp32 False)
    grad_reduce_in_bf16: bool = False
    # Megatron-LM --fp8-param-gather (NeMo fp8_params, Megatron-Bridge's mixed-precision
    # fp8_param_gather, on in its FP8 performance recipes): FP8 linear-layer weights are the
    # model's only compute copy, kept in FP8 (model/memory.py fp8_weight_copy_bytes) and
    # all-gathered in FP8 (model/costs.py fp8_gather_saving; MXFP8 weights in 16 bits, then
    # quantized again). Not priced with the blockwise recipe. Megatron
    # accepts it with the distributed optimizer only, so it applies to plans with FP8 and ZeRO
    # 1 or 2 (`fp8_params_apply`)
    fp8_param_gather: bool = False
    # Transformer Engine's FP8 scaling recipe (Megatron-LM --fp8-recipe): "delayed" (scales
    # from the amax history; Megatron-LM's default), "tensorwise" (per-tensor current
    # scaling, Megatron-Bridge's FP8-CS performance recipes: its casts read the tensor once
    # more for the amax), "mxfp8" (32-element blocks, Blackwell; FP8-MX) or "blockwise"
    # (1 x 128 and 128 x 128 blocks, Hopper): what each casts and keeps is model/fp8.py
    fp8_recipe: str = "delayed"
    # mixture of experts: tokens each expert processes relative to a perfectly balanced
    # router's share T k / E. 1.0 (default): balanced, dropless, as the published MoE
    # benchmarks force (moe_router_force_load_balancing); c > 1: Megatron-LM's token
    # dropping at capacity factor c with every expert's input padded to capacity
    # (--moe-expert-capacity-factor c --moe-pad-expert-input-to-capacity), so every expert's
    # GEMMs, its all-to-all share and its stored activations are c times the balanced ones
    moe_capacity_factor: float = 1.0
    # mixture of experts: the token dispatcher (MOE_DISPATCHERS). "alltoall" (default):
    # Megatron-LM --moe-token-dispatcher-type alltoall, one NCCL all-to-all of every routed
    # copy and one of their probabilities. "deepep" / "hybridep": --moe-token-dispatcher-type
    # flex --moe-flex-dispatcher-backend deepep|hybridep (Megatron-Core 0.16), each token sent
    # once per destination GPU with its top-k indices and weights, over the network once per
    # destination node and forwarded over NVLink there (DeepSeek-V3 report Sec. 3.2.2;
    # DeepEP internode.cu). Priced with expert TP 1 only (the flex dispatcher folds expert TP
    # into its group: token_dispatcher.py MoEFlexTokenDispatcher)
    moe_dispatcher: str = "alltoall"
    compile: bool = True
    # Megatron-Core's fused cross-entropy, its native implementation (Megatron-LM
    # --cross-entropy-loss-fusion with --cross-entropy-fusion-impl native, its default; on by
    # default in Megatron-Bridge's GPTModelProvider): the loss step peaks at 10 bytes per logit
    # against the unfused path's 6 (model/memory.py LOSS_BYTES_PER_LOGIT, measured). Transformer
    # Engine's implementation is not measured and not priced
    fused_loss: bool = False
    # torchtitan: torch.compile of the loss as well (its default with compile since v0.1.0:
    # build_cross_entropy_loss, and [compile] components ["model", "loss"] in v0.2); None
    # follows `compile`. Its 2024-12 benchmark code left the loss eager ("compiling loss
    # function causes CUDA errors", train.py), which formats/published.py says for its runs
    compile_loss: bool | None = None
    # torchtitan: K and V repeated to every query head before attention (`repeat_kv` in its
    # Llama model from 2024 to v0.2.1; v0.2.2 passes enable_gqa and keeps the kv heads: "GQA
    # without kv repeats", pytorch/torchtitan#2259, 2026-01). What context parallelism
    # exchanges and what eager kernels copy follow it (model/costs.py, model/compute.py)
    repeat_kv: bool = False
    # Megatron-LM before Megatron-Core's pipeline schedules (2021-2022 runs): each tensor rank
    # sends 1/t of a pipeline transfer and the receiver all-gathers it over NVLink (the
    # scatter/gather optimization, Narayanan et al. 2021 Sec. 4.1). Megatron-Core sends the
    # whole [s/cp, b, h] tensor from every tensor rank unless sequence parallelism has sliced
    # it (megatron/core/pipeline_parallel/schedules.py get_tensor_shapes divides the sequence
    # by TP only with sequence_parallel; its p2p_communication has no scatter or gather)
    p2p_scatter_gather: bool = False
    source: str = "job"

    def __post_init__(self):
        # every true/false field is a boolean (None where the field allows it): a sweep spec's
        # "false" (a string) had been read as true, pricing the option it meant to leave off
        for f in fields(self):
            if "bool" in str(f.type):
                v, unset = getattr(self, f.name), "None" in str(f.type)
                if not (isinstance(v, bool) or (v is None and unset)):
                    raise SpecError(f"must be true or false{' (or unset)' if unset else ''}, "
                                    f"got {v!r}", source=self.source, field=f.name)
        if self.zero is None and self.distributed_optimizer is not None:
            object.__setattr__(self, "zero", int(bool(self.distributed_optimizer)))
        if self.zero is not None:
            if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
                raise SpecError(f"ZeRO stage must be 0, 1, 2 or 3, got {self.zero!r}",
                                source=self.source, field="zero")
            object.__setattr__(self, "distributed_optimizer", self.zero >= 1)
        _positive(self.global_batch, "global_batch", self.source, integer=True)
        _positive(self.seq_length, "seq_length", self.source, integer=True)
        for f, hi, why in (("global_batch", MAX_GLOBAL_BATCH, "a 32-bit sample counter"),
                           ("seq_length", MAX_SEQ_LENGTH, "16M tokens, beyond any context")):
            if getattr(self, f) > hi:
                raise SpecError(f"is {getattr(self, f):,}; at most {hi:,} ({why})",
                                source=self.source, field=f)
        if self.precision not in PRECISIONS:
            raise SpecError(f"unknown precision '{self.precision}'; use one of "
                            f"{', '.join(PRECISIONS)} (FP8 linear layers are the fp8 field, "
                            "over a bf16 or fp16 base)", source=self.source, field="precision")
        if self.fp8 is not False and self.precision == "fp32":
            raise SpecError("FP8 linear layers need a 16-bit base precision (bf16 or fp16), "
                            "not fp32", source=self.source, field="precision")
        if self.attention not in ATTENTION:
            raise SpecError(f"unknown attention '{self.attention}'; use one of "
                            f"{', '.join(ATTENTION)}", source=self.source, field="attention")
        if self.framework not in FRAMEWORKS:
            raise SpecError(f"unknown framework '{self.framework}'; use one of "
                            f"{', '.join(FRAMEWORKS)}", source=self.source, field="framework")
        if isinstance(self.moe_capacity_factor, bool) or not isinstance(
                self.moe_capacity_factor, (int, float)) or not self.moe_capacity_factor >= 1 \
                or not math.isfinite(self.moe_capacity_factor):
            # below 1 the router drops tokens: FLOPs (and MFU) counted per token would count
            # work that is not done, and the loss is another model's; not priced
            raise SpecError(f"moe_capacity_factor must be a number of 1 or more (1.0: a "
                            f"balanced router; below 1 tokens are dropped, which the cost model "
                            f"does not price), got {self.moe_capacity_factor!r}",
                            source=self.source, field="moe_capacity_factor")
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise SpecError(f"unknown moe_dispatcher {self.moe_dispatcher!r}; use one of "
                            f"{', '.join(MOE_DISPATCHERS)}", source=self.source,
                            field="moe_dispatcher")
        if self.moe_dispatcher != "alltoall" and self.framework != "megatron":
            raise SpecError(f"moe_dispatcher {self.moe_dispatcher} is priced as Megatron-Core's "
                            f"flex dispatcher; {self.framework} is not modelled with it: use "
                            "framework megatron (emit -f nemo writes the same dispatcher) or "
                            "moe_dispatcher alltoall", source=self.source,
                            field="moe_dispatcher")
        if self.moe_dispatcher != "alltoall" and self.moe_capacity_factor != 1.0:
            # Megatron-Core refuses DeepEP with inputs padded to capacity
            # (transformer_config.py __post_init__); HybridEP's drop-and-pad is not priced
            raise SpecError(f"a capacity factor with the {self.moe_dispatcher} dispatcher is "
                            "not priced (Megatron-Core refuses DeepEP with padded expert "
                            "inputs); drop moe_capacity_factor or use moe_dispatcher alltoall",
                            source=self.source, field="moe_dispatcher")
        if self.grad_reduce_in_bf16 and (self.precision != "bf16" or self.framework not in (
                "megatron", "nemo")):
            raise SpecError("grad_reduce_in_bf16 is Megatron-LM's (and NeMo's) option for bf16 "
                            "training; set it false", source=self.source,
                            field="grad_reduce_in_bf16")
        if not isinstance(self.fp8_param_gather, bool):
            raise SpecError(f"fp8_param_gather must be true or false, got "
                            f"{self.fp8_param_gather!r}", source=self.source,
                            field="fp8_param_gather")
        if self.fp8_param_gather:
            why = ("it keeps FP8 linear layers' weights in FP8" if self.fp8 is False else
                   "it is Megatron-LM's (and NeMo's, Megatron-Bridge's)"
                   if self.framework != "megatron" else
                   "Megatron-LM accepts it with the distributed optimizer only (ZeRO 1 or 2)"
                   if self.zero in (0, 3) else None)
            if why:
                raise SpecError(f"{why}; drop it or "
                                + ("allow fp8" if self.fp8 is False else
                                   "use framework megatron" if self.framework != "megatron"
                                   else "use ZeRO 1 or 2"),
                                source=self.source, field="fp8_param_gather")
        if self.fp8_recipe not in FP8_RECIPES:
            raise SpecError(f"unknown fp8_recipe {self.fp8_recipe!r}; use one of "
                            f"{', '.join(FP8_RECIPES)}", source=self.source, field="fp8_recipe")
        if self.fp8_recipe != "delayed" and (self.fp8 is False
                                              or not self.transformer_engine):
            raise SpecError("fp8_recipe is Transformer Engine's, for FP8 linear layers: "
                            + ("allow fp8 or drop it" if self.fp8 is False else
                               "torchtitan's torchao float8 has its own scaling; drop it"),
                            source=self.source, field="fp8_recipe")
        if self.fp8_param_gather and self.fp8_recipe == "blockwise":
            raise SpecError("fp8_param_gather with the blockwise recipe is not priced (how "
                            "Megatron-Core shards and gathers 128 x 128-block weights is not "
                            "modelled); drop it, or use recipe delayed or tensorwise (mxfp8 "
                            "on Blackwell)",
                            source=self.source, field="fp8_param_gather")
        if not isinstance(self.compile, bool):
            raise SpecError(f"compile must be true or false, got {self.compile!r}",
                            source=self.source, field="compile")
        if not self.compile and self.framework != "torchtitan":
            raise SpecError(f"compile = false (--no-compile) models torchtitan's eager PyTorch "
                            f"kernels; {self.framework} always runs fused kernels: drop it or "
                            "use framework torchtitan", source=self.source, field="compile")
        if not isinstance(self.fused_loss, bool) or (self.fused_loss
                                                     and self.framework != "megatron"):
            raise SpecError(f"fused_loss is Megatron-Core's fused cross-entropy (true or "
                            f"false), got {self.fused_loss!r} for {self.framework}: drop it or "
                            "use framework megatron", source=self.source, field="fused_loss")
        if self.compile_loss is not None and (not isinstance(self.compile_loss, bool)
                                              or self.framework != "torchtitan"):
            raise SpecError(f"compile_loss is torchtitan's (true or false; unset follows "
                            f"compile), got {self.compile_loss!r} for {self.framework}: drop it",
                            source=self.source, field="compile_loss")

        if not isinstance(self.repeat_kv, bool) or (self.repeat_kv
                                                     and self.framework != "torchtitan"):
            raise SpecError(f"repeat_kv is torchtitan's (true for its releases before v0.2.2, "
                            f"which repeat K and V to the query heads), got {self.repeat_kv!r} "
                            f"for {self.framework}: drop it", source=self.source,
                            field="repeat_kv")

    @property
    def transformer_engine(self) -> bool:
        """Whether the linear layers run Transformer Engine (Megatron-LM, NeMo, DeepSpeed;
        torchtitan's FP8 is torchao's): its FP8 casts, gathers and userbuffers overlap."""
        return self.framework != "torchtitan"

    @property
    def fp8_tp_gathers(self) -> bool:
        """Whether FP8 linear layers' tensor-parallel all-gathers move FP8 (model/costs.py):
        Transformer Engine's always; torchtitan's only where its release turns Float8 TP on.
        The 2024-12 code and v0.1.0 do (parallelize tests 'float8' in model.converters, the
        name they register); v0.2.0-v0.2.2 register the converter as 'quantize.linear.float8'
        (components/quantization/float8.py:238) while llama3/infra/parallelize.py:77 still
        tests 'float8', so their TP gathers stay bf16. `repeat_kv` marks the older releases
        (the reference runs; cli.py's --framework-version 0.1)."""
        return self.framework != "torchtitan" or self.repeat_kv

    @property
    def loss_compiled(self) -> bool:
        """Whether the loss runs under torch.compile (torchtitan only)."""
        if self.framework != "torchtitan":
            return False
        return self.compile if self.compile_loss is None else self.compile_loss

    # Bytes per parameter. "replicated" (weights, gradients) stays on every data-parallel rank;
    # "shardable" (optimizer state) is divided by the data-parallel degree with the
    # distributed optimizer / ZeRO-1. FP8 adds its weight copies on top (model/memory.py).
    # - Megatron-LM's distributed-optimizer table (docs/source/api-guide/dist_optimizer.md):
    #   fp16 20 -> 4 + 16/d, bf16 18 -> 6 + 12/d, fp32 16 -> 8 + 8/d.
    # - DeepSpeed: the ZeRO paper's mixed-precision Adam (Rajbhandari et al. 2020, Sec. 3.1):
    #   2 + 2 + K with K = 12 (fp32 weights, momentum, variance); with bf16, DeepSpeed's
    #   BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py) also keeps an fp32 gradient
    #   accumulation buffer of the whole model, not partitioned: 2 + 2 + 4 + 12/d.
    @property
    def weight_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def grad_bytes(self) -> int:
        """Gradient buffers held on every rank. Megatron-LM: fp16 grads for fp16, the fp32
        main_grad for bf16 (accumulate_allreduce_grads_in_fp32), fp32 for fp32. DeepSpeed:
        16-bit grads, plus the fp32 accumulation buffer for bf16."""
        if self.precision == "fp32":
            return 4
        if self.framework == "deepspeed":
            return 6 if self.precision == "bf16" else 2
        return 2 if self.precision == "fp16" or self.grad_reduce_in_bf16 else 4

    @property
    def reduce_bytes(self) -> int:
        """Bytes per parameter the data-parallel gradient reduction moves: the buffer it
        reduces (fp32 for bf16 in Megatron-LM and DeepSpeed, fp16 for fp16; torchtitan reduces
        in float32, its default reduce_dtype)."""
        if self.framework == "torchtitan":
            return 4
        return 2 if self.precision == "fp16" or self.grad_reduce_in_bf16 else 4

    @property
    def optimizer_bytes(self) -> int:
        """fp32 master weights + Adam m and v (+ Megatron's fp32 gradient copy for fp16)."""
        if self.framework == "deepspeed":
            return {"fp16": 12, "bf16": 12, "fp32": 8}[self.precision]
        return {"fp16": 16, "bf16": 12, "fp32": 8}[self.precision]

    @property
    def activation_bytes(self) -> int:
        return element_bytes(self.precision)


def element_bytes(precision: str) -> int:
    """Bytes of an activation element: Korthikanti et al. 2022 count 16-bit activations; fp32
    doubles them."""
    return 4 if precision == "fp32" else 2


@dataclass(frozen=True)
class Overheads:
    """Memory the formulas do not see, and fixed per-iteration costs. All configurable.

    - `context_gib`: CUDA context, cuBLAS/NCCL workspaces and communication buffers, per GPU.
    - `fragmentation`: allocator cache and fragmentation, as a fraction of the tensors counted.
    Defaults fitted to the BLOOM nvidia-smi readings in the reference set: the grid search in
    bench/calibrate_overheads.py minimizes the worst relative error over those runs while every
    published out-of-memory run stays above 80 GiB and every run that ran stays within it.
    """

    context_gib: float = 1.0
    fragmentation: float = 0.2
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

    What the job overlaps (tensor-parallel communication, gradient reduction, parameter
    gathering) is part of the plan (`Shape`), since the frameworks take it as launch flags.
    """

    blocking_p2p: bool = True
    overheads: Overheads = field(default_factory=Overheads)
