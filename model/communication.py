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


def share_reached(experts_there: int, num_experts: int, topk: int) -> float:
    """Probability that a token's top-k experts (k distinct experts drawn uniformly: the
    balanced router the published MoE benchmarks force) include at least one of
    `experts_there` given experts: 1 - C(E - e, k) / C(E, k)."""
    if experts_there <= 0:
        return 0.0
    miss = 1.0
    for i in range(topk):
        if num_experts - experts_there - i <= 0:
            return 1.0
        miss *= (num_experts - experts_there - i) / (num_experts - i)
    return 1.0 - miss


def hierarchical_dispatch_ms(cluster: ClusterSpec, members: list[tuple[int, int]],
                             tokens: float, token_bytes: float, num_experts: int,
                             topk: int) -> float:
    """One dispatch (or combine) of Megatron-Core's flex dispatcher with the DeepEP or
    HybridEP backend among `members` [(node, local GPU)], each holding `tokens` tokens of
    `token_bytes` and num_experts / len(members) of the experts.

    A token goes once to each GPU that holds one of its top-k experts, not once per expert
    (DeepEP's dispatch takes the routing as is_token_in_rank; the receiver permutes to
    experts), and crosses the network once per destination node: it travels to the GPU of the
    same local index there and is forwarded over NVLink to the others that need it (DeepEP
    internode.cu: one RDMA slot per node whose is_token_in_rank bytes are not all zero;
    DeepSeek-V3 technical report Sec. 3.2.2; HybridEP the same, docs/Hybrid-EP_Implementation
    .md). The network and NVLink legs run at once ("communications via IB and NVLink are fully
    overlapped", the report). With e experts per GPU and g_n members on node n, member i of
    node a sends T share(g_n e) tokens to each other node n and receives (g_n / g_a) T
    share(g_a e) from it (share_reached, balanced routing); over NVLink it sends each other
    GPU of its node T share(e) tokens of its own and forwards what arrived for them, in all
    T share(e) (g_a - 1) (1 + sum over other nodes of g_n / g_a) tokens, spread evenly over its
    g_a - 1 peers (and receives as much). Each leg is timed as `alltoall_ms` times its sends:
    one after another at the measured stream to each node, and over the GPU-to-GPU links.
    Latency: one per other node over the network, one per other GPU of the node over
    NVLink."""
    n = len(members)
    if n <= 1 or tokens <= 0:
        return 0.0
    per_node: dict[int, list[int]] = {}
    for node, gpu in members:
        per_node.setdefault(node, []).append(gpu)
    e = num_experts / n
    tok_b = tokens * token_bytes
    local = share_reached(int(round(e)), num_experts, topk)  # one other GPU needs the token
    worst = 0.0
    for a, gpus in per_node.items():
        ga = len(gpus)
        node_share = share_reached(int(round(ga * e)), num_experts, topk)
        others = {m: len(g) for m, g in per_node.items() if m != a}
        send_net = sum(tok_b * share_reached(int(round(gm * e)), num_experts, topk)
                       / (float(cluster.inter_gb_per_s[a, m]) * 1e6)
                       for m, gm in others.items())
        recv_net = sum(gm / ga * tok_b * node_share / (float(cluster.inter_gb_per_s[m, a]) * 1e6)
                       for m, gm in others.items())
        nv_total = tok_b * local * (ga - 1) * (1 + sum(others.values()) / ga)
        node = cluster.nodes[a]
        for gi in gpus:
            peers = [g for g in gpus if g != gi]
            send_nv = sum(nv_total / len(peers) / (node.link_gb_per_s(gi, g) * 1e6)
                          for g in peers)
            recv_nv = sum(nv_total / len(peers) / (node.link_gb_per_s(g, gi) * 1e6)
                          for g in peers)
            worst = max(worst, send_net, recv_net, send_nv, recv_nv)
    lat = ((len(per_node) - 1) * cluster.latency_us
           + (max(len(g) for g in per_node.values()) - 1) * cluster.intra_latency_us)
    return worst + lat / 1e3


# DeepEP's normal-mode kernels (deepseek-ai/DeepEP dd758ca, the legacy Buffer Megatron-Core's
# flex dispatcher builds: megatron/core/transformer/moe/fused_a2a.py get_buffer). Per EP group
# size, the (NVLink chunked receive tokens, RDMA chunked send tokens, RDMA chunked receive
# tokens) of Buffer.get_dispatch_config and get_combine_config (deep_ep/buffers/legacy.py);
# no other group size has a configuration ("Unsupported number of EP ranks")
DEEPEP_CONFIGS = {  # ranks: ((dispatch nvl recv, rdma send, rdma recv), (combine ...))
    2: ((256, 6, 128), (256, 6, 128)), 4: ((256, 6, 128), (256, 6, 128)),
    8: ((256, 6, 128), (256, 6, 128)), 16: ((288, 20, 128), (288, 12, 128)),
    24: ((288, 8, 128), (288, 8, 128)), 32: ((288, 8, 128), (288, 8, 128)),
    48: ((288, 8, 128), (288, 8, 128)), 64: ((288, 8, 128), (288, 8, 128)),
    96: ((480, 12, 128), (480, 8, 128)), 128: ((560, 12, 128), (560, 8, 128)),
    144: ((720, 12, 128), (720, 8, 128)), 160: ((720, 12, 128), (720, 8, 128))}
