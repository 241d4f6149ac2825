"""The placement made real: which torchrun `--node_rank` and `CUDA_VISIBLE_DEVICES` order each
physical node gets so that the framework's process groups land where the plan put them.

Rank order. Megatron-LM builds its groups from global ranks with tensor parallelism fastest,
then context, then data, then pipeline (megatron/core/parallel_state.py,
`initialize_model_parallel`, default order "tp-cp-ep-dp-pp"; Narayanan et al. 2021 Sec. 3):

    rank = stage * (tp * cp * dp) + (replica * cp + cp_rank) * tp + tensor_rank

(replica * cp + cp_rank is the placement's column, model.plan).

The same order holds for NeMo (it calls Megatron-Core's parallel_state), torchtitan (its device
mesh is ["pp", "dp_replicate", "dp_shard", "cp", "tp"], row-major, tp fastest:
torchtitan/distributed/parallel_dims.py) and DeepSpeed pipelines (PipeModelDataParallelTopology
axes ["pipe", "data", "model"], model fastest: deepspeed/runtime/pipe/topology.py).

Launcher. torchrun gives the node started with `--node_rank=k` and `--nproc_per_node=G` the
global ranks k*G .. k*G+G-1, and local_rank = rank - k*G (torch.distributed.run docs: "RANK =
group_rank * local_world_size + local_rank" for a homogeneous job). Megatron-LM binds each process
to CUDA device `local_rank` (megatron/training/initialize.py `_initialize_distributed`:
`torch.cuda.set_device(args.local_rank)`), which CUDA_VISIBLE_DEVICES renumbers: local device l
is physical GPU CUDA_VISIBLE_DEVICES[l].

So a placement is expressible iff every block of G consecutive ranks lies on one node, and every
node has G GPUs; then node n gets node_rank = its block and CUDA_VISIBLE_DEVICES[l] = the
physical GPU the plan gives rank k*G + l.

Megatron-LM (and NeMo through it) also takes the order "tp-cp-ep-pp-dp" with
`--use-tp-pp-dp-mapping` (megatron/training/initialize.py, `initialize_model_parallel(order=...)`):
pipeline before data, so one replica's stages are consecutive ranks,

    rank = replica * (tp * cp * pp) + stage * (tp * cp) + cp_rank * tp + tensor_rank.

A placement that puts several stages of one replica on a node (and not several replicas of one
stage) needs that order. `rank_mapping` tries the default order first, then this one where the
framework has it (ORDERS).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from model.cluster import ClusterSpec
from model.plan import DEFAULT_ORDER, TP_PP_DP_ORDER, Plan, megatron_rank, slot_label


# the rank orders each framework can be told to use: torchtitan's device mesh and DeepSpeed's
# PipeModelDataParallelTopology put the pipeline dimension outermost, always
ORDERS = {"megatron": (DEFAULT_ORDER, TP_PP_DP_ORDER), "nemo": (DEFAULT_ORDER, TP_PP_DP_ORDER),
          "torchtitan": (DEFAULT_ORDER,), "deepspeed": (DEFAULT_ORDER,)}


@dataclass(frozen=True)
class RankMapping:
    """`node_rank[n]` and `visible_devices[n]` (local_rank -> physical GPU id) per cluster
    node index n; `order` lists node indices by node_rank."""

    nproc_per_node: int
    world_size: int
    node_rank: tuple[int, ...]
    visible_devices: tuple[tuple[int, ...], ...]
    rank_order: str = DEFAULT_ORDER

    @property
    def order(self) -> list[int]:
        return sorted(range(len(self.node_rank)), key=lambda n: self.node_rank[n])

    def where(self, rank: int, nodes_by_rank: list[int] | None = None) -> tuple[int, int]:
        """(node index, physical GPU) that global `rank` runs on under this mapping."""
        G = self.nproc_per_node
        n = (nodes_by_rank or self.order)[rank // G]
        return n, self.visible_devices[n][rank % G]


def rank_locations(plan: Plan, order: str = DEFAULT_ORDER
                   ) -> dict[int, tuple[int, int, int, int, int]]:
    """global rank -> (node index, physical GPU, stage, column, tensor rank) the plan wants."""
    sh, pl = plan.shape, plan.placement
    out = {}
    for s in range(sh.pp):
        for r in range(sh.cols):
            for i in range(sh.tp):
                out[megatron_rank(sh.tp, sh.cols, s, r, i, order, sh.pp, sh.cp)] = (
                    pl.node[s][r], pl.gpus[s][r][i], s, r, i)
    return out


def rank_mapping(cluster: ClusterSpec, plan: Plan, orders: tuple[str, ...] = (DEFAULT_ORDER,)
                 ) -> tuple[RankMapping | None, str | None]:
    """The torchrun node ranks and device orders realizing `plan` under the first rank order
    of `orders` that can, or (None, the reason under the first order).

    The tp-pp-dp order is tried only without expert parallelism: the expert groups
    (plan.ep_groups) are derived for the default order."""
    first_reason = None
    for order in orders:
        if order != DEFAULT_ORDER and plan.shape.ep > 1:
            continue
        mp, why = _rank_mapping(cluster, plan, order)
        if mp is not None:
            return mp, None
        first_reason = first_reason or why
    if len(orders) > 1 and plan.shape.ep == 1:
        first_reason += " (nor in the tp-pp-dp order of --use-tp-pp-dp-mapping)"
    return None, first_reason


def _rank_mapping(cluster: ClusterSpec, plan: Plan, order: str
                  ) -> tuple[RankMapping | None, str | None]:
    G = cluster.gpus_per_node
    if G is None:
        counts = ", ".join(f"{nd.name}={nd.num_gpus}" for nd in cluster.nodes)
        return None, (f"nodes have different GPU counts ({counts}); torchrun gives every node "
                      "the same --nproc_per_node, so contiguous rank blocks cannot match them")
    sh = plan.shape
    world = sh.tp * sh.pp * sh.cols
    if world != cluster.num_gpus:
        return None, (f"the plan uses {world} GPUs but the cluster has {cluster.num_gpus}; "
                      "every GPU must run one rank")
    loc = rank_locations(plan, order)
    node_rank = [-1] * cluster.num_nodes
    devices: list[tuple[int, ...]] = [()] * cluster.num_nodes
    for k in range(world // G):
        block = [loc[q] for q in range(k * G, (k + 1) * G)]
        nodes = sorted({b[0] for b in block})
        if len(nodes) != 1:
            where = "; ".join(
                f"{cluster.nodes[n].name} gets "
                + ", ".join(sorted({slot_label(b[2], b[3], plan.shape.cp) for b in block
                                    if b[0] == n}))
                for n in nodes)
            return None, (f"torchrun node_rank {k} runs ranks {k * G}..{k * G + G - 1} on one "
                          f"node, but the plan puts them on {len(nodes)} nodes ({where}); a "
                          "node's GPUs would need ranks from non-contiguous blocks")
        n = nodes[0]
        if node_rank[n] >= 0:  # cannot happen when all GPUs are used once; kept as a guard
            return None, (f"{cluster.nodes[n].name} would need two rank blocks "
                          f"({node_rank[n]} and {k})")
        node_rank[n] = k
        devices[n] = tuple(b[1] for b in block)
    missing = [cluster.nodes[n].name for n in range(cluster.num_nodes) if node_rank[n] < 0]
    if missing:
        return None, f"nodes {', '.join(missing)} get no ranks"
    return RankMapping(G, world, tuple(node_rank), tuple(devices), order), None


# ---------------------------------------------------------------------------------------------
# files


def hostfile_text(cluster: ClusterSpec, mapping: RankMapping) -> str:
    """One `hostname slots=G` line per node, in node_rank order (the DeepSpeed / OpenMPI
    hostfile format: deepspeed/launcher/runner.py `fetch_hostfile`)."""
    lines = ["# hosts in node_rank order; slots = processes per node"]
    lines += [f"{cluster.nodes[n].name} slots={mapping.nproc_per_node}" for n in mapping.order]
    return "\n".join(lines) + "\n"


ORDER_FORMULA = {
    DEFAULT_ORDER: "rank = stage*TP*CP*DP + (replica*CP + cp_rank)*TP + tensor_rank",
    TP_PP_DP_ORDER: "rank = replica*TP*CP*PP + stage*TP*CP + cp_rank*TP + tensor_rank",
}


def launch_script(cluster: ClusterSpec, plan: Plan, mapping: RankMapping,
                  train_cmd: list[str], args_file: str | None = None,
                  title: str = "", env: dict[str, str | None] | None = None,
                  notices: list[str] = (), requires: dict[str, str] | None = None,
                  torchrun_flags: tuple[str, ...] = ()) -> str:
    """A bash script to run on every node: it picks its own torchrun line by host name
    ($NODE_NAME or `hostname -s`), with the node_rank and CUDA_VISIBLE_DEVICES order the
    plan needs. Flags are torchrun's (torch.distributed.run): --nnodes, --nproc_per_node,
    --node_rank, --master_addr, --master_port. `env` names the variables the framework needs
    exported (None: unset); `notices` become comment lines at the top. The arguments file is
    read one line at a time into an array (no word splitting of values, no globbing), and the
    script's own arguments are passed on after it (data, learning rate, ...).
    `torchrun_flags`: more of torchrun's own flags, in --flag=value form."""
    first = cluster.nodes[mapping.order[0]].name
    N = cluster.num_nodes
    G = mapping.nproc_per_node
    sh, pl = plan.shape, plan.placement
    # one word each, double-quoted: "$HERE" (and $NEMO_DIR) expand when the script runs, and
    # a folder with a space, or a token with brackets, stays one word (it had been split and
    # globbed unquoted)
    cmd = " ".join('"' + t.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'
                   for t in train_cmd)
    out = ["#!/usr/bin/env bash",
           "# Generated by pipette-configurator" + (f": {title}" if title else "")]
    out += [f"# {n}" for n in notices]
    out += [f"# Plan: {sh.describe()}  layers={list(sh.layers)}",
            "# Run this same script on every node; arguments given to it are passed on to the",
            "# training script. Each node gets the torchrun --node_rank and the",
            "# CUDA_VISIBLE_DEVICES order that put the framework's rank order",
            f"# ({ORDER_FORMULA[mapping.rank_order]}) where the plan placed it.",
            "set -euo pipefail",
            'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
            # an assignment is not word-split; the quoted default is taken literally
            f'MASTER_ADDR=${{MASTER_ADDR:-{shlex.quote(first)}}}  # the node with node_rank 0',
            'MASTER_PORT="${MASTER_PORT:-29500}"',
            # the host's name as the cluster file gives it: $NODE_NAME, else `hostname` when
            # that is one of the plan's nodes (a name with its domain), else `hostname -s`
            "PLAN_NODES=" + shlex.quote(" ".join(nd.name for nd in cluster.nodes)),
            'NODE="${NODE_NAME:-$(hostname)}"',
            'case " $PLAN_NODES " in *" $NODE "*) ;; *) '
            '[ -n "${NODE_NAME:-}" ] || NODE="$(hostname -s)" ;; esac']
    for k, what in (requires or {}).items():
        out.append(f': "${{{k}:?set {k} to {what}}}"')
    for k, (v, why) in (env or {}).items():
        out.append(f"# {why}")
        out.append(f"unset {k}" if v is None else f"export {k}={shlex.quote(v)}")
    out.append("TRAIN_ARGS=()")
    if args_file:
        out += ['while read -r line || [ -n "$line" ]; do',
                '  case "$line" in ""|"#"*) continue ;; esac',
                '  read -ra words <<< "$line"',
                '  TRAIN_ARGS+=("${words[@]}")',
                f'done < "$HERE/{args_file}"']
    # $TRAIN_CMD, when set, replaces the command (split into words, not globbed)
    out += ['if [ -n "${TRAIN_CMD:-}" ]; then read -ra CMD <<< "$TRAIN_CMD"; '
            f'else CMD=({cmd}); fi',
            f"TORCHRUN=\"torchrun --nnodes={N} --nproc_per_node={G} "
            "--master_addr=$MASTER_ADDR --master_port=$MASTER_PORT"
            + "".join(f" {f}" for f in torchrun_flags) + "\"",
            'case "$NODE" in']
    for n in mapping.order:
        nd = cluster.nodes[n]
        hosts = [slot_label(s, r, sh.cp)  # stage, then column order: s0/r8 before s0/r10
                 for s in range(sh.pp) for r in range(sh.cols) if pl.node[s][r] == n]
        k = mapping.node_rank[n]
        out.append(f"  # {nd.name}: ranks {k * G}..{k * G + G - 1} = {' '.join(hosts)}")
        dev = ",".join(map(str, mapping.visible_devices[n]))
        out.append(f"  {shlex.quote(nd.name)}) CUDA_VISIBLE_DEVICES={dev} exec $TORCHRUN "
                   f"--node_rank={k} \"${{CMD[@]}}\" ${{TRAIN_ARGS[@]+\"${{TRAIN_ARGS[@]}}\"}} "
                   "\"$@\" ;;")
    out += ['  *) echo "launch.sh: host $NODE is not in this plan (set NODE_NAME)" >&2; exit 1 ;;',
            "esac", ""]
    return "\n".join(out)


