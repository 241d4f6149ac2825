"""Context parallelism: the split of compute and memory, the ring exchange, the rules, the
search, the emitted configurations and the rank groups."""

import json
import tomllib

import numpy as np
import pytest

from formats import presets
from formats.clusters import uniform_cluster
from launch.emit import emit, megatron_args, nemo_config, torchtitan_config
from launch.ranks import rank_mapping
from model.errors import SpecError
from model.estimator import Evaluator, estimate, make_plan
from model.memory import layer_activation_bytes
from model.plan import Plan, block_placement
from model.specs import JobSpec
from solvers.search import solve
from solvers.space import SearchSpace, enumerate_shapes


def h100(nodes=8, inter=45.0):
    return uniform_cluster(nodes, 8, "H100-SXM-80GB", 360.0, inter)


@pytest.fixture(scope="module")
def l3():
    return presets.model("llama3-8b")


# Iteration time and peak memory of three plans, computed before context parallelism existed
# (commit db018df); CP = 1 must reproduce them to the last digit. (torchtitan plans are not
# among them: their memory model changed after, with the torchtitan validation rows.)
BEFORE_CP = [
    ("llama2-70b", dict(global_batch=64, seq_length=4096), ("A100-80GB", 4, 8, 240.0, 23.0),
     dict(tp=8, pp=4, sequence_parallel=True, distributed_optimizer=True),
     22947.681938765, 57.265472412),
    ("llama3-8b", dict(global_batch=32, seq_length=8192), ("H100-SXM-80GB", 2, 8, 360.0, 45.0),
     dict(tp=2, pp=2, sequence_parallel=True, zero=3, recompute="selective"),
     # (its memory since 2026-12-07: Megatron-FSDP's double buffers, model/memory.py
     # megatron_fsdp_units; 34.294820404 before)
     2025.877159881, 34.782338714599),
    # (its TP 8 without SP priced the pipeline transfers then as legacy Megatron-LM's
    # scatter/gather: JobSpec.p2p_scatter_gather, since Megatron-Core's whole-tensor sends)
    ("gpt3-175b", dict(global_batch=96, seq_length=2048, attention="eager",
                       p2p_scatter_gather=True),
     ("A100-80GB", 4, 8, 240.0, 23.0), dict(tp=8, pp=4, micro_batch=1, schedule="interleaved",
                                            chunks=2, recompute="full"),
     # (its time since 2026-12-08: + the tied embedding's all-reduce between the first and
     # last stage, 13.687 ms, Evaluator.tied_ms; 57776.092693836 before)
     57789.779772097, 120.301828003),
]


@pytest.mark.parametrize("name,jk,cl,pk,ms,gib", BEFORE_CP)
def test_cp1_reproduces_the_numbers_before_cp(name, jk, cl, pk, ms, gib):
    m, job = presets.model(name), JobSpec(**jk)
    gpu, n, g, intra, inter = cl
    c = uniform_cluster(n, g, gpu, intra, inter)
    e = estimate(m, job, c, make_plan(m, job, c, cp=1, **pk))
    assert e.iteration_ms == pytest.approx(ms, rel=1e-11)
    assert e.peak_memory_gib == pytest.approx(gib, rel=1e-11)


def test_cp_splits_activations_and_attention_work(l3):
    job = JobSpec(global_batch=8, seq_length=65536)
    c = h100(1)
    p1 = make_plan(l3, job, c, tp=4, pp=1, dp=2, cp=1, sequence_parallel=True)
    p2 = make_plan(l3, job, c, tp=4, pp=1, dp=1, cp=2, sequence_parallel=True)
    # each CP rank stores half of every sequence's activations
    assert layer_activation_bytes(l3, job, p2.shape) == pytest.approx(
        layer_activation_bytes(l3, job, p1.shape) / 2)
    ev1, ev2 = Evaluator(l3, job, c, p1.shape), Evaluator(l3, job, c, p2.shape)
    # every GEMM of the layer, the attention core included (queries of half the sequence
    # against all keys), does half the work
    for p in ("fwd", "bwd"):
        f1 = getattr(ev1.costs.compute(c.nodes[0].gpu).layer(), p).flops
        f2 = getattr(ev2.costs.compute(c.nodes[0].gpu).layer(), p).flops
        assert f2 == pytest.approx(f1 / 2)
    # and inside one node the K/V ring hides behind the attention steps
    lt = ev2.costs.layer_times(c.nodes[0].gpu, 360.0, cp_ring_gb_per_s=360.0)
    assert lt.cp_comm_fwd_ms == 0.0 and lt.cp_comm_bwd_ms == 0.0


