"""Megatron-Core's flex token dispatcher (DeepEP, HybridEP) beside the alltoall one: the
routing share, the hierarchical transfer's closed forms, the bound below every placement, the
MILP and brute force on it, the refusals, what is emitted and read back."""

import dataclasses
import itertools
import math
import random
from pathlib import Path

import pytest

from formats import presets
from formats.clusters import SynthParams, synth_cluster, uniform_cluster
from formats.logs import megatron_arg_blocks
from test_calibration import _set_arg as with_arg  # one printed argument changed
from formats.megatron_args import megatron_args_mismatch, plan_from_megatron_args
from launch.emit import bridge_recipe, megatron_args, nemo_config
from model.communication import alltoall_ms, hierarchical_dispatch_ms, share_reached
from model.costs import CostModel
from model.errors import SpecError
from model.estimator import Evaluator, estimate, make_plan
from model.plan import Shape, validate_shape
from model.specs import JobSpec, ModelSpec, Options
from solvers.bounds import fastest_ep_alltoall_ms

QWEN3 = presets.model("qwen3-30b-a3b")  # 128 experts, top-8
TINY_MOE = ModelSpec("tiny-moe", 8, 1024, 8, 8, 2048, 32000, 2048, gated_mlp=True,
                     tied_embeddings=False, position_embedding="rope", norm="rmsnorm",
                     bias=False, dropout=False, num_experts=8, moe_topk=2)
LOGS = Path(__file__).parent / "fixtures" / "logs"


@pytest.mark.parametrize("E,k,e", [(8, 2, 2), (8, 3, 4), (6, 2, 1), (10, 4, 5), (4, 4, 1)])
def test_share_reached_counts_topk_sets(E, k, e):
    """The share of top-k expert sets (k distinct of E, each set equally likely) that hold at
    least one of e given experts, by enumeration."""
    sets = list(itertools.combinations(range(E), k))
    hit = sum(any(x < e for x in s) for s in sets) / len(sets)
    assert share_reached(e, E, k) == pytest.approx(hit, rel=1e-12)
    assert share_reached(0, E, k) == 0.0


def test_inside_a_node_each_peer_gets_a_token_once():
    """EP 8 inside one node on uniform links: each GPU sends every other GPU T share(e)
    tokens, where the alltoall dispatcher sends T k / 8 copies (Qwen3: 16 experts a GPU,
    share 0.667 against 1 copy of 8 / 8), plus one latency per peer."""
    c = uniform_cluster(1, 8, "H100-SXM-80GB", 400.0, 50.0)
    members = [(0, g) for g in range(8)]
    T, B = 4096, 4176.0
    got = hierarchical_dispatch_ms(c, members, T, B, 128, 8)
    share = share_reached(16, 128, 8)
    want = 7 * T * share * B / (400.0 * 1e6) + 7 * c.intra_latency_us / 1e3
    assert got == pytest.approx(want, rel=1e-12)
    nccl = alltoall_ms(c, members, T * 8 * B, 0.0)  # every routed copy
    assert got - 7 * c.intra_latency_us / 1e3 == pytest.approx(nccl * share, rel=1e-12)


def test_across_nodes_a_token_crosses_the_network_once_per_node():
    """EP 16 over two 8-GPU nodes: the network leg carries T share(64 experts) per GPU (about
    once per token), the alltoall dispatcher's T k / 2 copies (4 per token): the flex transfer
    is the NVLink leg or the network one, whichever is longer, and well below NCCL's."""
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    members = [(n, g) for n in range(2) for g in range(8)]
    T, B = 4096, 4176.0
    got = hierarchical_dispatch_ms(c, members, T, B, 128, 8)
    net = T * B * share_reached(64, 128, 8) / (50.0 * 1e6)
    nv = T * B * share_reached(8, 128, 8) * 7 * 2 / (400.0 * 1e6)  # own + forwarded
    lat = (c.latency_us + 7 * c.intra_latency_us) / 1e3
    assert got == pytest.approx(max(net, nv) + lat, rel=1e-12)
    assert got < 0.35 * alltoall_ms(c, members, T * 8 * B, c.latency_us)


def _ev(job, c, **kw):
    sh = Shape(micro_batch=1, recompute="none", zero=1, **kw)
    return Evaluator(QWEN3, job, c, sh, Options()), sh


def test_flex_costs_less_than_alltoall_on_the_estimate_and_carries_the_metadata():
    """The same plan priced with DeepEP: its all-to-all time falls (Qwen3-30B, EP 16 over two
    nodes), the tokens carry 8 bytes a routed expert and an 8-byte record in 16-byte units,
    and HybridEP adds its routing map's all-gather only where the group spans nodes."""
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    base = JobSpec(global_batch=64, seq_length=4096)
    deep = dataclasses.replace(base, moe_dispatcher="deepep")
    hyb = dataclasses.replace(base, moe_dispatcher="hybridep")
    plans = {j.moe_dispatcher: make_plan(QWEN3, j, c, tp=1, pp=1, ep=16, zero=1)
             for j in (base, deep, hyb)}
    times = {j.moe_dispatcher: estimate(QWEN3, j, c, plans[j.moe_dispatcher])
             .breakdown_ms["ep_alltoall_ms"] for j in (base, deep, hyb)}
    assert times["deepep"] < 0.4 * times["alltoall"]
    assert times["deepep"] < times["hybridep"] < times["alltoall"]
    cm = CostModel(QWEN3, deep, c, plans["deepep"].shape, Options())
    assert cm.flex_token_bytes() == 16 * math.ceil((2048 * 2 + 8 * 8 + 8) / 16)
    one = uniform_cluster(1, 8, "H100-SXM-80GB", 400.0, 50.0)
    members = [(0, g) for g in range(8)]
    for j in (deep, hyb):  # inside a node the two backends cost the same
        sh = Shape(tp=1, pp=1, dp=8, micro_batch=1, ep=8, zero=1)
        assert CostModel(QWEN3, j, one, sh, Options()).ep_alltoall_ms(one, members) == \
            pytest.approx(CostModel(QWEN3, deep, one, sh, Options()).ep_alltoall_ms(
                one, members), rel=1e-12)


