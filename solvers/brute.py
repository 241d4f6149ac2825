"""Enumeration of a block's whole space: every permutation of nodes over slots, every layer
split. The tests' oracle for tiny instances, and the exact method's answer for blocks small
enough (`enumerable`): there it replaces the annealing warm start and the MILP, which on a
4-node, 2-GPU cluster spend 0.6 s a block where the enumeration takes milliseconds."""

from __future__ import annotations

import itertools
import math
import time

from model import work

from .problem import PlacementProblem
from .result import PlacementResult

# the exact method enumerates a block whose space (slot permutations x splits with a layer in
# every virtual stage, before the memory filter) is at most ENUMERATE_MAX_EVALS placements and
# ENUMERATE_MAX_SPLITS splits (each split builds an evaluator): ~30 us an evaluation on the
# development machine, 0.46 work-s at the meter's price (model.work)
ENUMERATE_MAX_EVALS = 2000
ENUMERATE_MAX_SPLITS = 128
# the deadline is looked at every this many evaluations
_CHECK_EVERY = 64


def space_size(prob: PlacementProblem) -> tuple[int, int]:
    """(slot permutations, splits) brute_force walks (splits before the memory filter)."""
    L, V = prob.model.num_layers, prob.shape.num_virtual
    return math.factorial(prob.num_slots), math.comb(L - 1, V - 1)


def enumerable(prob: PlacementProblem) -> bool:
    """Whether the exact method enumerates this block (`ENUMERATE_MAX_EVALS` placements and
    `ENUMERATE_MAX_SPLITS` splits at most)."""
    if prob.num_slots > 8:  # 9! alone is past the limit; no factorial of a large number
        return False
    perms, splits = space_size(prob)
    return splits <= ENUMERATE_MAX_SPLITS and perms * splits <= ENUMERATE_MAX_EVALS


def brute_force(prob: PlacementProblem, max_evals: int = 200_000,
                deadline_s: float | None = None) -> PlacementResult:
    """The block's optimum over every placement and split ("optimal", bound = objective), or
    with `deadline_s` (on model.work's clock) passed, the best seen ("time_limit", bound the
    shape's closed-form bound)."""
    t0 = time.perf_counter()
    splits = [s for s in prob.all_splits() if prob.fits(s)]
    perms = math.factorial(prob.num_slots)
    if perms * len(splits) > max_evals:
        raise ValueError(f"{perms * len(splits)} evaluations exceed max_evals={max_evals}")
    best, arg, n = float("inf"), None, 0
    for lay in splits:
        for p in itertools.permutations(range(prob.num_slots)):
            n += 1
            if deadline_s is not None and n % _CHECK_EVERY == 0 and work.now() >= deadline_s:
                return PlacementResult(None if arg is None else prob.plan(*arg), best,
                                       prob.lower_bound_ms(), "time_limit", "enumeration",
                                       time.perf_counter() - t0, iterations=n)
            c = prob.cost(p, lay)
            if c < best:
                best, arg = c, (p, lay)
    if arg is None:
        return PlacementResult(None, float("inf"), float("inf"), "infeasible", "enumeration",
                               time.perf_counter() - t0)
    return PlacementResult(prob.plan(*arg), best, best, "optimal", "enumeration",
                           time.perf_counter() - t0, iterations=n)
