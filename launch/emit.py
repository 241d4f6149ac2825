"""What each training framework needs to run a plan as chosen, and what it cannot express.

`emit(framework, model, job, cluster, plan, out_dir)` writes the framework's configuration and
the placement (launch.sh, hostfile, ranks.json from launch.ranks) and returns the files written
and the warnings: every knob of the plan a framework cannot express is reported, never dropped.

Sources of the names (each mapping below cites its own):
- Megatron-LM: megatron/training/arguments.py (`_add_distributed_args`, `_add_training_args`,
  `_add_network_size_args`, `_add_mixed_precision_args`), NVIDIA/Megatron-LM.
- Megatron-Bridge (NeMo's current API): megatron/bridge/training/config.py (ConfigContainer and
  its sections), models/gpt_provider.py, recipes/common.py, NVIDIA-NeMo/Megatron-Bridge.
- NeMo 1.x: examples/nlp/language_modeling/conf/megatron_gpt_config.yaml, NVIDIA/NeMo.
- torchtitan: torchtitan/config/job_config.py (`Parallelism`, `Training`,
  `ActivationCheckpoint`), pytorch/torchtitan.
- DeepSpeed: the JSON config reference (deepspeed.ai/docs/config-json/).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from formats.megatron_args import FSDP_TORCH_DTYPES, fsdp_grads_dtype
from formats.torchtitan_config import FLOAT8_CONVERTER, TORCHTITAN_VERSIONS, torchtitan_flavor
from model.cluster import ClusterSpec
from model.errors import SpecError
from model.costs import bucket_params
from model.memory import fp8_param_gather_note, fp8_params_apply
from model.plan import (DEEPSPEED_PARTITIONS, Plan, Shape, deepep_layout_problem, model_refusal,
                        deepspeed_pipe_partitioned,
                        deepspeed_split, deepspeed_splits, num_microbatches,
                        torch_interleave_group, torchtitan_seq_problem)
from model.specs import JobSpec, ModelSpec, Options, priced_as

from .ranks import DEFAULT_ORDER, ORDERS, TP_PP_DP_ORDER, launch_files, rank_mapping

FRAMEWORKS = ("megatron", "nemo", "torchtitan", "deepspeed")
# what a warning says changes from the plan: the pipeline schedule, the layer split, the model
# built, the parallel layout, the placement, precision, overlaps, recompute, memory
WARNING_KINDS = ("schedule", "split", "model", "parallelism", "placement", "precision",
                 "overlap", "recompute", "memory", "framework")


def tagged(framework: str, kind: str, text: str) -> str:
    """A warning line: 'framework [kind]: text'."""
    assert kind in WARNING_KINDS, kind
    return f"{framework} [{kind}]: {text}"


# ---------------------------------------------------------------------------------------------
# the layer split


def _chunks_equal_per_stage(sh: Shape) -> bool:
    return all(len({sh.layers[c * sh.pp + s] for c in range(sh.chunks)}) == 1
               for s in range(sh.pp))


def first_last_split(sh: Shape) -> dict | None:
    """The split as Megatron-Core's first/last stage counts ({} when even), or None when they
    cannot express it: TransformerConfig num_layers_in_first/last_pipeline_stage (NeMo 1.x
    keys; Megatron-LM --decoder-first/last-pipeline-num-layers) split the rest evenly and each
    stage's layers evenly over its model chunks (transformer_block.get_num_layers_to_build)."""
    if len(set(sh.layers)) == 1:
        return {}
    T = [sh.stage_layers(s) for s in range(sh.pp)]
    mid = set(T[1:-1])
    if not _chunks_equal_per_stage(sh) or len(mid) > 1:
        return None
    m = mid.pop() if mid else None
    out = {}
    if m is None or T[0] != m:
        out["num_layers_in_first_pipeline_stage"] = T[0]
    if m is None or T[-1] != m:
        out["num_layers_in_last_pipeline_stage"] = T[-1]
    return out


def _mb_group(sh: Shape) -> int | None:
    """The interleaved schedule's micro-batch group where it is not Megatron-Core's default
    (PP): ModelParallelConfig.microbatch_group_size_per_vp_stage."""
    return sh.mb_group if sh.mb_group and sh.mb_group != sh.pp else None


def megatron_split(sh: Shape) -> list[str]:
    """Megatron-LM flags that build the plan's layers per virtual stage exactly.

    An even split needs no flag (with a virtual pipeline, the layers per virtual stage:
    --num-layers-per-virtual-pipeline-stage). Uneven first and last stages with even middle
    stages, each stage's layers even over its model chunks, use
    --decoder-first/last-pipeline-num-layers (arguments.py `_add_distributed_args`; with a
    virtual pipeline together with --num-virtual-stages-per-pipeline-rank). Any other split
    is given as --pipeline-model-parallel-layout (Megatron-Core >= 0.13), which names every
    virtual stage's layers."""
    fl = first_last_split(sh)
    if fl == {}:
        return (["--num-layers-per-virtual-pipeline-stage", str(sh.layers[0])]
                if sh.chunks > 1 else [])
    if fl is not None:
        flags = (["--num-virtual-stages-per-pipeline-rank", str(sh.chunks)]
                 if sh.chunks > 1 else [])
        for key, flag in (("num_layers_in_first_pipeline_stage",
                           "--decoder-first-pipeline-num-layers"),
                          ("num_layers_in_last_pipeline_stage",
                           "--decoder-last-pipeline-num-layers")):
            if key in fl:
                flags += [flag, str(fl[key])]
        return flags
    return ["--pipeline-model-parallel-layout", pipeline_layout(sh)]


def pipeline_layout(sh: Shape) -> str:
    """Megatron-LM's experimental --pipeline-model-parallel-layout string for any split: virtual
    stages in model order separated by '|', E = embedding, t = decoder layer, L = loss
    (Megatron-LM docs, "Custom Pipeline Model Parallel Layout")."""
    parts = ["t" * n for n in sh.layers]
    parts[0] = "E" + parts[0]
    parts[-1] = parts[-1] + "L"
    return "|".join(parts)


# ---------------------------------------------------------------------------------------------
# Megatron-LM


# The Megatron-LM these arguments target, and the oldest Megatron-Core release that has each
# flag emitted here that is younger than core_r0.8.0: the first commit adding the flag to
# megatron/training/arguments.py and the earliest core tag containing it (git log -S on the
# NVIDIA/Megatron-LM history).
MEGATRON_TARGET = "Megatron-LM main of 2026-08-22 (d98e8a6), Megatron-Core 0.19 generation"
MEGATRON_MIN_CORE = {
    "--pipeline-model-parallel-layout": "0.13.0",
    "--use-megatron-fsdp": "0.15.0",
    "--fsdp-double-buffer": "0.15.0",
    "--megatron-fsdp-main-grads-dtype": "0.17.0",
    "--megatron-fsdp-grad-comm-dtype": "0.17.0",
    "--data-parallel-sharding-strategy": "0.12.0",
    "--grad-reduce-in-bf16": "0.12.0",
    "--attention-backend": "0.11.0",
    "--num-virtual-stages-per-pipeline-rank": "0.11.0",
    "--expert-tensor-parallel-size": "0.10.0",
    "--microbatch-group-size-per-virtual-pipeline-stage": "0.10.0",
    "--multi-latent-attention": "0.10.0",
    "--moe-shared-expert-intermediate-size": "0.10.0",
    "--moe-flex-dispatcher-backend": "0.16.0",
    "--overlap-moe-expert-parallel-comm": "0.14.0",
    "--delay-wgrad-compute": "0.13.0",
    "--decoder-first-pipeline-num-layers": "0.9.0",
    "--decoder-last-pipeline-num-layers": "0.9.0",
    # e5bc9249d7 "Enabling mixing SWA with full attention [gpt-oss 2/5]": both flags are in
    # core_v0.15.0, neither in core_v0.14.0 (TransformerConfig.window_size is older)
    "--window-size": "0.15.0",
    "--window-attn-skip-freq": "0.15.0",
}


def _cuda_major(gpu_name: str) -> int | None:
    """CUDA compute capability major of a GPU preset (NVIDIA CUDA GPUs list: V100 7.0, A100
    8.0, H100/H200 9.0, B200/GB200 10.0); None for others (MI300X runs ROCm)."""
    for prefix, major in (("V100", 7), ("A100", 8), ("H100", 9), ("H200", 9), ("B200", 10),
                          ("GB200", 10)):
        if gpu_name.upper().startswith(prefix):
            return major
    return None


def megatron_env(cluster: ClusterSpec, plan: Plan) -> dict[str, tuple[str | None, str]]:
    """Environment launch.sh sets for Megatron-Core (megatron/training/arguments.py
    validate_args): with TP or CP > 1 before Blackwell, CUDA_DEVICE_MAX_CONNECTIONS=1 (TP/CP
    communication kernels must be queued ahead of the compute they overlap); Megatron-FSDP
    instead requires it unset or > 1."""
    sh = plan.shape
    if sh.zero >= 2:
        return {"CUDA_DEVICE_MAX_CONNECTIONS": (
            None, "Megatron-FSDP requires CUDA_DEVICE_MAX_CONNECTIONS unset or > 1")}
    majors = {_cuda_major(nd.gpu.name) for nd in cluster.nodes}
    if (sh.tp > 1 or sh.cp > 1) and any(m is None or m < 10 for m in majors) and \
            sh.ep_comm_overlap:
        # arguments.py validate_args: with the expert all-to-all overlap it only warns, and
        # advises 1 or 32 by which overlap to favour; one connection would serialize the two
        # streams whose overlap the estimate prices
        return {"CUDA_DEVICE_MAX_CONNECTIONS": (
            "32", "the expert all-to-all overlap needs its streams to run at once (Megatron-LM "
                  "advises 1 or 32 with TP or CP before Blackwell; the estimate priced the "
                  "all-to-all overlap)")}
    if (sh.tp > 1 or sh.cp > 1) and any(m is None or m < 10 for m in majors):
        return {"CUDA_DEVICE_MAX_CONNECTIONS": (
            "1", "Megatron-LM requires 1 with tensor or context parallelism before Blackwell "
                 "(communication queued ahead of the compute it overlaps)")}
    return {}


