"""Collective and point-to-point communication times, in milliseconds (sizes in bytes,
bandwidths in GB/s, 1 GB = 1e9 bytes), and how much of a collective a concurrent kernel hides.

Collective formulas are the ring algorithm's (Thakur et al. 2005; NCCL's bus-bandwidth
definition in nccl-tests PERFORMANCE.md): all-reduce moves 2(n-1)/n of the buffer through the
slowest link of the ring, reduce-scatter and all-gather (n-1)/n.
"""

from __future__ import annotations

from .cluster import ClusterSpec


def ring_ms(nbytes: float, n: int, gb_per_s: float, latency_us: float, factor: float) -> float:
    """`factor` (n-1)/n of the buffer through a ring of n at `gb_per_s`, plus per-step latency."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return factor * (n - 1) / n * nbytes / (gb_per_s * 1e6) + factor * (n - 1) * latency_us / 1e3


def allreduce_ms(nbytes, n, gb_per_s, latency_us):
    return ring_ms(nbytes, n, gb_per_s, latency_us, 2.0)


def gather_ms(nbytes, n, gb_per_s, latency_us):
    """All-gather or reduce-scatter of a buffer of `nbytes` (the full, gathered size)."""
    return ring_ms(nbytes, n, gb_per_s, latency_us, 1.0)


def exposed_async_ms(comm_ms: float, overlapped_ms: float) -> float:
    """A collective launched asynchronously next to a kernel that does not depend on it (as
    Megatron-LM's backward overlaps a column-parallel layer's input all-gather with its data
    gradient and the gradient's reduction with the weight gradient): only what outlasts the
    kernel shows."""
    return max(0.0, comm_ms - overlapped_ms)


def exposed_pipelined_ms(comm_ms: float, gemm_ms: float, chunks: int) -> float:
    """A collective split into `chunks` ring steps, each overlapped with the GEMM's work on the
    chunk that has arrived (Megatron-LM --tp-comm-overlap, torchtitan async TP: all-gather then
    GEMM, GEMM then reduce-scatter, one chunk per rank): the first step cannot overlap, and the
    rest hides as far as the GEMM lasts."""
    if chunks <= 1:
        return comm_ms
    step = comm_ms / chunks
    return step + max(0.0, comm_ms - step - gemm_ms * (chunks - 1) / chunks)


def dp_ring(cluster: ClusterSpec, members: list[tuple[int, int]],
            channels_per_node: bool = True) -> tuple[float, bool]:
    """Bandwidth of the data-parallel ring through `members` [(node, local GPU)], in replica
    order, and whether it leaves a node.

    NCCL builds rings that visit each node's members contiguously and chain nodes in rank order
    (hierarchical); each member has its own NIC, so the k members of a node drive k parallel
    channels across nodes. The ring is limited by its slowest link: min over consecutive nodes
    (cyclic) of k x stream bandwidth, and the intra-node ring of any node holding several members.
    """
    order: list[int] = []
    per_node: dict[int, list[int]] = {}
    for n, g in members:
        if n not in per_node:
            order.append(n)
            per_node[n] = []
        per_node[n].append(g)
    bw = float("inf")
    for n in order:
        if len(per_node[n]) > 1:
            bw = min(bw, cluster.nodes[n].ring_gb_per_s(tuple(per_node[n])))
    if len(order) > 1:
        # channels_per_node=False: one stream per node boundary (a flat ring; see
        # costs.CostModel._shard_collectives for where that is what was measured)
        k = min(len(v) for v in per_node.values()) if channels_per_node else 1
        # the slowest consecutive pair, cyclic
        bw = min(bw, k * float(cluster.inter_gb_per_s[order, order[1:] + order[:1]].min()))
    return bw, len(order) > 1


def p2p_ring(cluster: ClusterSpec, members: list[tuple[int, int]]) -> float:
    """Bandwidth of a point-to-point ring through `members` [(node, local GPU)] in their given
    order (no reordering: context parallelism sends K and V from CP rank i to rank i + 1, as
    Transformer Engine's ring attention does): every member sends one stream to the next at
    once, so a step lasts as long as the slowest hop (NVLink between two GPUs of a node, one
    GPU's network stream between nodes)."""
    n = len(members)
    if n <= 1:
        return float("inf")
    bw = float("inf")
    for i, (na, ga) in enumerate(members):
        nb, gb = members[(i + 1) % n]
        if na == nb:
            bw = min(bw, cluster.nodes[na].link_gb_per_s(ga, gb))
        else:
            bw = min(bw, float(cluster.inter_gb_per_s[na, nb]))
    return bw


def alltoall_ms(cluster: ClusterSpec, members: list[tuple[int, int]], nbytes: float,
                latency_us: float) -> float:
    """An all-to-all among `members` [(node, local GPU)] in which each member holds `nbytes`,
    split evenly into one chunk per member (the dispatch and combine of expert parallelism).

    NCCL runs it as grouped point-to-point sends and receives, all at once. A member's chunks
    for the other nodes leave through its own NIC, one after another at the measured stream to
    each peer node. Its chunks for GPUs of its own node leave over NVLink, whose bandwidth is
    shared by those chunks, in parallel with the network. Receiving is the same, in the other
    direction. The all-to-all ends when the busiest member has sent and received everything,
    plus one latency per peer:

        t = max_i max(sum over off-node j of chunk / bw(n_i, n_j),
                      sum over on-node j of chunk / link(g_i, g_j),  and the receive sums)

    With one member per node on a uniform matrix this is (n-1)/n x nbytes / bw, the
    closed form of a balanced all-to-all.
    """
    n = len(members)
    if n <= 1 or nbytes <= 0:
        return 0.0
    chunk = nbytes / n
    worst = 0.0
    for i, (ni, gi) in enumerate(members):
        send_net = recv_net = send_nv = recv_nv = 0.0
        for j, (nj, gj) in enumerate(members):
            if i == j:
                continue
            if ni == nj:
                node = cluster.nodes[ni]
                send_nv += chunk / (node.link_gb_per_s(gi, gj) * 1e6)
                recv_nv += chunk / (node.link_gb_per_s(gj, gi) * 1e6)
            else:
                send_net += chunk / (float(cluster.inter_gb_per_s[ni, nj]) * 1e6)
                recv_net += chunk / (float(cluster.inter_gb_per_s[nj, ni]) * 1e6)
        worst = max(worst, send_net, recv_net, send_nv, recv_nv)
    return worst + (n - 1) * latency_us / 1e3
