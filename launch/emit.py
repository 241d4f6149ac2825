"""What each training framework needs to run a plan as chosen, and what it cannot express.

`emit(framework, model, job, cluster, plan, out_dir)` writes the framework's configuration and
the placement (launch.sh, hostfile, ranks.json from launch.ranks) and returns the files written
and the warnings: every knob of the plan a framework cannot express is reported, never dropped.

Sources of the names (each mapping below cites its own):
- Megatron-LM: megatron/training/arguments.py (`_add_distributed_args`, `_add_training_args`,
  `_add_network_size_args`, `_add_mixed_precision_args`), NVIDIA/Megatron-LM.
- NeMo 1.x: examples/nlp/language_modeling/conf/megatron_gpt_config.yaml, NVIDIA/NeMo.
- torchtitan: torchtitan/config/job_config.py (`Parallelism`, `Training`,
  `ActivationCheckpoint`), pytorch/torchtitan.
- DeepSpeed: the JSON config reference (deepspeed.ai/docs/config-json/).
"""

from __future__ import annotations

import json
from pathlib import Path

from model.cluster import ClusterSpec
from model.errors import SpecError
from model.plan import Plan, Shape, num_microbatches
from model.specs import JobSpec, ModelSpec

FRAMEWORKS = ("megatron", "nemo", "torchtitan", "deepspeed")


# ---------------------------------------------------------------------------------------------
# the layer split


def _chunks_equal_per_stage(sh: Shape) -> bool:
    return all(len({sh.layers[c * sh.pp + s] for c in range(sh.chunks)}) == 1
               for s in range(sh.pp))


def megatron_split(sh: Shape) -> tuple[list[str], str | None]:
    """Megatron-LM flags for the layer split, or a reason it cannot be expressed.

    Megatron splits layers evenly, or takes the first and last stage counts
    (--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers, arguments.py
    `_add_distributed_args`) and splits the rest evenly; with a virtual pipeline each stage's
    layers are split evenly over its chunks (--num-virtual-stages-per-pipeline-rank; uniform
    splits may use --num-layers-per-virtual-pipeline-stage)."""
    L, p, v = list(sh.layers), sh.pp, sh.chunks
    if len(set(L)) == 1:
        return (["--num-layers-per-virtual-pipeline-stage", str(L[0])] if v > 1 else []), None
    if not _chunks_equal_per_stage(sh):
        return [], (f"the model chunks of a stage hold different layer counts ({L}); Megatron "
                    "splits each stage's layers evenly over its virtual stages")
    T = [sh.stage_layers(s) for s in range(p)]
    flags = ["--num-virtual-stages-per-pipeline-rank", str(v)] if v > 1 else []
    if p == 2:
        return flags + ["--decoder-first-pipeline-num-layers", str(T[0]),
                        "--decoder-last-pipeline-num-layers", str(T[1])], None
    mid = set(T[1:-1])
    if len(mid) != 1:
        return [], (f"the split {T} (layers per stage) is uneven between middle stages; "
                    "--decoder-first/last-pipeline-num-layers only set the first and last "
                    "stage and split the rest evenly")
    m = mid.pop()
    if T[0] != m:
        flags += ["--decoder-first-pipeline-num-layers", str(T[0])]
    if T[-1] != m:
        flags += ["--decoder-last-pipeline-num-layers", str(T[-1])]
    return flags, None


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


