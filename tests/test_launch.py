"""Launch files: Megatron arguments parse with Megatron-LM's flag names and types, NeMo YAML,
torchtitan TOML and DeepSpeed JSON parse, and the rank mapping, fed through Megatron's group
rule, puts every (stage, replica, tensor rank) where the plan placed it."""

import argparse
import dataclasses
import json
import random
import tomllib

import numpy as np
import pytest

from launch.emit import (FRAMEWORKS, deepspeed_config, emit, megatron_args, nemo_config,
                         pipeline_layout)
from launch.ranks import rank_mapping
from formats import presets
from formats.clusters import uniform_cluster
from model.cluster import ClusterSpec, NodeSpec
from model.errors import SpecError
from model.estimator import make_plan
from model.plan import Placement, Plan, block_placement, megatron_placement
from model.specs import JobSpec


# ---------------------------------------------------------------------------------------------
# Megatron-LM's argument parser, restricted to the flags we emit. Names and types as declared in
# megatron/training/arguments.py (_add_distributed_args, _add_training_args,
# _add_network_size_args, _add_mixed_precision_args).


def megatron_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False)
    for f in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
              "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
              "--virtual-pipeline-model-parallel-size",
              "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
              "--micro-batch-size", "--global-batch-size", "--recompute-num-layers",
              "--seq-length", "--max-position-embeddings", "--num-layers", "--hidden-size",
              "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
              "--context-parallel-size"):
        p.add_argument(f, type=int, default=None)
    p.add_argument("--recompute-granularity", type=str, default=None,
                   choices=["full", "selective"])
    p.add_argument("--recompute-method", type=str, default=None, choices=["uniform", "block"])
    for f in ("--sequence-parallel", "--use-distributed-optimizer", "--bf16", "--fp16",
              "--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights",
              "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
              "--grad-reduce-in-bf16"):
        p.add_argument(f, action="store_true")
    p.add_argument("--use-megatron-fsdp", action="store_true")
    p.add_argument("--data-parallel-sharding-strategy", default="no_shard",
                   choices=["no_shard", "optim", "optim_grads", "optim_grads_params"])
    for f in ("--megatron-fsdp-main-grads-dtype", "--megatron-fsdp-grad-comm-dtype"):
        p.add_argument(f, default="auto", choices=["fp32", "bf16", "fp16", "auto"])
    p.add_argument("--fsdp-double-buffer", action="store_true")
    p.add_argument("--no-gradient-accumulation-fusion", action="store_false",
                   dest="gradient_accumulation_fusion")
    p.add_argument("--ckpt-format", default="torch_dist",
                   choices=["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"])
    p.add_argument("--attention-backend", default="auto",
                   choices=["flash", "fused", "unfused", "local", "auto"])
    p.add_argument("--fp8-format", default=None, choices=["e4m3", "hybrid"])
    p.add_argument("--fp8-param-gather", action="store_true")
    p.add_argument("--reuse-grad-buf-for-mxfp8-param-ag", action="store_true")
    p.add_argument("--fp8-recipe", default="delayed",
                   choices=["tensorwise", "delayed", "mxfp8", "blockwise", "custom"])
    p.add_argument("--fp8-amax-history-len", type=int, default=1)
    p.add_argument("--fp8-amax-compute-algo", default="most_recent",
                   choices=["most_recent", "max"])
    # architecture and vocabulary (_add_network_size_args, _add_regularization_args,
    # _add_tokenizer_args)
    p.add_argument("--position-embedding-type", default="learned_absolute",
                   choices=["learned_absolute", "rope", "yarn", "mrope", "relative", "none"])
    p.add_argument("--rotary-base", type=int, default=10000)
    p.add_argument("--rotary-percent", type=float, default=1.0)
    p.add_argument("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"])
    p.add_argument("--norm-epsilon", type=float, default=1e-5)
    p.add_argument("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    p.add_argument("--hidden-dropout", type=float, default=0.1)
    p.add_argument("--attention-dropout", type=float, default=0.1)
    p.add_argument("--tokenizer-type", default=None)
    p.add_argument("--tokenizer-model", default=None)
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    p.add_argument("--pipeline-model-parallel-layout", default=None)
    p.add_argument("--use-tp-pp-dp-mapping", action="store_true")
    p.add_argument("--no-overlap-p2p-communication", action="store_false",
                   dest="overlap_p2p_comm")
    p.add_argument("--num-distributed-optimizer-instances", type=int, default=1)
    # sliding window (_add_network_size_args: tuple_type 'left,right', moe_freq_type: an int
    # or a list pattern)
    p.add_argument("--window-size", type=lambda x: tuple(int(v) for v in x.strip("()").split(
        ",")), default=None)
    p.add_argument("--window-attn-skip-freq", type=int, default=None)
    return p


def parse_megatron(tokens):
    return megatron_parser().parse_args(tokens)


@pytest.fixture(scope="module")
def llama():
    return presets.model("llama2-70b")


@pytest.fixture(scope="module")
def c32():
    return uniform_cluster(4, 8, "A100-80GB", 240.0, 23.0)


def test_megatron_args_parse_uniform(llama, c32):
    job = JobSpec(global_batch=64, seq_length=4096, precision="bf16")
    plan = make_plan(llama, job, c32, tp=8, pp=4, recompute="full", sequence_parallel=True,
                     distributed_optimizer=True, layers=(20, 20, 20, 20))
    args, warn = megatron_args(llama, job, plan)
    ns = parse_megatron(args)
    assert warn == []
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size) == (8, 4)
    assert (ns.micro_batch_size, ns.global_batch_size) == (1, 64)
    assert ns.sequence_parallel and ns.use_distributed_optimizer and ns.bf16 and not ns.fp16
    assert (ns.recompute_granularity, ns.recompute_method, ns.recompute_num_layers) == (
        "full", "uniform", 1)
    assert (ns.num_layers, ns.hidden_size, ns.ffn_hidden_size, ns.num_attention_heads) == (
        80, 8192, 28672, 64)
    assert ns.group_query_attention and ns.num_query_groups == 8
    assert ns.swiglu and ns.untie_embeddings_and_output_weights
    assert ns.seq_length == 4096
    assert ns.decoder_first_pipeline_num_layers is None
    assert ns.num_layers_per_virtual_pipeline_stage is None


def test_megatron_uneven_first_last(llama, c32):
    job = JobSpec(global_batch=64, seq_length=4096, precision="fp16")
    plan = make_plan(llama, job, c32, tp=8, pp=4, layers=(19, 21, 21, 19),
                     recompute="selective")
    args, warn = megatron_args(llama, job, plan)
    ns = parse_megatron(args)
    assert warn == []
    assert ns.decoder_first_pipeline_num_layers == 19
    assert ns.decoder_last_pipeline_num_layers == 19
    assert ns.fp16 and not ns.bf16 and ns.recompute_granularity == "selective"
    # Megatron's rule: first and last as given, the rest split evenly over the middle
    rest = (80 - 19 - 19) // 2
    assert [19, rest, rest, 19] == [plan.shape.stage_layers(s) for s in range(4)]


def test_megatron_uneven_middle_uses_layout(llama, c32):
    """A split uneven between middle stages is given to Megatron-LM as
    --pipeline-model-parallel-layout, which builds it exactly: no warning."""
    job = JobSpec(global_batch=64, seq_length=4096, precision="fp32")
    plan = make_plan(llama, job, c32, tp=8, pp=4, layers=(20, 21, 19, 20))
    args, warn = megatron_args(llama, job, plan)
    ns = parse_megatron(args)
    assert ns.decoder_first_pipeline_num_layers is None and not ns.bf16 and not ns.fp16
    assert warn == []
    layout = ns.pipeline_model_parallel_layout
    assert layout == pipeline_layout(plan.shape)
    assert [s.count("t") for s in layout.split("|")] == [20, 21, 19, 20]
    assert layout.startswith("E") and layout.endswith("L")


def test_megatron_emits_fp8_overlaps_and_attention(llama):
    """The plan's FP8, overlaps and attention kernel reach Megatron-LM's flags."""
    from formats.clusters import uniform_cluster as uc
    c = uc(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096, fp8=True, attention="eager")
    plan = make_plan(llama, job, c, tp=8, pp=4, sequence_parallel=True,
                     distributed_optimizer=False, tp_comm_overlap=True)
    a = parse_megatron(megatron_args(llama, job, plan)[0])
    assert a.fp8_format == "hybrid" and a.tp_comm_overlap and a.attention_backend == "unfused"
    job2 = JobSpec(global_batch=64, seq_length=4096)
    c2 = uc(4, 8, "A100-80GB", 240.0, 23.0)
    plan2 = make_plan(llama, job2, c2, tp=8, pp=2, distributed_optimizer=True,
                      overlap_grad_reduce=True, overlap_param_gather=True)
    a2 = parse_megatron(megatron_args(llama, job2, plan2)[0])
    assert a2.overlap_grad_reduce and a2.overlap_param_gather and a2.fp8_format is None
    assert a2.attention_backend == "auto" and not a2.tp_comm_overlap


def test_fp8_param_gather_reaches_megatron_nemo_and_bridge(llama):
    """The job's --fp8-param-gather reaches each framework where the plan can use it (FP8 and
    the distributed optimizer), and stays out where Megatron-LM would refuse it."""
    from formats.clusters import uniform_cluster as uc
    from launch.emit import bridge_recipe, nemo_config
    c = uc(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096, fp8=True, fp8_param_gather=True)
    on = make_plan(llama, job, c, tp=8, pp=4, sequence_parallel=True,
                   distributed_optimizer=True)
    # a plan a search found without the distributed optimizer (make_plan refuses to build one
    # with FP8 weights asked for)
    off = Plan(dataclasses.replace(on.shape, zero=0, distributed_optimizer=False), on.placement)
    assert parse_megatron(megatron_args(llama, job, on)[0]).fp8_param_gather
    assert not parse_megatron(megatron_args(llama, job, off)[0]).fp8_param_gather
    assert nemo_config(llama, job, c, on)[0]["model"]["fp8_params"] is True
    assert "fp8_params" not in nemo_config(llama, job, c, off)[0]["model"]
    assert bridge_recipe(llama, job, c, on)[0]["mixed_precision"]["fp8_param_gather"] is True
    assert bridge_recipe(llama, job, c, off)[0]["mixed_precision"]["fp8_param_gather"] is False
    # the scaling recipe: delayed by default, per-tensor current scaling when the job says so
    assert parse_megatron(megatron_args(llama, job, on)[0]).fp8_recipe == "delayed"
    cs = dataclasses.replace(job, fp8_recipe="tensorwise")
    a = parse_megatron(megatron_args(llama, cs, on)[0])
    assert a.fp8_recipe == "tensorwise" and a.fp8_format == "hybrid" and a.fp8_param_gather
    mp = bridge_recipe(llama, cs, c, on)[0]["mixed_precision"]
    assert mp["preset"] == "bf16_with_fp8_current_scaling_mixed"
    assert mp["first_last_layers_bf16"] is False
    assert any("tensorwise recipe has no key" in w for w in nemo_config(llama, cs, c, on)[1])


