"""Megatron-LM's own argument handling on launch records (run by bench/upstream_check.py with the
Python that has torch, from the root of a Megatron-LM checkout; imports nothing of this project).

For each record written by fake_torchrun (the arguments and environment an emitted launch.sh
gives pretrain_gpt.py) it runs, as pretrain_gpt.py would before touching a GPU:
`parse_args` -> `validate_args` -> the tokenizer's vocabulary padding -> `core_transformer_config_
from_args`, and prints what Megatron built as JSON: accepted or the error, the architecture,
parallel sizes, layers per virtual stage (Megatron's own `get_num_layers_to_build` per pipeline
rank and virtual stage), schedule, recompute and optimizer settings, and the sliding window (the
layers Megatron-Core's is_layer_window_attention slides, the keys its mask keeps).

usage: python run_megatron.py RECORDS.json RESULTS.json  (RECORDS: a list of {"record": ...,
"world_size": N, "gpu_arch": 8|9|10}); writes a JSON list of results.
"""

import io
import json
import os
import sys
import traceback
import typing
from contextlib import redirect_stdout

# Megatron-LM main uses typing.override (Python 3.12); on 3.11 it is a no-op decorator
# (PEP 698: override only marks the method)
if not hasattr(typing, "override"):
    typing.override = lambda f: f


def _fn_name(f):
    return getattr(f, "__name__", str(f)) if f is not None else None


def gpu_stand_ins(arch: int) -> None:
    """Stand-ins for the GPU machine Megatron-LM's argument code does not run on here (CPU
    torch, no Transformer Engine): the GPU generation validate_args reads
    (CUDA_DEVICE_MAX_CONNECTIONS rule, grouped-GEMM capability), and Transformer Engine's fused
    RoPE kernel, whose presence TransformerConfig checks when apply_rope_fusion is on (its
    default)."""
    import torch

    from megatron.core.models.common.embeddings import rope_utils
    from megatron.training import arguments as A

    A.get_device_arch_version = lambda: arch
    torch.cuda.get_device_capability = lambda *a, **k: (arch, 0)
    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = lambda *a, **k: None


