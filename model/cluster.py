"""The cluster as measured: nodes, GPU types, intra-node links and an inter-node matrix.

Bandwidth convention (used by every formula in the cost model):
- `inter_gb_per_s[n][m]` is what one GPU-to-GPU stream from node n to node m delivers, in GB/s,
  as nccl-tests `sendrecv_perf` between one GPU on each node measures it. Every GPU is assumed
  to have its own NIC share (rail-optimized DGX-style nodes), so concurrent streams from
  different GPUs of a node do not share it. The matrix may be asymmetric; the diagonal is unused.
- `intra_gb_per_s` is one direction of one GPU's intra-node link (NVLink/NVSwitch) as measured;
  `intra_matrix_gb_per_s`, when given, is GPU-by-GPU for non-uniform nodes (DGX-1, PCIe).
- `latency_us` is the per-message latency added to every transfer.

Cluster files, presets and synthetic clusters are built in `formats/clusters.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .errors import SpecError
from .specs import GPUSpec
from .topology import best_ring_gb_per_s


@dataclass(frozen=True, eq=False)
class NodeSpec:
    name: str
    gpu: GPUSpec
    num_gpus: int
    intra_gb_per_s: float
    intra_matrix_gb_per_s: np.ndarray | None = None  # num_gpus x num_gpus, optional

    def link_gb_per_s(self, a: int, b: int) -> float:
        """One direction from local GPU a to local GPU b."""
        if self.intra_matrix_gb_per_s is None:
            return self.intra_gb_per_s
        return float(self.intra_matrix_gb_per_s[a, b])

    def ring_gb_per_s(self, gpus: tuple[int, ...]) -> float:
        """Bandwidth of the best ring through `gpus`: its slowest link (NCCL searches rings)."""
        if len(gpus) <= 1:
            return float("inf")
        if self.intra_matrix_gb_per_s is None:
            return self.intra_gb_per_s
        return best_ring_gb_per_s(self.intra_matrix_gb_per_s, tuple(gpus))


@dataclass(frozen=True, eq=False)
class ClusterSpec:
    name: str
    nodes: tuple[NodeSpec, ...]
    inter_gb_per_s: np.ndarray
    latency_us: float = 5.0
    source: str = "cluster"

    def __post_init__(self):
        n = len(self.nodes)
        src = self.source
        if n == 0:
            raise SpecError("no nodes; add [[nodes]] entries", source=src, field="nodes")
        names = [nd.name for nd in self.nodes]
        dup = sorted({x for x in names if names.count(x) > 1})
        if dup:
            raise SpecError(f"duplicated node names {dup}; names must be unique", source=src,
                            field="nodes.name")
        m = self.inter_gb_per_s
        if m.shape != (n, n):
            raise SpecError(f"matrix is {m.shape[0]}x{m.shape[1] if m.ndim > 1 else '?'} but "
                            f"there are {n} nodes; give one row and column per node",
                            source=src, field="inter.gb_per_s")
        off = ~np.eye(n, dtype=bool)
        bad = off & ~(np.isfinite(m) & (m > 0))
        if bad.any():
            i, j = map(int, np.argwhere(bad)[0])
            raise SpecError(f"bandwidth from {names[i]} to {names[j]} is {m[i, j]!r}; every "
                            "off-diagonal entry must be a positive number of GB/s",
                            source=src, field="inter.gb_per_s")
        if not (self.latency_us >= 0):
            raise SpecError("must be >= 0 microseconds", source=src, field="latency_us")
        for nd in self.nodes:
            if nd.num_gpus <= 0:
                raise SpecError(f"node {nd.name}: gpus must be positive", source=src,
                                field="nodes.gpus")
            if not (nd.intra_gb_per_s > 0):
                raise SpecError(f"node {nd.name}: intra_gb_per_s must be a positive number "
                                "of GB/s", source=src, field="nodes.intra_gb_per_s")

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @cached_property
    def num_gpus(self) -> int:
        return sum(nd.num_gpus for nd in self.nodes)

    @cached_property
    def gpus_per_node(self) -> int | None:
        """GPUs per node if every node has the same count, else None."""
        counts = {nd.num_gpus for nd in self.nodes}
        return counts.pop() if len(counts) == 1 else None

    @cached_property
    def homogeneous(self) -> bool:
        return len({nd.gpu.name for nd in self.nodes}) == 1 and self.gpus_per_node is not None

    def uniform(self, rel_tol: float = 0.0) -> bool:
        """Every node interchangeable: one GPU type and count, the same uniform intra-node
        link, and every inter-node stream within `rel_tol` (relative) of every other. Then
        every permutation of nodes over a layout's slots costs the same: no placement search
        is needed."""
        if not self.homogeneous or any(nd.intra_matrix_gb_per_s is not None
                                       for nd in self.nodes):
            return False
        if len({nd.intra_gb_per_s for nd in self.nodes}) != 1:
            return False
        if self.num_nodes < 2:
            return True
        off = self.inter_gb_per_s[~np.eye(self.num_nodes, dtype=bool)]
        return float(off.max() - off.min()) <= rel_tol * float(off.min())

    def node_index(self, name: str) -> int:
        for i, nd in enumerate(self.nodes):
            if nd.name == name:
                return i
        raise SpecError(f"unknown node '{name}'", source=self.source, field="nodes")

    def p2p_gb_per_s(self, node_a: int, gpu_a: int, node_b: int, gpu_b: int) -> float:
        """Point-to-point bandwidth of one stream between two GPUs, in GB/s."""
        if node_a == node_b:
            return self.nodes[node_a].link_gb_per_s(gpu_a, gpu_b)
        return float(self.inter_gb_per_s[node_a, node_b])
