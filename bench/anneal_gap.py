"""Annealing: gap to the proven optimum, and time, on the instances of bench/exact_scaling.py.

For every instance of exact_scaling (4-32 nodes, random and switch-structured matrices, the same
model, shape and block), runs `solvers.anneal.anneal(prob, seed=s)` for several seeds with its
default schedule (6000 moves over 4 chains, then a descent polish) and a per-run time limit, and
compares each result with the MILP's:
  gap      (anneal - optimum) / optimum, where the MILP proved optimality;
  vs best  (anneal - MILP's best plan) / that plan, where it did not (negative: annealing found
           a better plan than the time-limited MILP), with the MILP's bound giving an upper
           bound on the true gap: (anneal - bound) / anneal.
Prints every run, then the max and median gap over the proven instances (goal: max <= 1%,
median 0) and the annealer's median and max wall time.

The MILP results are read from the JSON that bench/exact_scaling.py writes (default
/tmp/pipette-bench/exact_scaling.json); instances missing there are solved here first, with the
same code and --milp-time-limit.

Run:   python bench/exact_scaling.py && python bench/anneal_gap.py     (5 seeds, about 8 min)
       python bench/anneal_gap.py --quick      (4-16 nodes, 3 seeds; MILP 60 s if not cached)
       python bench/anneal_gap.py --seeds 0 1 2 3 4 5 6 7 --time-limit 60
       python bench/anneal_gap.py --nodes 10 12 --exact-json A.json B.json   (other MILP runs,
                                 e.g. exact_scaling.py --nodes 12 --time-limit 600 --json B.json)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import exact_scaling as ex  # noqa: E402
from solvers.anneal import anneal  # noqa: E402


def load_exact(paths: list[Path]) -> dict:
    """MILP rows by instance; a later file's row replaces an earlier one's."""
    out = {}
    for path in paths:
        if path.exists():
            for r in json.loads(path.read_text())["rows"]:
                out[(r["nodes"], r["kind"], r["model"], r["global_batch"], r.get("dp", 1))] = r
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4-16 nodes, 3 seeds")
    ap.add_argument("--nodes", type=int, nargs="+", default=None)
    ap.add_argument("--kinds", nargs="+", choices=ex.KINDS, default=list(ex.KINDS))
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds per anneal run")
    ap.add_argument("--exact-json", type=Path, nargs="+", default=[ex.DEFAULT_JSON],
                    help="exact_scaling.py outputs (later files override earlier ones)")
    ap.add_argument("--milp-time-limit", type=float, default=None,
                    help="for instances not in the JSON (default 120, --quick 60)")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--global-batch", type=int, default=64)
    a = ap.parse_args(argv)
    sizes = a.nodes or ((4, 8, 12, 16) if a.quick else ex.SIZES)
    seeds = a.seeds or ([0, 1, 2] if a.quick else [0, 1, 2, 3, 4])
    milp_limit = a.milp_time_limit or (60.0 if a.quick else 120.0)
    cached = load_exact(a.exact_json)
    print(f"model {a.model}, global batch {a.global_batch}, TP=8, DP={a.dp}; seeds {seeds}; "
          f"{a.time_limit:.0f} s per anneal run; MILP results from "
          f"{' '.join(map(str, a.exact_json)) if cached else '(solving here)'}")
    print(f"{'nodes':>5} {'matrix':<7} {'MILP':<10} {'reference ms':>12} {'bound ms':>10} "
          f"{'seed':>4} {'anneal ms':>10} {'gap':>9} {'vs best':>9} {'gap<=':>8} {'time s':>7}")
    gaps, times, rows = [], [], []
    for n in sizes:
        for kind in a.kinds:
            key = (n, kind, a.model, a.global_batch, a.dp)
            r = cached.get(key)
            if r is None:
                r = ex.run_instance(n, kind, milp_limit, model_name=a.model, dp=a.dp,
                                    global_batch=a.global_batch)
            prob = ex.make_instance(n, kind, model_name=a.model, dp=a.dp,
                                    global_batch=a.global_batch)
            proven = r["termination"] == "optimal"
            ref, bound = r["objective_ms"], r["bound_ms"]
            for s in seeds:
                t = time.perf_counter()
                res = anneal(prob, seed=s, time_limit_s=a.time_limit)
                wall = time.perf_counter() - t
                ms = res.objective_ms
                gap = (ms - ref) / ref if proven else None
                vs_best = (ms - ref) / ref
                upper = (ms - bound) / ms
                times.append(wall)
                if proven:
                    gaps.append(gap)
                rows.append((n, kind, proven, gap, vs_best, upper, wall))
                print(f"{n:>5} {kind:<7} {'optimal' if proven else 'not proven':<10} "
                      f"{ref:>12.2f} {bound:>10.2f} {s:>4} {ms:>10.2f} "
                      f"{(f'{gap:.3%}' if gap is not None else '-'):>9} {vs_best:>+9.3%} "
                      f"{upper:>8.2%} {wall:>7.1f}", flush=True)
    print()
    if gaps:
        print(f"gap to the proven optimum over {len(gaps)} runs on "
              f"{len({(r[0], r[1]) for r in rows if r[2]})} proven instances: "
              f"max {max(gaps):.3%}, median {statistics.median(gaps):.3%}, "
              f"runs at the optimum (gap <= 1e-6) {sum(g <= 1e-6 for g in gaps)}/{len(gaps)}; "
              f"goal max <= 1%, median 0: "
              f"{'met' if max(gaps) <= 0.01 and statistics.median(gaps) <= 1e-6 else 'NOT met'}")
    unproven = [r for r in rows if not r[2]]
    if unproven:
        print(f"instances the MILP did not prove ({len({(r[0], r[1]) for r in unproven})}): "
              f"anneal vs the MILP's best plan: max {max(r[4] for r in unproven):+.3%}, median "
              f"{statistics.median(r[4] for r in unproven):+.3%}; true gap at most "
              f"{max(r[5] for r in unproven):.2%} (from the MILP bound)")
    print(f"anneal wall time per run: median {statistics.median(times):.1f} s, "
          f"max {max(times):.1f} s")


if __name__ == "__main__":
    main()