def test_cp_ring_exchange_shows_when_links_are_slow(l3):
    """CP=8 across 8 nodes: as the inter-node streams slow down, each ring step outlasts its
    attention step and the exchange lands on the critical path."""
    job = JobSpec(global_batch=8, seq_length=32768)
    times = []
    for inter in (45.0, 0.5, 0.05):
        c = h100(8, inter)
        plan = make_plan(l3, job, c, tp=8, pp=1, dp=1, cp=8, sequence_parallel=True, zero=1)
        ev = Evaluator(l3, job, c, plan.shape)
        ring = ev.cp_ring(plan.placement, 0, 0)
        assert ring == pytest.approx(inter)  # every hop leaves a node
        times.append(ev.estimate(plan.placement).iteration_ms)
        lt = ev.costs.layer_times(c.nodes[0].gpu, 360.0, cp_ring_gb_per_s=ring)
        step_ms = ev.costs.cp_step_bytes() / (ring * 1e6) + c.latency_us / 1e3
        core = ev.costs.compute(c.nodes[0].gpu).layer().fwd.ms["attention"]
        assert lt.cp_comm_fwd_ms == pytest.approx(7 * max(0.0, step_ms - core / 8))
    assert times[0] < times[1] < times[2]


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_megatron_cp_backward_windows_and_selective_rerun(l3, cp):
    """Megatron-LM's ring backward (Transformer Engine AttnFuncWithCPAndKVP2P.backward) has cp
    windows: the K/V chunk alone, cp - 2 of chunk and gradients, the gradients alone (it had
    priced cp - 1 windows of both). Selective recompute reruns the attention core, which
    under CP is the ring attention: its forward exchange runs again in the backward (it had
    been left out: about 3% of a CP 8 iteration on 45 GB/s links)."""
    c = h100(cp, 0.5)  # TP 8: each CP rank a node of its own, the ring across nodes
    job = JobSpec(global_batch=8, seq_length=32768)
    lts = {}
    for rc in ("none", "selective"):
        plan = make_plan(l3, job, c, tp=8, pp=1, dp=1, cp=cp, sequence_parallel=True, zero=1,
                         recompute=rc)
        ev = Evaluator(l3, job, c, plan.shape)
        ring = ev.cp_ring(plan.placement, 0, 0)
        lts[rc] = lt = ev.costs.layer_times(c.nodes[0].gpu, 360.0, cp_ring_gb_per_s=ring)
        step = ev.costs.cp_step_bytes() / (ring * 1e6) + c.latency_us / 1e3
        layer = ev.costs.compute(c.nodes[0].gpu).layer()
        b = layer.bwd.ms["attention"] / cp
        assert lt.cp_comm_bwd_ms == pytest.approx(
            2 * max(0.0, step - b) + (cp - 2) * max(0.0, 2 * step - b))
        assert lt.cp_comm_fwd_ms > 0  # slow links: the exchange shows
    none, sel = lts["none"], lts["selective"]
    assert sel.cp_comm_rerun_ms == pytest.approx(none.cp_comm_fwd_ms)
    assert sel.bwd_ms - none.bwd_ms == pytest.approx(
        layer.attention_fwd_ms + none.cp_comm_fwd_ms)


