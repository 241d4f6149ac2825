"""Brute-force oracle for tiny instances: every permutation of nodes over slots, every layer
split. Slow on purpose; tests compare the MILP and the annealer with it."""

from __future__ import annotations

import itertools
import time

from .problem import PlacementProblem
from .result import PlacementResult


def brute_force(prob: PlacementProblem, max_evals: int = 200_000) -> PlacementResult:
    t0 = time.perf_counter()
    splits = [s for s in prob.all_splits() if prob.fits(s)]
    perms = list(itertools.permutations(range(prob.num_slots)))
    if len(splits) * len(perms) > max_evals:
        raise ValueError(f"{len(splits) * len(perms)} evaluations exceed max_evals={max_evals}")
    best, arg = float("inf"), None
    for lay in splits:
        for p in perms:
            c = prob.cost(p, lay)
            if c < best:
                best, arg = c, (p, lay)
    if arg is None:
        return PlacementResult(None, float("inf"), float("inf"), "infeasible", "brute",
                               time.perf_counter() - t0)
    return PlacementResult(prob.plan(*arg), best, best, "optimal", "brute",
                           time.perf_counter() - t0, iterations=len(splits) * len(perms))
