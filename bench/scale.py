"""Scale: a full solve (shape and placement) with the annealer on 128, 512 and 1024 nodes.

Clusters: formats.clusters.synth_cluster with 8 A100-80GB per node, leaf switches of 16 nodes,
23 GB/s per stream inside a leaf, a 1.6x oversubscribed spine, one degraded NIC (half rate) per
64 nodes, +-3% noise, seed 0. Models and global batches (bf16, the model's own sequence length):
  128 nodes   llama3-70b   global batch 1024 (8M tokens)
  512 nodes   gpt3-175b    global batch 1536 (3.1M tokens, as in the GPT-3 paper)
  1024 nodes  llama3-405b  global batch 2048 (16M tokens, as in the Llama 3 paper)
Each runs `solvers.search.solve(method="anneal", time_limit_s=60)` (every shape of the default
search space: TP, PP, DP, micro-batch, 1F1B / interleaved, recompute, distributed optimizer) and
prints the wall time, the best plan with its iteration time, tokens/s and MFU, what Megatron-LM's
rank order gives for the same shape, the bound and gap, and how many shapes were screened, did
not fit, were pruned by bounds, annealed, or left unsearched. The best plan is re-scored with
model.estimator.estimate and must agree (rel 1e-9). Goal: each solve within 60 s.

Run:   python bench/scale.py                  (128, 512, 1024 nodes; about 3.5 min)
       python bench/scale.py --quick          (128 and 512 nodes, 30 s limit)
       python bench/scale.py --nodes 1024 --profile   (cProfile of the solve, top functions)
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from formats.clusters import SynthParams, synth_cluster  # noqa: E402
from model.estimator import estimate  # noqa: E402
from model.specs import JobSpec  # noqa: E402
from solvers.search import solve  # noqa: E402

INSTANCES = {128: ("llama3-70b", 1024), 512: ("gpt3-175b", 1536), 1024: ("llama3-405b", 2048)}


def cluster_for(nodes: int, seed: int = 0):
    return synth_cluster(SynthParams(num_nodes=nodes, gpus_per_node=8, leaf_size=16,
                                     oversubscription=1.6, degraded=max(1, nodes // 64),
                                     noise=0.03, seed=seed))


def status_counts(res) -> dict:
    out = collections.Counter()
    for c in res.candidates:
        st = c.status
        key = ("does not fit" if st.startswith("does not fit") else
               "pruned by bound" if st.startswith("pruned") else
               "not searched (time)" if st.startswith("not searched") else
               "annealed" if st in ("best", "slower") else st)
        out[key] += 1
    return dict(out)


def run(nodes: int, time_limit_s: float, seed: int, profile: bool) -> dict:
    model_name, gb = INSTANCES[nodes]
    model = presets.model(model_name)
    job = JobSpec(global_batch=gb, seq_length=model.seq_length, precision="bf16")
    cluster = cluster_for(nodes, seed)
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    res = solve(model, job, cluster, method="anneal", time_limit_s=time_limit_s, seed=seed)
    if prof:
        prof.disable()
    wall = time.perf_counter() - t0
    again = estimate(model, job, cluster, res.plan).iteration_ms
    best = next((c for c in res.candidates if c.status == "best"), None)
    meg = best.quick_ms if best is not None else None
    print(f"\n== {nodes} nodes x 8 A100-80GB ({cluster.num_gpus} GPUs), {model_name}, "
          f"global batch {gb}, seq {job.seq_length}")
    print(f"wall time          {wall:.1f} s (limit {time_limit_s:.0f} s): "
          f"{'within' if wall <= time_limit_s else 'OVER'} the limit")
    print(f"best plan          {res.plan.shape.describe()}")
    print(f"iteration time     {res.objective_ms / 1e3:.3f} s; {res.estimate.tokens_per_s:,.0f} "
          f"tokens/s; MFU {res.estimate.mfu:.1%}; peak memory "
          f"{res.estimate.peak_memory_gib:.1f} GiB")
    if meg:
        print(f"Megatron placement {meg / 1e3:.3f} s for the same shape and balanced split "
              f"(annealed placement {(meg - res.objective_ms) / meg:+.2%} faster)")
    print(f"bound / gap        {res.bound_ms / 1e3:.3f} s / {res.gap:.1%}; termination "
          f"{res.termination}")
    print(f"shapes             {res.shapes_total} enumerated; {status_counts(res)}; "
          f"{res.shapes_solved} annealed")
    print(f"re-evaluation      estimator {again / 1e3:.6f} s "
          f"({'agrees' if abs(again - res.objective_ms) <= 1e-9 * again else 'DISAGREES'})")
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        print(s.getvalue())
    return {"nodes": nodes, "wall_s": wall, "plan": res.plan.shape.describe(),
            "iteration_ms": res.objective_ms, "megatron_ms": meg, "gap": res.gap}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="128 and 512 nodes, 30 s limit")
    ap.add_argument("--nodes", type=int, nargs="+", choices=sorted(INSTANCES), default=None)
    ap.add_argument("--time-limit", type=float, default=None, help="seconds (default 60)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of each solve")
    a = ap.parse_args(argv)
    nodes = a.nodes or ([128, 512] if a.quick else [128, 512, 1024])
    limit = a.time_limit or (30.0 if a.quick else 60.0)
    rows = [run(n, limit, a.seed, a.profile) for n in nodes]
    print("\nnodes  wall s  iteration s  vs Megatron  plan")
    for r in rows:
        vs = f"{(r['megatron_ms'] - r['iteration_ms']) / r['megatron_ms']:+.2%}" \
            if r["megatron_ms"] else "-"
        print(f"{r['nodes']:>5} {r['wall_s']:>7.1f} {r['iteration_ms'] / 1e3:>12.3f} {vs:>12}  "
              f"{r['plan']}")


if __name__ == "__main__":
    main()
