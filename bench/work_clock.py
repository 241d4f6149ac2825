"""The work clock (model/work.py) against the wall clock: how many wall seconds a work second
is, and that a budget in work seconds gives the same result twice.

    python bench/work_clock.py [--budget 10] [--quick]

Each instance is solved twice with `clock="work"` (the second time right after the first, with
the compiled walks loaded and the caches warm, so its wall time differs) and the two results
are compared (plan, time, bound, termination); then once with the wall clock at the same
budget. Prints per instance the work seconds used, the wall seconds of each run, their ratio,
and the wall-clock run's result beside the work-clock one. Instances: the built-in example,
synthetic clusters of 4, 8 and 16 nodes with one degraded NIC (the example sweep's kind), a
uniform 8-node cluster (bench/uniform_clusters.py's first) and 12 nodes of
bench/exact_scaling.py's random matrix; the exact and anneal methods.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from formats.clusters import SynthParams, cluster, synth_cluster, uniform_cluster  # noqa: E402
from model.specs import JobSpec  # noqa: E402
from solvers.search import solve  # noqa: E402


def _synth(n: int, seed: int = 0):
    return synth_cluster(SynthParams(num_nodes=n, seed=seed, nic_gb_per_s=12.5,
                                     oversubscription=2.0, degraded=1, degraded_factor=0.4))


def instances(quick: bool):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from exact_scaling import random_cluster
    gpt36 = presets.model("gpt-3.6b")
    out = [("example (llama2-70b)", presets.model("llama2-70b"), JobSpec(256, 4096, "bf16"),
            cluster("example")),
           ("synth 4 nodes", gpt36, JobSpec(128, 2048, "bf16"), _synth(4)),
           ("synth 8 nodes", gpt36, JobSpec(128, 2048, "bf16"), _synth(8))]
    if not quick:
        out += [("synth 16 nodes", gpt36, JobSpec(256, 2048, "bf16"), _synth(16)),
                ("uniform 8 nodes", gpt36, JobSpec(512, 2048, "bf16"),
                 uniform_cluster(8, 8, "A100-80GB", 240.0, 25.0)),
                ("random 12 nodes (llama2-7b)", presets.model("llama2-7b"),
                 JobSpec(64, 4096, "bf16"), random_cluster(12, 12))]
    return out


def _key(r):
    return (r.plan.shape.describe(), r.plan.placement, r.objective_ms, r.bound_ms,
            r.termination)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=10.0, help="work seconds per solve")
    ap.add_argument("--quick", action="store_true", help="the first three instances only")
    ap.add_argument("--methods", nargs="+", default=["exact", "anneal"])
    a = ap.parse_args(argv)
    print(f"budget {a.budget:g} work-s per solve\n")
    print("| instance | method | work-s | wall s (1st, 2nd) | wall / work | same twice | "
          "work clock: ms, gap, end | wall clock: ms, gap, end |")
    print("|---|---|---|---|---|---|---|---|")
    ratios, same = [], 0
    for name, model, job, cl in instances(a.quick):
        for method in a.methods:
            runs = []
            for _ in range(2):
                t = time.perf_counter()
                r = solve(model, job, cl, method=method, time_limit_s=a.budget, clock="work")
                runs.append((r, time.perf_counter() - t))
            t = time.perf_counter()
            w = solve(model, job, cl, method=method, time_limit_s=a.budget)
            (r1, s1), (r2, s2) = runs
            ok = _key(r1) == _key(r2)
            same += ok
            ratio = s1 / r1.work_s
            ratios.append(ratio)
            print(f"| {name} | {method} | {r1.work_s:.2f} | {s1:.2f}, {s2:.2f} | {ratio:.2f} | "
                  f"{'yes' if ok else 'NO'} | {r1.objective_ms:.1f}, {r1.gap * 100:.2f}%, "
                  f"{r1.termination} | {w.objective_ms:.1f}, {w.gap * 100:.2f}%, "
                  f"{w.termination} |", flush=True)
    print(f"\nsame result twice: {same}/{len(ratios)}; wall / work (first runs): median "
          f"{sorted(ratios)[len(ratios) // 2]:.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")


if __name__ == "__main__":
    main()