def test_block_fp8_recipes_reach_megatron_and_bridge(llama):
    """MXFP8 and blockwise FP8 reach Megatron-LM's --fp8-recipe and Megatron-Bridge's presets;
    MXFP8 weights go with the gradient-buffer reuse its later presets pair them with, and
    NeMo 1.x (delayed scaling only) says it cannot."""
    from formats.clusters import uniform_cluster as uc
    from launch.emit import bridge_recipe, nemo_config
    b200, h100 = uc(4, 8, "B200", 900.0, 50.0), uc(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    mx = JobSpec(global_batch=64, seq_length=4096, fp8=True, fp8_recipe="mxfp8",
                 fp8_param_gather=True)
    on = make_plan(llama, mx, b200, tp=8, pp=4, sequence_parallel=True,
                   distributed_optimizer=True)
    a = parse_megatron(megatron_args(llama, mx, on)[0])
    assert (a.fp8_format, a.fp8_recipe, a.fp8_param_gather) == ("e4m3", "mxfp8", True)
    # MXFP8 weights gather through the gradient buffer (Megatron-Core cannot remap them into
    # a separate parameter buffer: TE's MXFP8Tensor has no replace_raw_data)
    assert a.reuse_grad_buf_for_mxfp8_param_ag
    mp = bridge_recipe(llama, mx, b200, on)[0]["mixed_precision"]
    assert mp["preset"] == "bf16_with_mxfp8_mixed"
    assert mp["fp8_param_gather"] is True and mp["reuse_grad_buf_for_mxfp8_param_ag"] is True
    assert any("mxfp8 recipe has no key" in w for w in nemo_config(llama, mx, b200, on)[1])
    bw = JobSpec(global_batch=64, seq_length=4096, fp8=True, fp8_recipe="blockwise")
    p = make_plan(llama, bw, h100, tp=8, pp=4, sequence_parallel=True,
                  distributed_optimizer=True)
    a = parse_megatron(megatron_args(llama, bw, p)[0])
    assert (a.fp8_format, a.fp8_recipe, a.fp8_param_gather) == ("hybrid", "blockwise", False)
    assert not a.reuse_grad_buf_for_mxfp8_param_ag
    mp = bridge_recipe(llama, bw, h100, p)[0]["mixed_precision"]
    assert mp["preset"] == "bf16_with_fp8_subchannel_scaling_mixed"
    assert mp["fp8_param_gather"] is False


def test_bf16_gradients_reach_nemo1_or_are_warned(llama):
    """--grad-reduce-in-bf16 (2 bytes per gradient in the estimate): NeMo 1.x's distributed
    optimizer takes optim.grad_sync_dtype bf16 (Megatron-Core's grad_reduce_in_fp32 follows it);
    without it NeMo 1.x keeps fp32 main gradients, which the files say."""
    from formats.clusters import uniform_cluster as uc
    from launch.emit import nemo_config
    c = uc(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096, grad_reduce_in_bf16=True)
    on = make_plan(llama, job, c, tp=8, pp=4, sequence_parallel=True, distributed_optimizer=True)
    cfg, warn = nemo_config(llama, job, c, on)
    assert cfg["model"]["optim"]["grad_sync_dtype"] == "bf16"
    assert not any("fp32 main gradients" in w for w in warn)
    off = make_plan(llama, job, c, tp=8, pp=4, sequence_parallel=True,
                    distributed_optimizer=False)
    cfg, warn = nemo_config(llama, job, c, off)
    assert "grad_sync_dtype" not in cfg["model"]["optim"]
    assert any(w.startswith("nemo [memory]") and "fp32 main gradients" in w for w in warn)
    plain = dataclasses.replace(job, grad_reduce_in_bf16=False)
    cfg, warn = nemo_config(llama, plain, c, on)
    assert "grad_sync_dtype" not in cfg["model"]["optim"] and not any(
        "fp32 main gradients" in w for w in warn)


def test_torchtitan_float8_tp_follows_the_release(tmp_path):
    """An FP8 plan with TP priced for one torchtitan release and emitted for the other is
    warned: v0.1 gathers in FP8 (Float8 TP), v0.2 in bf16 (JobSpec.fp8_tp_gathers)."""
    from launch.emit import torchtitan_config
    c = uniform_cluster(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    l70 = presets.model("llama3-70b")
    for v01 in (False, True):
        job = JobSpec(global_batch=128, seq_length=8192, framework="torchtitan", fp8=True,
                      repeat_kv=v01)
        plan = make_plan(l70, job, c, tp=8, pp=1, zero=3, sequence_parallel=True,
                         recompute="full")
        for version in ("0.2", "0.1"):
            warn = torchtitan_config(l70, job, c, plan, version)[1]
            said = [w for w in warn if w.startswith("torchtitan [precision]")
                    and "Float8 TP" in w]
            assert bool(said) == (v01 != (version == "0.1")), (v01, version, warn)
        tp1 = make_plan(l70, job, c, tp=1, pp=1, zero=3, recompute="full")
        assert not any("Float8 TP" in w for w in torchtitan_config(
            l70, job, c, tp1, "0.1" if not v01 else "0.2")[1])


def test_megatron_interleaved(llama, c32):
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=8, pp=4, schedule="interleaved", chunks=2)
    uni = Plan(plan.shape.__class__(**{**plan.shape.__dict__, "layers": (10,) * 8}),
               plan.placement)
    ns = parse_megatron(megatron_args(llama, job, uni)[0])
    assert ns.num_layers_per_virtual_pipeline_stage == 10
    # stage totals 18/22/22/18, each split evenly over its two chunks: first/last + VPP count
    lay = (9, 11, 11, 9, 9, 11, 11, 9)
    un = make_plan(llama, job, c32, tp=8, pp=4, schedule="interleaved", chunks=2, layers=lay)
    args, warn = megatron_args(llama, job, un)
    ns = parse_megatron(args)
    assert warn == []
    assert ns.num_virtual_stages_per_pipeline_rank == 2
    assert (ns.decoder_first_pipeline_num_layers, ns.decoder_last_pipeline_num_layers) == (18, 18)
    # chunks of a stage uneven: only the layout string says it; the schedule stays interleaved
    bad = make_plan(llama, job, c32, tp=8, pp=4, schedule="interleaved", chunks=2,
                    layers=(9, 11, 11, 9, 10, 10, 10, 10))
    args, warn = megatron_args(llama, job, bad)
    ns = parse_megatron(args)
    assert warn == [] and ns.num_virtual_stages_per_pipeline_rank is None
    assert [x.count("t") for x in ns.pipeline_model_parallel_layout.split("|")] == list(
        bad.shape.layers)
    # the pipeline sends as priced: Megatron-LM overlaps them by default under interleaving
    # (the default blocking pricing had run overlapped), asserts PP > 2 for blocking ones, and
    # blocks without interleaving whatever it is told
    assert ns.overlap_p2p_comm is False
    assert parse_megatron(megatron_args(llama, job, bad, blocking_p2p=False)[0]).overlap_p2p_comm
    two = make_plan(llama, job, c32, tp=8, pp=2, dp=2, schedule="interleaved", chunks=2)
    args, warn = megatron_args(llama, job, two)
    assert parse_megatron(args).overlap_p2p_comm and any("PP > 2" in w for w in warn)
    one = make_plan(llama, job, c32, tp=8, pp=4)
    assert any("sends block" in w for w in megatron_args(llama, job, one, blocking_p2p=False)[1])
    assert megatron_args(llama, job, one)[1] == []


def test_hsdp_reaches_megatron_fsdp(llama, c32):
    """An HSDP plan (ZeRO-3 sharded in groups of S data-parallel ranks) runs on Megatron-FSDP
    as DP / S distributed-optimizer instances, each a consecutive slice of the data x context
    parallel group (parallel_state.py; mcore_fsdp_adapter.py enable_hsdp): Megatron-LM's flag
    and Bridge's ddp field (the emit had warned that it would shard over the whole group)."""
    from launch.emit import bridge_recipe
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=8, pp=1, dp=4, zero=3, shard_size=2,
                     sequence_parallel=True, recompute="full")
    args, warn = megatron_args(llama, job, plan)
    ns = parse_megatron(args)
    assert ns.num_distributed_optimizer_instances == 2 and ns.use_megatron_fsdp
    assert not any("HSDP" in w for w in warn)
    cfg, warn = bridge_recipe(llama, job, c32, plan)
    assert cfg["ddp"]["num_distributed_optimizer_instances"] == 2
    assert not any("HSDP" in w for w in warn)
    full = make_plan(llama, job, c32, tp=8, pp=1, dp=4, zero=3, sequence_parallel=True,
                     recompute="full")
    assert "--num-distributed-optimizer-instances" not in megatron_args(llama, job, full)[0]


def test_bridge_recipe_sends_buckets_and_fsdp_order(llama, c32):
    """The Bridge recipe: CommOverlapConfig would turn pipeline-send overlap on under
    interleaving and take 128M-element buckets (comm_overlap.py); the recipe gives the priced
    ones. Megatron-FSDP with the pipeline-before-data rank order is refused, as Bridge's
    ConfigContainer.validate would at start-up."""
    from launch.emit import bridge_recipe
    from launch.ranks import TP_PP_DP_ORDER
    from model.costs import bucket_params
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=8, pp=2, dp=2, schedule="interleaved", chunks=2,
                     sequence_parallel=True, tp_comm_overlap=True, distributed_optimizer=True,
                     overlap_grad_reduce=True)
    co = bridge_recipe(llama, job, c32, plan)[0]["comm_overlap"]
    assert co["overlap_p2p_comm"] is False and co["bucket_size"] == int(bucket_params(2))
    co = bridge_recipe(llama, job, c32, plan, blocking_p2p=False)[0]["comm_overlap"]
    assert co["overlap_p2p_comm"] is True
    fsdp = make_plan(llama, job, c32, tp=8, pp=2, dp=2, zero=3, sequence_parallel=True)
    with pytest.raises(SpecError, match="use_tp_pp_dp_mapping is not supported"):
        bridge_recipe(llama, job, c32, fsdp, rank_order=TP_PP_DP_ORDER)


def test_gpipe_warns(llama, c32):
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=8, pp=4, schedule="gpipe")
    assert any("GPipe" in w for w in megatron_args(llama, job, plan)[1])


def _mini_yaml(text):
    """YAML via PyYAML when installed, else a parser for the subset our writer emits."""
    try:
        import yaml
        return yaml.safe_load(text)
    except ImportError:  # pragma: no cover
        root, stack = {}, [(-1, None)]
        stack[0] = (-1, root)
        for line in text.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            ind = len(line) - len(line.lstrip())
            k, _, v = line.strip().partition(":")
            while stack[-1][0] >= ind:
                stack.pop()
            cur = stack[-1][1]
            if v.strip() == "":
                cur[k] = {}
                stack.append((ind, cur[k]))
            else:
                cur[k] = json.loads(v.strip().replace("null", "null"))
        return root


# ---------------------------------------------------------------------------------------------
# Megatron-Bridge recipes, executed against recording stand-ins for the library (the library
# itself is checked by bench/upstream_check.py --bridge)