@pytest.mark.parametrize("repeat_kv,compiled", [(False, True), (True, False)])
def test_torchtitan_cp_gathers_kv_and_hides_it_behind_one_step(l3, repeat_kv, compiled):
    """torchtitan's context parallelism (PyTorch's ring attention with its default all-gather
    rotation): the forward's gather of (cp - 1) K/V chunks hides only behind the first of cp
    attention steps, the backward gathers again and passes fp32 K/V gradients after every
    step, the last one waited for in full. The chunks hold the 8 kv heads, or all 32 query
    heads where torchtitan repeats K and V (before v0.2.2). Megatron-LM's p2p ring on the
    same links hides each chunk behind one step, never less. (v0.1 compiled: the next
    test.)"""
    job_tt = JobSpec(global_batch=8, seq_length=131072, framework="torchtitan",
                     repeat_kv=repeat_kv, compile=compiled)
    job_mg = JobSpec(global_batch=8, seq_length=131072)
    for inter in (45.0, 5.0):
        c = h100(8, inter)
        ex = {}
        for job in (job_tt, job_mg):
            plan = make_plan(l3, job, c, tp=2, pp=1, dp=1, cp=32, sequence_parallel=True,
                             zero=0)
            ev = Evaluator(l3, job, c, plan.shape)
            ring = ev.cp_ring(plan.placement, 0, 0)
            lt = ev.costs.layer_times(c.nodes[0].gpu, 360.0, cp_ring_gb_per_s=ring)
            lc = ev.costs.compute(c.nodes[0].gpu).layer()
            ex[job.framework] = (lt, lc, ring)
        lt, lc, ring = ex["torchtitan"]
        lat_ms = c.latency_us / 1e3
        # 131072 / 32 tokens; K and V of (32 or 8) heads x 128 / TP 2 each; 2 bytes
        heads = 32 if repeat_kv else 8
        chunk = 4096 * 2 * heads * 128 / 2 * 2
        step = chunk / (ring * 1e6) + lat_ms
        grad = 2 * chunk / (ring * 1e6) + lat_ms
        f, b = lc.fwd.ms["attention"] / 32, lc.bwd.ms["attention"] / 32
        assert lt.cp_comm_fwd_ms == pytest.approx(max(0.0, 31 * step - f))
        assert lt.cp_comm_bwd_ms == pytest.approx(
            max(0.0, 31 * step - b) + 31 * max(0.0, grad - b) + grad)
        assert lt.cp_comm_fwd_ms > 0
        mg = ex["megatron"][0]
        assert lt.cp_comm_fwd_ms > mg.cp_comm_fwd_ms and lt.cp_comm_bwd_ms > mg.cp_comm_bwd_ms
        # its "alltoall" rotation passes each chunk on beside one step, K/V and gradients
        # together in the backward: its forward never exposes more than the gather's (its
        # backward can, where the gather fits behind the first step and the gradients alone
        # behind the others)
        plan = make_plan(l3, job_tt, c, tp=2, pp=1, dp=1, cp=32, cp_alltoall=True,
                         sequence_parallel=True, zero=0)
        ev = Evaluator(l3, job_tt, c, plan.shape)
        a2a = ev.costs.layer_times(c.nodes[0].gpu, 360.0, cp_ring_gb_per_s=ring)
        assert a2a.cp_comm_fwd_ms == pytest.approx(31 * max(0.0, step - f))
        assert a2a.cp_comm_bwd_ms == pytest.approx(
            max(0.0, step - b) + 30 * max(0.0, step + grad - b) + max(0.0, grad - b) + grad)
        assert a2a.cp_comm_fwd_ms <= lt.cp_comm_fwd_ms * (1 + 1e-12)


def test_torchtitan_v01_compiled_cp_hides_no_exchange(l3):
    """torchtitan v0.1 compiled (repeat_kv marks the release): the ring loop is traced into
    the block's graph, each collective waited for at once, so the forward pays its (cp - 1)
    K/V chunks in full and the backward them again and every step's fp32 gradient pass;
    eager v0.1 and compiled v0.2 hide them behind the steps (the test above)."""
    c = h100(8, 45.0)
    out = {}
    for repeat_kv, compiled in ((True, True), (True, False), (False, True)):
        job = JobSpec(global_batch=8, seq_length=131072, framework="torchtitan",
                      repeat_kv=repeat_kv, compile=compiled)
        plan = make_plan(l3, job, c, tp=2, pp=1, dp=1, cp=32, sequence_parallel=True, zero=0)
        ev = Evaluator(l3, job, c, plan.shape)
        ring = ev.cp_ring(plan.placement, 0, 0)
        out[repeat_kv, compiled] = (ev.costs.layer_times(c.nodes[0].gpu, 360.0,
                                                         cp_ring_gb_per_s=ring), ring)
    lt, ring = out[True, True]
    lat_ms = c.latency_us / 1e3
    chunk = 4096 * 2 * 32 * 128 / 2 * 2  # the 32 repeated heads' K and V, TP 2, 2 bytes
    step = chunk / (ring * 1e6) + lat_ms
    grad = 2 * chunk / (ring * 1e6) + lat_ms
    assert lt.cp_comm_fwd_ms == pytest.approx(31 * step)
    assert lt.cp_comm_bwd_ms == pytest.approx(31 * step + 32 * grad)
    eager = out[True, False][0]
    assert lt.cp_comm_fwd_ms > eager.cp_comm_fwd_ms and lt.cp_comm_bwd_ms > eager.cp_comm_bwd_ms


