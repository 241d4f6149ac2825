"""The annealer on small clusters of mixed GPU types against brute force, with and without
its mixed-GPU moves.

    python bench/mixed_gpu_anneal.py [--seeds 100:160] [--budget-s 300]

Seeded instances: 2-4 nodes of 2, 4 or 8 GPUs drawn from two or three of A100 40/80 GB,
H100 SXM, H200 and L40S (intra-node links 240, 360 and, for the L40S's PCIe, 25 GB/s),
inter-node streams uniform in 5-50 GB/s, a small model (GPT 1.7B, Llama-2 7B/13B, Llama-3 8B)
and job; up to three random shapes with 2-4 pipeline stages, every block of each. Each block
is annealed (solvers.anneal, 3 seeds, 300-1000 moves) twice: as it is, and with the moves for
GPUs of several types turned off (PlacementProblem.mixed_gpus False: no placed_split starts,
no re-balancing or row-swap moves, no per-order descents: the annealer before them), and
brute-forced where at most 40,000 plans exist (solvers.brute). Prints the share of runs above
the brute-force optimum, by how much, for both, and each instance more than 2% above.
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
from model.specs import JobSpec, Options  # noqa: E402
from solvers.anneal import anneal  # noqa: E402
from solvers.brute import brute_force, space_size  # noqa: E402
from solvers.problem import PlacementProblem  # noqa: E402
from solvers.space import blocks_for, enumerate_shapes  # noqa: E402

GPUS = ("A100-40GB", "A100-80GB", "H100-SXM-80GB", "H200-141GB", "L40S")
INTRA_GB_PER_S = {"A100-40GB": 240.0, "A100-80GB": 240.0, "H100-SXM-80GB": 360.0,
                  "H200-141GB": 360.0, "L40S": 25.0}
MODELS = ("gpt-1.7b", "llama2-7b", "llama2-13b", "llama3-8b")
MAX_PLANS = 40_000  # brute force only where a block has at most this many plans


def instance(seed: int):
    """(rng, cluster, model name, job) of one seed: at least two GPU types."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 5))
    g = int(rng.choice([2, 4, 8]))
    kinds = rng.choice(GPUS, size=2 if rng.random() < 0.7 else 3, replace=False)
    types = [str(rng.choice(kinds)) for _ in range(n)]
    if len(set(types)) == 1:
        types[0] = str(kinds[1]) if types[0] == kinds[0] else str(kinds[0])
    nodes = tuple(NodeSpec(f"n{i}", presets.gpu(t), g, INTRA_GB_PER_S[t])
                  for i, t in enumerate(types))
    inter = np.round(rng.uniform(5, 50, size=(n, n)), 2)
    np.fill_diagonal(inter, 0)
    job = JobSpec(global_batch=int(rng.choice([16, 32, 64])),
                  seq_length=int(rng.choice([2048, 4096])))
    return rng, ClusterSpec(f"mixed{seed}", nodes, inter, 5.0), str(rng.choice(MODELS)), job


def run_block(prob: PlacementProblem, iters: list[int]) -> dict[str, list[float]]:
    """Annealed times, per seed, with the mixed-GPU moves and without."""
    out = {"mixed moves": [], "without": []}
    cls = type(prob)
    prop = cls.mixed_gpus
    for label in out:
        if label == "without":
            cls.mixed_gpus = property(lambda self: False)
        try:
            for s, it in enumerate(iters):
                r = anneal(prob, seed=s, iters=it, time_limit_s=30)
                out[label].append(r.objective_ms if r.plan is not None else math.inf)
        finally:
            cls.mixed_gpus = prop
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="100:160")
    ap.add_argument("--budget-s", type=float, default=300.0)
    args = ap.parse_args()
    a, b = (int(x) for x in args.seeds.split(":"))
    deadline = time.time() + args.budget_s
    gaps: dict[str, list[float]] = {"mixed moves": [], "without": []}
    worst = []
    blocks = 0
    for seed in range(a, b):
        if time.time() > deadline:
            print(f"(budget reached after seed {seed - 1})")
            break
        rng, c, name, job = instance(seed)
        m = presets.model(name)
        shapes = [s for s in enumerate_shapes(m, job, c) if 1 < s.pp <= 4 and s.num_virtual <= 6]
        if not shapes:
            continue
        for k in rng.choice(len(shapes), size=min(3, len(shapes)), replace=False):
            sh = shapes[int(k)]
            for blk in blocks_for(c, sh):
                prob = PlacementProblem(m, job, c, sh, blk, Options())
                iters = [int(rng.integers(300, 1001)) for _ in range(3)]
                perms, splits = space_size(prob)
                if perms * splits > MAX_PLANS:
                    continue
                best = brute_force(prob, max_evals=10**6)
                if best.plan is None:
                    continue
                blocks += 1
                got = run_block(prob, iters)
                for label, times in got.items():
                    for t in times:
                        gap = t / best.objective_ms - 1
                        gaps[label].append(gap)
                        if label == "mixed moves" and gap > 0.02:
                            worst.append((gap, seed, name, sh.describe(), blk.describe()))
    print(f"{blocks} blocks brute-forced, 3 annealing seeds each\n")
    print(f"{'annealer':<13} {'runs':>5} {'at opt':>7} {'> 0.5%':>7} {'> 1%':>6} {'> 2%':>6} "
          f"{'> 5%':>6} {'max':>7}")
    for label, g in gaps.items():
        n = len(g)
        if not n:
            continue
        frac = [sum(x > th for x in g) for th in (1e-9, 0.005, 0.01, 0.02, 0.05)]
        print(f"{label:<13} {n:5d} {100 * (n - frac[0]) / n:6.1f}% "
              + " ".join(f"{100 * f / n:6.1f}%" for f in frac[1:])
              + f" {100 * max(g):6.2f}%")
    for gap, seed, name, sh, blk in sorted(worst, reverse=True)[:10]:
        print(f"  +{100 * gap:.2f}%: seed {seed} {name} {sh}, {blk}")


if __name__ == "__main__":
    main()
