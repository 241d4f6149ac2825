"""Pipette's simulated annealing as published, for side-by-side comparisons (bench/).

Yim et al. 2024 (Pipette, DATE), Sec. IV-C: simulated annealing over the node-to-stage
assignment with the moves swap, 2-opt, insert, insert-route and insert-reversed, Metropolis
acceptance, initial temperature T0 = 1 and geometric cooling alpha = 0.999 per move. The layer
split is the one the search starts from (time-balanced if it fits, else memory-balanced): the
paper anneals the assignment only. Scored by the same cost model as every solver here
(`PlacementProblem.cost`), with the cost in seconds (the unit of Pipette's latency estimates,
so that T0 = 1 means what it meant there). Runs until the time limit; returns the best seen.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .anneal import perm_move
from .problem import PlacementProblem
from .result import PlacementResult

T0 = 1.0
ALPHA = 0.999


def paper_sa(prob: PlacementProblem, *, seed: int = 0, time_limit_s: float = 10.0
             ) -> PlacementResult:
    t_start = time.perf_counter()
    rng = np.random.default_rng(seed)
    n = prob.num_slots
    perm = list(range(n))
    layers = prob.start_layers()
    cur = prob.cost(perm, layers) / 1e3
    best, best_perm = cur, list(perm)
    temp = T0
    moves = 0
    while n > 1 and time.perf_counter() - t_start < time_limit_s:
        moves += 1
        cand = perm_move(rng, perm, rng.random())
        c = prob.cost(cand, layers) / 1e3
        if c <= cur or (math.isfinite(c) and rng.random() < math.exp(-(c - cur) / temp)):
            perm, cur = cand, c
            if c < best:
                best, best_perm = c, list(cand)
        temp *= ALPHA
    if not math.isfinite(best):
        return PlacementResult(None, math.inf, 0.0, "infeasible", "paper-sa",
                               time.perf_counter() - t_start, iterations=moves)
    return PlacementResult(prob.plan(best_perm, layers), best * 1e3, 0.0, "heuristic",
                           "paper-sa", time.perf_counter() - t_start, iterations=moves)