def _divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def vocab_divisor(model: ModelSpec, sh: Shape) -> tuple[int, str | None]:
    """make_vocab_size_divisible_by that makes Megatron-Core build the plan's vocabulary
    size, and a warning when none can.

    Megatron pads the tokenizer's vocabulary up to a multiple of make_vocab_size_divisible_by
    x TP (megatron/core/tokenizers/utils/build_tokenizer.py `vocab_size_with_padding`,
    default 128; NeMo pads the same way). The plan's vocab_size is already the padded size the
    model trains with, so the divisor is chosen (the largest <= 128) that leaves it unchanged;
    a vocabulary that TP does not divide must grow to the next multiple of TP."""
    V, tp = model.vocab_size, sh.tp
    if V % tp:
        padded = -(-V // tp) * tp
        return 1, (f"vocabulary {V} is not divisible by TP={tp}: Megatron-Core pads the "
                   f"embedding and output layer to {padded} rows ({padded - V} more than "
                   "planned)")
    return _divisor_at_most(V // tp, 128), None


def megatron_args(model: ModelSpec, job: JobSpec, plan: Plan, *,
                  rank_order: str = DEFAULT_ORDER, tokenizer: str | None = None,
                  blocking_p2p: bool = True) -> tuple[list[str], list[str]]:
    """Megatron-LM command-line arguments for the plan (a complete set for pretrain_gpt.py but
    the data and optimizer hyperparameters), and the warnings. `blocking_p2p`: the pipeline
    sends as priced (Options.blocking_p2p)."""
    sh = plan.shape
    warn: list[str] = []
    # pipeline sends: Megatron-LM overlaps them by default (--no-overlap-p2p-communication
    # turns it off) but only under interleaving, where it asserts PP > 2 for blocking ones;
    # without interleaving it always blocks (arguments.py validate_args)
    p2p: list[str] = []
    if sh.pp > 1 and sh.chunks > 1 and blocking_p2p:
        if sh.pp > 2:
            p2p = ["--no-overlap-p2p-communication"]
        else:
            warn.append(tagged("megatron", "schedule", (
                "interleaving over PP 2 runs its pipeline sends overlapped (Megatron-LM asserts "
                "PP > 2 for blocking ones); the estimate priced them blocking: estimate with "
                "--overlapped")))
    elif sh.pp > 1 and not blocking_p2p and sh.chunks == 1:
        warn.append(tagged("megatron", "schedule", (
            "without interleaving Megatron-LM's pipeline sends block (it turns "
            "overlap_p2p_comm off); the estimate priced them overlapped: estimate without "
            "--overlapped")))
    # arguments.py _add_distributed_args
    a = ["--tensor-model-parallel-size", str(sh.tp),
         "--pipeline-model-parallel-size", str(sh.pp)]
    if sh.cp > 1:  # ring attention through Transformer Engine (--cp-comm-type p2p default)
        a += ["--context-parallel-size", str(sh.cp)]
    if rank_order == TP_PP_DP_ORDER:  # the placement needs pipeline-before-data rank order
        a.append("--use-tp-pp-dp-mapping")
    a += p2p
    a += megatron_split(sh)
    if _mb_group(sh):  # schedules.py get_schedule_table
        a += ["--microbatch-group-size-per-virtual-pipeline-stage", str(sh.mb_group)]
    if sh.schedule == "gpipe":
        warn.append(tagged("megatron", "schedule", (
            "Megatron-LM has no GPipe schedule; it runs 1F1B "
            "(forward_backward_pipelining_without_interleaving), which the estimate did not "
            "model")))
    # arguments.py _add_training_args
    a += ["--micro-batch-size", str(sh.micro_batch), "--global-batch-size",
          str(job.global_batch)]
    if sh.sequence_parallel:
        a.append("--sequence-parallel")
    if sh.recompute == "full":  # full = recompute every layer: uniform, 1 layer per group
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform",
              "--recompute-num-layers", "1"]
    elif sh.recompute == "selective":  # core attention only (Korthikanti et al. 2022)
        a += ["--recompute-granularity", "selective"]
    if sh.zero == 1:
        a.append("--use-distributed-optimizer")
    elif sh.zero >= 2:
        # Megatron-FSDP (Megatron-Core developer guide, "Megatron FSDP"): ZeRO-2 is the
        # optim_grads strategy, ZeRO-3 optim_grads_params; it needs the distributed optimizer
        # and no gradient-accumulation fusion, and saves fsdp_dtensor checkpoints
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
              "optim_grads" if sh.zero == 2 else "optim_grads_params",
              "--use-distributed-optimizer", "--no-gradient-accumulation-fusion",
              "--ckpt-format", "fsdp_dtensor"]
        # Megatron-FSDP's own gradient precision (Megatron-Core 0.17 on): it ignores
        # grad_reduce_in_fp32, and its 'auto' default keeps the gradients, and reduces them,
        # in the parameters' dtype (arguments.py --megatron-fsdp-main-grads-dtype,
        # --megatron-fsdp-grad-comm-dtype; param_and_grad_buffer.py _resolve_group_grad_dtype;
        # mixed_precision.py grad_comm_dtype): bf16 where the estimate prices fp32
        dtype = fsdp_grads_dtype(job)
        a += ["--megatron-fsdp-main-grads-dtype", dtype, "--megatron-fsdp-grad-comm-dtype",
              dtype]
        # two persistent buffers of layers for its gathers and its reduce-scatters, as the
        # memory is priced (model/memory.py megatron_fsdp_units; NVIDIA's Bridge performance
        # recipes set it for Megatron-FSDP)
        a.append("--fsdp-double-buffer")
        if sh.shard_size:
            # HSDP: Megatron-FSDP shards inside each of R distributed-optimizer instances,
            # consecutive slices of the data x context parallel group (parallel_state.py
            # intra-partial groups; mcore_fsdp_adapter.py enable_hsdp when R > 1) and
            # replicates across them (--outer-dp-sharding-strategy no_shard, the default)
            a += ["--num-distributed-optimizer-instances", str(sh.dp // sh.shard_size)]
    # overlaps (arguments.py _add_distributed_args): what the estimate assumed hidden
    if sh.overlap_grad_reduce:
        a.append("--overlap-grad-reduce")
    if sh.overlap_param_gather:
        a.append("--overlap-param-gather")
    if sh.tp_comm_overlap:
        a.append("--tp-comm-overlap")
    if sh.ep_comm_overlap:  # ModelParallelConfig fields as flags (Megatron-Core 0.14 / 0.13)
        a += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    # arguments.py _add_mixed_precision_args; fp32 is Megatron's default (no flag)
    if job.precision == "bf16":
        a.append("--bf16")
        if job.grad_reduce_in_bf16:  # bf16 main gradients (the estimate's 2 bytes each)
            a.append("--grad-reduce-in-bf16")
    elif job.precision == "fp16":
        a.append("--fp16")
    if job.fused_loss:  # Megatron-Core's fused cross-entropy, its default native implementation
        a.append("--cross-entropy-loss-fusion")
    if sh.fp8 and job.fp8_recipe == "tensorwise":
        # Transformer Engine's per-tensor current scaling: E4M3 forward, E5M2 gradients
        a += ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]
    elif sh.fp8 and job.fp8_recipe == "mxfp8":
        # MXFP8BlockScaling, E4M3 for every tensor (Megatron-Bridge's bf16_with_mxfp8_mixed)
        a += ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]
    elif sh.fp8 and job.fp8_recipe == "blockwise":
        # Float8BlockScaling, E4M3 forward, E5M2 gradients (Megatron-Bridge's
        # bf16_with_fp8_subchannel_scaling_mixed)
        a += ["--fp8-format", "hybrid", "--fp8-recipe", "blockwise"]
    elif sh.fp8:
        # Transformer Engine's delayed-scaling recipe: E4M3 forward, E5M2 gradients
        a += ["--fp8-format", "hybrid", "--fp8-amax-history-len", "1024",
              "--fp8-amax-compute-algo", "max"]
    if fp8_params_apply(job, sh):  # FP8 weights only (the estimate's weight bytes)
        a.append("--fp8-param-gather")
        if job.fp8_recipe == "mxfp8":
            # MXFP8 weights gathered through the gradient buffer (param_and_grad_buffer.py),
            # as the estimate's memory says and as Megatron-Bridge's bf16_with_mxfp8_mixed
            # pairs them; without it Megatron-Core remaps each weight into its parameter
            # buffer, which Transformer Engine's MXFP8Tensor refuses (replace_raw_data)
            a.append("--reuse-grad-buf-for-mxfp8-param-ag")
    # attention kernel the estimate assumed (--attention-backend: flash, fused, unfused, local,
    # auto; auto picks a fused / flash kernel, neither stores the scores)
    a += ["--attention-backend", "auto" if job.attention == "flash" else "unfused"]
    a += _megatron_model(model, job, sh, warn)
    # the vocabulary: a Hugging Face tokenizer when given, else the NullTokenizer of the
    # plan's size (pre-tokenized data); the padding rule keeps the planned size
    if tokenizer:
        a += ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer]
    else:
        a += ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(model.vocab_size)]
    div, vwhy = vocab_divisor(model, sh)
    if div != 128:  # Megatron's default
        a += ["--make-vocab-size-divisible-by", str(div)]
    if vwhy:
        warn.append(tagged("megatron", "model", vwhy))
    return a, warn


# the norms' epsilon every emitted framework defaults to: Megatron-LM --norm-epsilon
# (TransformerConfig.layernorm_epsilon, transformer_config.py), NeMo 1.x megatron_gpt_config's
# layernorm_epsilon, Megatron-Bridge's provider (a TransformerConfig)
NORM_EPS_DEFAULT = 1e-5


def norm_eps(model: ModelSpec) -> float | None:
    """The model's norm epsilon where it must be written (given, and not the default)."""
    return model.norm_eps if model.norm_eps and model.norm_eps != NORM_EPS_DEFAULT else None


def _megatron_model(model: ModelSpec, job: JobSpec, sh: Shape,
                    warn: list[str]) -> list[str]:
    """The architecture (arguments.py _add_network_size_args, _add_regularization_args,
    _add_moe_args, _add_mla_args)."""
    a = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
         "--ffn-hidden-size", str(model.ffn_hidden_size),
         "--num-attention-heads", str(model.num_heads),
         "--seq-length", str(job.seq_length),
         "--max-position-embeddings", str(max(model.seq_length, job.seq_length))]
    if model.position_embedding == "rope":
        a += ["--position-embedding-type", "rope"]
        if model.rope_base:  # an integer flag (arguments.py --rotary-base type=int)
            a += ["--rotary-base", str(round(model.rope_base))]
            if model.rope_base != round(model.rope_base):
                warn.append(tagged("megatron", "model", (
                    f"rotary base {model.rope_base:g} rounded to {round(model.rope_base)} "
                    "(Megatron-LM's --rotary-base is an integer)")))
        if model.rotary_percent != 1.0:
            a += ["--rotary-percent", f"{model.rotary_percent:g}"]
    elif model.position_embedding == "learned":
        a += ["--position-embedding-type", "learned_absolute"]
    else:  # ALiBi: a bias on the scores, no weights; Megatron-LM has no such choice
        a += ["--position-embedding-type", "none"]
        warn.append(tagged("megatron", "model", (
            f"{model.position_embedding} positions have no Megatron-LM choice "
            "(--position-embedding-type learned_absolute, rope, mrope, relative, none); the "
            "arguments build a model without position embedding (same weights and cost); "
            "BLOOM's ALiBi needs Megatron-DeepSpeed")))
    if model.embedding_norm:
        warn.append(tagged("megatron", "model", (
            "the LayerNorm after the embedding has no Megatron-LM flag; the model built "
            "lacks it (2h weights)")))
    a += ["--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm"]
    if eps := norm_eps(model):
        a += ["--norm-epsilon", repr(eps)]  # exactly (argparse reads it with float)
    if model.qk_norm or model.is_mla:
        # arguments.py: normalize q and k per head (Qwen3); under MLA the flag builds the
        # latent norms of DeepSeek's q/kv down-projections (gpt_layer_specs.py: without it the
        # up-projections are plain linears), which the cost model counts
        a.append("--qk-layernorm")
    if not model.bias:
        a.append("--disable-bias-linear")
        if model.qkv_bias:  # TransformerConfig.add_qkv_bias (Qwen2): biases on q, k, v only
            a.append("--add-qkv-bias")
    if not model.dropout:  # Megatron's defaults are 0.1 each
        a += ["--hidden-dropout", "0", "--attention-dropout", "0"]
    if model.is_mla:  # arguments.py _add_mla_args (qk-head-dim: the non-rotary part)
        a += ["--multi-latent-attention", "--kv-lora-rank", str(model.mla_kv_lora_rank),
              "--qk-head-dim", str(model.head_dim),
              "--qk-pos-emb-head-dim", str(model.mla_qk_rope_dim),
              "--v-head-dim", str(model.mla_v_head_dim)]
        if model.mla_q_lora_rank:
            a += ["--q-lora-rank", str(model.mla_q_lora_rank)]
    elif model.kv_channels:
        a += ["--kv-channels", str(model.kv_channels)]
    if model.num_kv_heads != model.num_heads:
        a += ["--group-query-attention", "--num-query-groups", str(model.num_kv_heads)]
    if model.gated_mlp:
        a.append("--swiglu")
    if model.is_moe:
        # arguments.py _add_moe_args: the experts split over EP ranks, each expert's FFN over
        # the plan's expert-TP ranks; the token dispatcher the cost model times
        # (JobSpec.moe_dispatcher: costs.ep_alltoall_ms); grouped GEMMs for the local experts
        a += ["--num-experts", str(model.num_experts), "--moe-router-topk", str(model.moe_topk),
              "--moe-ffn-hidden-size", str(model.expert_ffn),
              "--expert-model-parallel-size", str(sh.ep),
              "--expert-tensor-parallel-size", str(sh.expert_tp),
              *dispatcher_args(job, sh), "--moe-grouped-gemm"]
        if model.first_dense_layers:  # leading dense layers (arguments.py: a list pattern)
            a += ["--moe-layer-freq",
                  f"([0]*{model.first_dense_layers}+[1]*{model.moe_layers})"]
        if job.moe_capacity_factor != 1.0:  # token dropping, inputs padded to capacity
            a += ["--moe-expert-capacity-factor", f"{job.moe_capacity_factor:g}",
                  "--moe-pad-expert-input-to-capacity"]
        if model.moe_shared_experts:
            a += ["--moe-shared-expert-intermediate-size",
                  str(model.moe_shared_experts * model.expert_ffn)]
    if not model.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    a += megatron_window_args(model)
    return a


def window_fields(model: ModelSpec) -> dict:
    """The sliding window as TransformerConfig fields (NeMo's model keys, Megatron-Bridge's
    provider): window_size (left, right) with the query's own key not counted in left (W - 1
    for Hugging Face's W keys; core/transformer/utils.py get_sliding_window_causal_mask), and
    window_attn_skip_freq N where every Nth layer attends fully; none without a window."""
    if not model.sliding_window:
        return {}
    out = {"window_size": [model.sliding_window - 1, 0]}
    if model.window_full_every:
        out["window_attn_skip_freq"] = model.window_full_every
    return out


