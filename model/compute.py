"""Compute time of one transformer layer, the embedding and the output layer, kernel by kernel.

Every kernel takes a roofline time (Williams et al. 2009): max(FLOPs / achievable FLOP rate,
bytes / achievable HBM rate), plus the GPU's per-kernel overhead. Times are milliseconds per
micro-batch on one GPU; sizes are after tensor parallelism (t), sequence parallelism and the
micro-batch (T = micro-batch x sequence tokens).

- GEMMs: the output is cut into tiles (256 x 128, 128 x 256, 128 x 128 or 64 x 128, whichever
  is fastest), one tile per streaming multiprocessor at a time; a GEMM takes ceil(tiles / SMs)
  waves of one tile's work. Partial tiles (tile
  quantization) and a partial last wave (wave quantization) run at full cost, so small or
  awkward shapes (micro-batch 1, high TP) fall below the large-GEMM rate `gemm_efficiency x
  peak` (NVIDIA Deep Learning Performance Guide, "Matrix Multiplication Background": tile and
  wave quantization, 256 x 128 tiles on A100's 108 SMs). Bytes: both operands read and the
  output written once.
- Backward is its own GEMMs: for y = x W with x (m x k), W (k x n), the data gradient is an
  (m, k, n) GEMM and the weight gradient a (k, n, m) GEMM (same FLOPs as the forward, other
  shapes, so other efficiencies).
- FlashAttention (Dao 2023, FlashAttention-2, Sec. 3.1): the causal kernel skips the blocks
  above the diagonal (work x 0.5 (1 + 128 / s) for 128-wide blocks); the backward recomputes the
  scores, 5 matrix products against the forward's 2 (2.5x the forward work). With a sliding
  window it skips the blocks outside the window too (`flash_work_share`). The FLOPs counted
  for MFU stay those of eq. (3) of Narayanan et al. 2021 (full s x s, backward 2x; windows
  uncounted, as Megatron-LM's num_floating_point_operations counts them).
- Eager attention (Megatron-LM before FlashAttention): batched QK^T and attention-times-V GEMMs
  over b x heads/t, the fused scale-mask-softmax and the attention dropout on the s x s scores as
  element-wise kernels (Korthikanti et al. 2022 store the same tensors: 5 bytes per score).
- Element-wise kernels (norms, rotary embedding, activation, bias + dropout + residual add,
  embedding gather, cross-entropy) move the bytes listed per kernel in `_elementwise`; each
  backward reads the output gradient and what the forward saved, and writes the input gradient.
- Eager element-wise kernels (torchtitan without torch.compile, `JobSpec.compile` False): its
  Llama block runs each PyTorch operation as its own kernel, in fp32 where the code casts
  (torchtitan/models/norms.py `RMSNorm`, models/llama/model.py `apply_rotary_emb`, `repeat_kv`,
  `FeedForward`, `Attention.forward`; pytorch/torchtitan at ba24697, 2024-12); the bytes each
  kernel and its autograd backward move are listed in `EAGER_BYTES`. torch.compile
  (Inductor) fuses each chain of point-wise ops and reductions into one kernel (Ansel et al.
  2024, PyTorch 2, the TorchInductor section), which the fused counts above describe.
- FP8 (Transformer Engine, torchao float8): the four linear layers' GEMMs (forward, data and
  weight gradient) run at the FP8 peak with 1-byte operands; each GEMM input and each output
  gradient is cast first. The output layer and attention stay in the base precision
  (Transformer Engine and torchtitan keep them there). What a cast reads and writes depends on
  the recipe and the GPU (model/fp8.py `fp8_bytes`): Transformer Engine (Megatron-LM, NeMo,
  DeepSpeed) quantizes each input for the forward GEMM and, for the weight gradient, column-wise
  in the same pass (module/linear.py: input_quantizer.set_usage(rowwise=True,
  columnwise=backward_needs_input)), and each output gradient for both backward GEMMs. With
  sequence parallelism the QKV and MLP-up inputs are quantized on the local sequence shard
  before their all-gather (linear.py: quantize the local input shard, then
  gather_along_first_dim of the FP8 tensor), and so are the output gradients of the two
  row-parallel layers before theirs (module/base.py grad_output_preprocess: "FP8 with
  all-gather", gather_along_first_dim(grad_output, ..., quantizer=quantizer)): 1/t of the
  tokens. torchao float8 (torchtitan) casts the gathered tokens.
  The FP8 GEMMs run at `GPUSpec.fp8_efficiency` of the FP8 peak: the GPU's own
  fp8_gemm_efficiency, or FP8_GEMM_RATIO (0.78, the same fit) x its bf16 GEMM efficiency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .fp8 import fp8_bytes
from .specs import GPUSpec, JobSpec, ModelSpec

# output tiles of one SM: cuBLAS picks among shapes like these per GEMM (NVIDIA "Matrix
# Multiplication Background": 256 x 128 on A100; narrower tiles for skinny problems); the cost
# model takes the fastest
TILES = ((256, 128), (128, 256), (128, 128), (64, 128))
FLASH_BLOCK = 128  # key/query block of the causal FlashAttention kernel (FlashAttention-2)
FLASH_BWD_FACTOR = 2.5  # backward work / forward work (5 vs 2 matrix products)
# Transformer Engine's userbuffers TP overlap, its default configuration (Megatron-LM
# --tp-comm-overlap without a config file; transformer_engine/pytorch/module/base.py
# initialize_ub, get_default_config): "ring_exchange" layers (QKV and MLP-up forward, the
# output projection's and MLP-down's data gradient) run their GEMM in tp chunks of m / tp rows,
# one per ring step (common/comm_gemm_overlap: split_overlap_ag), with the copy engine moving
# the data; "pipeline" layers (output projection and MLP-down forward, reduce-scatter) in
# num_splits = 4 chunks; "pipeline" and "bulk" (the QKV and MLP-up backward GEMMs) leave
# num_sm = 16 SMs to the communication kernels (set_sm_margin)
UB_PIPELINE_SPLITS = 4
UB_COMM_SMS = 16

# Eager PyTorch element-wise kernels of torchtitan's Llama block (module docstring): bytes per
# element (forward, backward), bf16 activations, counted from the code, kernel by kernel:
# - RMSNorm `self._norm(x.float()).type_as(x) * self.weight`, `_norm` = x * rsqrt(mean(x^2)
#   + eps): forward x.float() 2+4, pow 4+4, mean 4, x * rsqrt 4+4, type_as 4+2, * weight 2+2
#   = 36; backward (autograd of the same chain): g * weight 2+2, g * out for dweight 2+2+2
#   and its sum 2, type_as's backward 2+4, g * r 4+4, g * x for dr 4+4+4 and its row sum 4,
#   pow's backward (x^1, times 2, times the expanded gradient) 3 x (4+4), the two gradients
#   of x added 4+4+4, float()'s backward 4+2 = 84.
# - rotary `view_as_complex(xq.float()...) * freqs_cis`, `.type_as(xq)`: forward cast 2+4,
#   complex multiply 4+4, cast back 4+2 = 20 per q / k element; backward the same three = 20.
# - SwiGLU `F.silu(w1(x)) * w3(x)`: forward silu 2+2, multiply 2+2+2 = 10 per FFN element;
#   backward the multiply's two gradients 2 x (2+2+2), silu's backward 2+2+2 = 18.
EAGER_BYTES = {"norm": (36.0, 84.0), "rope": (20.0, 20.0), "swiglu": (10.0, 18.0)}


def gemm_ms(gpu: GPUSpec, m: int, n: int, k: int, peak_flops: float, *, batch: int = 1,
            in_bytes: float = 2.0, out_bytes: float = 2.0,
            efficiency: float | None = None) -> float:
    """One (batched) GEMM C[m,n] = A[m,k] B[k,n]: waves of output tiles, or the bytes of its
    operands, whichever takes longer (module docstring), plus the kernel overhead.
    `efficiency`: the large-GEMM fraction of `peak_flops` (default `gemm_efficiency`)."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    eff = gpu.gemm_efficiency if efficiency is None else efficiency
    # one wave: every SM computes one full tile, at the large-GEMM rate per SM
    compute_ms = min(math.ceil(batch * math.ceil(m / tm) * math.ceil(n / tn) / gpu.sm_count)
                     * tm * tn for tm, tn in TILES) * gpu.sm_count * 2.0 * k / (
        peak_flops * eff) * 1e3
    memory_ms = batch * (in_bytes * (m * k + k * n) + out_bytes * m * n) / gpu.hbm_bytes_per_ms
    return max(compute_ms, memory_ms) + gpu.kernel_overhead_us / 1e3


