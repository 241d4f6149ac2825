"""Per-operation times: compute, tensor-parallel collectives, pipeline transfers, gradient
synchronization and the optimizer step. All times are in milliseconds, sizes in bytes,
bandwidths in GB/s (1 GB = 1e9 bytes).

Collective formulas are the ring algorithm's (Thakur et al. 2005; NCCL's bus-bandwidth
definition in nccl-tests PERFORMANCE.md): all-reduce moves 2(n-1)/n of the buffer through the
slowest link of the ring, reduce-scatter and all-gather (n-1)/n.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cluster import ClusterSpec
from .plan import Shape
from .specs import GPUSpec, JobSpec, ModelSpec, Options

INTRA_LATENCY_US = 10.0  # one NCCL collective inside an NVLink node, small-message regime


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


def adam_bytes_per_param(job: JobSpec) -> int:
    """Bytes an element-wise Adam step reads and writes per parameter: the gradient, fp32
    master, m and v read and written back, the 16-bit weight written. Memory-bound, so time is
    bytes / HBM bandwidth. fp16 also copies fp16 grads into an fp32 buffer (read 2, write 4)."""
    b = job.grad_bytes + 12 + 12 + (job.weight_bytes if job.precision != "fp32" else 0)
    return b + (6 if job.precision == "fp16" else 0)


@dataclass(frozen=True)
class LayerTimes:
    """Per micro-batch, per transformer layer, on one GPU type and TP ring bandwidth (ms)."""

    fwd_ms: float
    bwd_ms: float  # includes recompute
    emb_fwd_ms: float  # embedding (first virtual stage), per micro-batch
    emb_bwd_ms: float
    head_fwd_ms: float  # final norm + output projection + loss (last virtual stage)
    head_bwd_ms: float


class CostModel:
    """Costs that depend on the shape but not on the placement (or only through the node's GPU
    type and the bandwidths given to each method). Shared by the estimator, the MILP and the
    annealer: every time any of them uses comes from here."""

    def __init__(self, model: ModelSpec, job: JobSpec, cluster: ClusterSpec, shape: Shape,
                 options: Options):
        self.model, self.job, self.cluster, self.shape, self.options = (
            model, job, cluster, shape, options)
        self.tokens = shape.micro_batch * job.seq_length  # tokens per micro-batch
        self.act_msg_bytes = self.tokens * model.hidden_size * job.activation_bytes
        self._layer_cache: dict = {}

    # -- compute -----------------------------------------------------------------------------

    def layer_times(self, gpu: GPUSpec, tp_ring_gb_per_s: float) -> LayerTimes:
        key = (gpu.name, tp_ring_gb_per_s)
        hit = self._layer_cache.get(key)
        if hit is not None:
            return hit
        m, job, sh, t = self.model, self.job, self.shape, self.shape.tp
        rate = gpu.peak_flops(job.precision) * gpu.efficiency / 1e3  # FLOP per ms
        T, s = self.tokens, job.seq_length
        f_comp = m.layer_flops_fwd(T, s) / t / rate
        # Megatron TP: two all-reduces per layer forward and two backward (Shoeybi et al. 2019
        # Fig. 3); with sequence parallelism, all-gather + reduce-scatter of the same volume
        # (Korthikanti et al. 2022 Sec. 4.2.2).
        comm = 2 * allreduce_ms(self.act_msg_bytes, t, tp_ring_gb_per_s, INTRA_LATENCY_US)
        fwd = f_comp + comm
        bwd = 2 * f_comp + comm  # backward: twice the forward FLOPs (Narayanan et al. eq. 3)
        if sh.recompute == "full":
            bwd += fwd  # the forward runs again, collectives included
        elif sh.recompute == "selective":
            bwd += m.attention_core_flops_fwd(T, s) / t / rate  # Korthikanti et al. Sec. 5
        emb_comm = allreduce_ms(self.act_msg_bytes, t, tp_ring_gb_per_s, INTRA_LATENCY_US)
        head_fwd = m.logits_flops_fwd(T) / t / rate + emb_comm / 2
        head_bwd = 2 * m.logits_flops_fwd(T) / t / rate + emb_comm / 2
        out = LayerTimes(fwd, bwd, emb_comm, 0.0, head_fwd, head_bwd)
        self._layer_cache[key] = out
        return out

    def virtual_stage_ms(self, gpu: GPUSpec, tp_ring_gb_per_s: float, j: int,
                         layers: int) -> tuple[float, float]:
        """Forward and backward time of virtual stage j holding `layers` layers."""
        lt = self.layer_times(gpu, tp_ring_gb_per_s)
        f, b = layers * lt.fwd_ms, layers * lt.bwd_ms
        if j == 0:
            f, b = f + lt.emb_fwd_ms, b + lt.emb_bwd_ms
        if j == self.shape.num_virtual - 1:
            f, b = f + lt.head_fwd_ms, b + lt.head_bwd_ms
        return f, b

    # -- pipeline transfers -------------------------------------------------------------------

    def hop_ms(self, link_gb_per_s: float, same_node: bool, recv_ring_gb_per_s: float) -> float:
        """One activation (or gradient) transfer between consecutive stages.

        Each tensor rank sends its 1/t slice (scatter/gather optimization, Narayanan et al. 2021
        Sec. 4.1; with sequence parallelism the tensor is already sliced) on its own link, so the
        slices travel in parallel; without sequence parallelism the receiver all-gathers them
        over NVLink.
        """
        t = self.shape.tp
        lat = INTRA_LATENCY_US if same_node else self.cluster.latency_us
        ms = lat / 1e3 + self.act_msg_bytes / t / (link_gb_per_s * 1e6)
        if t > 1 and not self.shape.sequence_parallel:
            ms += gather_ms(self.act_msg_bytes, t, recv_ring_gb_per_s, INTRA_LATENCY_US)
        return ms

    def node_hop_ms(self, a: int, b: int) -> float:
        """Transfer from a group on node a to a group on node b, default GPU layout."""
        c = self.cluster
        ring = c.nodes[b].ring_gb_per_s(tuple(range(self.shape.tp)))
        if a == b:
            return self.hop_ms(c.nodes[a].intra_gb_per_s, True, ring)
        return self.hop_ms(float(c.inter_gb_per_s[a, b]), False, ring)

    def hop_matrix_ms(self) -> np.ndarray:
        """`node_hop_ms(a, b)` for every pair of nodes at once (same formula, vectorized)."""
        c, t = self.cluster, self.shape.tp
        n = c.num_nodes
        ring = np.array([nd.ring_gb_per_s(tuple(range(min(t, nd.num_gpus))))
                         for nd in c.nodes])
        with np.errstate(divide="ignore"):
            out = c.latency_us / 1e3 + self.act_msg_bytes / t / (c.inter_gb_per_s * 1e6)
        if t > 1 and not self.shape.sequence_parallel:
            out = out + np.array([gather_ms(self.act_msg_bytes, t, r, INTRA_LATENCY_US)
                                  for r in ring])[None, :]
        for a in range(n):
            out[a, a] = self.node_hop_ms(a, a)
        return out

    # -- data parallel -------------------------------------------------------------------------

    def stage_params(self, stage: int, layers: tuple[int, ...] | None = None) -> float:
        """Parameters held by one GPU of `stage` (its TP shard)."""
        m, sh = self.model, self.shape
        layers = layers if layers is not None else sh.layers
        n = 0.0
        for c in range(sh.chunks):
            j = c * sh.pp + stage
            n += layers[j] * m.params_per_layer
            if j == 0:
                n += m.embedding_params
            if j == sh.num_virtual - 1:
                n += 2 * m.hidden_size  # final norm
                if not m.tied_embeddings or sh.pp > 1:
                    n += m.embedding_params  # output layer (a copy of the tied weight if PP > 1)
        return n / sh.tp

    def sync_bytes(self, params: float) -> tuple[float, float]:
        """(gradient bytes reduced, parameter bytes gathered) per GPU per iteration."""
        grad = params * self.job.grad_bytes
        gather = params * self.job.weight_bytes if self.shape.distributed_optimizer else 0.0
        return grad, gather

    def sync_ms(self, params: float, dp_ring_gb_per_s: float, inter_node: bool) -> float:
        """Gradient all-reduce (or reduce-scatter + parameter all-gather with the distributed
        optimizer, Rajbhandari et al. 2020 ZeRO-1) over the data-parallel ring."""
        d = self.shape.dp
        if d <= 1:
            return 0.0
        lat = self.cluster.latency_us if inter_node else INTRA_LATENCY_US
        grad, gather = self.sync_bytes(params)
        if self.shape.distributed_optimizer:
            return (gather_ms(grad, d, dp_ring_gb_per_s, lat)
                    + gather_ms(gather, d, dp_ring_gb_per_s, lat))
        return allreduce_ms(grad, d, dp_ring_gb_per_s, lat)

    def optimizer_ms(self, params: float, gpu: GPUSpec) -> float:
        """Adam step over this GPU's shard: memory-bound, bytes / HBM bandwidth."""
        shard = params / (self.shape.dp if self.shape.distributed_optimizer else 1)
        return shard * adam_bytes_per_param(self.job) / (gpu.hbm_gb_per_s * 1e6)


def dp_ring(cluster: ClusterSpec, members: list[tuple[int, int]]) -> tuple[float, bool]:
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
        k = min(len(v) for v in per_node.values())
        for i, n in enumerate(order):
            nxt = order[(i + 1) % len(order)]
            bw = min(bw, k * float(cluster.inter_gb_per_s[n, nxt]))
    return bw, len(order) > 1

