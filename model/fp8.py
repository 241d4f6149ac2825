"""FP8 recipes: the bytes each one moves and keeps, by recipe and GPU.

The cast of an activation or output gradient, the cached FP8 weight copies, what a linear
layer keeps of its input, and the once-a-step weight recast all depend on the scaling recipe
and on whether the GPU's FP8 GEMMs take operands in any layout. Bytes per element, bf16 in
(NVIDIA/TransformerEngine at d0067d0; paths under transformer_engine/):

- Per-tensor scaling (`delayed`, `tensorwise`): one FP8 copy plus, where the GPU's FP8 GEMMs
  take only the TN layout (Hopper, Ada), its transpose for the backward
  (pytorch/csrc/quantizer.cpp Float8Quantizer::create_tensor: with_transpose =
  columnwise_usage && !is_non_tn_fp8_gemm_supported; common/transformer_engine.cpp
  nvte_is_non_tn_fp8_gemm_supported: compute capability 10.x, 11.x or 13.0 and later). The cast
  reads 2 and writes 1 (+ 1 transposed) in one kernel that also takes the amax (delayed:
  common/transpose/cast_transpose.cu); current scaling (`tensorwise`) first reads the tensor
  once more for its amax (Float8CurrentScalingQuantizer::quantize_impl: nvte_compute_amax,
  then nvte_quantize): + 2.
- MXFP8 (`mxfp8`, MXFP8BlockScaling): a row-wise and a column-wise copy, each scaled per 32
  elements along its own axis with one E8M0 byte (MXFP8Quantizer::create_tensor,
  get_scale_shape), both written by one kernel from the bf16 input, which takes the block amax
  itself (common/cast/mxfp8/quantize_mxfp8.cuh): read 2, write 2 + 2/32. TE runs it on compute
  capability 10.x and 11.x only (pytorch/quantization.py _compute_mxfp8_support).
- Blockwise (`blockwise`, Float8BlockScaling, DeepSeek-V3's scheme): activations and gradients
  scaled per 1 x 128 elements, weights per 128 x 128, each scale fp32, the column-wise copy
  transposed (Float8BlockQuantizer::create_tensor; recipe defaults x_block_scaling_dim=1,
  w_block_scaling_dim=2, grad_block_scaling_dim=1), one fused kernel
  (quantize_transpose_vector_blockwise): read 2, write 2 + 2 x 4/128 for activations. Native on
  Hopper (_compute_fp8_block_scaling_support: compute capability 9.0 and later); on Blackwell TE
  converts each operand to MXFP8 before every GEMM (pytorch/csrc/extensions/gemm.cpp
  convert_block_scaling_to_mxfp8_tensor), which this model does not price.
- Under sequence parallelism Transformer Engine casts a tensor it all-gathers on the local
  shard and gathers the FP8 data (pytorch/distributed.py gather_along_first_dim). Per-tensor
  recipes cast the shard row-wise only ("all-gather is not supported with FP8 column-wise
  data": module/linear.py, layernorm_linear.py) and, where the GPU needs one, transpose after
  the gather over every token (_all_gather_fp8, then update_usage(columnwise_usage=True)):
  read 1, write 1. The block recipes write both copies on the shard; an input's forward
  gather moves its row-wise copy and its backward re-gather the column-wise one (1 byte +
  scales each), an output gradient's gather both copies with their scales
  (_all_gather_mxfp8, _start_all_gather_fp8_blockwise).
- Kept for the backward (pytorch/module/linear.py: the saved input keeps its column-wise usage
  only, update_usage(rowwise_usage=False, columnwise_usage=True)): 1 byte per element, + 1/32
  (MXFP8) or + 4/128 (blockwise) of scales. The cached weight (is_first_microbatch) keeps both
  usages: 2 bytes where a transpose or a column-wise copy exists, 1 where the GPU reads the one
  copy either way, + the scales.
- torchao float8 (torchtitan): read 2, write 1 over the gathered tokens, as fitted on the
  reference set's Float8 run (data/gpus.json H100-96GB-500W fp8_gemm_efficiency); it caches no
  weight copy.

GEMMs of every recipe run at the GPU's `fp8_efficiency` of its dense FP8 peak: the block-scaled
MMA of Blackwell is rated at the FP8 peak (NVIDIA Blackwell architecture technical brief), and
no measurement here says otherwise (an assumption; the held-out Megatron-Bridge MXFP8 runs of
data/published_dense_heldout_runs.json judge it).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SpecError
from .specs import FP8_RECIPES, GPUSpec, JobSpec

MX_BLOCK = 32  # MXFP8: elements per E8M0 (1-byte) scale (OCP Microscaling spec v1.0)
BLOCK_1D = 128  # Float8BlockScaling: elements per fp32 scale of activations and gradients
BLOCK_2D = 128 * 128  # ... and of weights (128 x 128 tiles)


@dataclass(frozen=True)
class Fp8Bytes:
    """Bytes per element of one recipe on one GPU (module docstring)."""

    cast: float  # an activation or output gradient cast for its GEMMs (read + written)
    weight_cast: float  # the once-a-step recast of a linear weight (read + written)
    weight_copy: float  # the FP8 weight copies a linear layer caches, per weight element
    saved_input: float  # what a linear layer keeps of its input for the weight gradient
    # under sequence parallelism: the cast of a shard that is all-gathered next, the
    # transpose after the gather (per gathered element), and what the gathers move per
    # element: an input (forward, and its backward re-gather) and an output gradient
    shard_cast: float = 0.0
    gathered_transpose: float = 0.0
    gather_input: float = 1.0
    gather_grad: float = 1.0


TORCHAO = Fp8Bytes(cast=3.0, weight_cast=4.0, weight_copy=0.0, saved_input=1.0,
                   shard_cast=3.0)


def any_layout(gpu: GPUSpec) -> bool:
    """Whether the GPU's FP8 GEMMs take operands in any layout, so per-tensor FP8 needs no
    transposed copy (TE's nvte_is_non_tn_fp8_gemm_supported: compute capability 10.x, 11.x,
    13.0 and later)."""
    cc = gpu.compute_capability
    return cc is not None and (10.0 <= cc < 12.0 or cc >= 13.0)


def recipes_run(gpu: GPUSpec) -> tuple[str, ...]:
    """The Transformer Engine recipes this model prices on `gpu` (`recipe_problem`)."""
    return tuple(r for r in FP8_RECIPES if _recipe_problem(r, gpu) is None)


def _recipe_problem(recipe: str, gpu: GPUSpec) -> str | None:
    cc = gpu.compute_capability
    # a GPU type without one: AMD's, or a plan file's written before 2026-12-07
    has = cc if cc is not None else "no compute_capability listed"
    if recipe == "mxfp8" and not (cc is not None and 10.0 <= cc < 12.0):
        return ("MXFP8 runs on compute capability 10.x and 11.x GPUs (B200, GB200, B300, "
                f"GB300); {gpu.name} has {has}")
    if recipe == "blockwise" and not (cc is not None and 9.0 <= cc < 10.0):
        return (f"blockwise FP8 is priced on Hopper (compute capability 9.0); {gpu.name} has "
                f"{has}" + (" (Transformer Engine converts it to MXFP8 before every GEMM there)"
                            if cc is not None and cc >= 10.0 else ""))
    return None


def recipe_problem(recipe: str, gpu: GPUSpec) -> str | None:
    """Why Transformer Engine's `recipe` does not run (or is not priced) on `gpu`, with the
    recipes that do; None where it does."""
    why = _recipe_problem(recipe, gpu)
    return None if why is None else f"{why}: use {' or '.join(recipes_run(gpu))}"


def cluster_recipe_problem(job: JobSpec, cluster) -> str | None:
    """Why the job's FP8 recipe cannot run on every GPU type of `cluster` that has FP8
    tensor cores (with the recipes all of them run), or None. torchao's Float8 has none."""
    if not job.transformer_engine:
        return None
    gpus = [g for g in cluster.gpu_types if "fp8" in g.peak_tflops]
    for g in gpus:
        why = _recipe_problem(job.fp8_recipe, g)
        if why:
            common = [r for r in recipes_run(g) if all(r in recipes_run(o) for o in gpus)]
            return f"{why}: use {' or '.join(common)}"
    return None