DEEPEP_GROUP_SIZES = tuple(sorted(DEEPEP_CONFIGS))
DEEPEP_NUM_SMS = 20  # Megatron-Core's default (token_dispatcher.py: "None -> 20")
DEEPEP_NVL_PEERS = 8  # LEGACY_NUM_MAX_NVL_PEERS
DEEPEP_WORKSPACE_BYTES = 32 * 2 ** 20  # LEGACY_NUM_WORKSPACE_BYTES, cudaMalloc'd per buffer
# DeepEP sets NVSHMEM_CUMEM_GRANULARITY = 2^29 ("NVSHMEM initialization requires at least
# 256 MiB"): the symmetric heap holding the RDMA buffer grows in granules of this size
NVSHMEM_GRANULE_BYTES = 2 ** 29


def deepep_buffer_bytes(ep: int, hidden_size: int, activation_bytes: int) -> float:
    """Device memory of the DeepEP buffer one GPU of an EP group of `ep` ranks holds, outside
    PyTorch's allocator: the NVLink buffer (csrc/legacy/config.hpp get_nvl_buffer_size_hint,
    the larger of the dispatch and combine configurations', as Megatron-Core takes them),
    the 32 MiB workspace, and above 8 ranks the RDMA buffer (get_rdma_buffer_size_hint) in
    NVSHMEM's symmetric heap, whole granules (NVSHMEM_GRANULE_BYTES). Per token slot both
    hold the hidden state (Megatron-Core's hidden bytes: at least 2 per element,
    fused_a2a.py get_hidden_bytes), DeepEP's 8-byte source record, and room for 128 top-k
    indices (int64), 128 weights and 128 scales (fp32), whatever k is; channels are half the
    SMs. 0 for a group DeepEP does not run (DEEPEP_GROUP_SIZES) or of one rank."""
    if ep <= 1 or ep not in DEEPEP_CONFIGS:
        return 0.0
    hidden_b = hidden_size * max(activation_bytes, 2)
    meta, topk_max, scales_max = 8, 128, 128
    slot = hidden_b + meta + topk_max * 8 + topk_max * 4 + scales_max * 4
    channels = DEEPEP_NUM_SMS // 2
    rdma_ranks = max(ep // DEEPEP_NVL_PEERS, 1)
    nvl_ranks = min(ep, DEEPEP_NVL_PEERS)

    def align(x: int) -> int:
        return (x + 127) // 128 * 128

    nvl = rdma = 0
    for nvl_recv, rdma_send, rdma_recv in DEEPEP_CONFIGS[ep]:
        nvl = max(nvl, align(channels * nvl_ranks * (2 * rdma_ranks + 3) * 4
                             + channels * nvl_ranks * nvl_recv * slot))
        if ep > DEEPEP_NVL_PEERS:
            recv = -(-rdma_recv // rdma_send) * rdma_send  # Config rounds it up to the send
            rdma = max(rdma, align(
                channels * rdma_ranks * (DEEPEP_NVL_PEERS * 2 + 2) * 2 * 4
                + channels * rdma_ranks * recv * (2 * slot + 2 * 16)))
    heap = -(-rdma // NVSHMEM_GRANULE_BYTES) * NVSHMEM_GRANULE_BYTES if rdma else 0
    return float(nvl + DEEPEP_WORKSPACE_BYTES + heap)


def hybridep_buffer_bytes(tokens: int, hidden_size: int, num_experts: int, ep: int,
                          domain: int) -> float:
    """Device memory of the HybridEP buffer one GPU of an EP group of `ep` ranks holds,
    outside PyTorch's allocator (DeepEP hybrid-ep branch 94a9f8f: csrc/hybrid_ep/buffer/
    intranode.cu allocate_combine_buffers / allocate_dispatch_buffers and internode_doca.cu,
    with Megatron-Core's defaults: fused_a2a.py init_hybrid_ep_buffer sizes it for the
    `tokens` the rank dispatches, 16-bit tokens, the shared dispatch/combine buffer, no
    custom all-gather). R = min(ep, `domain`) ranks share an NVLink domain and N = ep / R
    domains take part. Inside the domain every GPU holds room for all T R N tokens of the
    group: their 16-bit hidden states, an fp32 probability per expert of the domain, and an
    fp32 scale per 128 elements. Across domains (N > 1) it also holds its own T tokens'
    hidden states, probabilities (every expert) and scales, and for each of the N - 1 other
    domains T tokens' hidden states and probabilities for the dispatch, and twice for the
    combine (the reduction's and the transfer's), the dispatch's with scales. Flags and the
    preprocessing scratch are left out (kilobytes)."""
    if ep <= 1 or tokens <= 0:
        return 0.0
    R = min(ep, max(1, domain))
    N = max(1, ep // R)
    e_rank = num_experts / ep
    T, h = float(tokens), float(hidden_size)
    scales = h // 128
    per_token = 2 * h + 4 * e_rank * R + 4 * scales
    nvl = T * R * N * per_token
    rdma = 0.0
    if N > 1:
        rdma += T * (2 * h + 4 * e_rank * R * N + 4 * scales)  # the rank's own tokens
        rdma += T * (N - 1) * per_token  # dispatch, from each other domain
        rdma += 2 * T * (N - 1) * (2 * h + 4 * e_rank * R)  # combine: reduction, transfer
    return nvl + rdma
