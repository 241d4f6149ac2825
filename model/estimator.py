"""The estimator: for a model, job, cluster and plan, per-stage memory and iteration time.

Iteration time = max over columns (data-parallel replica x context-parallel rank) of the longest
path through that column's schedule graph (model.schedule), where each stage's path ends with its
tail: the exposed part of the gradient synchronization plus the optimizer step. Synchronization
is collective across replicas, so every replica sees the same tail; with tied embeddings the
first and last stage's tails also carry their column's all-reduce of the embedding's gradient
(`Evaluator.tied_ms`). This is the single definition
of iteration time; the solvers use `Evaluator` and are tested to agree with it.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace

import numpy as np

from . import work
from .cluster import ClusterSpec
from .communication import dp_ring, p2p_ring
from .costs import CostModel
from .errors import SpecError
from .fp8 import plan_fp8_bytes
from .memory import MemoryModel, StageMemory, fp8_params_apply, keeps_unsharded
from .plan import (Placement, Plan, Shape, ep_groups, expert_dp_groups, framework_splits,
                   fsdp_overlaps_grads, full_attention_layers, least_zero, megatron_placement,
                   num_microbatches, schedule_key, validate_placement, validate_shape)
from .schedule import compile_schedule
from .specs import JobSpec, ModelSpec, Options


@dataclass(frozen=True)
class StageReport:
    stage: int
    layers: int
    fwd_ms: float  # per micro-batch, all chunks, slowest replica
    bwd_ms: float
    sync_ms: float  # gradient synchronization (+ parameter all-gather)
    sync_exposed_ms: float
    optimizer_ms: float
    memory: StageMemory
    limit_gib: float  # smallest GPU memory among the nodes hosting this stage
    # a windowed model's layers of this stage that attend fully (plan.full_attention_layers)
    full_layers: int = 0


@dataclass(frozen=True)
class Estimate:
    iteration_ms: float
    replica_ms: tuple[float, ...]
    stages: tuple[StageReport, ...]
    hops_ms: tuple[tuple[float, float], ...]  # slowest (fwd, bwd) transfer per hop
    breakdown_ms: dict  # critical path of the slowest replica, by category
    tokens_per_s: float
    mfu: float  # eq. (3) model FLOPs (full s x s attention) / time / dense peak
    hfu: float  # the same with what recompute runs again
    num_microbatches: int
    critical_path: list = field(default_factory=list, repr=False)
    mfu_causal: float = 0.0  # MFU counting the causal half of the attention core
    # (and only the window's pairs in the layers that slide one shorter than the sequence)
    windowed: bool = False

    @property
    def peak_memory_gib(self) -> float:
        return max(s.memory.total_gib for s in self.stages)

    @property
    def fits(self) -> bool:
        return all(s.memory.total_gib <= s.limit_gib for s in self.stages)

    def overflow(self) -> list[str]:
        return [f"stage {s.stage} needs {s.memory.total_gib:.1f} GiB > {s.limit_gib:.0f} GiB"
                for s in self.stages if s.memory.total_gib > s.limit_gib]


def _path_comm(lt, kind: str) -> tuple[float, float]:
    """One layer's exposed communication of a kind inside its F and its B (with what the
    recompute runs again: LayerTimes.*_comm_rerun_ms; ZeRO-3's backward exposure counts its
    re-gather already)."""
    return (getattr(lt, f"{kind}_comm_fwd_ms"), getattr(lt, f"{kind}_comm_bwd_ms")
            + getattr(lt, f"{kind}_comm_rerun_ms", 0.0))


def stage_limit_gib(cluster: ClusterSpec, pl: Placement, stage: int) -> float:
    """A stage's memory limit: the smallest GPU memory among the nodes hosting it (every
    replica of the stage holds the same bytes), the one fit rule of estimator and solvers."""
    return min(cluster.nodes[n].gpu.memory_gib for n in pl.node[stage])


def _residue_to_zero(x_ms: float, length_ms: float) -> float:
    """A difference of sums that is zero but for float rounding (-5e-13 ms, printed -0.0) as
    0.0; anything larger is kept as it is."""
    return 0.0 if abs(x_ms) <= 1e-9 * max(abs(length_ms), 1.0) else x_ms


class Evaluator:
    """Everything fixed by the shape, ready to score placements quickly."""

    def __init__(self, model: ModelSpec, job: JobSpec, cluster: ClusterSpec, shape: Shape,
                 options: Options | None = None, src: str = "plan"):
        options = options or Options()
        validate_shape(model, job, cluster, shape, src)
        self.model, self.job, self.cluster, self.shape, self.options = (
            model, job, cluster, shape, options)
        self.m = num_microbatches(job, shape)
        self.cs = compile_schedule(*schedule_key(job, shape, options.blocking_p2p))
        self.kinds = self.cs.kinds
        self.costs = CostModel(model, job, cluster, shape, options)
        self.mem = MemoryModel(model, job, shape, self.cs, options,
                               plan_fp8_bytes(job, shape, cluster), cluster=cluster)
        self.params = [self.costs.stage_params(s) for s in range(shape.pp)]
        # a windowed model's full-attention layers per virtual stage (where the split puts
        # them: plan.full_attention_layers)
        self.full_layers = full_attention_layers(model, shape.layers)
        self.memory = [self.mem.stage(s, self.params[s], shape.layers) for s in range(shape.pp)]
        # Caches for the solvers' hot path (`iteration_ms`): a stage's tail depends only on
        # that stage's row of the placement, a replica's path up to the tails only on that
        # replica's column. Pure memoization: every number is computed as without them.
        self._tail_cache: dict = {}
        self._ring_cache: dict = {}
        self._replica_cache: dict = {}
        self._path_cache: dict = {}
        self._dur_memo: dict = {}  # replica_durations' stages and transfers
        K = self.kinds
        self._idx_f = [K.F(j) for j in range(shape.num_virtual)]
        self._idx_b = [K.B(j) for j in range(shape.num_virtual)]
        hops = shape.pp if shape.chunks > 1 else shape.pp - 1
        self._idx_xf = [K.xf(h) for h in range(hops)]
        self._idx_xb = [K.xb(h) for h in range(hops)]
        self._ep_groups = ep_groups(shape) if shape.ep > 1 else []
        self._expert_dp_groups = expert_dp_groups(shape) if self.costs.experts_split else []

    # -- durations ---------------------------------------------------------------------------

    def ring(self, members: list[tuple[int, int]], channels_per_node: bool = True
             ) -> tuple[float, bool]:
        """`communication.dp_ring`, memoized on what it depends on: the order of the nodes,
        how many members each holds, and which GPUs only where a node's links differ by GPU
        (the TP ranks of a stage usually share one ring)."""
        c = self.cluster
        if not c.gpu_specific_links:  # the node sequence says it all (order and counts)
            key = ("nodes", channels_per_node, tuple([n for n, _g in members]))
        else:
            sig = []
            for n, g in members:
                if sig and sig[-1][0] == n:
                    sig[-1][1].append(g)
                else:
                    sig.append((n, [g]))
            key = (channels_per_node, tuple(
                (n, tuple(gs) if c.nodes[n].intra_matrix_gb_per_s is not None else len(gs))
                for n, gs in sig))
        hit = self._ring_cache.get(key)
        if hit is None:
            if len(self._ring_cache) > 100_000:
                self._ring_cache.clear()
            hit = dp_ring(c, members, channels_per_node)
            self._ring_cache[key] = hit
        return hit

    def shard_ring(self, pl: Placement, s: int) -> float:
        """ZeRO-3 / FSDP: the slowest ring of stage s's shard groups (every TP rank's), which
        every layer's gathers use; inf without parameter sharding."""
        sh = self.shape
        if sh.zero < 3:
            return float("inf")
        key = ("shard", s, pl.node[s], pl.gpus[s])
        hit = self._tail_cache.get(key)
        if hit is None:
            hit = float("inf")
            g = sh.shard_group  # consecutive columns: shard_size replicas x their CP ranks
            for i in range(sh.tp):
                for first in range(0, sh.cols, g):
                    members = [(pl.node[s][r], pl.gpus[s][r][i]) for r in range(first, first + g)]
                    hit = min(hit, self.ring(members, self.costs.shard_ring_channels)[0])
            self._tail_cache[key] = hit
        return hit

    def cp_ring(self, pl: Placement, s: int, r: int) -> float:
        """Context parallelism: the slowest hop of column r's CP ring at stage s (every TP
        rank's ring, in CP rank order); inf without CP."""
        sh = self.shape
        if sh.cp <= 1:
            return float("inf")
        first = r - r % sh.cp
        cols = range(first, first + sh.cp)
        key = ("cp", s, tuple(pl.node[s][q] for q in cols), tuple(pl.gpus[s][q] for q in cols))
        hit = self._tail_cache.get(key)
        if hit is None:
            hit = min(p2p_ring(self.cluster, [(pl.node[s][q], pl.gpus[s][q][i]) for q in cols])
                      for i in range(sh.tp))
            self._tail_cache[key] = hit
        return hit

    def ep_alltoall(self, pl: Placement, s: int, r: int) -> float:
        """Expert parallelism: one all-to-all at stage s as column r sees it, the slowest of
        the EP groups its GPUs belong to (all run at once); 0 without EP."""
        if self.shape.ep <= 1:
            return 0.0
        return self.ep_alltoall_row(pl, s)[r]

    def ep_alltoall_row(self, pl: Placement, s: int) -> list[float]:
        """`ep_alltoall` of every column of stage s, memoized on the stage's row."""
        sh = self.shape
        key = ("ep", s, pl.node[s], pl.gpus[s])
        per_col = self._tail_cache.get(key)
        if per_col is None:
            per_col = [0.0] * sh.cols
            for grp in self._ep_groups:
                ms = self.costs.ep_alltoall_ms(self.cluster, [(pl.node[s][c], pl.gpus[s][c][t])
                                                              for c, t in grp])
                for c, _t in grp:
                    per_col[c] = max(per_col[c], ms)
            self._tail_cache[key] = per_col
        return per_col

    def replica_durations(self, pl: Placement, r: int, tails: np.ndarray,
                          tied: bool = True) -> np.ndarray:
        """Durations of column r's schedule graph (its operations, transfers and tails).
        A virtual stage's (forward, backward) is memoized on its node, GPUs and rings, a
        transfer on its two ends (the annealer re-scores many columns per move). The first
        and the last stage's tails carry the column's tied-embedding all-reduce (`tied_ms`)
        unless `tied` is False."""
        sh, K = self.shape, self.kinds
        d = [0.0] * K.size
        memo = self._dur_memo
        if len(memo) > 200_000:
            memo.clear()
        node_row, gpu_row = pl.node, pl.gpus
        for s in range(sh.pp):
            n, g = node_row[s][r], gpu_row[s][r]
            shard = self.shard_ring(pl, s)
            cpr = self.cp_ring(pl, s, r)
            a2a = self.ep_alltoall(pl, s, r)
            for ch in range(sh.chunks):
                j = ch * sh.pp + s
                key = (n, g, j, shard, cpr, a2a)
                fb = memo.get(key)
                if fb is None:
                    node = self.cluster.nodes[n]
                    fb = memo[key] = self.costs.virtual_stage_ms(
                        node.gpu, node.ring_gb_per_s(g), j, sh.layers[j], shard, cpr, a2a,
                        self.full_layers[j])
                d[self._idx_f[j]], d[self._idx_b[j]] = fb
        for h in range(len(self._idx_xf)):
            a, b = h, (h + 1) % sh.pp
            d[self._idx_xf[h]] = self.link_ms(pl, a, b, r)
            d[self._idx_xb[h]] = self.link_ms(pl, b, a, r)
        out = np.array(d)
        out[2 * K.V + 2 * sh.pp:] = tails
        if tied and self.costs.tied_grad_bytes:
            t = self.tied_ms(pl, r)
            out[K.tail(0)] += t
            out[K.tail(sh.pp - 1)] += t
        return out

    def tied_ms(self, pl: Placement, r: int) -> float:
        """Column r's tied-embedding gradient all-reduce between its first and last stage
        (costs.CostModel.tied_allreduce_ms; 0 where nothing is tied across stages): every
        tensor rank with its peer, the slowest pair's link, the slower way round. Both
        stages' tails carry it (each waits for it before its optimizer step; the wait for the
        later of the two to be ready is not modelled). Memoized on the two ends."""
        if not self.costs.tied_grad_bytes:
            return 0.0
        last = self.shape.pp - 1
        na, nb = pl.node[0][r], pl.node[last][r]
        ga, gb = pl.gpus[0][r], pl.gpus[last][r]
        key = ("tied", na, ga, nb, gb)
        hit = self._dur_memo.get(key)
        if hit is None:
            c = self.cluster
            if na == nb:
                nd = c.nodes[na]
                bw = min(min(nd.link_gb_per_s(x, y), nd.link_gb_per_s(y, x))
                         for x, y in zip(ga, gb))
            else:
                bw = float(min(c.inter_gb_per_s[na, nb], c.inter_gb_per_s[nb, na]))
            hit = self._dur_memo[key] = self.costs.tied_allreduce_ms(bw, na == nb)
        return hit

    def link_ms(self, pl: Placement, sa: int, sb: int, r: int) -> float:
        """Transfer from stage sa's group to stage sb's group in replica r (memoized on the
        two ends)."""
        na, nb = pl.node[sa][r], pl.node[sb][r]
        ga, gb = pl.gpus[sa][r], pl.gpus[sb][r]
        key = ("hop", na, ga, nb, gb)
        hit = self._dur_memo.get(key)
        if hit is None:
            c = self.cluster
            ring = c.nodes[nb].ring_gb_per_s(gb)
            if na == nb:
                bw = min(c.nodes[na].link_gb_per_s(x, y) for x, y in zip(ga, gb))
                hit = self.costs.hop_ms(bw, True, ring)
            else:
                hit = self.costs.hop_ms(float(c.inter_gb_per_s[na, nb]), False, ring)
            self._dur_memo[key] = hit
        return hit

    def stage_sync_ms(self, pl: Placement, s: int, bwd_window_ms: float = 0.0,
                      fwd_window_ms: float = 0.0) -> tuple[float, float]:
        """(full synchronization, exposed part) of stage s: the slowest of its TP ranks' data
        parallel rings (costs.exposed_sync_ms says what the overlaps hide)."""
        worst_full, worst_exposed = 0.0, 0.0
        sh = self.shape
        # the synchronization's groups: the data x context parallel group (every column), or
        # with HSDP the replicas of each shard (columns i, i + g, i + 2g, ...)
        g = sh.shard_group if sh.zero >= 3 else sh.cols
        groups = [list(range(i, sh.cols, g)) for i in range(g)] if sh.zero >= 3 else \
            [list(range(sh.cols))]
        experts = self.costs.stage_expert_params(s)
        dense = self.params[s] - experts
        linear = self.costs.stage_linear_params(s) if self.costs.fp8_gather_saving else 0.0
        # where no node's links differ by GPU, every TP rank's ring is the same ring (`ring`'s
        # memo key): one rank stands for all
        for i in range(sh.tp if self.cluster.gpu_specific_links else 1):
            for reps in groups:
                members = [(pl.node[s][r], pl.gpus[s][r][i]) for r in reps]
                bw, inter = self.ring(members)
                red, gat, exposed = self.costs.exposed_sync_ms(dense, bw, inter,
                                                               bwd_window_ms, fwd_window_ms,
                                                               linear=linear)
                worst_full = max(worst_full, red + gat)
                worst_exposed = max(worst_exposed, exposed)
        if experts:
            # EP > 1 (or expert TP != TP): the routed experts' gradients (and parameters)
            # synchronize over their expert-data-parallel groups (plan.expert_dp_groups) after
            # the dense ones (Megatron-LM keeps them in buffers of their own), in what is left
            # of the backward window
            full_e = exposed_e = 0.0
            for grp in self._expert_dp_groups:
                members = [(pl.node[s][c], pl.gpus[s][c][t]) for c, t in grp]
                bw, inter = self.ring(members)
                red, gat, exposed = self.costs.exposed_sync_ms(
                    experts, bw, inter, max(0.0, bwd_window_ms - worst_full),
                    max(0.0, fwd_window_ms - worst_full), self.costs.expert_sync_group())
                full_e, exposed_e = max(full_e, red + gat), max(exposed_e, exposed)
            worst_full += full_e
            worst_exposed += exposed_e
        if sh.zero >= 3 and keeps_unsharded(self.job, sh):
            step = self.unsharded_step_ms(pl, s)
            worst_full, worst_exposed = worst_full + step, worst_exposed + step
        return worst_full, worst_exposed

    def unsharded_step_ms(self, pl: Placement, s: int) -> float:
        """torchtitan's FSDP2 under PP: stage s's gathers in the step's first forward and its
        reduce-scatters after the last backward, once a step (costs.CostModel.
        unsharded_step_coefs), on its slowest replica."""
        sh, worst = self.shape, 0.0
        shard = self.shard_ring(pl, s)
        cols = [(self.cluster.nodes[pl.node[s][r]], r) for r in range(sh.cols)]
        args = [(nd.gpu, nd.ring_gb_per_s(pl.gpus[s][r]), shard, self.cp_ring(pl, s, r),
                 self.ep_alltoall(pl, s, r)) for nd, r in cols]
        # the gathers hide behind the slowest replica's layer forward, which the iteration's
        # path already runs: a faster replica hides less of them but shows no more (per layer
        # max(forward, gather)); judged against its own forward it had made a faster GPU or
        # TP ring slow the iteration (up to +2% on one faster H100 node)
        window = max(self.costs.layer_times(*a).fwd_ms for a in args)
        for a in args:
            per_layer, per_chunk, per_edge = self.costs.unsharded_step_coefs(
                *a, fwd_window_ms=window)
            js = range(s, sh.num_virtual, sh.pp)
            worst = max(worst, per_layer * sum(sh.layers[j] for j in js) + per_chunk * len(js)
                        + per_edge * self.costs.stage_edges(s))
        return worst

    def stage_windows_ms(self, pl: Placement, s: int) -> tuple[float, float]:
        """Backward and forward time of the stage's first chunk (virtual stage s) on its
        slowest node: the windows the gradient reduction (--overlap-grad-reduce, during the
        last micro-batch's backward) and the parameter all-gather (--overlap-param-gather,
        during the first forward) can hide in."""
        gpu_nodes = {pl.node[s][r] for r in range(self.shape.cols)}
        bwd, fwd = float("inf"), float("inf")
        shard = self.shard_ring(pl, s)
        cpr = self.cp_ring(pl, s, 0)
        a2a = self.ep_alltoall(pl, s, 0)
        for n in gpu_nodes:
            node = self.cluster.nodes[n]
            ring = node.ring_gb_per_s(tuple(range(self.shape.tp)))
            f, b = self.costs.virtual_stage_ms(node.gpu, ring, s, self.shape.layers[s], shard,
                                               cpr, a2a, self.full_layers[s])
            bwd, fwd = min(bwd, b), min(fwd, f)
        return bwd, fwd

    def stage_tail(self, pl: Placement, s: int) -> tuple[float, tuple[float, float, float]]:
        """Stage s's tail time and (sync, exposed sync, optimizer); memoized on the stage's row
        of the placement (nodes and GPUs of every replica), which is all it depends on."""
        key = (s, pl.node[s], pl.gpus[s])
        hit = self._tail_cache.get(key)
        if hit is None:
            sh = self.shape
            windows = (self.stage_windows_ms(pl, s) if self.costs.sync_overlapped
                       or sh.overlap_param_gather else (0.0, 0.0))
            sync, exposed = self.stage_sync_ms(pl, s, *windows)
            lin = self.costs.stage_linear_params(s)
            # the slowest GPU type of the row (one Adam time per type, not per column)
            gpus = {self.cluster.nodes[n].gpu.name: self.cluster.nodes[n].gpu
                    for n in set(pl.node[s])}
            experts = self.costs.stage_expert_params(s)
            opt = max(self.costs.optimizer_ms(self.params[s], g, lin, experts)
                      for g in gpus.values())
            hit = (exposed + opt + self.options.overheads.latency_overhead_ms,
                   (sync, exposed, opt))
            if len(self._tail_cache) >= 200_000:
                self._tail_cache.clear()
            self._tail_cache[key] = hit
        return hit

    def tails(self, pl: Placement) -> tuple[np.ndarray, list[tuple[float, float, float]]]:
        """Per stage: tail time, and (sync, exposed sync, optimizer) for the report."""
        sh = self.shape
        out = np.zeros(sh.pp)
        parts = []
        for s in range(sh.pp):
            out[s], part = self.stage_tail(pl, s)
            parts.append(part)
        return out, parts

    def iteration_ms(self, pl: Placement) -> float:
        """The cost model's iteration time for this placement (fast path for solvers).

        Equals max over replicas of `cs.longest_path(replica_durations(...))` bit for bit: a
        replica's path up to its tails (`cs.tail_starts`) is memoized on the replica's column
        of the placement and on its durations (replicas on equal links share it), many new
        ones are walked together (`cs.tail_starts_batch`), and the tails, which end every
        path, are added afterwards."""
        work.charge("evaluation")
        tails, _ = self.tails(pl)
        tl = tails.tolist()
        sh = self.shape
        rng_s = range(sh.pp)
        cache, paths = self._replica_cache, self._path_cache
        if len(cache) > 200_000:
            cache.clear()
        if len(paths) > 200_000:
            paths.clear()
        zeros = np.zeros(sh.pp)
        tied = bool(self.costs.tied_grad_bytes)
        cols = []
        todo: dict[bytes, np.ndarray] = {}
        # ZeRO-3: a column's layers also depend on its stages' shard rings (the whole row);
        # CP: on its CP rings
        rings = tuple(self.shard_ring(pl, s) for s in rng_s) if sh.zero >= 3 else ()
        # EP: each stage's all-to-alls looked up once (the row's key), not once per column
        a2a_rows = [self.ep_alltoall_row(pl, s) for s in rng_s] if sh.ep > 1 else []
        # every column's nodes and GPU groups, stage by stage (the placement transposed)
        col_nodes, col_gpus = list(zip(*pl.node)), list(zip(*pl.gpus))
        for r in range(sh.cols):
            cpr = tuple(self.cp_ring(pl, s, r) for s in rng_s) if sh.cp > 1 else ()
            a2a = tuple(row[r] for row in a2a_rows)
            key = (col_nodes[r], col_gpus[r], rings, cpr, a2a)
            starts = cache.get(key)
            if starts is None:
                d = self.replica_durations(pl, r, zeros, tied=False)
                dkey = d.tobytes()
                starts = paths.get(dkey)
                if starts is None:
                    todo.setdefault(dkey, d)
                    starts = dkey  # filled in below
            cols.append((key, starts, self.tied_ms(pl, r) if tied else 0.0))
        if todo:
            keys = list(todo)
            if len(keys) >= 8:
                rows = self.cs.tail_starts_batch(np.stack([todo[k] for k in keys])).tolist()
            else:
                rows = [self.cs.tail_starts(todo[k]) for k in keys]
            for k, row in zip(keys, rows):
                paths[k] = row
        worst = 0.0
        last = sh.pp - 1
        for key, starts, tie in cols:
            if isinstance(starts, bytes):
                starts = paths[starts]
                cache[key] = starts
            length = max(st + t for st, t in zip(starts, tl))
            if tie:  # the first and last stage's tails carry the tied all-reduce
                length = max(length, starts[0] + (tl[0] + tie), starts[last] + (tl[last] + tie))
            worst = max(worst, length)
        return worst

    # -- full report ---------------------------------------------------------------------------

    def model_flops(self) -> tuple[float, float, float]:
        """(model FLOPs, recompute FLOPs, causal attention's saving) of one iteration:
        Narayanan et al. 2021 eq. (3), 3x the forward of every layer and the output layer,
        the attention core counted over the full s x s (as torchtitan's MFU counts it); full
        recompute adds one forward of every layer, selective what the framework runs again
        (Megatron-LM the attention core, Korthikanti et al. 2022 Sec. 5; torchtitan's per-op
        checkpointing the k, o and w3 multiplies, costs.CostModel.op_sac_recompute_share);
        the saving: half of the attention core's 3 passes, which a causal count leaves out
        (Megatron-Bridge's flop_utils, `causal_self_attn`), and in the layers that slide a
        window of W < s keys all but its s W - W^2 / 2 query-key pairs (so that the causal MFU
        counts only the pairs the masks keep; Megatron-LM's own count ignores windows)."""
        m, job = self.model, self.job
        tokens = job.global_batch * job.seq_length
        layers_fwd = m.model_flops_fwd(tokens, job.seq_length)
        model_flops = 3 * (layers_fwd + m.logits_flops_fwd(tokens))
        core = m.num_layers * m.attention_core_flops_fwd(tokens, job.seq_length)
        extra = 0.0
        if self.shape.recompute == "full":
            extra = layers_fwd
        elif self.shape.recompute == "selective" and job.framework == "torchtitan":
            extra = layers_fwd * self.costs.op_sac_recompute_share(self.cluster.nodes[0].gpu)
        elif self.shape.recompute == "selective":
            extra = core
        saving = core / 2
        w, seq = m.sliding_window, job.seq_length
        if w and w < seq:  # the windowed layers keep s W - W^2 / 2 of the s^2 pairs
            saving += core * m.windowed_layers / m.num_layers * (
                0.5 - (seq * w - w * w / 2) / (seq * seq))
        return model_flops, extra, 3 * saving

    def comm_on_path(self, pl: Placement, r: int, counts: np.ndarray, kind: str) -> float:
        """Milliseconds of column r's critical path (`counts`: times it visits each
        operation) spent in one kind of layer communication that sits inside the layers'
        F and B: "ep" the expert-parallel all-to-alls (each forward of a layer carries a
        dispatch and a combine, each backward their gradients'), "cp" the exposed
        context-parallel K/V exchange (costs.CostModel._cp_exchange_ms), "tp" the exposed
        tensor-parallel collectives (costs.CostModel._layer_tp_comm), "shard" ZeRO-3's
        exposed parameter gathers and gradient reduce-scatters (each chunk's first gather and
        last reduce-scatter, the embedding's and output layer's included); each backward also
        carries what its recompute runs again (LayerTimes.*_comm_rerun_ms)."""
        sh, K = self.shape, self.kinds
        total = 0.0
        for s in range(sh.pp):
            node = self.cluster.nodes[pl.node[s][r]]
            lt = self.costs.layer_times(node.gpu, node.ring_gb_per_s(pl.gpus[s][r]),
                                        self.shard_ring(pl, s), self.cp_ring(pl, s, r),
                                        self.ep_alltoall(pl, s, r))
            f, per_b = _path_comm(lt, kind)
            for ch in range(sh.chunks):
                j = ch * sh.pp + s
                total += sh.layers[j] * (counts[K.F(j)] * f + counts[K.B(j)] * per_b)
                if j == 0 and self.costs.first_dense:
                    # the leading dense layers at their own times (costs.virtual_stage_ms):
                    # no all-to-all, a smaller gather under ZeRO-3
                    d = self.costs.dense_costs().layer_times(
                        node.gpu, node.ring_gb_per_s(pl.gpus[s][r]), self.shard_ring(pl, s),
                        self.cp_ring(pl, s, r))
                    d_f, d_b = _path_comm(d, kind)
                    total += self.costs.first_dense * (counts[K.F(j)] * (d_f - f)
                                                       + counts[K.B(j)] * (d_b - per_b))
                if kind == "shard":  # each chunk's first gather (+ last reduce-scatter), and
                    # the embedding's and output layer's (costs.CostModel.virtual_stage_ms)
                    first, last = j == 0, j == sh.num_virtual - 1
                    total += counts[K.F(j)] * (lt.shard_fill_fwd_ms + (first + last)
                                               * lt.shard_edge_fwd_ms)
                    total += counts[K.B(j)] * (lt.shard_fill_bwd_ms + first
                                               * lt.shard_edge_bwd_ms + last
                                               * lt.shard_head_bwd_ms)
        return float(total)

    def estimate(self, pl: Placement) -> Estimate:
        sh, K, c = self.shape, self.kinds, self.cluster
        validate_placement(c, sh, pl)
        tails, parts = self.tails(pl)
        durs = [self.replica_durations(pl, r, tails) for r in range(sh.cols)]
        # columns on equal links have equal durations: one longest path per distinct vector
        by_bytes: dict[bytes, float] = {}
        lengths = []
        for d in durs:
            key = d.tobytes()
            if key not in by_bytes:
                by_bytes[key] = self.cs.longest_path(d)
            lengths.append(by_bytes[key])
        worst = int(np.argmax(lengths))
        length, counts, path = self.cs.critical_path(durs[worst])
        dw = durs[worst]
        contrib = counts * dw
        compute = float(contrib[:2 * K.V].sum())
        p2p = float(contrib[2 * K.V:2 * K.V + 2 * sh.pp].sum())
        tail = float(contrib[2 * K.V + 2 * sh.pp:].sum())
        tail_stage = int(np.argmax(counts[2 * K.V + 2 * sh.pp:]))
        sync_exposed = parts[tail_stage][1]
        opt = parts[tail_stage][2]
        tied = float(counts[K.tail(0)] + counts[K.tail(sh.pp - 1)]) * self.tied_ms(pl, worst)
        # ideal compute of the slowest stage: every micro-batch's F and B, no waiting
        stage_work = []
        stages = []
        for s in range(sh.pp):
            f = max(sum(d[K.F(ch * sh.pp + s)] for ch in range(sh.chunks)) for d in durs)
            b = max(sum(d[K.B(ch * sh.pp + s)] for ch in range(sh.chunks)) for d in durs)
            stage_work.append(self.m * (f + b))
            limit = stage_limit_gib(c, pl, s)
            stages.append(StageReport(s, sh.stage_layers(s), f, b, parts[s][0], parts[s][1],
                                      parts[s][2], self.memory[s], limit, sum(
                                          self.full_layers[s::sh.pp])))
        hops = []
        for h in range(sh.pp if sh.chunks > 1 else sh.pp - 1):
            hops.append((max(d[K.xf(h)] for d in durs), max(d[K.xb(h)] for d in durs)))
        comm_part = {}
        # the exposed tensor-parallel collectives, the expert-parallel all-to-all and the
        # context-parallel K/V exchange on the critical path (inside each F and B), apart
        # from the compute
        for kind, key, on in (("tp", "tp_comm_ms", sh.tp > 1),
                              ("ep", "ep_alltoall_ms", sh.ep > 1),
                              ("cp", "cp_exchange_ms", sh.cp > 1),
                              ("shard", "shard_comm_ms", sh.zero >= 3)):
            if on:
                comm_part[key] = self.comm_on_path(pl, worst, counts, kind)
                compute -= comm_part[key]
        breakdown = {
            "compute_ms": compute,
            **comm_part,
            "pipeline_p2p_ms": p2p,
            "dp_sync_exposed_ms": sync_exposed,
            "optimizer_ms": opt,
            **({"tied_embedding_ms": tied} if self.costs.tied_grad_bytes else {}),
            "other_tail_ms": _residue_to_zero(tail - sync_exposed - opt - tied, length),
            "bubble_ms": _residue_to_zero(float(length - max(stage_work) - tail), length),
        }
        tokens = self.job.global_batch * self.job.seq_length
        secs = length / 1e3
        model_flops, extra, causal_saving = self.model_flops()
        # MFU against the base precision's dense peak (bf16 for FP8 runs, as torchtitan did
        # through v0.2.2; since its #2451, 2026-02, it reports no MFU with FP8 at all; the
        # outputs say "of the 16-bit peak")
        peak = sum(nd.gpu.peak_flops(self.job.precision) * nd.num_gpus for nd in c.nodes)
        if not (math.isfinite(length) and length > 0 and all(
                math.isfinite(st.memory.total_gib) for st in stages)):
            # valid inputs always give finite times and memory; refuse rather than print NaN
            raise SpecError(f"the estimate is not finite (iteration {length!r} ms, memory "
                            f"{[st.memory.total_gib for st in stages]} GiB); the inputs are "
                            "out of the model's range", source="plan", field="estimate")
        return Estimate(
            iteration_ms=float(length), replica_ms=tuple(float(x) for x in lengths),
            stages=tuple(stages), hops_ms=tuple(hops), breakdown_ms=breakdown,
            tokens_per_s=tokens / secs, mfu=model_flops / secs / peak,
            hfu=(model_flops + extra) / secs / peak,
            mfu_causal=(model_flops - causal_saving) / secs / peak, num_microbatches=self.m,
            windowed=0 < self.model.sliding_window < self.job.seq_length,
            critical_path=[self.cs.label(i) for i in path])


