"""Plain-dict views of plans and estimates, for --json output and plan files, and CSV tables."""

from __future__ import annotations

from dataclasses import asdict

from model.cluster import ClusterSpec
from model.estimator import Estimate
from model.plan import Placement, Plan, Shape


def shape_to_dict(shape: Shape) -> dict:
    d = asdict(shape)
    d["layers"] = list(shape.layers)
    return d


def placement_to_dict(pl: Placement, cluster: ClusterSpec, cp: int = 1) -> list[dict]:
    """One row per (stage, replica[, CP rank]): node name and local GPU ids, tensor rank
    order. With context parallelism a row also names its CP rank (column = replica x cp +
    cp_rank in model.plan's terms)."""
    rows = []
    for s in range(pl.pp):
        for col in range(pl.cols):
            row = {"stage": s, "replica": col // cp}
            if cp > 1:
                row["cp_rank"] = col % cp
            row.update(node=cluster.nodes[pl.node[s][col]].name, gpus=list(pl.gpus[s][col]))
            rows.append(row)
    return rows


def placement_from_dict(rows: list[dict], cluster: ClusterSpec, pp: int, dp: int,
                        cp: int = 1) -> Placement:
    cols = dp * cp
    node = [[-1] * cols for _ in range(pp)]
    gpus = [[()] * cols for _ in range(pp)]
    for row in rows:
        s, r = int(row["stage"]), int(row["replica"]) * cp + int(row.get("cp_rank", 0))
        node[s][r] = cluster.node_index(str(row["node"]))
        gpus[s][r] = tuple(int(g) for g in row["gpus"])
    return Placement(tuple(map(tuple, node)), tuple(map(tuple, gpus)))


def plan_to_dict(plan: Plan, cluster: ClusterSpec) -> dict:
    return {"shape": shape_to_dict(plan.shape),
            "placement": placement_to_dict(plan.placement, cluster, plan.shape.cp)}


# estimate --json's breakdown_ms keys (model/estimator.py Evaluator.estimate)
BREAKDOWN_KEYS = ("compute_ms", "tp_comm_ms", "ep_alltoall_ms", "cp_exchange_ms",
                  "shard_comm_ms",
                  "pipeline_p2p_ms", "dp_sync_exposed_ms", "optimizer_ms", "tied_embedding_ms",
                  "other_tail_ms",
                  "bubble_ms")


def estimate_to_dict(e: Estimate) -> dict:
    return {
        "iteration_ms": e.iteration_ms,
        "tokens_per_s": e.tokens_per_s,
        "mfu": e.mfu,
        "hfu": e.hfu,
        "mfu_causal": e.mfu_causal,
        "num_microbatches": e.num_microbatches,
        "fits": e.fits,
        "peak_memory_gib": e.peak_memory_gib,
        # one key set whatever the plan (a part the plan has none of is 0.0), in the
        # estimator's order
        "breakdown_ms": {**{k: 0.0 for k in BREAKDOWN_KEYS}, **e.breakdown_ms},
        "replica_ms": list(e.replica_ms),
        "hops_ms": [{"hop": h, "fwd_ms": f, "bwd_ms": b} for h, (f, b) in enumerate(e.hops_ms)],
        "stages": [{
            "stage": s.stage, "layers": s.layers, "full_attention_layers": s.full_layers,
            "fwd_ms": s.fwd_ms, "bwd_ms": s.bwd_ms,
            "dp_sync_ms": s.sync_ms, "dp_sync_exposed_ms": s.sync_exposed_ms,
            "optimizer_ms": s.optimizer_ms, "limit_gib": float(s.limit_gib),
            "memory_gib": {
                "weights": s.memory.weights_gib, "grads": s.memory.grads_gib,
                "optimizer": s.memory.optimizer_gib, "activations": s.memory.activations_gib,
                "working": s.memory.working_gib, "allowance": s.memory.allowance_gib,
                "dispatcher_buffers_in_allowance": s.memory.dispatcher_gib,
                "total": s.memory.total_gib},
            "inflight_microbatches": list(s.memory.inflight),
        } for s in e.stages],
    }


def write_csv(path, rows: list[dict]) -> None:
    """Rows of one table (e.g. `compare`'s) as CSV, header from the first row's keys."""
    import csv

    import io

    from .atomic import write_atomic

    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else [])
    w.writeheader()
    w.writerows(rows)
    write_atomic(path, buf.getvalue(), field="--csv")