def megatron_window_args(model: ModelSpec) -> list[str]:
    """`window_fields` as Megatron-LM flags (arguments.py --window-size, a 'left,right'
    tuple, and --window-attn-skip-freq)."""
    f = window_fields(model)
    a = []
    if f:
        a += ["--window-size", ",".join(map(str, f["window_size"]))]
    if "window_attn_skip_freq" in f:
        a += ["--window-attn-skip-freq", str(f["window_attn_skip_freq"])]
    return a


def flex_dispatcher(job: JobSpec, shape) -> str | None:
    """The flex dispatcher's backend the plan runs (JobSpec.moe_dispatcher), or None for the
    alltoall dispatcher: also with EP 1, where no tokens move and Megatron-Core's DeepEP and
    NCCL EP backends refuse a TP x EP group of one (token_dispatcher.py: 'requires TPxEP >
    1'; the flex dispatcher is priced with expert TP 1)."""
    return job.moe_dispatcher if job.moe_dispatcher != "alltoall" and shape.ep > 1 else None


def dispatcher_args(job: JobSpec, shape) -> list[str]:
    """Megatron-LM's token dispatcher flags (TransformerConfig fields as flags:
    --moe-token-dispatcher-type, --moe-flex-dispatcher-backend from Megatron-Core 0.16)."""
    flex = flex_dispatcher(job, shape)
    if flex is None:
        return ["--moe-token-dispatcher-type", "alltoall"]
    return ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", flex]