def run_bridge_recipe(path, monkeypatch):
    """Import an emitted bridge_recipe.py with stand-ins for torch and Megatron-Bridge that record
    what it sets, call pipette_pretrain_config() and return the config it built."""
    import importlib.util
    import sys
    from types import ModuleType, SimpleNamespace

    def module(name, **attrs):
        m = ModuleType(name)
        m.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, m)

    def fn(name):
        f = lambda x: x  # noqa: E731
        f.__name__ = name
        return f

    class Provider(SimpleNamespace):
        pass

    def pretrain_common():
        return SimpleNamespace(model=None, mixed_precision="bf16_mixed", comm_overlap=None,
                               **{k: SimpleNamespace() for k in (
                                   "train", "dataset", "tokenizer", "ddp", "optimizer",
                                   "dist", "checkpoint")})

    module("torch", float32="float32", bfloat16="bfloat16", float16="float16")
    for pkg in ("torch.nn", "megatron", "megatron.core", "megatron.core.transformer",
                "megatron.bridge", "megatron.bridge.models", "megatron.bridge.recipes",
                "megatron.bridge.training"):
        module(pkg)
    module("torch.nn.functional", silu=fn("silu"), gelu=fn("gelu"))
    module("megatron.core.transformer.enums",
           AttnBackend=SimpleNamespace(auto="auto", unfused="unfused"))
    module("megatron.bridge.models.gpt_provider", GPTModelProvider=Provider)
    module("megatron.bridge.models.mla_provider", MLAModelProvider=Provider)
    module("megatron.bridge.recipes.common", _pretrain_common=pretrain_common)
    module("megatron.bridge.training.comm_overlap",
           CommOverlapConfig=lambda **kw: SimpleNamespace(**kw))
    module("megatron.bridge.training.config", ConfigContainer=SimpleNamespace)
    module("megatron.bridge.training.mixed_precision",
           get_mixed_precision_config=lambda name: SimpleNamespace(preset=name))
    spec = importlib.util.spec_from_file_location("bridge_recipe_under_test", path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    return recipe.pipette_pretrain_config()


def bridge_layers(m) -> list[int]:
    """Layers per virtual stage Megatron-Core builds from a recipe's model fields: the layout
    string, or first/last stage counts with the rest even, each stage even over its chunks."""
    if getattr(m, "pipeline_model_parallel_layout", None):
        return [p.count("t") for p in m.pipeline_model_parallel_layout.split("|")]
    pp, vp = m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size or 1
    first = getattr(m, "num_layers_in_first_pipeline_stage", None)
    last = getattr(m, "num_layers_in_last_pipeline_stage", None)
    rest, left = m.num_layers - (first or 0) - (last or 0), pp - (first is not None) - (
        last is not None)
    per = [rest // left if left else 0] * pp
    if first is not None:
        per[0] = first
    if last is not None:
        per[-1] = last
    return [per[s] // vp for c in range(vp) for s in range(pp)]


@pytest.mark.parametrize("fw,version", [(fw, None) for fw in FRAMEWORKS] + [("nemo", "1")])
def test_emit_files_parse(fw, version, llama, c32, tmp_path, monkeypatch):
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=8, pp=4, schedule="interleaved", chunks=2,
                     recompute="selective", sequence_parallel=True,
                     distributed_optimizer=True)
    files, warn = emit(fw, llama, job, c32, plan, tmp_path, version=version)
    names = {p.name for p in files}
    assert {"launch.sh", "hostfile", "ranks.json"} <= names
    assert all(p.exists() and p.stat().st_size > 0 for p in files)
    if fw == "megatron":
        toks = [t for line in (tmp_path / "megatron_args.txt").read_text().splitlines()
                if not line.startswith("#") for t in line.split()]
        ns = parse_megatron(toks)
        assert ns.tensor_model_parallel_size == 8 and ns.num_layers_per_virtual_pipeline_stage
    elif fw == "nemo" and version is None:  # Megatron-Bridge, the default
        cfg = run_bridge_recipe(tmp_path / "bridge_recipe.py", monkeypatch)
        m = cfg.model
        assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
                m.virtual_pipeline_model_parallel_size) == (8, 4, 2)
        assert bridge_layers(m) == list(plan.shape.layers)
        assert m.sequence_parallel is True and m.recompute_granularity == "selective"
        assert (m.normalization, m.gated_linear_unit, m.activation_func.__name__,
                m.add_bias_linear, m.position_embedding_type) == (
            "RMSNorm", True, "silu", False, "rope")
        assert (m.num_query_groups, m.share_embeddings_and_output_weights) == (8, False)
        assert cfg.ddp.use_distributed_optimizer and cfg.optimizer.use_distributed_optimizer
        assert (cfg.train.global_batch_size, cfg.train.micro_batch_size) == (64, 1)
        assert cfg.dataset.seq_length == m.seq_length == 4096
        assert (cfg.tokenizer.tokenizer_type, cfg.tokenizer.vocab_size) == ("NullTokenizer",
                                                                            32000)
        assert cfg.mixed_precision.preset == "bf16_mixed" and not cfg.dist.use_tp_pp_dp_mapping
        assert "torchrun" in (tmp_path / "launch.sh").read_text()
        assert "bridge_recipe.py" in (tmp_path / "launch.sh").read_text()
    elif fw == "nemo":
        cfg = _mini_yaml((tmp_path / "nemo_config.yaml").read_text())
        m = cfg["model"]
        assert (m["tensor_model_parallel_size"], m["pipeline_model_parallel_size"],
                m["virtual_pipeline_model_parallel_size"]) == (8, 4, 2)
        assert m["sequence_parallel"] is True
        assert m["activations_checkpoint_granularity"] == "selective"
        assert m["optim"]["name"] == "distributed_fused_adam"
        assert (cfg["trainer"]["num_nodes"], cfg["trainer"]["devices"]) == (4, 8)
    elif fw == "torchtitan":
        cfg = tomllib.loads((tmp_path / "torchtitan.toml").read_text())
        par = cfg["parallelism"]
        assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (8, 4)
        assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
        parts = par["module_fqns_per_model_part"]  # torchtitan 0.2: modules of each part
        assert [sum(m.startswith("layers.") for m in p) for p in parts] == list(
            plan.shape.layers)
        assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
        assert cfg["model"]["flavor"] == "llama2-70b"  # no torchtitan flavor: stops at lookup
        assert cfg["training"]["global_batch_size"] == 64
        assert cfg["activation_checkpoint"]["mode"] == "selective"
        assert warn  # the architecture flavor at least
    else:
        cfg = json.loads((tmp_path / "ds_config.json").read_text())
        assert cfg["train_batch_size"] == 64 and cfg["train_micro_batch_size_per_gpu"] == 1
        assert cfg["gradient_accumulation_steps"] == 64 and cfg["zero_optimization"]["stage"] == 1
        assert any("Interleaved" in w or "interleaved" in w for w in warn)
    if warn:
        assert (tmp_path / "warnings.txt").read_text().count("\n") == len(warn)
    script = (tmp_path / "launch.sh").read_text()
    assert script.count("--node_rank=") == 4 and "CUDA_VISIBLE_DEVICES=" in script


def test_emit_unknown_framework(llama, c32, tmp_path):
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=8, pp=4)
    with pytest.raises(SpecError, match="unknown framework 'foo'"):
        emit("foo", llama, job, c32, plan, tmp_path)


# ---------------------------------------------------------------------------------------------
# rank mapping through Megatron's group rule