@pytest.mark.parametrize("repeat_kv", [False, True])
def test_torchtitan_cp_backward_holds_the_gathered_kv(l3, repeat_kv):
    """A torchtitan stage under CP holds, during a layer's attention backward, the gathered
    K/V of all cp ranks (2 chunks with the alltoall rotation), the fp32 K/V gradient
    accumulators and the fp32 gradients in flight: (cp + 6) chunks. With nothing recomputed, that is the working memory of a stage that does
    not compute the loss; Megatron-LM's stage holds none of it."""
    c = h100(2)
    works = {}
    for fw, a2a in (("torchtitan", False), ("torchtitan", True), ("megatron", False)):
        job = JobSpec(global_batch=2, seq_length=131072, framework=fw,
                      repeat_kv=repeat_kv and fw == "torchtitan")
        plan = make_plan(l3, job, c, tp=1, pp=2, dp=1, cp=8, cp_alltoall=a2a, zero=0,
                         recompute="none")
        works[fw, a2a] = estimate(l3, job, c, plan).stages[0].memory.working_gib
    heads = 32 if repeat_kv else 8
    chunk = 131072 // 8 * 2 * heads * 128 * 2  # tokens x (K and V) x width x 2 bytes
    assert works["torchtitan", False] == pytest.approx((8 + 6) * chunk / 2**30)
    # the alltoall rotation holds the chunk in use and the next instead of all 8
    assert works["torchtitan", True] == pytest.approx((2 + 6) * chunk / 2**30)
    assert works["megatron", False] == 0.0


def test_breakdown_shows_the_cp_exchange_on_the_critical_path(l3):
    """One stage, no recompute: the critical path runs every micro-batch's F and B of every
    layer, so the breakdown's cp_exchange_ms is layers x micro-batches x the exposed exchange
    of one layer's forward and backward, taken out of the compute; the parts add up."""
    c = h100(8, 5.0)
    job = JobSpec(global_batch=4, seq_length=131072, framework="torchtitan", repeat_kv=True)
    plan = make_plan(l3, job, c, tp=2, pp=1, dp=1, cp=32, sequence_parallel=True, zero=0,
                     recompute="none")
    ev = Evaluator(l3, job, c, plan.shape)
    e = ev.estimate(plan.placement)
    lt = ev.costs.layer_times(c.nodes[0].gpu, 360.0,
                              cp_ring_gb_per_s=ev.cp_ring(plan.placement, 0, 0))
    assert e.breakdown_ms["cp_exchange_ms"] == pytest.approx(
        l3.num_layers * 4 * (lt.cp_comm_fwd_ms + lt.cp_comm_bwd_ms))
    assert e.breakdown_ms["cp_exchange_ms"] > e.breakdown_ms["compute_ms"]  # slow links
    assert sum(e.breakdown_ms.values()) == pytest.approx(e.iteration_ms)
    mg = JobSpec(global_batch=8, seq_length=8192)
    p1 = make_plan(l3, mg, c, tp=8, pp=1, dp=8, cp=1, sequence_parallel=True)
    assert "cp_exchange_ms" not in estimate(l3, mg, c, p1).breakdown_ms


def test_torchtitan_emit_warns_when_the_release_treats_kv_otherwise(l3):
    """The emitted release and the estimate disagree about repeating K and V: a warning
    names both (v0.1 repeats them; v0.2.2 does not)."""
    c = h100(2)
    for repeat_kv, version, warned in ((False, "0.2", False), (True, "0.1", False),
                                       (False, "0.1", True), (True, "0.2", True)):
        job = JobSpec(global_batch=8, seq_length=65536, framework="torchtitan",
                      repeat_kv=repeat_kv)
        plan = make_plan(l3, job, c, tp=4, pp=1, dp=1, cp=4, sequence_parallel=True, zero=3)
        warn = [w for w in torchtitan_config(l3, job, c, plan, version)[1]
                if "[attention]" in w]
        assert bool(warn) == warned, (repeat_kv, version, warn)
        if warned:  # compiled (the default): v0.1 hides none of the exchange, said too
            assert "4x in bytes" in warn[0] and "hides none of it" in warn[0]