def test_flex_bound_is_below_every_placement_of_its_group():
    """`fastest_ep_alltoall_ms` for the flex dispatcher stays at or below the transfer of
    random EP groups on uneven clusters (degraded NICs, oversubscribed leaves), for groups
    inside a node and across nodes."""
    rng = random.Random(7)
    for seed in range(12):
        gpn = rng.choice((4, 8))
        c = synth_cluster(SynthParams(num_nodes=4, gpus_per_node=gpn, nic_gb_per_s=25.0,
                                      leaf_size=2, oversubscription=3, degraded=1,
                                      degraded_factor=0.3, noise=0.15, seed=seed))
        for ep in (2, 4, 8, 16):
            job = JobSpec(global_batch=64, seq_length=2048,
                          moe_dispatcher=rng.choice(("deepep", "hybridep")))
            sh = Shape(tp=1, pp=1, dp=c.num_gpus, micro_batch=1, ep=ep, zero=1)
            cm = CostModel(QWEN3, job, c, sh, Options())
            lo = fastest_ep_alltoall_ms(cm, c, sh)
            slots = [(n, g) for n in range(c.num_nodes) for g in range(gpn)]
            for _ in range(10):
                members = rng.sample(slots, ep)
                assert lo <= cm.ep_alltoall_ms(c, members) * (1 + 1e-12), (seed, ep, members)


def _on_hopper(c):
    """The cluster with its A100s taken for H100s (same links): the flex dispatchers' GPUs."""
    h100 = presets.gpu("H100-SXM-80GB")
    return dataclasses.replace(c, nodes=tuple(dataclasses.replace(nd, gpu=h100)
                                              for nd in c.nodes))


def _flex_problems():
    """The expert-parallel placement problems of test_expert_parallel (uniform and uneven
    clusters, EP inside and across nodes) with whole experts, on H100s, priced with DeepEP
    where it can start the groups (inside a node of 2) and with HybridEP elsewhere."""
    from solvers.problem import PlacementProblem
    from test_expert_parallel import _moe_problems
    return [PlacementProblem(p.model, dataclasses.replace(
                p.job, moe_dispatcher="deepep" if p.block.k * p.shape.tp % p.shape.ep == 0
                else "hybridep"), _on_hopper(p.cluster), p.shape, p.block, p.options)
            for p in _moe_problems() if p.shape.expert_tp == 1 and p.shape.ep > 1]


@pytest.mark.parametrize("prob", _flex_problems(), ids=lambda p: (
    f"n{p.cluster.num_nodes}-{p.shape.describe()}-j{p.block.j}k{p.block.k}"
    f"{'-uniform' if p.cluster.uniform() else ''}"))
def test_flex_milp_and_annealer_reach_brute_force_and_the_estimator(prob):
    """One cost model with the DeepEP dispatcher: the same checks as the alltoall
    dispatcher's (the MILP optimal against brute force on uniform clusters, its all-to-all
    and objective the estimator's; the annealer at brute force elsewhere; the bound below)."""
    from test_expert_parallel import test_milp_alltoall_equals_the_estimator_and_brute_force
    test_milp_alltoall_equals_the_estimator_and_brute_force(prob)


@pytest.mark.parametrize("kw,field", [
    (dict(moe_dispatcher="nccl"), "moe_dispatcher"),
    (dict(moe_dispatcher="deepep", framework="torchtitan"), "moe_dispatcher"),
    (dict(moe_dispatcher="hybridep", moe_capacity_factor=1.5), "moe_dispatcher"),
])
def test_dispatcher_job_refusals_name_the_field(kw, field):
    with pytest.raises(SpecError) as e:
        JobSpec(global_batch=8, seq_length=2048, **kw)
    assert e.value.field == field


def test_flex_needs_whole_experts_and_deepep_an_eight_gpu_domain():
    """Expert TP = TP 2 is refused with the flex dispatcher (expert TP 1 accepted); DeepEP on
    a 72-GPU NVLink node is refused naming HybridEP, which is accepted there."""
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096, moe_dispatcher="deepep")
    sh = Shape(tp=2, pp=1, dp=8, micro_batch=1, ep=8, zero=1, sequence_parallel=True)
    with pytest.raises(SpecError) as e:
        validate_shape(QWEN3, job, c, sh, check_layers=False)
    assert e.value.field == "etp" and "expert TP 1" in str(e.value)
    validate_shape(QWEN3, job, c, dataclasses.replace(sh, etp=1), check_layers=False)
    rack = uniform_cluster(1, 72, "GB200", 900.0, 50.0)
    sh72 = Shape(tp=1, pp=1, dp=72, micro_batch=1, ep=8, zero=1)
    with pytest.raises(SpecError) as e:
        validate_shape(QWEN3, JobSpec(global_batch=72, seq_length=4096,
                                      moe_dispatcher="deepep"), rack, sh72,
                       check_layers=False)
    assert e.value.field == "moe_dispatcher" and "hybridep" in str(e.value)
    validate_shape(QWEN3, JobSpec(global_batch=72, seq_length=4096,
                                  moe_dispatcher="hybridep"), rack, sh72,
                   check_layers=False)


