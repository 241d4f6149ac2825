"""Speed of one estimate: the solver hot path and the full report.

Instance (issue 3 / the estimator issue's target): GPT-3 175B (preset gpt3-175b) on a uniform
cluster of 12 nodes x 8 A100-80GB (240 GB/s NVLink, 23 GB/s per inter-node stream), TP=8, PP=12,
DP=1, global batch 64, micro-batch 1 (64 micro-batches per iteration), 1F1B, full recompute,
Megatron-LM's placement. Reports the median over repeats, in the two regimes a process runs in (model/walk_jit.py):
Python walks (a one-shot `estimate`, or a search's first ~0.25 s) and compiled walks (a search
once it has walked JIT_AFTER_NODES nodes). Each regime is set explicitly: the compiled kernels
are loaded (and waited for) before the second, so no background load competes for the GIL
while a figure is timed.
  (c) the first call, compiling the schedule graph (the compile cache is cleared each repeat);
  (a) Evaluator.iteration_ms(placement): the solvers' hot path, schedule already compiled, for
      a placement the Evaluator has not seen (its per-replica / per-stage memo cleared before
      each call); (a') the same call repeated (memo hit: what an annealing move that leaves a
      replica unchanged costs for that replica);
  (b) estimate(): building the Evaluator plus Evaluator.estimate (schedule cached).
Target: <= 20 ms per estimate.

Run:   python bench/estimator_speed.py            (default: 200 / 50 / 10 repeats)
       python bench/estimator_speed.py --quick    (50 / 10 / 3 repeats)
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from formats.clusters import uniform_cluster  # noqa: E402
from model.estimator import Evaluator, estimate, make_plan  # noqa: E402
from model import walk_jit  # noqa: E402
from model.schedule import compile_schedule  # noqa: E402
from model.specs import JobSpec  # noqa: E402


def median_ms(fn, repeats, before=None):
    out = []
    for _ in range(repeats):
        if before:
            before()
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out), min(out), max(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--repeats", type=int, default=None, help="repeats of (a); (b) 1/4, (c) 1/20")
    a = ap.parse_args(argv)
    n_a = a.repeats or (50 if a.quick else 200)
    n_b, n_c = max(3, n_a // 4), max(3, n_a // 20)

    model = presets.model("gpt3-175b")
    job = JobSpec(global_batch=64, seq_length=2048, precision="fp16")
    cluster = uniform_cluster(12, 8, "A100-80GB", 240.0, 23.0)
    plan = make_plan(model, job, cluster, tp=8, pp=12, dp=1, micro_batch=1, recompute="full")
    ev = Evaluator(model, job, cluster, plan.shape)
    assert ev.m == 64
    it_ms = ev.iteration_ms(plan.placement)
    print(f"instance: {model.name}, {cluster.num_nodes} nodes x 8 A100-80GB, TP=8 PP=12 DP=1, "
          f"global batch 64, mbs 1 -> {ev.m} micro-batches, full recompute; "
          f"schedule graph {ev.cs.num_nodes} nodes; predicted iteration {it_ms:.1f} ms")

    def clear_memo():
        for name in ("_replica_cache", "_path_cache", "_tail_cache"):
            getattr(ev, name, {}).clear()

    def measure():
        """(c), (a), (a'), (b) in the regime the process is in now."""
        rc = median_ms(lambda: estimate(model, job, cluster, plan), n_c,
                       before=compile_schedule.cache_clear)
        ev.iteration_ms(plan.placement)  # the graph compiled again, for (a)
        ra = median_ms(lambda: ev.iteration_ms(plan.placement), n_a, before=clear_memo)
        ev.iteration_ms(plan.placement)
        ra2 = median_ms(lambda: ev.iteration_ms(plan.placement), n_a)
        rb = median_ms(lambda: estimate(model, job, cluster, plan), n_b)
        return {"c": (rc, n_c), "a": (ra, n_a), "a'": (ra2, n_a), "b": (rb, n_b)}

    # Python walks throughout: keep the kernels from loading while this regime is timed
    os.environ["PIPETTE_JIT"] = "0"
    regimes = [("Python walks", measure())]
    del os.environ["PIPETTE_JIT"]
    if walk_jit.load():  # blocks until numba's kernels are loaded
        regimes.append(("compiled walks", measure()))
    else:
        print(f"compiled walks unavailable: {walk_jit._state['error']}")

    names = {"c": "(c) first call incl. compiling the schedule",
             "a": "(a) Evaluator.iteration_ms (hot path, schedule cached)",
             "a'": "(a') the same, placement seen before (memo hit)",
             "b": "(b) estimate() incl. Evaluator build (schedule cached)"}
    print(f"{'what':<56} {'regime':<15} {'median ms':>10} {'min':>8} {'max':>8} {'repeats':>8}")
    for key, name in names.items():
        for regime, res in regimes:
            (med, lo, hi), n = res[key]
            print(f"{name:<56} {regime:<15} {med:>10.2f} {lo:>8.2f} {hi:>8.2f} {n:>8}")
    verdict = ", ".join(f"{key} {'met' if max(r[key][0][0] for _, r in regimes) <= 20 else 'NOT met'}"
                        for key in ("a", "b", "c"))
    print(f"target <= 20 ms per estimate, in every regime: {verdict}")

if __name__ == "__main__":
    main()
