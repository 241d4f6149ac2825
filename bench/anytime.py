"""Anytime quality: the plan a short time limit returns, against the proven optimum.

    python bench/anytime.py            # built-in example and the vTrain uniform clusters of
                                       # 8, 32 and 64 nodes; limits 2 and 10 s; auto, anneal
    python bench/anytime.py --quick    # built-in example and 8 nodes only

For each instance the reference is a full `solve` (auto, 300 s limit; its termination is
printed: the ratio is to a proven optimum only where it says "optimal"). Then `solve` with
each method and limit; prints the plan's time / reference - 1, the wall time, and the issue-13
goals: within 5% at 2 s, within 1% at 10 s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from formats.clusters import cluster as load_cluster, uniform_cluster  # noqa: E402
from model.specs import JobSpec  # noqa: E402
from solvers.search import solve  # noqa: E402

GOALS = {2.0: 0.05, 10.0: 0.01}


def instances(quick: bool):
    yield ("built-in example", presets.model("llama2-70b"), JobSpec(256, 4096, "bf16"),
           load_cluster("example"))
    for nodes, name, gbs in ((8, "gpt-3.6b", 512), (32, "gpt-18.4b", 1024),
                             (64, "gpt-39.1b", 1536)):
        if quick and nodes > 8:
            continue
        yield (f"{nodes} nodes {name}", presets.model(name), JobSpec(gbs, 2048, "bf16"),
               uniform_cluster(nodes, 8, "A100-80GB", 240.0, 25.0))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    met, total = 0, 0
    print(f"{'instance':22s} {'method':7s} {'limit s':>7s} {'wall s':>7s} {'plan ms':>11s} "
          f"{'ref ms':>11s} {'vs ref':>8s} goal")
    for name, model, job, cluster in instances(a.quick):
        ref = solve(model, job, cluster, time_limit_s=300.0)
        print(f"{name:22s} reference: {ref.objective_ms:.1f} ms, {ref.termination}, gap "
              f"{ref.gap:.1e}, {ref.wall_s:.1f} s", flush=True)
        for method in ("auto", "anneal"):
            for T, goal in GOALS.items():
                t = time.perf_counter()
                r = solve(model, job, cluster, method=method, time_limit_s=T)
                wall = time.perf_counter() - t
                d = r.objective_ms / ref.objective_ms - 1
                ok = d <= goal
                met += ok
                total += 1
                print(f"{name:22s} {method:7s} {T:7.1f} {wall:7.2f} {r.objective_ms:11.1f} "
                      f"{ref.objective_ms:11.1f} {100 * d:+7.3f}% "
                      f"{'met' if ok else 'MISSED'} (<= {100 * goal:.0f}%)", flush=True)
    print(f"goals met: {met}/{total}")


if __name__ == "__main__":
    main()
