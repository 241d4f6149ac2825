"""Exact placement: time to proven optimality of solvers.milp.solve_milp versus cluster size.

For 4, 8, 12, 16, 24 and 32 nodes of 8 A100-80GB, on two kinds of inter-node matrix:
  random  every ordered node pair drawn uniformly from [5, 25] GB/s (asymmetric), seed = nodes;
  switch  formats.clusters.synth_cluster: leaf switches of 4 nodes, 23 GB/s inside a leaf, 1.6x
          oversubscribed spine, one degraded NIC at half rate, +-3% noise, seed = nodes.
One fixed shape and block per instance, chosen so that placement matters (pipeline transfers
are a visible share of the iteration): Llama-2 7B, global batch 64, sequence 4096, bf16,
TP=8 (one tensor group per node), PP = nodes / DP, DP=1 by default (--dp 2 for two replicas),
micro-batch 1, 1F1B, no recompute, sequence parallelism; block: one stage x one replica per node,
so the MILP decides which node hosts which (stage, replica) and the layer split.

Each instance is solved as solvers/search.py does for `--method exact`: a short seeded anneal
(warm start, its time counted and shown separately) gives the MILP its seed solutions, then
`solve_milp(PlacementProblem(model, job, cluster, shape, block, Options()))` runs under the time
limit. Printed per instance: nodes, matrix kind, shape, block, termination, objective, bound, gap,
wall time (warm start + MILP), MILP rounds, and whether the estimator re-evaluates the returned
plan to the MILP objective (rel 1e-6). The summary gives the largest node count proven optimal
within 60 s per matrix kind (the basis for AUTO_EXACT_MAX_NODES in solvers/search.py). Results
are also written as JSON (bench/anneal_gap.py reads them).

Run:   python bench/exact_scaling.py                 (all sizes, both kinds, 120 s per instance;
                                                      about 13 min, the big ones time out)
       python bench/exact_scaling.py --quick         (4, 8, 12, 16 nodes, 60 s per instance)
       python bench/exact_scaling.py --nodes 16 --kinds random --time-limit 300
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from formats.clusters import SynthParams, synth_cluster, uniform_cluster  # noqa: E402
from model.estimator import estimate  # noqa: E402
from model.plan import Shape  # noqa: E402
from model.specs import JobSpec, Options  # noqa: E402
from solvers.anneal import _perm_of, anneal  # noqa: E402
from solvers.milp import solve_milp  # noqa: E402
from solvers.problem import PlacementProblem  # noqa: E402
from solvers.search import WARM_START_S  # noqa: E402
from solvers.space import blocks_for  # noqa: E402

DEFAULT_JSON = Path("/tmp/pipette-bench/exact_scaling.json")
SIZES = (4, 8, 12, 16, 24, 32)
KINDS = ("random", "switch")


def random_cluster(n: int, seed: int, lo: float = 5.0, hi: float = 25.0):
    c = uniform_cluster(n, 8, "A100-80GB", 240.0, 23.0, name=f"random-{n}-s{seed}")
    bw = np.round(np.random.default_rng(seed).uniform(lo, hi, size=(n, n)), 2)
    np.fill_diagonal(bw, 0.0)
    return dataclasses.replace(c, inter_gb_per_s=bw, source="bench")


def switch_cluster(n: int, seed: int):
    return synth_cluster(SynthParams(num_nodes=n, leaf_size=4, oversubscription=1.6, degraded=1,
                                     degraded_factor=0.5, noise=0.03, seed=seed))


def make_instance(nodes: int, kind: str, *, model_name: str = "llama2-7b", dp: int = 1,
                  global_batch: int = 64, tp: int = 8,
                  matrix_seed: int | None = None) -> PlacementProblem:
    """The instance of one (node count, matrix kind): a PlacementProblem for one shape+block.
    The matrix's seed is the node count unless `matrix_seed` is given."""
    model = presets.model(model_name)
    job = JobSpec(global_batch=global_batch, seq_length=model.seq_length, precision="bf16")
    ms = nodes if matrix_seed is None else matrix_seed
    cluster = random_cluster(nodes, ms) if kind == "random" else switch_cluster(nodes, ms)
    pp = nodes * 8 // (tp * dp)
    shape = Shape(tp=tp, pp=pp, dp=dp, micro_batch=1, schedule="1f1b", chunks=1, layers=(),
                  recompute="none", sequence_parallel=tp > 1, distributed_optimizer=False)
    blocks = [b for b in blocks_for(cluster, shape) if b.j == 1]  # one stage per node
    if not blocks:
        raise SystemExit(f"no block with one stage per node for {shape.describe()}")
    return PlacementProblem(model, job, cluster, shape, blocks[0], Options())