def test_emitted_dispatcher_flags_and_read_back():
    """Megatron-LM gets --moe-token-dispatcher-type flex and the backend (alltoall where EP
    is 1: DeepEP refuses a group of one), NeMo and Megatron-Bridge the same fields; a printed
    arguments block with the flex dispatcher reads back as the job's dispatcher, and the
    allgather dispatcher and NCCL EP are refused naming their argument."""
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096, moe_dispatcher="hybridep")
    plan = make_plan(QWEN3, job, c, tp=1, pp=2, ep=8, zero=1)
    a = megatron_args(QWEN3, job, plan)[0]
    assert a[a.index("--moe-token-dispatcher-type") + 1] == "flex"
    assert a[a.index("--moe-flex-dispatcher-backend") + 1] == "hybridep"
    one = make_plan(QWEN3, job, c, tp=1, pp=2, ep=1, zero=1)
    a1 = megatron_args(QWEN3, job, one)[0]
    assert a1[a1.index("--moe-token-dispatcher-type") + 1] == "alltoall"
    assert "--moe-flex-dispatcher-backend" not in a1
    model = nemo_config(QWEN3, job, c, plan)[0]["model"]
    assert (model["moe_token_dispatcher_type"], model["moe_flex_dispatcher_backend"]) == \
        ("flex", "hybridep")
    fields = bridge_recipe(QWEN3, job, c, plan)[0]["model"]
    assert (fields["moe_token_dispatcher_type"], fields["moe_flex_dispatcher_backend"]) == \
        ("flex", "hybridep")

    from formats.clusters import cluster as load_cluster
    ex = _on_hopper(load_cluster("example"))  # HybridEP needs Hopper
    text = (LOGS / "megatron_args_mixtral.txt").read_text()

    def read(t):
        return plan_from_megatron_args(megatron_arg_blocks(t)[0], ex, source="t")

    assert read(text)[1].moe_dispatcher == "alltoall"
    flex = with_arg(text, "moe_token_dispatcher_type", "flex")
    assert read(flex)[1].moe_dispatcher == "deepep"  # the backend's printed default
    hyb = with_arg(flex, "moe_flex_dispatcher_backend", "hybridep")
    m, j, p = read(hyb)[:3]
    assert j.moe_dispatcher == "hybridep"
    assert megatron_args_mismatch(m, j, p, megatron_arg_blocks(hyb)[0]) == []
    assert ("moe_token_dispatcher_type", "flex", "alltoall") in megatron_args_mismatch(
        m, dataclasses.replace(j, moe_dispatcher="alltoall"), p, megatron_arg_blocks(hyb)[0])
    for t, field in ((with_arg(flex, "moe_flex_dispatcher_backend", "ncclep"),
                      "moe_flex_dispatcher_backend"),
                     (with_arg(text, "moe_token_dispatcher_type", "allgather"),
                      "moe_token_dispatcher_type")):
        with pytest.raises(SpecError) as e:
            read(t)
        assert e.value.field == field


def test_plan_file_keeps_the_dispatcher_and_older_files_read_alltoall(tmp_path):
    import json
    from formats.planfile import load_plan, save_plan
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096, moe_dispatcher="deepep")
    plan = make_plan(QWEN3, job, c, tp=1, pp=2, ep=8, zero=1)
    est = estimate(QWEN3, job, c, plan)
    save_plan(tmp_path / "p.json", QWEN3, job, c, plan, est)
    _m, j2, c2, p2, o2, _meta = load_plan(tmp_path / "p.json")
    assert j2.moe_dispatcher == "deepep"
    assert estimate(QWEN3, j2, c2, p2, o2).iteration_ms == pytest.approx(est.iteration_ms,
                                                                         rel=1e-12)
    doc = json.loads((tmp_path / "p.json").read_text())
    del doc["job"]["moe_dispatcher"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    _m, j3, *_rest, meta = load_plan(tmp_path / "old.json")
    assert j3.moe_dispatcher == "alltoall"
    assert any("moe_dispatcher" in n for n in meta["read_notes"])


# -- the expert all-to-all overlap (Shape.ep_comm_overlap) ------------------------------------

def test_combined_layer_steps_lie_between_the_longer_stream_and_the_sum():
    """n layer steps of the two-stream walk take at least the longer stream's work and at
    most the sum of both; with no communication the compute alone, with nothing to hide
    behind, the compute and the transfers in series."""
    from model.costs import combined_layer_steps
    rng = random.Random(3)
    for _ in range(200):
        pf, mf, pb, pw, mb, mw = (rng.uniform(0, 2) for _ in range(6))
        a = rng.uniform(0, 2)
        n = rng.randint(1, 12)
        t = combined_layer_steps(n, pf, a, mf, a, a, mb, mw, a, pb, pw)
        comp, comm = pf + mf + pb + pw + mb + mw, 4 * a
        assert max(comp, comm) * n * (1 - 1e-12) <= t <= (comp + comm) * n * (1 + 1e-12)
        assert combined_layer_steps(n, pf, 0, mf, 0, 0, mb, mw, 0, pb, pw) == \
            pytest.approx(n * comp, rel=1e-12)


def _ov_plan(job, c, overlap, **kw):
    return make_plan(QWEN3, job, c, tp=1, pp=1, ep=16, zero=1, ep_comm_overlap=overlap, **kw)


def test_overlap_hides_at_most_the_all_to_alls_and_nothing_with_one_micro_batch():
    """Qwen3-30B at EP 16 over two nodes: the overlap saves time, no more than the exposed
    all-to-all of the plan without it, and leaves the compute; the breakdown still adds up.
    With one micro-batch per step there is no pair to overlap: the same estimate."""
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    for disp in ("alltoall", "deepep"):
        job = JobSpec(global_batch=64, seq_length=4096, moe_dispatcher=disp)
        off, on = (estimate(QWEN3, job, c, _ov_plan(job, c, x)) for x in (False, True))
        a2a = off.breakdown_ms["ep_alltoall_ms"]
        assert on.iteration_ms < off.iteration_ms
        assert off.iteration_ms - on.iteration_ms <= a2a * (1 + 1e-9)
        assert on.breakdown_ms["compute_ms"] == pytest.approx(off.breakdown_ms["compute_ms"],
                                                              rel=1e-9)
        parts = sum(v for k, v in on.breakdown_ms.items() if k != "bubble_ms")
        assert parts == pytest.approx(on.iteration_ms, rel=1e-9)
        one = JobSpec(global_batch=16, seq_length=4096, moe_dispatcher=disp)
        assert estimate(QWEN3, one, c, _ov_plan(one, c, True)).iteration_ms == \
            pytest.approx(estimate(QWEN3, one, c, _ov_plan(one, c, False)).iteration_ms,
                          rel=1e-12)


def test_overlap_holds_one_more_layer_at_backward_moments():
    from model.memory import MemoryModel
    from model.schedule import compile_schedule
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096)
    mems = []
    for x in (False, True):
        sh = _ov_plan(job, c, x).shape
        mems.append(MemoryModel(QWEN3, job, sh, compile_schedule("1f1b", 1, 4, 1, True),
                                Options(), cluster=c))
    assert mems[1].work == pytest.approx(mems[0].work + mems[0].act_layer, rel=1e-12)