def megatron_args(model: ModelSpec, job: JobSpec, plan: Plan) -> tuple[list[str], list[str]]:
    """Megatron-LM command-line arguments for the plan, and the warnings."""
    sh = plan.shape
    warn: list[str] = []
    # arguments.py _add_distributed_args
    a = ["--tensor-model-parallel-size", str(sh.tp),
         "--pipeline-model-parallel-size", str(sh.pp)]
    if sh.cp > 1:  # ring attention through Transformer Engine (--cp-comm-type p2p default)
        a += ["--context-parallel-size", str(sh.cp)]
    split, why = megatron_split(sh)
    if why:
        warn.append(f"megatron: layer split not expressible: {why}. Megatron-LM would split "
                    "evenly instead. Newer Megatron-LM (experimental) accepts "
                    f"--pipeline-model-parallel-layout \"{pipeline_layout(sh)}\"")
    a += split
    if sh.schedule == "gpipe":
        warn.append("megatron: Megatron-LM has no GPipe schedule; it runs 1F1B "
                    "(forward_backward_pipelining_without_interleaving), which the estimate "
                    "did not model")
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
        if sh.shard_size:
            warn.append(f"megatron: HSDP (shard over {sh.shard_size} data-parallel ranks, "
                        f"{sh.dp // sh.shard_size} replicas) has no flag emitted here; "
                        "Megatron-FSDP would shard over the whole data-parallel group, with "
                        "less memory and more inter-node traffic than the estimate; "
                        "torchtitan expresses it (data_parallel_replicate_degree)")
    # overlaps (arguments.py _add_distributed_args): what the estimate assumed hidden
    if sh.overlap_grad_reduce:
        a.append("--overlap-grad-reduce")
    if sh.overlap_param_gather:
        a.append("--overlap-param-gather")
    if sh.tp_comm_overlap:
        a.append("--tp-comm-overlap")
    # arguments.py _add_mixed_precision_args; fp32 is Megatron's default (no flag)
    if job.precision == "bf16":
        a.append("--bf16")
        if job.grad_reduce_in_bf16:  # bf16 main gradients (the estimate's 2 bytes each)
            a.append("--grad-reduce-in-bf16")
    elif job.precision == "fp16":
        a.append("--fp16")
    if sh.fp8:
        # Transformer Engine's delayed-scaling recipe: E4M3 forward, E5M2 gradients
        a += ["--fp8-format", "hybrid", "--fp8-amax-history-len", "1024",
              "--fp8-amax-compute-algo", "max"]
    # attention kernel the estimate assumed (--attention-backend: flash, fused, unfused, local,
    # auto; auto picks a fused / flash kernel, neither stores the scores)
    a += ["--attention-backend", "auto" if job.attention == "flash" else "unfused"]
    # arguments.py _add_network_size_args
    a += ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
          "--ffn-hidden-size", str(model.ffn_hidden_size),
          "--num-attention-heads", str(model.num_heads),
          "--seq-length", str(job.seq_length),
          "--max-position-embeddings", str(max(model.seq_length, job.seq_length))]
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
        # the plan's expert-TP ranks; the alltoall token dispatcher the cost model times
        # (costs.ep_alltoall_bytes); grouped GEMMs for the local experts
        a += ["--num-experts", str(model.num_experts), "--moe-router-topk", str(model.moe_topk),
              "--moe-ffn-hidden-size", str(model.expert_ffn),
              "--expert-model-parallel-size", str(sh.ep),
              "--expert-tensor-parallel-size", str(sh.expert_tp),
              "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm"]
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
    return a, warn


def megatron_args_text(args: list[str], plan: Plan) -> str:
    """One flag (and its value) per line; '#' lines are comments (launch.sh skips them)."""
    lines = [f"# Megatron-LM arguments for {plan.shape.describe()}",
             f"# layers per virtual stage: {list(plan.shape.layers)}"]
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


