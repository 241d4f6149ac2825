"""Research entry point: exact vs annealing vs baselines on one instance, one cost model.

Baselines, each re-evaluated with this project's estimator on the cluster as measured:
- "megatron": the exact solver's best plan, its degrees and layer split, with Megatron-LM's
  default rank placement instead of the searched one: what placement alone gains. (It had
  taken the balanced split, or where that did not fit a memory-balanced one, and so charged
  placement with a split's cost: +33% on a uniform 8 x 8 H100 cluster, where placement cannot
  matter. The sweep's "megatron" task is the plain launch: see solvers/sweep.py.)
- "amp-style": the plan an AMP-style model (Li et al., NeurIPS 2022) would pick: it sees every
  inter-node link at the cluster's mean bandwidth and counts pipeline communication once
  (transfers overlap with compute: `Options(blocking_p2p=False)`); it places ranks in Megatron-LM
  order. Its choice is then scored with the real matrix and blocking send/receive.
"""

from __future__ import annotations

import time

import numpy as np

from model.cluster import ClusterSpec
from model.estimator import Evaluator
from model.plan import Plan, megatron_placement
from model.specs import JobSpec, ModelSpec, Options

from .search import prepare_shapes, solve
from .space import SearchSpace, cp_degrees, with_layers


def _uniform_view(c: ClusterSpec) -> ClusterSpec:
    from dataclasses import replace

    bw = c.inter_gb_per_s
    off = ~np.eye(c.num_nodes, dtype=bool)
    mean = float(bw[off].mean()) if c.num_nodes > 1 else 1.0
    u = np.where(off, mean, 0.0)
    return replace(c, inter_gb_per_s=u, name=c.name + " (uniform mean)")


def amp_style_plan(model: ModelSpec, job: JobSpec, cluster: ClusterSpec,
                   space: SearchSpace = SearchSpace()) -> Plan | None:
    view = _uniform_view(cluster)
    infos, _rej, _n = prepare_shapes(model, job, view, Options(blocking_p2p=False), space)
    infos = [i for i in infos if i.quick_ms is not None]
    if not infos:
        return None
    best = min(infos, key=lambda i: i.quick_ms)
    return Plan(with_layers(best.shape, best.layers),
                megatron_placement(cluster, best.shape.tp, best.shape.pp, best.shape.cols))