def flash_work_share(s: int, window: int = 0) -> float:
    """The share of the full s x s work causal FlashAttention does: the blocks on and below
    the diagonal, 0.5 (1 + B / s) for B-wide blocks (half a block a row beyond the exact
    triangle). With a sliding window of W keys (W < s), the blocks the window touches: a
    query row attends to min(i + 1, W) keys, s W - W^2 / 2 in all, and the kernel's blocks add
    up to one block a row (half at the diagonal, half at the window's far edge; FlashAttention-2
    skips the blocks outside the window, flash_fwd_kernel.h n_block_min with Is_local); never
    more than the causal share."""
    causal = 0.5 * (1 + min(1.0, FLASH_BLOCK / s))
    if not window or window >= s:
        return causal
    return min(causal, (s * window - window * window / 2 + s * FLASH_BLOCK) / (s * s))


def flash_attention_ms(gpu: GPUSpec, full_flops: float, s: int, peak_flops: float, *,
                       kernels: int = 1, share: float | None = None) -> tuple[float, float]:
    """(forward, backward) ms of causal FlashAttention whose full s x s work would be
    `full_flops` (eq. 3 of Narayanan et al. 2021: 4 T s d per head): the kernel skips the
    blocks above the diagonal (`share` of the work, `flash_work_share` by default), the
    backward does 2.5x the forward work (module docstring), at `attention_efficiency` x peak;
    `kernels` launches each way (ring attention runs one kernel per ring step)."""
    work = full_flops * (flash_work_share(s) if share is None else share)
    rate = peak_flops * gpu.attention_efficiency
    launch_ms = kernels * gpu.kernel_overhead_us / 1e3
    return (work / rate * 1e3 + launch_ms, FLASH_BWD_FACTOR * work / rate * 1e3 + launch_ms)