@pytest.mark.parametrize("kw", [dict(pp=2), dict(ep=1), dict(tp=2, sequence_parallel=True),
                                dict(recompute="full"), dict(precision="fp32")])
def test_overlap_refusals_name_the_field(kw):
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096, precision=kw.pop("precision", "bf16"))
    shp = dict(tp=1, pp=1, dp=16, micro_batch=1, ep=8, zero=1, ep_comm_overlap=True)
    shp.update(kw)
    shp["dp"] = 16 // (shp["tp"] * shp["pp"])
    with pytest.raises(SpecError) as e:
        validate_shape(QWEN3, job, c, Shape(**shp), check_layers=False)
    assert e.value.field == "ep_comm_overlap"


def _overlap_problems():
    from solvers.problem import PlacementProblem
    from test_expert_parallel import _moe_problems
    return [PlacementProblem(p.model, p.job, p.cluster,
                             dataclasses.replace(p.shape, ep_comm_overlap=True), p.block,
                             p.options)
            for p in _moe_problems()
            if p.shape.expert_tp == 1 and p.shape.ep > 1 and p.shape.pp == 1]


@pytest.mark.parametrize("prob", _overlap_problems(), ids=lambda p: (
    f"n{p.cluster.num_nodes}-{p.shape.describe()}-j{p.block.j}k{p.block.k}"
    f"{'-uniform' if p.cluster.uniform() else ''}"))
def test_overlap_milp_and_annealer_reach_brute_force_and_the_estimator(prob):
    """One cost model with the all-to-all overlap: as the alltoall dispatcher's checks."""
    from test_expert_parallel import test_milp_alltoall_equals_the_estimator_and_brute_force
    test_milp_alltoall_equals_the_estimator_and_brute_force(prob)


def test_search_turns_the_overlap_on_only_where_it_runs():
    from solvers.space import SearchSpace, enumerate_shapes
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096)
    shapes = list(enumerate_shapes(QWEN3, job, c, SearchSpace(
        micro_batch=(1,), recompute=("none", "full"), ep_comm_overlap=(True,))))
    on = [s for s in shapes if s.ep_comm_overlap]
    assert on and all(s.pp == 1 and s.ep > 1 and s.expert_tp == 1 and s.recompute != "full"
                      for s in on)
    assert any(s.pp > 1 and s.ep > 1 for s in shapes)  # searched, without it