def compare_instance(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, *,
                     time_limit_s: float = 120.0, seed: int = 0, options: Options | None = None,
                     progress=None, space: SearchSpace = SearchSpace(),
                     plans: dict | None = None, clock: str = "wall") -> list[dict]:
    """One row per method; `plans`, if given, receives each method's plan object. `clock`:
    solve's (the exact and anneal rows' time limits in work seconds with "work")."""
    options = options or Options()
    rows = []
    ex = solve(model, job, cluster, method="exact", time_limit_s=time_limit_s, seed=seed,
               options=options, progress=progress, space=space, clock=clock)
    an = solve(model, job, cluster, method="anneal", time_limit_s=time_limit_s, seed=seed,
               options=options, progress=progress, space=space, clock=clock)
    proven = ex.termination == "optimal"
    # unproven: the larger of the two searches' lower bounds (both valid over the same space;
    # the annealer's can be the tighter where it bounded other shapes first)
    ref = ex.objective_ms if proven else max(ex.bound_ms, an.bound_ms)

    def row(method, plan, ms, solve_s, prov, fits=True, gap=None, work_s=None, bound_ms=None):
        """`over_reference`: T / reference - 1, the reference the exact search's proven
        optimum or, unproven, the larger of the two searches' lower bounds (then not a gap to
        the optimum); `proven` gives
        the exact search's own gap, (T - bound) / T as solve reports it, in words; for
        scripts, `proven_optimal` (the exact row's proof), `solver_gap` (the exact row's
        gap, None for the others) and `fits` say the same as values. `solve_s` is wall
        seconds whatever the clock; `work_s` the work seconds a search used under
        clock="work" (None otherwise, and for the baselines); `bound_ms` a search's own
        lower bound."""
        if plans is not None:
            plans[method] = plan
        return {"cluster": cluster.name, "method": method,
                "plan": plan.shape.describe() if plan else "-", "iteration_ms": ms,
                "over_reference": (ms - ref) / ref if ref and ms is not None else None,
                "reference": "proven optimum" if proven else "lower bound",
                "solve_s": solve_s, "work_s": work_s, "bound_ms": bound_ms, "clock": clock,
                "time_limit_s": time_limit_s,
                "seed": seed, "proven": prov,
                **_proof(method == "exact" and proven, gap, fits)}

    # blocks the MILP does not cover were annealed inside the exact search: its row says so
    # (an 'exact' row equal to the annealer's had read as a meaningless race)
    annealed = sum(ex.not_covered.values())
    fell_back = (f"; {annealed} placement problem(s) annealed, not by the MILP: "
                 + "; ".join(ex.not_covered) if annealed else "")
    rows.append(row("exact", ex.plan, ex.objective_ms, ex.wall_s,
                    f"yes (solver gap {ex.gap * 100:.3f}%{fell_back})" if proven else
                    f"no (solver gap {ex.gap * 100:.2f}%{fell_back})", gap=ex.gap,
                    work_s=ex.work_s, bound_ms=ex.bound_ms))
    rows.append(row("anneal", an.plan, an.objective_ms, an.wall_s, "no (heuristic)",
                    work_s=an.work_s, bound_ms=an.bound_ms))
    t0 = time.perf_counter()
    sh = ex.plan.shape  # its split too: the row's difference from "exact" is placement alone
    meg = Plan(sh, megatron_placement(cluster, sh.tp, sh.pp, sh.cols))
    meg_est = Evaluator(model, job, cluster, meg.shape, options).estimate(meg.placement)
    rows.append(row("megatron", meg, meg_est.iteration_ms, time.perf_counter() - t0,
                    "baseline" if meg_est.fits else "baseline (does not fit)",
                    fits=meg_est.fits))
    t0 = time.perf_counter()
    amp = amp_style_plan(model, job, cluster, space)
    if amp is not None:
        ev = Evaluator(model, job, cluster, amp.shape, options)
        ms = ev.iteration_ms(amp.placement)
        fits = ev.estimate(amp.placement).fits  # each stage on its hosts' memory
        rows.append(row("amp-style", amp, ms, time.perf_counter() - t0,
                        "baseline" if fits else "baseline (does not fit)", fits=fits))
    else:  # said, not left out: the row is the baseline's answer
        rows.append({**row("amp-style", None, None, time.perf_counter() - t0,
                           "none: no shape fits in Megatron-LM's rank order on the "
                           "mean-bandwidth view (the AMP-style model's only placement)"),
                     "fits": None})
    return rows


def _proof(proven: bool, gap: float | None, fits: bool | None) -> dict:
    """A row's proof and fit as values, for scripts (`proven_optimal`, `solver_gap`: the
    search's own gap, None where there is no search or no plan; `fits`: None with no plan)."""
    return {"proven_optimal": proven, "solver_gap": gap, "fits": fits}


SHARDING_OPTIONS = (("ZeRO-1 (distributed optimizer)", 1, 0), ("ZeRO-3 / FSDP", 3, 0),
                    ("HSDP (shard in a node)", 3, -1))