def estimate(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, plan: Plan,
             options: Options | None = None) -> Estimate:
    """Score one plan with the cost model."""
    return Evaluator(model, job, cluster, plan.shape, options).estimate(plan.placement)


def default_layers(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, shape: Shape,
                   options: Options | None = None) -> tuple[int, ...]:
    """Balanced split over the p * v virtual stages that accounts for the embedding on the first
    and the output layer and loss on the last: layers go one at a time to the virtual stage with
    the least forward + backward time (ties to the later stage, as Megatron's uneven split keeps
    the first and last stages lighter). A mixture of experts' leading dense layers start in
    virtual stage 0, at their own time. Where the framework runs its own split whatever the
    plan says (DeepSpeed's pipeline engine: plan.framework_splits), its default one."""
    fixed = framework_splits(model, job, shape)
    if fixed:
        return next(iter(fixed))
    options = options or Options()
    V = shape.pp * shape.chunks
    costs = CostModel(model, job, cluster, shape, options)
    node = cluster.nodes[0]
    ring = node.ring_gb_per_s(tuple(range(min(shape.tp, node.num_gpus))))
    lt = costs.layer_times(node.gpu, ring)
    per = lt.fwd_ms + lt.bwd_ms
    load = [0.0] * V
    load[0] += lt.emb_fwd_ms + lt.emb_bwd_ms
    load[-1] += lt.head_fwd_ms + lt.head_bwd_ms
    layers = [0] * V
    kd = model.first_dense_layers
    if kd:
        f0, b0 = costs.virtual_stage_ms(node.gpu, ring, 0, kd)
        layers[0], load[0] = kd, f0 + b0
    # empty stages first (the later first), then the least loaded (ties: the later)
    first = min(model.num_layers - kd, V - (1 if kd else 0))
    for j in range(V - 1, V - 1 - first, -1):
        layers[j] += 1
        load[j] += per
    heap = [(load[i] + per, -i) for i in range(V) if layers[i]]
    heapq.heapify(heap)
    for _ in range(model.num_layers - kd - first):
        _key, neg = heapq.heappop(heap)
        j = -neg
        layers[j] += 1
        load[j] += per
        heapq.heappush(heap, (load[j] + per, -j))
    return tuple(layers)