# What the GEMM kernels the cost model prices assume of a shape: every matrix dimension a
# multiple of 16 bytes ("Performance is better when equivalent matrix dimensions M, N, and K are
# aligned to multiples of 16 bytes", NVIDIA Matrix Multiplication Background User's Guide,
# Tensor Core Requirements; PyTorch's attention kernels ask the same of the head dimension,
# aten/src/ATen/native/transformers/cuda/sdp_utils.cpp minimum_gemm_alignment: 128 bits per
# element width), and FlashAttention heads at most 256 wide (sdp_utils.cpp
# check_head_dim_size_flash). Shapes outside these are priced as if inside them.
GEMM_ALIGN_BYTES = 16
FLASH_MAX_HEAD_DIM = 256


def head_dim_aligned(model, job) -> bool:
    """Whether the attention heads' width is a multiple of GEMM_ALIGN_BYTES in the job's
    activation precision."""
    return model.qk_head_dim % (GEMM_ALIGN_BYTES // job.activation_bytes) == 0


def shape_warnings(model, job, shape) -> list[str]:
    """Where the plan's shapes leave what the GEMM and attention kernels priced here assume
    (GEMM_ALIGN_BYTES, FLASH_MAX_HEAD_DIM): one line each, for the user to read beside the
    estimate. The estimate itself is unchanged; how much slower such shapes run has no figure
    here (bench/README.md: BLOOM's pre-launch runs with head dimensions 150, 450 and 108 ran
    29-59% longer than predicted)."""
    out = []
    el = job.activation_bytes
    need = GEMM_ALIGN_BYTES // el
    head = model.qk_head_dim
    if not head_dim_aligned(model, job):
        out.append(f"head dimension {head} is not a multiple of {need} elements "
                   f"({GEMM_ALIGN_BYTES} bytes): the attention's matrix products run slower "
                   "than the aligned kernels this estimate prices (BLOOM's pre-launch runs "
                   "with head dimensions 150, 450 and 108 took 29-59% longer than predicted; "
                   "bench/README.md)")
    if job.attention == "flash" and head > FLASH_MAX_HEAD_DIM:
        out.append(f"head dimension {head} is above {FLASH_MAX_HEAD_DIM}, the widest PyTorch's "
                   "FlashAttention kernel takes: attention falls back to a slower kernel than "
                   "the FlashAttention this estimate prices")
    if job.framework == "torchtitan" and shape.tp > 1 and not shape.sequence_parallel:
        # the emit says so too (launch/emit.py); `estimate --no-sp` asks for it
        out.append("torchtitan's tensor-parallel plan always shards the norms along the "
                   "sequence (sequence parallelism); this estimate prices TP without it, which "
                   "torchtitan does not run: estimate with --sp")
    t = shape.tp
    lin = 1 if shape.fp8 else el  # FP8 linear layers: 1-byte operands
    need_lin = GEMM_ALIGN_BYTES // lin
    widths = {"hidden size": model.hidden_size, "query width per GPU": model.q_dim // t}
    if not model.is_moe or model.first_dense_layers:
        widths["MLP width per GPU"] = model.ffn_hidden_size // t
    if model.num_kv_heads >= t:
        widths["key/value width per GPU"] = model.kv_dim // t
    if model.is_moe:
        widths["expert MLP width per GPU"] = model.expert_ffn // shape.expert_tp
    for name, w in widths.items():
        if w % need_lin:
            out.append(f"{name} {w} is not a multiple of {need_lin} elements "
                       f"({GEMM_ALIGN_BYTES} bytes{' in FP8' if shape.fp8 else ''}): its "
                       "GEMMs run slower than the aligned kernels this estimate prices")
    return out


def linear_gemms(m: int, n: int, k: int) -> tuple[tuple[int, int, int], ...]:
    """The (m, n, k) GEMMs of a linear layer y[m,n] = x[m,k] W[k,n]: forward, data gradient
    dx = dy W' (m, k, n) and weight gradient dW = x' dy (k, n, m) (module docstring)."""
    return (m, n, k), (m, k, n), (k, n, m)


def elementwise_ms(gpu: GPUSpec, nbytes: float) -> float:
    """A memory-bound kernel moving `nbytes` through HBM, plus the kernel overhead."""
    if nbytes <= 0:
        return 0.0
    return nbytes / gpu.hbm_bytes_per_ms + gpu.kernel_overhead_us / 1e3


@dataclass
class Pass:
    """The kernels of one forward or backward pass: name -> ms, and the FLOPs counted as
    eq. (3) counts them (for totals and MFU)."""

    ms: dict[str, float] = field(default_factory=dict)
    flops: float = 0.0
    op_flops: dict[str, float] = field(default_factory=dict)  # name -> its share of `flops`

    def add(self, name: str, ms: float, flops: float = 0.0) -> None:
        self.ms[name] = self.ms.get(name, 0.0) + ms
        self.op_flops[name] = self.op_flops.get(name, 0.0) + flops
        self.flops += flops

    @property
    def total_ms(self) -> float:
        return sum(self.ms.values())


@dataclass
class LayerCompute:
    """One transformer layer for one micro-batch: forward, backward, and what selective
    recompute reruns (the attention core's forward)."""

    fwd: Pass
    bwd: Pass
    attention_fwd_ms: float


class ComputeModel:
    """Kernel times for one model, job and shape-level choices (t, sequence parallelism,
    micro-batch, fp8) on one GPU type."""

    def __init__(self, model: ModelSpec, job: JobSpec, gpu: GPUSpec, *, tp: int,
                 micro_batch: int, sequence_parallel: bool, fp8: bool, cp: int = 1,
                 ep: int = 1, etp: int | None = None, tp_comm_overlap: bool = False):
        self.model, self.job, self.gpu = model, job, gpu
        self.t, self.b, self.sp, self.fp8, self.cp = tp, micro_batch, sequence_parallel, fp8, cp
        self.ep, self.etp = ep, (tp if etp is None else etp)
        self.s = job.seq_length
        # tokens of a micro-batch on this GPU: context parallelism keeps 1/cp of each sequence
        self.T = micro_batch * job.seq_length // cp
        self.act_b = float(job.activation_bytes)
        self.peak = gpu.peak_flops(job.precision)
        self.peak_fp8 = gpu.peak_flops("fp8") if fp8 else self.peak
        # FP8 casts: torchao's (torchtitan) or Transformer Engine's, by recipe and GPU
        self.te = job.transformer_engine
        self.fp8b = fp8_bytes(job, gpu) if fp8 else None
        # what sequence parallelism gathers TE casts on the local 1/t shard (module docstring)
        self.cast_shard = tp if self.te and sequence_parallel else 1
        # eager element-wise kernels: torchtitan without torch.compile (module docstring)
        self.eager = job.framework == "torchtitan" and not job.compile
        # Transformer Engine's userbuffers overlap splits and squeezes the dense layers' GEMMs
        # (UB_PIPELINE_SPLITS); torchtitan's async TP is left unsplit, as fitted. The GPU its
        # GEMMs see beside the communication kernels: UB_COMM_SMS fewer SMs, each at its rate
        self.ub = tp_comm_overlap and self.te and sequence_parallel and tp > 1
        left = max(1, gpu.sm_count - UB_COMM_SMS)
        self._squeezed = (replace(gpu, sm_count=left), left / gpu.sm_count) if self.ub else None

    # -- building blocks -----------------------------------------------------------------------

    def _gemm(self, shape: tuple[int, int, int], peak: float, ib: float, eff,
              chunks: int = 1, squeezed: bool = False) -> float:
        """One GEMM, or `chunks` GEMMs of 1/chunks of its rows one after another; `squeezed`:
        on the SMs TE's communication kernels leave (waves of fewer SMs at the same rate)."""
        g = self.gpu
        if squeezed:
            g, share = self._squeezed
            peak *= share
        m, n, k = shape
        return chunks * gemm_ms(g, math.ceil(m / chunks), n, k, peak, in_bytes=ib,
                                out_bytes=self.act_b, efficiency=eff)

    def _ub_split(self, tp_role: str) -> tuple[tuple[int, bool], ...]:
        """(chunks, squeezed) of the forward, data-gradient and weight-gradient GEMMs of a
        dense linear layer under TE's userbuffers overlap (UB_PIPELINE_SPLITS)."""
        if not (self.ub and tp_role):
            return ((1, False),) * 3
        if tp_role == "col":  # forward ring exchange; both backward GEMMs bulk-overlapped
            return (self.t, False), (1, True), (1, True)
        return (UB_PIPELINE_SPLITS, True), (self.t, False), (1, False)

    def _linear(self, fwd: Pass, bwd: Pass, name: str, m: int, n: int, k: int,
                tp_role: str = "", fp8: bool | None = None) -> None:
        """y[m,n] = x[m,k] W[k,n]: forward, data-gradient and weight-gradient GEMMs; in FP8
        with the casts of the input (forward) and of the output gradient (backward).
        `tp_role`: a dense layer's tensor-parallel linear, "col" (QKV, MLP-up: sequence
        parallelism gathers its input) or "row" (the projections: it gathers its output
        gradient); TE casts the gathered tensor on its local shard (module docstring) and
        its userbuffers overlap splits the GEMMs (`_ub_split`). `fp8` False: a GEMM that stays
        in the base precision in an FP8 plan (the router)."""
        g = self.gpu
        eff = None
        if self.fp8 and fp8 is not False:
            ib, peak = 1.0, self.peak_fp8
            eff = g.fp8_efficiency
            fb, t = self.fp8b, self.cast_shard
            # the input (forward) and the output gradient (backward); the one sequence
            # parallelism gathers is cast on its shard, and any transpose follows its gather in
            # the backward (the input's re-gather, for the weight gradient)
            for p, elements, gathered in ((fwd, m * k, tp_role == "col" and t > 1),
                                          (bwd, m * n, tp_role == "row" and t > 1)):
                p.add(f"{name}.cast", elementwise_ms(
                    g, fb.shard_cast * elements / t if gathered else fb.cast * elements))
                if gathered and fb.gathered_transpose:
                    bwd.add(f"{name}.cast", elementwise_ms(g, fb.gathered_transpose * elements))
        else:
            ib, peak = self.act_b, self.peak
        flops = 2.0 * m * n * k
        for p, label, shape, (chunks, squeezed) in zip(
                (fwd, bwd, bwd), (name, f"{name}.dgrad", f"{name}.wgrad"),
                linear_gemms(m, n, k), self._ub_split(tp_role)):
            p.add(label, self._gemm(shape, peak, ib, eff, chunks, squeezed), flops)

    def dense_linears(self) -> dict[str, tuple[int, int, int]]:
        """(m, n, k) of the dense layer's four linear layers on this GPU (after TP): what
        `layer` runs for standard attention and a dense MLP, and what probe/gemm.py times."""
        m, t, T = self.model, self.t, self.T
        h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
        gated = 2 if m.gated_mlp else 1
        return {"qkv": (T, (m.q_dim + 2 * kv) // t, h), "proj": (T, h, m.o_dim // t),
                "fc1": (T, gated * f // t, h), "fc2": (T, h, f // t)}

    def _elementwise(self, p: Pass, name: str, elements: float, reads: float, writes: float,
                     extra_bytes: float = 0.0) -> None:
        """`reads` + `writes` tensors of `elements` elements in the activation precision, plus
        `extra_bytes` (dropout masks, fp32 buffers)."""
        p.add(name, elementwise_ms(self.gpu, elements * (reads + writes) * self.act_b
                                   + extra_bytes))

    # -- one transformer layer ----------------------------------------------------------------

    def layer(self) -> LayerCompute:
        m, t, T = self.model, self.t, self.T
        h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
        hs = T * h / (t if self.sp else 1)  # elements of a norm / residual region
        mask = hs if m.dropout else 0.0  # 1-byte dropout mask
        fwd, bwd = Pass(), Pass()
        linears = self.dense_linears()

        # attention block: norm, QKV, rotary, core, output projection, bias-dropout-add
        self._norm(fwd, bwd, "norm1", hs)
        q = m.q_dim  # = h unless the heads are not h / a wide
        if m.is_mla:
            self._latent_projections(fwd, bwd)
        else:
            self._linear(fwd, bwd, "qkv", *linears["qkv"], tp_role="col")
            if m.position_embedding == "rope":
                if self.eager:
                    self._eager(fwd, bwd, "rope", T * (q + kv) / t, "rope")
                else:
                    self._elementwise(fwd, "rope", T * (q + kv) / t, 1, 1)
                    self._elementwise(bwd, "rope", T * (q + kv) / t, 1, 1)
            if self.eager:
                self._eager_attention_copies(fwd, bwd)
        attn_fwd = self._attention(fwd, bwd)
        self._linear(fwd, bwd, "proj", *linears["proj"], tp_role="row")
        self._bias_dropout_add(fwd, bwd, "bda1", hs, mask)

        # MLP block: norm, up (and gate), activation, down, bias-dropout-add
        self._norm(fwd, bwd, "norm2", hs)
        if m.is_moe:
            self._moe(fwd, bwd)
            self._bias_dropout_add(fwd, bwd, "bda2", hs, mask)
            return LayerCompute(fwd, bwd, attn_fwd)
        self._linear(fwd, bwd, "fc1", *linears["fc1"], tp_role="col")
        if m.gated_mlp and self.eager:
            self._eager(fwd, bwd, "act", T * f / t, "swiglu")
        elif m.gated_mlp:  # SwiGLU: reads gate and up, writes their product
            self._elementwise(fwd, "act", T * f / t, 2, 1)
            self._elementwise(bwd, "act", T * f / t, 3, 2)
        else:  # GeLU
            self._elementwise(fwd, "act", T * f / t, 1, 1)
            self._elementwise(bwd, "act", T * f / t, 2, 1)
        self._linear(fwd, bwd, "fc2", *linears["fc2"], tp_role="row")
        self._bias_dropout_add(fwd, bwd, "bda2", hs, mask)
        return LayerCompute(fwd, bwd, attn_fwd)

    def _norm(self, fwd: Pass, bwd: Pass, name: str, elements: float) -> None:
        """A layer / RMS norm: one fused kernel each way (read x, write y; the backward reads
        the gradient and x), or torchtitan's eager RMSNorm (`EAGER_BYTES`)."""
        if self.eager:
            self._eager(fwd, bwd, name, elements, "norm")
            return
        self._elementwise(fwd, name, elements, 1, 1)
        self._elementwise(bwd, name, elements, 2, 1)

    def _eager(self, fwd: Pass, bwd: Pass, name: str, elements: float, op: str) -> None:
        """An eager PyTorch operation chain: `EAGER_BYTES[op]` per element (counted for bf16
        activations, scaled by the activation bytes otherwise: an approximation, since an
        fp32 model has no casts)."""
        scale = self.act_b / 2.0
        f_b, b_b = EAGER_BYTES[op]
        fwd.add(name, elementwise_ms(self.gpu, elements * f_b * scale))
        bwd.add(name, elementwise_ms(self.gpu, elements * b_b * scale))

    def _eager_attention_copies(self, fwd: Pass, bwd: Pass) -> None:
        """Copies eager torchtitan makes around SDPA (models/llama/model.py): `repeat_kv`
        expands K and V to every query head (read kv, write q-wide, each; the backward sums
        them back) in the releases that repeat them (`JobSpec.repeat_kv`), and
        `output.transpose(1, 2).contiguous()` copies the attention output (and its gradient
        back). Compiled, the copy fuses away; the expanded K and V that the compiled block
        still writes for SDPA are not counted there."""
        m, T, t, ab = self.model, self.T, self.t, self.act_b
        q, kv = m.q_dim / t, m.kv_dim / t
        moved = T * (q * ab * 2)  # output copy: read + write
        if self.job.repeat_kv and m.num_kv_heads < m.num_heads:
            moved += 2 * T * (kv + q) * ab  # K and V expanded
        fwd.add("attn_copies", elementwise_ms(self.gpu, moved))
        bwd.add("attn_copies", elementwise_ms(self.gpu, moved))

    def _latent_projections(self, fwd: Pass, bwd: Pass) -> None:
        """Multi-head latent attention's input projections (DeepSeek-V2 Sec. 2.1; Megatron-LM
        MultiLatentAttention): the down projections to the query latent (if any) and to the
        key/value latent plus the shared rotary key are not split over the TP ranks, each
        latent is normalized, and the up projections to per-head queries and to per-head keys
        and values are column-parallel. With sequence parallelism Megatron-LM runs the down
        projections and the latent norms on the rank's 1/t sequence shard (duplicated
        TELinear layers, gpt_layer_specs.py; multi_latent_attention.py's down projection:
        "kv_combined: [s / TP, b, ...]"), and the column-parallel up projections gather the
        latents; without it every rank runs them on all tokens. All are named "qkv" (their sum
        is what the tensor-parallel overlaps see)."""
        m, t, T = self.model, self.t, self.T
        h, ql, kvl, rope = m.hidden_size, m.mla_q_lora_rank, m.mla_kv_lora_rank, m.mla_qk_rope_dim
        heads = m.num_heads // t
        Td = T // t if self.sp and t > 1 and self.job.framework != "torchtitan" else T
        if ql:
            self._linear(fwd, bwd, "qkv", Td, ql, h)
            self._elementwise(fwd, "latent_norm", Td * ql, 1, 1)
            self._elementwise(bwd, "latent_norm", Td * ql, 2, 1)
            self._linear(fwd, bwd, "qkv", T, heads * m.qk_head_dim, ql)
        else:
            self._linear(fwd, bwd, "qkv", T, heads * m.qk_head_dim, h)
        self._linear(fwd, bwd, "qkv", Td, kvl + rope, h)
        self._elementwise(fwd, "latent_norm", Td * kvl, 1, 1)
        self._elementwise(bwd, "latent_norm", Td * kvl, 2, 1)
        self._linear(fwd, bwd, "qkv", T, heads * (m.head_dim + m.mla_v_head_dim), kvl)
        # rotary on each head's query part and on the shared key part
        self._elementwise(fwd, "rope", T * rope * (heads + 1), 1, 1)
        self._elementwise(bwd, "rope", T * rope * (heads + 1), 1, 1)

    def _moe(self, fwd: Pass, bwd: Pass) -> None:
        """A mixture-of-experts MLP: E / ep experts on this GPU, each expert's FFN split over
        the TP ranks as a dense MLP is (Megatron-LM's MoE layer: router, token permutation,
        grouped expert GEMMs, unpermutation; Fedus et al. 2022).

        The router is a T_r x E GEMM and an fp32 softmax / top-k over its logits, T_r the
        tokens it routes (below); each token is copied to its top-k experts; tokens spread
        evenly (a perfectly balanced router: load imbalance is not modelled), so each expert
        multiplies T_e k / E tokens of each of the ep ranks of its expert-parallel group,
        ep T_e k / E in all, T_e being the tokens one expert-TP group sees: the micro-batch's T
        with expert TP = TP (sequence parallelism's shares gathered), its 1 / t share with
        expert TP 1 (whole experts, each FFN unsplit); the weighted sum of the k outputs brings
        them back. The all-to-all that carries tokens between the ep ranks is communication
        (costs.CostModel.ep_alltoall_ms), and so are the expert-TP gathers (the dispatcher's:
        costs.CostModel._layer_tp_comm). Shared experts run on every token as a dense MLP of
        their combined width ("shared_fc1" / "shared_fc2"). Names "fc1" / "fc2" sum over the
        routed experts."""
        m, t, T = self.model, self.t, self.T
        h, E, k, fe = m.hidden_size, m.num_experts, m.moe_topk, m.expert_ffn
        gated = 2 if m.gated_mlp else 1
        # the router: Megatron-LM's routes each TP rank's sequence-parallel shard (router.py:
        # the layer's input is the sequence-parallel hidden states), in the base precision
        # (router_gating_linear, not a Transformer Engine layer); torchtitan gathers the MoE
        # input and runs its gate replicated (parallelize.py: "moe.router.gate": NoParallel),
        # an nn.Linear its Float8 converter takes like the others
        te = self.job.transformer_engine
        Tr = T // t if self.sp and te else T
        self._linear(fwd, bwd, "router", Tr, E, h, fp8=None if not te else False)
        self._elementwise(fwd, "router_topk", Tr * E, 1, 1, Tr * E * 4.0)
        self._elementwise(bwd, "router_topk", Tr * E, 2, 1, Tr * E * 4.0)
        ep, et = self.ep, self.etp
        Te = T * et // t if self.sp else T
        # routed copies: k per token, times the capacity factor (JobSpec.moe_capacity_factor:
        # each expert's input padded to c times the balanced share)
        Tk = Te * k * self.job.moe_capacity_factor
        self._elementwise(fwd, "permute", Tk * h, 1, 1)
        self._elementwise(bwd, "permute", Tk * h, 1, 1)
        per_expert = max(1, math.ceil(ep * Tk / E))
        for _ in range(E // ep):
            self._linear(fwd, bwd, "fc1", per_expert, gated * fe // et, h)
        act = Tk * fe / et
        self._elementwise(fwd, "act", act, gated, 1)
        self._elementwise(bwd, "act", act, gated + 1, gated)
        for _ in range(E // ep):
            self._linear(fwd, bwd, "fc2", per_expert, h, fe // et)
        self._elementwise(fwd, "unpermute", Tk * h, 1, 0, Te * h * self.act_b)
        self._elementwise(bwd, "unpermute", Tk * h, 1, 1)
        if m.moe_shared_experts:
            fs = m.moe_shared_experts * fe
            self._linear(fwd, bwd, "shared_fc1", T, gated * fs // t, h)
            self._elementwise(fwd, "shared_act", T * fs / t, gated, 1)
            self._elementwise(bwd, "shared_act", T * fs / t, gated + 1, gated)
            self._linear(fwd, bwd, "shared_fc2", T, h, fs // t)

    def _bias_dropout_add(self, fwd: Pass, bwd: Pass, name: str, hs: float, mask: float):
        """Megatron's fused bias + dropout + residual add: reads the branch and the residual,
        writes the sum (and the mask); backward reads the gradient (and the mask) and writes
        the branch's gradient; the residual's gradient passes through."""
        self._elementwise(fwd, name, hs, 2, 1, mask)
        self._elementwise(bwd, name, hs, 1, 1, mask)

    def _attention(self, fwd: Pass, bwd: Pass) -> float:
        """The attention core; returns its forward time (what selective recompute reruns)."""
        m, t, T, s, b = self.model, self.t, self.T, self.s, self.b
        g, h = self.gpu, m.q_dim
        heads = m.num_heads // t
        d = m.head_dim
        # QK^T and PV of this GPU's T queries against all s keys (eq. 3; with context
        # parallelism T = b s / cp, so each rank does 1/cp of the s x s work; latent
        # attention: qk-wide scores, v-wide values)
        full_flops = (4.0 * T * s * h / t if not m.is_mla else
                      2.0 * T * s * heads * (m.qk_head_dim + m.mla_v_head_dim))
        if self.job.attention == "flash":
            # a sliding window (ModelSpec.sliding_window): this is a windowed layer; a model's
            # full layers among them add their difference per virtual stage
            # (costs.CostModel.virtual_stage_ms, plan.full_attention_layers)
            share = flash_work_share(s, m.sliding_window) if m.sliding_window else None
            f_ms, b_ms = flash_attention_ms(g, full_flops, s, self.peak, kernels=self.cp,
                                            share=share)
            fwd.add("attention", f_ms, full_flops)
            bwd.add("attention", b_ms, 2 * full_flops)
            return f_ms
        # eager: scores, softmax (+ dropout), attention times values
        nb = b * heads
        scores = float(nb) * s * s
        drop = m.dropout
        before = fwd.total_ms
        fwd.add("qk", gemm_ms(g, s, s, d, self.peak, batch=nb), full_flops / 2)
        self._elementwise(fwd, "softmax", scores, 1, 1)
        if drop:
            self._elementwise(fwd, "attn_dropout", scores, 1, 1, scores)
        fwd.add("pv", gemm_ms(g, s, d, s, self.peak, batch=nb), full_flops / 2)
        f_ms = fwd.total_ms - before
        bwd.add("pv.dgrad", gemm_ms(g, s, s, d, self.peak, batch=nb), full_flops / 2)  # dP
        bwd.add("pv.wgrad", gemm_ms(g, s, d, s, self.peak, batch=nb), full_flops / 2)  # dV
        if drop:
            self._elementwise(bwd, "attn_dropout", scores, 1, 1, scores)
        self._elementwise(bwd, "softmax", scores, 2, 1)
        bwd.add("qk.dgrad", gemm_ms(g, s, d, s, self.peak, batch=nb), full_flops / 2)  # dQ
        bwd.add("qk.wgrad", gemm_ms(g, s, d, s, self.peak, batch=nb), full_flops / 2)  # dK
        return f_ms

    # -- embedding and output layer --------------------------------------------------------------

    def embedding(self) -> tuple[Pass, Pass]:
        """Vocabulary-parallel embedding: each rank gathers its rows (zeros elsewhere) for all
        T tokens; learned positions are added; embedding dropout. Backward scatters the
        gradient into the table."""
        m, T = self.model, self.T
        h = m.hidden_size
        fwd, bwd = Pass(), Pass()
        self._elementwise(fwd, "gather", T * h, 1, 1)
        self._elementwise(bwd, "scatter", T * h, 1, 1)
        if m.position_embedding == "learned":
            self._elementwise(fwd, "positions", T * h, 2, 1)
            self._elementwise(bwd, "positions", T * h, 1, 1)
        hs = T * h / (self.t if self.sp else 1)
        if m.embedding_norm:
            self._elementwise(fwd, "embedding_norm", hs, 1, 1)
            self._elementwise(bwd, "embedding_norm", hs, 2, 1)
        if m.dropout:
            self._elementwise(fwd, "dropout", hs, 1, 1, hs)
            self._elementwise(bwd, "dropout", hs, 1, 1, hs)
        return fwd, bwd

    def head(self) -> tuple[Pass, Pass]:
        """Final norm, output projection (base precision) and vocabulary-parallel cross-entropy
        in fp32 (Megatron-LM casts the logits to fp32 and makes about three passes: max,
        exp-sum, log; the backward reads the saved fp32 softmax and writes the gradient)."""
        m, t, T = self.model, self.t, self.T
        h, V = m.hidden_size, m.vocab_size
        hs = T * h / (t if self.sp else 1)
        fwd, bwd = Pass(), Pass()
        self._elementwise(fwd, "final_norm", hs, 1, 1)
        self._elementwise(bwd, "final_norm", hs, 2, 1)
        g, flops = self.gpu, 2.0 * T * (V // t) * h
        fwd.add("logits", gemm_ms(g, T, V // t, h, self.peak), flops)
        bwd.add("logits.dgrad", gemm_ms(g, T, h, V // t, self.peak), flops)
        bwd.add("logits.wgrad", gemm_ms(g, h, V // t, T, self.peak), flops)
        logits = float(T) * (V // t)
        fwd.add("cross_entropy", elementwise_ms(g, logits * (self.act_b + 3 * 4.0)))
        bwd.add("cross_entropy", elementwise_ms(g, logits * (4.0 + self.act_b)))
        return fwd, bwd
