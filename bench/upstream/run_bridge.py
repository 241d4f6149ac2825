"""Megatron-Bridge's own configuration code on launch records (run by bench/upstream_check.py with
the Python that has torch, Megatron-Bridge's src/ and a Megatron-LM checkout on PYTHONPATH;
imports nothing of this project).

For each record written by fake_torchrun (the recipe file and the KEY=VALUE overrides an
emitted launch.sh hands to torchrun) it does what the recipe's main() does before touching a
GPU: imports the recipe, calls pipette_pretrain_config(), applies the overrides with
Megatron-Bridge's process_config_with_overrides, runs runtime_config_update (as pretrain() does
first: the mixed-precision and communication-overlap settings applied to the model, then
ConfigContainer.validate(), which finalizes the model's TransformerConfig, the DDP, optimizer, train and scheduler configs and
derives the data-parallel size from WORLD_SIZE), builds the tokenizer and sizes the vocabulary
as megatron/bridge/training/setup.py does, and prints what it built as JSON with the keys of
run_megatron.py's view, so that bench/upstream_check.py compares both alike. Where an item
names a "run_config" path it writes there the run_config.yaml a checkpoint of that run would
hold (ConfigContainer.to_yaml, as checkpointing.py writes it), for `calibrate --run-config`;
"summary" holds the configuration summary Bridge's setup logs (log_non_default_values).

Stand-ins for what this CPU machine lacks, and nothing else: typing.override on Python 3.11
(PEP 698, a marker), an import-only stand-in for Transformer Engine (Megatron-Bridge imports it
at module level; nothing here calls it), the GPU generation, and Transformer Engine's fused RoPE
kernel whose presence TransformerConfig checks.

usage: python run_bridge.py ITEMS.json RESULTS.json  (ITEMS: a list of {"record": ... or
"recipe": "module:function", "world_size": N, "gpu_arch": 8|9|10, "run_config": path or
null}); writes a JSON list of results. Bridge's own recipes read their model's Hugging Face
config.json: run offline (HF_HUB_OFFLINE=1) with HF_HOME holding it.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import os
import sys
import traceback
import types
import typing
from contextlib import redirect_stdout
from pathlib import Path

if not hasattr(typing, "override"):
    typing.override = lambda f: f


def _stand_in_classes():
    """Classes for the Transformer Engine stand-in: torch modules (some importers register
    them as such), any attribute of which is another such class."""
    import torch

    class _AbsentMeta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            sub = _AbsentMeta(name, (_Absent,), {})
            setattr(cls, name, sub)
            return sub

    class _Absent(torch.nn.Module, metaclass=_AbsentMeta):
        def __init__(self, *a, **k):
            super().__init__()

    class _AbsentModule(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            cls = _AbsentMeta(name, (_Absent,), {})
            setattr(self, name, cls)
            return cls

    return _AbsentModule


class _TEStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """transformer_engine and its submodules as import-only stand-ins."""

    def __init__(self):
        self.module_type = _stand_in_classes()

    def find_spec(self, fullname, path, target=None):
        if fullname == "transformer_engine" or fullname.startswith("transformer_engine."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = self.module_type(spec.name)
        mod.__path__ = []
        mod.__version__ = "2.10.0"
        return mod

    def exec_module(self, module):
        pass


def _install_stand_ins() -> None:
    if importlib.util.find_spec("transformer_engine") is None:  # a real one wins
        sys.meta_path.insert(0, _TEStandIn())
    from megatron.core.models.common.embeddings import rope_utils

    if getattr(rope_utils, "fused_apply_rotary_pos_emb", None) is None:
        rope_utils.fused_apply_rotary_pos_emb = lambda *a, **k: None


def build_config(item: dict):
    """(ConfigContainer, padded vocabulary) as Megatron-Bridge builds them for one item: a
    launch record (the emitted recipe and its overrides) or, for {"recipe":
    "module:function"}, one of Bridge's own recipes as it stands. What pretrain() does before
    touching a GPU; the environment from the record, WORLD_SIZE from the item."""
    rec = item.get("record") or {"env": {}, "args": []}
    for k in ("CUDA_DEVICE_MAX_CONNECTIONS",):
        os.environ.pop(k, None)
    os.environ.update(rec["env"])
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(item["world_size"]))
    import torch

    torch.cuda.get_device_capability = lambda *a, **k: (item["gpu_arch"], 0)
    from megatron.bridge.training.setup import _validate_and_set_vocab_size
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides
    from megatron.bridge.utils.vocab_utils import calculate_padded_vocab_size

    if item.get("recipe"):
        module, fn = item["recipe"].split(":")
        make = getattr(importlib.import_module(module), fn)
    else:
        spec = importlib.util.spec_from_file_location("pipette_recipe", rec["script"])
        recipe = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(recipe)
        make = recipe.pipette_pretrain_config
    from megatron.bridge.training.config import runtime_config_update

    cfg = process_config_with_overrides(make(), cli_overrides=rec["args"] or None)
    runtime_config_update(cfg)  # what pretrain() does first: precision, overlap, validate
    tok = build_tokenizer(cfg.tokenizer)
    vocab, pad = _validate_and_set_vocab_size(
        cfg.model.vocab_size, tok.vocab_size,
        getattr(cfg.tokenizer, "use_tokenizer_vocab_size", False))
    padded = (calculate_padded_vocab_size(vocab, cfg.model.make_vocab_size_divisible_by,
                                          cfg.model.tensor_model_parallel_size)
              if pad else vocab)
    # setup.py sets the model's vocabulary so before training; every checkpoint then writes
    # the container as its run_config.yaml (checkpointing.py, cfg.to_yaml)
    cfg.model.vocab_size, cfg.model.should_pad_vocab = vocab, pad
    return cfg, padded


def bridge_view(item: dict) -> dict:
    """What Megatron-Bridge builds for one item (build_config), viewed as run_megatron.py
    views Megatron-LM's."""
    try:
        with redirect_stdout(io.StringIO()):
            cfg, padded = build_config(item)
            if item.get("run_config"):
                cfg.to_yaml(item["run_config"])
        # what setup then logs of the run (setup.py: cfg.log_non_default_values, on rank 0)
        summary = io.StringIO()
        with redirect_stdout(summary):
            cfg.log_non_default_values()
    except BaseException as e:  # AssertionError, ValueError, anything the library raises
        tb = traceback.extract_tb(e.__traceback__)
        where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
        return {"accepted": False, "error": f"{type(e).__name__}: {e}"[:600], "where": where}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run_megatron import (  # Megatron-Core's own, as Bridge
        main_grads_dtype, megatron_groups, pipeline_built, window_built)

    m = cfg.model
    pp, vp, layers, schedule = pipeline_built(m)
    mp = cfg.mixed_precision
    co = cfg.comm_overlap
    ddp = cfg.ddp
    tp_pp_dp = bool(cfg.dist.use_tp_pp_dp_mapping)
    out = {
        "accepted": True, "run_config": item.get("run_config"), "summary": summary.getvalue(),
        "num_layers": m.num_layers, "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.ffn_hidden_size, "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.num_query_groups, "kv_channels": m.kv_channels,
        "normalization": m.normalization, "gated_linear_unit": m.gated_linear_unit,
        "activation": getattr(m.activation_func, "__name__", str(m.activation_func)),
        "add_bias_linear": m.add_bias_linear, "add_qkv_bias": m.add_qkv_bias,
        "hidden_dropout": m.hidden_dropout,
        "attention_dropout": m.attention_dropout,
        "position_embedding_type": m.position_embedding_type, "rotary_base": m.rotary_base,
        "rotary_percent": m.rotary_percent, "layernorm_epsilon": m.layernorm_epsilon,
        "untie_embeddings": not m.share_embeddings_and_output_weights,
        "padded_vocab_size": padded,
        # the data's and the model's sequence length must agree: a pair shows when not
        "seq_length": (cfg.dataset.seq_length if cfg.dataset.seq_length == m.seq_length
                       else [m.seq_length, cfg.dataset.seq_length]),
        "multi_latent_attention": bool(getattr(m, "multi_latent_attention", False)),
        "num_moe_experts": m.num_moe_experts, "moe_router_topk": m.moe_router_topk,
        "moe_ffn_hidden_size": m.moe_ffn_hidden_size,
        "moe_shared_expert_intermediate_size": m.moe_shared_expert_intermediate_size,
        "moe_layer_freq": m.moe_layer_freq,
        "tp": m.tensor_model_parallel_size, "pp": pp, "vp": vp,
        "cp": m.context_parallel_size, "dp": cfg.data_parallel_size,
        "ep": m.expert_model_parallel_size, "etp": m.expert_tensor_parallel_size,
        "layers": layers, "schedule": schedule,
        "micro_batch": cfg.train.micro_batch_size, "global_batch": cfg.train.global_batch_size,
        "sequence_parallel": m.sequence_parallel,
        "recompute_granularity": m.recompute_granularity,
        "recompute_method": m.recompute_method,
        "recompute_num_layers": m.recompute_num_layers,
        "distributed_optimizer": bool(ddp.use_distributed_optimizer
                                      and cfg.optimizer.use_distributed_optimizer),
        "megatron_fsdp": bool(ddp.use_megatron_fsdp),
        "fsdp_double_buffer": bool(getattr(ddp, "fsdp_double_buffer", False)),
        "fsdp_strategy": ddp.data_parallel_sharding_strategy,
        "overlap_grad_reduce": bool(ddp.overlap_grad_reduce),
        "overlap_param_gather": bool(ddp.overlap_param_gather),
        "tp_comm_overlap": bool(co is not None and co.tp_comm_overlap),
        "bf16": bool(m.bf16), "fp16": bool(m.fp16), "fp8": m.fp8,
        "fp8_recipe": str(getattr(m.fp8_recipe, "value", m.fp8_recipe)),
        "first_last_layers_bf16": bool(getattr(m, "first_last_layers_bf16", False)),
        "fp8_param_gather": bool(getattr(mp, "fp8_param_gather", False)),
        "grad_reduce_in_bf16": not ddp.grad_reduce_in_fp32,
        "main_grads_dtype": main_grads_dtype(
            bool(ddp.use_megatron_fsdp), getattr(ddp, "megatron_fsdp_main_grads_dtype", None),
            bool(ddp.grad_reduce_in_fp32), m.params_dtype),
        "attention_backend": str(m.attention_backend),
        "cross_entropy_loss_fusion": bool(m.cross_entropy_loss_fusion),
        **window_built(m, layers, m.seq_length),
        "use_tp_pp_dp_mapping": tp_pp_dp,
        "order": "tp-cp-ep-pp-dp" if tp_pp_dp else "tp-cp-ep-dp-pp",
    }
    out["groups"] = megatron_groups(out)
    return out


def main():
    items = json.load(open(sys.argv[1]))
    dest = sys.argv[2]
    _install_stand_ins()
    out = [bridge_view(it) for it in items]
    with open(dest, "w") as f:
        json.dump(out, f, default=str)


if __name__ == "__main__":
    main()