def dispatcher_fields(job: JobSpec, shape) -> dict:
    """The same as TransformerConfig fields (NeMo's model keys, Megatron-Bridge's provider),
    with the all-to-all overlap's (Shape.ep_comm_overlap) where the plan has it."""
    flex = flex_dispatcher(job, shape)
    out = ({"moe_token_dispatcher_type": "alltoall"} if flex is None else
           {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": flex})
    if shape.ep_comm_overlap:
        out.update(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)
    return out


def megatron_args_text(args: list[str], plan: Plan, notices: list[str] = ()) -> str:
    """One flag (and its value) per line; '#' lines are comments (launch.sh skips them). The
    header names the Megatron-LM the flags target and the minimum release of the newer ones."""
    newer = [f"{f} {MEGATRON_MIN_CORE[f]}" for f in args if f in MEGATRON_MIN_CORE]
    lines = [f"# {n}" for n in notices]
    lines += [f"# Megatron-LM arguments for {plan.shape.describe()}",
              f"# layers per virtual stage: {list(plan.shape.layers)}",
              f"# target: {MEGATRON_TARGET}",
              "# minimum Megatron-Core release of the newer flags used here: "
              + (", ".join(newer) if newer else "none") + "; the others are in 0.8.0 or older",
              "# data, optimizer and run length are yours: launch.sh passes its own arguments on,",
              "# e.g. bash launch.sh --data-path PREFIX --lr 3e-4 --train-iters 1000",
              "# (or --mock-data to try the plan)"]
    cur: list[str] = []
    for x in args:
        if x.startswith("--") and cur:
            lines.append(" ".join(cur))
            cur = []
        cur.append(x)
    if cur:
        lines.append(" ".join(cur))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# NeMo


def _yaml_scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_yaml_scalar(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_yaml_scalar(x)}" for k, x in v.items()) + "}"
    s = str(v)
    return json.dumps(s)  # a JSON string is a valid YAML double-quoted scalar


def to_yaml(d: dict, indent: int = 0) -> str:
    """A tiny YAML writer for nested dicts of scalars and flat lists (no dependency)."""
    out = []
    for k, v in d.items():
        pad = "  " * indent
        if isinstance(v, dict):
            out.append(f"{pad}{k}:")
            out.append(to_yaml(v, indent + 1).rstrip("\n"))
        else:
            out.append(f"{pad}{k}: {_yaml_scalar(v)}")
    return "\n".join(out) + "\n"


def _nemo_architecture(model: ModelSpec, sh: Shape, tokenizer: str | None,
                       warn: list[str]) -> dict:
    """The model as NeMo 1.x builds it (megatron_gpt_config.yaml keys: normalization, bias,
    activation, position_embedding_type with rotary_base / rotary_percentage, dropouts,
    make_vocab_size_divisible_by, tokenizer)."""
    m: dict = {"normalization": "rmsnorm" if model.norm == "rmsnorm" else "layernorm",
               "bias": model.bias,
               "activation": "fast-swiglu" if model.gated_mlp else "gelu",
               "position_embedding_type": {"rope": "rope", "learned": "learned_absolute",
                                           "alibi": "alibi"}[model.position_embedding]}
    if model.position_embedding == "rope":
        if model.rope_base:
            m["rotary_base"] = model.rope_base
        m["rotary_percentage"] = model.rotary_percent
    if eps := norm_eps(model):
        m["layernorm_epsilon"] = eps
    if not model.dropout:
        m.update(hidden_dropout=0.0, attention_dropout=0.0)
    if model.qkv_bias and not model.bias:
        warn.append(tagged("nemo", "model", "the biases on the query, key and value "
                           "projections (Qwen2) have no NeMo 1.x megatron_gpt_config key this "
                           "tool knows: the model built may lack them; emit the Bridge recipe "
                           "(--framework-version bridge), which sets add_qkv_bias"))
    if model.qk_norm:
        warn.append(tagged("nemo", "model", "the per-head q/k normalization (QK-norm) has no "
                           "NeMo 1.x megatron_gpt_config key this tool knows: the model built "
                           "may lack it; check the config NeMo prints, or emit the Bridge "
                           "recipe (--framework-version bridge), which sets qk_layernorm"))
    if model.embedding_norm:
        warn.append("nemo [model]: the LayerNorm after the embedding has no NeMo 1.x key; the "
                    "model built lacks it (2h weights)")
    m["make_vocab_size_divisible_by"], vwhy = vocab_divisor(model, sh)
    if vwhy:
        warn.append(f"nemo [model]: {vwhy}")
    if tokenizer:
        m["tokenizer"] = {"library": "huggingface", "type": tokenizer, "model": None,
                          "vocab_file": None, "merge_file": None}
    else:
        warn.append(f"nemo [model]: the vocabulary comes from model.tokenizer (GPT-2 BPE by "
                    f"default); give a tokenizer with {model.vocab_size} entries (--tokenizer "
                    "NAME) or the embedding differs from the plan")
    return m


def nemo_config(model: ModelSpec, job: JobSpec, cluster: ClusterSpec,
                plan: Plan, tokenizer: str | None = None,
                blocking_p2p: bool = True) -> tuple[dict, list[str]]:
    """NeMo 1.x (Megatron GPT) config for the plan: a full config, megatron_gpt_config.yaml
    from NeMo's examples as the default it overrides (a Hydra defaults list), with the
    architecture, split, parallel and precision keys of the plan. `blocking_p2p`: the
    pipeline sends as priced (Options.blocking_p2p)."""
    sh = plan.shape
    warn = []
    G = cluster.gpus_per_node
    if G is None:
        warn.append("nemo [placement]: trainer.devices is one count for every node, but the "
                    "nodes have different GPU counts")
        G = max(nd.num_gpus for nd in cluster.nodes)
    # Lightning 2 precision strings; megatron_amp_O2 keeps fp32 main weights in the optimizer
    # (Megatron-style mixed precision, the memory the estimate assumes)
    prec = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": 32}[job.precision]
    m: dict = {
        "micro_batch_size": sh.micro_batch,
        "global_batch_size": job.global_batch,
        "tensor_model_parallel_size": sh.tp,
        "pipeline_model_parallel_size": sh.pp,
        "context_parallel_size": sh.cp,
        "virtual_pipeline_model_parallel_size": sh.chunks if sh.chunks > 1 else None,
        "sequence_parallel": sh.sequence_parallel,
        "megatron_amp_O2": job.precision != "fp32",
        "encoder_seq_length": job.seq_length,
        "max_position_embeddings": max(model.seq_length, job.seq_length),
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_heads,
        "num_query_groups": model.num_kv_heads if model.num_kv_heads != model.num_heads
        else None,
        "share_embeddings_and_output_weights": model.tied_embeddings,
        **window_fields(model),
    }
    if _mb_group(sh):  # a ModelParallelConfig field: NeMo passes it to Megatron-Core
        m["microbatch_group_size_per_vp_stage"] = _mb_group(sh)
    if model.gated_mlp:
        m["activation"] = "fast-swiglu"  # NeMo llama configs
    if job.fused_loss:
        # a TransformerConfig field found in the model config passes to Megatron-Core
        # (megatron_base_model.py build_transformer_config, NeMo 8cfedd7); its default is False
        m["cross_entropy_loss_fusion"] = True
    if model.is_mla:  # qk_layernorm: the latent norms (a TransformerConfig field passes on)
        m.update(multi_latent_attention=True, qk_layernorm=True,
                 kv_lora_rank=model.mla_kv_lora_rank,
                 q_lora_rank=model.mla_q_lora_rank or None, qk_head_dim=model.head_dim,
                 qk_pos_emb_head_dim=model.mla_qk_rope_dim, v_head_dim=model.mla_v_head_dim)
    elif model.kv_channels:
        m["kv_channels"] = model.kv_channels
    if model.is_moe:  # NeMo (Megatron-Core) MoE keys
        m.update(num_moe_experts=model.num_experts, moe_router_topk=model.moe_topk,
                 expert_model_parallel_size=sh.ep, expert_tensor_parallel_size=sh.expert_tp,
                 moe_grouped_gemm=True, **dispatcher_fields(job, sh))
        if model.first_dense_layers:
            m["moe_layer_freq"] = [0] * model.first_dense_layers + [1] * model.moe_layers
        if job.moe_capacity_factor != 1.0:
            m.update(moe_expert_capacity_factor=job.moe_capacity_factor,
                     moe_pad_expert_input_to_capacity=True)
        if model.expert_ffn != model.ffn_hidden_size or model.moe_shared_experts:
            warn.append("nemo [model]: the expert FFN width and shared experts have no NeMo 1.x "
                        "key here; set them in the model config")
    # activations_checkpoint_* keys: granularity 'selective' | 'full', method 'uniform'
    if sh.recompute == "full":
        m.update(activations_checkpoint_granularity="full",
                 activations_checkpoint_method="uniform", activations_checkpoint_num_layers=1)
    elif sh.recompute == "selective":
        m.update(activations_checkpoint_granularity="selective",
                 activations_checkpoint_method=None, activations_checkpoint_num_layers=None)
    else:
        m.update(activations_checkpoint_granularity=None, activations_checkpoint_method=None,
                 activations_checkpoint_num_layers=None)
    # NeMo's distributed optimizer is the optim name distributed_fused_adam
    m["optim"] = {"name": "distributed_fused_adam" if sh.zero == 1 else "fused_adam"}
    if sh.zero >= 2:
        # NeMo 1.x PyTorch-FSDP strategy (nlp_overrides.NLPFSDPStrategy): sharding_strategy
        # 'grad' (SHARD_GRAD_OP, ZeRO-2), 'full' (FULL_SHARD, ZeRO-3); what it refuses at
        # start-up (NeMo 8cfedd7) is refused here, with the line that refuses it
        bridge = "emit for --framework-version bridge (Megatron-FSDP runs it)"
        refused = [(sh.shard_size, "shard_size", "hybrid sharding (HSDP): NLPFSDPStrategy "
                    "asserts sharding_strategy != 'hybrid' (nlp_overrides.py:814)",
                    "emit for --framework-version bridge (Megatron-FSDP's HSDP), or drop "
                    "--shard-size (plain ZeRO-3 runs here)"),
                   (sh.pp > 1, "pp", "pipeline parallelism: 'FSDP does not support pipeline "
                    "parallelism' (nlp_overrides.py:867)", f"{bridge}, or solve with --pp 1"),
                   (sh.fp8, "fp8", "FP8: 'Torch FSDP does not support FP8.' "
                    "(megatron_base_model.py:1090)", f"{bridge}, or use bf16"),
                   (sh.tp_comm_overlap, "tp_comm_overlap", "TP communication overlap: turned "
                    "off under FSDP (megatron_base_model.py:1081-1087), while the plan was "
                    "priced with it", f"{bridge}, or drop --tp-comm-overlap")]
        hit = next((x for x in refused if x[0]), None)
        if hit:
            raise SpecError(f"NeMo 1.x's FSDP (ZeRO-{sh.zero}) does not run {hit[2]}; {hit[3]}",
                            source="plan", field=hit[1])
        m["fsdp"] = True
        m["fsdp_sharding_strategy"] = "grad" if sh.zero == 2 else "full"
        m["megatron_amp_O2"] = False  # FSDP keeps its own fp32 shards
    if job.grad_reduce_in_bf16:
        if sh.zero == 1:
            # the distributed optimizer's gradient buffers and reductions in bf16: NeMo 1.x
            # builds Megatron-Core's DDP with grad_reduce_in_fp32 = (optim.grad_sync_dtype ==
            # 'fp32') (megatron_base_model.py setup_mcore_distributed_parallel), apex's
            # DistributedFusedAdam takes the same grad_sync_dtype
            m["optim"]["grad_sync_dtype"] = "bf16"
        else:
            warn.append("nemo [memory]: NeMo 1.x keeps fp32 main gradients without the "
                        "distributed optimizer (megatron_gpt_model.py configure_optimizers: "
                        "fp32_grad_accum with bf16 O2) and has no key for the plan's bf16 "
                        "gradients: 2 bytes per parameter more than the estimate; estimate "
                        "without --grad-reduce-in-bf16, or emit for --framework-version bridge")
    if sh.zero <= 1:
        # written either way: NeMo's MegatronDistributedFusedAdam takes apex's defaults,
        # overlap_grad_sync and overlap_param_sync True (apex distributed_fused_adam.py); with
        # fused_adam, Megatron-Core's DDP reads overlap_grad_sync (megatron_gpt_model.py:602)
        m["optim"]["overlap_grad_sync"] = sh.overlap_grad_reduce
        if sh.zero == 1:
            m["optim"]["overlap_param_sync"] = sh.overlap_param_gather
    if sh.tp_comm_overlap:
        m["ub_tp_comm_overlap"] = True
    if sh.fp8:
        m.update(fp8=True, fp8_hybrid=True, fp8_amax_history_len=1024,
                 fp8_amax_compute_algo="max")
        if job.fp8_recipe != "delayed":
            warn.append(f"nemo [precision]: NeMo 1.x's FP8 is Transformer Engine's delayed "
                        f"scaling; the plan's {job.fp8_recipe} recipe has no key here (its "
                        "casts and FP8 copies are not delayed scaling's: model/fp8.py)")
        if fp8_params_apply(job, sh):  # megatron_gpt_model.py: fp8_param_gather=fp8_params
            m["fp8_params"] = True
    # Transformer Engine's layer spec: with transformer_engine False (the YAML's default) NeMo's
    # Megatron-Core model takes the local spec, whose DotProductAttention stores the scores
    # whatever use_flash_attention says (megatron_gpt_model.py get_specs; use_flash_attention
    # only reaches the legacy non-mcore model), and FP8 needs TE's layers. TE's attention
    # picks FlashAttention or cuDNN's fused kernel (attention_backend auto, which NeMo hands
    # to TransformerConfig: megatron_base_model.py build_transformer_config); eager is its
    # unfused backend, which stores the scores
    m["transformer_engine"] = True
    m["use_flash_attention"] = job.attention == "flash"
    if job.attention != "flash":
        m["attention_backend"] = "unfused"
    first_last = first_last_split(sh)
    if first_last is None:
        warn.append(f"nemo [split]: the layer split {list(sh.layers)} has no NeMo 1.x YAML key "
                    "(num_layers_in_first/last_pipeline_stage set only the first and last "
                    "stage, each stage's layers even over its model chunks); NeMo splits "
                    "evenly instead")
    else:
        m.update(first_last)
    m.update(_nemo_architecture(model, sh, tokenizer, warn))
    if sh.schedule == "gpipe":
        warn.append("nemo [schedule]: NeMo (Megatron-Core) has no GPipe schedule; it runs 1F1B")
    # pipeline sends: megatron_gpt_config.yaml leaves overlap_p2p_comm off (blocking), and
    # Megatron-Core overlaps them only under interleaving (as for Megatron-LM above)
    if sh.pp > 1 and sh.chunks > 1 and not blocking_p2p:
        m["overlap_p2p_comm"] = True
    elif sh.pp > 1 and sh.chunks == 1 and not blocking_p2p:
        warn.append("nemo [schedule]: without interleaving Megatron-Core's pipeline sends "
                    "block; the estimate priced them overlapped: estimate without --overlapped")
    cfg = {"defaults": ["megatron_gpt_config", "_self_"],
           "trainer": {"num_nodes": cluster.num_nodes, "devices": G, "accelerator": "gpu",
                       "precision": prec},
           "model": m}
    return cfg, warn


# ---------------------------------------------------------------------------------------------
# Megatron-Bridge (NeMo Framework's Megatron-Core training library; NeMo 2.0's recipes move to it:
# docs.nvidia.com/nemo/megatron-bridge, "NeMo 2.0 to Megatron Bridge Migration Guide")

BRIDGE_TARGET = "Megatron-Bridge main of 2026-08-22 (067f987, after v0.6.0)"
# NeMo releases emitted for: "bridge" (a Megatron-Bridge recipe, the current API) and "1" (the
# NeMo 1.x YAML)
NEMO_VERSIONS = ("bridge", "1")


class _Code(str):
    """A Python expression written as is into a recipe (an imported name), not as a literal."""

    def __repr__(self) -> str:
        return str(self)


def bridge_recipe(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, plan: Plan, *,
                  rank_order: str = DEFAULT_ORDER, tokenizer: str | None = None,
                  blocking_p2p: bool = True) -> tuple[dict[str, dict], list[str]]:
    """The plan as a Megatron-Bridge ConfigContainer: {section: {field: value}} over the
    library's own pre-training defaults (megatron/bridge/recipes/common.py _pretrain_common, the
    base of its Llama, Qwen and DeepSeek recipes), and the warnings. The model is a
    GPTModelProvider (MLAModelProvider for latent attention) built from the model spec, not
    from a Hugging Face checkpoint: field names are Megatron-Core TransformerConfig's
    (megatron/core/transformer/transformer_config.py) plus GPTModelProvider's
    (megatron/bridge/models/gpt_provider.py); ddp, dist, train, tokenizer and mixed_precision
    are megatron/bridge/training/config.py's."""
    sh = plan.shape
    warn: list[str] = []
    m: dict = {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
               "ffn_hidden_size": model.ffn_hidden_size,
               "num_attention_heads": model.num_heads,
               "num_query_groups": model.num_kv_heads, "seq_length": job.seq_length,
               "normalization": "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
               "add_bias_linear": model.bias}
    if eps := norm_eps(model):  # TransformerConfig.layernorm_epsilon
        m["layernorm_epsilon"] = eps
    if model.qkv_bias and not model.bias:  # TransformerConfig.add_qkv_bias (Qwen2)
        m["add_qkv_bias"] = True
    if model.qk_norm or model.is_mla:  # TransformerConfig.qk_layernorm (MLA: latent norms)
        m["qk_layernorm"] = True
    # SwiGLU = a gated linear unit with SiLU (Megatron-Core's --swiglu); else GeLU
    m.update(activation_func=_Code("F.silu" if model.gated_mlp else "F.gelu"),
             gated_linear_unit=model.gated_mlp)
    if model.position_embedding == "rope":
        m["position_embedding_type"] = "rope"
        if model.rope_base:  # an int field unless the base is fractional
            m["rotary_base"] = (int(model.rope_base) if model.rope_base == int(model.rope_base)
                                else model.rope_base)
        m["rotary_percent"] = model.rotary_percent
    elif model.position_embedding == "learned":
        m["position_embedding_type"] = "learned_absolute"
    else:  # ALiBi: GPTModelProvider has learned_absolute, rope, yarn (and Megatron's none)
        m["position_embedding_type"] = "none"
        warn.append(tagged("nemo", "model", (
            f"{model.position_embedding} positions have no Megatron-Bridge choice; the recipe "
            "builds a model without position embedding (same weights and cost)")))
    if model.embedding_norm:
        warn.append(tagged("nemo", "model", "the LayerNorm after the embedding has no "
                           "Megatron-Bridge field; the model built lacks it (2h weights)"))
    if not model.dropout:
        m.update(hidden_dropout=0.0, attention_dropout=0.0)
    m["share_embeddings_and_output_weights"] = model.tied_embeddings
    m.update(window_fields(model))
    if model.is_mla:  # MLATransformerConfig (qk_head_dim: the non-rotary part); the flag is not
        # on by default in Megatron-Bridge's MLAModelProvider (its DeepSeek bridges set it)
        m.update(multi_latent_attention=True, q_lora_rank=model.mla_q_lora_rank or None,
                 kv_lora_rank=model.mla_kv_lora_rank, qk_head_dim=model.head_dim,
                 qk_pos_emb_head_dim=model.mla_qk_rope_dim, v_head_dim=model.mla_v_head_dim)
    elif model.kv_channels:
        m["kv_channels"] = model.kv_channels
    if model.is_moe:  # the dispatcher and grouped GEMMs the cost model times
        m.update(num_moe_experts=model.num_experts, moe_router_topk=model.moe_topk,
                 moe_ffn_hidden_size=model.expert_ffn, moe_grouped_gemm=True,
                 **dispatcher_fields(job, sh))
        if model.first_dense_layers:
            m["moe_layer_freq"] = [0] * model.first_dense_layers + [1] * model.moe_layers
        if model.moe_shared_experts:
            m["moe_shared_expert_intermediate_size"] = model.moe_shared_experts * model.expert_ffn
        if job.moe_capacity_factor != 1.0:
            m.update(moe_expert_capacity_factor=job.moe_capacity_factor,
                     moe_pad_expert_input_to_capacity=True)
    div, vwhy = vocab_divisor(model, sh)
    m["make_vocab_size_divisible_by"] = div
    if vwhy:
        warn.append(tagged("nemo", "model", vwhy))
    # parallel layout and split (the same TransformerConfig fields as Megatron-LM's flags)
    m.update(tensor_model_parallel_size=sh.tp, pipeline_model_parallel_size=sh.pp,
             context_parallel_size=sh.cp, sequence_parallel=sh.sequence_parallel,
             expert_model_parallel_size=sh.ep)
    if model.is_moe:
        m["expert_tensor_parallel_size"] = sh.expert_tp
    fl = first_last_split(sh)
    m.update({"pipeline_model_parallel_layout": pipeline_layout(sh)} if fl is None else fl)
    m["virtual_pipeline_model_parallel_size"] = sh.chunks if sh.chunks > 1 else None
    if _mb_group(sh):
        m["microbatch_group_size_per_vp_stage"] = _mb_group(sh)
    if sh.schedule == "gpipe":
        warn.append(tagged("nemo", "schedule", "Megatron-Core has no GPipe schedule; it runs "
                           "1F1B, which the estimate did not model"))
    rec = {"none": (None, None, None), "selective": ("selective", None, None),
           "full": ("full", "uniform", 1)}[sh.recompute]
    m.update(recompute_granularity=rec[0], recompute_method=rec[1], recompute_num_layers=rec[2])
    m["attention_backend"] = _Code("AttnBackend.auto" if job.attention == "flash"
                                   else "AttnBackend.unfused")
    # the loss the estimate's memory counts (model/memory.py LOSS_BYTES_PER_LOGIT): Megatron's
    # unfused vocab_parallel_cross_entropy, 6 bytes per logit at its peak, unless the job
    # fuses it (JobSpec.fused_loss: the native implementation, 10; the provider's default is
    # fused, so it is always set)
    m["cross_entropy_loss_fusion"] = job.fused_loss
    if job.fused_loss:
        m["cross_entropy_fusion_impl"] = "native"
    ddp = {"use_distributed_optimizer": sh.zero >= 1,
           "overlap_grad_reduce": sh.overlap_grad_reduce,
           "overlap_param_gather": sh.overlap_param_gather,
           "grad_reduce_in_fp32": not job.grad_reduce_in_bf16,
           "use_megatron_fsdp": sh.zero >= 2,
           # DistributedDataParallelConfig.fsdp_double_buffer, as priced (megatron_fsdp_units)
           "fsdp_double_buffer": sh.zero >= 2,
           # Megatron-FSDP's strategy; no_shard otherwise, as the library's own recipes
           "data_parallel_sharding_strategy": {2: "optim_grads", 3: "optim_grads_params"}.get(
               sh.zero, "no_shard")}
    if sh.zero >= 2 and rank_order == TP_PP_DP_ORDER:
        # ConfigContainer.validate (Megatron-FSDP checks) asserts 'use_tp_pp_dp_mapping is not
        # supported with Megatron FSDP' (src/megatron/bridge/training/config.py)
        raise SpecError("Megatron-Bridge refuses Megatron-FSDP (ZeRO-2/3) with the "
                        "pipeline-before-data rank order this placement needs (config.py: "
                        "'use_tp_pp_dp_mapping is not supported with Megatron FSDP'); emit for "
                        "megatron (Megatron-LM runs it), or solve with --zero 1",
                        source="plan", field="zero")
    dist = {"use_tp_pp_dp_mapping": rank_order == TP_PP_DP_ORDER,
            "use_megatron_fsdp": sh.zero >= 2}
    ckpt = {}
    if sh.zero >= 2:  # Megatron-FSDP: no gradient-accumulation fusion, fsdp_dtensor checkpoints
        m["gradient_accumulation_fusion"] = False
        ckpt["ckpt_format"] = "fsdp_dtensor"
        if sh.shard_size:  # HSDP, as Megatron-LM's flags (megatron_args)
            ddp["num_distributed_optimizer_instances"] = sh.dp // sh.shard_size
        # Megatron-FSDP's gradient precision is its own fields', not grad_reduce_in_fp32's
        # (megatron_args; distributed_data_parallel_config.py megatron_fsdp_main_grads_dtype)
        torch_dtype = _Code(FSDP_TORCH_DTYPES[fsdp_grads_dtype(job)])
        ddp.update(megatron_fsdp_main_grads_dtype=torch_dtype,
                   megatron_fsdp_grad_comm_dtype=torch_dtype)
    # mixed precision presets (megatron/bridge/training/mixed_precision.py); FP8 is the
    # job's recipe (delayed, per-tensor current scaling, MXFP8 or blockwise), its FP8 parameter
    # gather set as the job says whatever the preset's default (as the Megatron-LM flags)
    prec = {"bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp32": None}[job.precision]
    mp: dict = {"preset": prec}
    if prec:
        mp["grad_reduce_in_fp32"] = not job.grad_reduce_in_bf16
    if sh.fp8 and job.fp8_recipe == "tensorwise":
        # the current-scaling preset keeps the first and last layers in bf16 unless told
        # otherwise; the estimate runs every layer's linear layers in FP8
        mp.update(preset=prec.replace("_mixed", "_with_fp8_current_scaling_mixed"),
                  fp8_param_gather=fp8_params_apply(job, sh), first_last_layers_bf16=False)
    elif sh.fp8 and job.fp8_recipe == "mxfp8":
        # later presets reuse the gradient buffer for the MXFP8 weights' gather, which
        # Megatron-Core allows only with MXFP8 weights (distributed_data_parallel_config.py);
        # the estimate's memory is the same either way (the weights share that buffer)
        keep = fp8_params_apply(job, sh)
        mp.update(preset=prec.replace("_mixed", "_with_mxfp8_mixed"), fp8_param_gather=keep,
                  reuse_grad_buf_for_mxfp8_param_ag=keep)
    elif sh.fp8 and job.fp8_recipe == "blockwise":  # FP8 weights not priced here (JobSpec)
        mp.update(preset=prec.replace("_mixed", "_with_fp8_subchannel_scaling_mixed"),
                  fp8_param_gather=False)
    elif sh.fp8:
        mp.update(preset=prec.replace("_mixed", "_with_fp8_delayed_scaling_mixed"),
                  fp8_param_gather=fp8_params_apply(job, sh))
    if tokenizer:
        tok = {"tokenizer_type": "HuggingFaceTokenizer", "tokenizer_model": tokenizer,
               "use_tokenizer_vocab_size": True}
    else:  # pre-tokenized data with the plan's vocabulary; the padding rule keeps its size
        tok = {"tokenizer_type": "NullTokenizer", "tokenizer_model": None,
               "vocab_size": model.vocab_size, "use_tokenizer_vocab_size": True}
    cfg = {"model": m, "train": {"global_batch_size": job.global_batch,
                                 "micro_batch_size": sh.micro_batch},
           "dataset": {"seq_length": job.seq_length}, "tokenizer": tok, "ddp": ddp,
           "optimizer": {"use_distributed_optimizer": sh.zero >= 1}, "dist": dist,
           "checkpoint": ckpt, "mixed_precision": mp,
           "comm_overlap": ({"tp_comm_overlap": True,
                             "overlap_grad_reduce": sh.overlap_grad_reduce,
                             "overlap_param_gather": sh.overlap_param_gather}
                            if sh.tp_comm_overlap else None)}
    if cfg["comm_overlap"] is not None:
        # CommOverlapConfig sets its own pipeline-send overlap (on under interleaving) and a
        # 128M-element bucket with DP > 1 (comm_overlap.py); a value given here overrides them:
        # the sends and buckets as priced (costs.bucket_params, Megatron-LM's default rule)
        if sh.pp > 1:
            cfg["comm_overlap"]["overlap_p2p_comm"] = sh.chunks > 1 and not blocking_p2p
        if sh.cols > 1:
            cfg["comm_overlap"]["bucket_size"] = int(bucket_params(sh.cols))
    elif sh.pp > 1 and sh.chunks > 1 and not blocking_p2p:
        m["overlap_p2p_comm"] = True  # ModelParallelConfig's default is off
    if sh.pp > 1 and sh.chunks == 1 and not blocking_p2p:
        warn.append(tagged("nemo", "schedule", (
            "without interleaving Megatron-Core's pipeline sends block; the estimate priced "
            "them overlapped: estimate without --overlapped")))
    return cfg, warn


def bridge_recipe_text(cfg: dict[str, dict], model: ModelSpec, plan: Plan,
                       notices: list[str] = ()) -> str:
    """The recipe as a Python module: pipette_pretrain_config() returns the ConfigContainer;
    run as a script (launch.sh does, under torchrun) it applies the trailing KEY=VALUE
    overrides as Megatron-Bridge's scripts/training/run_recipe.py does and pre-trains."""
    m = cfg["model"]
    provider, module = (("MLAModelProvider", "mla_provider") if m.get("multi_latent_attention")
                        else ("GPTModelProvider", "gpt_provider"))
    head = "".join(f"# {n}\n" for n in notices)
    lines = [
        f'"""Megatron-Bridge pre-training recipe for {model.name}: {plan.shape.describe()}.',
        "",
        "Written by pipette. Targets " + BRIDGE_TARGET + ". Run on every",
        "node with launch.sh (torchrun ... bridge_recipe.py KEY=VALUE ...); give the data and the",
        "run length as overrides, e.g. dataset.blend=[[/data/prefix],null] train.train_iters=1000",
        "(without one the library's mock data is used).",
        '"""', "",
        "import sys", "", "import torch", "import torch.nn.functional as F",
        "from megatron.core.transformer.enums import AttnBackend",
        f"from megatron.bridge.models.{module} import {provider}",
        "from megatron.bridge.recipes.common import _pretrain_common",
        "from megatron.bridge.training.comm_overlap import CommOverlapConfig",
        "from megatron.bridge.training.config import ConfigContainer",
        "from megatron.bridge.training.mixed_precision import get_mixed_precision_config",
        "", "",
        "def pipette_pretrain_config() -> ConfigContainer:",
        '    """The plan over the library\'s pre-training defaults."""',
        "    cfg = _pretrain_common()",
        f"    cfg.model = {provider}(",
    ]
    lines += [f"        {k}={v!r}," for k, v in m.items()]
    lines.append("    )")
    for sec in ("train", "dataset", "tokenizer", "ddp", "optimizer", "dist", "checkpoint"):
        lines += [f"    cfg.{sec}.{k} = {v!r}" for k, v in cfg[sec].items()]
    mp = dict(cfg["mixed_precision"])
    preset = mp.pop("preset")
    if preset is None:
        lines.append("    cfg.mixed_precision = None  # fp32")
    else:
        lines.append(f"    mp = get_mixed_precision_config({preset!r})")
        lines += [f"    mp.{k} = {v!r}" for k, v in mp.items()]
        lines.append("    cfg.mixed_precision = mp")
    co = cfg["comm_overlap"]
    lines.append("    cfg.comm_overlap = " + (
        "CommOverlapConfig(" + ", ".join(f"{k}={v!r}" for k, v in co.items()) + ")"
        if co else "None"))
    lines += ["    return cfg", "", "",
              "def main(overrides: list[str]) -> None:",
              "    from megatron.bridge.training.gpt_step import forward_step",
              "    from megatron.bridge.training.pretrain import pretrain",
              "    from megatron.bridge.training.utils.omegaconf_utils import (",
              "        process_config_with_overrides)",
              "",
              "    cfg = process_config_with_overrides(pipette_pretrain_config(),",
              "                                        cli_overrides=overrides or None)",
              "    pretrain(cfg, forward_step)", "", "",
              'if __name__ == "__main__":', "    main(sys.argv[1:])", ""]
    return head + "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# torchtitan


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # basic TOML strings use the same escapes as JSON


def to_toml(d: dict, comments: list[str] = ()) -> str:
    """TOML text of sections {name: {key: value}}; a value that is a mapping is a sub-table
    ([quantize.linear.float8])."""
    out = [f"# {c}" for c in comments]

    def table(name: str, kv: dict) -> None:
        plain = [(k, v) for k, v in kv.items() if not isinstance(v, dict)]
        if plain or len(plain) == len(kv):
            out.append(f"\n[{name}]")
            out.extend(f"{k} = {_toml_value(v)}" for k, v in plain)
        for k, v in kv.items():
            if isinstance(v, dict):
                table(f"{name}.{k}", v)
    for sec, kv in d.items():
        table(sec, kv)
    return "\n".join(out).lstrip("\n") + "\n"


# torchtitan's rotary base per model name (models/<name>/model/args.py and __init__.py
# flavors, v0.2.2)
TORCHTITAN_ROPE_THETA = {"llama3": 500000.0, "qwen3": 1000000.0, "deepseek_v3": 10000.0}


def torchtitan_parts(sh: Shape) -> list[list[str]]:
    """Module names of each (virtual) pipeline part in model order: the embedding with the first
    part, the final norm and output layer with the last (torchtitan's module names:
    tok_embeddings, layers.<i>, norm, output)."""
    parts, cum = [], 0
    for i, n in enumerate(sh.layers):
        mods = [f"layers.{j}" for j in range(cum, cum + n)]
        cum += n
        if i == 0:
            mods = ["tok_embeddings"] + mods
        if i == len(sh.layers) - 1:
            mods = mods + ["norm", "output"]
        parts.append(mods)
    return parts


def torchtitan_config(model: ModelSpec, job: JobSpec, cluster: ClusterSpec,
                      plan: Plan, version: str = TORCHTITAN_VERSIONS[0]
                      ) -> tuple[dict, list[str]]:
    """torchtitan TOML sections for the release `version` (TORCHTITAN_VERSIONS)."""
    sh = plan.shape
    warn = []
    if version != "0.1" and (why := torchtitan_seq_problem(job, sh)):
        raise SpecError(f"{why}, or emit for --framework-version 0.1", source="plan",
                        field="seq_length")
    local = job.global_batch // sh.dp  # per data-parallel rank
    training = {"global_batch_size": job.global_batch, "seq_len": job.seq_length}
    if sh.pp > 1:
        # PP: local_batch_size is cut into micro-batches of pipeline_parallel_microbatch_size
        training["local_batch_size"] = local
    else:
        # no PP: the rest of the global batch is gradient accumulation over local batches
        training["local_batch_size"] = sh.micro_batch
    if job.precision == "bf16":
        training["mixed_precision_param"] = "bfloat16"
    elif job.precision == "fp32":
        training["mixed_precision_param"] = "float32"
    else:
        warn.append("torchtitan [precision]: fp16 is not a torchtitan mixed_precision_param "
                    "(bfloat16 or float32)")
    par: dict = {"tensor_parallel_degree": sh.tp, "pipeline_parallel_degree": sh.pp,
                 "context_parallel_degree": sh.cp}
    if sh.cp > 1:
        # the K/V rotation the estimate priced (model/costs.py _cp_exchange_ms; "allgather"
        # is torchtitan's default in both releases), written out so that the plan pins it
        par["context_parallel_rotate_method"] = "alltoall" if sh.cp_alltoall else "allgather"
    # v0.1 repeats K and V to the query heads before attention (repeat_kv), v0.2.2 does not
    # (v0.2.0 and v0.2.1 still did): with CP or eager kernels the estimate depends on it
    gqa = model.num_kv_heads < model.num_heads and not model.is_mla
    if gqa and (sh.cp > 1 or not job.compile) and job.repeat_kv != (version == "0.1"):
        counted = (f"repeated to the {model.num_heads} query heads" if job.repeat_kv
                   else f"at the {model.num_kv_heads} kv heads")
        runs = ("v0.1 repeats them (repeat_kv): estimate with --framework-version 0.1"
                if version == "0.1" else
                "v0.2.2 keeps the kv heads (v0.2.0 and v0.2.1 repeat them)")
        ratio = model.num_heads // model.num_kv_heads
        warn.append(f"torchtitan [attention]: the estimate counted K and V {counted}; {runs}"
                    + (f"; the context-parallel K/V exchange differs {ratio}x in bytes"
                       + (", and compiled v0.1 hides none of it (model/costs.py "
                          "_cp_exchange_ms): re-estimate with the release you run"
                          if job.compile else "")
                       if sh.cp > 1 else ""))
    # Float8 TP: on in v0.1 ('float8' converter), off in v0.2.x (JobSpec.fp8_tp_gathers)
    if sh.fp8 and sh.tp > 1 and job.fp8_tp_gathers != (version == "0.1"):
        priced = "in FP8 (Float8 TP)" if job.fp8_tp_gathers else "in bf16"
        runs = ("v0.1 turns Float8 TP on: its gathers move FP8" if version == "0.1" else
                "v0.2 never turns Float8 TP on (its parallelize tests the converter name "
                "'float8', which it registers as 'quantize.linear.float8'): bf16 gathers")
        warn.append(f"torchtitan [precision]: the estimate priced the TP all-gathers {priced}; "
                    f"{runs}: re-estimate with --framework-version {version}")
    # FSDP2 shards over data_parallel_shard_degree ranks and replicates over
    # data_parallel_replicate_degree (HSDP when both > 1); DDP only on 1-D meshes
    if sh.zero >= 3:
        g = sh.shard_size or sh.dp
        par.update(data_parallel_replicate_degree=sh.dp // g, data_parallel_shard_degree=g)
        if g == 1 and sh.cp == 1:
            # ParallelDims.fsdp_enabled: dp_shard > 1 or CP > 1 (parallel_dims.py, v0.2.2)
            warn.append("torchtitan [sharding]: data_parallel_shard_degree 1 without context "
                        "parallelism: torchtitan applies no FSDP; the estimate priced ZeRO-3 "
                        "over one rank (gathered 16-bit weights beside the fp32 ones), so memory "
                        "is lower")
    elif sh.tp * sh.pp * sh.cp == 1 and sh.zero == 0:
        par.update(data_parallel_replicate_degree=sh.dp, data_parallel_shard_degree=1)
    else:
        par.update(data_parallel_replicate_degree=1, data_parallel_shard_degree=sh.dp)
        if sh.dp * sh.cp > 1:  # fsdp_enabled: dp_shard > 1 or CP > 1 (parallel_dims.py)
            warn.append("torchtitan [parallelism]: data parallelism becomes FSDP (shards "
                        "weights, gradients and optimizer state"
                        + (" over the context-parallel ranks" if sh.cp > 1 else "")
                        + "); the plan's estimate assumes "
                        + (f"ZeRO-{sh.zero}" if sh.zero else "replicated DDP") +
                        ", so memory is lower and communication differs")
    if sh.pp > 1:
        # torch.distributed.pipelining schedule names
        par["pipeline_parallel_schedule"] = {"gpipe": "GPipe", "1f1b": "1F1B",
                                             "interleaved": "Interleaved1F1B"}[sh.schedule]
        if sh.schedule == "interleaved" and job.framework != "torchtitan":
            # a plan priced in another framework's micro-batch groups: PyTorch has no setting
            # for them and runs its own rounds (plan.torch_interleave_group)
            m = job.global_batch // (sh.micro_batch * sh.dp)
            ran, why = torch_interleave_group(sh.pp, m)
            if why or ran != (sh.mb_group or sh.pp):
                warn.append(tagged("torchtitan", "schedule", (
                    f"the plan runs its {m} micro-batches through each chunk in groups of "
                    f"{sh.mb_group or sh.pp}; PyTorch's Interleaved1F1B "
                    + (why + " and refuses them" if why else f"runs groups of {ran}")
                    + ", which the estimate did not model")))
        par["pipeline_parallel_microbatch_size"] = sh.micro_batch
        if version == "0.1":
            # split points name the first module of every (virtual) stage after the first;
            # torchtitan's models name their blocks layers.<i>
            cum, pts = 0, []
            for n in sh.layers[:-1]:
                cum += n
                pts.append(f"layers.{cum}")
            par["pipeline_parallel_split_points"] = pts
        else:  # v0.2: the modules of every model part, in model order
            par["module_fqns_per_model_part"] = torchtitan_parts(sh)
    if sh.tp > 1 and not sh.sequence_parallel:
        warn.append("torchtitan [parallelism]: its tensor-parallel plan always shards norms "
                    "along the sequence (sequence parallelism); the plan has it off")
    if sh.tp_comm_overlap:
        par["enable_async_tensor_parallel"] = True
    extra: dict = {}
    # torch.compile of every transformer block and of the loss: v0.1 training.compile (both:
    # torchtitan/components/loss.py compiles the loss with it), v0.2 [compile] and its
    # components; JobSpec allows compile False only for torchtitan
    compiled = job.compile
    if version == "0.1":
        training["compile"] = compiled
        if job.loss_compiled != compiled:
            warn.append("torchtitan [memory]: v0.1 compiles the loss exactly when it compiles "
                        f"the model ({compiled}); the estimate counted the loss "
                        f"{'compiled' if job.loss_compiled else 'eager'} (emit for 0.2, which "
                        "has both switches)")
    else:
        comps = [c for c, on in (("model", compiled), ("loss", job.loss_compiled)) if on]
        extra["compile"] = {"enable": bool(comps), "components": comps or ["model", "loss"]}
    if not compiled and (sh.tp_comm_overlap or sh.fp8):
        warn.append("torchtitan [compile]: off, but "
                    + ("async tensor parallelism only runs compiled" if sh.tp_comm_overlap
                       else "float8 linear layers are slow without it")
                    + "; the estimate assumed it works as with torch.compile")
    match = torchtitan_flavor(model, version)
    if match:
        extra["model"] = {"name": match[0], "flavor": match[1]}
        # the flavor fixes torchtitan's rotary embedding (models/<name>/model/args.py at
        # v0.2.2 rope_theta; RoPE over the whole head): a model that sets another is
        # trained with the flavor's
        theta = TORCHTITAN_ROPE_THETA[match[0]]
        if (model.rope_base and model.rope_base != theta) or model.rotary_percent != 1.0:
            warn.append(tagged("torchtitan", "model", (
                f"torchtitan's {match[0]} {match[1]} rotates every head dimension with base "
                f"{theta:g}; {model.name} sets base {model.rope_base or 'unset'} over "
                f"{model.rotary_percent:g} of each head, which the flavor does not take")))
    else:
        # a flavor torchtitan does not have: the run stops at the model lookup instead of
        # training torchtitan's default debug model
        extra["model"] = {"name": "llama3", "flavor": model.name}
        warn.append(tagged("torchtitan", "model", (
            f"torchtitan {version} has no model flavor with {model.name}'s dimensions "
            f"(layers={model.num_layers}, hidden={model.hidden_size}, "
            f"heads={model.num_heads}/{model.num_kv_heads}, ffn={model.ffn_hidden_size}"
            + (f", experts={model.num_experts}" if model.num_experts else "")
            + f"); [model] names flavor '{model.name}', which must be registered first, "
            "or the run stops at the model lookup")))
    if sh.fp8:
        # torchao float8 training of the linear layers (torchtitan's float8 converter, named
        # per release), the output layer left in bf16 as priced (model/compute.py) and as
        # torchtitan's own llama3 configs do (filter_fqns defaults to none)
        name, where = FLOAT8_CONVERTER[version]
        extra["model"]["converters"] = [name]
        sec = extra
        for part in where.split("."):
            sec = sec.setdefault(part, {})
        sec["filter_fqns"] = ["output"]
        if job.transformer_engine and job.fp8_recipe != "delayed":
            warn.append(tagged("torchtitan", "precision", (
                f"the plan's {job.fp8_recipe} recipe is Transformer Engine's; torchtitan runs "
                "torchao's Float8 (tensorwise), which this file turns on instead: estimate with "
                "--framework torchtitan to price it")))
        if fp8_params_apply(job, sh):
            warn.append(tagged("torchtitan", "precision", (
                "the plan's FP8 weights (fp8_param_gather) have no torchtitan key: FSDP2 keeps "
                "and gathers 16-bit weights here")))
    if model.qkv_bias and not model.bias:
        warn.append("torchtitan [model]: its Llama-style model has no biases; the plan's "
                    "model has them on the query, key and value projections (Qwen2): the model "
                    "built lacks them and cannot load such a checkpoint")
    if job.attention != "flash":
        warn.append("torchtitan [model]: attention is scaled_dot_product_attention "
                    "(FlashAttention on GPUs that have it); the estimate assumed eager attention")
    if sh.overlap_grad_reduce or sh.overlap_param_gather:
        warn.append("torchtitan [overlap]: FSDP2 prefetches and overlaps its own collectives; the "
                    "Megatron bucket overlaps the estimate assumed have no switch here")
    ac = {"mode": sh.recompute}  # "none" | "selective" | "full"
    if sh.recompute == "selective":
        ac["selective_ac_option"] = "op"
        if job.framework != "torchtitan":
            warn.append("torchtitan [recompute]: selective recompute is op-level SAC, not "
                        "Megatron's attention-core recompute the estimate assumed (estimate with "
                        "framework torchtitan to model it); memory and time differ")
    if model.is_moe and sh.ep > 1:
        # torchtitan/config/configs.py Parallelism.expert_parallel_degree (EP borrows ranks
        # from FSDP and TP); expert_tensor_parallel_degree 1 or TP (v0.2.2 job_config.py:464,
        # default 1; v0.1.0 has no such key: its experts take TP)
        par["expert_parallel_degree"] = sh.ep
        if version == "0.2":
            par["expert_tensor_parallel_degree"] = sh.expert_tp
        elif sh.expert_tp != sh.tp:
            warn.append(f"torchtitan [parallelism]: v0.1 splits the experts over TP={sh.tp}; "
                        f"the plan has expert TP {sh.expert_tp}")
        # v0.2.1 and v0.2.2 job_config.py Parallelism.expert_parallel_comm_backend:
        # "standard" or "deepep" (HybridEP came later)
        if job.moe_dispatcher == "deepep" and version == "0.2":
            par["expert_parallel_comm_backend"] = "deepep"
            warn.append("torchtitan [parallelism]: expert_parallel_comm_backend is v0.2.1's "
                        "and later (v0.2.0 refuses the key)")
        elif job.moe_dispatcher != "alltoall":
            warn.append(f"torchtitan [parallelism]: v{version} has no {job.moe_dispatcher} "
                        "backend (expert_parallel_comm_backend: standard, or deepep from "
                        "v0.2.1); the plan was estimated with it")
    if sh.ep_comm_overlap:
        warn.append("torchtitan [parallelism]: no key overlaps the expert all-to-alls with "
                    "another micro-batch's compute (Megatron-LM's "
                    "--overlap-moe-expert-parallel-comm); the estimate hid them so")
    if model.is_moe and job.moe_capacity_factor != 1.0:
        warn.append(f"torchtitan [model]: token dropping at capacity factor "
                    f"{job.moe_capacity_factor:g} has no torchtitan key (its MoE routes "
                    "every token); the estimate priced every expert padded to capacity")
    if model.is_moe:
        warn.append(f"torchtitan [model]: {model.num_experts}-expert top-{model.moe_topk} MoE "
                    f"comes from the model flavor (e.g. its DeepSeek-V3 / Llama 4 models)"
                    + (f"; the plan's expert parallelism (EP={sh.ep}) was estimated for "
                       f"Megatron-LM's {job.moe_dispatcher} dispatcher, not torchtitan's"
                       if sh.ep > 1 else
                       "; expert parallelism 1 as the estimate assumed"))
    # the whole job config printed at start-up (v0.2.2 JobConfig.maybe_log: 'Running with
    # configs: ' and its JSON; v0.1.0 train.py: 'Running with args: ' and its repr), from
    # which `calibrate --cluster` reads the plan of the run's log
    job_sec = {"print_config" if version == "0.2" else "print_args": True}
    return {"job": job_sec, **extra, "training": training, "parallelism": par,
            "activation_checkpoint": ac}, warn


# ---------------------------------------------------------------------------------------------
# DeepSpeed


def deepspeed_config(model: ModelSpec, job: JobSpec, cluster: ClusterSpec,
                     plan: Plan) -> tuple[dict, list[str]]:
    """DeepSpeed JSON config (keys from the DeepSpeed config-json reference)."""
    sh = plan.shape
    warn = []
    # train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * DP
    cfg: dict = {
        "train_batch_size": job.global_batch,
        "train_micro_batch_size_per_gpu": sh.micro_batch,
        "gradient_accumulation_steps": num_microbatches(job, sh),
        "bf16": {"enabled": job.precision == "bf16"},
        "fp16": {"enabled": job.precision == "fp16"},
        # ZeRO stage 1 shards optimizer state over data-parallel ranks (Megatron's
        # distributed optimizer), 2 also gradients, 3 also parameters
        "zero_optimization": {"stage": sh.zero},
        # the engine's timing lines (ThroughputTimer's CurrSamplesPerSec, the pipeline
        # engine's 'iter time (s)') print every this many steps, and not at all unset
        # (deepspeed/runtime/constants.py STEPS_PER_PRINT_DEFAULT = None since 0.15.2,
        # DeepSpeed #6602; 10 before): what `calibrate` reads
        "steps_per_print": 10,
    }
    if sh.shard_size:
        # ZeRO++ hierarchical partitioning (hpZ): a secondary copy of the weights sharded
        # inside groups of this many ranks, so gathers stay inside them
        cfg["zero_optimization"]["zero_hpz_partition_size"] = sh.shard_size
        warn.append("deepspeed [parallelism]: HSDP maps to ZeRO++ hpZ (zero_hpz_partition_size), "
                    "which keeps "
                    "the primary shards over the whole group: optimizer state and gradients "
                    "use less memory than the estimate, weights slightly more")
    if job.precision == "bf16" and sh.zero == 1:
        # the estimate prices BF16_Optimizer's fp32 gradient accumulation buffer
        # (model/specs.py grad_bytes); without data_types DeepSpeed accumulates in bf16 and
        # takes its plain ZeRO optimizer instead (deepspeed/runtime/engine.py get_data_types,
        # _do_optimizer_sanity_check: bf16 + fp32 accumulation + ZeRO-1 -> BF16_Optimizer)
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    # (bf16 without ZeRO is refused before: plan.deepspeed_problem)
    if sh.tp > 1 and sh.pp > 1 and not deepspeed_pipe_partitioned(model, sh):
        # partitioning the passed tensors over the tensor ranks (DeepSpeed's default) assumes
        # they are the same on every rank, not so for sequence shards, and Megatron-DeepSpeed
        # refuses it for MoE models (megatron/model/gpt_model.py GPTModelPipe): off, as the
        # estimate prices it (plan.deepspeed_pipe_partitioned)
        cfg["pipeline"] = {"pipe_partitioned": False, "grad_partitioned": False}
    if model.is_moe:
        # DeepSpeed-MoE takes experts in model code (deepspeed/moe/layer.py MoE: num_experts,
        # ep_size, k), not in its config JSON
        warn.append(f"deepspeed [parallelism]: the {model.num_experts}-expert top-"
                    f"{model.moe_topk} MoE layers"
                    + (f" and their expert parallelism (EP={sh.ep})" if sh.ep > 1 else "")
                    + " are not DeepSpeed config keys: build them in the model code "
                    f"(deepspeed.moe.layer.MoE(num_experts={model.num_experts}, "
                    f"ep_size={sh.ep}, k={model.moe_topk}, "
                    # its defaults, capacity_factor 1.0 with drop_tokens True and no expert
                    # TP (deepspeed/moe/layer.py MoE), are not the plan's
                    + (f"capacity_factor={job.moe_capacity_factor:g}, drop_tokens=True"
                       if job.moe_capacity_factor != 1.0 else "drop_tokens=False")
                    + f", enable_expert_tensor_parallelism={sh.expert_tp > 1})); the "
                    f"estimate priced Megatron-LM's {job.moe_dispatcher} dispatcher and "
                    "grouped GEMMs")
    if sh.ep_comm_overlap:
        warn.append("deepspeed [parallelism]: no key overlaps the expert all-to-alls with "
                    "another micro-batch's compute (Megatron-LM's "
                    "--overlap-moe-expert-parallel-comm); the estimate hid them so")
    if sh.overlap_grad_reduce:
        cfg["zero_optimization"]["overlap_comm"] = True
    elif sh.zero >= 3:
        # the estimate has each layer's gradient reduce-scatter wait in line (costs.py)
        cfg["zero_optimization"]["overlap_comm"] = False
    if sh.cp > 1:
        warn.append(f"deepspeed [parallelism]: context parallelism (CP={sh.cp}) cannot be "
                    f"expressed: "
                    "DeepSpeed's sequence parallelism is Ulysses (all-to-all over heads), not "
                    "the ring exchange the estimate assumed; without it DeepSpeed counts the "
                    f"{sh.dp * sh.cp} data x context ranks as data-parallel, and refuses the "
                    f"batch written (train_batch_size {job.global_batch} must equal micro-batch "
                    f"x accumulation x {sh.dp * sh.cp})")
    if sh.zero >= 2 and sh.pp > 1:
        warn.append(f"deepspeed [parallelism]: its pipeline engine runs ZeRO-1 only; "
                    f"ZeRO-{sh.zero} with PP={sh.pp} cannot be expressed")
    if sh.fp8:
        warn.append("deepspeed [precision]: FP8 is not a DeepSpeed config key; enable "
                    f"Transformer Engine FP8 with its {job.fp8_recipe} recipe in the model code "
                    "(Megatron-DeepSpeed) or run bf16")
    if sh.tp_comm_overlap or sh.overlap_param_gather:
        warn.append("deepspeed [overlap]: tensor-parallel and parameter-gather overlap are "
                    "Megatron-LM features with no DeepSpeed config key")
    if sh.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": False,
                                           "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
        warn.append(f"deepspeed [recompute]: the config only tunes activation checkpointing; "
                    f"{sh.recompute} recompute must be enabled in the model code "
                    "(deepspeed.checkpointing.checkpoint) or by Megatron-DeepSpeed flags")
    if sh.tp > 1 or sh.pp > 1 or sh.sequence_parallel:
        warn.append(f"deepspeed [parallelism]: TP={sh.tp}, PP={sh.pp}"
                    + (", sequence parallelism" if sh.sequence_parallel else "")
                    + " are not DeepSpeed config keys: give them to the model code "
                    "(PipelineModule(num_stages=PP) and a model-parallel mpu, or "
                    "Megatron-DeepSpeed's --tensor-model-parallel-size / "
                    "--pipeline-model-parallel-size)")
    method = deepspeed_splits(model, sh.pp).get(tuple(sh.layers))
    if sh.pp > 1 and method is None:
        warn.append(f"deepspeed [split]: the layer split {list(sh.layers)} cannot be given to "
                    "PipelineModule, whose partition_method is 'parameters', 'uniform' or "
                    "'type:...'")
    elif sh.pp > 1:
        # deepspeedai/Megatron-DeepSpeed GPTModelPipe passes 'type:transformer'; the bigscience
        # fork takes --pp-partition-method (megatron/arguments.py) but builds only GPT/BLOOM
        # models: tied embeddings, LayerNorm, every head its own K/V, a plain MLP, no experts
        bigscience = (model.tied_embeddings and model.norm == "layernorm" and not model.is_moe
                      and model.num_kv_heads == model.num_heads and not model.gated_mlp)
        warn.append(f"deepspeed [split]: the plan's layer split {list(sh.layers)} is what "
                    f"PipelineModule(partition_method='{method}') gives"
                    + (" (Megatron-DeepSpeed's GPTModelPipe default)"
                       if method == DEEPSPEED_PARTITIONS[0] else
                       " (bigscience-workshop/Megatron-DeepSpeed: --pp-partition-method "
                       f"'{method}'; deepspeedai's GPTModelPipe always uses "
                       f"'{DEEPSPEED_PARTITIONS[0]}')" if bigscience else
                       f": give it to your own PipelineModule; deepspeedai's Megatron-"
                       f"DeepSpeed always uses '{DEEPSPEED_PARTITIONS[0]}' (that split: "
                       "estimate without --layers), and bigscience's fork, which takes "
                       "--pp-partition-method, cannot build this model"))
    if sh.schedule != "1f1b" and sh.pp > 1:
        warn.append(f"deepspeed [schedule]: the pipeline engine runs its own 1F1B-style "
                    f"TrainSchedule; the plan's {sh.schedule} schedule cannot be expressed")
    # DeepSpeed's logger is created at WARNING from 0.17.6 on (deepspeed/utils/logging.py,
    # DeepSpeed #7526); the ThroughputTimer line and the configuration print are INFO, the
    # pipeline engine's 'iter time' line a print()
    warn.append("deepspeed [logging]: DeepSpeed 0.17.6 and later keep their logger at WARNING, "
                "which hides the INFO lines calibrate reads (its configuration print"
                + ("" if sh.pp > 1 else " and the ThroughputTimer's CurrSamplesPerSec")
                + "): call deepspeed.utils.set_log_level_from_string('info') in train.py")
    return cfg, warn


# ---------------------------------------------------------------------------------------------
# entry point


def not_fit_reason(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, plan: Plan,
                   est=None, options=None) -> str | None:
    """Why the plan would run out of GPU memory (the estimator's memory model), or None."""
    if est is None:
        from model.estimator import estimate
        est = estimate(model, job, cluster, plan, options)
    if est.fits:
        return None
    worst = max(est.stages, key=lambda st: st.memory.total_gib - st.limit_gib)
    return (f"the plan needs {worst.memory.total_gib:,.1f} GiB per GPU on stage {worst.stage} "
            f"against {worst.limit_gib:,.1f} GiB")


@dataclass
class LaunchSet:
    """A framework's files for one plan, in memory: {file name: text}, the executable ones,
    and the warnings (also in warnings.txt when any)."""

    files: dict[str, str]
    executable: set[str]
    warnings: list[str]


def check_framework(framework: str, version: str | None = None) -> str:
    """The framework's name, lower case; a version it is not emitted for is refused."""
    fw = framework.lower()
    if fw not in FRAMEWORKS:
        raise SpecError(f"unknown framework '{framework}'; use one of {', '.join(FRAMEWORKS)}",
                        source="options", field="--emit/--framework")
    known = {"torchtitan": TORCHTITAN_VERSIONS, "nemo": NEMO_VERSIONS}.get(fw, ())
    if version is not None and version not in known:
        raise SpecError(f"{fw} is emitted for " + (
            f"versions {', '.join(known)}" if known else "one version only (see the README)")
            + f", not '{version}'", source="options", field="--framework-version")
    return fw


# the frameworks whose runs a job's estimate describes: NeMo runs Megatron-Core
def _runs_an_even_split(fw: str, version: str | None, model: ModelSpec, job: JobSpec,
                        sh: Shape) -> bool:
    """Whether the framework runs its own even split instead of the plan's: DeepSpeed's
    PipelineModule where no partition method it is given gives the plan's split
    (plan.framework_splits), and NeMo 1.x where its first/last stage keys cannot express the
    split."""
    if sh.pp == 1 or len(set(sh.layers)) == 1:
        return False
    if fw == "deepspeed":
        return tuple(sh.layers) not in deepspeed_splits(model, sh.pp)
    return (fw == "nemo" and (version or NEMO_VERSIONS[0]) != "bridge"
            and first_last_split(sh) is None)


def even_split_warnings(fw: str, model: ModelSpec, job: JobSpec, cluster: ClusterSpec,
                        plan: Plan, options=None, plan_ms: float | None = None) -> list[str]:
    """What the framework's even split (layers as even as the virtual stages allow: L // V,
    one more on L % V of them, which ones the framework's to decide; for DeepSpeed,
    Megatron-DeepSpeed's partition_method 'type:transformer') does to the plan: the stage that
    may run out of memory, else the time the cost model gives it beside the plan's (`plan_ms`,
    computed where not given). Each stage is judged with the extra layers on its own virtual
    stages first, its worst case (DeepSpeed's rule is known: plan.deepspeed_split)."""
    from model.estimator import Evaluator

    sh = plan.shape
    V, L = sh.num_virtual, model.num_layers
    base, extra = divmod(L, V)
    worst = None  # (overflow GiB, stage, need, limit)
    slowest = 0.0
    splits = []
    for s in range(sh.pp) if extra else [0]:
        mine = [c * sh.pp + s for c in range(sh.chunks)]
        order = mine + [j for j in range(V - 1, -1, -1) if j not in mine]
        lay = [base] * V
        for j in order[:extra]:
            lay[j] += 1
        splits.append(tuple(lay))
    how = f"{base}" if not extra else f"{base} or {base + 1}"
    how += " layers per virtual stage"
    run = sh
    if fw == "deepspeed":  # its rule is known: the first L % V stages take one more
        splits, extra = [deepspeed_split(L, sh.pp)], 0
        how = (f"{'/'.join(map(str, splits[0]))} layers per stage, partition_method "
               f"'{DEEPSPEED_PARTITIONS[0]}'")
        # its pipeline engine runs one chunk per stage (TrainSchedule, its 1F1B): an
        # interleaved plan is judged as that runs it (the split had been given PP entries
        # for PP x chunks virtual stages, a refusal naming the plan's own layers)
        if sh.chunks > 1 or sh.schedule == "interleaved":
            run = replace(sh, schedule="1f1b", chunks=1, mb_group=0)
    for lay in splits:
        est = Evaluator(model, job, cluster, replace(run, layers=lay),
                        options).estimate(plan.placement)
        slowest = max(slowest, est.iteration_ms)
        for st in est.stages:
            over = st.memory.total_gib - st.limit_gib
            if over > 0 and (worst is None or over > worst[0]):
                worst = (over, st.stage, st.memory.total_gib, st.limit_gib)
    if worst is not None:
        _o, st, need, lim = worst
        return [tagged(fw, "memory", f"it splits the layers evenly ({how}), "
                       f"not as the plan ({list(sh.layers)}): stage {st} may then need "
                       f"{need:.1f} GiB > {lim:g} GiB and run out of memory; give it a plan "
                       + ("solved for it (solve --framework deepspeed searches only the splits "
                          "its partition methods give)" if fw == "deepspeed" else
                          "with an even split (estimate --layers)")
                       + " or use a framework that takes the plan's split (megatron, "
                       "torchtitan)")]
    if plan_ms is None:
        plan_ms = Evaluator(model, job, cluster, sh, options).iteration_ms(plan.placement)
    return [tagged(fw, "split", f"with its even split ({how}) the "
                   f"cost model gives {slowest / 1e3:.3f} s per iteration"
                   + (" at most" if extra else "") + f", against the plan's "
                   f"{plan_ms / 1e3:.3f} s")]


def warnings_text(warn: list[str]) -> str:
    """warnings.txt of a launch set: one line per warning."""
    return "".join(f"- {x}\n" for x in warn)


def launch_set(framework: str, model: ModelSpec, job: JobSpec, cluster: ClusterSpec,
               plan: Plan, *, est=None, options=None, force: bool = False,
               tokenizer: str | None = None, version: str | None = None) -> LaunchSet:
    """Everything `emit` writes, built and checked before a byte is written. A plan that does
    not fit in memory is refused unless `force`; then every file says so."""
    fw = check_framework(framework, version)
    notices: list[str] = []
    warn: list[str] = []
    why = not_fit_reason(model, job, cluster, plan, est, options)
    if why and not force:
        raise SpecError(f"{why}: it would run out of memory; emit a plan that fits (solve), or "
                        "add --force to write it anyway", source="plan", field="--emit")
    if why:
        notices.append(f"WARNING: written with --force although it does not fit: {why}")
        warn.append(tagged(fw, "memory", f"does not fit: {why}; written with --force"))
    if flex_dispatcher(job, plan.shape) == "deepep" and fw in ("megatron", "nemo") and (
            bad := deepep_layout_problem(plan, cluster)):
        raise SpecError(bad, source="plan", field="--emit")
    if model.is_moe and job.moe_dispatcher != "alltoall" and plan.shape.ep <= 1:
        warn.append(tagged(fw, "model", f"the plan has EP 1: the alltoall dispatcher is "
                           f"written, not {job.moe_dispatcher} (no tokens move; Megatron-Core's "
                           "flex dispatcher refuses a group of one)"))
    priced = job.framework
    # what the target framework cannot run at all (a window it lacks, tied embeddings under
    # its PP): refused as estimate refuses it, whatever the plan was priced for
    bad = model_refusal(model, priced_as(fw), job.seq_length, plan.shape)
    if bad is not None:
        raise SpecError(f"{fw} cannot run this plan: {bad[1]}", source="plan",
                        field="--framework")
    if priced_as(fw) != priced:
        # the estimate is the job's framework's (its kernels, memory, sharding rules)
        warn.append(tagged(fw, "framework", (
            f"the plan was priced for {priced}, whose kernels, memory and sharding rules "
            f"differ from {fw}'s: estimate it with --framework {priced_as(fw)} before "
            "running it there")))
    if job.grad_reduce_in_bf16 and fw in ("deepspeed", "torchtitan"):
        # Megatron-LM's option (JobSpec.grad_reduce_in_bf16): neither file writes it
        warn.append(tagged(fw, "precision", (
            "the plan keeps and reduces bf16 gradients (--grad-reduce-in-bf16), which is not "
            "written here: " + ("torchtitan reduces in float32 (its mixed_precision_reduce)"
                                if fw == "torchtitan" else
                                "DeepSpeed keeps the gradients ds_config.json's data_types "
                                "(or its bf16 default without ZeRO) says")
            + "; the plan's gradient memory and reduction time do not hold there")))
    if note := fp8_param_gather_note(job, plan.shape):
        warn.append(tagged(fw, "precision", note))
    big = sorted({nd.num_gpus for nd in cluster.nodes if nd.num_gpus > 8})
    if big:
        # a rack-scale NVLink domain (NVL72: 18 hosts of 4 GPUs) modelled as one node
        warn.append(tagged(fw, "placement", (
            f"nodes of {', '.join(map(str, big))} GPUs: the launch files start one process "
            "group per node (one host). Where such a node is an NVLink domain of several hosts "
            "(a GB200 / GB300 NVL72 rack), they do not run as written: the plan's placement "
            "(ranks.json: which GPU of which node plays each rank) holds; start it per "
            "host with your scheduler")))
    mapping, reason = rank_mapping(cluster, plan, ORDERS[fw])
    order = mapping.rank_order if mapping else DEFAULT_ORDER
    files: dict[str, str] = {}
    title = f"{model.name} on {cluster.name}, {framework}"
    env: dict = {}
    requires: dict = {}
    args_file = None
    flags: tuple[str, ...] = ()  # torchrun's own, beyond the rendezvous
    if fw == "megatron":
        args, w = megatron_args(model, job, plan, rank_order=order, tokenizer=tokenizer,
                                blocking_p2p=(options or Options()).blocking_p2p)
        files["megatron_args.txt"] = megatron_args_text(args, plan, notices)
        cmd, args_file = ["pretrain_gpt.py"], "megatron_args.txt"
        env = megatron_env(cluster, plan)
    elif fw == "nemo" and (version or NEMO_VERSIONS[0]) == "bridge":
        cfg, w = bridge_recipe(model, job, cluster, plan, rank_order=order,
                               tokenizer=tokenizer,
                               blocking_p2p=(options or Options()).blocking_p2p)
        files["bridge_recipe.py"] = bridge_recipe_text(cfg, model, plan, notices)
        cmd = ["$HERE/bridge_recipe.py"]
        env = megatron_env(cluster, plan)
    elif fw == "nemo":
        cfg, w = nemo_config(model, job, cluster, plan, tokenizer,
                             blocking_p2p=(options or Options()).blocking_p2p)
        if order == TP_PP_DP_ORDER:
            cfg["model"]["use_tp_pp_dp_mapping"] = True
        head = "".join(f"# {n}\n" for n in notices)
        files["nemo_config.yaml"] = (
            head + f"# NeMo 1.x Megatron GPT config for {plan.shape.describe()}: NeMo's\n"
            "# examples/nlp/language_modeling/conf/megatron_gpt_config.yaml with these keys over\n"
            "# it (launch.sh adds that folder to Hydra's search path from $NEMO_DIR); give the\n"
            "# data as model.data.data_prefix=[...] to launch.sh\n" + to_yaml(cfg))
        cmd = ["$NEMO_DIR/examples/nlp/language_modeling/megatron_gpt_pretraining.py",
               "--config-path=$HERE", "--config-name=nemo_config",
               "hydra.searchpath=[file://$NEMO_DIR/examples/nlp/language_modeling/conf]"]
        env = megatron_env(cluster, plan)
        # MegatronGPTModel logs max_memory_reserved to the progress bar with this set
        # (megatron_gpt_model.py, NeMo 8cfedd7): the log's memory, for `calibrate`
        env["NEMO_LOG_MEMORY_USAGE"] = ("1", "NeMo logs the peak reserved memory each step "
                                        "(read by calibrate)")
        requires = {"NEMO_DIR": "a NeMo 1.x checkout (its examples/nlp/language_modeling)"}
    elif fw == "torchtitan":
        ver = version or TORCHTITAN_VERSIONS[0]
        cfg, w = torchtitan_config(model, job, cluster, plan, ver)
        files["torchtitan.toml"] = to_toml(cfg, list(notices) + [
            f"torchtitan {ver}.x job config for {plan.shape.describe()}, model {model.name}"])
        cmd = ["-m", "torchtitan.train", "--job.config_file", "$HERE/torchtitan.toml"]
        # as torchtitan's own run_train.sh launches (v0.2.2): only local rank 0's output on the
        # console, each line under its '[rank0]:' prefix, so the job config it prints comes
        # through whole for `calibrate`
        flags = ("--local-ranks-filter=0", "--role=rank", "--tee=3")
    else:
        cfg, w = deepspeed_config(model, job, cluster, plan)
        if notices:  # JSON has no comments; DeepSpeed ignores keys it does not know
            cfg = {"_notice": " ".join(notices), **cfg}
        files["ds_config.json"] = json.dumps(cfg, indent=1) + "\n"
        cmd = ["train.py", "--deepspeed", "--deepspeed_config", "$HERE/ds_config.json"]
        if plan.shape.sequence_parallel:
            # Megatron-DeepSpeed raises without it under sequence parallelism on CUDA
            # (megatron/arguments.py, deepspeedai/Megatron-DeepSpeed 4efb479)
            env = {"CUDA_DEVICE_MAX_CONNECTIONS": (
                "1", "Megatron-DeepSpeed requires 1 with sequence parallelism")}
    warn += w
    # what the model's source sets that these files do not (ModelSpec.unmodelled)
    warn += [tagged(fw, "model", f"{model.origin}: {x}")
             for x in model.unmodelled_at(job.seq_length)]
    if model.is_moe and fw in ("megatron", "nemo") and not any(
            x.startswith(("router_aux_loss_coef ", "aux_loss_alpha ")) for x in model.unmodelled):
        # Megatron-Core's TransformerConfig: moe_aux_loss_coeff 0.0 by default
        warn.append(tagged(fw, "model", (
            f"{model.origin}: the load-balancing loss is not emitted and its coefficient is "
            "not known here: Megatron-LM's --moe-aux-loss-coeff defaults to 0 (no balancing), "
            "while the estimate prices tokens spread evenly over the experts; set the "
            "model's")))
    if _runs_an_even_split(fw, version, model, job, plan.shape):
        warn += even_split_warnings(fw, model, job, cluster, plan, options,
                                    None if est is None else est.iteration_ms)
    executable: set[str] = set()
    if mapping is None and not force:
        # a set without its launcher had been written with exit 0 (a warning scripts miss)
        raise SpecError(f"the placement cannot be expressed with torchrun node ranks: "
                        f"{reason}; launch.sh and the hostfile cannot be written: add --force "
                        "to write the configuration without them", source="plan",
                        field="--emit")
    if mapping is None:
        warn.append(tagged(fw, "placement", (
            f"placement cannot be expressed with torchrun node ranks: {reason}; launch.sh and "
            "hostfile were not written")))
    else:
        files.update(launch_files(cluster, plan, mapping, cmd, args_file, title, env, notices,
                                  requires, flags))
        executable.add("launch.sh")
    if warn:
        files["warnings.txt"] = warnings_text(warn)
    return LaunchSet(files, executable, warn)


def emit(framework: str, model: ModelSpec, job: JobSpec, cluster: ClusterSpec, plan: Plan,
         out_dir: Path, *, est=None, options=None, force: bool = False,
         tokenizer: str | None = None, version: str | None = None
         ) -> tuple[list[Path], list[str]]:
    """Write `framework`'s configuration and the launch files into `out_dir`, as a whole or
    not at all (formats.atomic.write_set): returns the files written and the warnings."""
    from formats.atomic import write_set

    ls = launch_set(framework, model, job, cluster, plan, est=est, options=options,
                    force=force, tokenizer=tokenizer, version=version)
    paths = write_set(Path(out_dir), ls.files, modes={n: 0o755 for n in ls.executable},
                      force=force)
    return paths, ls.warnings