def megatron_view(item):
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    from megatron.training import arguments as A
    from megatron.training.argument_utils import core_transformer_config_from_args

    rec = item["record"]
    env_keys = ("CUDA_DEVICE_MAX_CONNECTIONS",)
    for k in env_keys:
        os.environ.pop(k, None)
    os.environ.update(rec["env"])
    os.environ["RANK"] = "0"
    os.environ["WORLD_SIZE"] = str(item["world_size"])
    os.environ["LOCAL_RANK"] = "0"
    gpu_stand_ins(item["gpu_arch"])
    sys.argv = [rec["script"] or "pretrain_gpt.py"] + rec["args"]
    log = io.StringIO()
    try:
        with redirect_stdout(log):
            args = A.parse_args()
            A.validate_args(args, {})
            build_tokenizer(args)
            cfg = core_transformer_config_from_args(args)
    except BaseException as e:  # AssertionError, SystemExit from argparse, anything
        tb = traceback.extract_tb(e.__traceback__)
        where = f"{tb[-1].filename.split('megatron-lm/')[-1]}:{tb[-1].lineno}" if tb else ""
        return {"accepted": False, "error": f"{type(e).__name__}: {e}"[:600], "where": where}
    pp, vp, layers, schedule = pipeline_built(cfg)
    out = {
        "accepted": True,
        "num_layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
        "ffn_hidden_size": cfg.ffn_hidden_size, "num_attention_heads": cfg.num_attention_heads,
        "num_query_groups": cfg.num_query_groups, "kv_channels": cfg.kv_channels,
        "normalization": cfg.normalization, "gated_linear_unit": cfg.gated_linear_unit,
        "activation": _fn_name(cfg.activation_func), "add_bias_linear": cfg.add_bias_linear,
        "add_qkv_bias": cfg.add_qkv_bias,
        "hidden_dropout": cfg.hidden_dropout, "attention_dropout": cfg.attention_dropout,
        "position_embedding_type": args.position_embedding_type,
        "rotary_base": args.rotary_base, "rotary_percent": args.rotary_percent,
        "layernorm_epsilon": cfg.layernorm_epsilon,
        "untie_embeddings": args.untie_embeddings_and_output_weights,
        "padded_vocab_size": args.padded_vocab_size, "seq_length": args.seq_length,
        "multi_latent_attention": bool(getattr(cfg, "multi_latent_attention", False)),
        "num_moe_experts": cfg.num_moe_experts, "moe_router_topk": cfg.moe_router_topk,
        "moe_ffn_hidden_size": cfg.moe_ffn_hidden_size,
        "moe_shared_expert_intermediate_size": cfg.moe_shared_expert_intermediate_size,
        "moe_layer_freq": cfg.moe_layer_freq,
        "tp": cfg.tensor_model_parallel_size, "pp": pp, "vp": vp,
        "cp": cfg.context_parallel_size, "dp": args.data_parallel_size,
        "ep": cfg.expert_model_parallel_size, "etp": cfg.expert_tensor_parallel_size,
        "layers": layers, "schedule": schedule,
        "micro_batch": args.micro_batch_size, "global_batch": args.global_batch_size,
        "sequence_parallel": cfg.sequence_parallel,
        "recompute_granularity": cfg.recompute_granularity,
        "recompute_method": cfg.recompute_method,
        "recompute_num_layers": cfg.recompute_num_layers,
        "distributed_optimizer": args.use_distributed_optimizer,
        "megatron_fsdp": bool(getattr(args, "use_megatron_fsdp", False)),
        "fsdp_strategy": getattr(args, "data_parallel_sharding_strategy", None),
        "fsdp_double_buffer": bool(getattr(args, "fsdp_double_buffer", False)),
        "overlap_grad_reduce": args.overlap_grad_reduce,
        "overlap_param_gather": args.overlap_param_gather,
        "tp_comm_overlap": cfg.tp_comm_overlap,
        "bf16": cfg.bf16, "fp16": cfg.fp16, "fp8": cfg.fp8,
        "fp8_recipe": str(getattr(cfg.fp8_recipe, "value", cfg.fp8_recipe)),
        "first_last_layers_bf16": bool(getattr(cfg, "first_last_layers_bf16", False)),
        "grad_reduce_in_bf16": bool(getattr(args, "grad_reduce_in_bf16", False)),
        "main_grads_dtype": main_grads_dtype(
            bool(getattr(args, "use_megatron_fsdp", False)),
            getattr(args, "megatron_fsdp_main_grads_dtype", None),
            args.accumulate_allreduce_grads_in_fp32, args.params_dtype),
        "fp8_param_gather": bool(getattr(args, "fp8_param_gather", False)),
        "attention_backend": str(cfg.attention_backend),
        "cross_entropy_loss_fusion": bool(cfg.cross_entropy_loss_fusion),
        **window_built(cfg, layers, args.seq_length),
        "use_tp_pp_dp_mapping": bool(getattr(args, "use_tp_pp_dp_mapping", False)),
        "order": "tp-cp-ep-pp-dp" if getattr(args, "use_tp_pp_dp_mapping", False)
        else "tp-cp-ep-dp-pp",
    }
    out["groups"] = megatron_groups(out)
    out["printed"] = log.getvalue()  # what it printed, its arguments block (_print_args) in it
    return out


def main_grads_dtype(fsdp: bool, fsdp_dtype, fp32_accumulation: bool, params_dtype) -> str:
    """The dtype the run keeps its gradients in: Megatron-FSDP's own (None: the parameters',
    param_and_grad_buffer.py _resolve_group_grad_dtype), else fp32 where Megatron accumulates
    and reduces in fp32 (DDP's grad_reduce_in_fp32), else the parameters'."""
    if fsdp:
        dtype = fsdp_dtype if fsdp_dtype is not None else params_dtype
    else:
        dtype = "torch.float32" if fp32_accumulation else params_dtype
    return str(dtype).replace("torch.", "")