def make_plan(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, *, tp: int, pp: int,
              dp: int | None = None, cp: int = 1, cp_alltoall: bool = False, ep: int = 1,
              etp: int = 0,
              micro_batch: int = 1,
              schedule: str = "1f1b",
              chunks: int = 1, mb_group: int = 0, layers: tuple[int, ...] | None = None,
              recompute: str = "none",
              sequence_parallel: bool = False, distributed_optimizer: bool | None = None,
              zero: int | None = None, shard_size: int = 0,
              fp8: bool | None = None, tp_comm_overlap: bool = False,
              overlap_grad_reduce: bool | None = None, overlap_param_gather: bool = False,
              ep_comm_overlap: bool = False,
              placement: Placement | None = None, options: Options | None = None) -> Plan:
    """A plan with defaults filled in: DP from the GPU count, the balanced layer split,
    Megatron-LM's placement; the distributed optimizer and FP8 as the job fixes them; the
    gradient-reduce overlap (None) as the framework runs it without being asked (off, but on
    under Megatron-FSDP's ZeRO-2: plan.fsdp_overlaps_grads)."""
    for f, val in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise SpecError(f"must be a positive integer, got {val!r}", source="plan", field=f)
    if dp is None:
        if cluster.num_gpus % (tp * pp * cp):
            # DP is derived only where it is whole (a floor had reported a DP nobody gave)
            names = "TP x PP" + (" x CP" if cp > 1 else "")
            vals = f"{tp}x{pp}" + (f"x{cp}" if cp > 1 else "")
            raise SpecError(f"{names} = {vals} = {tp * pp * cp} does not divide the "
                            f"{cluster.num_gpus} GPUs, so no data-parallel degree fills the "
                            "cluster; choose degrees whose product divides it",
                            source="plan", field="tp/pp/dp/cp")
        dp = max(1, cluster.num_gpus // (tp * pp * cp))
    if zero is None:  # explicit stage, else the distributed-optimizer flag, else the job's,
        # else the framework's least (DeepSpeed's bf16 runs as priced from ZeRO-1 on:
        # plan.deepspeed_problem)
        zero = (int(distributed_optimizer) if distributed_optimizer is not None
                else (job.zero if job.zero is not None else least_zero(job)))
    if fp8 is None:
        fp8 = bool(job.fp8)
    if overlap_grad_reduce is None:
        overlap_grad_reduce = fsdp_overlaps_grads(job, zero, dp * cp)
    shape = Shape(tp=tp, pp=pp, dp=dp, cp=cp, cp_alltoall=cp_alltoall, ep=ep, etp=etp,
                  micro_batch=micro_batch, schedule=schedule,
                  chunks=chunks, mb_group=mb_group, layers=(), recompute=recompute,
                  sequence_parallel=sequence_parallel, zero=zero, shard_size=shard_size,
                  fp8=fp8,
                  tp_comm_overlap=tp_comm_overlap, overlap_grad_reduce=overlap_grad_reduce,
                  overlap_param_gather=overlap_param_gather, ep_comm_overlap=ep_comm_overlap)
    if layers is None:
        validate_shape(model, job, cluster, shape, check_layers=False)
        layers = default_layers(model, job, cluster, shape, options)
    shape = replace(shape, layers=tuple(layers))
    validate_shape(model, job, cluster, shape)
    if job.fp8_param_gather and not fp8_params_apply(job, shape):
        # one plan, given with FP8 weights asked for: they must apply (a search instead
        # applies them to the plans with FP8 and the distributed optimizer only)
        raise SpecError("FP8 weights need FP8 linear layers and the distributed optimizer "
                        "(ZeRO 1 or 2) in the plan; drop it or plan both",
                        source=job.source, field="fp8_param_gather")
    if placement is None:
        placement = megatron_placement(cluster, tp, pp, dp * cp)
    return Plan(shape, placement)
