"""Closed-form lower bounds on a shape's iteration time, over every layer split and every
placement the solvers search (valid before any MILP is built, so every search has a bound).

The path argument (any schedule): stage k runs the forward and backward of all m micro-batches,
m W_k of work; it cannot start before micro-batch 0 has gone forward through stages 0..k-1 (k
transfers), and after its last backward that micro-batch's gradient goes back through them (k
transfers) to stage 0, whose tail (gradient synchronization and optimizer step) ends the
iteration. So for every k

    T >= sum_{s<k} W_s + 2 k hop_min + m W_k + tail_0,

with W_s the forward + backward of one micro-batch on stage s (for interleaved schedules only
the chunk-0 part of the stages before k must pass first: at least one layer each). The bound
is the smallest T for which some integer split satisfies every k, each stage within its memory
(binary search on T; for a given T the layers placed before each stage form an interval, which
`feasible` carries from stage to stage). Durations are each operation's fastest on any GPU
type of the cluster; hop_min is the cheapest transfer anywhere; the tail is taken at its
smallest (stage 0 with one layer, the data-parallel ring at the best rate any block layout
could give, only the last bucket when the plan overlaps; a tied embedding's all-reduce with
the last stage over the cluster's fastest link).
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from model import work
from model.cluster import ClusterSpec
from model.costs import CostModel
from model.memory import GIB, keeps_unsharded, plan_overheads
from model.plan import Shape, num_microbatches
from model.topology import EXHAUSTIVE_MAX_GPUS
from model.specs import JobSpec, ModelSpec, Options

from .space import blocks_for, stage_memory_events


def _top_inter(cluster: ClusterSpec, single_node: float) -> float:
    """The fastest stream between two different nodes; `single_node` if there is one node."""
    return float(cluster.inbound_max_gb_per_s.max()) if cluster.num_nodes > 1 else single_node


def _fastest_layer_times(costs: CostModel, cluster: ClusterSpec, tp: int,
                         shard_ring: float = math.inf, cp_ring: float = math.inf,
                         ep_alltoall_ms: float = 0.0):
    """Per GPU type, its layer times on its fastest TP ring (and ZeRO-3 shard ring, CP ring);
    the type with the fastest layer."""
    best = None
    for gpu in cluster.gpu_types:
        rings = [node_group_ring_gb_per_s(nd, tp) for nd in cluster.node_kinds
                 if nd.gpu.name == gpu.name and tp <= nd.num_gpus]
        if not rings:
            continue
        lt = costs.layer_times(gpu, max(rings), shard_ring, cp_ring, ep_alltoall_ms)
        if best is None or lt.fwd_ms + lt.bwd_ms < best[1].fwd_ms + best[1].bwd_ms:
            best = (gpu, lt)
    return best


def best_group_ring_gb_per_s(cluster: ClusterSpec, g: int) -> float:
    """An upper bound on the ring of any g GPUs of one node (inf for g <= 1; a node with
    fewer GPUs counts with all of them): a uniform node's link; on a GPU-by-GPU matrix the
    best ring over every g of its GPUs (up to EXHAUSTIVE_MAX_GPUS GPUs), else its fastest
    link, which no ring beats."""
    if g <= 1:
        return math.inf
    out = max((node_group_ring_gb_per_s(nd, min(g, nd.num_gpus))
               for nd in cluster.node_kinds if nd.num_gpus > 1), default=math.inf)
    return out if out > 0 else math.inf


@functools.lru_cache(maxsize=4096)
def node_group_ring_gb_per_s(nd, g: int) -> float:
    """best_group_ring_gb_per_s for one node (a model.cluster.NodeSpec, hashed by identity;
    cached: every shape's bound asks, and a matrix node tries every g of its GPUs)."""
    m = nd.intra_matrix_gb_per_s
    if g <= 1:
        return math.inf
    if m is None:
        return nd.intra_gb_per_s
    if nd.num_gpus <= EXHAUSTIVE_MAX_GPUS:
        return max(nd.ring_gb_per_s(c) for c in itertools.combinations(range(nd.num_gpus), g))
    return float(np.asarray(m)[~np.eye(nd.num_gpus, dtype=bool)].max())


def best_dp_ring_gb_per_s(cluster: ClusterSpec, shape: Shape, group: int | None = None
                          ) -> float:
    """The fastest ring a group of `group` data-parallel ranks (default: all of them) could
    get in any block layout (an upper bound on every placement's): inside one node its
    intra-node ring, across nodes at most k x the fastest inter-node stream with k of its
    members per node; a group that spans every node (one node-stage, the whole data-parallel
    group) at most k x the bottleneck of the streams that connect all nodes
    (ClusterSpec.all_node_ring_max_gb_per_s)."""
    g = shape.cols if group is None else group
    blocks = blocks_for(cluster, shape)
    top = _top_inter(cluster, 0.0)
    if not blocks:  # no block layout: the loosest ring
        return max(best_group_ring_gb_per_s(cluster, g),
                   max(nd.num_gpus for nd in cluster.node_kinds) * top)
    out = 0.0
    for blk in blocks:
        if g <= blk.k:  # the group can sit in one node
            out = max(out, best_group_ring_gb_per_s(cluster, g))
            continue
        intra = best_group_ring_gb_per_s(cluster, blk.k)
        top_b = (min(top, cluster.all_node_ring_max_gb_per_s)
                  if blk.D == cluster.num_nodes and g == shape.cols else top)
        out = max(out, intra if blk.D == 1 else min(intra, blk.k * top_b))
    return out


def best_cp_ring_gb_per_s(cluster: ClusterSpec, shape: Shape) -> float:
    """An upper bound on every placement's context-parallel ring (inf without CP): its
    slowest hop is at most the fastest GPU-to-GPU link of a node if the group (cp x tp GPUs)
    fits in one, else one of its hops leaves a node: at most the fastest inter-node stream."""
    if shape.cp <= 1:
        return math.inf
    intra = cluster.max_intra_link_gb_per_s
    if shape.cp * shape.tp <= max(nd.num_gpus for nd in cluster.node_kinds):
        return max(intra, _top_inter(cluster, 0.0))
    return _top_inter(cluster, math.inf)


def fastest_ep_alltoall_ms(costs: CostModel, cluster: ClusterSpec, shape: Shape) -> float:
    """A lower bound on one all-to-all of every placement's EP groups (0 without EP).

    A group has ep members, at most q = min(ep, GPUs per node / expert TP) on one node,
    so every member has at least ep - q peers on other nodes, whose chunks leave one after
    another through its network stream (communication.alltoall_ms): at least (ep - q) chunks
    at the fastest inter-node stream. A group that fits in a node sends its ep - 1 chunks
    over NVLink at best at the fastest GPU-to-GPU link, or has a peer off the node."""
    ep = shape.ep
    if ep <= 1:
        return 0.0
    top = _top_inter(cluster, 0.0)
    link = cluster.max_intra_link_gb_per_s
    q = min(ep, max(nd.num_gpus for nd in cluster.node_kinds) // shape.expert_tp)
    if costs.job.moe_dispatcher != "alltoall":
        return _fastest_flex_ms(costs, cluster, shape, q, top, link)
    chunk = costs.ep_alltoall_bytes() / ep
    lat = min(cluster.latency_us, cluster.intra_latency_us) * (ep - 1) / 1e3
    net = (ep - q) * chunk / (top * 1e6) if top > 0 else math.inf
    if q < ep:
        return net + lat
    nv = (ep - 1) * chunk / (link * 1e6) if link > 0 else math.inf
    one_off = chunk / (top * 1e6) if top > 0 else math.inf
    return min(nv, one_off) + lat


def _fastest_flex_ms(costs: CostModel, cluster: ClusterSpec, shape: Shape, q: int,
                     top: float, link: float) -> float:
    """`fastest_ep_alltoall_ms` for the flex dispatcher (communication.
    hierarchical_dispatch_ms). A member of a group that cannot fit in a node has at least
    ep - q members on other nodes; what it sends there, T x sum over those nodes of
    share(g_n e), is least with them packed q to a node (share_reached is concave and 0 at 0),
    at the fastest stream, plus one network latency per other node (at least ceil(ep / q) - 1
    of them). A group that fits in a node sends each other member T share(e) over NVLink at
    best at the fastest link, or has a member off the node (at least T share(e) over the
    network and one latency)."""
    from model.communication import share_reached
    m, ep = costs.model, shape.ep
    e = m.num_experts // ep
    tok_b = costs.dispatch_tokens * costs.flex_token_bytes()

    def share(members: int) -> float:
        return share_reached(members * e, m.num_experts, m.moe_topk)

    if q < ep:
        rest = ep - q
        net = tok_b * ((rest // q) * share(q) + share(rest % q)) / (top * 1e6) \
            if top > 0 else math.inf
        return net + (-(-ep // q) - 1) * cluster.latency_us / 1e3
    nv = (tok_b * share(1) * (ep - 1) / (link * 1e6) if link > 0 else math.inf) \
        + (ep - 1) * cluster.intra_latency_us / 1e3
    one_off = (tok_b * share(1) / (top * 1e6) if top > 0 else math.inf) \
        + cluster.latency_us / 1e3
    return min(nv, one_off)


def _memory_caps(model, job, cluster, shape, options, costs) -> list[int]:
    """Most layers each stage can hold within the largest GPU memory, from the events of
    `space.stage_memory_events`: at each event a stage's bytes are its constant plus, per
    chunk, layers x bytes per layer; charging every layer of the stage at its cheapest chunk's
    rate can only lower them (exact with one chunk per stage), so a stage holds at most
    min over events of (budget - constant) / cheapest rate layers."""
    ovh = plan_overheads(model, job, shape, options, cluster)
    # the largest GPU's memory: a valid relaxation where sizes differ (a stage may sit there)
    cap = max(nd.gpu.memory_gib for nd in cluster.nodes)
    budget = (cap - ovh.context_gib) / (1 + ovh.fragmentation) * GIB
    return [min(model.num_layers, int(np.floor(np.min((budget - const) / per.min(axis=1))
                                               + 1e-9)))
            for const, per in stage_memory_events(model, job, cluster, shape, options, costs)]


def layer_room(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, shape: Shape,
               options: Options) -> float:
    """The share of the model's layers the stages could hold together by _memory_caps (at
    least 1 where some split may fit): how close a shape that cannot fit comes."""
    caps = _memory_caps(model, job, cluster, shape, options,
                        CostModel(model, job, cluster, shape, options))
    return sum(max(0, c) for c in caps) / model.num_layers


def shape_bound_ms(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, shape: Shape,
                   options: Options) -> float:
    """Lower bound on the iteration time of every placement and split of `shape` that the
    solvers consider (module docstring); inf if no split fits in memory."""
    work.charge("shape_bound")
    costs = CostModel(model, job, cluster, shape, options)
    # memory first: most shapes of a large space fail it, and it is cheaper than the times
    caps = _memory_caps(model, job, cluster, shape, options, costs)
    if any(x < shape.chunks for x in caps) or sum(caps) < model.num_layers:
        return math.inf
    shard_ring = (best_dp_ring_gb_per_s(cluster, shape, shape.shard_group)
                  if shape.zero >= 3 else math.inf)
    fastest = _fastest_layer_times(costs, cluster, shape.tp, shard_ring,
                                   best_cp_ring_gb_per_s(cluster, shape),
                                   fastest_ep_alltoall_ms(costs, cluster, shape))
    if fastest is None:
        return math.inf
    gpu, lt = fastest
    m = num_microbatches(job, shape)
    p, v, L = shape.pp, shape.chunks, model.num_layers
    c = lt.fwd_ms + lt.bwd_ms
    # a mixture of experts' leading dense layers sit in virtual stage 0 (model.plan), whose
    # time the estimator corrects by kd x (dense layer - MoE layer) (CostModel.
    # virtual_stage_ms): at least kd x (the fastest dense layer - c) on any GPU. (Left out,
    # the bound priced them as MoE layers: 2.8-15% above the optimum where dense layers are
    # the cheaper.)
    kd = model.first_dense_layers
    dense_delta = 0.0
    if kd:
        dense = _fastest_layer_times(costs.dense_costs(), cluster, shape.tp, shard_ring,
                                     best_cp_ring_gb_per_s(cluster, shape))
        dense_delta = kd * (dense[1].fwd_ms + dense[1].bwd_ms - c)
    # every chunk's ZeRO-3 fill (its first gather, last reduce-scatter) is a per-chunk extra
    fill = lt.shard_fill_fwd_ms + lt.shard_fill_bwd_ms
    e_first, e_last = lt.emb_fwd_ms + lt.emb_bwd_ms, lt.head_fwd_ms + lt.head_bwd_ms
    hop = 0.0
    if p > 1:
        hop = costs.min_hop_ms()

    # the smallest tail of stage 0 with n layers (linear in n: params, bytes)
    zero = (0,) * shape.num_virtual
    e0_params = costs.stage_params(0, zero)
    per_layer = costs.layer_params
    lin_layer = costs.layer_linear_params
    exp_layer = costs.layer_expert_params if costs.experts_split else 0.0
    ring = best_dp_ring_gb_per_s(cluster, shape) if shape.cols > 1 else math.inf
    # the experts' sync ring (EP > 1): no faster than any node's fastest ring or all of a
    # node's streams across nodes
    top = _top_inter(cluster, 0.0)
    most = max(nd.num_gpus for nd in cluster.node_kinds)
    ring_e = max([best_group_ring_gb_per_s(cluster, g) for g in range(2, most + 1)]
                 + [most * top])

    def sync(params: float, bw: float = ring, group: int | None = None, linear: float = 0.0
             ) -> tuple[float, float]:  # the cheaper latency of the two
        a = costs.sync_parts_ms(params, bw, False, group, linear)
        b = costs.sync_parts_ms(params, bw, True, group, linear)
        return min(a[0], b[0]), min(a[1], b[1])

    # stage 0's leading dense layers (kd): no experts
    lin0 = costs.stage_linear_params(0, zero)

    # torchtitan's FSDP2 under PP: the step's reduce-scatters and each chunk's first gather
    # (costs.CostModel.unsharded_step_coefs, less the gathers the prefetch may hide) on the
    # fastest shard ring; stage 0 holds the embedding
    us_layer = us_const = 0.0
    if shape.zero >= 3 and keeps_unsharded(job, shape):
        ag, rs, e_ag, e_rs = costs.shard_unit_collectives(shard_ring)
        us_layer, us_const = rs, v * ag + e_ag + e_rs

    # tied embeddings: stage 0's tail also all-reduces the embedding's gradient with the
    # last stage (Evaluator.tied_ms), at best over the fastest link of the cluster
    tied = 0.0
    if costs.tied_grad_bytes:
        # a pair inside a node runs at most at the best 2-GPU ring, across nodes at most at
        # the fastest stream
        pair = best_group_ring_gb_per_s(cluster, 2)
        tied = min(costs.tied_allreduce_ms(pair, True) if math.isfinite(pair) else math.inf,
                   costs.tied_allreduce_ms(_top_inter(cluster, 0.0), False)
                   if cluster.num_nodes > 1 else math.inf)

    def tail0(n: int) -> float:
        params = e0_params + per_layer * n
        experts = exp_layer * max(0, n - kd)
        t = costs.optimizer_ms(params, gpu, lin_layer * n + lin0, experts) + \
            options.overheads.latency_overhead_ms + us_layer * n + us_const + tied
        if shape.cols > 1:
            dense = params - experts
            lin = (lin_layer * n + lin0) if costs.fp8_gather_saving else 0.0
            red, gat = sync(dense, linear=lin)
            bucket = costs.sync_bucket(costs.sync_group())
            last_red, last_gat = sync(min(dense, bucket), linear=lin if dense <= bucket else 0.0)
            t += (last_red if costs.sync_overlapped else red) + (
                last_gat if shape.overlap_param_gather else gat)
            if experts:  # all of the experts' sync, or with an overlap its last bucket
                group = costs.expert_sync_group()
                ovl = costs.sync_overlapped or shape.overlap_param_gather
                e_red, e_gat = sync(min(experts, costs.sync_bucket(group)) if ovl else
                                    experts, ring_e, group)
                t += e_red + e_gat
        return t

    extra = [v * fill] * p  # per micro-batch, on top of the layers
    extra[0] += e_first + dense_delta
    extra[p - 1] += e_last
    first0 = (kd - 1) * c + dense_delta if kd else 0.0  # chunk 0 of stage 0, beyond one layer
    before = [0.0] * (p + 1)  # extras of stages 0..k-1 (v == 1: all of them pass first)
    for k in range(p):
        before[k + 1] = before[k] + extra[k]
    t_min = tail0(v)
    # stage 0's own inequality for n = 0..cap layers (increasing in n): the most layers it
    # takes at T is a bisection in this table
    # (filled lazily: a bisection touches a few entries of it, a table costs caps[0] tails)
    stage0: dict[int, float] = {}

    def stage0_at(n_: int) -> float:
        if n_ not in stage0:
            stage0[n_] = m * (n_ * c + extra[0]) + tail0(n_)
        return stage0[n_]

    def most_at_stage0(T: float) -> int:
        """The largest n <= caps[0] with stage0_at(n) <= T, or -1 (bisect_right - 1 on the
        table)."""
        lo_, hi_ = -1, caps[0]  # stage0_at(lo_) <= T (or lo_ = -1); the answer is <= hi_
        while lo_ < hi_:
            mid = (lo_ + hi_ + 1) // 2
            if stage0_at(mid) <= T:
                lo_ = mid
            else:
                hi_ = mid - 1
        return lo_

    def feasible(T: float) -> bool:
        """Is there an integer split, each stage at least v layers and within its memory,
        meeting every stage's inequality at T? The layers placed before stage k (`used`) can
        be any integer in an interval [lo, hi]: stage k accepts n layers with
        v <= n <= a_k(used), a_k falling as used grows (an earlier layer delays stage k by
        its own time), so after stage k the interval is [lo + v, u + a_k(u)] for the largest
        u in [lo, hi] that leaves stage k its minimum (u + a_k(u) grows with u)."""
        lo = hi = 0
        for k in range(p):
            if k == 0:
                a0 = most_at_stage0(T)
                if a0 < v:
                    return False
                lo, hi = v, a0
                continue
            if v == 1:  # the stages before k all pass micro-batch 0 first: `used` layers
                rhs = T - before[k] - 2 * k * hop - t_min - m * extra[k]

                def a_k(u: int) -> int:
                    return min(caps[k], int(math.floor((rhs - u * c) / (m * c) + 1e-12)))
                if a_k(lo) < 1:
                    return False
                u = min(hi, int(math.floor((rhs - m * c) / c + 1e-12)))
                while u > lo and a_k(u) < 1:  # float edge
                    u -= 1
                lo, hi = lo + 1, u + a_k(u)
            else:  # interleaved: at least one layer of chunk 0 per stage before k, and
                # stage 0's chunk 0 its kd dense layers (kd x the fastest dense layer)
                rhs = (T - (k * (c + fill) + e_first + first0) - 2 * k * hop - t_min
                       - m * extra[k])
                a = min(caps[k], int(math.floor(rhs / (m * c) + 1e-12)))
                if a < v:
                    return False
                lo, hi = lo + v, hi + a
        return lo <= L <= hi

    # the continuous form (no transfers, no tail) is also valid, and can be the larger for
    # interleaved schedules; the bisection starts from it
    W = L * c + sum(extra)
    smooth = m * W / p if (v > 1 or p == 1) else W / (1 - (1 - 1 / m) ** p)
    if feasible(smooth):
        return smooth
    lo, hi = smooth, max(smooth * 1.25, 1e-9)
    while not feasible(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1e-7 * hi:
        mid = (lo + hi) / 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    # lo is infeasible: every T at or below it fails, so it is a valid lower bound
    return lo