def mapping_table(cluster: ClusterSpec, plan: Plan, mapping: RankMapping) -> list[dict]:
    """Per node: node_rank, CUDA_VISIBLE_DEVICES, and (rank, stage, replica, tensor) per slot."""
    loc = rank_locations(plan, mapping.rank_order)
    G = mapping.nproc_per_node
    rows = []
    for n in mapping.order:
        k = mapping.node_rank[n]
        rows.append({"node": cluster.nodes[n].name, "node_rank": k,
                     "cuda_visible_devices": list(mapping.visible_devices[n]),
                     "ranks": [{"rank": q, "local_rank": q - k * G, "gpu": loc[q][1],
                                "stage": loc[q][2], "replica": loc[q][3] // plan.shape.cp,
                                **({"cp_rank": loc[q][3] % plan.shape.cp}
                                   if plan.shape.cp > 1 else {}),
                                "tensor": loc[q][4]}
                               for q in range(k * G, (k + 1) * G)]})
    return rows


def launch_files(cluster: ClusterSpec, plan: Plan, mapping: RankMapping, train_cmd: list[str],
                 args_file: str | None = None, title: str = "",
                 env: dict[str, tuple[str | None, str]] | None = None,
                 notices: list[str] = (), requires: dict[str, str] | None = None,
                 torchrun_flags: tuple[str, ...] = ()) -> dict[str, str]:
    """launch.sh, hostfile and ranks.json as {file name: text} (nothing written here)."""
    import json

    doc = {"rank_order": ORDER_FORMULA[mapping.rank_order],
           "framework_order": mapping.rank_order,
           **({"notices": list(notices)} if notices else {}),
           "nproc_per_node": mapping.nproc_per_node,
           "nodes": mapping_table(cluster, plan, mapping)}
    host = hostfile_text(cluster, mapping)
    if notices:
        host = "".join(f"# {n}\n" for n in notices) + host
    return {"launch.sh": launch_script(cluster, plan, mapping, train_cmd, args_file, title,
                                       env, notices, requires, torchrun_flags),
            "hostfile": host,
            "ranks.json": json.dumps(doc, indent=1) + "\n"}
