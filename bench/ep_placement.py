"""Expert parallelism on a cluster with two slow leaf switches: where the EP groups land.

    python bench/ep_placement.py [--time-limit 60] [--orders 3]

The cluster: 16 nodes of 8 H100-SXM-80GB (NVLink 360 GB/s, 450 x 0.8), four leaf switches of
four nodes. A GPU stream between two nodes of one leaf gets 50 GB/s (400 Gb/s NDR); across
leaves the spine is 2:1 oversubscribed (25 GB/s); two of the four leaves have degraded
uplinks, so any stream that leaves or enters them across the spine gets 6.25 GB/s. The
hostfile lists the nodes in rack order ("racked": node i in leaf i // 4), or, as hostfiles
sorted by name often are, in an order that does not follow the racks ("shuffled", one
permutation per seed).

The job: Qwen3-30B-A3B (128 experts, top 8), global batch 512, sequence 4096, bf16,
Megatron-LM, with EP 16 or 32 (an EP group spans 2 or 4 nodes, so its all-to-all crosses
nodes: the case where placement matters). For each cluster the script runs `compare`
(solvers/compare.py: the exact search, the annealer, and the exact search's shape under
Megatron-LM's default rank placement, all scored by the same estimator) and prints the times,
the ratio Megatron placement / ours, the same ratio for our own shape and split placed in
Megatron-LM's order (the placement alone), the all-to-all time per stage of both, and how many
EP groups each placement puts across a leaf boundary or on a degraded uplink ("ours": the
better of the exact search and the annealer).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from model.cluster import ClusterSpec, NodeSpec  # noqa: E402
from model.estimator import Evaluator  # noqa: E402
from model.plan import Plan, ep_groups, megatron_placement  # noqa: E402
from model.specs import JobSpec, Options  # noqa: E402
from solvers.compare import compare_instance  # noqa: E402
from solvers.space import SearchSpace  # noqa: E402

NODES, GPUS, LEAF = 16, 8, 4
IN_LEAF, SPINE, DEGRADED = 50.0, 25.0, 6.25
SLOW_LEAVES = (1, 3)


def two_slow_leaves(order: np.ndarray, name: str) -> tuple[ClusterSpec, list[int]]:
    """The cluster; `order[i]` is the rack slot of the i-th node of the hostfile."""
    leaf = [int(order[i]) // LEAF for i in range(NODES)]
    bw = np.zeros((NODES, NODES))
    for a in range(NODES):
        for b in range(NODES):
            if a == b:
                continue
            if leaf[a] == leaf[b]:
                bw[a, b] = IN_LEAF
            elif leaf[a] in SLOW_LEAVES or leaf[b] in SLOW_LEAVES:
                bw[a, b] = DEGRADED
            else:
                bw[a, b] = SPINE
    gpu = presets.gpu("H100-SXM-80GB")
    nodes = tuple(NodeSpec(f"node{i:02d}", gpu, GPUS, 360.0) for i in range(NODES))
    return ClusterSpec(name=name, nodes=nodes, inter_gb_per_s=bw, latency_us=5.0,
                       source=name), leaf


def ep_report(model, job, cluster, leaf, plan) -> tuple[float, int, int]:
    """(slowest all-to-all of any stage in ms, EP groups crossing leaves, EP groups on a
    degraded uplink) of a plan."""
    ev = Evaluator(model, job, cluster, plan.shape, Options())
    pl = plan.placement
    worst = max(ev.ep_alltoall(pl, s, r) for s in range(plan.shape.pp)
                for r in range(plan.shape.cols))
    cross = slow = 0
    for s in range(plan.shape.pp):
        for grp in ep_groups(plan.shape):
            leaves = {leaf[pl.node[s][c]] for c, _t in grp}
            if len(leaves) > 1:
                cross += 1
                slow += bool(leaves & set(SLOW_LEAVES))
    return worst, cross, slow


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--orders", type=int, default=3, help="shuffled hostfile orders")
    args = ap.parse_args()
    model = presets.model("qwen3-30b-a3b")
    job = JobSpec(global_batch=512, seq_length=4096, precision="bf16")
    space = SearchSpace(tp=(1, 2), pp=(1, 2, 4), micro_batch=(1, 2), ep=(16, 32),
                        schedules=(("1f1b", 1),), recompute=("none", "full"))
    clusters = [two_slow_leaves(np.arange(NODES), "racked")]
    for seed in range(args.orders):
        perm = np.random.default_rng(seed).permutation(NODES)
        clusters.append(two_slow_leaves(perm, f"shuffled-{seed}"))
    print(f"Qwen3-30B-A3B, GBS {job.global_batch}, seq {job.seq_length}, EP 16/32; 16 nodes x 8 "
          f"H100, leaves of 4 ({IN_LEAF:g} GB/s), spine {SPINE:g}, leaves {SLOW_LEAVES} "
          f"degraded to {DEGRADED:g}; time limit {args.time_limit:g} s per method\n")
    head = (f"{'cluster':<11} {'plan (ours)':<44} {'exact s':>8} {'anneal s':>8} "
            f"{'megatron s':>10} {'meg/ours':>8} {'same/ours':>9} {'a2a ours':>9} {'a2a meg':>8} "
            f"{'cross ours':>10} {'cross meg':>9} {'slow ours':>9} {'slow meg':>8} {'status':>22}")
    print(head)
    ratios, same_ratios = [], []
    for cluster, leaf in clusters:
        t0 = time.perf_counter()
        plans: dict = {}
        rows = {r["method"]: r for r in compare_instance(model, job, cluster,
                                                         time_limit_s=args.time_limit,
                                                         space=space, plans=plans)}
        ex, an, meg = rows["exact"], rows["anneal"], rows["megatron"]
        # ours: the better of the two searches; Megatron's: the exact search's shape in
        # Megatron-LM's rank order (compare's baseline)
        ours = plans["exact"] if ex["iteration_ms"] <= an["iteration_ms"] else plans["anneal"]
        # Megatron-LM's placement of the same shape and split as ours (the placement alone)
        same = Plan(ours.shape, megatron_placement(cluster, ours.shape.tp, ours.shape.pp,
                                                   ours.shape.cols))
        meg_same = Evaluator(model, job, cluster, ours.shape, Options()).iteration_ms(
            same.placement)
        a_ours, c_ours, s_ours = ep_report(model, job, cluster, leaf, ours)
        a_meg, c_meg, s_meg = ep_report(model, job, cluster, leaf, same)
        best = min(ex["iteration_ms"], an["iteration_ms"])
        ratio = meg["iteration_ms"] / best
        ratios.append(ratio)
        same_ratios.append(meg_same / best)
        print(f"{cluster.name:<11} {ours.shape.describe()[:44]:<44} "
              f"{ex['iteration_ms'] / 1e3:8.3f} "
              f"{an['iteration_ms'] / 1e3:8.3f} {meg['iteration_ms'] / 1e3:10.3f} "
              f"{ratio:8.3f} {meg_same / best:9.3f} {a_ours:9.3f} {a_meg:8.3f} {c_ours:10d} {c_meg:9d} {s_ours:9d} "
              f"{s_meg:8d} {ex['proven'][:22]:>22}   ({time.perf_counter() - t0:.0f} s)")
    print(f"\nMegatron placement / ours: median {np.median(ratios):.3f}, min {min(ratios):.3f}, "
          f"max {max(ratios):.3f} over {len(ratios)} clusters (compare's baseline: the exact "
          f"search's shape in Megatron-LM order); same shape and split as ours, Megatron-LM "
          f"order: median {np.median(same_ratios):.3f}, min {min(same_ratios):.3f}, max "
          f"{max(same_ratios):.3f}. a2a: one all-to-all, ms, slowest stage, of ours and of the "
          "same shape in Megatron order; cross / slow: EP groups across a leaf boundary / "
          "over a degraded uplink")


if __name__ == "__main__":
    main()