def test_overlap_emitted_read_back_and_kept_in_plan_files(tmp_path):
    import json
    from formats.planfile import load_plan, save_plan
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = _ov_plan(job, c, True)
    a = megatron_args(QWEN3, job, plan)[0]
    assert "--overlap-moe-expert-parallel-comm" in a and "--delay-wgrad-compute" in a
    model = nemo_config(QWEN3, job, c, plan)[0]["model"]
    assert model["overlap_moe_expert_parallel_comm"] and model["delay_wgrad_compute"]
    est = estimate(QWEN3, job, c, plan)
    save_plan(tmp_path / "p.json", QWEN3, job, c, plan, est)
    _m, j2, c2, p2, o2, _meta = load_plan(tmp_path / "p.json")
    assert p2.shape.ep_comm_overlap
    doc = json.loads((tmp_path / "p.json").read_text())
    del doc["plan"]["shape"]["ep_comm_overlap"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    _m, _j, _c, p3, _o, meta = load_plan(tmp_path / "old.json")
    assert not p3.shape.ep_comm_overlap
    assert any("ep_comm_overlap" in n for n in meta["read_notes"])

    from formats.clusters import cluster as load_cluster
    ex = load_cluster("example")
    text = (LOGS / "megatron_args_mixtral.txt").read_text()

    # the fixture is PP 4: the overlap is priced without pipelining, so read it at PP 1
    t = with_arg(with_arg(text, "pipeline_model_parallel_size", 1),
                 "data_parallel_size", 32)
    t = with_arg(with_arg(t, "virtual_pipeline_model_parallel_size", "None"),
                 "overlap_moe_expert_parallel_comm", True)
    with pytest.raises(SpecError) as e:
        plan_from_megatron_args(megatron_arg_blocks(t)[0], ex, source="t")
    assert e.value.field == "delay_wgrad_compute"
    m, j, p = plan_from_megatron_args(megatron_arg_blocks(
        with_arg(t, "delay_wgrad_compute", True))[0], ex, source="t")[:3]
    assert p.shape.ep_comm_overlap and p.shape.pp == 1


def test_hybridep_routing_map_gather_is_counted_once_a_layer():
    """HybridEP over two nodes costs DeepEP's transfer plus a quarter of one all-gather of
    every member's tokens x experts map per transfer (four a layer: one gather, its latency
    once); inside a node the two are the same."""
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    sh = Shape(tp=1, pp=1, dp=16, micro_batch=1, ep=16, zero=1)
    members = [(n, g) for n in range(2) for g in range(8)]
    deep, hyb = (CostModel(QWEN3, JobSpec(global_batch=64, seq_length=4096, moe_dispatcher=d),
                           c, sh, Options()) for d in ("deepep", "hybridep"))
    gather = alltoall_ms(c, members, 4096 * 128 * 16, c.latency_us)
    assert hyb.ep_alltoall_ms(c, members) - deep.ep_alltoall_ms(c, members) == \
        pytest.approx(gather / 4, rel=1e-12)


def test_deepep_group_sizes_and_layouts_it_cannot_start():
    """DeepEP's buffer takes groups below 8 ranks or of a multiple of 8, over nodes of 8
    GPUs above 8 (refused as shapes); a placement that splits a group of 8 over two nodes of
    4 is named (estimate warns, emit refuses), a group of 16 over two whole nodes of 8 is
    not."""
    from model.plan import deepep_layout_problem
    job = JobSpec(global_batch=96, seq_length=4096, moe_dispatcher="deepep")
    c12 = uniform_cluster(2, 6, "H100-SXM-80GB", 400.0, 50.0)
    q12 = dataclasses.replace(QWEN3, num_experts=96)
    with pytest.raises(SpecError) as e:
        validate_shape(q12, job, c12, Shape(tp=1, pp=1, dp=12, micro_batch=1, ep=12, zero=1),
                       check_layers=False)
    assert e.value.field == "moe_dispatcher" and "not 12" in str(e.value)
    c4 = uniform_cluster(4, 4, "H100-SXM-80GB", 400.0, 50.0)
    with pytest.raises(SpecError) as e:
        validate_shape(QWEN3, job, c4, Shape(tp=1, pp=1, dp=16, micro_batch=1, ep=16, zero=1),
                       check_layers=False)
    assert e.value.field == "moe_dispatcher" and "nodes of 8" in str(e.value)
    split = make_plan(QWEN3, JobSpec(global_batch=64, seq_length=4096,
                                     moe_dispatcher="deepep"), c4, tp=1, pp=1, ep=8, zero=1)
    assert "DeepEP runs a group inside one node" in deepep_layout_problem(split, c4)
    from launch.emit import launch_set
    with pytest.raises(SpecError) as e:
        launch_set("megatron", QWEN3, JobSpec(global_batch=64, seq_length=4096,
                                              moe_dispatcher="deepep"), c4, split,
                   force=True)
    assert e.value.field == "--emit" and "DeepEP" in str(e.value)
    c2 = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    whole = make_plan(QWEN3, JobSpec(global_batch=64, seq_length=4096,
                                     moe_dispatcher="deepep"), c2, tp=1, pp=1, ep=16, zero=1)
    assert deepep_layout_problem(whole, c2) is None


def test_dispatcher_refusals_before_the_search_and_in_sweeps(tmp_path):
    from typer.testing import CliRunner
    from cli import app
    from formats.sweepspec import Task, build_inputs
    r = CliRunner().invoke(app, ["cluster", "synth", "--nodes", "1", "--gpu", "GB200",
                                 "--gpus-per-node", "72", "-o", str(tmp_path / "rack.toml")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["solve", "-m", "qwen3-30b-a3b", "-c",
                                 str(tmp_path / "rack.toml"), "--gbs", "1152", "--seq", "4096",
                                 "--moe-dispatcher", "deepep"])
    assert r.exit_code == 2 and "hybridep" in r.output and "Traceback" not in r.output
    with pytest.raises(SpecError) as e:
        build_inputs(Task("llama2-7b", {"preset": "example"},
                          {"global_batch": 64, "seq_length": 4096, "moe_dispatcher": "deepep"},
                          "anneal", 1.0, 0))
    assert e.value.field == "jobs" and "dense" in str(e.value)


def test_overlap_walk_runs_each_kernel_on_its_node_stream():
    """The walk's nodes hold what Megatron-Core's callables run: with the alltoall dispatcher
    the permutation before the dispatch (compute) and the unpermutation and residual add after
    the combine (communication stream); with the flex dispatchers both permutations with the
    experts (compute) and the residual add after the combine."""
    from model.costs import combined_layer_steps
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    for disp, mlp, comm in (("alltoall", {"fc1", "act", "fc2"}, {"unpermute", "bda2"}),
                            ("deepep", {"fc1", "act", "fc2", "permute", "unpermute"},
                             {"bda2"})):
        job = JobSpec(global_batch=64, seq_length=4096, moe_dispatcher=disp)
        cm = CostModel(QWEN3, job, c, _ov_plan(job, c, True).shape, Options())
        lc = cm.compute(c.nodes[0].gpu).layer()
        a = 0.7

        def ms(p, names, kind=None, inside=True):
            return sum(v for k, v in p.ms.items() if (k.split(".")[0] in names) == inside
                       and (kind is None or k.endswith(".wgrad") == kind))
        pre = mlp | comm
        steps = (ms(lc.fwd, pre, inside=False), a, ms(lc.fwd, mlp), a + ms(lc.fwd, comm),
                 a + ms(lc.bwd, comm), ms(lc.bwd, mlp, False), ms(lc.bwd, mlp, True), a,
                 ms(lc.bwd, pre, False, inside=False), ms(lc.bwd, pre, True, inside=False))
        alone = sum(steps)
        n = QWEN3.moe_layers
        assert cm._ep_overlap(lc, 0.0, 0.0, 0.0, 0.0, a) == pytest.approx(
            alone - combined_layer_steps(n, *steps) / n, rel=1e-12)


def test_overlap_mends_one_micro_batch_memory_logs_with_pipelining_and_deepep_rank_runs():
    """With one micro-batch a step nothing is paired, so no extra layer is held; a Megatron
    log that ran the overlap with pipelining is refused naming the flag (no plan file can say
    it), not read as another run; DeepEP's group of 16 must be two runs of 8 consecutive
    ranks, each on a node of its own."""
    from model.memory import MemoryModel
    from model.plan import Placement, Plan, deepep_layout_problem
    from model.schedule import compile_schedule
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    one = JobSpec(global_batch=16, seq_length=4096)
    works = [MemoryModel(QWEN3, one, _ov_plan(one, c, x).shape,
                         compile_schedule("1f1b", 1, 1, 1, True), Options(),
                         cluster=c).work
             for x in (False, True)]
    assert works[0] == works[1]

    from formats.clusters import cluster as load_cluster
    ex = load_cluster("example")
    text = (LOGS / "megatron_args_mixtral.txt").read_text()
    t = with_arg(with_arg(text, "overlap_moe_expert_parallel_comm", True),
                 "delay_wgrad_compute", True)
    with pytest.raises(SpecError) as e:
        plan_from_megatron_args(megatron_arg_blocks(t)[0], ex, source="t")
    assert e.value.field == "overlap_moe_expert_parallel_comm" and \
        "cannot be calibrated on" in str(e.value)

    job = JobSpec(global_batch=64, seq_length=4096, moe_dispatcher="deepep")
    plan = make_plan(QWEN3, job, c, tp=1, pp=1, ep=16, zero=1)
    assert deepep_layout_problem(plan, c) is None
    order = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]  # nodes 0,0,0,0,1,1,1,1,..
    pl = Placement((tuple(plan.placement.node[0][i] for i in order),),
                   (tuple(plan.placement.gpus[0][i] for i in order),))
    assert "DeepEP" in deepep_layout_problem(Plan(plan.shape, pl), c)


def test_dispatchers_refused_on_gpus_that_do_not_run_them():
    """HybridEP needs Hopper or later (TMA); DeepEP runs inside an A100 node but not across
    nodes (its Ampere build has no NVSHMEM)."""
    from model.plan import dispatcher_problem
    a100 = uniform_cluster(2, 8, "A100-80GB", 240.0, 25.0)
    hyb = JobSpec(global_batch=64, seq_length=4096, moe_dispatcher="hybridep")
    assert "Hopper" in dispatcher_problem(hyb, a100)
    deep = JobSpec(global_batch=64, seq_length=4096, moe_dispatcher="deepep")
    assert dispatcher_problem(deep, a100) is None
    validate_shape(QWEN3, deep, a100, Shape(tp=1, pp=1, dp=16, micro_batch=1, ep=8, zero=1),
                   check_layers=False)
    with pytest.raises(SpecError) as e:
        validate_shape(QWEN3, deep, a100, Shape(tp=1, pp=1, dp=16, micro_batch=1, ep=16,
                                                zero=1), check_layers=False)
    assert e.value.field == "moe_dispatcher" and "NVSHMEM" in str(e.value)


def test_search_leaves_out_layouts_deepep_cannot_start():
    """On nodes of 4 GPUs an EP group of 8 can only be split over nodes: no block layout is
    left for DeepEP (HybridEP keeps them); EP 4 keeps the layouts whose nodes hold a whole
    group; and a solve returns a plan whose every EP group DeepEP can start."""
    from model.plan import deepep_layout_problem
    from solvers.search import solve
    from solvers.space import SearchSpace, blocks_for
    c4 = uniform_cluster(4, 4, "H100-SXM-80GB", 400.0, 50.0)
    deep = JobSpec(global_batch=64, seq_length=2048, moe_dispatcher="deepep")
    hyb = dataclasses.replace(deep, moe_dispatcher="hybridep")
    sh8 = Shape(tp=1, pp=2, dp=8, micro_batch=1, ep=8, zero=1)
    assert blocks_for(c4, sh8, hyb) and blocks_for(c4, sh8) and not blocks_for(c4, sh8, deep)
    sh4 = Shape(tp=1, pp=2, dp=8, micro_batch=1, ep=4, zero=1)
    kept = blocks_for(c4, sh4, deep)
    assert kept and all(b.k * sh4.tp % 4 == 0 for b in kept)
    assert len(kept) < len(blocks_for(c4, sh4))
    res = solve(TINY_MOE, deep, c4, time_limit_s=20, space=SearchSpace(
        micro_batch=(1,), recompute=("none",), zero=(1,), ep=(4,)))
    assert res.plan.shape.ep == 4
    assert deepep_layout_problem(res.plan, c4) is None


def test_dispatcher_at_ep_1_and_unused_overlap_are_said(tmp_path):
    from typer.testing import CliRunner
    from cli import app
    r = CliRunner().invoke(app, ["estimate", "-m", "qwen3-30b-a3b", "--tp", "4", "--pp", "4",
                                 "--ep", "1", "--distopt", "--moe-dispatcher", "deepep",
                                 "--gbs", "64", "--seq", "4096"])
    assert r.exit_code == 0, r.output
    assert "EP 1, so no tokens move" in " ".join(r.output.split())
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096, moe_dispatcher="deepep")
    plan = make_plan(QWEN3, job, c, tp=1, pp=2, ep=1, zero=1)
    from launch.emit import launch_set
    ls = launch_set("megatron", QWEN3, job, c, plan, force=True)
    assert any("EP 1: the alltoall dispatcher is written" in w for w in ls.warnings)
    from cli import _moe_warnings
    assert any(w.startswith("--ep-comm-overlap: the plan does not use it")
               for w in _moe_warnings(job, c, plan, asked_ep_overlap=True))
    # with --emit the launch set's [model] line says it, once (it had been said twice)
    r = CliRunner().invoke(app, ["estimate", "-m", "qwen3-30b-a3b", "--tp", "4", "--pp", "4",
                                 "--ep", "1", "--distopt", "--moe-dispatcher", "deepep",
                                 "--gbs", "64", "--seq", "4096", "--emit", "megatron",
                                 "--out", str(tmp_path / "e")])
    assert r.exit_code == 0, r.output
    assert " ".join(r.output.split()).count("EP 1") == 1


