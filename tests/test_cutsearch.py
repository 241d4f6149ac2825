"""solvers.cutsearch: the critical-path surrogate and the iterated local search on it."""

import dataclasses
import itertools
import time

import numpy as np
import pytest

from model.estimator import estimate
from model.plan import Shape
from model.specs import JobSpec, ModelSpec, Options
from solvers.anneal import anneal
from solvers.cutsearch import PathSurrogate, neighbourhood, path_search
from solvers.problem import PlacementProblem
from solvers.space import blocks_for

from test_construct import problem as llama_problem
from test_solvers import TINY, tiny_cluster


TINY16 = ModelSpec("tiny16", 16, 2048, 16, 16, 8192, 32000, 2048)
LAYOUTS = ("1f1b", "two stages per node", "interleaved")


def tiny_pipeline(seed: int, gbs: int = 24, layout: str = "1f1b",
                  tied: bool = False) -> PlacementProblem:
    """6 nodes of 2 GPUs on slow, uneven links, one pipeline: TP=2 PP=6 (one stage per node),
    TP=1 PP=12 (two stages per node) or TP=2 PP=6 interleaved over 2 chunks; `tied`: the
    model's input and output embeddings tied (the first and last stage all-reduce its
    gradient over the link between their nodes)."""
    c = tiny_cluster(6, seed)
    if layout == "two stages per node":
        sh, model, j = Shape(tp=1, pp=12, dp=1, micro_batch=1), TINY16, 2
    else:
        v = 2 if layout == "interleaved" else 1
        sh = Shape(tp=2, pp=6, dp=1, micro_batch=1, sequence_parallel=True,
                   schedule="interleaved" if v > 1 else "1f1b", chunks=v)
        model, j = (TINY16 if v > 1 else TINY), 1
    blk = next(b for b in blocks_for(c, sh) if b.j == j and b.D == 1)
    if tied:
        model = dataclasses.replace(model, tied_embeddings=True)
    return PlacementProblem(model, JobSpec(global_batch=gbs, seq_length=2048), c, sh, blk,
                            Options())


@pytest.mark.parametrize("seed,gbs,layout,tied", [
    (0, 24, "1f1b", False), (1, 24, "1f1b", False), (2, 96, "1f1b", False),
    (0, 24, LAYOUTS[1], False), (1, 24, LAYOUTS[2], False),
    (0, 24, "1f1b", True), (1, 24, LAYOUTS[1], True), (2, 24, LAYOUTS[2], True)])
def test_surrogate_is_below_the_estimator_and_exact_where_traced(seed, gbs, layout, tied):
    """Over all 720 placements: the surrogate never exceeds the estimator's time, and equals
    it on every placement whose critical path it has traced (with tied embeddings too, whose
    all-reduce between the first and last stage's nodes is a term of its own)."""
    prob = tiny_pipeline(seed, gbs, layout, tied)
    lay = prob.start_layers()
    perms = np.array(list(itertools.permutations(range(6))))
    sur = PathSurrogate.build(prob, lay, list(perms[0]))
    assert sur is not None
    rng = np.random.default_rng(seed)
    for i in rng.choice(len(perms), 12, replace=False):
        sur.add_cut(list(perms[i]))
    true = np.array([prob.cost(list(p), lay) for p in perms])
    s = sur.score(perms)
    assert (s <= true * (1 + 1e-12)).all()
    traced = np.isclose(s, true, rtol=1e-12, atol=0)
    assert traced.sum() >= 13  # the traced ones at least
    assert (s < true * (1 - 1e-6)).any()  # and it is a bound, not the estimator itself


def test_surrogate_on_a_measured_matrix_of_12_nodes():
    """Llama-2 7B on 12 nodes of random links: below the estimator on random placements,
    exact on the traced one."""
    rng = np.random.default_rng(3)
    bw = rng.uniform(5, 25, (12, 12))
    np.fill_diagonal(bw, 0.0)
    prob = llama_problem(bw, dp=1)
    lay = prob.start_layers()
    sur = PathSurrogate.build(prob, lay, list(range(12)))
    for _ in range(50):
        p = rng.permutation(12)
        t = prob.cost(list(p), lay)
        assert sur.score(p[None, :])[0] <= t * (1 + 1e-12)
        sur.add_cut(list(p))
        assert sur.score(p[None, :])[0] == pytest.approx(t, rel=1e-12)