def test_kv_rotation_is_torchtitans_choice_and_searched_for_it(l3, tmp_path):
    """Shape.cp_alltoall: torchtitan's to choose under CP, refused in one line elsewhere; the
    search tries both rotations for torchtitan CP shapes only; the TOML names the one chosen;
    a plan file keeps it, and one written before it existed reads as the default."""
    c = h100(2)
    tt = JobSpec(global_batch=8, seq_length=65536, framework="torchtitan")
    mg = JobSpec(global_batch=8, seq_length=65536)
    for job, kw in ((mg, dict(cp=4)), (tt, dict(cp=1))):
        with pytest.raises(SpecError) as e:
            make_plan(l3, job, c, tp=4, pp=1, cp_alltoall=True, sequence_parallel=True,
                      zero=3 if job is tt else 0, **kw)
        assert e.value.field == "cp_alltoall"
    space = SearchSpace(tp=(4,), pp=(1,), micro_batch=(1,), recompute=("full",))
    rot = {(sh.cp, sh.cp_alltoall) for sh in enumerate_shapes(l3, tt, c, space)}
    assert {(4, False), (4, True), (1, False)} <= rot and (1, True) not in rot
    assert {a for _, a in ((sh.cp, sh.cp_alltoall)
                           for sh in enumerate_shapes(l3, mg, c, space))} == {False}
    only = SearchSpace(tp=(4,), pp=(1,), micro_batch=(1,), recompute=("full",),
                       cp_alltoall=(True,))
    assert all(sh.cp_alltoall for sh in enumerate_shapes(l3, tt, c, only) if sh.cp > 1)
    plan = make_plan(l3, tt, c, tp=4, pp=1, dp=1, cp=4, cp_alltoall=True,
                     sequence_parallel=True, zero=3)
    assert "kv-alltoall" in plan.shape.describe()
    par = torchtitan_config(l3, tt, c, plan)[0]["parallelism"]
    assert par["context_parallel_rotate_method"] == "alltoall"
    from formats.planfile import load_plan, save_plan
    tmp = tmp_path / "p.json"
    save_plan(tmp, l3, tt, c, plan, estimate(l3, tt, c, plan))
    assert load_plan(tmp)[3].shape.cp_alltoall is True
    d = json.loads(tmp.read_text())
    del d["plan"]["shape"]["cp_alltoall"]
    tmp.write_text(json.dumps(d))
    # schema 3 writes every shape field: one left out is refused (it had been read as its
    # default); a schema 2 file may predate the field
    with pytest.raises(SpecError) as e:
        load_plan(tmp)
    assert e.value.field == "plan.shape.cp_alltoall" and "missing" in str(e.value)
    d["schema_version"] = 2
    tmp.write_text(json.dumps(d))
    assert load_plan(tmp)[3].shape.cp_alltoall is False


def test_torchtitan_cp_solve_weighs_both_rotations(l3):
    """A torchtitan long-context solve considers both K/V rotations of every CP shape, and
    the plan it returns re-evaluates to its objective."""
    job = JobSpec(global_batch=4, seq_length=131072, framework="torchtitan", repeat_kv=True)
    c = h100(2, 5.0)
    space = SearchSpace(tp=(2,), pp=(1,), micro_batch=(1,), schedules=(("1f1b", 1),),
                        recompute=("full",))
    res = solve(l3, job, c, time_limit_s=30, space=space)
    described = {x.describe for x in res.candidates}
    cp_shapes = [d for d in described if "CP=" in d]
    assert any("kv-alltoall" in d for d in cp_shapes)
    assert any("kv-alltoall" not in d for d in cp_shapes)
    e = estimate(l3, job, c, res.plan)
    assert e.iteration_ms == pytest.approx(res.objective_ms, rel=1e-9)