def warm_start(prob: PlacementProblem, time_limit_s: float, seed: int = 0):
    """What search.py does before the MILP: a short anneal cooled by the clock whose result
    seeds HiGHS."""
    t = time.perf_counter()
    warm = anneal(prob, seed=seed, iters=None, time_limit_s=time_limit_s, restarts=2)
    seeds = [(list(range(prob.num_slots)), prob.start_layers())]
    if warm.plan is not None:
        seeds.append((_perm_of(prob, warm.plan), tuple(warm.plan.shape.layers)))
    return seeds, warm.objective_ms, time.perf_counter() - t


def run_instance(nodes: int, kind: str, time_limit_s: float, *, warm: bool = True,
                 **inst) -> dict:
    prob = make_instance(nodes, kind, **inst)
    t0 = time.perf_counter()
    seeds, warm_ms, warm_s = (warm_start(prob, min(WARM_START_S, time_limit_s / 4)) if warm
                              else ((), None, 0.0))
    r = solve_milp(prob, time_limit_s=time_limit_s, seed_solutions=seeds)
    wall = time.perf_counter() - t0
    agrees = None
    if r.plan is not None:
        again = estimate(prob.model, prob.job, prob.cluster, r.plan).iteration_ms
        agrees = abs(again - r.objective_ms) <= 1e-6 * r.objective_ms
    identity = prob.cost(list(range(prob.num_slots)), prob.start_layers())
    return {"nodes": nodes, "kind": kind, "model": prob.model.name,
            "global_batch": prob.job.global_batch, "tp": prob.shape.tp, "dp": prob.shape.dp,
            "shape": prob.shape.describe(),
            "block": prob.block.describe(), "termination": r.termination,
            "objective_ms": r.objective_ms, "bound_ms": r.bound_ms, "gap": r.gap,
            "wall_s": wall, "warm_s": warm_s, "milp_s": r.wall_s, "rounds": r.iterations,
            "warm_ms": warm_ms, "identity_ms": identity, "reevaluates": agrees,
            "time_limit_s": time_limit_s,
            "layers": list(r.plan.shape.layers) if r.plan is not None else None,
            "placement": [list(x) for x in r.plan.placement.node] if r.plan else None}


HEADER = (f"{'nodes':>5} {'matrix':<7} {'shape':<34} {'termination':<11} {'objective ms':>12} "
          f"{'bound ms':>10} {'gap':>9} {'wall s':>7} {'warm s':>6} {'rounds':>6} "
          f"{'vs identity':>11} {'reeval':>6}")


def row(r: dict) -> str:
    vs = (r["identity_ms"] - r["objective_ms"]) / r["identity_ms"]
    return (f"{r['nodes']:>5} {r['kind']:<7} {r['shape'][:34]:<34} {r['termination']:<11} "
            f"{r['objective_ms']:>12.2f} {r['bound_ms']:>10.2f} {r['gap']:>9.2e} "
            f"{r['wall_s']:>7.1f} {r['warm_s']:>6.1f} {r['rounds']:>6} {vs:>10.2%} "
            f"{str(r['reevaluates']):>6}")


def summary(rows: list[dict], within_s: float = 60.0) -> list[str]:
    out = []
    for kind in sorted({r["kind"] for r in rows}):
        rs = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["nodes"])
        ok = [r["nodes"] for r in rs if r["termination"] == "optimal" and r["wall_s"] <= within_s]
        first_fail = next((r["nodes"] for r in rs if not (r["termination"] == "optimal" and
                                                          r["wall_s"] <= within_s)), None)
        out.append(f"{kind}: proven optimal within {within_s:.0f} s at {ok or 'no'} nodes; "
                   f"first size not proven within {within_s:.0f} s: {first_fail or 'none'}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4-16 nodes, 60 s per instance")
    ap.add_argument("--nodes", type=int, nargs="+", default=None)
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--time-limit", type=float, default=None, help="seconds per instance "
                    "(default 120, --quick 60)")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--no-warm", action="store_true", help="no annealing warm start")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help="write rows here")
    a = ap.parse_args(argv)
    sizes = a.nodes or ((4, 8, 12, 16) if a.quick else SIZES)
    limit = a.time_limit or (60.0 if a.quick else 120.0)
    print(f"model {a.model}, global batch {a.global_batch}, TP=8, DP={a.dp}, one stage per node; "
          f"time limit {limit:.0f} s per instance; warm start {'off' if a.no_warm else 'on'}")
    print(HEADER, flush=True)
    rows = []
    t0 = time.perf_counter()
    for n in sizes:
        for kind in a.kinds:
            r = run_instance(n, kind, limit, warm=not a.no_warm, model_name=a.model, dp=a.dp,
                             global_batch=a.global_batch)
            rows.append(r)
            print(row(r), flush=True)
    print(f"total {time.perf_counter() - t0:.0f} s")
    for line in summary(rows):
        print(line)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"rows": rows, "argv": sys.argv[1:]}, indent=1))
        print(f"rows written to {a.json}")


if __name__ == "__main__":
    main()
