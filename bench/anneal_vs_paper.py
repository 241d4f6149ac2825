"""The project's annealer against Pipette's SA as published, on the same cost model.

    python bench/anneal_vs_paper.py            # 8-512 nodes, random and switch, 3 seeds,
                                               # budgets 1, 2, 10, 60 s (~80 min)
    python bench/anneal_vs_paper.py --quick    # 8-128 nodes, 1 seed, budgets 1, 2, 10 s

Instances (bench/exact_scaling.py's generators): Llama-2 7B, TP 8, one pipeline stage per
node; up to 32 nodes one replica (PP = nodes), from 128 nodes PP 8 and DP = nodes / 8 (a global
batch of 8 per replica). Per instance, seed and budget B:
- `paper`: solvers.paper_sa (swap, 2-opt, insert, insert-route, insert-reversed; T0 = 1 s,
  alpha = 0.999, Metropolis), the permutation only, for B seconds;
- `ours`: solvers.anneal.anneal with clock cooling (iters=None), for B seconds, and for B / 10.
Prints per row the two objectives and ours / paper - 1 (negative: ours better), and the goals of
issue 13: ours at B no worse than paper at B, ours at B / 10 within 0.1% of paper at B.
`--json PATH` writes the rows; `--matrix-seed S` draws other matrices (held-out instances).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from exact_scaling import make_instance  # noqa: E402
from solvers.anneal import anneal  # noqa: E402
from solvers.paper_sa import paper_sa  # noqa: E402


def instance(nodes: int, kind: str, matrix_seed: int | None = None):
    if nodes <= 32:
        return make_instance(nodes, kind, matrix_seed=matrix_seed)
    dp = nodes // 8
    return make_instance(nodes, kind, dp=dp, global_batch=8 * dp, matrix_seed=matrix_seed)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", type=str, default=None)
    ap.add_argument("--budgets", type=str, default=None)
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--kinds", type=str, default="random,switch")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--matrix-seed", type=int, default=None,
                    help="the matrices' seed (default: the node count, the instances the "
                         "annealer's settings were chosen on); another seed gives held-out "
                         "instances")
    a = ap.parse_args(argv)
    sizes = [int(x) for x in (a.sizes or ("8,16,32,128" if a.quick else
                                           "8,16,32,128,512")).split(",")]
    budgets = [float(x) for x in (a.budgets or ("1,2,10" if a.quick else "1,2,10,60")).split(",")]
    seeds = a.seeds or (1 if a.quick else 3)
    rows = []
    print(f"{'nodes':>5s} {'kind':7s} {'seed':>4s} {'budget s':>8s} {'paper ms':>11s} "
          f"{'ours ms':>11s} {'ours/paper-1':>12s} {'ours@B/10 ms':>12s} {'vs paper@B':>10s}")
    for n in sizes:
        for kind in a.kinds.split(","):
            prob = instance(n, kind, a.matrix_seed)
            for seed in range(seeds):
                for b in budgets:
                    p = paper_sa(prob, seed=seed, time_limit_s=b)
                    o = anneal(prob, seed=seed, iters=None, time_limit_s=b)
                    o10 = anneal(prob, seed=seed, iters=None, time_limit_s=b / 10)
                    r = {"nodes": n, "kind": kind, "seed": seed, "budget_s": b,
                         "paper_ms": p.objective_ms, "paper_moves": p.iterations,
                         "ours_ms": o.objective_ms, "ours_wall_s": o.wall_s,
                         "ours_tenth_ms": o10.objective_ms, "ours_tenth_wall_s": o10.wall_s}
                    r["ratio"] = r["ours_ms"] / r["paper_ms"] - 1
                    r["tenth_ratio"] = r["ours_tenth_ms"] / r["paper_ms"] - 1
                    rows.append(r)
                    print(f"{n:5d} {kind:7s} {seed:4d} {b:8.1f} {r['paper_ms']:11.2f} "
                          f"{r['ours_ms']:11.2f} {100 * r['ratio']:+11.3f}% "
                          f"{r['ours_tenth_ms']:12.2f} {100 * r['tenth_ratio']:+9.3f}%",
                          flush=True)
    worse = [r for r in rows if r["ratio"] > 1e-9]
    tenth = [r for r in rows if r["tenth_ratio"] > 1e-3]
    print(f"ours at B no worse than paper at B: {len(rows) - len(worse)}/{len(rows)} rows "
          f"(median ours/paper - 1: {100 * statistics.median(r['ratio'] for r in rows):+.3f}%)")
    print(f"ours at B/10 within 0.1% of paper at B: {len(rows) - len(tenth)}/{len(rows)} rows "
          f"(worst {100 * max(r['tenth_ratio'] for r in rows):+.3f}%)")
    overrun = max(max(r["ours_wall_s"] / r["budget_s"], r["ours_tenth_wall_s"] /
                      (r["budget_s"] / 10)) for r in rows)
    print(f"annealer wall / budget, worst: {overrun:.3f}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
