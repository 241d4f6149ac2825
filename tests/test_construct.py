"""solvers.construct: the constructed start for the annealer (rings and pipelines of fast links)."""

import dataclasses

import numpy as np
import pytest

from formats.clusters import uniform_cluster
from model.plan import Shape
from model.specs import JobSpec, Options
from formats import presets
from solvers import construct
from solvers.anneal import anneal
from solvers.problem import PlacementProblem
from solvers.space import blocks_for


def problem(bw: np.ndarray, dp: int, tp: int = 8):
    """Llama-2 7B, one pipeline stage per node, on a cluster with the node matrix `bw`."""
    n = bw.shape[0]
    model = presets.model("llama2-7b")
    job = JobSpec(global_batch=8 * dp, seq_length=model.seq_length, precision="bf16")
    c = dataclasses.replace(uniform_cluster(n, 8, "A100-80GB", 240.0, 23.0),
                            inter_gb_per_s=bw, source="test")
    pp = n * 8 // (tp * dp)
    shape = Shape(tp=tp, pp=pp, dp=dp, micro_batch=1, schedule="1f1b", chunks=1, layers=(),
                  recompute="none", sequence_parallel=True, distributed_optimizer=False)
    blk = next(b for b in blocks_for(c, shape) if b.j == 1)
    return PlacementProblem(model, job, c, shape, blk, Options())


def planted(n: int, length: int, seed: int, cyclic: bool):
    """Every link 5 GB/s except those of hidden sequences of `length` nodes (25 GB/s; cyclic:
    rings, else paths in both directions), the nodes shuffled."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    bw = np.full((n, n), 5.0)
    for start in range(0, n, length):
        seq = order[start:start + length]
        for i in range(len(seq) - (0 if cyclic else 1)):
            a, b = seq[i], seq[(i + 1) % len(seq)]
            bw[a, b] = 25.0
            if not cyclic:
                bw[b, a] = 25.0
    np.fill_diagonal(bw, 0.0)
    return bw


def ring_bottlenecks(perm, bw, A, D):
    rows = np.asarray(perm).reshape(A, D)
    return [float(bw[r, np.roll(r, -1)].min()) for r in rows]


@pytest.mark.parametrize("seed", range(3))
def test_planted_rings_are_found(seed):
    """8 hidden rings of 8 nodes with fast links: every constructed ring runs on them only."""
    bw = planted(64, 8, seed, cyclic=True)
    prob = problem(bw, dp=8)
    perm = construct.constructed_perm(prob)
    assert sorted(perm) == list(range(64))
    assert ring_bottlenecks(perm, bw, prob.block.A, prob.block.D) == [25.0] * 8
    ident = list(range(64))
    assert prob.cost(perm, prob.start_layers()) < prob.cost(ident, prob.start_layers())


@pytest.mark.parametrize("seed", range(3))
def test_planted_pipeline_is_found(seed):
    """One hidden path of 16 nodes with fast links both ways: the constructed pipeline uses
    only those."""
    bw = planted(16, 16, seed, cyclic=False)
    prob = problem(bw, dp=1)
    perm = construct.constructed_perm(prob)
    hops = [min(bw[a, b], bw[b, a]) for a, b in zip(perm, perm[1:])]
    assert min(hops) == 25.0


def test_swaps_only_improve_and_stop_within_their_budget():
    """The swap phase never lowers (slowest ring, sum of rings) below the greedy rings', and it
    stops after max_steps."""
    rng = np.random.default_rng(7)
    bw = np.round(rng.uniform(5, 25, size=(96, 96)), 2)
    np.fill_diagonal(bw, 0.0)
    greedy = construct._greedy_rows(bw, 6, 16)
    climbed = construct._climb(greedy, bw, cyclic=True, max_steps=10_000, deadline_s=None)
    assert sorted(climbed.ravel()) == list(range(96))

    def key(rows):
        m = [bw[r, np.roll(r, -1)].min() for r in rows]
        return (min(m), sum(m))

    assert key(climbed) > key(greedy)
    one = construct._climb(greedy, bw, cyclic=True, max_steps=1, deadline_s=None)
    assert (one != greedy).sum() == 2  # exactly one swap
    assert key(greedy) < key(one) <= key(climbed)


def test_anneal_starts_from_the_better_start():
    """On 128 random nodes (DP 16) the annealer with the constructed start beats, at the same
    few moves, the chain from the identity."""
    rng = np.random.default_rng(3)
    bw = np.round(rng.uniform(5, 25, size=(128, 128)), 2)
    np.fill_diagonal(bw, 0.0)
    prob = problem(bw, dp=16)
    lay = prob.start_layers()
    with_start = anneal(prob, seed=0, iters=50, restarts=1, polish=False)
    from_identity = anneal(prob, seed=0, iters=50, restarts=1, polish=False,
                           init_perm=list(range(128)))
    built = construct.constructed_perm(prob)
    assert with_start.objective_ms <= prob.cost(built, lay)
    assert with_start.objective_ms < 0.95 * from_identity.objective_ms