def megatron_groups(world: int, tp: int, pp: int):
    """Megatron-LM initialize_model_parallel, written from its documented construction: tensor
    groups are blocks of tp consecutive ranks; pipeline groups take every (world/pp)-th rank;
    data groups take, inside each pipeline block of world/pp ranks, every tp-th rank.
    Returns rank -> (stage, replica, tensor rank) as positions in those groups."""
    dp = world // (tp * pp)
    pos = {}
    tensor = [list(range(k * tp, (k + 1) * tp)) for k in range(world // tp)]
    pipeline = [list(range(i, world, world // pp)) for i in range(world // pp)]
    data = []
    for b in range(pp):
        start, end = b * world // pp, (b + 1) * world // pp
        for j in range(tp):
            data.append(list(range(start + j, end, tp)))
    for g in tensor:
        for i, q in enumerate(g):
            pos.setdefault(q, {})["t"] = i
    for g in pipeline:
        for i, q in enumerate(g):
            pos[q]["s"] = i
    for g in data:
        assert len(g) == dp
        for i, q in enumerate(g):
            pos[q]["r"] = i
    return {q: (v["s"], v["r"], v["t"]) for q, v in pos.items()}


def check_mapping(cluster, plan):
    mp, why = rank_mapping(cluster, plan)
    assert mp is not None, why
    sh, pl = plan.shape, plan.placement
    world = sh.tp * sh.pp * sh.dp
    G = mp.nproc_per_node
    by_node_rank = {mp.node_rank[n]: n for n in range(cluster.num_nodes)}
    assert sorted(by_node_rank) == list(range(cluster.num_nodes))
    for n in range(cluster.num_nodes):
        assert sorted(mp.visible_devices[n]) == list(range(cluster.nodes[n].num_gpus))
    seen = set()
    for q, (s, r, i) in megatron_groups(world, sh.tp, sh.pp).items():
        node = by_node_rank[q // G]  # torchrun: node_rank k runs ranks k*G..k*G+G-1
        gpu = mp.visible_devices[node][q % G]  # local_rank -> CUDA_VISIBLE_DEVICES entry
        assert (node, gpu) == (pl.node[s][r], pl.gpus[s][r][i]), (q, s, r, i)
        seen.add((node, gpu))
    assert len(seen) == world


def permute_nodes(pl: Placement, perm) -> Placement:
    return Placement(tuple(tuple(perm[n] for n in row) for row in pl.node), pl.gpus)


def permute_gpus(pl: Placement, perms) -> Placement:
    return Placement(pl.node, tuple(tuple(tuple(perms[pl.node[s][r]][g] for g in grp)
                                          for r, grp in enumerate(row))
                                    for s, row in enumerate(pl.gpus)))


def _plan(tp, pp, dp, pl):
    from model.plan import Shape
    return Plan(Shape(tp=tp, pp=pp, dp=dp, micro_batch=1, layers=(1,) * pp), pl)


@pytest.mark.parametrize("tp,pp,dp", [(8, 4, 1), (4, 4, 2), (2, 4, 4), (1, 8, 4), (8, 1, 4),
                                      (2, 2, 8), (4, 2, 4), (1, 1, 32)])
def test_megatron_default_placement(tp, pp, dp, c32):
    check_mapping(c32, _plan(tp, pp, dp, megatron_placement(c32, tp, pp, dp)))


@pytest.mark.parametrize("tp,pp,dp,j", [(8, 4, 1, 1), (4, 4, 2, 1), (2, 4, 4, 1), (1, 4, 8, 1),
                                        (4, 8, 1, 2), (2, 8, 2, 2), (1, 16, 2, 4)])
def test_block_placements(tp, pp, dp, j, c32):
    rng = random.Random(tp * 100 + pp * 10 + dp + j)
    for _ in range(5):
        order = list(range(c32.num_nodes))
        rng.shuffle(order)
        pl = block_placement(c32, tp, pp, dp, j, node_order=order)
        check_mapping(c32, _plan(tp, pp, dp, pl))


def test_random_node_and_gpu_permutations(c32):
    rng = random.Random(7)
    for tp, pp, dp in [(8, 4, 1), (4, 4, 2), (2, 4, 4), (2, 2, 8), (1, 8, 4)]:
        base = megatron_placement(c32, tp, pp, dp)
        for _ in range(6):
            perm = list(range(c32.num_nodes))
            rng.shuffle(perm)
            gperm = []
            for _n in range(c32.num_nodes):
                g = list(range(8))
                rng.shuffle(g)
                gperm.append(g)
            pl = permute_gpus(permute_nodes(base, perm), gperm)
            check_mapping(c32, _plan(tp, pp, dp, pl))


def test_example_cluster_default(example_cluster):
    check_mapping(example_cluster, _plan(8, 4, 2, megatron_placement(example_cluster, 8, 4, 2)))


def test_inexpressible_placements(c32):
    # two stages x two replicas per node: node 0 holds ranks 0..3 and 16..19
    pl = block_placement(c32, 2, 2, 8, 2,
                         slots=[(0, b) for b in range(4)])
    mp, why = rank_mapping(c32, _plan(2, 2, 8, pl))
    assert mp is None and "non-contiguous" in why and "node00" in why
    # different GPU counts per node
    g = presets.gpu("A100-80GB")
    nodes = (NodeSpec("a", g, 8, 240.0), NodeSpec("b", g, 4, 240.0))
    bw = np.array([[0.0, 20.0], [20.0, 0.0]])
    het = ClusterSpec("het", nodes, bw)
    pl = Placement(((0, 0, 1),), (((0, 1, 2, 3), (4, 5, 6, 7), (0, 1, 2, 3)),))
    mp, why = rank_mapping(het, _plan(4, 1, 3, pl))
    assert mp is None and "different GPU counts" in why


def _cross_placement(c32) -> Placement:
    """tp=2, pp=2, dp=8 with (stage s, replica r) on node (r + s) % 4: a node holds one stage
    of four replicas, and no replica's two stages share a node, so neither Megatron rank order
    gives any node a contiguous block of ranks."""
    nxt = [0] * 4
    node, gpus = [], []
    for s in range(2):
        node.append(tuple((r + s) % 4 for r in range(8)))
        row = []
        for r in range(8):
            n = (r + s) % 4
            row.append((nxt[n], nxt[n] + 1))
            nxt[n] += 2
        gpus.append(tuple(row))
    return Placement(tuple(node), tuple(gpus))


def test_emit_reports_inexpressible_placement(llama, c32, tmp_path):
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=2, pp=2, dp=8, placement=_cross_placement(c32))
    files, warn = emit("megatron", llama, job, c32, plan, tmp_path, force=True)
    assert not (tmp_path / "launch.sh").exists()
    assert any(w.startswith("megatron [placement]") and "cannot be expressed" in w
               for w in warn)


@pytest.mark.parametrize("zero,strategy", [(2, "optim_grads"), (3, "optim_grads_params")])
def test_megatron_fsdp_flags_parse(llama, c32, zero, strategy):
    """ZeRO-2/3 plans run on Megatron-FSDP, with the distributed optimizer it requires."""
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=8, pp=1, sequence_parallel=True, zero=zero)
    a = parse_megatron(megatron_args(llama, job, plan)[0])
    assert a.use_megatron_fsdp and a.data_parallel_sharding_strategy == strategy
    assert a.use_distributed_optimizer and not a.gradient_accumulation_fusion
    assert a.ckpt_format == "fsdp_dtensor" and a.fsdp_double_buffer  # as priced
    # Megatron-FSDP ignores grad_reduce_in_fp32 (Megatron-Core 0.17 on): its own flags give the
    # fp32 gradients and fp32 reduction the estimate prices ('auto' would be bf16)
    assert (a.megatron_fsdp_main_grads_dtype, a.megatron_fsdp_grad_comm_dtype) == (
        "fp32", "fp32")
    jb = JobSpec(global_batch=64, seq_length=4096, grad_reduce_in_bf16=True)
    ab = parse_megatron(megatron_args(llama, jb, plan)[0])
    assert (ab.megatron_fsdp_main_grads_dtype, ab.megatron_fsdp_grad_comm_dtype) == (
        "bf16", "bf16")
    plan1 = make_plan(llama, job, c32, tp=8, pp=2, sequence_parallel=True, zero=1)
    a1 = parse_megatron(megatron_args(llama, job, plan1)[0])
    assert a1.use_distributed_optimizer and not a1.use_megatron_fsdp
    assert a1.megatron_fsdp_main_grads_dtype == "auto"  # not written without Megatron-FSDP


def test_bf16_gradients_named_where_not_written(llama, c32, tmp_path):
    """A Megatron plan with bf16 gradients (--grad-reduce-in-bf16) emitted for DeepSpeed or
    torchtitan, which are not told: the warning names the choice, not only the framework."""
    job = JobSpec(global_batch=64, seq_length=4096, grad_reduce_in_bf16=True)
    plan = make_plan(llama, job, c32, tp=8, pp=4, sequence_parallel=True, zero=1)
    for fw in ("deepspeed", "torchtitan"):
        _, warn = emit(fw, llama, job, c32, plan, tmp_path / fw, force=True)
        assert any(w.startswith(f"{fw} [precision]") and "--grad-reduce-in-bf16" in w
                   for w in warn), warn
    _, warn = emit("megatron", llama, job, c32, plan, tmp_path / "m", force=True)
    assert not any("--grad-reduce-in-bf16" in w for w in warn)
    plain = JobSpec(global_batch=64, seq_length=4096)
    _, warn = emit("deepspeed", llama, plain, c32, plan, tmp_path / "d", force=True)
    assert not any("--grad-reduce-in-bf16" in w for w in warn)


def test_deepspeed_gets_the_zero_stage(c32, tmp_path):
    m = presets.model("llama2-7b")
    for zero in (0, 1, 2, 3):
        # (bf16 without ZeRO is not DeepSpeed's mixed precision: plan.deepspeed_problem)
        job = JobSpec(global_batch=64, seq_length=4096, framework="deepspeed",
                      precision="fp16" if zero == 0 else "bf16")
        plan = make_plan(m, job, c32, tp=1, pp=1, zero=zero)
        emit("deepspeed", m, job, c32, plan, tmp_path, force=True)  # ZeRO-0 needs 123 GiB
        cfg = json.loads((tmp_path / "ds_config.json").read_text())
        assert cfg["zero_optimization"]["stage"] == zero
        # DeepSpeed prints no timing line without it (calibrate reads those)
        assert cfg["steps_per_print"] == 10
        # and from 0.17.6 on logs it at INFO under a WARNING logger: the user is told
        warns = (tmp_path / "warnings.txt").read_text()
        assert "deepspeed [logging]" in warns and "set_log_level_from_string" in warns
        if zero == 3:  # the estimate's reduce-scatters wait in line; so must DeepSpeed's
            assert cfg["zero_optimization"]["overlap_comm"] is False


# ---------------------------------------------------------------------------------------------
# issue 16: complete Megatron-LM argument sets, run as launch.sh runs them


FAKE_TORCHRUN = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["RECORD"], "w") as f:
    json.dump({"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in
               ("CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_VISIBLE_DEVICES")}}, f)
"""


def run_launch_sh(folder, node, tmp_path, extra=(), env_extra=None):
    """Run launch.sh for `node` with torchrun replaced by a recorder; returns the record."""
    import os
    import subprocess
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    tr = shim / "torchrun"
    tr.write_text(FAKE_TORCHRUN)
    tr.chmod(0o755)
    rec = tmp_path / f"rec-{node}.json"
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "NODE_NAME": node,
           "RECORD": str(rec), **(env_extra or {})}
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None) if not env_extra else None
    subprocess.run(["bash", str(folder / "launch.sh"), *extra], env=env, check=True)
    return json.loads(rec.read_text())


def _args_file_tokens(folder):
    return [t for line in (folder / "megatron_args.txt").read_text().splitlines()
            if line and not line.startswith("#") for t in line.split()]


def test_launch_sh_hands_over_every_argument_verbatim(tmp_path):
    """launch.sh passes the arguments file word for word (a layout string with '|', a MoE layer
    pattern with brackets and '*' that a shell would glob) and then its own arguments, and
    exports CUDA_DEVICE_MAX_CONNECTIONS=1 for TP > 1 on A100s."""
    ds = presets.model("deepseek-v2-lite")
    c = uniform_cluster(2, 8, "A100-80GB", 240.0, 23.0)
    job = JobSpec(global_batch=32, seq_length=4096)
    plan = make_plan(ds, job, c, tp=2, pp=2, ep=4, layers=(12, 15), sequence_parallel=True,
                     distributed_optimizer=True)
    out = tmp_path / "set"
    emit("megatron", ds, job, c, plan, out)
    (tmp_path / "[0]").write_text("a file a glob would match")
    rec = run_launch_sh(out, "node01", tmp_path, extra=["--mock-data", "--lr", "1e-4"])
    argv = rec["argv"]
    toks = _args_file_tokens(out)
    i = argv.index("pretrain_gpt.py")
    assert argv[i + 1:] == toks + ["--mock-data", "--lr", "1e-4"]
    assert "([0]*1+[1]*26)" in argv and "--node_rank=1" in argv
    import os
    assert f"--master_addr={os.environ.get('MASTER_ADDR', 'node00')}" in argv
    assert rec["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    k = toks.index("--decoder-first-pipeline-num-layers")
    assert toks[k + 1] == "12"


def ns_of(folder):
    return parse_megatron(_args_file_tokens(folder))


def test_cuda_device_max_connections_rule(llama, tmp_path):
    """Set to 1 with TP or CP > 1 before Blackwell (Megatron-LM validate_args), not set on
    B200, unset for Megatron-FSDP (which requires it unset or > 1)."""
    job = JobSpec(global_batch=64, seq_length=4096)
    one = "export CUDA_DEVICE_MAX_CONNECTIONS=1"
    for gpu, kw, want in [("A100-80GB", dict(tp=8, pp=4), one),
                          ("H100-SXM-80GB", dict(tp=8, pp=4), one),
                          ("B200", dict(tp=8, pp=4), None),
                          ("A100-80GB", dict(tp=1, pp=4), None),
                          ("A100-80GB", dict(tp=8, pp=1, zero=3, recompute="full"),
                           "unset CUDA_DEVICE_MAX_CONNECTIONS")]:
        c = uniform_cluster(4, 8, gpu, 240.0, 23.0)
        plan = make_plan(llama, job, c, sequence_parallel=kw["tp"] > 1, **kw)
        out = tmp_path / f"{gpu}-{kw['tp']}-{kw.get('zero', 0)}"
        emit("megatron", llama, job, c, plan, out, force=True)
        script = (out / "launch.sh").read_text()
        if want:
            assert want in script, (gpu, kw)
        else:
            assert "CUDA_DEVICE_MAX_CONNECTIONS" not in script, (gpu, kw)


def test_megatron_builds_the_planned_architecture(llama, c32):
    job = JobSpec(global_batch=64, seq_length=4096)
    ns = parse_megatron(megatron_args(llama, job, make_plan(llama, job, c32, tp=8, pp=4))[0])
    assert ns.position_embedding_type == "rope" and ns.rotary_base == 10000
    assert ns.normalization == "RMSNorm" and ns.swiglu and not ns.add_bias_linear
    assert ns.hidden_dropout == 0 and ns.attention_dropout == 0
    assert ns.untie_embeddings_and_output_weights
    assert ns.tokenizer_type == "NullTokenizer" and ns.vocab_size == 32000
    # Megatron pads to a multiple of divisor x TP: the divisor keeps 32,000 as planned
    d, tp = ns.make_vocab_size_divisible_by, 8
    assert -(-32000 // (d * tp)) * d * tp == 32000
    l3 = presets.model("llama3-8b")
    a3 = parse_megatron(megatron_args(l3, job, make_plan(l3, job, c32, tp=4, pp=1))[0])
    assert a3.rotary_base == 500000 and a3.num_query_groups == 8
    gpt = presets.model("gpt-7.5b")
    ag = parse_megatron(megatron_args(gpt, job, make_plan(gpt, job, c32, tp=8, pp=1))[0])
    assert ag.position_embedding_type == "learned_absolute" and ag.normalization == "LayerNorm"
    assert ag.add_bias_linear and ag.hidden_dropout == 0.1 and not ag.swiglu
    assert not ag.untie_embeddings_and_output_weights
    hf = megatron_args(llama, job, make_plan(llama, job, c32, tp=8, pp=4),
                       tokenizer="meta-llama/Llama-2-70b-hf")[0]
    ah = parse_megatron(hf)
    assert ah.tokenizer_type == "HuggingFaceTokenizer"
    assert ah.tokenizer_model == "meta-llama/Llama-2-70b-hf"


def test_vocabulary_tp_does_not_divide_is_a_model_warning(c32):
    from dataclasses import replace
    m = replace(presets.model("gpt-1.7b"), vocab_size=50257)
    job = JobSpec(global_batch=64, seq_length=2048)
    args, warn = megatron_args(m, job, make_plan(m, job, c32, tp=2, pp=1))
    assert parse_megatron(args).make_vocab_size_divisible_by == 1
    assert any(w.startswith("megatron [model]") and "50258" in w for w in warn)


def test_tp_pp_dp_order_places_every_rank(llama, tmp_path, megatron_groups):
    """Two stages of one replica per node: not expressible in Megatron's default rank order,
    expressible with --use-tp-pp-dp-mapping; Megatron's group rule for that order
    (tp-cp-ep-pp-dp, tp fastest) puts every rank on the planned node and GPU. torchtitan has
    no such order and says so."""
    from launch.ranks import DEFAULT_ORDER, TP_PP_DP_ORDER
    groups = megatron_groups
    c = uniform_cluster(8, 8, "A100-80GB", 240.0, 23.0)
    job = JobSpec(global_batch=64, seq_length=4096)
    tp, pp, dp = 4, 4, 4
    pl = block_placement(c, tp, pp, dp, 2, node_order=[3, 1, 0, 2, 7, 5, 4, 6])
    plan = make_plan(llama, job, c, tp=tp, pp=pp, dp=dp, recompute="full",
                     sequence_parallel=True, distributed_optimizer=True, placement=pl)
    assert rank_mapping(c, plan)[0] is None
    mp, why = rank_mapping(c, plan, (DEFAULT_ORDER, TP_PP_DP_ORDER))
    assert mp is not None and mp.rank_order == TP_PP_DP_ORDER, why
    out = tmp_path / "m"
    emit("megatron", llama, job, c, plan, out)
    assert ns_of(out).use_tp_pp_dp_mapping
    doc = json.loads((out / "ranks.json").read_text())
    where = {r["rank"]: (c.nodes.index(next(nd for nd in c.nodes if nd.name == n["node"])),
                         r["gpu"]) for n in doc["nodes"] for r in n["ranks"]}
    sizes = {"tp": tp, "cp": 1, "ep": 1, "pp": pp, "dp": dp}
    world = tp * pp * dp
    coord = {}
    for dim in ("tp", "pp", "dp"):
        for g in groups(world, sizes, "tp-cp-ep-pp-dp", dim):
            for i, q in enumerate(g):
                coord.setdefault(q, {})[dim] = i
    for q, co in coord.items():
        s, r, t = co["pp"], co["dp"], co["tp"]
        assert where[q] == (pl.node[s][r], pl.gpus[s][r][t]), q
    with pytest.raises(SpecError, match="--force"):
        emit("torchtitan", llama, job, c, plan, tmp_path / "t")
    _f, warn = emit("torchtitan", llama, job, c, plan, tmp_path / "t", force=True)
    assert any(w.startswith("torchtitan [placement]") for w in warn)
    assert not (tmp_path / "t" / "launch.sh").exists()


def test_plan_that_does_not_fit_is_refused_unless_forced(tmp_path):
    """estimate --tp 1 --pp 1 --dp 64 --emit megatron for Llama-2 70B: one line, exit 2, no
    file; with --force every file says it does not fit."""
    from typer.testing import CliRunner
    from cli import app
    out = tmp_path / "l"
    r = CliRunner().invoke(app, ["estimate", "--tp", "1", "--pp", "1", "--dp", "64",
                                 "--emit", "megatron", "--out", str(out)])
    assert r.exit_code == 2
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "GiB" in lines[0] and "--force" in lines[0]
    assert not out.exists()
    # `emit PLANFILE` names the plan file (it had said "plan: ...")
    saved = tmp_path / "big.json"
    r = CliRunner().invoke(app, ["estimate", "--tp", "1", "--pp", "1", "--dp", "64",
                                 "--save-plan", str(saved)])
    r = CliRunner().invoke(app, ["emit", str(saved), "--out", str(out)])
    assert r.exit_code == 2 and r.output.startswith(f"error: {saved}: --emit: "), r.output
    for fw in FRAMEWORKS:
        o = tmp_path / fw
        r = CliRunner().invoke(app, ["estimate", "--tp", "1", "--pp", "1", "--dp", "64",
                                     "--emit", fw, "--out", str(o), "--force"])
        assert r.exit_code == 0, r.output
        for p in o.iterdir():
            if not p.name.startswith("."):
                assert "does not fit" in p.read_text(), (fw, p.name)


@pytest.mark.parametrize("fw,kind,plan_kw", [
    ("megatron", "schedule", dict(schedule="gpipe")),
    ("deepspeed", "schedule", dict(schedule="interleaved", chunks=2)),
    ("nemo", "split", dict(layers=(19, 21, 20, 20))),  # NeMo 1.x: first/last keys only
    ("deepspeed", "split", dict(layers=(19, 21, 20, 20))),
    ("torchtitan", "model", dict()),
])
def test_warnings_name_every_change(fw, kind, plan_kw, llama, c32, tmp_path):
    """A change of schedule, split or model is announced in warnings.txt under its kind."""
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=8, pp=4, recompute="full", sequence_parallel=True,
                     distributed_optimizer=True, **plan_kw)
    _files, warn = emit(fw, llama, job, c32, plan, tmp_path,
                        version="1" if fw == "nemo" and kind == "split" else None)
    text = (tmp_path / "warnings.txt").read_text()
    assert any(w.startswith(f"{fw} [{kind}]") for w in warn)
    assert f"{fw} [{kind}]" in text


def test_model_change_warned_for_alibi_and_embedding_norm(c32):
    bl = presets.model("bloom-176b")
    job = JobSpec(global_batch=64, seq_length=2048)
    args, warn = megatron_args(bl, job, make_plan(bl, job, c32, tp=8, pp=4))
    assert parse_megatron(args).position_embedding_type == "none"
    assert sum(w.startswith("megatron [model]") for w in warn) == 2


def test_output_folder_of_someone_else_is_refused(llama, c32, tmp_path):
    """An --out folder holding files the tool did not write is refused (nothing written)
    unless forced; the tool's own earlier files are replaced, stale ones removed, and a user's
    file beside them is never deleted."""
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=8, pp=4, recompute="full", sequence_parallel=True,
                     distributed_optimizer=True)
    out = tmp_path / "o"
    out.mkdir()
    (out / "launch.sh").write_text("my own script\n")
    with pytest.raises(SpecError, match="did not write"):
        emit("megatron", llama, job, c32, plan, out)
    assert (out / "launch.sh").read_text() == "my own script\n"
    assert sorted(p.name for p in out.iterdir()) == ["launch.sh"]
    fresh = tmp_path / "f"
    gp = make_plan(llama, job, c32, tp=8, pp=4, schedule="gpipe", recompute="full",
                   sequence_parallel=True, distributed_optimizer=True)
    emit("megatron", llama, job, c32, gp, fresh)
    assert (fresh / "warnings.txt").exists()
    emit("megatron", llama, job, c32, plan, fresh)  # no warning now: the stale file goes
    assert not (fresh / "warnings.txt").exists()
    (fresh / "notes.md").write_text("mine")
    emit("nemo", llama, job, c32, plan, fresh, force=True)
    assert (fresh / "notes.md").read_text() == "mine"
    assert not (fresh / "megatron_args.txt").exists() and (fresh / "bridge_recipe.py").exists()


def test_failed_write_leaves_the_previous_launch_set(llama, c32, tmp_path, monkeypatch):
    """A write that fails midway (disk full on the third file) changes nothing."""
    import os
    import formats.atomic as atomic
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=8, pp=4, recompute="full", sequence_parallel=True,
                     distributed_optimizer=True)
    out = tmp_path / "o"
    emit("megatron", llama, job, c32, plan, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = {"n": 0}
    real = atomic._write_temp

    def full_disk(path, data, mode):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, os.strerror(28))
        return real(path, data, mode)

    monkeypatch.setattr(atomic, "_write_temp", full_disk)
    plan2 = make_plan(llama, job, c32, tp=8, pp=4, schedule="gpipe", recompute="full",
                      sequence_parallel=True, distributed_optimizer=True)
    with pytest.raises(SpecError, match="nothing was changed"):
        emit("megatron", llama, job, c32, plan2, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_torchtitan_versions_and_flavors(tmp_path):
    """torchtitan 0.2 (current release) names each pipeline part's modules, 0.1 gives split
    points; a model with a torchtitan flavor gets [model] name/flavor (Llama-2 70B, with
    Llama-3 70B's layers but another vocabulary, does not); other versions are refused."""
    from launch.emit import torchtitan_config
    c = uniform_cluster(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    l70 = presets.model("llama3-70b")
    job = JobSpec(global_batch=128, seq_length=8192, framework="torchtitan")
    plan = make_plan(l70, job, c, tp=8, pp=4, zero=3, sequence_parallel=True,
                     recompute="full", layers=(19, 21, 21, 19))
    new, w_new = torchtitan_config(l70, job, c, plan, "0.2")
    old, _ = torchtitan_config(l70, job, c, plan, "0.1")
    assert new["model"] == {"name": "llama3", "flavor": "70B"} == old["model"]
    # the whole job config printed at start-up, for calibrate (v0.1: print_args)
    assert new["job"] == {"print_config": True} and old["job"] == {"print_args": True}
    # ZeRO-3 over one data-parallel rank: torchtitan applies no FSDP then; the set says so
    assert plan.shape.dp == 1 and any(w.startswith("torchtitan [sharding]") for w in w_new)
    assert "pipeline_parallel_split_points" not in new["parallelism"]
    assert old["parallelism"]["pipeline_parallel_split_points"] == [
        "layers.19", "layers.40", "layers.61"]
    assert [len(p) for p in new["parallelism"]["module_fqns_per_model_part"]] == [
        20, 21, 21, 21]
    l2 = presets.model("llama2-70b")
    cfg, warn = torchtitan_config(l2, job, c, make_plan(l2, job, c, tp=8, pp=4, zero=3,
                                                        sequence_parallel=True), "0.2")
    assert cfg["model"]["flavor"] == "llama2-70b"
    assert any(w.startswith("torchtitan [model]") and "no model flavor" in w for w in warn)
    with pytest.raises(SpecError, match="versions 0.2, 0.1"):
        emit("torchtitan", l70, job, c, plan, tmp_path / "x", version="0.3")
    with pytest.raises(SpecError, match="one version"):
        emit("megatron", l70, job, c, plan, tmp_path / "y", version="0.2")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_nemo_yaml_is_a_full_config(llama, c32, tmp_path):
    """NeMo 1.x: NeMo's megatron_gpt_config.yaml as the default (Hydra defaults list, found
    through $NEMO_DIR), the architecture keys, and uneven first/last stages as
    num_layers_in_first/last_pipeline_stage."""
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=8, pp=4, layers=(19, 21, 21, 19), recompute="full",
                     sequence_parallel=True, distributed_optimizer=True)
    _f, warn = emit("nemo", llama, job, c32, plan, tmp_path, tokenizer="meta-llama/Llama-2-70b-hf",
                    version="1")
    cfg = _mini_yaml((tmp_path / "nemo_config.yaml").read_text())
    assert cfg["defaults"] == ["megatron_gpt_config", "_self_"]
    m = cfg["model"]
    assert (m["normalization"], m["bias"], m["activation"], m["position_embedding_type"]) == (
        "rmsnorm", False, "fast-swiglu", "rope")
    assert m["rotary_base"] == 10000 and m["hidden_dropout"] == 0
    # Transformer Engine's layers and attention (FlashAttention or cuDNN's fused kernel, as
    # priced); without them NeMo's Megatron-Core model stores the scores
    assert m["transformer_engine"] is True and "attention_backend" not in m
    eager = JobSpec(global_batch=64, seq_length=4096, attention="eager")
    emit("nemo", llama, eager, c32, make_plan(llama, eager, c32, tp=8, pp=4, recompute="full"),
         tmp_path / "eager", version="1", force=True)
    me = _mini_yaml((tmp_path / "eager" / "nemo_config.yaml").read_text())["model"]
    assert me["transformer_engine"] is True and me["attention_backend"] == "unfused"
    assert (m["num_layers_in_first_pipeline_stage"], m["num_layers_in_last_pipeline_stage"]) == (
        19, 19)
    assert m["tokenizer"]["library"] == "huggingface"
    assert warn == []
    script = (tmp_path / "launch.sh").read_text()
    assert 'NEMO_DIR:?' in script and "hydra.searchpath=" in script
    # MegatronGPTModel then logs the peak reserved memory to the bar (calibrate reads it)
    assert "export NEMO_LOG_MEMORY_USAGE=1" in script
    mid = make_plan(llama, job, c32, tp=8, pp=4, layers=(19, 21, 20, 20), recompute="full",
                    sequence_parallel=True, distributed_optimizer=True)
    _f, warn = emit("nemo", llama, job, c32, mid, tmp_path / "mid", version="1")
    assert any(w.startswith("nemo [split]") for w in warn)
    assert any(w.startswith("nemo [model]") and "tokenizer" in w for w in warn)
    # the overlaps are written either way: NeMo's distributed Adam takes apex's defaults
    # (both on), which had run a plan priced without them
    assert m["optim"]["overlap_grad_sync"] is False and m["optim"]["overlap_param_sync"] is False
    # what NeMo 1.x's FSDP refuses at start-up (or turns off) is refused, naming NeMo's line
    from launch.emit import nemo_config
    fsdp = dict(tp=8, pp=1, zero=3, recompute="full", sequence_parallel=True)
    for extra, says, field in (
            (dict(shard_size=2), "nlp_overrides.py:814", "shard_size"),
            (dict(pp=4, dp=1, tp=8), "nlp_overrides.py:867", "pp"),
            (dict(tp_comm_overlap=True), "megatron_base_model.py:1081", "tp_comm_overlap")):
        plan = make_plan(llama, job, c32, **{**fsdp, **extra})
        with pytest.raises(SpecError) as e:
            nemo_config(llama, job, c32, plan)
        assert says in str(e.value) and e.value.field == field, extra
    assert "drop --shard-size" in str(pytest.raises(SpecError, nemo_config, llama, job, c32,
                                                    make_plan(llama, job, c32, **fsdp,
                                                              shard_size=2)).value)
    f8 = JobSpec(global_batch=64, seq_length=4096, fp8=True)
    h32 = uniform_cluster(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    with pytest.raises(SpecError, match="megatron_base_model.py:1090"):
        nemo_config(llama, f8, h32, make_plan(llama, f8, h32, **fsdp))
    nemo_config(llama, job, c32, make_plan(llama, job, c32, **fsdp))  # plain FSDP runs


def test_bridge_recipe_builds_the_plan(llama, c32, tmp_path, monkeypatch):
    """Megatron-Bridge recipes: any split (first/last counts or the layout string, interleaved
    or not), the pipeline-before-data rank order, Megatron-FSDP with its checkpoint format, FP8,
    latent attention and experts, a Hugging Face tokenizer; nothing to warn about for Llama."""
    from model.plan import block_placement
    job = JobSpec(global_batch=64, seq_length=4096)
    kw = dict(recompute="full", sequence_parallel=True, distributed_optimizer=True)
    for k, layers in enumerate([(19, 21, 21, 19), (19, 21, 20, 20), (9, 11, 11, 9, 9, 11, 11, 9),
                                (9, 11, 10, 10, 10, 10, 11, 9)]):
        chunks = len(layers) // 4
        plan = make_plan(llama, job, c32, tp=8, pp=4, layers=layers, chunks=chunks,
                         schedule="interleaved" if chunks > 1 else "1f1b", **kw)
        _f, warn = emit("nemo", llama, job, c32, plan, tmp_path / f"s{k}")
        m = run_bridge_recipe(tmp_path / f"s{k}" / "bridge_recipe.py", monkeypatch).model
        assert bridge_layers(m) == list(layers) and warn == []
        assert (m.virtual_pipeline_model_parallel_size or 1) == chunks
        assert m.recompute_granularity == "full" and m.recompute_num_layers == 1
        assert m.cross_entropy_loss_fusion is False  # the loss the memory model counts
    # a job that fuses its loss (JobSpec.fused_loss: the native implementation) says so to
    # every Megatron-Core emitter; other frameworks have no such loss
    fj = JobSpec(global_batch=64, seq_length=4096, fused_loss=True)
    fplan = make_plan(llama, fj, c32, tp=8, pp=4, **kw)
    emit("nemo", llama, fj, c32, fplan, tmp_path / "f")
    m = run_bridge_recipe(tmp_path / "f" / "bridge_recipe.py", monkeypatch).model
    assert m.cross_entropy_loss_fusion is True and m.cross_entropy_fusion_impl == "native"
    assert "--cross-entropy-loss-fusion" in megatron_args(llama, fj, fplan)[0]
    assert "--cross-entropy-loss-fusion" not in megatron_args(llama, job, fplan)[0]
    assert nemo_config(llama, fj, c32, fplan)[0]["model"]["cross_entropy_loss_fusion"] is True
    with pytest.raises(SpecError) as e:
        JobSpec(global_batch=64, seq_length=4096, framework="torchtitan", fused_loss=True)
    assert e.value.field == "fused_loss"
    paired = make_plan(llama, job, c32, tp=4, pp=4, dp=2, placement=block_placement(
        c32, 4, 4, 2, 2), **kw)
    emit("nemo", llama, job, c32, paired, tmp_path / "p", tokenizer="meta-llama/Llama-2-70b-hf")
    cfg = run_bridge_recipe(tmp_path / "p" / "bridge_recipe.py", monkeypatch)
    assert cfg.dist.use_tp_pp_dp_mapping is True
    assert json.loads((tmp_path / "p" / "ranks.json").read_text())["framework_order"] == (
        "tp-cp-ep-pp-dp")
    assert (cfg.tokenizer.tokenizer_type, cfg.tokenizer.tokenizer_model) == (
        "HuggingFaceTokenizer", "meta-llama/Llama-2-70b-hf")
    fsdp = make_plan(llama, job, c32, tp=8, pp=1, recompute="full", sequence_parallel=True,
                     zero=3)
    emit("nemo", llama, job, c32, fsdp, tmp_path / "f", force=True)
    cfg = run_bridge_recipe(tmp_path / "f" / "bridge_recipe.py", monkeypatch)
    assert cfg.ddp.use_megatron_fsdp and cfg.dist.use_megatron_fsdp
    assert cfg.ddp.data_parallel_sharding_strategy == "optim_grads_params"
    assert (cfg.ddp.megatron_fsdp_main_grads_dtype, cfg.ddp.megatron_fsdp_grad_comm_dtype) == (
        "float32", "float32")
    assert cfg.checkpoint.ckpt_format == "fsdp_dtensor"
    assert cfg.model.gradient_accumulation_fusion is False
    h100 = uniform_cluster(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    j8 = JobSpec(global_batch=64, seq_length=4096, fp8=True)
    p8 = make_plan(llama, j8, h100, tp=8, pp=4, tp_comm_overlap=True, **kw)
    emit("nemo", llama, j8, h100, p8, tmp_path / "8", force=True)
    cfg = run_bridge_recipe(tmp_path / "8" / "bridge_recipe.py", monkeypatch)
    assert cfg.mixed_precision.preset == "bf16_with_fp8_delayed_scaling_mixed"
    assert cfg.mixed_precision.fp8_param_gather is False and cfg.comm_overlap.tp_comm_overlap
    ds = presets.model("deepseek-v2-lite")
    pds = make_plan(ds, job, c32, tp=1, pp=2, ep=8, recompute="selective",
                    distributed_optimizer=True)
    emit("nemo", ds, job, c32, pds, tmp_path / "d", force=True)
    m = run_bridge_recipe(tmp_path / "d" / "bridge_recipe.py", monkeypatch).model
    assert m.multi_latent_attention is True and m.kv_lora_rank == ds.mla_kv_lora_rank
    assert m.qk_layernorm is True  # the latent norms
    assert (m.num_moe_experts, m.expert_model_parallel_size) == (ds.num_experts, 8)
    assert m.moe_layer_freq == [0] * ds.first_dense_layers + [1] * ds.moe_layers
    bl = presets.model("bloom-176b")
    jb = JobSpec(global_batch=64, seq_length=2048, precision="fp32")
    _f, warn = emit("nemo", bl, jb, c32, make_plan(bl, jb, c32, tp=8, pp=4, **kw),
                    tmp_path / "b", force=True)
    cfg = run_bridge_recipe(tmp_path / "b" / "bridge_recipe.py", monkeypatch)
    assert cfg.mixed_precision is None and cfg.model.position_embedding_type == "none"
    assert sum(w.startswith("nemo [model]") for w in warn) == 2


def test_torchtitan_compile_switch_is_emitted(tmp_path):
    """The job's torch.compile choice reaches torchtitan's config in each release's key
    (0.1: training.compile; 0.2: [compile] enable); an uncompiled async-TP plan is refused
    (torchtitan raises at start-up: it had been priced, emitted and warned); v0.2's sequence
    rule TP x 2 CP holds without CP too."""
    from launch.emit import torchtitan_config
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 360.0, 50.0)
    l8 = presets.model("llama3-8b")
    for comp in (True, False):
        job = JobSpec(global_batch=64, seq_length=8192, framework="torchtitan", compile=comp)
        plan = make_plan(l8, job, c, tp=2, pp=1, zero=3, sequence_parallel=True)
        new, w_new = torchtitan_config(l8, job, c, plan, "0.2")
        old, _ = torchtitan_config(l8, job, c, plan, "0.1")
        assert new["compile"]["enable"] is comp and old["training"]["compile"] is comp
        if comp:
            make_plan(l8, job, c, tp=2, pp=1, zero=3, sequence_parallel=True,
                      tp_comm_overlap=True)
            continue
        with pytest.raises(SpecError) as e:
            make_plan(l8, job, c, tp=2, pp=1, zero=3, sequence_parallel=True,
                      tp_comm_overlap=True)
        assert e.value.field == "tp_comm_overlap"
    # a ZeRO-1 plan with DP 1 and CP 4: torchtitan still applies FSDP (over the CP ranks),
    # which had gone unsaid where DP was 1
    mj = JobSpec(global_batch=64, seq_length=8192)
    p1 = make_plan(l8, mj, c, tp=4, pp=1, cp=4, zero=1, sequence_parallel=True)
    _cfg, w = torchtitan_config(l8, mj, c, p1, "0.2")
    assert any("becomes FSDP" in x and "context-parallel ranks" in x for x in w), w
    job = JobSpec(global_batch=64, seq_length=4100, framework="torchtitan")
    with pytest.raises(SpecError) as e:  # priced for v0.2.2: refused with the plan itself
        make_plan(l8, job, c, tp=4, pp=1, zero=3, sequence_parallel=True)
    assert e.value.field == "seq_length" and "TP x 2 CP = 8" in str(e.value)
    # priced repeating K and V (v0.1, or v0.2.0/1): the emit checks the release it writes for
    rep = JobSpec(global_batch=64, seq_length=4100, framework="torchtitan", repeat_kv=True)
    plan = make_plan(l8, rep, c, tp=4, pp=1, zero=3, sequence_parallel=True)
    with pytest.raises(SpecError) as e:
        torchtitan_config(l8, rep, c, plan, "0.2")
    assert e.value.field == "seq_length" and "TP x 2 CP = 8" in str(e.value)
    torchtitan_config(l8, rep, c, plan, "0.1")  # v0.1.0 has no such check


def test_torchtitan_compiles_the_loss_the_estimate_counted():
    """The loss's torch.compile (its memory differs: model/memory.py LOSS_BYTES_PER_LOGIT)
    follows the job: v0.2's [compile] components list it or not; v0.1 compiles it exactly with
    the model, so a plan that counted otherwise is warned."""
    from launch.emit import torchtitan_config
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 360.0, 50.0)
    l8 = presets.model("llama3-8b")
    for comp, comp_loss, comps in ((True, None, ["model", "loss"]), (True, False, ["model"]),
                                   (False, True, ["loss"]), (False, None, None)):
        job = JobSpec(global_batch=64, seq_length=8192, framework="torchtitan", compile=comp,
                      compile_loss=comp_loss)
        plan = make_plan(l8, job, c, tp=1, pp=1, zero=3)
        new, _w = torchtitan_config(l8, job, c, plan, "0.2")
        _old, w_old = torchtitan_config(l8, job, c, plan, "0.1")
        assert new["compile"]["enable"] is (comps is not None)
        if comps is not None:
            assert new["compile"]["components"] == comps
        assert any(w.startswith("torchtitan [memory]") for w in w_old) is (
            job.loss_compiled != comp)


def test_frameworks_that_split_evenly_say_what_their_split_costs(tmp_path):
    """DeepSpeed and NeMo 1.x run their own even split where the plan's cannot be given: on
    A100 40 GB / 80 GB nodes the plan 14/26/14/26 fits, an even 20 per stage overflows the
    40 GB stage: a [memory] warning; where the even split fits, the [split] warning gives its
    time by the cost model."""
    from launch.emit import even_split_warnings
    from model.cluster import ClusterSpec, NodeSpec
    import numpy as np
    m = presets.model("llama2-70b")
    job = JobSpec(global_batch=32, seq_length=4096)
    nodes = tuple(NodeSpec(f"a{i}", presets.gpu(g), 8, 240.0) for i, g in
                  enumerate(("A100-40GB", "A100-80GB", "A100-40GB", "A100-80GB")))
    c = ClusterSpec("mixa", nodes, np.full((4, 4), 20.0) - np.diag([20.0] * 4))
    plan = make_plan(m, job, c, tp=8, pp=4, dp=1, recompute="full", sequence_parallel=True,
                     layers=(14, 26, 14, 26))
    for fw, version in (("deepspeed", None), ("nemo", "1")):
        _files, warn = emit(fw, m, job, c, plan, tmp_path / fw, version=version)
        mem = [w for w in warn if w.startswith(f"{fw} [memory]")]
        assert len(mem) == 1 and "stage 0 may then need" in mem[0] and "> 40 GiB" in mem[0]
    big = uniform_cluster(4, 8, "A100-80GB", 240.0, 20.0)
    plan = make_plan(m, job, big, tp=8, pp=4, dp=1, recompute="full", sequence_parallel=True,
                     layers=(19, 21, 21, 19))
    (w,) = even_split_warnings("deepspeed", m, job, big, plan)
    assert w.startswith("deepspeed [split]") and "(20/20/20/20 layers per stage, " \
        "partition_method 'type:transformer')" in w


def test_deepspeed_emit_names_the_partition_method_that_gives_the_plans_split(tmp_path):
    """A DeepSpeed plan whose split a partition method gives (model.plan.deepspeed_split) is
    emitted with that method named and no even-split warning; one whose split none gives is
    warned about. BLOOM-like: 70 tied layers over 4 stages, 'type:transformer' 18/18/17/17,
    'type:transformer|embedding' 17/18/18/17."""
    m = presets.model("bloom-176b")
    job = JobSpec(global_batch=32, seq_length=2048, framework="deepspeed")
    c = uniform_cluster(4, 8, "A100-80GB", 240.0, 20.0)
    for lay, method in (((18, 18, 17, 17), "'type:transformer')"),
                        ((17, 18, 18, 17), "'type:transformer|embedding')")):
        plan = make_plan(m, job, c, tp=8, pp=4, dp=1, recompute="full", zero=1,
                         sequence_parallel=True, layers=lay)
        _files, warn = emit("deepspeed", m, job, c, plan, tmp_path / method[2:8], force=True)
        split = [w for w in warn if w.startswith("deepspeed [split]")]
        assert len(split) == 1 and f"partition_method={method}" in split[0], split
        assert ("--pp-partition-method" in split[0]) == ("embedding" in method)
        assert not [w for w in warn if "even split" in w or "splits the layers evenly" in w]
    plan = make_plan(m, job, c, tp=8, pp=4, dp=1, recompute="full", sequence_parallel=True,
                     layers=(16, 18, 18, 18), zero=1)
    _files, warn = emit("deepspeed", m, job, c, plan, tmp_path / "other", force=True)
    split = [w for w in warn if w.startswith("deepspeed [split]")]
    assert any("cannot be given to PipelineModule" in w for w in split)
    assert any("18/18/17/17 layers per stage" in w for w in warn), warn


def test_deepspeed_config_runs_what_the_estimate_priced(tmp_path):
    """The DeepSpeed emit asks for what the cost model prices: bf16 with ZeRO-1 accumulates
    in fp32 (data_types; DeepSpeed's default had been bf16, with its plain ZeRO optimizer),
    bf16 without ZeRO is refused (plan.deepspeed_problem); under sequence parallelism (and
    for MoE) the pipeline engine's partitioning of passed tensors is off, each rank sending its
    sequence shard as priced; sequence parallelism exports CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-DeepSpeed
    raises without it)."""
    m = presets.model("llama2-7b")
    job = JobSpec(global_batch=64, seq_length=2048, framework="deepspeed")
    c = uniform_cluster(4, 8, "A100-80GB", 240.0, 20.0)
    plan = make_plan(m, job, c, tp=2, pp=4, dp=4, zero=1, sequence_parallel=True)
    files, warn = emit("deepspeed", m, job, c, plan, tmp_path / "z1")
    cfg = json.loads((tmp_path / "z1" / "ds_config.json").read_text())
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"}
    assert cfg["pipeline"] == {"pipe_partitioned": False, "grad_partitioned": False}
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in (tmp_path / "z1" / "launch.sh").read_text()
    # dense, TP without sequence parallelism: DeepSpeed's default partitioned transfers stay
    plan = make_plan(m, job, c, tp=2, pp=4, dp=4, zero=1)
    emit("deepspeed", m, job, c, plan, tmp_path / "tp")
    assert "pipeline" not in json.loads((tmp_path / "tp" / "ds_config.json").read_text())
    fp16 = dataclasses.replace(job, precision="fp16")
    plan = make_plan(m, fp16, c, tp=1, pp=4, dp=8, zero=0)
    files, warn = emit("deepspeed", m, fp16, c, plan, tmp_path / "z0")
    cfg = json.loads((tmp_path / "z0" / "ds_config.json").read_text())
    assert "data_types" not in cfg and "pipeline" not in cfg and cfg["fp16"]["enabled"]
    assert not any(w.startswith("deepspeed [precision]") for w in warn), warn
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in (tmp_path / "z0" / "launch.sh").read_text()
    # an untied Llama's 'type:transformer|embedding' split: not a flag of any fork
    lay = (6, 7, 7, 6, 6)
    from model.plan import deepspeed_split
    assert deepspeed_split(32, 5, "type:transformer|embedding", False) == lay
    c = uniform_cluster(5, 8, "A100-80GB", 240.0, 20.0)
    plan = make_plan(m, job, c, tp=1, pp=5, dp=8, zero=1, layers=lay)
    _f, warn = emit("deepspeed", m, job, c, plan, tmp_path / "emb")
    (split,) = [w for w in warn if w.startswith("deepspeed [split]")]
    assert "your own PipelineModule" in split and "cannot build this model" in split


def test_block_launchable_follows_the_rank_orders():
    """A node's block is launchable when its ranks are consecutive in a rank order the
    framework has: TP 1, PP 4, DP 8 on 8-GPU nodes: one stage x 8 replicas (default order),
    4 stages x 2 replicas (tp-pp-dp), never 2 stages x 4 replicas; with expert parallelism
    only the default order counts."""
    from launch.ranks import ORDERS
    from model.plan import Shape
    from solvers.space import Block, block_launchable
    sh = Shape(tp=1, pp=4, dp=8, micro_batch=1)
    one, four, two = Block(1, 8, 4, 1), Block(4, 2, 1, 4), Block(2, 4, 2, 2)
    for fw, want in (("megatron", (True, True, False)), ("nemo", (True, True, False)),
                     ("torchtitan", (True, False, False)), ("deepspeed", (True, False, False))):
        assert tuple(block_launchable(sh, b, ORDERS[fw]) for b in (one, four, two)) == want
    moe = dataclasses.replace(sh, ep=2)
    assert not block_launchable(moe, four, ORDERS["megatron"])
    # with context parallelism the columns are replica x CP + cp_rank: a replica's 2 CP ranks
    # of 4 stages fill one node in the tp-pp-dp order
    cp = Shape(tp=1, pp=4, dp=4, cp=2, micro_batch=1)
    assert block_launchable(cp, Block(4, 2, 1, 4), ORDERS["megatron"])
    assert not block_launchable(cp, Block(4, 2, 1, 4), ORDERS["torchtitan"])


@pytest.mark.parametrize("fw", ["megatron", "deepspeed"])
def test_solve_for_an_emit_returns_a_plan_its_launch_can_start(fw, tmp_path):
    """solve --emit X places only what X's torchrun launch can start (it had returned 2
    stages x 4 replicas per node, which no rank order puts in one node's block, and written no
    launch.sh): on the same cluster, unrestricted, the search picks such a layout."""
    from typer.testing import CliRunner
    from cli import app
    from formats.clusters import SynthParams, cluster_to_toml, synth_cluster
    c = synth_cluster(SynthParams(num_nodes=4, gpus_per_node=8, nic_gb_per_s=3.0,
                                  leaf_size=2, oversubscription=8, degraded=0, seed=13))
    (tmp_path / "c.toml").write_text(cluster_to_toml(c))
    args = ["solve", "-m", "gpt-1.7b", "-c", str(tmp_path / "c.toml"), "--gbs", "1024",
            "--seq", "8192", "--tp", "1", "--pp", "4", "--time-limit", "8", "--clock", "work",
            "--framework", fw, "--json"]
    free = json.loads(CliRunner().invoke(app, args).output)
    nodes = {}
    for row in free["plan"]["placement"]:
        nodes.setdefault(row["node"], set()).add((row["stage"], row["replica"]))
    assert any(len({s for s, _ in v}) == 2 for v in nodes.values())  # 2 stages x 4 replicas
    # the framework's name in any case, as --emit takes it elsewhere (it had raised KeyError)
    r = CliRunner().invoke(app, [*args, "--emit", fw.capitalize(), "--out", str(tmp_path / fw)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert (tmp_path / fw / "launch.sh").exists(), d["warnings"]
    assert any(w.startswith("placements limited to what torchrun can start")
               for w in d["warnings"])
    assert d["solver"]["bound_ms"] <= d["solver"]["objective_ms"]


def test_launch_sh_survives_a_folder_with_a_space_and_finds_a_full_host_name(tmp_path):
    """launch.sh's command stays one word per token in a folder with a space (torchtitan's
    --job.config_file had been split in two), and a node named with its domain is found by
    `hostname` when `hostname -s` gives the short name (it had said the host is not in the
    plan)."""
    import os
    import stat
    import subprocess
    from model.plan import megatron_placement
    m = presets.model("llama3-8b")
    nodes = tuple(NodeSpec(f"gpu{i}.cluster.local", presets.gpu("H100-SXM-80GB"), 8, 400.0)
                  for i in range(2))
    c = ClusterSpec("fqdn", nodes, np.full((2, 2), 50.0) - np.diag([50.0, 50.0]))
    job = JobSpec(global_batch=16, seq_length=4096, framework="torchtitan")
    plan = make_plan(m, job, c, tp=8, pp=1, dp=2, zero=3,
                     placement=megatron_placement(c, 8, 1, 2))
    out = tmp_path / "with space" / "tt"
    emit("torchtitan", m, job, c, plan, out, force=True)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "torchrun").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$REC"\n')
    (bin_ / "hostname").write_text('#!/usr/bin/env bash\n'
                                   '[ "${1:-}" = -s ] && echo gpu1 || echo gpu1.cluster.local\n')
    for f in ("torchrun", "hostname"):
        (bin_ / f).chmod((bin_ / f).stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "REC": str(tmp_path / "rec")}
    env.pop("NODE_NAME", None)
    subprocess.run(["bash", str(out / "launch.sh")], env=env, check=True)
    words = (tmp_path / "rec").read_text().splitlines()
    assert words[words.index("--job.config_file") + 1] == str(out / "torchtitan.toml")
    assert "--node_rank=1" in words


def test_deepspeed_emit_of_an_interleaved_plan_judges_its_own_split(tmp_path):
    """An interleaved plan with an uneven split emitted for DeepSpeed: its pipeline engine
    runs one chunk per stage, so its even split is judged under 1F1B (the split had been given
    PP entries for PP x chunks virtual stages, and emit and solve --emit deepspeed had stopped
    with 'layers has 3 entries')."""
    m = presets.model("llama2-7b")
    c = uniform_cluster(3, 4, "H100-SXM-80GB", 360.0, 25.0)
    job = JobSpec(global_batch=24, seq_length=4096)
    plan = make_plan(m, job, c, tp=1, pp=3, schedule="interleaved", chunks=2,
                     layers=(5, 5, 5, 6, 6, 5), placement=megatron_placement(c, 1, 3, 4))
    _files, warn = emit("deepspeed", m, job, c, plan, tmp_path / "ds", force=True)
    assert (tmp_path / "ds" / "ds_config.json").exists()
    assert any("[schedule]" in w for w in warn)
    assert any("[split]" in w and "11/11/10 layers per stage" in w for w in warn), warn


def test_nemo1_gets_the_overlapped_pipeline_sends_the_plan_was_priced_with():
    """NeMo 1.x: an interleaved plan priced with overlapped pipeline sends sets
    overlap_p2p_comm (megatron_gpt_config.yaml leaves it off; the key had been left out, so
    the run would block where the plan had priced overlap); blocking plans keep NeMo's
    default, and 1F1B priced overlapped is warned."""
    from model.specs import Options
    m = presets.model("llama2-13b")
    c = uniform_cluster(3, 8, "H100-SXM-80GB", 360.0, 25.0)
    job = JobSpec(global_batch=48, seq_length=4096)
    inter = make_plan(m, job, c, tp=2, pp=3, schedule="interleaved", chunks=2,
                      sequence_parallel=True)
    cfg, _w = nemo_config(m, job, c, inter, blocking_p2p=False)
    assert cfg["model"]["overlap_p2p_comm"] is True
    assert "overlap_p2p_comm" not in nemo_config(m, job, c, inter)[0]["model"]
    plain = make_plan(m, job, c, tp=2, pp=3, sequence_parallel=True)
    cfg, w = nemo_config(m, job, c, plain, blocking_p2p=False)
    assert "overlap_p2p_comm" not in cfg["model"] and any("[schedule]" in x for x in w)
    assert Options().blocking_p2p  # the default priced: blocking, NeMo's default


@pytest.mark.parametrize("fw", ["torchtitan", "deepspeed"])
def test_a_tokenizer_their_files_cannot_carry_is_said(tmp_path, fw):
    """--tokenizer with torchtitan or DeepSpeed, whose emitted files have no tokenizer key: a
    warning on the terminal and in warnings.txt (it had been written nowhere without a word)."""
    from typer.testing import CliRunner
    from cli import app
    plan = tmp_path / "p.json"
    r = CliRunner().invoke(app, ["estimate", "-m", "gpt-1.7b", "--gbs", "64", "--seq", "1024",
                                 "--tp", "1", "--pp", "1", "--save-plan", str(plan)])
    assert r.exit_code == 0, r.output
    out = tmp_path / fw
    r = CliRunner().invoke(app, ["emit", str(plan), "--framework", fw, "--tokenizer",
                                 "my/tok", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    said = [w for w in json.loads(r.output)["warnings"] if "--tokenizer 'my/tok'" in w]
    assert said and said[0].startswith(f"{fw} [model]: ") and "no tokenizer key" in said[0]
    assert "--tokenizer 'my/tok' is not written" in (out / "warnings.txt").read_text()


def test_a_placement_torchrun_cannot_start_is_refused_unless_forced(tmp_path):
    """One pipeline replica per node (what Megatron-LM's tp-pp-dp order starts) emitted for
    torchtitan, whose mesh keeps PP outermost: no torchrun node ranks give it, so the set
    without launch.sh and hostfile is refused naming --force (it had been written with exit
    0, a warning in warnings.txt); with --force it is written and says so; Megatron-LM takes
    the same plan with its launcher."""
    m = presets.model("llama3-8b")
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096, framework="torchtitan")
    p = make_plan(m, job, c, tp=4, pp=2, zero=3)
    p = dataclasses.replace(p, placement=dataclasses.replace(
        p.placement, node=((0, 1), (0, 1)),
        gpus=(((0, 1, 2, 3), (0, 1, 2, 3)), ((4, 5, 6, 7), (4, 5, 6, 7)))))
    with pytest.raises(SpecError) as e:
        emit("torchtitan", m, job, c, p, tmp_path / "tt")
    assert e.value.field == "--emit" and "--force" in str(e.value)
    assert not (tmp_path / "tt").exists()
    files, warns = emit("torchtitan", m, job, c, p, tmp_path / "tt", force=True)
    names = {f.name for f in files}
    assert "launch.sh" not in names and "warnings.txt" in names
    assert any("cannot be expressed with torchrun" in w for w in warns)
    mj = dataclasses.replace(job, framework="megatron")
    mp = make_plan(m, mj, c, tp=4, pp=2, zero=1)
    mp = dataclasses.replace(mp, placement=p.placement)
    files, _ = emit("megatron", m, mj, c, mp, tmp_path / "mg")
    assert "launch.sh" in {f.name for f in files}


def test_deepspeed_context_parallel_warning_says_the_batch_breaks(tmp_path):
    """DeepSpeed has no ring context parallelism: its engine would count the CP ranks as
    data-parallel ranks and refuse the batch triple written; the warning says so with the
    numbers, not only that CP cannot be expressed."""
    m = presets.model("llama3-8b")
    h100 = uniform_cluster(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=32768)
    plan = make_plan(m, job, h100, tp=2, pp=1, cp=2, sequence_parallel=True, zero=1)
    cfg, warn = deepspeed_config(m, job, h100, plan)
    dp = cfg["train_batch_size"] // (cfg["train_micro_batch_size_per_gpu"]
                                     * cfg["gradient_accumulation_steps"])
    assert dp == plan.shape.dp == 8
    line = next(w for w in warn if "context parallelism (CP=2)" in w)
    assert "train_batch_size 64 must equal micro-batch x accumulation x 16" in line


def test_torchtitan_flavor_rotary_settings_it_does_not_take_are_said():
    """A torchtitan flavor fixes the rotary embedding (llama3: base 500000 over the whole
    head); a model of the flavor's dimensions that sets another base or fraction is said, not
    trained with the flavor's without a word (the presets match their flavors)."""
    from launch.emit import torchtitan_config
    l8 = presets.model("llama3-8b")
    c = uniform_cluster(1, 8, "H100-SXM-80GB", 360.0, 50.0)
    job = JobSpec(global_batch=8, seq_length=4096, framework="torchtitan")
    plan = make_plan(l8, job, c, tp=1, pp=1, zero=3)
    assert not any("rotates every head" in w for w in torchtitan_config(l8, job, c, plan)[1])
    other = dataclasses.replace(l8, rope_base=10000.0, rotary_percent=0.5)
    warn = torchtitan_config(other, job, c, make_plan(other, job, c, tp=1, pp=1, zero=3))[1]
    assert any("[model]" in w and "base 500000" in w and "0.5 of each head" in w
               for w in warn), warn