def pipeline_built(cfg) -> tuple[int, int, list[int], str]:
    """(pp, vp, layers per virtual stage in model order: chunk-major, then pipeline rank,
    schedule) of a finalized TransformerConfig, by Megatron-Core's own layout object or
    get_num_layers_to_build per pipeline rank and virtual stage."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp = cfg.pipeline_model_parallel_size
    vp = cfg.virtual_pipeline_model_parallel_size or 1
    layers = []
    for c in range(vp):
        for r in range(pp):
            if cfg.pipeline_model_parallel_layout is not None:
                n = cfg.pipeline_model_parallel_layout.layout[r][c].count(LayerType.decoder)
            else:
                n = get_num_layers_to_build(cfg, vp_stage=c if vp > 1 else None, pp_rank=r)
            layers.append(n)
    schedule = "interleaved" if vp > 1 else "1f1b" if pp > 1 else "none"
    return pp, vp, layers, schedule


def window_built(cfg, layers: list[int], seq_length: int) -> dict:
    """The sliding window a finalized TransformerConfig builds: window_size and
    window_attn_skip_freq as set; the layers (1-indexed, over the whole model) whose attention
    slides, by Megatron-Core's own is_layer_window_attention on the number each layer's
    attention is given (transformer_layer.py: its number in its virtual stage plus
    get_transformer_layer_offset; `layers` as pipeline_built gives them, in model order); and
    what a sliding layer's mask keeps, by Megatron-Core's own get_sliding_window_causal_mask
    (the (left, right) span Transformer Engine and flash-attn take too) on a seq_length
    sequence: [keys its last query attends, its own included; keys after their query]."""
    import torch

    from megatron.core.transformer import utils as U
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    ws, freq = cfg.window_size, cfg.window_attn_skip_freq
    pp = cfg.pipeline_model_parallel_size
    vp = cfg.virtual_pipeline_model_parallel_size or 1
    numbers, k = [], 0
    for c in range(vp):
        for r in range(pp):
            n = layers[c * pp + r]
            # a layout's offset is read for the calling rank only: the model order instead
            off = (k if cfg.pipeline_model_parallel_layout is not None else
                   get_transformer_layer_offset(cfg, vp_stage=c if vp > 1 else None, pp_rank=r))
            numbers += [off + i + 1 for i in range(n)]
            k += n
    out = {"window_size": list(ws) if ws is not None else None,
           "window_attn_skip_freq": freq,
           "windowed_layers": [g for g in numbers if U.is_layer_window_attention(ws, freq, g)],
           "window_keys": None}
    if ws is not None:
        ones = torch.ones  # the mask is made on "cuda"; this machine's torch has CPU only
        torch.ones = lambda *a, **kw: ones(*a, **{**kw, "device": "cpu"})
        try:
            m = ~U.get_sliding_window_causal_mask(seq_length, seq_length, tuple(ws))
        finally:
            torch.ones = ones
        out["window_keys"] = [int(m[-1].sum()), int(m.triu(1).sum())]
    return out


def megatron_groups(v: dict) -> dict:
    """The process groups Megatron-Core would build for these sizes and this rank order, by
    its own RankGenerator (megatron/core/parallel_state.py initialize_model_parallel: the
    dense grid tp-cp-dp-pp and the expert grid etp-ep-edp-pp in the chosen order)."""
    from megatron.core import parallel_state as ps

    order = v["order"]
    inject = getattr(ps, "_inject_gtp_remat_axis", None)
    dense_order = inject(order, after="tp") if inject else order
    expert_order = inject(order, after="ep") if inject else order
    world = v["tp"] * v["pp"] * v["cp"] * v["dp"]
    dense = ps.RankGenerator(tp=v["tp"], ep=1, dp=v["dp"], pp=v["pp"], cp=v["cp"],
                             order=dense_order)
    etp = v["etp"] or v["tp"]
    edp = world // (etp * v["ep"] * v["pp"])
    expert = ps.RankGenerator(tp=etp, ep=v["ep"], dp=edp, pp=v["pp"], cp=1, order=expert_order)
    return {"tp": dense.get_ranks("tp"), "pp": dense.get_ranks("pp"),
            "dp": dense.get_ranks("dp"), "cp": dense.get_ranks("cp"),
            "ep": expert.get_ranks("ep"), "expert_dp": expert.get_ranks("dp")}


def main():
    items = json.load(open(sys.argv[1]))
    dest = sys.argv[2]  # megatron_view replaces sys.argv
    out = []
    for it in items:
        with redirect_stdout(io.StringIO()):
            out.append(megatron_view(it))
    with open(dest, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