@pytest.mark.parametrize("nodes,gpus,ep,ok", [(1, 6, 6, False), (1, 6, 3, False),
                                              (1, 8, 4, True), (3, 8, 24, True),
                                              (5, 8, 40, False), (6, 8, 48, True)])
def test_deepep_runs_only_the_group_sizes_it_has_configurations_for(nodes, gpus, ep, ok):
    """Megatron-Core sizes DeepEP's buffer from Buffer.get_dispatch_config(group size),
    which knows 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144 and 160 ranks and asserts on any
    other: EP 3, 6 and 40 are refused naming the sizes it runs; 4, 24 and 48 pass."""
    c = uniform_cluster(nodes, gpus, "H100-SXM-80GB", 400.0, 50.0)
    model = dataclasses.replace(QWEN3, num_experts=240)  # divisible by every ep here
    job = JobSpec(global_batch=240, seq_length=4096, moe_dispatcher="deepep")
    sh = Shape(tp=1, pp=1, dp=nodes * gpus, micro_batch=1, ep=ep, zero=1)
    if ok:
        validate_shape(model, job, c, sh, check_layers=False)
        return
    with pytest.raises(SpecError) as e:
        validate_shape(model, job, c, sh, check_layers=False)
    assert e.value.field == "moe_dispatcher" and f"not {ep}" in str(e.value) \
        and "16, 24, 32, 48, 64" in str(e.value)


