"""Research sweeps: a grid of (model, cluster, job, method, budget, seed) tasks, each one solve,
run in worker processes, each finished task appended to a results store that survives being
killed (formats/results.py), and a rerun that skips what is done.

Spec (TOML; data/sweeps/example.toml):

    [sweep]
    name = "example"
    methods = ["exact", "anneal", "megatron"]   # the task's solver (below)
    budgets = [2.0, 5.0]                         # time limits, s
    seeds = [0]
    clock = "work"        # optional: budgets in work seconds (model.work), so that every
                          # executor, machine and load gives the same answer; "wall" (the
                          # default) is solve's --time-limit
    anneal_moves = 3000   # optional: moves per annealing run instead of cooling by the
                          # clock (with clock = "wall" the annealer is then reproducible)
    [[models]]   name = "gpt-3.6b"  (a preset or a Hugging Face config.json)
    [[jobs]]     global_batch = 256, seq_length = 2048, precision = "bf16"
    [[clusters]] preset = "example"  |  file = "path.toml"  |
                 synth = {num_nodes = [4, 8], seed = [0, 1], ...}   (lists expand as a grid)

Methods: "exact" and "anneal" are `solve` with that method; "megatron" is the best plan the
screening scores, every shape with Megatron-LM's default placement and balanced split (what a
user gets by choosing the best degrees and launching plainly; it needs no other task);
"amp-style" is the plan an AMP-style model picks (uniform links at the mean, transfers
overlapped; solvers.compare.amp_style_plan), scored on the cluster as measured. The two
baselines search nothing: one task per instance (budget 0, seed 0), not one per budget and
seed.

Specs and task ids live in formats/sweepspec.py. A task's id is the SHA-256 of its inputs in
canonical JSON (model spec, cluster spec or synth parameters, job, method, budget, seed, and
the clock and move count when given): the same spec gives the same ids, so a rerun skips the
tasks the store holds. Only the driver writes the store; workers return results.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import platform
import time

from model.errors import SpecError

from .workers import die_with_parent


def run_task(t, build) -> dict:
    """One task in a worker: its plan, times, bound and status (never raises: a failure is
    a result with its error). `build(t)` gives (model, cluster, job) (formats.sweepspec)."""
    import numpy as np
    t0, c0 = time.perf_counter(), time.process_time()
    out = {"id": t.id, "inputs": t.inputs(), "status": "done", "error": None}
    try:
        model, cluster, job = build(t)
        off = cluster.inter_gb_per_s[~np.eye(cluster.num_nodes, dtype=bool)]
        out["nodes"] = cluster.num_nodes
        out["bw_spread"] = float(off.max() / off.min()) if off.size and off.min() > 0 else 1.0
        if t.method == "amp-style":
            from model.estimator import Evaluator
            from model.specs import Options
            from solvers.compare import amp_style_plan
            plan = amp_style_plan(model, job, cluster)
            if plan is None:
                from model.errors import InfeasibleError
                raise InfeasibleError("nothing fits in GPU memory: no shape the AMP-style "
                                      "model scores fits")
            ev = Evaluator(model, job, cluster, plan.shape, Options())
            out.update(plan=plan.shape.describe(), iteration_ms=ev.iteration_ms(plan.placement),
                       bound_ms=None, gap=None, termination="baseline",
                       peak_memory_gib=max(m.total_gib for m in ev.memory))
        elif t.method == "megatron":
            from model.specs import Options
            from solvers.search import prepare_shapes
            from solvers.space import SearchSpace
            infos, _rej, _n = prepare_shapes(model, job, cluster, Options(), SearchSpace())
            scored = [i for i in infos if i.quick_ms is not None]
            if not scored:
                from model.errors import InfeasibleError
                raise InfeasibleError("nothing fits in GPU memory: no valid shape fits with "
                                      "Megatron-LM's placement and balanced split")
            best = min(scored, key=lambda i: i.quick_ms)
            out.update(plan=best.shape.describe(), iteration_ms=best.quick_ms, bound_ms=None,
                       gap=None, termination="baseline", peak_memory_gib=best.peak_gib)
        else:
            from solvers.search import solve
            # a fixed move count replaces cooling by the clock; else solve's defaults
            moves = ({} if t.anneal_moves is None else
                     {"anneal_iters": t.anneal_moves, "anneal_clock": False})
            r = solve(model, job, cluster, method=t.method, time_limit_s=t.budget_s,
                      seed=t.seed, clock=t.clock, **moves)
            # work_s: the work seconds the search used, what a work-clock budget limits
            out.update(plan=r.plan.shape.describe(), iteration_ms=r.objective_ms,
                       bound_ms=r.bound_ms, gap=r.gap, termination=r.termination,
                       work_s=r.work_s, peak_memory_gib=r.estimate.peak_memory_gib
                       if r.estimate is not None else None)
    except Exception as e:  # noqa: BLE001  (recorded with the task; the sweep goes on)
        out.update(status="failed", error=f"{type(e).__name__}: {e}")
    out["wall_s"] = time.perf_counter() - t0
    out["cpu_s"] = time.process_time() - c0
    # what a result depends on besides its inputs (a work-clock budget: HiGHS's search path)
    out["versions"] = {"python": platform.python_version(),
                       **{k: _version(d) for k, d in (("pipette", "pipette-configurator"),
                                                      ("highspy", "highspy"),
                                                      ("numpy", "numpy"))}}
    return out


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # noqa: BLE001
        return "unknown"


def run_sweep(tasks: list, store, build, jobs: int | None = None, progress=None,
              executor: str = "local", ray_address: str | None = None) -> dict:
    """Run the tasks (formats.sweepspec.Task) the store does not hold; returns counts.
    `store` (formats.results.Store) is written by this process only, one committed row per
    finished task; `build` (formats.sweepspec.build_inputs, a module-level function the
    workers can import) turns a task into its inputs."""
    done = store.done_ids()
    todo = [t for t in tasks if t.id not in done]
    counts = {"total": len(tasks), "skipped": len(tasks) - len(todo), "done": 0, "failed": 0}
    if not todo:
        return counts
    if executor == "ray":
        return _run_ray(todo, store, build, counts, progress, ray_address)
    jobs = jobs or os.cpu_count() or 1
    retried: set[str] = set()
    queue = list(todo)
    while queue:
        # workers start from a fresh forkserver process, not by forking this one: a fork of a
        # process whose HiGHS threads are running can leave the child waiting on a lock
        # forever (observed in the test suite)
        ctx = multiprocessing.get_context(
            "forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
            else "spawn")
        with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx,
                                    initializer=die_with_parent) as pool:
            try:
                queue = _drain(pool, queue, store, build, counts, retried, progress)
            except BaseException:
                # interrupted (SIGINT to the driver alone, say): leaving the pool would wait for
                # every queued task and then drop their results; the queued ones are cancelled
                # and the busy workers stopped now (the recorded rows stay; the rest run again)
                # (the workers are taken before shutdown, which forgets them)
                procs = list((getattr(pool, "_processes", None) or {}).values())
                for proc in procs:
                    proc.terminate()
                for proc in procs:  # gone before the pool's own shutdown joins them
                    proc.join(timeout=5)
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    return counts


def _drain(pool, queue, store, build, counts, retried, progress) -> list:
    """Submit `queue` to the pool and record each result as it comes; returns the tasks to
    submit again (a worker died under them, once)."""
    futures = {}
    for t in queue:
        store.started(t.id)
        futures[pool.submit(run_task, t, build)] = t
    again = []
    for fut in cf.as_completed(futures):
        t = futures[fut]
        try:
            res = fut.result()
        except cf.process.BrokenProcessPool as e:  # a worker died
            if t.id in retried:
                res = {"id": t.id, "inputs": t.inputs(), "status": "failed",
                       "error": f"worker died twice: {e}"}
            else:
                retried.add(t.id)
                again.append(t)
                continue
        store.record(res)
        counts["done" if res["status"] == "done" else "failed"] += 1
        if progress:
            progress(counts, len(futures) - counts["done"] - counts["failed"])
    return again


def _run_ray(todo, store, build, counts, progress, address):
    try:
        import ray
    except ImportError:
        raise SpecError("--ray needs ray: pip install -e '.[sweep]'", source="options",
                        field="--ray") from None
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(max_retries=1)(run_task)
    pending = {}
    for t in todo:
        store.started(t.id)
        pending[remote.remote(t, build)] = t
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        ref = ready[0]
        t = pending.pop(ref)
        try:
            res = ray.get(ref)
        except Exception as e:  # noqa: BLE001  (the task failed twice: recorded)
            res = {"id": t.id, "inputs": t.inputs(), "status": "failed",
                   "error": f"{type(e).__name__}: {e}"}
        store.record(res)
        counts["done" if res["status"] == "done" else "failed"] += 1
        if progress:
            progress(counts, len(pending))
    return counts