@pytest.mark.parametrize("jk,pk,msg", [
    (dict(seq_length=32768 + 8), dict(tp=2, cp=4, sequence_parallel=True), "2 x CP x TP"),
    (dict(seq_length=32768, attention="eager"), dict(tp=2, cp=4), "attention = flash"),
    (dict(seq_length=32768, framework="deepspeed"), dict(tp=2, cp=4), "framework"),
])
def test_cp_rules_are_clear_errors(l3, jk, pk, msg):
    job = JobSpec(global_batch=8, **jk)
    with pytest.raises(SpecError) as e:
        make_plan(l3, job, h100(1), pp=1, **pk)
    assert msg in str(e.value) and e.value.field == "cp"


def test_cp_enumerated_only_for_long_sequences(l3):
    c = h100(2)
    short = {sh.cp for sh in enumerate_shapes(l3, JobSpec(global_batch=16, seq_length=8192), c)}
    long_ = {sh.cp for sh in enumerate_shapes(l3, JobSpec(global_batch=16, seq_length=32768),
                                              c, SearchSpace(tp=(8,)))}
    assert short == {1} and {1, 2} <= long_
    # the user may ask for it at any length
    asked = {sh.cp for sh in enumerate_shapes(l3, JobSpec(global_batch=16, seq_length=8192), c,
                                              SearchSpace(cp=(2,)))}
    assert asked == {2}


def test_long_context_solve_picks_cp_and_lists_every_rejected_plan_without_it(l3):
    """Llama-3 8B, 128k tokens, 8 sequences, 64 H100: the chosen plan has CP > 1 and fits;
    every plan without context parallelism is either listed with the stage that overflows or
    bounded above the chosen plan's time."""
    job = JobSpec(global_batch=8, seq_length=131072)
    c = h100(8)
    space = SearchSpace(micro_batch=(1,), schedules=(("1f1b", 1),), recompute=("none", "full"),
                        zero=(1,))
    res = solve(l3, job, c, time_limit_s=60, space=space)
    assert res.plan.shape.cp > 1 and res.estimate.fits
    # one cost model: the solver's objective is the estimator's time of its plan
    assert estimate(l3, job, c, res.plan).iteration_ms == pytest.approx(res.objective_ms)
    no_cp = [s for s in enumerate_shapes(l3, job, c, space) if s.cp == 1]
    status = {x.describe: x for x in res.candidates}
    misfits = 0
    for sh in no_cp:
        x = status[sh.describe()]
        if x.status.startswith("does not fit"):
            misfits += 1
            assert "stage" in x.status and "GiB" in x.status
        else:
            assert max(x.lower_bound_ms, x.best_ms or 0.0) >= res.objective_ms * (1 - 1e-9)
    assert misfits >= len(no_cp) // 3
    # the report of a CP plan prints with and without misfits among the candidates (a short
    # limit can leave none screened: the table of plans without CP once raised then)
    import dataclasses

    import render
    for cands in (res.candidates, [x for x in res.candidates
                                   if not x.status.startswith("does not fit")]):
        render.print_solve(dataclasses.replace(res, candidates=cands), c)


# ---------------------------------------------------------------------------------------------
# emitted configurations and rank groups


