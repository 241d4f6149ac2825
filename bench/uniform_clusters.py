"""Full solves on uniform clusters (every node pair the same bandwidth): time to a proof over the
whole search space.

    python bench/uniform_clusters.py [--time-limit 60] [--jobs 1 2] [--large]

The vTrain-sized jobs: GPT 3.6B / 18.4B / 39.1B / 175B (Narayanan et al. shapes) at global
batch 512 / 1024 / 1536 / 1536, sequence 2048, bf16, on 8 / 32 / 64 / 64 nodes of 8 A100-80GB
(NVLink 240 GB/s, 25 GB/s per GPU stream between nodes). On a uniform cluster every placement of
a block layout costs the same, so the search only chooses shapes, layouts and splits
(solvers/search.py). Prints per instance the termination, plan, objective, bound, gap, wall
time and shapes enumerated / optimized, once per worker count given (--jobs: processes that
bound and screen the shapes; the plan must not change with it). `--large` adds Llama-3 405B
(global batch 2048, sequence 8192) on 1024 nodes of 8 H100 (NVLink 360 GB/s, 50 GB/s per GPU
stream between nodes).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from formats.clusters import uniform_cluster  # noqa: E402
from model.specs import JobSpec  # noqa: E402
from solvers.search import solve  # noqa: E402

# nodes, model, global batch, sequence, GPU, NVLink GB/s, inter-node GB/s per GPU stream
INSTANCES = ((8, "gpt-3.6b", 512, 2048, "A100-80GB", 240.0, 25.0),
             (32, "gpt-18.4b", 1024, 2048, "A100-80GB", 240.0, 25.0),
             (64, "gpt-39.1b", 1536, 2048, "A100-80GB", 240.0, 25.0),
             (64, "gpt3-175b", 1536, 2048, "A100-80GB", 240.0, 25.0))
LARGE = ((1024, "llama3-405b", 2048, 8192, "H100-SXM-80GB", 360.0, 50.0),)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--jobs", type=int, nargs="+", default=[1])
    ap.add_argument("--large", action="store_true")
    a = ap.parse_args(argv)
    print(f"{'nodes':>5s} {'model':11s} {'jobs':>4s} {'termination':12s} {'objective ms':>13s} "
          f"{'bound ms':>12s} {'gap':>9s} {'wall s':>7s} {'shapes':>7s} {'solved':>6s}  plan")
    for nodes, name, gbs, seq, gpu, nvlink, inter in INSTANCES + (LARGE if a.large else ()):
        c = uniform_cluster(nodes, 8, gpu, nvlink, inter)
        m = presets.model(name)
        job = JobSpec(gbs, seq, "bf16")
        for jobs in a.jobs:
            t = time.perf_counter()
            r = solve(m, job, c, time_limit_s=a.time_limit, jobs=jobs)
            wall = time.perf_counter() - t
            print(f"{nodes:5d} {name:11s} {jobs:4d} {r.termination:12s} {r.objective_ms:13.1f} "
                  f"{r.bound_ms:12.1f} {r.gap:9.2e} {wall:7.1f} {r.shapes_total:7d} "
                  f"{r.shapes_solved:6d}  {r.plan.shape.describe()}", flush=True)


if __name__ == "__main__":
    main()
