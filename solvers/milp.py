"""Exact placement and layer split for one shape: a MILP on HiGHS (through Pyomo), with the
schedule's critical paths added as cuts until the MILP agrees with the estimator.

Formulation (one shape, one block layout of A node-stages x D node-replicas; see space.py):

Sets      N nodes; slots (a, b), a < A, b < D; virtual stages j < V; stages s < p.
Variables x[n,a,b] in {0,1}: node n hosts slot (a, b).
          l[j] integer >= 1: layers of virtual stage j; beta[j,k] its binary digits.
          w[n,m,e,b] >= 0: x[n,a,b] * x[m,a',b] for each node-stage edge e = (a, a') that a
          pipeline hop crosses; y[n,m,a,b] >= 0: x[n,a,b] * x[m,a,b+1 mod D] (data-parallel ring).
          u[a] >= 0: 1 / bandwidth of node-stage a's data-parallel ring; z[j,k] = beta[j,k] u[a].
          tail[s], T >= 0.
Objective min T (ms).
Constraints
  assign:     sum_{a,b} x[n,a,b] = 1;  sum_n x[n,a,b] = 1.
  product:    sum_m w[n,m,e,b] = x[n,a,b];  sum_n w[n,m,e,b] = x[m,a',b]   (tight form; with
              integral x it forces w to the product). Same for y.
  ring:       u[a] >= sum_{n,m} y[n,m,a,b] / (k * bw[n,m]) for every b (the slowest link);
              u[a] >= 1 / intra ring bandwidth when a node holds several replicas.
  split:      sum_j l[j] = L;  l[j] = 1 + sum_k 2^k beta[j,k];  z[j,k] >= u[a] - U (1 - beta).
  memory:     for every moment of the schedule that can be a stage's peak (schedule.
              inflight_profile), bytes of weights + grads + optimizer + stored activations
              (+ recompute working memory) <= (GPU GiB - context) / (1 + fragmentation).
  tail:       tail[s] >= exposed reduction + exposed all-gather + optimizer_s, the reduction
              sig_r params_s u[a] + lam_r (all-gather likewise), linear through z; with an
              overlap, exposed = max(last bucket, all - window): one row per combination. The
              last bucket min(bucket, params_s) u[a] is linear through the loads' binaries
              (gu[s,c] >= u[a] - U (1 - g[s,c])) where the stage's size decides it.
  connect:    sum_{e,b} sum_{n,m in different parts} w[n,m,e,b] >= crossings, for a few
              partitions of the nodes by link speed (_Data.crossing_levels): valid for every
              placement, they stop the LP from running every hop inside a fast part.
  window:     a windowed model with a full layer every N: q[j] integer, N q[j] <= sum_{i<=j}
              l[i] <= N q[j] + N - 1; virtual stage j holds q[j] - q[j-1] full layers, each
              (dF, dB) more than a windowed one in F_j and B_j.
  tied:       with tied embeddings split over the pipeline, tied[b] = sum_{n,m} C_t[n,m]
              w[n,m,e_t,b], replica b's all-reduce between its first and last stage over
              their node-stages' edge e_t (a constant inside a node), in both stages' tails.
  paths:      T >= counts_pi . durations_b for every generated critical path pi and every b,
              durations linear in l, w and tail (model.schedule: a path's length is linear in the
              durations of the operation kinds it visits). Each hop's transfer time is a
              variable equal to its sum_{n,m} C[n,m] w[n,m,e,b], so a path's row names one
              variable per hop (sparse rows, fast LPs).
Symmetry: rotating node-replica labels maps solutions to solutions of equal cost, so the
smallest-index host of node-stage 0 is fixed to b = 0.

Critical paths: solve, rebuild the plan, score it with the estimator; if the estimator's time
exceeds the MILP objective, add the critical path of every replica as a cut, with the paths of
every one-swap neighbour and of variants where the hops the path repeats (a steady state's) are
slow one way and fast the other, and solve again. The MILP with a subset of paths is a
relaxation, so its bound is valid throughout, and at the end the objective equals the
estimator's time of the returned plan. The paths of the best seed's one-swap neighbours go in
before the first solve (up to SEED_SWAP_SLOTS slots).

Decomposition by stage loads (layers per pipeline stage). With layer counts free, the LP
spreads layers fractionally and sees no pigeonhole (32 layers on 12 stages put 3 on some
stage), so its bound sits far below (19% on 16 nodes). Instead:
  master   the placement-relaxed model (every inter-node hop at the cheapest link, the ring at
           its best rate) with a binary g[s,c] per stage s and load c: its optimum is a lower
           bound for every load vector it has not excluded;
  sub      the full model with the master's load vector fixed: its relaxation is tight, and
           16 nodes solve in seconds.
Loop: the master gives the most promising load vector; the sub solves it exactly (T <= the
best plan's time, so a vector that cannot win is proven so quickly); a no-good cuts that vector
from the master; stop when the master's bound reaches the best plan. Where the master's bound is
far below the best plan (more than LOAD_GAP: placement moves the time a lot, as on small slow
clusters) or MAX_LOAD_VECTORS have been solved, one full model with free loads takes all the
vectors left (T >= the master's bound). The final bound is the smallest over the vectors solved
and the master's bound for the rest.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from networkx.utils import UnionFind

from model import work
from model.costs import adam_bytes_per_param, hsdp_overlapped
from model.errors import SolverUnavailableError
from model.memory import GIB, keeps_unsharded, plan_overheads
from model.plan import Plan, expert_dp_groups, full_attention_layers

from .linear import Lin, LinearModel, Row, SolveResult, lsum
from .problem import PlacementProblem
from .result import PlacementResult

# The decomposition by stage loads (module docstring). bench/exact_scaling.py: one load vector
# settles 16 nodes; on 12 nodes (32 layers, uneven) five vectors come within 0.5% on the
# cheapest links, and past four one MILP over the rest is faster; on the small slow clusters of
# the tests the relaxed bound is 50% off and one MILP for all loads is fastest.
MAX_LOAD_VECTORS = 4
LOAD_GAP = 0.10
# Extra critical paths per violated plan: its repeated hops flipped slow/fast (first each hop
# alone, both ways, then random combinations). Cut the 12-node rounds from 8 to 4-5.
PATH_VARIANTS = 16
# The connectivity rows (_Data.crossing_levels) only where the round-trip hop time jumps by
# more than 2% between merges: 2-8 dense rows on bench/exact_scaling.py's instances. On its
# 32-node switch cluster, a row at every merge (30, through pair variables) gave the same LP
# bound (701.38 ms) as 2 rows, but the MILP's root LP took 20 s instead of 3 s.
LEVEL_JUMP = 0.02
# The best seed's one-swap neighbours' paths go in before the first solve up to this many
# slots (16: 120 plans, about 0.4 s; 32 slots would take 2 s)
SEED_SWAP_SLOTS = 16


def _sync_ring(ev, pl) -> float:
    """The slowest end-of-iteration synchronization ring of stage 0 (HSDP's replica groups)."""
    from model.communication import dp_ring
    sh = ev.shape
    g = sh.shard_group
    out = math.inf
    for i in range(sh.tp):
        for first in range(g):
            members = [(pl.node[0][r], pl.gpus[0][r][i]) for r in range(first, sh.cols, g)]
            out = min(out, dp_ring(ev.cluster, members)[0])
    return out


def lat_us_for(cl, ev, pl) -> float:
    """Latency of the HSDP replica ring: inter-node when its members sit on several nodes."""
    sh = ev.shape
    nodes = {pl.node[0][r] for r in range(0, sh.cols, sh.shard_group)}
    return cl.latency_us if len(nodes) > 1 else cl.intra_latency_us


INTRA_RATES_DIFFER = ("nodes differ in their intra-node link rate (the annealer searches the "
                      "placement; the bound is the MILP's with every node at the fastest rate)")


def intra_relaxed(prob: PlacementProblem) -> PlacementProblem | None:
    """The same block on the cluster with every node's intra-node link at the fastest node's
    rate, where that difference is all that keeps the MILP out (else None): every time the
    cost model adds falls or stays as a link speeds up, and the critical path is monotone in
    them, so this problem's optimum (and MILP bound) bounds the block's, and its plan is a
    placement and split to time on the real cluster."""
    c = prob.cluster
    if milp_supported(prob) != INTRA_RATES_DIFFER:
        return None
    fast = max(nd.intra_gb_per_s for nd in c.nodes)
    nodes = tuple(dataclasses.replace(nd, intra_gb_per_s=fast) for nd in c.nodes)
    rc = dataclasses.replace(c, nodes=nodes)
    out = PlacementProblem(prob.model, prob.job, rc, prob.shape, prob.block, prob.options)
    return out if milp_supported(out) is None else None


def milp_supported(prob: PlacementProblem) -> str | None:
    """None if the MILP applies, else why not (the caller falls back to annealing)."""
    c = prob.cluster
    if not c.homogeneous:
        return "mixed GPU types or GPU counts (the annealer handles them)"
    if c.gpu_specific_links:
        return "non-uniform intra-node links (the annealer handles them)"
    if len({nd.intra_gb_per_s for nd in c.nodes}) > 1:
        # the MILP prices every node's tensor-parallel rings and intra-node hops and rings
        # with one node's rate (`_Data`): with a node slower (a degraded NVLink) its optimum
        # and bound were another cluster's, claimed optimal 2-35% above the optimum
        return INTRA_RATES_DIFFER
    if prob.shape.zero >= 3 and not c.uniform():
        return ("ZeRO-3 / FSDP gathers every layer over its shard group, whose ring depends on "
                "the placement (the annealer searches it; the bound is the closed form)")
    if prob.shape.ep > 1 or prob.shape.expert_tp != prob.shape.tp:
        why = _ep_unsupported(prob)
        if why:
            return why
    if prob.shape.cp > 1 and not c.uniform():
        return ("context parallelism exchanges K and V every layer over its CP ring, whose "
                "links depend on the placement (the annealer searches it; the bound is the "
                "closed form)")
    return None


def _ep_inside_node(prob: PlacementProblem) -> bool:
    """Whether every EP group lies in one node-replica of the block layout (ep x expert TP
    consecutive ranks of a stage within the k x tp a node holds), so that its all-to-all runs
    over NVLink whatever the placement."""
    sh = prob.shape
    return (prob.block.k * sh.tp) % (sh.ep * sh.expert_tp) == 0


def _ep_unsupported(prob: PlacementProblem) -> str | None:
    """Expert parallelism runs in the MILP where its all-to-all does not depend on the
    placement: on a uniform cluster (every EP group then costs the same), or where every EP
    group stays inside a node. The experts' gradient rings are then the data-parallel ring's
    node order with fewer members per node (`_Data._expert_sync`). Elsewhere the annealer
    searches which nodes share an EP group."""
    sh = prob.shape
    if sh.overlap_grad_reduce or sh.overlap_param_gather or hsdp_overlapped(prob.job, sh):
        return ("expert parallelism with the bucket overlaps (the expert gradients' buckets "
                "share the backward window; the annealer handles it)")
    if not prob.cluster.uniform() and not _ep_inside_node(prob):
        return ("expert parallelism's all-to-all runs over the links each EP group's nodes "
                "share, which depend on the placement (the annealer searches them; the bound "
                "is the closed form)")
    return None


class _Data:
    """The numbers every formulation of one problem shares (all times in ms)."""

    def __init__(self, prob: PlacementProblem):
        work.charge("model_data")
        sh, blk, cl = prob.shape, prob.block, prob.cluster
        self.prob = prob
        self.p, self.v, self.V, self.L = sh.pp, sh.chunks, sh.num_virtual, prob.model.num_layers
        self.A, self.D, self.j_per, self.k = blk.A, blk.D, blk.j, blk.k
        self.N = N = cl.num_nodes
        self.start_layers = prob.start_layers()
        self.ev0 = ev0 = prob.evaluator(self.start_layers)
        self.K = ev0.kinds
        costs, self.mem = ev0.costs, ev0.mem
        node0 = cl.nodes[0]
        gpu = node0.gpu
        ring_tp = node0.ring_gb_per_s(tuple(range(sh.tp)))
        # ZeRO-3 (MILP only on uniform clusters, where every placement's rings are the node
        # order's): the per-layer gathers' ring, and the end-of-iteration ring of HSDP
        # (and the context-parallel ring, the same for every group there)
        self.shard_ring = self.cp_ring = math.inf
        ident = None
        self.a2a = 0.0
        split_experts = costs.experts_split
        if sh.zero >= 3 or sh.cp > 1 or split_experts:
            ident = prob.placement(list(range(blk.A * blk.D)))
            self.shard_ring = ev0.shard_ring(ident, 0)
            self.cp_ring = ev0.cp_ring(ident, 0, 0)
            # expert parallelism (MILP on uniform clusters, or EP groups inside a node):
            # every EP group's all-to-all costs the same as in the node order
            if split_experts:
                self.a2a = max(ev0.ep_alltoall(ident, s, r) for s in range(sh.pp)
                               for r in range(sh.cols))
        lt = costs.layer_times(gpu, ring_tp, self.shard_ring, self.cp_ring, self.a2a)
        ovh = plan_overheads(prob.model, prob.job, sh, prob.options, prob.cluster)
        self.cap_gib = (gpu.memory_gib - ovh.context_gib) / (1 + ovh.fragmentation)
        V, p = self.V, self.p
        # per virtual stage: F_j = fF l_j + eF_j, B_j = fB l_j + eB_j (costs.py)
        self.fF, self.fB = [lt.fwd_ms] * V, [lt.bwd_ms] * V
        # a windowed model's full-attention layers: each adds (dF, dB) to its virtual stage
        # (costs.CostModel.virtual_stage_ms); which stage holds them follows the split:
        # q[j] = floor(layers of virtual stages 0..j / N), full layers of j = q[j] - q[j-1]
        # (plan.full_attention_layers)
        self.dF, self.dB = costs.full_layer_delta(gpu, ring_tp, self.shard_ring, self.cp_ring,
                                                  self.a2a)
        self.full_every = prob.model.window_full_every if (self.dF or self.dB) else 0
        self.eF = [costs.virtual_stage_ms(gpu, ring_tp, j, 0, self.shard_ring, self.cp_ring,
                                          self.a2a)[0] for j in range(V)]
        self.eB = [costs.virtual_stage_ms(gpu, ring_tp, j, 0, self.shard_ring, self.cp_ring,
                                          self.a2a)[1] for j in range(V)]
        self.hop_C = costs.hop_matrix_ms()
        self.intra_hop = costs.node_hop_ms(0, 0)
        self.n_hops = p if self.v > 1 else p - 1
        self.hop_edge = {}  # physical hop h -> node-stage edge (a, a2), None inside a node
        for h in range(self.n_hops):
            a, a2 = self.nstage(h), self.nstage((h + 1) % p)
            self.hop_edge[h] = None if a == a2 else (a, a2)
        # tied embeddings split over the pipeline: stage 0 and stage p - 1 all-reduce the
        # embedding's gradient in both tails (Evaluator.tied_ms), over the link between their
        # node-stages (an edge of its own where no hop crosses it), or inside a node
        self.tied = bool(costs.tied_grad_bytes)
        a0, a_last = self.nstage(0), self.nstage(p - 1)
        self.tied_edge = (a_last, a0) if self.tied and a0 != a_last else None
        self.tied_C = costs.tied_matrix_ms() if self.tied_edge else None
        self.tied_intra = (costs.tied_allreduce_ms(node0.intra_gb_per_s, True)
                           if self.tied and a0 == a_last else 0.0)
        # with the placement relaxed: inside a node as it is, across nodes the cheapest pair
        self.tied_relaxed = (float(self.tied_C[~np.eye(N, dtype=bool)].min())
                             if self.tied_edge and N > 1 else self.tied_intra)
        self.edges = sorted({e for e in self.hop_edge.values() if e is not None}
                            | ({self.tied_edge} if self.tied_edge else set()))
        zero = tuple([0] * V)
        self.P_gpu = costs.layer_params  # a layer's parameters on one GPU
        self.P_lin = costs.layer_linear_params
        # with EP > 1 the routed experts synchronize over their own group (exp_sig, exp_lam)
        # and their optimizer state is sharded ep times finer (costs.optimizer_shard)
        self.P_exp = costs.layer_expert_params if split_experts else 0.0
        self.P_sync = self.P_gpu - self.P_exp
        self.P_opt = self.P_gpu + (self.P_exp * (costs.expert_shard_factor - 1) if sh.zero
                                   else 0.0)
        self.E_s = [costs.stage_params(s, zero) for s in range(p)]
        # static memory: bytes outside the layers, and per layer (memory.MemoryModel)
        self.const_bytes = [self.mem.const_static_bytes(e, s) for s, e in enumerate(self.E_s)]
        # stage 0's leading dense layers (first_dense_layers, all in virtual stage 0): no
        # expert parameters, so constants shift the sync, optimizer and FP8 terms
        self.first_dense = kd = prob.model.first_dense_layers
        self.exp_off = [kd if s == 0 else 0 for s in range(p)]
        self.E_sync = [e + o * self.P_exp for e, o in zip(self.E_s, self.exp_off)]
        self.E_opt = [e - (o * self.P_exp * (costs.expert_shard_factor - 1) if sh.zero else 0.0)
                      for e, o in zip(self.E_s, self.exp_off)]
        self.lin_const = [costs.stage_linear_params(s, zero) for s in range(p)]
        self.d = d = sh.cols  # the synchronization spans data x context parallel ranks
        self.nr = 1  # gradient reductions per iteration (ZeRO-2: one per micro-batch)
        grad_b, weight_b = prob.job.reduce_bytes, prob.job.weight_bytes
        # data-parallel synchronization, linear in params x (1 / ring bandwidth) = params x u:
        # reduction sig_r params u + lam_r, all-gather sig_g params u + lam_g (costs.py)
        f = (d - 1) / d / 1e6 if d > 1 else 0.0
        self.inter_ring = self.D > 1
        lat_us = cl.latency_us if self.inter_ring else cl.intra_latency_us
        lat = (d - 1) * lat_us / 1e3 if d > 1 else 0.0
        if sh.zero >= 3:
            # per-layer gathers live in F and B; HSDP all-reduces each shard across the
            # replicas at the end, over a ring fixed on a uniform cluster (u is set below)
            r = costs.sync_group()
            if sh.shard_size and r > 1:
                self.sig_r = 2 * grad_b / sh.shard_group * (r - 1) / r / 1e6
                self.lam_r = 2 * (r - 1) * lat_us_for(cl, ev0, ident) / 1e3
            else:
                self.sig_r, self.lam_r = 0.0, 0.0
            self.sig_g, self.lam_g = 0.0, 0.0
        elif sh.distributed_optimizer:
            # ZeRO-2 reduce-scatters every micro-batch (costs.CostModel.grad_reductions)
            nr = costs.grad_reductions
            self.sig_r, self.lam_r = nr * grad_b * f, nr * lat
            self.nr = nr  # and as many backward windows to hide them in (costs.py)
            self.sig_g, self.lam_g = weight_b * f, lat
        else:
            self.sig_r, self.lam_r = 2 * grad_b * f, 2 * lat
            self.sig_g, self.lam_g = 0.0, 0.0
        # FP8 weights gather each linear weight in 1 byte (costs.sync_bytes): the gather's
        # parameters less this share of the stage's linear weights
        self.kappa = costs.fp8_gather_saving / weight_b
        self.ogr, self.opg = costs.sync_overlapped, sh.overlap_param_gather
        self.bucket = costs.sync_bucket(d)
        # the last bucket's size min(bucket, params): a constant unless the stage's layer count
        # decides which (then it needs the loads' binaries)
        self.bucket_case = []
        for s_ in range(p):
            lo, hi = self.E_sync[s_] + self.P_sync * self.v, self.E_sync[s_] + self.P_sync * (
                self.L - V + self.v)
            self.bucket_case.append("bucket" if lo >= self.bucket else
                                    "params" if hi <= self.bucket else "mixed")
        self.needs_loads = (self.ogr or self.opg) and d > 1 and "mixed" in self.bucket_case
        self.opt_coef = adam_bytes_per_param(prob.job) / (
            (sh.shard_group if sh.zero else 1) * gpu.hbm_bytes_per_ms)
        self.fp8_coef = costs.fp8_recast_bytes(gpu) / gpu.hbm_bytes_per_ms
        self.ovh = prob.options.overheads.latency_overhead_ms
        # torchtitan's FSDP2 under PP: the step's gathers and reduce-scatters, once a step in
        # the tail, linear in the stage's layers (costs.CostModel.unsharded_step_coefs; the
        # shard ring is the cluster's on the uniform clusters the MILP takes ZeRO-3 on)
        self.us_layer, self.us_const = 0.0, [0.0] * p
        if sh.zero >= 3 and keeps_unsharded(prob.job, sh):
            per_layer, per_chunk, per_edge = costs.unsharded_step_coefs(
                gpu, ring_tp, self.shard_ring, self.cp_ring, self.a2a)
            self.us_layer = per_layer
            self.us_const = [per_chunk * self.v + per_edge * costs.stage_edges(s_)
                             for s_ in range(p)]
        k = self.k
        self.inv_intra = 1.0 / node0.ring_gb_per_s(tuple(range(k))) if k > 1 else 0.0
        bw = cl.inter_gb_per_s
        with np.errstate(divide="ignore"):
            self.inv_ring = np.where(np.eye(N, dtype=bool), 0.0, 1.0 / (k * bw))
        off = ~np.eye(N, dtype=bool)
        # placement relaxed: every inter-node hop at the cluster's cheapest, the ring at the
        # best rate this block layout could give
        self.hop_min_inter = float(self.hop_C[off].min()) if N > 1 else math.inf
        self.hop_max_inter = float(self.hop_C[off].max()) if N > 1 else 0.0
        # the ring's slowest link is at best the fastest inter-node stream; with one node-stage
        # (D = N) the ring passes through every node, so at best the bottleneck of the links
        # that connect all nodes strongly (ClusterSpec.all_node_ring_max_gb_per_s: a degraded
        # NIC is on every such ring)
        self.inv_ring_min = float(self.inv_ring[off].min()) if N > 1 else 0.0
        if self.D == N > 1:
            self.inv_ring_min = max(self.inv_ring_min,
                                    1.0 / (k * cl.all_node_ring_max_gb_per_s))
        self.u_min = (max(self.inv_intra, self.inv_ring_min) if self.inter_ring
                      else self.inv_intra)
        self.zero3 = sh.zero >= 3
        if self.zero3:  # uniform: the end-of-iteration ring is the node order's (HSDP)
            self.u_min = 1.0 / _sync_ring(ev0, ident) if sh.shard_size else 0.0
        self._expert_sync(prob, costs, node0, ev0, ident, split_experts)

    @cached_property
    def crossing_levels(self) -> list[tuple[np.ndarray, int]]:
        """Partitions of the nodes that every replica's pipeline must cross, with how often:
        the connectivity rows of _Formulation. Replica b's pipeline visits its A nodes along
        the node-stage edges, a connected graph, so it crosses at least (parts it meets) - 1
        times between the parts of any partition; its A slots take at most A nodes of a part
        of c nodes, so the D replicas meet at least sum ceil(c / A) parts in all and cross at
        least sum_parts ceil(c / A) - D times (Dantzig, Fulkerson and Johnson 1954's
        subtour-elimination argument, here as a multicut). Valid for any partition; the
        useful ones are the levels of the round-trip hop time: the parts joined by links
        faster than each distinct value, as Kruskal's algorithm merges them (a switch
        cluster's leaves, for one), where the next link is LEVEL_JUMP slower than the last
        merged. Returns (part label per node, crossings) with at least one crossing.

        Computed on first use, by the full model only: on 1024 nodes it takes 0.5 s, and the
        placement-relaxed bounds build a _Data per call."""
        N, A, D = self.N, self.A, self.D
        if not self.edges:
            return []
        rtt = self.hop_C + self.hop_C.T
        iu, ju = np.triu_indices(N, 1)
        parts = UnionFind(range(N))
        out, last, merges = [], None, 0
        for q in np.argsort(rtt[iu, ju], kind="stable"):
            i, j = int(iu[q]), int(ju[q])
            if merges == N - 1:
                break
            if parts[i] == parts[j]:
                continue
            v = float(rtt[i, j])
            if merges and v > last * (1 + LEVEL_JUMP):  # the links faster than v are merged
                labels = np.array([parts[n] for n in range(N)])
                _, sizes = np.unique(labels, return_counts=True)
                need = int(sum(-(-int(c) // A) for c in sizes)) - D
                if need > 0:
                    out.append((labels, need))
            parts.union(i, j)
            last, merges = v, merges + 1
        return out

    def _expert_sync(self, prob, costs, node0, ev0, ident, split_experts: bool) -> None:
        """The routed experts' gradient sync over their expert-data-parallel rings (EP > 1 or
        expert TP != TP): exp_sig x expert params x u_e + exp_lam, u_e[a] the inverse
        bandwidth of node-stage a's expert ring.

        On a uniform cluster every ring is the node order's: u_e is a constant. Otherwise
        (EP groups inside a node) the ring's members are the data-parallel ring's, k_e =
        k x tp / (ep x etp) per node-replica instead of k columns, in the same node order
        (plan.expert_dp_groups): u_e >= (k / k_e) x the data-parallel ring's link terms and
        u_e >= 1 / the intra-node ring of k_e GPUs (`u_e_const` None: a variable)."""
        sh, cl = prob.shape, prob.cluster
        self.exp_sig = self.exp_lam = 0.0
        self.exp_factor, self.inv_intra_e, self.u_e_const = 1.0, 0.0, 0.0
        if not split_experts:
            return
        de = costs.expert_sync_group()
        if de <= 1:
            return
        grad_b, weight_b = prob.job.reduce_bytes, prob.job.weight_bytes
        fe = (de - 1) / de / 1e6
        # reduce-scatter (ZeRO-2: one per micro-batch) + all-gather (distributed optimizer)
        # or all-reduce, as costs.sync_parts_ms; each pays (de - 1) latencies
        nr = costs.grad_reductions
        self.exp_sig = (nr * grad_b + weight_b) * fe if sh.zero in (1, 2) else 2 * grad_b * fe
        members = [(ident.node[0][c], ident.gpus[0][c][t]) for c, t in expert_dp_groups(sh)[0]]
        bw, inter = ev0.ring(members)
        self.exp_lam = (nr + 1 if sh.zero in (1, 2) else 2) * (de - 1) * (
            cl.latency_us if inter else cl.intra_latency_us) / 1e3
        if cl.uniform() or not self.inter_ring:
            self.u_e_const = 1.0 / bw
            return
        k_e = self.k * sh.tp // (sh.ep * sh.expert_tp)
        self.exp_factor = self.k / k_e
        self.inv_intra_e = 1.0 / node0.ring_gb_per_s(tuple(range(k_e))) if k_e > 1 else 0.0
        self.u_e_min = max(self.inv_intra_e, self.exp_factor * self.inv_ring_min)
        self.u_e_const = None

    def last_bucket(self, s: int, n: int, gather: bool = False) -> float:
        """The last bucket of stage s with n layers, in parameters: min(bucket, params); for
        the all-gather of FP8 weights, where it is the whole stage, what the stage's gather
        moves in 16-bit parameters (costs.CostModel.exposed_sync_ms)."""
        params = self.E_sync[s] + self.P_sync * n
        if params > self.bucket:
            return self.bucket
        if gather and self.kappa:
            return params - self.kappa * (self.lin_const[s] + self.P_lin * n)
        return params

    def stage_of(self, j: int) -> int:
        return j % self.p

    def nstage(self, s: int) -> int:
        return s // self.j_per

    def loads(self, lay) -> tuple[int, ...]:
        """Layers per pipeline stage (the sum over its chunks)."""
        return tuple(int(sum(lay[j] for j in range(self.V) if j % self.p == s))
                     for s in range(self.p))


class _Formulation:
    """One model of one problem (solvers.linear): with placement variables (`relax=False`,
    through Pyomo), or with the placement relaxed (every inter-node hop at the cheapest link,
    the ring at its best rate; straight into HiGHS, as it is solved hundreds of times).

    `loads=True` adds a binary g[s, c] per stage s and layer count c, so that one load vector
    can be fixed (`fix_loads`) or cut off (`exclude_loads`, a no-good)."""

    def __init__(self, dat: _Data, *, relax: bool, integral_layers: bool = True,
                 loads: bool = False, backend: str | None = None):
        self.dat, self.relax = dat, relax
        p, V, L, A, N = dat.p, dat.V, dat.L, dat.A, dat.N
        D = 1 if relax else dat.D  # relaxed: one representative pipeline
        self.D = D
        k = dat.k
        u_const = None
        if relax or dat.zero3:  # ZeRO-3 runs here only on uniform clusters: a fixed ring
            u_const = dat.u_min
        elif not dat.inter_ring:
            u_const = dat.inv_intra
        U = max(dat.inv_ring.max(), dat.inv_intra) if dat.inter_ring else dat.inv_intra
        # the ring's inverse bandwidth is a constant unless node-replicas form an inter-node
        # ring; only then is l[j] * u[a] a product that needs the binary expansion
        nbits = max(1, math.ceil(math.log2(L - V + 2))) if u_const is None else 0

        self.M = M = LinearModel("placement-relaxed" if relax else "placement",
                                 backend or ("highs" if relax else "pyomo"))
        slots = [(a, b) for a in range(A) for b in range(D)]
        self.x = {} if relax else M.vars([(n, a, b) for n in range(N) for a, b in slots],
                                         0, 1, integer=True)
        self.integral = integral = integral_layers or not relax
        self.l = [M.var(dat.first_dense if (j == 0 and dat.first_dense > 1) else 1,
                        L - V + 1, integer=integral) for j in range(V)]
        beta = M.vars([(j, q) for j in range(V) for q in range(nbits)], 0, 1, integer=True)
        self.tail = [M.var() for _ in range(p)]
        self.T = M.var()
        x, l_, tail = self.x, self.l, self.tail

        if not relax:
            for n in range(N):
                M.add(lsum(x[n, a, b] for a, b in slots) == 1)
            for a, b in slots:
                M.add(lsum(x[n, a, b] for n in range(N)) == 1)
        M.add(lsum(l_) == L)
        own = dat.prob.allowed_splits
        if own is not None:  # the framework's own splits (DeepSpeed): one of them, z[k]
            z = M.vars(list(range(len(own))), 0, 1, integer=integral)
            M.add(lsum(z[k] for k in range(len(own))) == 1)
            for j in range(V):
                M.add(l_[j] == lsum(own[k][j] * z[k] for k in range(len(own))))
        for j in range(V):
            if nbits:
                M.add(l_[j] == 1 + lsum(2 ** q * beta[j, q] for q in range(nbits)))

        def stage_layers(s):
            return lsum(l_[j] for j in range(V) if j % p == s)

        # full-attention layers up to each virtual stage (_Data.full_every):
        # N q[j] <= layers of 0..j <= N q[j] + N - 1
        nf = dat.full_every
        self.q = M.vars(list(range(V)) if nf else [], 0, L // nf if nf else 0,
                        integer=integral)
        for j in self.q:
            upto = lsum(l_[i] for i in range(j + 1))
            M.add(nf * self.q[j] <= upto)
            M.add(upto <= nf * self.q[j] + (nf - 1))

        # layers per stage: a variable to fix, or one binary per possible count
        self.counts = range(dat.v, L - V + dat.v + 1) if loads else range(0)
        g = self.g = M.vars([(s, c) for s in range(p) for c in self.counts], 0, 1, integer=True)
        for s in range(p) if loads else ():
            M.add(lsum(g[s, c] for c in self.counts) == 1)
            M.add(lsum(c * g[s, c] for c in self.counts) == stage_layers(s))

        # products for pipeline edges: w[n,m,e,b] = x[n,a,b] x[m,a2,b], tight form
        w = M.vars([] if relax else [
            (n, m, e, b) for e in range(len(dat.edges)) for b in range(D) for n in range(N)
            for m in range(N) if n != m], 0, 1)
        for e, (a, a2) in ([] if relax else enumerate(dat.edges)):
            for b in range(D):
                for n in range(N):
                    M.add(lsum(w[n, m, e, b] for m in range(N) if m != n) == x[n, a, b])
                    M.add(lsum(w[m, n, e, b] for m in range(N) if m != n) == x[n, a2, b])

        # connectivity: every replica's pipeline crosses each level of the links (_Data.
        # crossing_levels) at least that often. Integral placements satisfy these rows anyway;
        # the LP does not: it runs every hop over the fast links inside one part (of the 3
        # crossings between the 4 leaves of bench/exact_scaling.py's 16-node switch cluster,
        # it made 1).
        for labels, need in [] if relax else dat.crossing_levels:
            M.add(lsum(w[n, m, e, b] for e in range(len(dat.edges)) for b in range(D)
                       for n in range(N) for m in range(N) if labels[n] != labels[m]) >= need)

        # one variable per edge, replica and direction for its transfer time: the paths' rows
        # then name one variable per hop instead of every product (sparse rows, fast LPs)
        self.hop = M.vars([] if relax else [(e, b, q) for e in range(len(dat.edges))
                                            for b in range(D) for q in (0, 1)])
        C = dat.hop_C
        for (e, b, q), hv in self.hop.items():
            M.add(hv == lsum((C[m, n] if q else C[n, m]) * w[n, m, e, b] for n in range(N)
                             for m in range(N) if n != m))

        # the tied embedding's all-reduce per replica: the product terms of its edge
        self.tied_vars = M.vars([] if relax or dat.tied_edge is None else list(range(D)))
        if self.tied_vars:
            e_t = dat.edges.index(dat.tied_edge)
            for b, tv in self.tied_vars.items():
                M.add(tv == lsum(dat.tied_C[n, m] * w[n, m, e_t, b] for n in range(N)
                                 for m in range(N) if n != m))

        # data-parallel ring per node-stage: u[a] = 1 / its slowest link's bandwidth
        u = {} if u_const is not None else M.vars(range(A))
        y = {}
        if u_const is None:
            y = M.vars([(n, m, a, b) for a in range(A) for b in range(D) for n in range(N)
                        for m in range(N) if n != m], 0, 1)
            for a in range(A):
                for b in range(D):
                    b2 = (b + 1) % D
                    for n in range(N):
                        M.add(lsum(y[n, m, a, b] for m in range(N) if m != n) == x[n, a, b])
                        M.add(lsum(y[m, n, a, b] for m in range(N) if m != n) == x[n, a, b2])
                    M.add(u[a] >= lsum(dat.inv_ring[n, m] * y[n, m, a, b]
                                       for n in range(N) for m in range(N) if n != m))
                if k > 1:
                    M.add(u[a] >= dat.inv_intra)

        # the experts' ring (EP groups inside a node, uneven links): u_e[a], the data-parallel
        # ring's link terms with k_e instead of k streams per node (_Data._expert_sync)
        ue_var = dat.exp_sig > 0 and dat.u_e_const is None and not relax
        ue_const = None if ue_var else (dat.u_e_min if relax and dat.u_e_const is None
                                        else dat.u_e_const)
        ue = M.vars(range(A)) if ue_var else {}
        for a in ue:
            for b in range(D):
                M.add(ue[a] >= dat.exp_factor * lsum(
                    dat.inv_ring[n, m] * y[n, m, a, b] for n in range(N) for m in range(N)
                    if n != m))
            M.add(ue[a] >= dat.inv_intra_e)
        U_e = max(dat.exp_factor * dat.inv_ring.max(), dat.inv_intra_e) if ue_var else 0.0

        # z[j,q] = beta[j,q] u[a] (ze likewise for u_e), exact at the optimum (z minimal)
        z = M.vars([(j, q) for j in range(V) for q in range(nbits)])
        ze = M.vars([(j, q) for j in range(V) for q in range(nbits)] if ue_var else [])
        for j in range(V):
            a = dat.nstage(dat.stage_of(j))
            for q in range(nbits):
                M.add(z[j, q] >= u[a] - U * (1 - beta[j, q]))
                if ue_var:
                    M.add(ze[j, q] >= ue[a] - U_e * (1 - beta[j, q]))

        def lue_expr(j):  # l[j] * u_e[a]
            if not ue_var:
                return ue_const * l_[j]
            a = dat.nstage(dat.stage_of(j))
            return ue[a] + lsum(2 ** q * ze[j, q] for q in range(nbits))

        def params_expr(s):  # the parameters the optimizer steps (costs.optimizer_shard)
            return dat.E_opt[s] + dat.P_opt * stage_layers(s)

        def lu_expr(j):  # l[j] * u[a]
            if u_const is not None:
                return u_const * l_[j]
            a = dat.nstage(dat.stage_of(j))
            return u[a] + lsum(2 ** q * z[j, q] for q in range(nbits))

        def ua(s):
            return u_const if u_const is not None else u[dat.nstage(s)]

        def params_u(s):  # params_s * u[a] (the parameters of the data-parallel sync)
            return dat.E_sync[s] * ua(s) + dat.P_sync * lsum(lu_expr(j) for j in range(V)
                                                           if j % p == s)

        def gather_u(s):  # what the all-gather moves, in 16-bit parameters, times u[a]
            if not dat.kappa:
                return params_u(s)
            return (dat.E_sync[s] - dat.kappa * dat.lin_const[s]) * ua(s) + (
                dat.P_sync - dat.kappa * dat.P_lin) * lsum(lu_expr(j) for j in range(V)
                                                           if j % p == s)

        # the last bucket's min(bucket, params_s) * u[a]: constant cases, or through the loads'
        # binaries (gu[s, c] = g[s, c] u[a]); a model without loads takes the smallest value
        # it can have (a relaxation, used only for bounds)
        self.has_loads = loads
        mixed = [s for s in range(p) if dat.bucket_case[s] == "mixed"]
        gu = M.vars([(s, c) for s in mixed for c in self.counts] if (
            loads and dat.needs_loads and u_const is None) else [])
        for (s, c), v_ in gu.items():
            M.add(v_ >= u[dat.nstage(s)] - U * (1 - g[s, c]))

        def bucket_u(s, gather=False):
            """The last bucket x u[a]: min(bucket, params_s), the stage's FP8-weight gather
            bytes (in 16-bit parameters) where the bucket is the whole stage (costs.py)."""
            case = dat.bucket_case[s]
            if case == "bucket":
                return dat.bucket * ua(s)
            if case == "params":
                return gather_u(s) if gather else params_u(s)
            if not (loads and dat.needs_loads):
                return dat.last_bucket(s, dat.v, gather) * ua(s)
            size = {c: dat.last_bucket(s, c, gather) for c in self.counts}
            if u_const is not None:
                return u_const * lsum(size[c] * g[s, c] for c in self.counts)
            return lsum(size[c] * gu[s, c] for c in self.counts)

        for s in range(p):
            opt_s = (dat.opt_coef * params_expr(s) + dat.fp8_coef * (
                dat.P_lin * stage_layers(s) + dat.lin_const[s]) + dat.ovh
                + dat.us_layer * stage_layers(s) + dat.us_const[s])
            if dat.exp_sig:  # the experts' gradient sync over their own ring
                off = dat.exp_off[s] * (ue[dat.nstage(s)] if ue_var else ue_const)
                opt_s = opt_s + dat.exp_sig * dat.P_exp * (lsum(
                    lue_expr(j) for j in range(V) if j % p == s) - off) + dat.exp_lam
            if dat.d <= 1:
                M.add(tail[s] >= opt_s)
                continue
            red = dat.sig_r * params_u(s) + dat.lam_r
            gat = dat.sig_g * gather_u(s) + dat.lam_g
            # exposed = max(last bucket, all - window) under each overlap (costs.py); a sum of
            # maxima is the maximum over the combinations
            reds = ([dat.sig_r * bucket_u(s) + dat.lam_r, red - dat.nr * self.B(s)] if dat.ogr
                    else [red])
            gats = ([dat.sig_g * bucket_u(s, True) + dat.lam_g, gat - self.F(s)] if dat.opg
                    else [gat])
            for r_ in reds:
                for g_ in gats:
                    M.add(tail[s] >= r_ + g_ + opt_s)

        # memory at every moment of the schedule that can be a stage's peak, in GiB (bytes
        # would put coefficients near 1e10 and upset HiGHS's tolerances)
        mem = dat.mem
        for s in range(p):
            for kind, counts in dat.ev0.cs.memory_moments(s):
                act = Lin()
                for c, cnt in enumerate(counts):
                    if cnt:
                        jj = c * p + s
                        act.iadd(mem.act_layer * l_[jj] + mem.chunk_act_bytes(jj, 0), int(cnt))
                work = mem.stage_work(s) if kind == "B" else 0.0
                static = dat.const_bytes[s] + mem.layer_static_bytes * stage_layers(s)
                M.add((static + act + work) / GIB <= dat.cap_gib)

        # symmetry: rotate node-replicas so the lowest-index host of node-stage 0 is in b = 0
        for b in range(1, D):
            M.add(lsum(n * x[n, 0, 0] for n in range(N)) <= lsum(n * x[n, 0, b]
                                                               for n in range(N)))
        M.minimize(self.T)
        self._fF, self._fB = np.asarray(dat.fF, dtype=float), np.asarray(dat.fB, dtype=float)
        self._eF, self._eB = np.asarray(dat.eF, dtype=float), np.asarray(dat.eB, dtype=float)
        self.seen: set[bytes] = set()
        self.synced = 0  # how much of the shared cut list _sync_cuts has passed to this model
        self.values: np.ndarray | None = None  # the last solve's column values (`load`)

    def full(self, j):
        """Virtual stage j's full-attention layers, q[j] - q[j-1] (0 without them)."""
        if not self.q:
            return 0.0
        return self.q[j] - self.q[j - 1] if j else self.q[j] + 0.0

    def F(self, j):
        return self.dat.fF[j] * self.l[j] + self.dat.eF[j] + self.dat.dF * self.full(j)

    def B(self, j):
        return self.dat.fB[j] * self.l[j] + self.dat.eB[j] + self.dat.dB * self.full(j)

    def full_values(self) -> list[float] | None:
        """The last solution's full-attention layers per virtual stage (None without)."""
        if not self.q:
            return None
        q = [self._val(self.q[j]) for j in range(self.dat.V)]
        return [q[j] - (q[j - 1] if j else 0.0) for j in range(self.dat.V)]

    def hop_expr(self, h: int, b: int, backward: bool):
        dat = self.dat
        e = dat.hop_edge[h]
        if e is None:
            return dat.intra_hop
        if self.relax:
            return dat.hop_min_inter
        return self.hop[dat.edges.index(e), b, int(backward)]

    def tied_expr(self, b: int):
        """Replica b's tied-embedding all-reduce (in the first and last stage's tails): a
        constant inside a node or with the placement relaxed, else its variable."""
        dat = self.dat
        if dat.tied_edge is None or self.relax:
            return dat.tied_relaxed
        return self.tied_vars[b]

    def add_cut(self, counts: np.ndarray) -> bool:
        """T >= the path's length, for every replica: durations are linear in the variables
        (model.schedule: a path's length is linear in the durations of the kinds it visits).
        Built as one row of coefficients: each virtual stage's F and B visits weigh its layer
        count (fF, fB) and a constant (eF, eB); a transfer is a constant inside a node or
        with the placement relaxed, else its hop variable; tails are variables."""
        key = counts.tobytes()
        if key in self.seen:
            return False
        self.seen.add(key)
        work.charge("cut")
        dat = self.dat
        V, p = dat.V, dat.p
        cF, cB = counts[:V], counts[V:2 * V]
        cx = (counts[2 * V:2 * V + p], counts[2 * V + p:2 * V + 2 * p])
        ct = counts[2 * V + 2 * p:2 * V + 3 * p]
        coef_l = cF * self._fF + cB * self._fB
        const = float(cF @ self._eF + cB @ self._eB)
        base: dict[int, float] = {}
        for j in np.flatnonzero(coef_l):
            (col,) = self.l[j].terms
            base[col] = -float(coef_l[j])
        for s_ in np.flatnonzero(ct):
            (col,) = self.tail[s_].terms
            base[col] = base.get(col, 0.0) - float(ct[s_])
        if self.q:  # sum_j cq[j] (q[j] - q[j-1]) = sum_j q[j] (cq[j] - cq[j+1])
            cq = cF * dat.dF + cB * dat.dB
            for j in range(V):
                w = float(cq[j] - (cq[j + 1] if j + 1 < V else 0.0))
                if w:
                    (col,) = self.q[j].terms
                    base[col] = base.get(col, 0.0) - w
        (t_col,) = self.T.terms
        base[t_col] = base.get(t_col, 0.0) + 1.0
        c_tied = float(ct[0] + ct[p - 1]) if dat.tied else 0.0
        for b in range(self.D):
            terms, lb = dict(base), const
            if c_tied:
                x = self.tied_expr(b)
                if isinstance(x, Lin):
                    (col,) = x.terms
                    terms[col] = terms.get(col, 0.0) - c_tied
                else:
                    lb += c_tied * x
            for q in (0, 1):
                for h in np.flatnonzero(cx[q][:dat.n_hops]):
                    x = self.hop_expr(h, b, bool(q))
                    if isinstance(x, Lin):
                        (col,) = x.terms
                        terms[col] = terms.get(col, 0.0) - float(cx[q][h])
                    else:
                        lb += float(cx[q][h]) * x
            self.M.add(Row(terms, lb, math.inf))
        return True

    def set_cutoff(self, cutoff_ms: float) -> None:
        """T <= cutoff_ms (infinite: no cutoff)."""
        self.M.set_bounds(self.T, 0.0, cutoff_ms)

    def solve(self, time_limit_s: float, mip_rel_gap: float) -> SolveResult:
        res = self.M.solve(time_limit_s, mip_rel_gap)
        self.values = res.values
        return res

    def _val(self, x: Lin) -> float:
        (c,) = x.terms
        return float(self.values[c])

    def layers(self) -> tuple[int, ...] | tuple[float, ...]:
        lay = tuple(self._val(x) for x in self.l)
        if self.integral:
            lay = tuple(int(round(x)) for x in lay)
        return lay

    def perm(self) -> list[int]:
        perm = [0] * (self.dat.A * self.D)
        for (n, a, b), x in self.x.items():
            if self._val(x) > 0.5:
                perm[a * self.D + b] = n
        return perm

    def fix_loads(self, loads) -> None:
        for s, c in enumerate(loads):
            self.M.set_bounds(self.g[s, int(c)], 1, 1)

    def unfix_loads(self) -> None:
        for x in self.g.values():
            self.M.set_bounds(x, 0, 1)

    def add_floor(self, bound_ms: float) -> None:
        """T >= a lower bound known from elsewhere (the master's, for the loads left)."""
        self.M.add(self.T >= bound_ms)

    def exclude_loads(self, loads) -> None:
        self.M.add(lsum(self.g[s, int(c)] for s, c in enumerate(loads)) <= self.dat.p - 1)

    def relaxed_durations(self, lay, full=None) -> np.ndarray:
        """Durations of every operation kind with the placement relaxed (what this model's
        paths cost for split `lay`; `full`: its full-attention layers per virtual stage, the
        split's own by default)."""
        dat, K = self.dat, self.dat.K
        p, V = dat.p, dat.V
        dur = np.zeros(K.size)
        if full is None:
            full = full_attention_layers(dat.prob.model, [int(round(x)) for x in lay]) \
                if self.q else (0,) * V
        for j in range(V):
            dur[K.F(j)] = dat.fF[j] * lay[j] + dat.eF[j] + dat.dF * full[j]
            dur[K.B(j)] = dat.fB[j] * lay[j] + dat.eB[j] + dat.dB * full[j]
        for h in range(dat.n_hops):
            dur[K.xf(h)] = dur[K.xb(h)] = (dat.intra_hop if dat.hop_edge[h] is None
                                           else dat.hop_min_inter)
        for s in range(p):
            n_s = sum(lay[j] for j in range(V) if j % p == s)
            params = dat.E_sync[s] + dat.P_sync * n_s
            tail = (dat.opt_coef * (dat.E_opt[s] + dat.P_opt * n_s) + dat.fp8_coef * (
                dat.P_lin * n_s + dat.lin_const[s]) + dat.ovh + dat.us_layer * n_s
                + dat.us_const[s])
            if dat.exp_sig:
                ue = dat.u_e_const if dat.u_e_const is not None else dat.u_e_min
                tail += dat.exp_sig * dat.P_exp * (n_s - dat.exp_off[s]) * ue + dat.exp_lam
            if dat.d > 1:
                u = dat.u_min
                n_b = (dat.v if dat.bucket_case[s] == "mixed"
                       and not (self.has_loads and dat.needs_loads) else n_s)  # as the model
                last, last_g = dat.last_bucket(s, n_b), dat.last_bucket(s, n_b, True)
                red = dat.sig_r * params * u + dat.lam_r
                gat = dat.sig_g * (params - dat.kappa * (dat.P_lin * n_s + dat.lin_const[s])
                                   ) * u + dat.lam_g
                if dat.ogr:
                    red = max(dat.sig_r * last * u + dat.lam_r, red - dat.nr * dur[K.B(s)])
                if dat.opg:
                    gat = max(dat.sig_g * last_g * u + dat.lam_g, gat - dur[K.F(s)])
                tail += red + gat
            dur[K.tail(s)] = tail
        if dat.tied:
            dur[K.tail(0)] += dat.tied_relaxed
            dur[K.tail(p - 1)] += dat.tied_relaxed
        return dur


def solve_milp(prob: PlacementProblem, *, time_limit_s: float = 60.0, max_rounds: int = 200,
               seed_solutions=(), progress=None, mip_rel_gap: float = 1e-4,
               relax_placement: bool = False, initial_cuts=(),
               integral_layers: bool = True, neighbor_cuts: int = 8,
               cutoff_ms: float = math.inf) -> PlacementResult:
    """Optimal placement and split for `prob`'s shape and block (see the module docstring).

    With `relax_placement`, there are no placement variables: every inter-node pipeline transfer
    costs the cheapest inter-node transfer of the cluster and the data-parallel ring runs at the
    best rate this block layout could give. Durations only shrink, and the critical path is
    monotone in them, so the optimum over layer splits is a lower bound for every placement of
    this block; search.py prunes shapes with the smallest over blocks. The plan is then None.
    `integral_layers=False` (relaxation only) lets layer counts be fractional: a weaker bound
    that solves as a linear program.

    `cutoff_ms`: a plan of another problem is known at this time, so only better plans matter.
    If none exists here the termination is "cutoff" and the bound is (about) the cutoff; the
    plan returned is then the best one seen, which may be slower than the cutoff."""
    t_start = work.now()
    why = milp_supported(prob)
    if why:
        raise SolverUnavailableError(f"MILP does not apply: {why}")

    def left_s():
        return time_limit_s - (work.now() - t_start)

    dat = _Data(prob)
    cut_list: list[np.ndarray] = [np.asarray(c, dtype=float) for c in initial_cuts
                                  if len(c) == dat.K.size]

    if relax_placement:
        R = _Formulation(dat, relax=True, integral_layers=integral_layers)
        if prob.fits(dat.start_layers):
            cut_list.append(dat.ev0.cs.critical_path(R.relaxed_durations(dat.start_layers))[1])
        st = _relaxed_loop(R, cut_list, left_s, max_rounds, mip_rel_gap, cutoff_ms)
        term = "infeasible" if st.infeasible else ("optimal" if st.converged else (
            "cutoff" if math.isfinite(cutoff_ms) and st.bound >= cutoff_ms * (1 - 1e-9)
            else "time_limit"))
        return PlacementResult(None, math.inf, max(st.bound, prob.lower_bound_ms()), term,
                               "milp-relaxed", work.now() - t_start, st.rounds,
                               cut_list, layers=tuple(st.layers) if st.converged else None)

    # Decomposition by stage loads (layers per pipeline stage). The placement-relaxed model
    # with one binary per stage and load (the master) gives load vectors in increasing order of
    # their relaxed bound; each is solved exactly with its loads fixed (the sub-MILP, whose
    # relaxation is tight: the pigeonhole over integral loads that the split's LP cannot see
    # is settled by the master). When the master's bound reaches the best plan, every load
    # vector not yet solved is proven no better.
    master = _Formulation(dat, relax=True, loads=True)
    full: _Formulation | None = None  # built when the first sub-MILP is known to need loads
    best_ms, best_plan, best_seed = math.inf, None, None
    seeds = [(list(p_), tuple(l_)) for p_, l_ in seed_solutions] or [
        (list(range(dat.A * dat.D)), dat.start_layers)]

    K = dat.K
    def paths(perm, lay, variants: int = 0) -> int:
        """Critical paths of every replica of plan (perm, lay) into the shared cut list; how
        many are new to the full model. With `variants`, also the paths that become critical
        when the transfers the path repeats (a steady state's hops) are made slow one way and
        fast the other (each such hop alone, both ways, then random combinations; `variants`
        in all): the placements the MILP would try next to dodge the first path."""
        cs = prob.evaluator(tuple(lay)).cs
        rng = np.random.default_rng(len(cut_list))
        for _, counts, dur in prob.critical_paths(perm, tuple(lay)):
            cut_list.append(counts)
            heavy = [h for h in range(dat.n_hops) if dat.hop_edge[h] is not None and
                     counts[K.xf(h)] + counts[K.xb(h)] > 2]
            for q in range(variants if heavy else 0):
                d2 = dur.copy()
                flips = ([heavy[q // 2]] if q < 2 * len(heavy) else
                         [h for h in heavy if rng.random() < 0.5])
                lo, hi = dat.hop_min_inter, dat.hop_max_inter
                for h in flips:
                    fwd_slow = (q % 2 == 0) if q < 2 * len(heavy) else rng.random() < 0.5
                    d2[K.xf(h)], d2[K.xb(h)] = (hi, lo) if fwd_slow else (lo, hi)
                cut_list.append(cs.critical_path(d2)[1])
        return _sync_cuts(full, cut_list) if full is not None else 0

    for perm, lay in seeds:
        if prob.fits(lay):
            paths(perm, lay)
            c = prob.cost(perm, lay)
            if c < best_ms:
                best_ms, best_plan, best_seed = c, prob.plan(perm, lay), (perm, lay)
    if best_plan is not None and dat.A * dat.D <= SEED_SWAP_SLOTS:
        # the paths around the best seed, which the sub-MILP's first rounds would otherwise
        # find one violated plan at a time (the example: 3 rounds, 16 s, become 1-2, 6-12 s);
        # never more than a tenth of the time limit
        swap_paths(paths, *best_seed, stop=lambda: left_s() < 0.9 * time_limit_s)
    solved_bounds: list[float] = []
    # lower bound of every load vector not solved yet: at least the closed-form bound of the
    # shape (solvers.bounds), so that a search stopped before any LP returns still bounds
    floor_ms = prob.lower_bound_ms()
    rest_bound = floor_ms
    rounds = 0

    # a sub-MILP leaves a little time so that, if it runs out, the master can still bound the
    # load vectors not reached (often none are left: then that bound is infinite)
    reserve_s = min(2.0, 0.05 * time_limit_s)

    def sub_solve() -> _LoopState:
        nonlocal best_ms, best_plan, rounds
        _sync_cuts(full, cut_list)
        sub = _placement_loop(full, prob, paths, lambda: left_s() - reserve_s,
                              max_rounds, mip_rel_gap, neighbor_cuts, min(best_ms, cutoff_ms))
        rounds += sub.rounds
        if sub.plan is not None and sub.objective_ms < best_ms:
            best_ms, best_plan = sub.objective_ms, sub.plan
            if progress:
                progress(best_ms, min(solved_bounds + [rest_bound]))
        return sub

    while left_s() > 0.05:
        limit_ms = min(best_ms, cutoff_ms)
        st = _relaxed_loop(master, cut_list, left_s, max_rounds, mip_rel_gap, limit_ms)
        rounds += st.rounds
        if st.infeasible:
            rest_bound = math.inf
            break
        rest_bound = max(rest_bound, st.bound)
        if not st.converged or limit_ms - rest_bound <= _tolerance(limit_ms, mip_rel_gap):
            break
        if len(solved_bounds) >= MAX_LOAD_VECTORS or limit_ms - rest_bound > LOAD_GAP * limit_ms:
            # many load vectors come close on the cheapest links (placement matters much, as
            # on small, slow clusters): one MILP over all the loads left, none of which can
            # beat the master's bound
            if full is None:
                full = _Formulation(dat, relax=False, loads=dat.needs_loads)
            else:
                full.unfix_loads()
                full.add_floor(rest_bound)
            rest_bound = max(rest_bound, sub_solve().bound)
            break
        if full is None:
            full = _Formulation(dat, relax=False, loads=True)
        loads = dat.loads(st.layers)
        full.fix_loads(loads)
        if prob.fits(st.layers):
            for perm, _lay in seeds:  # the seeds' placements with the master's split
                paths(perm, st.layers)
        sub = sub_solve()
        # a sub-MILP stopped before its first dual bound still has the master's bound for
        # this load vector
        solved_bounds.append(max(sub.bound, rest_bound))
        master.exclude_loads(loads)
        if not sub.converged:  # time is up: bound the other load vectors in the reserve
            st = _relaxed_loop(master, cut_list, left_s, max_rounds, mip_rel_gap,
                               min(best_ms, cutoff_ms))
            rounds += st.rounds
            rest_bound = math.inf if st.infeasible else max(rest_bound, st.bound)
            break
        full.unfix_loads()
        full.exclude_loads(loads)
    limit_ms = min(best_ms, cutoff_ms)
    bound = min(solved_bounds + [rest_bound, limit_ms])
    if best_ms - bound <= _tolerance(best_ms, mip_rel_gap):
        termination = "optimal"
    elif limit_ms < best_ms and limit_ms - bound <= _tolerance(limit_ms, mip_rel_gap):
        termination = "cutoff"  # proven: no plan of this problem beats `cutoff_ms`
    elif best_plan is None and math.isinf(rest_bound):
        termination = "infeasible"
    else:
        termination = "time_limit"
    return PlacementResult(best_plan, best_ms, bound, termination, "milp",
                           work.now() - t_start, rounds, cut_list, len(solved_bounds))


def _tolerance(best_ms: float, mip_rel_gap: float) -> float:
    """The gap HiGHS accepts as optimal (relative mip_rel_gap, absolute mip_abs_gap 1e-6), plus
    the 1e-7 relative at which a MILP objective and the estimator's time of its plan are judged
    to agree (HiGHS's feasibility tolerance: `_placement_loop`)."""
    return (mip_rel_gap + 1e-7) * best_ms + 1e-6


@dataclass
class _LoopState:
    bound: float = 0.0
    rounds: int = 0
    converged: bool = False  # the model agrees with the estimator at its optimum
    infeasible: bool = False
    layers: tuple = ()
    plan: Plan | None = None
    objective_ms: float = math.inf


def _sync_cuts(F: _Formulation, cut_list) -> int:
    """Add the paths appended to the shared (append-only) list since F last looked; how many
    were new to F."""
    new = sum(F.add_cut(c) for c in cut_list[F.synced:])
    F.synced = len(cut_list)
    return new


def _relaxed_loop(F: _Formulation, cut_list, left_s, max_rounds: int,
                  mip_rel_gap: float, cutoff_ms: float = math.inf) -> _LoopState:
    """Cut loop of the placement relaxation: solve, score the split's relaxed durations on the
    schedule graph, add the critical path if the model underestimates it, repeat. Every
    round's dual bound is a valid lower bound (fewer paths: a relaxation). With a finite
    `cutoff_ms` (the best plan's time) only splits below it are sought: when none is left the
    bound is the cutoff (`infeasible` stays False; it means no split fits at all)."""
    st = _LoopState()
    cs = F.dat.ev0.cs
    F.set_cutoff(cutoff_ms)
    while st.rounds < max_rounds and left_s() > 0.05:
        _sync_cuts(F, cut_list)
        st.rounds += 1
        res = _highs_solve(F, left_s(), mip_rel_gap)
        if res.status == "infeasible":
            if math.isfinite(cutoff_ms):
                st.bound = max(st.bound, cutoff_ms)
            else:
                st.infeasible, st.bound = True, math.inf
            return st
        if res.bound is not None:
            st.bound = max(st.bound, min(res.bound, cutoff_ms))
        if res.objective is None or res.status != "optimal":
            return st
        lay = F.layers()
        length, counts, _ = cs.critical_path(F.relaxed_durations(lay, F.full_values()))
        if length <= res.objective * (1 + 1e-7) + 1e-9:
            st.converged, st.layers = True, lay
            return st  # `bound` holds HiGHS's dual bound of this relaxation
        cut_list.append(counts)
    return st


def _placement_loop(F: _Formulation, prob, paths, left_s, max_rounds: int,
                    mip_rel_gap: float, neighbor_cuts: int, cutoff_ms: float) -> _LoopState:
    """Cut loop of the full model with its loads fixed: solve, rebuild the plan, score it with
    the estimator; if the estimator's time exceeds the MILP objective, add the critical path of
    every replica (and of a few neighbouring plans) and solve again. At convergence the MILP
    objective equals the estimator's time of its plan."""
    st = _LoopState()
    V = F.dat.V
    while st.rounds < max_rounds and left_s() > 0.05:
        st.rounds += 1
        # only plans better than the best known by more than the tolerance are of interest:
        # T <= best (1 - gap) prunes the rest, a node whose bound is within the tolerance at
        # once; if no plan is left, this load vector cannot beat the best by more, and its
        # bound is the cutoff (HiGHS's own gap needs an incumbent below the cutoff, which
        # there may never be)
        cut_ms = min(cutoff_ms, st.objective_ms)
        if math.isfinite(cut_ms):
            cut_ms *= 1 - mip_rel_gap
        F.set_cutoff(cut_ms)
        # the first round may not take all the time: its incumbent is scored by the estimator
        # only when HiGHS returns, and with few paths it may be far off (32 nodes)
        budget = left_s() if st.rounds > 1 else max(left_s() / 2, min(left_s(), 10.0))
        res = _highs_solve(F, budget, mip_rel_gap)
        if res.status == "infeasible":
            st.infeasible, st.converged, st.bound = True, True, cut_ms
            return st
        if res.bound is not None:
            st.bound = max(st.bound, min(res.bound, cut_ms))
        if res.objective is not None:
            perm, lay = F.perm(), F.layers()
            true_ms = prob.cost(perm, lay)
            if true_ms < st.objective_ms:
                st.objective_ms, st.plan = true_ms, prob.plan(perm, lay)
        # the dual bound is valid whatever the cuts (fewer paths: a relaxation) and whether
        # HiGHS finished or not: once the best plan known (here or the caller's cutoff) is
        # within the tolerance of it, no plan of this load vector can be better by more
        known = min(cutoff_ms, st.objective_ms)
        if known - st.bound <= _tolerance(known, mip_rel_gap):
            st.converged = True
            return st
        # the first round's share ran out (not the whole limit): the rest goes to another
        halved = st.rounds == 1 and res.status != "optimal" and left_s() > 0.05
        if res.objective is None:
            if halved:
                continue
            return st
        milp_ms = res.objective
        # HiGHS solves to its feasibility tolerance (1e-7): agreement is judged at 1e-7
        if true_ms <= milp_ms * (1 + 1e-7) + 1e-9:
            if halved:  # (with the better plan as the cutoff)
                continue
            st.converged = res.status == "optimal" or (
                st.objective_ms - st.bound <= 1e-9 * st.objective_ms)
            return st  # the bound stays HiGHS's dual bound, not the incumbent
        if not paths(perm, lay, PATH_VARIANTS):  # cannot happen if the model is linear as claimed
            raise RuntimeError("critical path already present but MILP underestimates")
        # paths of nearby plans too: every swap of two slots, and a few layer moves (the
        # placements the MILP would try next): fewer rounds of re-solving
        swap_paths(paths, perm, lay)
        rng = np.random.default_rng(st.rounds)
        for _ in range(neighbor_cuts if V > 1 else 0):
            l2 = list(lay)
            s_, d_ = rng.choice(V, 2, replace=False)
            if l2[s_] > 1:
                l2[s_] -= 1
                l2[d_] += 1
            if prob.fits(tuple(l2)):
                paths(perm, tuple(l2))
    return st


def swap_paths(paths, perm, lay, stop=lambda: False) -> None:
    """The critical paths of every plan one swap of two slots away from (perm, lay), until
    `stop()`."""
    n_sl = len(perm)
    for a_ in range(n_sl):
        if stop():
            return
        for b_ in range(a_ + 1, n_sl):
            if perm[a_] != perm[b_]:
                p2 = list(perm)
                p2[a_], p2[b_] = p2[b_], p2[a_]
                paths(p2, lay)


def _highs_solve(F: _Formulation, time_limit_s: float, mip_rel_gap: float):
    """One solve of F's model (solvers.linear clamps the limit and retries a solve error
    without presolve); tests replace it to inject failures."""
    return F.solve(time_limit_s, mip_rel_gap)