def compare_sharding(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, *,
                     time_limit_s: float = 60.0, seed: int = 0, options: Options | None = None,
                     space: SearchSpace = SearchSpace(), progress=None,
                     clock: str = "wall", plans: dict | None = None) -> list[dict]:
    """The best plan under each data-parallel sharding (ZeRO-1, ZeRO-3, HSDP with one node's
    replicas per shard group), each found by the full search restricted to it: iteration
    time, peak memory, the plan, and the search's proof status; `plans`, if given, receives
    each row's plan object under its row's label (None where nothing fits)."""
    from dataclasses import replace

    from model.errors import InfeasibleError, PipetteError

    options = options or Options()
    rows = []
    why_none: list[tuple[str, PipetteError]] = []  # user-facing reasons no plan came, by row
    for label, zero, shard in SHARDING_OPTIONS:
        if job.framework == "torchtitan" and zero == 1:  # said, not left out
            rows.append({"sharding": label, "plan": "-", "iteration_ms": None,
                         "peak_memory_gib": None, "solve_s": None, "work_s": None,
                         "bound_ms": None,
                         "termination": "none: torchtitan runs DDP or FSDP2, no ZeRO-1",
                         **_proof(False, None, None)})
            continue
        spaces = [replace(space, zero=(zero,), shard_sizes=(0,))]
        if shard < 0 and space.shard_sizes:
            # HSDP with the shard groups the user gave (--shard-size)
            spaces = [replace(space, zero=(zero,))]
            label = (f"HSDP (shard groups of {','.join(map(str, space.shard_sizes))} "
                     "data-parallel ranks)")
        elif shard < 0:
            # HSDP: the replicas of one node form a shard group, for each TP and CP degree (a
            # group holds shard_size data-parallel ranks times CP: model.plan Shape)
            G = cluster.gpus_per_node or 0
            spaces = [replace(space, zero=(zero,), tp=(t,), cp=(c,),
                              shard_sizes=(G // (t * c),))
                      for t in (space.tp or (1, 2, 4, 8))
                      for c in cp_degrees(job, cluster, space)
                      if G % (t * c) == 0 and G // (t * c) > 1]
            if not spaces:
                rows.append({"sharding": label, "plan": "-", "iteration_ms": None,
                             "peak_memory_gib": None, "solve_s": None, "work_s": None,
                             "bound_ms": None,
                             "termination": "none: no HSDP layout: TP x CP fills a node (no "
                             "node holds two data-parallel ranks to shard over); give "
                             "--shard-size for groups across nodes",
                             **_proof(False, None, None)})
                continue
        best, errors, wall, work_s = None, [], 0.0, 0.0
        for sp in spaces:
            try:
                r = solve(model, job.__class__(**{**job.__dict__, "zero": None,
                                                  "distributed_optimizer": None}),
                          cluster, time_limit_s=time_limit_s / len(spaces), seed=seed,
                          options=options, space=sp, progress=progress, clock=clock)
            except Exception as e:  # noqa: BLE001  (nothing fits under this sharding: say so)
                errors.append(str(e))
                if isinstance(e, PipetteError):
                    why_none.append((label, e))
                continue
            wall += r.wall_s
            work_s += r.work_s or 0.0
            if best is None or r.objective_ms < best.objective_ms:
                best = r
        if best is None:
            rows.append({"sharding": label, "plan": "-", "iteration_ms": None,
                         "peak_memory_gib": None, "termination": f"none: {errors[0]}",
                         "solve_s": None, "work_s": None, "bound_ms": None,
                         **_proof(False, None, None)})
            continue
        if plans is not None:
            plans[label] = best.plan
        rows.append({"sharding": label, "plan": best.plan.shape.describe(),
                     "iteration_ms": best.objective_ms,
                     "peak_memory_gib": best.estimate.peak_memory_gib,
                     "termination": f"{best.termination} (gap {best.gap * 100:.2g}%)",
                     "solve_s": wall, "work_s": work_s if clock == "work" else None,
                     "bound_ms": best.bound_ms, **_proof(best.termination == "optimal", best.gap,
                                               best.estimate.fits)})
    if why_none and all(r["iteration_ms"] is None for r in rows):
        # No sharding gives a plan: say why as solve and compare without --sharding do (one
        # line, exit 2), not in a table of 'none' rows (it had exited 0). Each row's own error
        # speaks of its restricted space ("Not searched: ZeRO-3" under ZeRO-1): the search the
        # user asked for gives the explanation; where it finds a plan, no sharding applies.
        r = solve(model, job, cluster, time_limit_s=time_limit_s, seed=seed, options=options,
                  space=space, progress=progress, clock=clock)
        label, e = why_none[0]
        first = getattr(e, "problem", str(e))  # a SpecError's, without its source and field
        raise InfeasibleError(
            f"none of the shardings compared (ZeRO-1, ZeRO-3, HSDP) gives a plan on "
            f"{cluster.name} ({label}: {first}); the search without them finds "
            f"{r.plan.shape.describe()}: compare without --sharding")
    # each row records what produced it, as compare_instance's rows do
    return [{**r, "clock": clock, "time_limit_s": time_limit_s, "seed": seed} for r in rows]
