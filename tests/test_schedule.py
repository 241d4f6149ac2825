"""The schedule graph: closed forms for uniform stages, agreement with networkx."""

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from model.schedule import compile_schedule, stage_order


def uniform(cs, f, b):
    K = cs.kinds
    d = np.zeros(K.size)
    d[:K.V] = f / cs.v
    d[K.V:2 * K.V] = b / cs.v
    return d


@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize("p,m", [(1, 4), (2, 4), (4, 8), (4, 16), (8, 8), (12, 64)])
def test_1f1b_and_gpipe_closed_form(p, m, blocking):
    for sched in ("1f1b", "gpipe"):
        cs = compile_schedule(sched, p, m, 1, blocking)
        assert cs.longest_path(uniform(cs, 1.0, 2.0)) == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (8, 16, 3), (12, 48, 2)])
def test_interleaved_bubble_is_one_over_v(p, m, v, blocking):
    cs = compile_schedule("interleaved", p, m, v, blocking)
    f, b = 1.0, 2.0
    assert cs.longest_path(uniform(cs, f, b)) == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)


def test_1f1b_in_flight_counts():
    cs = compile_schedule("1f1b", 4, 8, 1, True)
    for s in range(4):
        peak = max(int(c[0]) for _k, _c, c in cs.inflight_profile(s))
        assert peak == min(4 - s, 8)
    gp = compile_schedule("gpipe", 4, 8, 1, True)
    assert max(int(c[0]) for _k, _c, c in gp.inflight_profile(2)) == 8


def test_interleaved_in_flight_matches_megatron_warmup():
    p, m, v = 4, 8, 2
    cs = compile_schedule("interleaved", p, m, v, True)
    for s in range(p):
        peak = max(int(c.sum()) for _k, _c, c in cs.inflight_profile(s))
        assert peak == min((p - s - 1) * 2 + (v - 1) * p + 1, m * v)


def test_every_op_appears_once():
    for sched, v in (("1f1b", 1), ("gpipe", 1), ("interleaved", 2)):
        for s in range(4):
            ops = stage_order(sched, 4, 8, v, s)
            assert sorted(ops) == sorted({(k, mb, c) for k in "FB" for mb in range(8)
                                          for c in range(v)})


@settings(max_examples=40, deadline=None)
@given(sched=st.sampled_from(["1f1b", "gpipe", "interleaved"]), p=st.integers(2, 5),
       mult=st.integers(1, 3), blocking=st.booleans(), seed=st.integers(0, 10**6))
def test_fast_recurrence_equals_networkx(sched, p, mult, blocking, seed):
    v = 2 if sched == "interleaved" else 1
    m = p * mult
    cs = compile_schedule(sched, p, m, v, blocking)
    d = np.random.default_rng(seed).uniform(0.1, 3.0, cs.kinds.size)
    fast = cs.longest_path(d)
    ref = nx.dag_longest_path_length(cs.to_networkx(d))
    length, counts, _ = cs.critical_path(d)
    assert fast == pytest.approx(ref, rel=1e-12)
    assert length == pytest.approx(fast, rel=1e-12)
    assert counts @ d == pytest.approx(fast, rel=1e-9)


def test_blocking_puts_transfers_on_the_critical_path():
    """Pipette's point: with blocking send/recv, every 1F1B cycle pays the transfer."""
    p, m = 4, 32
    blk = compile_schedule("1f1b", p, m, 1, True)
    ovl = compile_schedule("1f1b", p, m, 1, False)
    d = uniform(blk, 1.0, 2.0)
    K = blk.kinds
    for h in range(p - 1):
        d[K.xf(h)] = d[K.xb(h)] = 0.1
    t_blk, t_ovl = blk.longest_path(d), ovl.longest_path(d)
    assert t_blk > t_ovl
    _, counts, _ = blk.critical_path(d)
    assert counts[2 * K.V:2 * K.V + 2 * p].sum() >= m  # at least one transfer per micro-batch


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)]),
       st.integers(2, 5), st.integers(1, 3), st.booleans(), st.integers(0, 10**6))
def test_compiled_walks_equal_python_walks(sched_v, p, mult, blocking, seed):
    """model/_walk_kernels.py (numba) gives the Python walks' results bit for bit: the critical
    path's length and nodes, every stage's tail start, and the batched walk (ties included:
    durations drawn from a few values, zeros among them)."""
    from model import walk_jit
    sched, v = sched_v
    cs = compile_schedule(sched, p, mult * p, v, blocking)
    rng = np.random.default_rng(seed)
    durs = rng.choice([0.0, 0.5, 1.0, 1.7, 3.0], size=(3, cs.kinds.size))
    assert walk_jit.load(), walk_jit._state["error"]
    saved = walk_jit._state["kernels"]
    out = {}
    for mode in ("python", "compiled"):
        walk_jit._state["kernels"] = None if mode == "python" else saved
        try:
            out[mode] = [(cs.critical_path(d)[0], cs.critical_path(d)[2], cs.tail_starts(d),
                          cs.longest_path(d)) for d in durs] + [
                cs.tail_starts_batch(durs).tolist()]
        finally:
            walk_jit._state["kernels"] = saved
    assert out["python"] == out["compiled"]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)]),
       st.integers(2, 5), st.integers(1, 4), st.integers(0, 10**6))
def test_memory_moments_keep_every_peak(sched_v, p, mult, seed):
    """The moments `memory_moments` drops never hold the peak: for any non-negative bytes per
    stored micro-batch of each chunk and working memory of a backward, the largest memory over
    the kept moments equals the largest over all of `inflight_profile`; and fewer are kept
    whenever some moment is dominated."""
    sched, v = sched_v
    cs = compile_schedule(sched, p, mult * p, v, False)
    rng = np.random.default_rng(seed)
    for s in range(p):
        every = cs.inflight_profile(s)
        kept = cs.memory_moments(s)
        assert 1 <= len(kept) <= len(every)
        for _ in range(5):
            act = rng.choice([0.0, 0.3, 1.0, 2.5], size=v)
            work = float(rng.choice([0.0, 0.7, 4.0]))

            def mem(kind, counts):
                return float(np.asarray(counts, dtype=float) @ act) + (work if kind == "B"
                                                                        else 0.0)
            assert max(mem(k, c) for k, c in kept) == max(mem(k, c) for k, _ch, c in every)