def test_frameworks_get_the_cp_degree(l3):
    job = JobSpec(global_batch=8, seq_length=65536)
    c = h100(2)
    plan = make_plan(l3, job, c, tp=4, pp=1, dp=1, cp=4, sequence_parallel=True, zero=1)
    a = megatron_args(l3, job, plan)[0]
    assert a[a.index("--context-parallel-size") + 1] == "4"
    assert nemo_config(l3, job, c, plan)[0]["model"]["context_parallel_size"] == 4
    job_tt = JobSpec(global_batch=8, seq_length=65536, framework="torchtitan")
    plan_tt = make_plan(l3, job_tt, c, tp=4, pp=1, dp=1, cp=4, sequence_parallel=True, zero=3)
    par = torchtitan_config(l3, job_tt, c, plan_tt)[0]["parallelism"]
    assert par["context_parallel_degree"] == 4 and par["data_parallel_shard_degree"] == 1
    assert par["context_parallel_rotate_method"] == "allgather"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rank_mapping_realises_cp_and_dp_groups(l3, seed, tmp_path, megatron_groups):
    """Ranks from the emitted ranks.json, grouped by Megatron's rule (order tp-cp-ep-dp-pp),
    land on exactly the GPUs of the plan's CP groups and data-parallel groups, for shuffled
    node orders."""
    job = JobSpec(global_batch=16, seq_length=32768)
    c = h100(8)
    tp, pp, dp, cp = 2, 2, 4, 4
    rng = np.random.default_rng(seed)
    order = [int(x) for x in rng.permutation(8)]
    pl = block_placement(c, tp, pp, dp * cp, 1, node_order=order)
    base = make_plan(l3, job, c, tp=tp, pp=pp, dp=dp, cp=cp, sequence_parallel=True, zero=1)
    plan = Plan(base.shape, pl)
    estimate(l3, job, c, plan)  # a valid plan
    emit("megatron", l3, job, c, plan, tmp_path)
    doc = json.loads((tmp_path / "ranks.json").read_text())
    names = {nd.name: i for i, nd in enumerate(c.nodes)}
    where = {}
    for row in doc["nodes"]:
        for r in row["ranks"]:
            where[r["rank"]] = (names[row["node"]], r["gpu"])
    world = tp * pp * dp * cp
    sizes = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    got_cp = {frozenset(where[q] for q in g)
              for g in megatron_groups(world, sizes, "tp-cp-ep-dp-pp", "cp")}
    got_dp = {frozenset(where[q] for q in g)
              for g in megatron_groups(world, sizes, "tp-cp-ep-dp-pp", "dp")}
    want_cp, want_dp = set(), set()
    for s in range(pp):
        for i in range(tp):
            for d in range(dp):
                want_cp.add(frozenset((pl.node[s][d * cp + k], pl.gpus[s][d * cp + k][i])
                                      for k in range(cp)))
            for k in range(cp):
                want_dp.add(frozenset((pl.node[s][d * cp + k], pl.gpus[s][d * cp + k][i])
                                      for d in range(dp)))
    assert got_cp == want_cp and got_dp == want_dp
    assert rank_mapping(c, plan)[0] is not None


def test_torchtitan_emits_hsdp_degrees(l3):
    job = JobSpec(global_batch=32, seq_length=8192, framework="torchtitan")
    c = h100(4)
    plan = make_plan(l3, job, c, tp=1, pp=1, zero=3, shard_size=8)
    par = torchtitan_config(l3, job, c, plan)[0]["parallelism"]
    assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (8, 4)
    toml = tomllib.loads("\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in par.items()
                                   if not isinstance(v, list)))
    assert toml["data_parallel_shard_degree"] == 8


def test_deepspeed_reports_what_it_cannot_express(l3, tmp_path):
    """A plan made for Megatron-LM with CP, emitted for DeepSpeed: the CP is reported, not
    dropped."""
    job = JobSpec(global_batch=8, seq_length=65536)
    c = h100(2)
    plan = make_plan(l3, job, c, tp=4, pp=1, dp=1, cp=4, sequence_parallel=True, zero=1)
    _files, warn = emit("deepspeed", l3, job, c, plan, tmp_path)
    assert any("context parallelism (CP=4)" in w for w in warn)


def test_cp_on_a_measured_cluster_is_annealed_with_a_valid_bound(l3):
    """On a cluster whose links differ the MILP does not cover CP: the annealer searches where
    the CP groups sit, the closed-form bound certifies, and the status names the reason."""
    from formats.clusters import SynthParams, synth_cluster
    c = synth_cluster(SynthParams(num_nodes=4, gpus_per_node=8, gpu="H100-SXM-80GB",
                                  nic_gb_per_s=5.0, seed=3))
    job = JobSpec(global_batch=4, seq_length=32768)
    res = solve(l3, job, c, method="exact", time_limit_s=5,
                space=SearchSpace(tp=(4,), cp=(2, 4), micro_batch=(1,),
                                  schedules=(("1f1b", 1),), recompute=("none",), zero=(1,)))
    assert res.plan.shape.cp in (2, 4)
    assert 0 < res.bound_ms <= res.objective_ms * (1 + 1e-9)
    assert estimate(l3, job, c, res.plan).iteration_ms == pytest.approx(res.objective_ms)
    assert any("context parallelism" in why for why in res.not_covered)
