"""Launch files: Megatron arguments parse with Megatron-LM's flag names and types, NeMo YAML,
torchtitan TOML and DeepSpeed JSON parse, and the rank mapping, fed through Megatron's group
rule, puts every (stage, replica, tensor rank) where the plan placed it."""

import argparse
import json
import random
import tomllib

import numpy as np
import pytest

from launch.emit import FRAMEWORKS, emit, megatron_args, pipeline_layout
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
              "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap"):
        p.add_argument(f, action="store_true")
    p.add_argument("--use-megatron-fsdp", action="store_true")
    p.add_argument("--data-parallel-sharding-strategy", default="no_shard",
                   choices=["no_shard", "optim", "optim_grads", "optim_grads_params"])
    p.add_argument("--no-gradient-accumulation-fusion", action="store_false",
                   dest="gradient_accumulation_fusion")
    p.add_argument("--ckpt-format", default="torch_dist",
                   choices=["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"])
    p.add_argument("--attention-backend", default="auto",
                   choices=["flash", "fused", "unfused", "local", "auto"])
    p.add_argument("--fp8-format", default=None, choices=["e4m3", "hybrid"])
    p.add_argument("--fp8-amax-history-len", type=int, default=1)
    p.add_argument("--fp8-amax-compute-algo", default="most_recent",
                   choices=["most_recent", "max"])
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


def test_megatron_uneven_middle_warns(llama, c32):
    job = JobSpec(global_batch=64, seq_length=4096, precision="fp32")
    plan = make_plan(llama, job, c32, tp=8, pp=4, layers=(20, 21, 19, 20))
    args, warn = megatron_args(llama, job, plan)
    ns = parse_megatron(args)
    assert ns.decoder_first_pipeline_num_layers is None and not ns.bf16 and not ns.fp16
    assert len(warn) == 1 and "pipeline-model-parallel-layout" in warn[0]
    layout = pipeline_layout(plan.shape)
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
    bad = make_plan(llama, job, c32, tp=8, pp=4, schedule="interleaved", chunks=2,
                    layers=(9, 11, 11, 9, 10, 10, 10, 10))
    assert megatron_args(llama, job, bad)[1]


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


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_emit_files_parse(fw, llama, c32, tmp_path):
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=8, pp=4, schedule="interleaved", chunks=2,
                     recompute="selective", sequence_parallel=True,
                     distributed_optimizer=True)
    files, warn = emit(fw, llama, job, c32, plan, tmp_path)
    names = {p.name for p in files}
    assert {"launch.sh", "hostfile", "ranks.json"} <= names
    assert all(p.exists() and p.stat().st_size > 0 for p in files)
    if fw == "megatron":
        toks = [t for line in (tmp_path / "megatron_args.txt").read_text().splitlines()
                if not line.startswith("#") for t in line.split()]
        ns = parse_megatron(toks)
        assert ns.tensor_model_parallel_size == 8 and ns.num_layers_per_virtual_pipeline_stage
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
        assert len(par["pipeline_parallel_split_points"]) == 7
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


def test_emit_reports_inexpressible_placement(llama, c32, tmp_path):
    job = JobSpec(global_batch=64, seq_length=4096)
    pl = block_placement(c32, 2, 2, 8, 2, slots=[(0, b) for b in range(4)])
    plan = make_plan(llama, job, c32, tp=2, pp=2, dp=8, placement=pl)
    files, warn = emit("megatron", llama, job, c32, plan, tmp_path)
    assert not (tmp_path / "launch.sh").exists()
    assert any("cannot be expressed" in w for w in warn)


@pytest.mark.parametrize("zero,strategy", [(2, "optim_grads"), (3, "optim_grads_params")])
def test_megatron_fsdp_flags_parse(llama, c32, zero, strategy):
    """ZeRO-2/3 plans run on Megatron-FSDP, with the distributed optimizer it requires."""
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(llama, job, c32, tp=8, pp=1, sequence_parallel=True, zero=zero)
    a = parse_megatron(megatron_args(llama, job, plan)[0])
    assert a.use_megatron_fsdp and a.data_parallel_sharding_strategy == strategy
    assert a.use_distributed_optimizer and not a.gradient_accumulation_fusion
    assert a.ckpt_format == "fsdp_dtensor"
    plan1 = make_plan(llama, job, c32, tp=8, pp=2, sequence_parallel=True, zero=1)
    a1 = parse_megatron(megatron_args(llama, job, plan1)[0])
    assert a1.use_distributed_optimizer and not a1.use_megatron_fsdp


def test_deepspeed_gets_the_zero_stage(c32, tmp_path):
    m = presets.model("llama2-7b")
    job = JobSpec(global_batch=64, seq_length=4096, framework="deepspeed")
    for zero in (0, 1, 2, 3):
        plan = make_plan(m, job, c32, tp=1, pp=1, zero=zero)
        emit("deepspeed", m, job, c32, plan, tmp_path)
        cfg = json.loads((tmp_path / "ds_config.json").read_text())
        assert cfg["zero_optimization"]["stage"] == zero
        if zero == 3:  # the estimate's reduce-scatters wait in line; so must DeepSpeed's
            assert cfg["zero_optimization"]["overlap_comm"] is False
