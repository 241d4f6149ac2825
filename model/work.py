"""The search's clock: wall seconds, or work seconds that come out the same on every executor
and under any load.

By default the search reads `time.perf_counter()`. Inside `metered()` it reads a work meter
instead: the operations that make up a search are counted (HiGHS calls, simplex iterations and
branch-and-bound nodes, rows handed to a model, schedule-graph nodes walked, estimator
evaluations, annealing moves, ...) and each count is priced in seconds. Every decision the
search takes by the clock (phase shares, per-call limits, when to stop) then depends only on
its inputs and the software versions (HiGHS must take the same path), so a research sweep gives
identical results on one worker, two, or a Ray cluster, under any load (issue 15). In this mode
HiGHS gets a node limit instead of a time limit, and the full placement MILP also an interrupt
at its share, counted on HiGHS's limit checks (solvers/linear.py); a small model's root node
is not interrupted, so a call may run past its share by that much, which is counted.

Prices: seconds per unit on the 2-core development machine (2026-12-01), fitted by
non-negative least squares. HiGHS: to recorded runs (exact solves of GPT-3.6B on 4- and
8-node synthetic clusters, and the 12- and 16-node random and 8-node switch instances of
bench/exact_scaling.py): 1108 runs of the small placement-relaxed models, straight into
highspy (correlation 0.93), and 42 runs of the full placement MILP through Pyomo (weighted by
1 / sqrt(wall time); predicted / measured 0.26-2.66 per run). Python work: to 24 whole solves
(weighted by 1 / wall time), bench/work_clock.py's six instances x exact and anneal x budgets
of 3 and 8 work-s. Work seconds are thus a rough estimate of wall seconds on that machine
(bench/work_clock.py prints the ratio per solve), and exactly reproducible.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

PRICE_S = {
    # a HiGHS run of a small model handed over directly (solvers.linear, backend "highs")
    "highs_call": 8.4e-3,      # one run (presolve, root cuts and heuristics, postsolve)
    "simplex_iter": 1.15e-4,   # one simplex iteration
    "mip_node": 7.3e-3,        # one branch-and-bound node
    # a run of the full placement MILP through Pyomo: its root work and its iterations grow
    # with the model's nonzeros
    "pyomo_nnz": 3.1e-5,       # per nonzero of the model, per run
    "pyomo_iter": 5.3e-5,      # per simplex iteration
    "pyomo_iter_nnz": 6.9e-9,  # per simplex iteration x nonzero
    # per limit check of HiGHS x nonzeros^1.5, only to interrupt a run at its share: checks
    # came about 5 ms apart on 2k-nonzero models (30-45 per run), 0.4 s apart on a 25k one
    "pyomo_check_nnz15": 6.0e-8,
    # Python work, fitted to whole solves (below); the last five got no weight of their own
    # in the fit and keep small prices, so that every loop of the search moves the clock
    "shape_bound": 9.7e-4,     # one shape's placement-free lower bound
    "screen": 9.4e-5,          # one shape screened (its walks are counted apart)
    "evaluation": 2.3e-4,      # one estimator evaluation of a placement (durations, hops)
    "walk": 1.0e-4,            # one schedule-graph walk (set-up)
    "walk_node": 1.9e-7,       # one graph node walked (the compiled walk is priced the same,
                               # so that the clock does not depend on when it loads)
    "move": 2.0e-6,            # one annealing move's bookkeeping
    "construct_slot": 5.0e-5,  # one slot of solvers.construct's greedy sequences (measured:
                               # 25 ms for 512 slots, 4 ms for 128)
    "construct_step": 1.5e-3,  # one swap step of solvers.construct (measured: 0.5-2 ms on
                               # 16-512 slots)
    "cut": 1.0e-5,             # one critical-path cut built
    "surrogate_hop": 1.1e-8,   # one candidate hop of solvers.cutsearch's surrogate, per
                               # (1 + cuts / 12) (measured: 12 ns with 1 cut, 20 with 16, 91-106
                               # with 128, on 16 and 32 slots)
    "model_data": 2.0e-4,      # one shape+block's MILP data (_Data)
    "row_pyomo": 5.0e-5,       # one row built as a Pyomo constraint (measured: 1.7 s for 15
                               # models, 34k rows)
    "row_direct": 2.0e-6,      # one row handed to highspy
}

_meter: dict | None = None  # counts per kind while metered, else None


def metering() -> bool:
    return _meter is not None


def charge(kind: str, n: float = 1.0) -> None:
    """Count `n` units of `kind` (nothing outside `metered()`)."""
    if _meter is not None:
        _meter[kind] = _meter.get(kind, 0.0) + n


# A stop request (solvers.workers.stop_on_sigint: Ctrl-C) moves every clock reading this far
# ahead, so every deadline of a search has passed: it winds down as at its time limit, with
# its best plan and a valid bound. Elapsed time is then `now() - start - stop_offset()`.
STOP_OFFSET_S = 1e9
_stop_offset = 0.0


def request_stop() -> None:
    global _stop_offset
    _stop_offset = STOP_OFFSET_S


def clear_stop() -> None:
    global _stop_offset
    _stop_offset = 0.0


def stop_offset() -> float:
    """What a stop request added to `now()` (0 without one)."""
    return _stop_offset


def now() -> float:
    """Seconds: the work meter's while metered, else the wall clock's (perf_counter); past
    every deadline after a stop request."""
    if _meter is None:
        return time.perf_counter() + _stop_offset
    return sum(PRICE_S[k] * v for k, v in _meter.items()) + _stop_offset


def counts() -> dict:
    return dict(_meter or {})


@contextmanager
def metered():
    """Read the work meter instead of the wall clock inside this block (one search at a
    time per process; nested blocks share the outer meter)."""
    global _meter
    if _meter is not None:
        yield
        return
    _meter = {}
    try:
        yield
    finally:
        _meter = None
