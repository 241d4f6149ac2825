"""`solve`'s two search flows on clusters of mixed GPU types: the exact method's (bound every
shape by the placement-relaxed MILP, then optimize the blocks best bound first, annealing the
blocks the MILP does not cover) against the anneal method's (screen, bound until
BOUND_FRACTION of the limit, then anneal the best shapes with cooling planned by the clock).
What `--method auto` picks on such clusters rests on this.

    python bench/mixed_auto.py [--seeds 900:912] [--nodes 4:8] [--time-limit 10]

Seeded instances: N nodes of 8 GPUs (N uniform in --nodes), two of A100 80 GB, H100 SXM and
H200 mixed at random (at least one node of each), inter-node streams uniform in 5-50 GB/s,
Llama-2 13B or 70B or Llama-3 8B, global batch 64 or 128, sequence 4096. Both flows get the
same limit on the work clock (`solve(clock="work")`: the same answer under any load). Prints
per instance both objectives and their ratio, then how often each flow found the better plan
and by how much.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from model.cluster import ClusterSpec, NodeSpec  # noqa: E402
from model.specs import JobSpec  # noqa: E402
from solvers.search import solve  # noqa: E402

GPUS = ("A100-80GB", "H100-SXM-80GB", "H200-141GB")
# the preset GPUs' NVLink all-GPU ring rates (the presets' intra-node defaults)
INTRA_GB_PER_S = {"A100-80GB": 240.0, "H100-SXM-80GB": 360.0, "H200-141GB": 360.0}
MODELS = ("llama2-13b", "llama3-8b", "llama2-70b")


def instance(seed: int, lo: int, hi: int):
    """(cluster, model name, job) of one seed: two GPU types, lo..hi nodes."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(lo, hi + 1))
    kinds = rng.choice(GPUS, size=2, replace=False)
    types = [str(rng.choice(kinds)) for _ in range(n)]
    if len(set(types)) == 1:
        types[0] = str(kinds[1]) if types[0] == kinds[0] else str(kinds[0])
    nodes = tuple(NodeSpec(f"n{i}", presets.gpu(t), 8, INTRA_GB_PER_S[t])
                  for i, t in enumerate(types))
    inter = np.round(rng.uniform(5, 50, size=(n, n)), 2)
    np.fill_diagonal(inter, 0)
    job = JobSpec(global_batch=int(rng.choice([64, 128])), seq_length=4096)
    return ClusterSpec(f"mixed{seed}", nodes, inter, 5.0), str(rng.choice(MODELS)), job


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="900:912")
    ap.add_argument("--nodes", default="4:8")
    ap.add_argument("--time-limit", type=float, default=10.0)
    a = ap.parse_args()
    s0, s1 = map(int, a.seeds.split(":"))
    lo, hi = map(int, a.nodes.split(":"))
    ratios = []
    print(f"{'seed':>4s} {'model':10s} {'nodes':>5s} {'GPUs':14s} {'exact flow ms':>13s} "
          f"{'anneal flow ms':>14s} {'anneal/exact':>12s}  wall s (exact, anneal)")
    for seed in range(s0, s1):
        c, name, job = instance(seed, lo, hi)
        got = {}
        for method in ("exact", "anneal"):
            t = time.perf_counter()
            try:
                r = solve(presets.model(name), job, c, method=method,
                          time_limit_s=a.time_limit, clock="work")
                got[method] = (r.objective_ms, time.perf_counter() - t)
            except Exception as e:  # noqa: BLE001  (nothing fits: the row says so)
                got[method] = (math.inf, time.perf_counter() - t)
                print(f"  {method}: {type(e).__name__}: {str(e)[:90]}")
        e, an = got["exact"][0], got["anneal"][0]
        ratio = an / e if math.isfinite(e) and math.isfinite(an) else math.nan
        if math.isfinite(ratio):
            ratios.append(ratio)
        kinds = "/".join(sorted({nd.gpu.name.split("-")[0] for nd in c.nodes}))
        print(f"{seed:4d} {name:10s} {c.num_nodes:5d} {kinds:14s} {e:13.1f} {an:14.1f} "
              f"{ratio:12.4f}  {got['exact'][1]:.1f}, {got['anneal'][1]:.1f}", flush=True)
    r = np.array(ratios)
    if r.size:
        print(f"{r.size} instances: the exact flow better on {int((r > 1 + 1e-9).sum())} "
              f"(by up to {(r.max() - 1) * 100:.1f}%), the anneal flow on "
              f"{int((r < 1 - 1e-9).sum())} (by up to {(1 - r.min()) * 100:.1f}%), equal on "
              f"{int((abs(r - 1) <= 1e-9).sum())}; median anneal/exact {np.median(r):.4f}")


if __name__ == "__main__":
    main()
