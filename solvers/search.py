"""The full solve: shapes in order of promise, placement and split per shape, pruned by bounds.

1. Enumerate every shape (space.enumerate_shapes). A shape that cannot fit with any layer split
   (space.memory_split) is recorded with the stage that overflows.
2. Score each fitting shape quickly: Megatron-LM's placement and the balanced split. The best of
   these is the first incumbent. Shapes are screened smallest bound first; one whose bound
   cannot beat the best quick score so far is not scored (its bound prunes it in step 3).
3. Visit shapes by their quick score; skip a shape whose lower bound (`shape_bound_ms`) cannot
   beat the incumbent; otherwise optimize its placement and split (MILP or annealing).
4. The result's bound is the smallest of: the MILP bounds of the shapes solved, and the lower
   bounds of shapes not solved. So the reported gap covers the whole search space.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from model import work
from model.cluster import ClusterSpec
from model.errors import InfeasibleError, SpecError
from model.estimator import Evaluator, default_layers, stage_limit_gib
from model import plan as plan_rules
from model.plan import (Plan, Shape, framework_splits, fsdp_overlaps_grads,
                        megatron_least_group, megatron_placement, schedule_key, schedule_slots)
from model.specs import JobSpec, ModelSpec, Options

from .anneal import _perm_of, anneal
from .bounds import layer_room, shape_bound_ms
from .brute import brute_force, enumerable
from .milp import INTRA_RATES_DIFFER, intra_relaxed, milp_supported, solve_milp
from .problem import PlacementProblem
from .result import NOT_BOUNDED, Beyond, Candidate, PlacementResult, SolveResult
from .space import (SearchSpace, block_launchable, block_of, blocks_for, capacity_split,
                    check_space, enumerate_shapes, min_max_memory_split,
                    refuse_unusable_lists, unused_values, with_layers)

# Above this many nodes `auto` anneals instead of proving optimality. bench/exact_scaling.py
# (Llama-2 7B, TP=8, one pipeline stage per node, random and switch-structured matrices; one
# shape and block, 120 s limit) measured the MILP's time to proof at 0.2-0.4 s on 4 nodes,
# 1.2-1.5 s on 8, 7-26 s on 16; 12 nodes (uneven layer loads, several load vectors within
# 0.5%) 65-68 s, or the 1e-4 tolerance missed by 3e-6 at 120 s; 24 nodes stop 0.5-0.9% short.
AUTO_EXACT_MAX_NODES = 16
# Time shares for large clusters (bench/scale.py): screening the shapes may use up to
# SCREEN_FRACTION of the time limit (once one shape has a score); with annealing, bounding
# shapes by the placement-relaxed MILP stops at BOUND_FRACTION, and the annealer gives each
# shape, best quick score first, the time left divided by min(blocks left, ANNEAL_SHARES).
SCREEN_FRACTION = 0.4
# bounding and screening stop at this share of the time limit even where no shape has a score
# yet (nothing fits, or the fitting shapes come late): the time left screens the rest, one
# shape at a time (the anytime pass at the end), and a search cut short says so
HARD_SCREEN_FRACTION = 0.6
BOUND_FRACTION = 0.5
# the closed-form bounds of the shapes stop at this share of the time limit (once some shape
# has a finite one): on a 24k-shape space they take ~2.5 s on 2 cores, longer than a short
# limit allows (bench/README.md, "Time-true limits"). The shapes left unbounded keep the
# trivial bound 0 until the search reaches them, and the reported bound (and gap) says so.
# They are bounded in batches of BOUND_BATCH that each sample the whole space (a stride
# through the enumeration), so a cut-short pass still bounds shapes of every degree.
CLOSED_BOUND_FRACTION = 0.35
BOUND_BATCH = 256
# The first BOUND_BATCH shapes are bounded whatever the limit (a bound for every shape of a
# small space), in batches that start at FIRST_BOUND_BATCH and double, unless that takes
# over FIRST_BOUNDS_S: 256 bounds of GPT-1T on 512 nodes take 1.3 s, over a 1 s limit
# (with the screening of a shape they had brought first, 5.7 s in all; 1.1 s now)
FIRST_BOUND_BATCH = 32
FIRST_BOUNDS_S = 0.25
ANNEAL_SHARES = 3
# With the exact method the shape of the best quick score is optimized first, with at most this
# share of the time limit; the annealing warm start of each MILP takes at most WARM_START_S.
# Measured on the built-in example (`python cli.py solve`, 2 cores): 0.3 and 2.0 s left its
# first block short of the proof, and the refinement pass then rebuilt and re-solved it
# (20.7 s in all); 0.5 and 1.0 s prove it in one pass (16.6 s); 0.5 s of warm start proves it
# later (24.3 s: the MILP starts from a worse incumbent).
FIRST_SHAPE_SHARE = 0.5
WARM_START_S = 1.0
# "optimal" means a proven relative gap of at most HiGHS's default MIP tolerance; the exact gap
# is always reported alongside
OPTIMAL_GAP = 1e-4
# the shortest time limit one solver call gets (time-true limits clamp every call to the time
# left; below this HiGHS and the annealer cannot do anything useful)
MIN_CALL_S = 0.05
# share of the time limit, and seconds, kept back from the search for overruns and the report
TIME_RESERVE = 0.04
FINAL_REPORT_S = 0.05


@dataclass
class ShapeInfo:
    shape: Shape
    bound_ms: float
    layers: tuple[int, ...] | None
    peak_gib: float
    quick_ms: float | None = None
    screened: bool = True  # False: the screening's time ran out before this shape
    bounded: bool = True  # False: the bounding's time ran out; bound_ms is the trivial 0


UNIFORM_ENUMERATE_SPLITS = 4  # (each split an evaluator build: milliseconds to tenths)


def _uniform_block(pr: PlacementProblem, cuts: list, best_ms: float, left_s: float):
    """One block of a shape on a uniform cluster, where the placement-relaxed model is exact
    (every order of nodes costs the same). The split's linear program bounds it; integral
    splits around its solution (rounded, balanced) give plans in node order; if one is within
    the optimality tolerance of the bound the block is settled, else the integral model (with
    the best of them as its cutoff) settles it. Returns (result with a valid bound and a
    termination, (time, plan) of the best plan found or None).

    A block with at most UNIFORM_ENUMERATE_SPLITS splits (PP 1, tiny models) is settled by
    timing each split in node order instead: exact whatever the model's relaxations (a
    one-node, two-GPU shape with a single plan had kept a 0.23% gap: the LP's bound of its
    overlapped tail is loose)."""
    from .brute import space_size
    if space_size(pr)[1] <= UNIFORM_ENUMERATE_SPLITS:
        t = time.perf_counter()
        perm = list(range(pr.num_slots))
        timed = [(pr.cost(perm, lay), lay) for lay in pr.all_splits() if pr.fits(lay)]
        wall = time.perf_counter() - t
        if not timed:
            return PlacementResult(None, math.inf, math.inf, "infeasible", "enumeration",
                                   wall, cuts=cuts), None
        ms, lay = min(timed, key=lambda x: x[0])
        return PlacementResult(pr.plan(perm, lay), ms, ms, "optimal", "enumeration", wall,
                               cuts=cuts), (ms, pr.plan(perm, lay))
    lp = solve_milp(pr, relax_placement=True, initial_cuts=cuts, integral_layers=False,
                    cutoff_ms=best_ms, time_limit_s=_clamp(min(10.0, left_s / 4), left_s))
    if lp.termination in ("cutoff", "infeasible") or lp.layers is None:
        return lp, None
    perm = list(range(pr.num_slots))
    cands = {pr.start_layers(), _round_split(lp.layers, pr.model.num_layers)}
    found = None
    for lay in cands:
        if min(lay) >= 1 and pr.fits(lay):
            ms = pr.cost(perm, lay)
            if found is None or ms < found[0]:
                found = (ms, lay)
    if found is not None and found[0] <= lp.bound_ms * (1 + OPTIMAL_GAP):
        lp.termination = "optimal"
        return lp, (found[0], pr.plan(perm, found[1]))
    cutoff = min(best_ms, found[0]) if found is not None else best_ms
    mip = solve_milp(pr, relax_placement=True, initial_cuts=lp.cuts, cutoff_ms=cutoff,
                     time_limit_s=_clamp(left_s / 2, left_s))
    mip.bound_ms = max(mip.bound_ms, lp.bound_ms)
    if mip.layers is not None and pr.fits(mip.layers):
        ms = pr.cost(perm, mip.layers)
        if found is None or ms < found[0]:
            found = (ms, mip.layers)
    if mip.termination == "cutoff" and found is not None and found[0] <= cutoff:
        mip.termination = "optimal"  # nothing beats the plan at the cutoff
    return mip, (None if found is None else (found[0], pr.plan(perm, found[1])))


def milp_start_s(prob) -> float:
    """Time a MILP of this problem needs before its first time check (data, formulation,
    hand-over to HiGHS): about 0.5 s plus 0.1 s per node slot on this machine (the built-in
    example's 8 slots build in about 0.6 s; issue 13 measured 4 s on 32)."""
    return 0.5 + 0.1 * prob.num_slots


def _clamp(want_s: float, left_s: float) -> float:
    """A solver call's time limit: what the step wants, never past the time left (and never
    below MIN_CALL_S, so HiGHS gets a valid positive limit)."""
    return max(MIN_CALL_S, min(want_s, left_s))


def _round_split(layers, total: int) -> tuple[int, ...]:
    """Largest-remainder rounding of a fractional split to integers summing to `total`, at
    least one layer each."""
    base = [max(1, int(x)) for x in layers]
    rest = sorted(range(len(layers)), key=lambda i: -(layers[i] - int(layers[i])))
    i = 0
    while sum(base) < total:
        base[rest[i % len(rest)]] += 1
        i += 1
    while sum(base) > total:
        j = max(range(len(base)), key=lambda i_: base[i_])
        base[j] -= 1
    return tuple(base)


def _quick(model, job, cluster, shape, layers, options, ev=None) -> float | None:
    """The time of Megatron-LM's placement with this split, or None where it has none or,
    on GPUs of several memory sizes, does not hold the split (a quick score is a plan that
    runs: the search prunes against it)."""
    try:
        pl = megatron_placement(cluster, shape.tp, shape.pp, shape.cols)
    except Exception:
        return None
    if not _dispatcher_starts(job, cluster, shape, pl):
        return None
    if ev is None or tuple(ev.shape.layers) != tuple(layers):
        ev = Evaluator(model, job, cluster, with_layers(shape, layers), options)
    if not _placement_holds(cluster, shape, pl, ev):
        return None
    return ev.iteration_ms(pl)


def _dispatcher_starts(job, cluster, shape, pl) -> bool:
    """Whether the MoE dispatcher can start the EP groups where `pl` puts them (DeepEP:
    model.plan.deepep_layout_problem); a placement it cannot start is no plan to score."""
    if job.moe_dispatcher != "deepep" or shape.ep <= 1:
        return True
    from model.plan import deepep_layout_problem
    return deepep_layout_problem(Plan(shape, pl), cluster) is None


def megatron_polish(model, job, cluster, options, plan: Plan, plan_ms: float
                    ) -> tuple[Plan, float]:
    """(plan, time): the plan's shape and split with Megatron-LM's placement where that is
    faster and fits (`_quick`, the screen's score), else the plan as given."""
    sh = plan.shape
    t = _quick(model, job, cluster, sh, sh.layers, options)
    if t is None or not t < plan_ms * (1 - 1e-9):
        return plan, plan_ms
    return Plan(sh, megatron_placement(cluster, sh.tp, sh.pp, sh.cols)), t


def _placement_holds(cluster, shape, pl, ev) -> bool:
    """Every stage within the memory of its smallest host (the estimator's rule)."""
    return all(mm.total_gib <= stage_limit_gib(cluster, pl, s)
               for s, mm in enumerate(ev.memory))


def _screen_mixed_memory(model, job, cluster, options, sh: Shape, bound: float,
                         best_quick: float):
    """screen_shape where the GPUs differ in memory: a split fits if some placement puts
    every stage on GPUs with room for it. Tried in order: the time-balanced split, then the
    split balanced against the memory of Megatron-LM's placement (which then gives the quick
    score), then, for each block, the split balanced against the memory of the placement that
    gives the largest GPUs to the neediest slots (PlacementProblem.memory_perm; no quick
    score: not Megatron's placement)."""
    lay = default_layers(model, job, cluster, sh, options)
    try:
        pl = megatron_placement(cluster, sh.tp, sh.pp, sh.cols)
    except Exception:
        pl = None
    worst = None  # (stage, GiB it needs, GiB its GPUs have) of the closest miss
    if pl is not None:
        caps = [stage_limit_gib(cluster, pl, s) for s in range(sh.pp)]
        balanced, _ok, st, need = capacity_split(model, job, cluster, sh, options, caps)
        worst = (st, need, caps[st])
        for cand in (lay, balanced):
            ev = Evaluator(model, job, cluster, with_layers(sh, cand), options)
            if _placement_holds(cluster, sh, pl, ev):
                info = ShapeInfo(sh, bound, tuple(cand), max(mm.total_gib for mm in ev.memory))
                if bound < best_quick * (1 + 1e-9) and _dispatcher_starts(job, cluster, sh, pl):
                    info.quick_ms = ev.iteration_ms(pl)
                return info, None
    for blk in blocks_for(cluster, sh, job):
        prob = PlacementProblem(model, job, cluster, sh, blk, options)
        cand = prob.start_layers()
        if prob.fits(cand):
            peak = max(prob.slot_needs_gib(cand))
            return ShapeInfo(sh, bound, tuple(cand), peak), None
        caps = prob.stage_caps_gib(cand)
        _l, _ok, st, need = capacity_split(model, job, cluster, sh, options, caps)
        if worst is None or need - caps[st] < worst[1] - worst[2]:
            worst = (st, need, caps[st])
    if worst is None:
        return None, Candidate(sh.describe(), bound, status="does not fit: no placement of "
                               "this shape on these nodes", shape=sh)
    st, need, cap = worst
    largest = max(nd.gpu.memory_gib for nd in cluster.nodes)
    if need > largest:
        return None, Candidate(sh.describe(), bound, status=f"does not fit: stage {st} needs "
                               f"{need:.1f} GiB > {largest:g} GiB, the largest GPU here, even "
                               "with the split balanced to its GPUs' memory", shape=sh)
    return None, Candidate(sh.describe(), bound, status=f"does not fit: stage {st} needs "
                           f"{need:.1f} GiB > {cap:g} GiB even with the split balanced to its "
                           "GPUs' memory (the largest GPUs on the neediest stages, or "
                           "Megatron-LM's placement where no other is searched)", shape=sh)


def _screen_own_splits(model, job, cluster, options, sh: Shape, bound: float,
                       best_quick: float, own: dict):
    """screen_shape where the framework runs only its own splits (DeepSpeed's partition
    methods: plan.framework_splits): of those that fit (on GPUs of several memory sizes:
    under Megatron-LM's placement, or for some block under the placement giving the largest
    GPUs to the neediest slots), the one with the best quick score (else the least memory);
    or the candidate naming the split that comes closest to fitting."""
    caps = {nd.gpu.memory_gib for nd in cluster.nodes}
    try:
        pl = megatron_placement(cluster, sh.tp, sh.pp, sh.cols)
    except Exception:
        pl = None
    best = closest = None  # (key, ShapeInfo); (overflow GiB, stage, need, split)
    for lay in own:
        ev = Evaluator(model, job, cluster, with_layers(sh, lay), options)
        mem = [mm.total_gib for mm in ev.memory]
        peak, quick = max(mem), None
        if len(caps) == 1:
            fits = peak <= min(caps)
            if fits and bound < best_quick * (1 + 1e-9):
                quick = _quick(model, job, cluster, sh, lay, options, ev)
        elif pl is not None and _placement_holds(cluster, sh, pl, ev):
            fits = True
            if bound < best_quick * (1 + 1e-9):
                quick = ev.iteration_ms(pl)
        else:
            fits = any(PlacementProblem(model, job, cluster, sh, blk, options).fits(lay)
                       for blk in blocks_for(cluster, sh, job))
        if fits:
            info = ShapeInfo(sh, bound, lay, peak)
            info.quick_ms = quick
            key = (math.inf if quick is None else quick, peak)
            if best is None or key < best[0]:
                best = (key, info)
            continue
        st = max(range(len(mem)), key=mem.__getitem__)
        over = mem[st] - max(caps)
        if closest is None or over < closest[0]:
            closest = (over, st, mem[st], lay)
    if best is not None:
        return best[1], None
    _o, st, need, lay = closest
    where = (f"> {min(caps):g} GiB" if len(caps) == 1 else
             "and no placement puts every stage on GPUs with room for it")
    return None, Candidate(sh.describe(), bound, status=f"does not fit: stage {st} needs "
                           f"{need:.1f} GiB {where} with the split DeepSpeed's pipeline engine "
                           f"runs ({'/'.join(map(str, lay))}; partition_method "
                           f"'{own[lay]}'), the closest of its partition methods", shape=sh)


def screen_shape(model, job, cluster, options, sh: Shape, bound: float, best_quick: float):
    """(ShapeInfo, None) with the split that fits (time-balanced, else memory-balanced) and,
    unless `bound` already fails to beat `best_quick`, the quick score; or (None, Candidate)
    naming the stage that overflows even with the most memory-balanced split."""
    work.charge("screen")
    own = framework_splits(model, job, sh)
    if own is not None:
        return _screen_own_splits(model, job, cluster, options, sh, bound, best_quick, own)
    caps = {nd.gpu.memory_gib for nd in cluster.nodes}
    if len(caps) > 1:
        return _screen_mixed_memory(model, job, cluster, options, sh, bound, best_quick)
    cap = caps.pop()
    lay = default_layers(model, job, cluster, sh, options)
    ev = Evaluator(model, job, cluster, with_layers(sh, lay), options)
    peak = max(mm.total_gib for mm in ev.memory)
    if peak > cap:
        lay2, peak2, worst = min_max_memory_split(model, job, cluster, sh, options)
        if peak2 > cap:
            # one decimal, or two where one would round up to the limit
            need = f"{peak2:.1f}" if round(peak2, 1) > cap else f"{peak2:.2f}"
            return None, Candidate(sh.describe(), bound, status=f"does not fit: stage {worst} "
                                   f"needs {need} GiB > {cap:g} GiB even with the most "
                                   "memory-balanced split", shape=sh)
        lay, peak = lay2, peak2
    info = ShapeInfo(sh, bound, lay, peak)
    if bound < best_quick * (1 + 1e-9):  # else the bound prunes it: quick >= bound
        info.quick_ms = _quick(model, job, cluster, sh, lay, options, ev)
    return info, None


# Shapes are screened in batches of this many, smallest bound first; within a batch every shape
# is held against the best quick score known when the batch began, so which shapes get a quick
# score does not depend on how many workers share the batch (results identical for any --jobs)
SCREEN_BATCH = 16
# below this many shapes, worker processes cost more than they save
PARALLEL_MIN_SHAPES = 64

# what the worker processes read (set before they are forked, so nothing is pickled but indices)
_WORK: tuple = ()


def _bound_of(i: int) -> float:
    model, job, cluster, options, shapes = _WORK
    return shape_bound_ms(model, job, cluster, shapes[i], options)


def _screen_of(item: tuple[int, float | None, float]):
    """Screen shape i; a shape not bounded yet (bound None) is bounded first. One whose
    closed-form bound is infinite has no split that fits: no estimate is needed to say so."""
    i, bound, best_quick = item
    model, job, cluster, options, shapes = _WORK
    if bound is None:
        bound = shape_bound_ms(model, job, cluster, shapes[i], options)
    if not math.isfinite(bound):
        room = layer_room(model, job, cluster, shapes[i], options)
        return None, closed_form_misfit(cluster, shapes[i], room)
    return screen_shape(model, job, cluster, options, shapes[i], bound, best_quick)


def closed_form_misfit(cluster, sh: Shape, room: float | None = None):
    """The candidate of a shape whose closed-form bound is infinite: the relaxation of
    min_max_memory_split in solvers.bounds (every layer at its cheapest chunk's bytes) finds
    no split within the largest GPU's memory, so none exists. `room`: the share of the layers
    its stages could hold (bounds.layer_room), where known."""
    cap = max(nd.gpu.memory_gib for nd in cluster.nodes)
    held = "" if room is None else (": no stage holds even one layer" if room <= 0 else
                                    f": its stages hold at most {min(room, 0.99):.0%} of the "
                                    "layers")
    return Candidate(sh.describe(), math.inf, status=f"does not fit: no layer split fits in "
                     f"{cap:g} GiB (closed-form memory bound{held})", shape=sh, room=room)


def _closest_misfit(rejected: list[Candidate]) -> Candidate | None:
    """The misfit that comes closest to fitting: the least memory needed where a split was
    balanced, else the most layers its stages could hold (a closed-form misfit)."""
    return min(rejected, key=lambda c: (c.needs_gib, -(c.room or 0.0)), default=None)


def _bound_batches(n: int) -> list[list[int]]:
    """_bound_order's indices in batches: FIRST_BOUND_BATCH of them at a stride through its
    first BOUND_BATCH (themselves a sample of every part of the enumeration), then the rest in
    batches twice as large each time, up to BOUND_BATCH."""
    todo = _bound_order(n)
    step = max(1, min(BOUND_BATCH, len(todo)) // FIRST_BOUND_BATCH)
    first = todo[:BOUND_BATCH:step][:FIRST_BOUND_BATCH]
    chosen = set(first)
    rest = [i for i in todo if i not in chosen]
    out, size, at = [first], FIRST_BOUND_BATCH, 0
    while at < len(rest):
        size = min(2 * size, BOUND_BATCH)
        out.append(rest[at:at + size])
        at += size
    return out


def _bound_order(n: int) -> list[int]:
    """Enumeration indices in bounding order: batch b holds b, b + k, b + 2k, ... for k
    batches, so each batch samples every part of the enumeration."""
    k = max(1, -(-n // BOUND_BATCH))
    return [i for b in range(k) for i in range(b, n, k)]


def _pool_size(jobs: int | None) -> int:
    import os
    return (os.cpu_count() or 1) if jobs is None else jobs


def _workers(jobs: int | None, n_items: int):
    """A fork-based process pool of `jobs` workers (None: all cores), or None when one process
    does: a single job, too few shapes, or a platform without fork."""
    import multiprocessing as mp

    jobs = _pool_size(jobs)
    if jobs <= 1 or n_items < PARALLEL_MIN_SHAPES or \
            "fork" not in mp.get_all_start_methods():
        return None
    from model import walk_jit
    walk_jit.settle()  # no child may inherit a half-done import of the compiled walks
    import signal
    import threading

    from .workers import quiet_worker
    # forked with Ctrl-C ignored, so that none arrives before quiet_worker has run
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        return mp.get_context("fork").Pool(jobs, initializer=quiet_worker)
    finally:
        if main:
            signal.signal(signal.SIGINT, old)


def prepare_shapes(model, job, cluster, options, space, progress=None, deadline=None,
                   jobs: int | None = 1, bound_deadline=None, too_long: list | None = None,
                   hard_deadline=None):
    """Every shape: its cheap lower bound, whether it fits (and the split that makes it fit),
    and its quick score (Megatron-LM placement, that split). Shapes are screened in order of
    their bound, in batches of SCREEN_BATCH; a shape whose bound is already at or above the
    best quick score of the batches before cannot win, so its quick score is skipped (it is
    pruned by that bound later). Past `deadline` (work.now()), once some shape has a
    quick score, the remaining shapes are left unscreened (`screened=False`, only their bound
    known). Past `bound_deadline`, once some shape has a finite bound, the shapes not bounded
    yet keep the trivial bound 0 (`bounded=False`) and are screened after the bounded ones
    (bounded first when they are). Past `hard_deadline` both stop whatever was found (a
    space where nothing fits, or nothing is bounded, would otherwise be screened whole,
    however long that takes); the deadlines are checked before each shape, or each round of
    one shape per worker. `jobs` worker processes share the bounds and each batch
    (None: all cores); without deadlines the result is the same for any number. Lists keep
    enumeration order. Shapes left out for their schedule's size go to `too_long`
    (enumerate_shapes)."""
    global _WORK
    infos, rejected = [], []
    shapes = list(enumerate_shapes(model, job, cluster, space, too_long))
    refuse_unusable_lists(space, shapes + list(too_long or ()))
    _WORK = (model, job, cluster, options, shapes)
    pool = _workers(jobs, len(shapes))
    try:
        run = pool.map if pool is not None else lambda f, xs: [f(x) for x in xs]
        bounds: list[float | None] = [None] * len(shapes)
        def past(soft, found_some: bool, done_some: bool) -> bool:
            """Past the soft deadline once something was found, or past the hard one once
            anything was done (the first round always runs: a search returns a plan)."""
            now = work.now()
            return (soft is not None and now > soft and found_some) or (
                hard_deadline is not None and now > hard_deadline and done_some)

        done, t_bounds = 0, work.now()
        for nb, batch in enumerate(_bound_batches(len(shapes))):
            first_round = done < BOUND_BATCH and work.now() - t_bounds < FIRST_BOUNDS_S
            if not first_round and past(
                    bound_deadline, any(b is not None and math.isfinite(b) for b in bounds),
                    nb > 0):
                break
            if progress:
                progress(f"bounding shapes {done}/{len(shapes)}")
            done += len(batch)
            for i, b in zip(batch, run(_bound_of, batch)):
                bounds[i] = b
        # the bounded shapes by bound, then the unbounded ones (which may fit), the shapes no
        # split fits last
        order = sorted(range(len(shapes)), key=lambda i: (
            (0, bounds[i]) if bounds[i] is not None and math.isfinite(bounds[i]) else
            (1, 0.0) if bounds[i] is None else (2, 0.0)))
        found: list[tuple[int, object]] = []
        best_quick = math.inf
        for start in range(0, len(order), SCREEN_BATCH):
            batch = order[start:start + SCREEN_BATCH]
            if progress:
                progress(f"screening shapes {start}/{len(shapes)}")
            # one shape per worker at a time, each round held against the quick score known
            # when the batch began (so the result does not depend on the workers), the
            # deadlines checked between rounds: a batch of a 405B model on 128 nodes takes
            # seconds
            width = 1 if pool is None else _pool_size(jobs)
            scored, held = [], best_quick
            for r in range(0, len(batch), width):
                if past(deadline, math.isfinite(best_quick), bool(found or rejected or scored)):
                    break
                scored += run(_screen_of, [(i, bounds[i], held) for i in batch[r:r + width]])
            found += [(i, ShapeInfo(shapes[i], 0.0 if bounds[i] is None else bounds[i], None,
                                    math.nan, screened=False, bounded=bounds[i] is not None))
                      for i in batch[len(scored):]]
            for i, (info, misfit) in zip(batch, scored):
                if misfit is not None:
                    rejected.append((i, misfit))
                    continue
                found.append((i, info))
                if info.quick_ms is not None:
                    best_quick = min(best_quick, info.quick_ms)
    except BaseException:
        if pool is not None:  # its workers may be mid-task: close() and join() would wait
            pool.terminate()
            pool = None
        raise
    finally:
        if pool is not None:
            pool.close()
            pool.join()
        _WORK = ()
    infos = [info for _i, info in sorted(found, key=lambda x: x[0])]
    return infos, [c for _i, c in sorted(rejected, key=lambda x: x[0])], len(shapes)


def _not_searched(job: JobSpec, space: SearchSpace) -> str:
    """What saves memory and was left out of the search (by the user's lists or a framework's
    default search), for "nothing fits": the sentence to add, or ''."""
    from .space import DEFAULT_ZERO, FRAMEWORK_ZERO
    out = []
    zeros = ((job.zero,) if job.zero is not None else space.zero
             if space.zero is not None else DEFAULT_ZERO[job.framework])
    if not {1, 2, 3} & set(zeros) and 1 in FRAMEWORK_ZERO[job.framework]:
        out.append("the distributed optimizer (--distopt or --zero 1: the optimizer state "
                   "sharded over the data-parallel ranks)")
    if 3 not in zeros and 3 in FRAMEWORK_ZERO[job.framework]:
        out.append("ZeRO-3 / FSDP (--zero 3: parameters and gradients sharded too"
                   + (", opt-in for Megatron-LM)" if job.framework == "megatron" else ")"))
    if "full" not in space.recompute:
        out.append(f"full recompute (--recompute was {','.join(space.recompute)})")
    flags = {"tp": "--tp", "pp": "--pp", "cp": "--cp", "ep": "--ep", "micro_batch": "--mbs",
             "shard_sizes": "--shard-size"}
    out += [f"other {flags[f]} values (given: {','.join(map(str, v))})"
            for f, v in _lists_given(space, tuple(flags)).items()]
    return (" Not searched: " + "; ".join(out) + ".") if out else ""


def _beyond_groups(job, cluster, space: SearchSpace) -> list:
    """The groups beyond_default_space looks at: (what the group is, its space, which of that
    space's shapes are new (the rest were searched), the options that add a faster shape of
    it to the search). The advice adds only the group's own option: a ZeRO-3 shape with CP 8
    at 128k tokens is reached by --zero alone (the default space has CP there), and a --cp
    list in its advice had dropped the plan's own CP degree from the search."""
    from dataclasses import replace

    from .space import CP_MIN_SEQ, DEFAULT_ZERO, FRAMEWORK_ZERO
    # (what the group is, its space, which of that space's shapes are new: the rest were
    # searched)
    groups: list[tuple[Beyond, SearchSpace, object, object]] = []
    fw = job.framework
    if job.zero is None and space.zero is None and True in space.distributed_optimizer \
            and 3 in FRAMEWORK_ZERO[fw] and 3 not in DEFAULT_ZERO[fw]:
        zeros = [z for z in DEFAULT_ZERO[fw] if (z >= 1) in space.distributed_optimizer]
        flag = "--zero " + ",".join(map(str, zeros + [3]))
        groups.append((Beyond("ZeRO-3 (Megatron-FSDP)", flag), replace(space, zero=(3,)),
                       lambda sh: sh.zero == 3, lambda sh: flag))
    if space.cp is None and job.seq_length < CP_MIN_SEQ:
        cps = tuple(2 ** i for i in range(1, 12) if 2 ** i <= cluster.num_gpus)
        if cps:
            groups.append((Beyond(f"context parallelism below {CP_MIN_SEQ:,} tokens",
                                  "--cp 1," + ",".join(map(str, cps[:3]))),
                           replace(space, cp=cps), lambda sh: sh.cp > 1,
                           lambda sh: f"--cp 1,{sh.cp}"))
    off = (False,)
    if fw == "megatron" and space.tp_comm_overlap == off and \
            space.overlap_grad_reduce == off and space.overlap_param_gather == off and \
            space.ep_comm_overlap == off:
        # Megatron-LM's overlaps are off unless asked for (its defaults; NeMo's and
        # Megatron-Bridge's recipes turn them on): each shape with each combination it can use
        # (not all on: TP overlap can cost more than it hides, the example's plan 42.1 -> 45.1 s)
        both = (False, True)

        def asked_grad(sh) -> bool:  # Megatron-FSDP's ZeRO-2 overlaps unasked: not beyond
            return sh.overlap_grad_reduce and not fsdp_overlaps_grads(job, sh.zero,
                                                                      sh.dp * sh.cp)
        groups.append((Beyond("communication overlaps (off by default, as in Megatron-LM)",
                              "--tp-comm-overlap/--overlap-grad-reduce/"
                              "--overlap-param-gather/--ep-comm-overlap"),
                       replace(space, tp_comm_overlap=both, overlap_grad_reduce=both,
                               overlap_param_gather=both,
                               ep_comm_overlap=both),
                       lambda sh: sh.tp_comm_overlap or asked_grad(sh)
                       or sh.overlap_param_gather or sh.ep_comm_overlap,
                       lambda sh: " ".join(f for f, on in (
                           ("--tp-comm-overlap", sh.tp_comm_overlap),
                           ("--overlap-grad-reduce", asked_grad(sh)),
                           ("--overlap-param-gather", sh.overlap_param_gather),
                           ("--ep-comm-overlap", sh.ep_comm_overlap)) if on)))
    if fw not in ("torchtitan", "deepspeed") and "whole" not in space.mb_groups and any(
            name == "interleaved" for name, _v in space.schedules):
        # Megatron-LM's interleaved schedule in one group of every micro-batch: a longer
        # warm-up, less waiting at the chunk boundaries (SearchSpace.mb_groups)
        groups.append((Beyond("interleaved in one micro-batch group (Megatron-LM's "
                              "--microbatch-group-size-per-virtual-pipeline-stage)",
                              "--mb-groups smallest,whole"),
                       replace(space, mb_groups=("whole",)),
                       lambda sh: sh.schedule == "interleaved" and sh.mb_group != 0
                       and sh.mb_group != megatron_least_group(
                           sh.pp, job.global_batch // (sh.micro_batch * sh.dp)),
                       lambda sh: "--mb-groups smallest,whole"))
    if fw == "deepspeed" and space.overlap_grad_reduce == off:
        # DeepSpeed's one overlap, overlap_comm, is off unless asked for (the emitted ZeRO
        # configs set it as the plan says; plan.deepspeed_overlaps_grads where it runs)
        groups.append((Beyond("the gradient-reduce overlap (overlap_comm, off unless asked)",
                              "--overlap-grad-reduce"),
                       replace(space, overlap_grad_reduce=(False, True)),
                       lambda sh: sh.overlap_grad_reduce, lambda sh: "--overlap-grad-reduce"))
    return groups


def model_state_floor(model: ModelSpec, job: JobSpec, cluster: ClusterSpec,
                      options: Options) -> tuple[float, float, int] | None:
    """For "nothing fits": the weights, gradients and optimizer state, spread over every GPU
    with nothing replicated (the most any mix of TP, PP and ZeRO-3 can do), against the GPUs'
    room for tensors (memory less the CUDA context, over 1 + fragmentation: the allowance
    model/memory.py adds). (state GiB, room GiB of the largest GPU, GPUs of that size the state
    needs) where the cluster's room is short of it, else None: then more sharding could make
    it fit, and otherwise only more or larger GPUs can."""
    from model.memory import param_bytes
    o = options.overheads
    per_param = sum(param_bytes(job, Shape(tp=1, pp=1, dp=1, micro_batch=1)))
    state_gib = model.total_params * per_param / 2 ** 30
    rooms = [max(0.0, n.gpu.memory_gib - o.context_gib) / (1 + o.fragmentation)
             for n in cluster.nodes for _g in range(n.num_gpus)]
    if state_gib <= sum(rooms):
        return None
    room = max(rooms)
    return state_gib, room, math.ceil(state_gib / room) if room > 0 else 0


def beyond_default_space(model, job, cluster, options, space: SearchSpace, best_ms: float,
                         deadline: float) -> list[Beyond]:
    """What the default search left out that could be faster, looked at with the time left
    (until `deadline`, work.now()): Megatron-FSDP's ZeRO-3 (opt-in for Megatron-LM:
    space.DEFAULT_ZERO) and context parallelism below CP_MIN_SEQ tokens, unless the user
    listed --zero / --cp; and Megatron-LM's communication overlaps (each combination a shape
    can use) unless one was asked for. Each group's shapes get their closed-form bound; those
    below `best_ms`, lowest first, are screened (a split that fits, Megatron-LM's placement). A
    helper found a TP 4 PP 1 ZeRO-3 plan 13% faster than a Llama-3 70B plan 'proven optimal'
    over the default space, and CP 2 at 8k tokens 29% faster for Llama-3 405B."""
    out = []
    for b, sub, new, advice in _beyond_groups(job, cluster, space):
        out.append(b)
        if work.stop_offset() or work.now() > deadline:
            continue
        shapes = [sh for sh in enumerate_shapes(model, job, cluster, sub) if new(sh)]
        b.shapes = len(shapes)
        below = []
        for sh in shapes:
            if work.now() > deadline:
                break
            bound = shape_bound_ms(model, job, cluster, sh, options)
            b.bounded += 1
            if bound < best_ms * (1 - 1e-9):
                below.append((bound, sh))
        b.could_beat = len(below)
        if b.bounded == b.shapes:
            below.sort(key=lambda x: x[0])
            for bound, sh in below:
                if work.now() > deadline:
                    break
                info, _misfit = screen_shape(model, job, cluster, options, sh, bound, best_ms)
                b.screened += 1
                if info is not None and info.quick_ms is not None and info.quick_ms < (
                        b.faster_ms or best_ms) * (1 - 1e-9):
                    b.faster_ms, b.faster_shape = info.quick_ms, sh.describe()
                    b.option = advice(sh)
            else:
                b.checked = True
    return out


def _lists_given(space: SearchSpace, fields: tuple[str, ...]) -> dict:
    """The search-space lists among `fields` the user narrowed (not left at the default)."""
    base = SearchSpace()
    return {f: getattr(space, f) for f in fields
            if getattr(space, f) is not None and getattr(space, f) != getattr(base, f)}


def solve(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, *, method: str = "auto",
          time_limit_s: float = 60.0, seed: int = 0, options: Options | None = None,
          space: SearchSpace = SearchSpace(), progress=None, max_shapes: int | None = None,
          anneal_iters: int | None = 3000, uniform_tol: float = 0.0,
          jobs: int | None = 1, anneal_clock: bool = True, clock: str = "wall") -> SolveResult:
    """Fastest plan that fits, with its proof status. `uniform_tol`: inter-node streams within
    this relative spread count as equal (cluster.uniform): no placement search then. `jobs`:
    worker processes for bounding and screening the shapes (None: all cores); the result does
    not depend on it.

    With method "anneal" each block is annealed with cooling planned by the clock over its
    share of the time limit (solvers.anneal, iters=None); where the exact method falls back to
    the annealer (blocks the MILP does not cover) it anneals `anneal_iters` moves, so that its
    answer does not depend on the machine's speed. `anneal_clock=False`: every annealing run
    takes `anneal_iters` moves, the anneal method's too (research sweeps that must give the
    same answer on any machine and executor; the time limit still caps each run).

    `clock="work"`: the time limit is in work seconds (model.work), so that the result is the
    same under any load and with any executor, given the same software versions (research
    sweeps); the search then runs in this process (jobs=1)."""
    if clock not in ("wall", "work"):
        raise ValueError(f"clock must be 'wall' or 'work', not {clock!r}")
    if job.fp8_param_gather and space.zero is not None and not set(space.zero) & {1, 2}:
        # FP8 weights that no plan of the space could use: say so rather than search without
        raise SpecError("FP8 weights need the distributed optimizer (ZeRO 1 or 2) and --zero "
                        f"allows {','.join(map(str, space.zero))}: add 1 or 2, or drop "
                        "--fp8-param-gather", source="options", field="--fp8-param-gather")
    check_space(model, job, cluster, space)
    if clock == "work" and not work.metering():
        with work.metered():
            return solve(model, job, cluster, method=method, time_limit_s=time_limit_s,
                         seed=seed, options=options, space=space, progress=progress,
                         max_shapes=max_shapes, anneal_iters=anneal_iters,
                         uniform_tol=uniform_tol, jobs=1, anneal_clock=anneal_clock,
                         clock=clock)
    options = options or Options()
    # offset-free: a search begun after a stop request (compare's second solve) is past its
    # deadlines at once, as one that was running
    t0, wall0 = work.now() - work.stop_offset(), time.perf_counter()
    # time-true: the search plans with a little less than the user's limit, leaving room for
    # what overruns a call's own limit (model hand-over to HiGHS, the last evaluation) and for
    # the final report (bench/time_true.py measures the result)
    time_limit_s = max(MIN_CALL_S, time_limit_s * (1 - TIME_RESERVE) - FINAL_REPORT_S)

    def budget(want_s: float) -> float:
        """Time-true: a call's limit, clamped to what is left of the whole limit."""
        return _clamp(want_s, time_limit_s - (work.now() - t0))
    if method not in ("auto", "exact", "anneal"):
        raise ValueError(method)
    # every node interchangeable: each block layout's placement is one (identity) and the
    # placement-relaxed MILP over the split is exact, whatever the cluster's size
    uniform = cluster.uniform(uniform_tol)
    if method == "auto":
        method = "exact" if uniform or (
            cluster.num_nodes <= AUTO_EXACT_MAX_NODES and cluster.homogeneous
            and not cluster.gpu_specific_links) else "anneal"
    # screening may take up to 40% of the time limit once some shape has a quick score
    too_long: list[Shape] = []
    infos, rejected, total = prepare_shapes(model, job, cluster, options, space, progress,
                                            deadline=t0 + SCREEN_FRACTION * time_limit_s,
                                            jobs=jobs, bound_deadline=t0 +
                                            CLOSED_BOUND_FRACTION * time_limit_s,
                                            too_long=too_long,
                                            hard_deadline=t0 + HARD_SCREEN_FRACTION
                                            * time_limit_s)
    if total == 0 and too_long:
        fewest = min(too_long, key=lambda sh: schedule_slots(job, sh))
        raise InfeasibleError(
            f"every plan in the search space ({len(too_long)} shapes) has a schedule longer "
            f"than the {plan_rules.MAX_SCHEDULE_SLOTS:,} slots (micro-batches per replica x PP "
            f"x chunks) the cost model builds; the shortest, {fewest.describe()}, has "
            f"{schedule_slots(job, fewest):,}. Use a smaller global batch, or larger "
            "micro-batches (--mbs)")
    if total == 0:
        given = _lists_given(space, ("tp", "pp", "cp", "ep", "micro_batch", "zero",
                                     "shard_sizes"))
        limits = (" The lists given: " + ", ".join(f"{k} {list(v)}" for k, v in given.items())
                  + "; widen them.") if given else ""
        refused: dict = {}
        for _sh in enumerate_shapes(model, job, cluster, space, refused=refused):
            pass  # none is valid: count why each was refused
        why = ""
        if refused:
            fld, (n, text) = max(refused.items(), key=lambda kv: kv[1][0])
            why = (f" {sum(v[0] for v in refused.values())} shapes were refused; most often "
                   f"on {fld} ({n}): {text}.")
        raise InfeasibleError(
            f"no plan in the search space is valid for {model.name} on {cluster.num_gpus} "
            "GPUs: TP x PP x DP x CP must equal the GPU count, TP divide the attention heads "
            "and fit in a node, the global batch divide by micro-batch x DP, and the sequence "
            "by 2 x CP (x TP with sequence parallelism)." + why + limits)
    if not infos:
        closest = _closest_misfit(rejected)
        hint = (f" The closest is {closest.describe}: "
                f"{closest.status.removeprefix('does not fit: ')}."
                if closest else " No shape is valid for this model and cluster.")
        floor = model_state_floor(model, job, cluster, options)
        details = {"closest": closest.describe, "closest_status": closest.status} if closest \
            else {}
        if floor is not None:
            state_gib, room_gib, need = floor
            per_node = max(n.num_gpus for n in cluster.nodes)
            details.update(model_state_gib=state_gib, room_gib_per_gpu=room_gib,
                           gpus_needed_at_least=need, gpus=cluster.num_gpus)
            raise InfeasibleError(
                f"nothing fits in GPU memory: the weights, gradients and optimizer state "
                f"alone are {state_gib:,.0f} GiB ({model.total_params / 1e9:,.1f}B parameters "
                f"x {state_gib * 2 ** 30 / model.total_params:.0f} bytes), more than the "
                f"{cluster.num_gpus} GPUs hold even spread over all of them with nothing "
                f"replicated: at least {need} GPUs with {room_gib:.1f} GiB of room each "
                f"(memory less the allowance; {math.ceil(need / per_node)} nodes of "
                f"{per_node}), before any activation. No parallelism, sharding, recompute or "
                "shorter sequence can make it fit: add GPUs or nodes, or use GPUs with more "
                "memory." + hint, details)
        raise InfeasibleError(
            "nothing fits in GPU memory." + hint + _not_searched(job, space) + " To make it "
            "fit: add GPUs or nodes (more pipeline or tensor parallelism), use GPUs with more "
            "memory, shorten the sequence, or lower the memory allowance if your measurements "
            "support it (Overheads).", details)
    infos.sort(key=lambda i: (i.quick_ms if i.quick_ms is not None else math.inf, i.bound_ms))
    best_ms, best_plan = math.inf, None
    for i in infos:
        if i.quick_ms is not None and i.quick_ms < best_ms:
            best_ms = i.quick_ms
            best_plan = Plan(with_layers(i.shape, i.layers),
                             megatron_placement(cluster, i.shape.tp, i.shape.pp, i.shape.cols))
    candidates = {id(i): Candidate(i.shape.describe(), i.bound_ms, i.quick_ms, shape=i.shape)
                  for i in infos}
    bounds_left: dict[int, float] = {id(i): i.bound_ms for i in infos}
    solved = 0
    errors: list[str] = []  # solver failures caught per shape; the search goes on without them
    not_covered: dict[str, int] = {}  # blocks the MILP does not cover, by reason
    enumerated = [0]  # blocks the exact method settled by enumeration (solvers.brute)

    def failed(info, e: Exception) -> None:
        errors.append(f"{info.shape.describe()}: {type(e).__name__}: {e}")
    cuts_of: dict[int, list] = {}
    # critical paths are count vectors over a schedule graph's operation kinds: valid cuts for
    # every shape with the same graph (schedule, p, m, v), whatever its durations
    pool: dict[tuple, list] = {}

    def graph_key(sh: Shape) -> tuple:
        return schedule_key(job, sh, options.blocking_p2p)
    block_bounds: dict[int, float] = {}  # id(PlacementProblem) -> its placement-relaxed bound
    probs_of: dict[int, list] = {}
    # block layouts left out as torchrun cannot start them (space.launch_orders), and shapes
    # left with none
    unlaunchable = [0, 0]
    # Phase A: bound every shape that the cheap bound cannot rule out; prune. With annealing
    # (large clusters) this phase ends at BOUND_FRACTION of the time limit; shapes not bounded
    # by then keep their cheap bound and go on to phase B.
    bound_until = t0 + BOUND_FRACTION * time_limit_s if method == "anneal" else math.inf
    def pruned(info, cand) -> bool:
        """A shape whose bound cannot beat the incumbent is settled: record and skip it."""
        if info.bound_ms < best_ms * (1 - 1e-9):
            return False
        if math.isinf(info.bound_ms):
            cand.status = closed_form_misfit(cluster, info.shape).status
            bounds_left[id(info)] = math.inf
            return True
        cand.status = "pruned: its lower bound is above the best plan"
        bounds_left[id(info)] = max(info.bound_ms, best_ms)
        return True

    optimized: set[int] = set()
    # per placement problem: the best (permutation, split) any earlier call found, which seeds
    # a later MILP of the same block (the refinement pass) instead of a new annealing warm start
    block_seed: dict[int, tuple] = {}

    def relaxed_block_bound(pr: PlacementProblem, cuts: list, left_s: float):
        """One block's placement-relaxed bound against the incumbent, and the cuts: the
        fractional split first (a linear program), then, when that lands within 2% below the
        incumbent, the integral split, which may settle it."""
        r = solve_milp(pr, relax_placement=True, initial_cuts=cuts, integral_layers=False,
                       cutoff_ms=best_ms, time_limit_s=budget(min(10.0, left_s / 4)))
        cuts, bound = r.cuts, r.bound_ms
        if best_ms * (1 - 0.02) < bound < best_ms * (1 - 1e-9):
            r = solve_milp(pr, relax_placement=True, initial_cuts=cuts, cutoff_ms=best_ms,
                           time_limit_s=budget(min(5.0, left_s / 8)))
            cuts, bound = r.cuts, max(bound, r.bound_ms)
        return bound, cuts

    def optimize(info, per_block: float, label: str, clock: bool = False) -> None:
        """Optimize placement and split of every block of one shape (MILP with an annealing
        warm start, or annealing), within `per_block` seconds a block; record its best plan
        and its bound. `clock`: anneal with cooling planned over the block's time (as the
        anneal method does) instead of a fixed number of moves."""
        nonlocal best_ms, best_plan, solved
        optimized.add(id(info))
        cand = candidates[id(info)]
        probs = probs_of[id(info)]
        cuts = cuts_of.get(id(info), pool.get(graph_key(info.shape), []))
        shape_bound = math.inf
        shape_best = math.inf
        for prob in probs:
            blk = prob.block
            if block_bounds.get(id(prob), 0.0) >= best_ms * (1 - 1e-9):
                # this block's layout cannot beat the incumbent even on the cheapest links
                shape_bound = min(shape_bound, block_bounds[id(prob)])
                continue
            left_now = time_limit_s - (work.now() - t0)
            if left_now < MIN_CALL_S and best_plan is not None:
                # time-true: the limit is reached; this block keeps the shape's closed-form
                # bound and the answer is not a proof
                shape_bound = min(shape_bound, info.bound_ms)
                continue
            per_block_now = min(per_block, max(MIN_CALL_S, left_now))
            if progress:
                progress(f"{label} {info.shape.describe()}, {blk.describe()}; best "
                         f"{best_ms / 1e3:.3f} s, bound {min(bounds_left.values()) / 1e3:.3f} s")
            res = None
            if method == "exact" and enumerable(prob):
                # small enough to try every placement and split: the block's optimum, proven
                # by enumeration, in less time than the warm start alone (solvers.brute)
                res = brute_force(prob, deadline_s=t0 + time_limit_s)
                enumerated[0] += res.termination != "time_limit"
            why_not = milp_supported(prob) if method == "exact" and res is None else None
            if why_not is not None:
                not_covered[why_not] = not_covered.get(why_not, 0) + 1
            if method == "exact" and res is None and why_not is None and \
                    per_block_now < milp_start_s(prob):
                # too little time to even build the MILP: anneal the block's share instead (a
                # quarter of it to the warm start and the rest to a MILP that could not start
                # had made the plan depend on the warm start's length alone: a synthetic
                # 8-node solve ended 775.38 ms at 4 and 6 work-s, 774.91 at 2 and 10)
                why_not = "too little time to build the MILP"
                not_covered[why_not] = not_covered.get(why_not, 0) + 1
            if method == "exact" and res is None and why_not is None and \
                    math.isfinite(shape_best) and id(prob) not in block_bounds:
                # another block of this shape has a plan: this block's placement-relaxed bound
                # (tenths of a second) may rule it out before its warm start (a second)
                try:
                    b_ms, cuts = relaxed_block_bound(prob, cuts, per_block_now)
                    block_bounds[id(prob)] = b_ms
                    if b_ms >= best_ms * (1 - 1e-9):
                        shape_bound = min(shape_bound, b_ms)
                        continue
                except Exception as e:  # noqa: BLE001  (reported; the MILP below still runs)
                    failed(info, e)
            if method == "exact" and res is None and why_not is None:
                t_block = work.now()
                seeds = [(list(range(prob.num_slots)), prob.start_layers())]
                if id(prob) in block_seed:
                    seeds.append(block_seed[id(prob)])
                else:
                    # cooling planned by the clock (unless every run must take a fixed
                    # number of moves): on the example, 1500 moves cut off by the 1 s limit
                    # end 0.1% above the optimum, a chain cooled over 1 s reaches it
                    warm = anneal(prob, seed=seed,
                                  iters=None if anneal_clock else min(anneal_iters or 1500,
                                                                      1500),
                                  time_limit_s=min(per_block_now / 4, WARM_START_S),
                                  restarts=2)
                    if warm.plan is not None:
                        seeds.append((_perm_of(prob, warm.plan),
                                      tuple(warm.plan.shape.layers)))
                try:
                    milp_s = budget(per_block_now - (work.now() - t_block))
                    res = solve_milp(prob, time_limit_s=milp_s, seed_solutions=seeds,
                                     initial_cuts=cuts, cutoff_ms=best_ms)
                    cuts = res.cuts
                    pool[graph_key(info.shape)] = cuts
                except Exception as e:  # noqa: BLE001  (reported; the annealer takes over)
                    failed(info, e)
                    res = None
            relaxed_ms, start = 0.0, {}
            if method == "exact" and res is None and why_not == INTRA_RATES_DIFFER:
                # nodes differ only in their intra-node rate: the MILP over the same block with
                # every node at the fastest rate bounds this one (milp.intra_relaxed), and its
                # plan, timed on the real links, starts the annealer
                rp = intra_relaxed(prob)
                if rp is not None:
                    try:
                        t_rel = work.now()
                        rr = solve_milp(rp, time_limit_s=budget(per_block_now / 2),
                                        cutoff_ms=best_ms)
                        relaxed_ms = rr.bound_ms
                        if rr.plan is not None:
                            start = dict(init_perm=_perm_of(prob, rr.plan),
                                         init_layers=tuple(rr.plan.shape.layers))
                        per_block_now = max(MIN_CALL_S, per_block_now - (work.now() - t_rel))
                    except Exception as e:  # noqa: BLE001  (reported; the annealer goes on)
                        failed(info, e)
                if relaxed_ms >= best_ms * (1 - 1e-9):
                    # even on the fastest links this layout cannot beat the incumbent
                    shape_bound = min(shape_bound, max(relaxed_ms, prob.lower_bound_ms()))
                    continue
            if res is None:
                res = anneal(prob, seed=seed, time_limit_s=per_block_now,
                             iters=None if anneal_clock and (method == "anneal" or clock)
                             else (anneal_iters or 3000), **start)
                res.bound_ms = max(info.bound_ms, relaxed_ms)
            # every result's bound is valid (a MILP stopped early keeps at least the shape's
            # closed-form bound; infeasible blocks bound at infinity)
            shape_bound = min(shape_bound, max(res.bound_ms, prob.lower_bound_ms()))
            if res.plan is not None and res.objective_ms < shape_best:
                shape_best = res.objective_ms
            if res.plan is not None:
                block_seed[id(prob)] = (_perm_of(prob, res.plan), tuple(res.plan.shape.layers))
            if res.plan is not None and res.objective_ms < best_ms:
                best_ms, best_plan = res.objective_ms, res.plan
                cand.plan = res.plan
        solved += 1
        cand.best_ms = shape_best if math.isfinite(shape_best) else None
        bounds_left[id(info)] = max(info.bound_ms, shape_bound) if math.isfinite(
            shape_bound) else math.inf

    survivors = []
    # the time may run out before every shape is bounded: smallest closed-form bound first,
    # as those set the reported gap (phase B still goes by quick score); the exact search
    # keeps its incumbent shape first (the n_done == 0 branch below gives it its time). In
    # quick-score order a short exact search had left the shapes of the smallest bounds
    # unbounded at any budget (a synthetic 8-node solve: 590.26 ms at 2 to 10 work-s; smallest
    # first: 607.85 at 2, 659.50 at 10)
    order_a = (sorted(infos, key=lambda i: i.bound_ms) if method == "anneal" else
               infos[:1] + sorted(infos[1:], key=lambda i: i.bound_ms))
    for n_done, info in enumerate(order_a):
        cand = candidates[id(info)]
        if pruned(info, cand):
            continue
        left = time_limit_s - (work.now() - t0)
        if left <= 0 or not info.screened:
            cand.status = "not searched (time limit)" if info.bounded else NOT_BOUNDED
            continue
        blks = blocks_for(cluster, info.shape, job)
        if space.launch_orders is not None:
            kept = [b for b in blks if block_launchable(info.shape, b, space.launch_orders)]
            unlaunchable[0] += len(blks) - len(kept)
            unlaunchable[1] += bool(blks) and not kept
            blks = kept
        probs = [PlacementProblem(model, job, cluster, info.shape, blk, options)
                 for blk in blks]
        probs_of[id(info)] = probs
        if not probs:
            none_at_all = blocks_for(cluster, info.shape) == []
            cand.status = ("no block layout fits this cluster's nodes" if none_at_all else
                           "no block layout where DeepEP can start its EP groups (each "
                           "inside a node, or over whole 8-GPU nodes)"
                           if not blocks_for(cluster, info.shape, job) else
                           "no block layout fits this cluster's nodes" if not unlaunchable[0]
                           else "no block layout the framework's torchrun launch can start")
            # a shape with no block layout at all keeps its closed-form bound, which then
            # holds for every placement (bounds.best_dp_ring_gb_per_s takes the loosest ring):
            # its Megatron-LM placement may be the plan, and nothing better is ruled out (a
            # gap of 0 had been reported where that bound left 10.6%); one whose layouts
            # the launch cannot start is outside the space asked for
            bounds_left[id(info)] = info.bound_ms if none_at_all else math.inf
            continue
        cuts: list = pool.setdefault(graph_key(info.shape), [])
        if n_done == 0 and method == "exact" and not uniform:
            # the best quick score first, solved outright: its optimum is the incumbent every
            # other shape's bound is held against (a better one prunes more, and sooner)
            optimize(info, budget(left * FIRST_SHAPE_SHARE / len(probs)), "incumbent shape",
                     clock=all(milp_supported(pr) is not None for pr in probs))
            if candidates[id(info)].status == "":
                survivors.append(info)
            continue
        bound_left_s = min(left, bound_until - work.now())
        # the problem whose MILP bounds each block: the block's own, or where the nodes differ
        # only in their intra-node rate the same block with every node at the fastest
        bounding = [pr if milp_supported(pr) is None else intra_relaxed(pr) for pr in probs]
        if bound_left_s > 0 and all(br is not None for br in bounding):
            left = bound_left_s
            if progress:
                progress(f"bounding shape {n_done + 1}/{len(infos)} {info.shape.describe()}; "
                         f"best {best_ms / 1e3:.3f} s")
            try:
                rb = math.inf
                exact_all = uniform
                for pr, br in zip(probs, bounding):
                    if uniform:
                        r, plan_ms = _uniform_block(pr, cuts, best_ms, left)
                        cuts = r.cuts
                        if plan_ms is not None:
                            ms, plan = plan_ms
                            cand.best_ms = min(cand.best_ms or math.inf, ms)
                            if ms < best_ms:
                                best_ms, best_plan = ms, plan
                                cand.plan = plan
                        exact_all &= r.termination in ("optimal", "cutoff", "infeasible")
                        rb = min(rb, r.bound_ms)
                        block_bounds[id(pr)] = r.bound_ms
                        continue
                    b_ms, cuts = relaxed_block_bound(br, cuts, left)
                    rb = min(rb, b_ms)
                    block_bounds[id(pr)] = b_ms
                info.bound_ms = max(info.bound_ms, rb)
                bounds_left[id(info)] = info.bound_ms
                cand.lower_bound_ms = info.bound_ms
                if uniform and exact_all:
                    # settled exactly: its bound is its best plan (or the incumbent's cutoff)
                    solved += 1
                    pool[graph_key(info.shape)] = cuts
                    if cand.best_ms is not None and cand.best_ms >= best_ms * (1 + 1e-9):
                        cand.status = "slower"
                    elif cand.best_ms is None:
                        cand.status = ("pruned: its best split cannot beat the best plan"
                                       if math.isfinite(info.bound_ms) else
                                       "no split fits in memory")
                    continue
            except Exception as e:  # noqa: BLE001  (reported; the closed-form bound stands)
                failed(info, e)
            pool[graph_key(info.shape)] = cuts
            if info.bound_ms >= best_ms * (1 - 1e-9):
                cand.status = "pruned: even on the cheapest links it cannot beat the best plan"
                continue
        cuts_of[id(info)] = cuts
        pool[graph_key(info.shape)] = cuts
        survivors.append(info)
    # Phase B: optimize placement and split of the survivors, best quick score first.
    rank = {id(i): n for n, i in enumerate(infos)}
    survivors.sort(key=lambda i: rank[id(i)])
    for n_done, info in enumerate(survivors):
        if id(info) in optimized:
            continue
        cand = candidates[id(info)]
        if pruned(info, cand):
            continue
        left = time_limit_s - (work.now() - t0)
        if method == "anneal":
            # keep a little for the final report; no run shorter than half the limit, or a
            # second (a 1.5 s budget had annealed nothing, its screening leaving under a
            # second; with less, the late screening of Megatron-LM placements does better)
            left -= min(1.0, 0.02 * time_limit_s)
            if left < min(1.0, 0.5 * time_limit_s):
                left = 0.0
        if left <= 0 or (max_shapes is not None and solved >= max_shapes):
            cand.status = "not searched (time limit)"
            continue
        blocks_left = sum(len(probs_of[id(i)]) for i in survivors[n_done:])
        # exact method, a shape no block of which the MILP covers (EP groups or CP rings
        # across uneven links, ZeRO-3 there): the annealer is its only search, so it is
        # scheduled as the anneal method schedules shapes (the most promising first, time
        # shares as if at most ANNEAL_SHARES blocks remained, cooling by the clock); a fixed
        # move count would leave large placement spaces barely searched
        anneal_only = method == "exact" and all(milp_supported(pr) is not None
                                                for pr in probs_of[id(info)])
        if method == "anneal" or anneal_only:
            # the most promising shapes first: each block gets a share of the time left as
            # if at most ANNEAL_SHARES blocks remained (shapes not reached stay unsearched,
            # with their valid bounds)
            blocks_left = min(blocks_left, ANNEAL_SHARES)
        optimize(info, budget(left / max(1, blocks_left)),
                 f"shape {n_done + 1}/{len(survivors)}", clock=anneal_only)
    # time left with the exact method: shapes whose bound still keeps the gap open get
    # another MILP (their cuts pooled, the incumbent as cutoff), smallest bound first, until
    # the gap closes, the time runs out, or a round given all the time left raises no bound
    # (a round on half of it that raises none is followed by one on all of it: stopping
    # there had left a 30 s limit at 15 s with a 0.32% gap that 60 s closed); bounds only grow
    share = 0.5
    while method == "exact" and math.isfinite(best_ms):
        left = time_limit_s - (work.now() - t0)
        open_ = sorted((i for i in infos if id(i) in optimized
                        and bounds_left[id(i)] < best_ms * (1 - OPTIMAL_GAP)),
                       key=lambda i: bounds_left[id(i)])
        if not open_ or left < 2.0:
            break
        info = open_[0]
        before = bounds_left[id(info)]
        optimize(info, budget(left * share / max(1, len(probs_of[id(info)]))), "refining")
        bounds_left[id(info)] = max(before, bounds_left[id(info)])
        if bounds_left[id(info)] > before * (1 + 1e-9):
            share = 0.5
        elif share < 1.0:
            share = 1.0
        else:
            break
    # anytime: time left over (the phases ended early) screens the shapes the screening's
    # deadline skipped, smallest bound first; a better quick score becomes the plan (its
    # bound stays the closed form: not a proof)
    late = sorted((i for i in infos if not i.screened), key=lambda i: (i.bounded, i.bound_ms))
    for info in late:
        cand = candidates[id(info)]
        if time_limit_s - (work.now() - t0) < 2 * MIN_CALL_S:
            break
        if not info.bounded:  # the bounding's deadline cut it off: bound it now
            info.bound_ms = cand.lower_bound_ms = shape_bound_ms(model, job, cluster,
                                                                 info.shape, options)
            info.bounded = True
            bounds_left[id(info)] = info.bound_ms
            cand.status = "not searched (time limit)"
        if pruned(info, cand):
            continue
        new, misfit = screen_shape(model, job, cluster, options, info.shape, info.bound_ms,
                                   best_ms)
        if misfit is not None:
            cand.status = misfit.status
            bounds_left[id(info)] = math.inf
            continue
        info.screened, info.layers, info.quick_ms = True, new.layers, new.quick_ms
        cand.quick_ms = new.quick_ms
        cand.status = "screened late (Megatron placement, balanced split)"
        if new.quick_ms is not None and new.quick_ms < best_ms:
            best_ms = new.quick_ms
            best_plan = Plan(with_layers(info.shape, new.layers), megatron_placement(
                cluster, info.shape.tp, info.shape.pp, info.shape.cols))
            cand.best_ms, cand.plan = new.quick_ms, best_plan
    for info in infos:
        c = candidates[id(info)]
        if c.best_ms is not None and c.status == "":
            c.status = "slower"
        elif c.status == "":
            c.status = "not searched"
    unscreened = [i for i in infos if not i.screened]
    if best_plan is None and unscreened:
        closest = _closest_misfit(rejected)
        fit = len(infos) - len(unscreened)  # screened, fit, but no plan timed in the time
        raise InfeasibleError(
            f"no plan found within the time limit: {fit + len(rejected)} of {total} shapes "
            "screened, " + (f"{fit} of them fit but got no plan in the time" if fit else
                            "none of them fits")
            + (f" (the closest misfit, {closest.describe}: "
               f"{closest.status.removeprefix('does not fit: ')})" if closest else "")
            + f"; {len(unscreened)} not screened yet. Give the search more time (--time-limit) "
            "to screen them, or narrow the space (--tp, --pp, --mbs, --recompute)")
    if best_plan is None and len({nd.gpu.memory_gib for nd in cluster.nodes}) > 1:
        raise InfeasibleError(
            f"nothing fits in GPU memory: the {len(infos)} shapes whose splits fit some "
            "placement on these GPUs of several memory sizes found no placement that holds "
            "them in the time given (the first: " + infos[0].shape.describe() + "). Give the "
            "search more time (--time-limit), or more GPUs or memory")
    if best_plan is None:  # every shape that fits was left with an infinite lower bound
        raise InfeasibleError(
            f"no plan could be timed: the {len(infos)} shapes that fit in memory all have an "
            f"infinite lower bound (the first: {infos[0].shape.describe()}); this is a bug of "
            "the search, please report it with the command line")
    # the plan's split with Megatron-LM's placement: under a short time limit the search can
    # end on a placement worse than that (a helper saw compare's exact row 0.85% slower than
    # its Megatron-placement row of the same split, 16 nodes, 10 s); one estimate settles it
    old = best_plan
    best_plan, best_ms = megatron_polish(model, job, cluster, options, best_plan, best_ms)
    if best_plan is not old:
        for c in candidates.values():
            if c.plan is old:
                c.plan, c.best_ms = best_plan, best_ms
    bound = min(bounds_left.values())
    bound = min(bound, best_ms)
    gap = (best_ms - bound) / best_ms if best_ms > 0 else 0.0
    # every bound in bounds_left is valid (MILP, relaxed or closed form), so a gap within
    # the tolerance is a proof whichever method produced the plan
    termination = "optimal" if gap <= OPTIMAL_GAP * (1 + 1e-3) else (
        "time_limit" if any(c.status.startswith("not searched") for c in candidates.values())
        else "feasible")
    # the bounds cover block layouts (space.blocks_for); a plan outside them (Megatron-LM's
    # own rank order, scored by the screening) that beats them all is no proof: other
    # placements outside blocks are not searched (a helper found one 0.3% faster than such
    # a plan reported "optimal", gap 0)
    outside = block_of(cluster, best_plan.shape, best_plan.placement) is None
    outside_note = [] if not work.stop_offset() else [
        f"stopped by Ctrl-C after {time.perf_counter() - wall0:.1f} s: the best plan found "
        "by then and the bound proven by then"]
    if outside:
        if termination == "optimal":
            termination = "feasible"
        outside_note += [
            "the plan is Megatron-LM's own rank placement, outside the block layouts (each "
            "node one rectangle of stages x replicas) that the search and its bound cover; "
            "the search found no block placement faster, but placements outside blocks are "
            "neither searched nor bounded, so it is not proven optimal"
            if blocks_for(cluster, best_plan.shape) else
            "the plan is Megatron-LM's own rank placement: no block layout of its shape exists "
            "on these nodes, so the search scores that placement only, and the bound is the "
            "shapes' closed form over every placement: it is not proven optimal"]
    est = Evaluator(model, job, cluster, best_plan.shape, options).estimate(best_plan.placement)
    # what the default search left out, with the time left (a faster plan there is named)
    if progress:
        progress("looking beyond the default search space")
    beyond = beyond_default_space(model, job, cluster, options, space, best_ms,
                                  t0 + time_limit_s)
    ordered = sorted(candidates.values(), key=lambda c: (c.best_ms or c.quick_ms or math.inf))
    for c in ordered:
        timed = c.best_ms if c.best_ms is not None else c.quick_ms
        if c.plan is best_plan or (c.describe == best_plan.shape.describe() and
                                   timed is not None and abs(timed - best_ms) < 1e-9):
            c.status = "best"
    return SolveResult(best_plan, est, best_ms, bound, termination, method,
                       time.perf_counter() - wall0, ordered + rejected, total, solved,
                       errors=errors, not_covered=not_covered, clock=clock,
                       blocks_enumerated=enumerated[0], shapes_too_long=len(too_long),
                       work_s=(work.now() - work.stop_offset() - t0
                               if clock == "work" else None),
                       outside_blocks=outside, beyond=beyond,
                       notes=outside_note + unused_values(space, [i.shape for i in infos]
                                           + [c.shape for c in rejected if c.shape]
                                           + too_long)
                       + ([f"placements limited to what torchrun can start in the "
                           f"framework's rank order{'s' * (len(space.launch_orders) > 1)} "
                           f"(--emit): {unlaunchable[0]} block layout(s) of the shapes "
                           f"searched left out"
                           + (f", {unlaunchable[1]} shape(s) left with none"
                              if unlaunchable[1] else "")] if unlaunchable[0] else []))