def nemo_config(model: ModelSpec, job: JobSpec, cluster: ClusterSpec,
                plan: Plan) -> tuple[dict, list[str]]:
    """NeMo 1.x (Megatron GPT) config keys for the plan (megatron_gpt_config.yaml names)."""
    sh = plan.shape
    warn = []
    G = cluster.gpus_per_node
    if G is None:
        warn.append("nemo: trainer.devices is one count for every node, but the nodes have "
                    "different GPU counts")
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
    }
    if model.gated_mlp:
        m["activation"] = "fast-swiglu"  # NeMo llama configs
    if model.is_mla:
        m.update(multi_latent_attention=True, kv_lora_rank=model.mla_kv_lora_rank,
                 q_lora_rank=model.mla_q_lora_rank or None, qk_head_dim=model.head_dim,
                 qk_pos_emb_head_dim=model.mla_qk_rope_dim, v_head_dim=model.mla_v_head_dim)
    elif model.kv_channels:
        m["kv_channels"] = model.kv_channels
    if model.is_moe:  # NeMo (Megatron-Core) MoE keys
        m.update(num_moe_experts=model.num_experts, moe_router_topk=model.moe_topk,
                 expert_model_parallel_size=sh.ep, expert_tensor_parallel_size=sh.expert_tp,
                 moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True)
        if model.first_dense_layers:
            m["moe_layer_freq"] = [0] * model.first_dense_layers + [1] * model.moe_layers
        if job.moe_capacity_factor != 1.0:
            m.update(moe_expert_capacity_factor=job.moe_capacity_factor,
                     moe_pad_expert_input_to_capacity=True)
        if model.expert_ffn != model.ffn_hidden_size or model.moe_shared_experts:
            warn.append("nemo: the expert FFN width and shared experts have no NeMo 1.x key "
                        "here; set them in the model config")
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
        # 'grad' (SHARD_GRAD_OP, ZeRO-2), 'full' (FULL_SHARD, ZeRO-3), 'hybrid' (HSDP)
        m["fsdp"] = True
        m["fsdp_sharding_strategy"] = ("grad" if sh.zero == 2 else
                                       "hybrid" if sh.shard_size else "full")
        m["megatron_amp_O2"] = False  # FSDP keeps its own fp32 shards
        if sh.shard_size and G and sh.shard_size * sh.tp != G:
            warn.append(f"nemo: hybrid FSDP shards inside a node ({G} GPUs), the plan shards "
                        f"over {sh.shard_size} data-parallel ranks")
        if sh.pp > 1:
            warn.append("nemo: NeMo 1.x FSDP does not combine with pipeline parallelism")
    if sh.overlap_grad_reduce:
        m["optim"]["overlap_grad_sync"] = True
    if sh.overlap_param_gather:
        m["optim"]["overlap_param_sync"] = True
    if sh.tp_comm_overlap:
        m["ub_tp_comm_overlap"] = True
    if sh.fp8:
        m.update(fp8=True, fp8_hybrid=True, fp8_amax_history_len=1024,
                 fp8_amax_compute_algo="max")
    m["use_flash_attention"] = job.attention == "flash"
    if len(set(sh.layers)) != 1:
        warn.append(f"nemo: the uneven layer split {list(sh.layers)} has no NeMo 1.x YAML key; "
                    "NeMo splits layers evenly")
    if sh.schedule == "gpipe":
        warn.append("nemo: NeMo (Megatron-Core) has no GPipe schedule; it runs 1F1B")
    cfg = {"trainer": {"num_nodes": cluster.num_nodes, "devices": G, "accelerator": "gpu",
                       "precision": prec},
           "model": m}
    return cfg, warn


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
    out = [f"# {c}" for c in comments]
    for sec, kv in d.items():
        out.append(f"\n[{sec}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in kv.items()]
    return "\n".join(out).lstrip("\n") + "\n"


def torchtitan_config(model: ModelSpec, job: JobSpec, cluster: ClusterSpec,
                      plan: Plan) -> tuple[dict, list[str]]:
    """torchtitan TOML sections (names from torchtitan/config/job_config.py)."""
    sh = plan.shape
    warn = []
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
        warn.append("torchtitan: fp16 is not a torchtitan mixed_precision_param "
                    "(bfloat16 or float32)")
    par: dict = {"tensor_parallel_degree": sh.tp, "pipeline_parallel_degree": sh.pp,
                 "context_parallel_degree": sh.cp}
    # FSDP2 shards over data_parallel_shard_degree ranks and replicates over
    # data_parallel_replicate_degree (HSDP when both > 1); DDP only on 1-D meshes
    if sh.zero >= 3:
        g = sh.shard_size or sh.dp
        par.update(data_parallel_replicate_degree=sh.dp // g, data_parallel_shard_degree=g)
    elif sh.tp * sh.pp * sh.cp == 1 and sh.zero == 0:
        par.update(data_parallel_replicate_degree=sh.dp, data_parallel_shard_degree=1)
    else:
        par.update(data_parallel_replicate_degree=1, data_parallel_shard_degree=sh.dp)
        if sh.dp > 1:
            warn.append("torchtitan: data parallelism becomes FSDP (shards weights, gradients "
                        "and optimizer state); the plan's estimate assumes "
                        + (f"ZeRO-{sh.zero}" if sh.zero else "replicated DDP") +
                        ", so memory is lower and communication differs")
    if sh.pp > 1:
        # torch.distributed.pipelining schedule names
        par["pipeline_parallel_schedule"] = {"gpipe": "GPipe", "1f1b": "1F1B",
                                             "interleaved": "Interleaved1F1B"}[sh.schedule]
        par["pipeline_parallel_microbatch_size"] = sh.micro_batch
        # split points name the first module of every (virtual) stage after the first;
        # torchtitan's llama models name their blocks layers.<i>
        cum, pts = 0, []
        for n in sh.layers[:-1]:
            cum += n
            pts.append(f"layers.{cum}")
        par["pipeline_parallel_split_points"] = pts
    if sh.tp > 1 and not sh.sequence_parallel:
        warn.append("torchtitan: its tensor-parallel plan always shards norms along the "
                    "sequence (sequence parallelism); the plan has it off")
    if sh.tp_comm_overlap:
        par["enable_async_tensor_parallel"] = True
    extra: dict = {}
    if sh.fp8:
        # torchao float8 training of the linear layers (torchtitan's float8 converter)
        extra["model"] = {"converters": ["float8"]}
    if job.attention != "flash":
        warn.append("torchtitan: attention is scaled_dot_product_attention (FlashAttention on "
                    "GPUs that have it); the estimate assumed eager attention")
    if sh.overlap_grad_reduce or sh.overlap_param_gather:
        warn.append("torchtitan: FSDP2 prefetches and overlaps its own collectives; the "
                    "Megatron bucket overlaps the estimate assumed have no switch here")
    ac = {"mode": sh.recompute}  # "none" | "selective" | "full"
    if sh.recompute == "selective":
        ac["selective_ac_option"] = "op"
        if job.framework != "torchtitan":
            warn.append("torchtitan: selective recompute is op-level SAC, not Megatron's "
                        "attention-core recompute the estimate assumed (estimate with "
                        "framework torchtitan to model it); memory and time differ")
    if model.is_moe and sh.ep > 1:
        # torchtitan/config/configs.py Parallelism.expert_parallel_degree (EP borrows ranks
        # from FSDP and TP)
        par["expert_parallel_degree"] = sh.ep
    if model.is_moe:
        warn.append(f"torchtitan: {model.num_experts}-expert top-{model.moe_topk} MoE comes from "
                    "the model flavor (e.g. its DeepSeek-V3 / Llama 4 models)"
                    + (f"; the plan's expert parallelism (EP={sh.ep}) was estimated for "
                       "Megatron-LM's dispatcher, not torchtitan's" if sh.ep > 1 else
                       "; expert parallelism 1 as the estimate assumed"))
    warn.append(f"torchtitan: the architecture comes from [model] name/flavor; choose the "
                f"flavor matching {model.name} (layers={model.num_layers}, "
                f"hidden={model.hidden_size}, heads={model.num_heads}/{model.num_kv_heads}, "
                f"ffn={model.ffn_hidden_size})")
    return {**extra, "training": training, "parallelism": par, "activation_checkpoint": ac}, warn


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
    }
    if sh.shard_size:
        # ZeRO++ hierarchical partitioning (hpZ): a secondary copy of the weights sharded
        # inside groups of this many ranks, so gathers stay inside them
        cfg["zero_optimization"]["zero_hpz_partition_size"] = sh.shard_size
        warn.append("deepspeed: HSDP maps to ZeRO++ hpZ (zero_hpz_partition_size), which keeps "
                    "the primary shards over the whole group: optimizer state and gradients "
                    "use less memory than the estimate, weights slightly more")
    if sh.overlap_grad_reduce:
        cfg["zero_optimization"]["overlap_comm"] = True
    elif sh.zero >= 3:
        # the estimate has each layer's gradient reduce-scatter wait in line (costs.py)
        cfg["zero_optimization"]["overlap_comm"] = False
    if sh.cp > 1:
        warn.append(f"deepspeed: context parallelism (CP={sh.cp}) cannot be expressed: "
                    "DeepSpeed's sequence parallelism is Ulysses (all-to-all over heads), not "
                    "the ring exchange the estimate assumed")
    if sh.zero >= 2 and sh.pp > 1:
        warn.append(f"deepspeed: its pipeline engine runs ZeRO-1 only; ZeRO-{sh.zero} with "
                    f"PP={sh.pp} cannot be expressed")
    if sh.fp8:
        warn.append("deepspeed: FP8 is not a DeepSpeed config key; enable Transformer Engine "
                    "FP8 in the model code (Megatron-DeepSpeed) or run bf16")
    if sh.tp_comm_overlap or sh.overlap_param_gather:
        warn.append("deepspeed: tensor-parallel and parameter-gather overlap are Megatron-LM "
                    "features with no DeepSpeed config key")
    if sh.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": False,
                                           "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
        warn.append(f"deepspeed: the config only tunes activation checkpointing; {sh.recompute} "
                    "recompute must be enabled in the model code "
                    "(deepspeed.checkpointing.checkpoint) or by Megatron-DeepSpeed flags")
    if sh.tp > 1 or sh.pp > 1 or sh.sequence_parallel:
        warn.append(f"deepspeed: TP={sh.tp}, PP={sh.pp}"
                    + (", sequence parallelism" if sh.sequence_parallel else "")
                    + " are not DeepSpeed config keys: give them to the model code "
                    "(PipelineModule(num_stages=PP) and a model-parallel mpu, or "
                    "Megatron-DeepSpeed's --tensor-model-parallel-size / "
                    "--pipeline-model-parallel-size)")
    if sh.pp > 1:
        warn.append(f"deepspeed: the layer split {list(sh.layers)} cannot be given to "
                    "PipelineModule, whose partition_method is 'parameters', 'uniform' or "
                    "'type:...'")
    if sh.schedule != "1f1b" and sh.pp > 1:
        warn.append(f"deepspeed: the pipeline engine runs its own 1F1B-style TrainSchedule; "
                    f"the plan's {sh.schedule} schedule cannot be expressed")
    return cfg, warn


# ---------------------------------------------------------------------------------------------
# entry point


def emit(framework: str, model: ModelSpec, job: JobSpec, cluster: ClusterSpec, plan: Plan,
         out_dir: Path) -> tuple[list[Path], list[str]]:
    """Write `framework`'s configuration and the launch files into `out_dir`."""
    from .ranks import write_launch

    fw = framework.lower()
    if fw not in FRAMEWORKS:
        raise SpecError(f"unknown framework '{framework}'; use one of {', '.join(FRAMEWORKS)}",
                        source="options", field="--emit/--framework")
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecError(f"cannot create the output folder ({e.strerror})", source=str(out_dir),
                        field="--out") from None
    files: list[Path] = []
    title = f"{model.name} on {cluster.name}, {framework}"
    if fw == "megatron":
        args, warn = megatron_args(model, job, plan)
        p = out_dir / "megatron_args.txt"
        p.write_text(megatron_args_text(args, plan))
        files.append(p)
        cmd, args_file = ["pretrain_gpt.py"], p.name
    elif fw == "nemo":
        cfg, warn = nemo_config(model, job, cluster, plan)
        p = out_dir / "nemo_config.yaml"
        p.write_text(f"# NeMo Megatron GPT overrides for {plan.shape.describe()}\n"
                     + to_yaml(cfg))
        files.append(p)
        cmd, args_file = ["megatron_gpt_pretraining.py", "--config-path=$HERE",
                          "--config-name=nemo_config"], None
    elif fw == "torchtitan":
        cfg, warn = torchtitan_config(model, job, cluster, plan)
        p = out_dir / "torchtitan.toml"
        p.write_text(to_toml(cfg, [f"torchtitan job config for {plan.shape.describe()}",
                                   f"model {model.name}: set [model] name/flavor to match"]))
        files.append(p)
        cmd, args_file = ["-m", "torchtitan.train", "--job.config_file",
                          "$HERE/torchtitan.toml"], None
    else:
        cfg, warn = deepspeed_config(model, job, cluster, plan)
        p = out_dir / "ds_config.json"
        p.write_text(json.dumps(cfg, indent=1) + "\n")
        files.append(p)
        cmd, args_file = ["train.py", "--deepspeed", "--deepspeed_config",
                          "$HERE/ds_config.json"], None
    lf, lw = write_launch(out_dir, cluster, plan, cmd, args_file, title)
    files += lf
    warn = warn + lw
    wp = out_dir / "warnings.txt"
    if warn:
        wp.write_text("".join(f"- {w}\n" for w in warn))
        files.append(wp)
    elif wp.exists():
        wp.unlink()
    return files, warn