def fp8_bytes(job: JobSpec, gpu: GPUSpec) -> Fp8Bytes:
    """The FP8 bytes of `job`'s recipe on `gpu` (module docstring); raises SpecError (field
    fp8_recipe) where the recipe does not run there."""
    if not job.transformer_engine:
        return TORCHAO
    recipe = job.fp8_recipe
    why = recipe_problem(recipe, gpu)
    if why:
        raise SpecError(why, source=job.source, field="fp8_recipe")
    if recipe in ("mxfp8", "blockwise"):
        # scale bytes per element: of an activation or gradient, of a weight
        act, wgt = ((1.0 / MX_BLOCK,) * 2 if recipe == "mxfp8" else
                    (4.0 / BLOCK_1D, 4.0 / BLOCK_2D))
        cast = 2.0 + 2.0 * (1.0 + act)  # both copies with their scales, in one pass
        return Fp8Bytes(cast=cast, weight_cast=2.0 + 2.0 * (1.0 + wgt),
                        weight_copy=2.0 * (1.0 + wgt), saved_input=1.0 + act,
                        shard_cast=cast, gathered_transpose=0.0, gather_input=1.0 + act,
                        gather_grad=2.0 * (1.0 + act))
    transposed = 0.0 if any_layout(gpu) else 1.0  # the transposed copy Hopper's GEMMs need
    amax = 2.0 if recipe == "tensorwise" else 0.0  # current scaling's extra read
    return Fp8Bytes(cast=3.0 + transposed + amax, weight_cast=3.0 + transposed + amax,
                    weight_copy=1.0 + transposed, saved_input=1.0, shard_cast=3.0 + amax,
                    gathered_transpose=2.0 * transposed)


def cluster_fp8_bytes(job: JobSpec, gpus) -> Fp8Bytes:
    """What the memory model takes for a cluster's GPU types: each field's largest over them
    (one memory model per plan; a cluster that mixes Hopper and Blackwell keeps Hopper's
    transposes everywhere, an upper bound on the Blackwell stages)."""
    each = [fp8_bytes(job, g) for g in gpus]
    return Fp8Bytes(*(max(getattr(b, f) for b in each) for f in Fp8Bytes.__dataclass_fields__))


def fp8_label(job: JobSpec | None, shape) -> str:
    """The FP8 recipe a plan is priced with, to print beside its shape: Transformer Engine's
    recipe, or torchao's Float8 (torchtitan); empty without FP8."""
    if job is None or not shape.fp8:
        return ""
    return f" ({job.fp8_recipe})" if job.transformer_engine else " (torchao float8)"


def plan_fp8_bytes(job: JobSpec, shape, cluster) -> Fp8Bytes | None:
    """`cluster_fp8_bytes` over the cluster's GPU types for a shape with FP8 linear layers;
    None without them."""
    if not shape.fp8:
        return None
    return cluster_fp8_bytes(job, cluster.gpu_types)