def test_deepep_buffer_size_follows_its_size_hints():
    """DeepEP's buffer, counted by hand from csrc/legacy/config.hpp for Qwen3-30B's hidden
    2048 in bf16 (4096 bytes a token, 6152 bytes a slot with the 8-byte source record and
    room for 128 int64 indices, 128 weights and 128 scales), 20 SMs (10 channels): EP 8 has
    only the NVLink buffer (256 slots a peer) and the 32 MiB workspace; EP 16 has 288 slots a
    peer and an RDMA buffer of 140 slots (128 rounded up to the 20-token send chunk) per
    remote node, which takes one 512 MiB NVSHMEM granule; NCCL's all-to-all holds none."""
    from model.communication import deepep_buffer_bytes, hybridep_buffer_bytes
    from model.memory import dispatcher_buffer_gib

    def align(x):
        return -(-x // 128) * 128
    slot = 4096 + 8 + 128 * 8 + 128 * 4 + 128 * 4
    assert slot == 6152
    nvl8 = align(10 * 8 * 5 * 4 + 10 * 8 * 256 * slot)
    assert deepep_buffer_bytes(8, 2048, 2) == nvl8 + 32 * 2 ** 20
    nvl16 = align(10 * 8 * 7 * 4 + 10 * 8 * 288 * slot)
    rdma16 = align(10 * 2 * 18 * 2 * 4 + 10 * 2 * 140 * (2 * slot + 32))
    assert rdma16 < 2 ** 29
    assert deepep_buffer_bytes(16, 2048, 2) == nvl16 + 32 * 2 ** 20 + 2 ** 29
    assert deepep_buffer_bytes(16, 2048, 1) == deepep_buffer_bytes(16, 2048, 2)  # >= 2 bytes
    assert deepep_buffer_bytes(1, 2048, 2) == deepep_buffer_bytes(12, 2048, 2) == 0.0
    sh = Shape(tp=1, pp=1, dp=16, micro_batch=1, ep=16, zero=1)
    for d, want in (("alltoall", 0.0),
                    ("hybridep", hybridep_buffer_bytes(4096, 2048, 128, 16, 8) / 2 ** 30),
                    ("deepep", deepep_buffer_bytes(16, 2048, 2) / 2 ** 30)):
        job = JobSpec(global_batch=64, seq_length=4096, moe_dispatcher=d)
        assert dispatcher_buffer_gib(QWEN3, job, sh, 8) == want
    assert dispatcher_buffer_gib(QWEN3, JobSpec(global_batch=64, seq_length=4096,
                                                moe_dispatcher="deepep"),
                                 dataclasses.replace(sh, ep=1), 8) == 0.0


def test_hybridep_buffer_holds_the_whole_group_s_tokens():
    """HybridEP's buffer, counted by hand from hybrid-ep's intranode.cu and internode_doca.cu
    for Qwen3-30B (hidden 2048, 128 experts) at 4096 tokens a rank: inside one NVLink domain
    of 8 (EP 8) room for all 8 x 4096 tokens' 16-bit states, an fp32 probability per expert
    of the domain (128) and a scale per 128 elements; EP 16 over two domains of 8 also its own
    tokens (probabilities for all 128 experts) and, per other domain, the dispatch's tokens
    with probabilities and scales and the combine's twice without scales; on one NVL72
    domain EP 16 has no RDMA part. It grows with the tokens a rank dispatches."""
    from model.communication import hybridep_buffer_bytes
    T, h = 4096, 2048
    per = 2 * h + 4 * 128 + 4 * 16
    assert hybridep_buffer_bytes(T, h, 128, 8, 8) == T * 8 * per
    own = T * (2 * h + 4 * 128 + 4 * 16)  # experts per rank 8 x 8 x 2 domains = 128
    other = T * (2 * h + 4 * 64 + 4 * 16) + 2 * T * (2 * h + 4 * 64)
    assert hybridep_buffer_bytes(T, h, 128, 16, 8) == T * 16 * (2 * h + 4 * 64 + 4 * 16) \
        + own + other
    assert hybridep_buffer_bytes(T, h, 128, 16, 72) == T * 16 * per
    assert hybridep_buffer_bytes(2 * T, h, 128, 16, 8) == 2 * hybridep_buffer_bytes(
        T, h, 128, 16, 8)
    assert hybridep_buffer_bytes(T, h, 128, 1, 8) == 0.0


def test_deepep_buffer_is_memory_outside_the_allocator_for_the_estimate_and_the_search():
    """The same plan with DeepEP instead of NCCL's all-to-all holds the buffer more on every
    stage (total, not the allocator's reserved peak, and not scaled by fragmentation), and
    the search's memory checks (space.capacity_split's peak, problem's split) see it too:
    the estimator's peak is what capacity_split reports for the estimator's split."""
    from model.memory import dispatcher_buffer_gib
    from solvers.space import capacity_split, min_max_memory_split
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 400.0, 50.0)
    base = JobSpec(global_batch=64, seq_length=4096)
    deep = dataclasses.replace(base, moe_dispatcher="deepep")
    ests = {}
    for j in (base, deep):
        plan = make_plan(QWEN3, j, c, tp=1, pp=2, ep=8, zero=1)
        ests[j.moe_dispatcher] = (plan, estimate(QWEN3, j, c, plan))
    buf = dispatcher_buffer_gib(QWEN3, deep, ests["deepep"][0].shape, 8)
    assert buf > 0.1
    for a, b in zip(ests["alltoall"][1].stages, ests["deepep"][1].stages):
        assert b.memory.total_gib - a.memory.total_gib == pytest.approx(buf, rel=1e-9)
        assert b.memory.reserved_gib == pytest.approx(a.memory.reserved_gib, rel=1e-12)
        assert b.memory.dispatcher_gib == buf
    plan, est = ests["deepep"]
    # the JSON view's parts add up to its total; the buffers are named as a share of the
    # allowance (a sibling key had been summed twice by a reviewer's script)
    from formats.views import estimate_to_dict
    for st in estimate_to_dict(est)["stages"]:
        mem = dict(st["memory_gib"])
        assert mem.pop("dispatcher_buffers_in_allowance") == buf
        total = mem.pop("total")
        assert sum(mem.values()) == pytest.approx(total, rel=1e-12)
    sh = plan.shape
    layers, peak, _ = min_max_memory_split(QWEN3, deep, c, sh, Options())
    split_peak = capacity_split(QWEN3, deep, c, sh, Options(), [80.0] * sh.pp)[3]
    at = estimate(QWEN3, deep, c, dataclasses.replace(
        plan, shape=dataclasses.replace(sh, layers=layers)))
    assert peak == pytest.approx(max(s.memory.total_gib for s in at.stages), rel=1e-9)
    assert split_peak == pytest.approx(peak, rel=1e-9)


@pytest.mark.parametrize("dispatcher,name", [("deepep", "DeepEP"), ("hybridep", "HybridEP")])
def test_estimate_names_the_dispatcher_whose_buffers_it_counts(dispatcher, name):
    """The estimate's line on buffers outside PyTorch's allocator names the backend that
    holds them (it had said DeepEP's for HybridEP's too)."""
    from typer.testing import CliRunner
    from cli import app
    r = CliRunner().invoke(app, ["estimate", "-m", "qwen3-30b-a3b", "-c", "h100-8x8", "--seq",
                                 "4096", "--gbs", "1024", "--tp", "1", "--pp", "1", "--ep",
                                 "16", "--distopt", "--precision", "bf16", "--moe-dispatcher",
                                 dispatcher])
    assert r.exit_code == 0, r.output
    line = " ".join(r.output.split())
    assert f"the allowance holds {name}'s buffers" in line, r.output