def test_neighbourhood_holds_every_swap_reversal_and_segment_move_once():
    nb = neighbourhood(6)
    assert len({tuple(r) for r in nb}) == len(nb)
    assert all(sorted(r) == list(range(6)) for r in nb)
    assert list(range(6)) not in nb.tolist()
    assert [0, 4, 2, 3, 1, 5] in nb.tolist()  # swap
    assert [0, 4, 3, 2, 1, 5] in nb.tolist()  # reversal
    assert [0, 3, 4, 1, 2, 5] in nb.tolist()  # segment (1, 2) moved after 4
    assert [0, 3, 4, 2, 1, 5] in nb.tolist()  # the same, reversed


@pytest.mark.parametrize("seed,layout", [(0, "1f1b"), (1, "1f1b"), (2, "1f1b"),
                                         (2, LAYOUTS[1]), (0, LAYOUTS[2])])
def test_path_search_reaches_the_enumerated_optimum(seed, layout):
    """Fixed split, all 720 placements enumerated: the search returns the best of them, and
    its time is the estimator's time of the plan it returns."""
    prob = tiny_pipeline(seed, layout=layout)
    lay = prob.start_layers()
    best = min(prob.cost(list(p), lay) for p in itertools.permutations(range(6)))
    perm, got, ms = path_search(prob, lay, list(range(6)),
                                deadline_s=time.perf_counter() + 30, seed=seed, max_kicks=10,
                                move_layers=False)
    assert got == lay
    assert ms == prob.cost(perm, lay)
    assert ms == pytest.approx(best, rel=1e-12)
    plan = prob.plan(perm, lay)
    assert estimate(prob.model, prob.job, prob.cluster, plan).iteration_ms == \
        pytest.approx(ms)


def test_clock_annealing_on_one_pipeline_keeps_its_time():
    """anneal(iters=None) takes the path search on a pipeline; it returns within its budget
    and its plan re-evaluates to its objective."""
    prob = tiny_pipeline(0)
    t = time.perf_counter()
    r = anneal(prob, seed=0, iters=None, time_limit_s=0.5)
    assert time.perf_counter() - t < 0.5 + 0.2
    assert estimate(TINY, prob.job, prob.cluster, r.plan).iteration_ms == \
        pytest.approx(r.objective_ms)


def test_surrogate_applies_only_to_one_pipeline_of_interchangeable_nodes():
    prob = tiny_pipeline(0)
    assert PathSurrogate.applies(prob)
    c = tiny_cluster(4, 0)
    sh = Shape(tp=2, pp=2, dp=2, micro_batch=1, sequence_parallel=True)
    for blk in blocks_for(c, sh):  # two replicas, or fewer than 3 node-stages
        p = PlacementProblem(TINY, JobSpec(global_batch=16, seq_length=2048), c, sh, blk,
                             Options())
        assert not PathSurrogate.applies(p)


def test_three_slots_end_after_one_descent():
    """3 slots: the neighbourhood holds every other permutation; no kick (which needs 4)."""
    rng = np.random.default_rng(0)
    bw = rng.uniform(5, 25, (3, 3))
    np.fill_diagonal(bw, 0.0)
    prob = llama_problem(bw, dp=1)
    lay = prob.start_layers()
    best = min(prob.cost(list(p), lay) for p in itertools.permutations(range(3)))
    perm, _, ms = path_search(prob, lay, [0, 1, 2], deadline_s=time.perf_counter() + 10,
                              move_layers=False)
    assert ms == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_path_search_with_split_moves_reaches_the_brute_force_optimum(seed):
    """Placements and splits together (every split of 8 layers over 6 stages x 720
    placements, solvers.brute): the search with layer kicks returns the optimum."""
    from solvers.brute import brute_force

    prob = tiny_pipeline(seed)
    best = brute_force(prob).objective_ms
    perm, lay, ms = path_search(prob, prob.start_layers(), list(range(6)),
                                deadline_s=time.perf_counter() + 30, seed=seed, max_kicks=80)
    assert ms == prob.cost(perm, lay)
    assert ms == pytest.approx(best, rel=1e-12)
