"""The cluster as measured: nodes, GPU types, intra-node links and an inter-node matrix.

Bandwidth convention (used by every formula in the cost model):
- `inter_gb_per_s[n][m]` is what one GPU-to-GPU stream from node n to node m delivers, in GB/s,
  as nccl-tests `sendrecv_perf` between one GPU on each node measures it. Every GPU is assumed
  to have its own NIC share (rail-optimized DGX-style nodes), so concurrent streams from
  different GPUs of a node do not share it. The matrix may be asymmetric; the diagonal is unused.
- `intra_gb_per_s` is one direction of one GPU's intra-node link (NVLink/NVSwitch) as measured;
  `intra_matrix_gb_per_s`, when given, is GPU-by-GPU for non-uniform nodes (DGX-1, PCIe).
- `latency_us` is the per-message latency added to every transfer between nodes;
  `intra_latency_us` the per-step latency of a collective inside a node (NVLink/NVSwitch).

Cluster files, presets and synthetic clusters are built in `formats/clusters.py`.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .errors import SpecError
from .specs import GPUSpec
from .topology import best_ring_gb_per_s

# one step of a ring collective inside an NVLink node (the cost model charges 2 (n - 1) steps
# per all-reduce over n GPUs, n - 1 per all-gather or reduce-scatter): the preset of
# ClusterSpec.intra_latency_us. NCCL's own tuning model (NVIDIA/nccl src/graph/tuning.cc:
# baseLat and hwLat, ring, Simple protocol, NVLink) charges 8.4 us once plus 3.4 us a step
# (56 us for an all-reduce over 8 GPUs, against 140 us here). 10 us a step is the assumption
# A100's curve was fitted with (bench/fit_compute.py), so it stays the preset; a cluster file,
# `cluster import --intra-allreduce` (measured) or a calibration profile replaces it.
INTRA_LATENCY_US = 10.0


def check_unique_hosts(names: list[str], src: str, fld: str) -> None:
    """Node names name machines: each once, and host names are case-insensitive (RFC 4343),
    so two that differ only in case are one machine, which a hostfile would list twice."""
    dup = sorted({x for x in names if names.count(x) > 1})
    if dup:
        raise SpecError(f"duplicated node name(s) {', '.join(dup)}; names must be unique",
                        source=src, field=fld)
    low: dict[str, str] = {}
    for x in names:
        if low.setdefault(str(x).lower(), x) != x:
            raise SpecError(f"node names {low[str(x).lower()]} and {x} differ only in case; "
                            "host names are case-insensitive, so they name one machine: give "
                            "each node one name", source=src, field=fld)


def _strongly_connected(adj: np.ndarray) -> bool:
    """Every node reaches node 0 and node 0 reaches every node along adj's edges."""
    for a in (adj, adj.T):
        seen = np.zeros(len(a), dtype=bool)
        seen[0] = True
        frontier = seen.copy()
        while frontier.any():
            nxt = a[frontier].any(axis=0) & ~seen
            seen |= nxt
            frontier = nxt
        if not seen.all():
            return False
    return True


@dataclass(frozen=True, eq=False)
class NodeSpec:
    name: str
    gpu: GPUSpec
    num_gpus: int
    intra_gb_per_s: float
    intra_matrix_gb_per_s: np.ndarray | None = None  # num_gpus x num_gpus, optional

    def __post_init__(self):
        # a matrix with every GPU pair at the node's rate (an NVSwitch node: the dgx-h100
        # topology) is that rate: kept, every search took the node for one whose rings depend
        # on which GPUs, and lost the exact method (`ClusterSpec.gpu_specific_links`)
        m = self.intra_matrix_gb_per_s
        if m is not None and getattr(m, "ndim", 0) == 2 and m.shape[0] > 1:
            off = np.asarray(m, dtype=float)[~np.eye(m.shape[0], dtype=bool)]
            rate = float(self.intra_gb_per_s)
            if np.all(np.abs(off - rate) <= 1e-9 * max(rate, 1.0)):
                object.__setattr__(self, "intra_matrix_gb_per_s", None)

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


# Sane upper bounds, with their reasons: the node-by-node matrix grows with the square of the
# node count (4,096 nodes: 128 MiB); no server holds more than 128 GPUs in one NVLink domain
# that this model treats as one node; 1e12 GB/s is an idealized link for experiments (no
# communication cost), anything beyond is a unit error; below 1 MB/s (8 Mbit/s, a hundredth
# of the slowest Ethernet NCCL falls back to) a stream is a link that is down, not slow; a
# latency above 1 s per message is a measurement error.
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 128
MAX_LINK_GB_PER_S = 1e12
MIN_LINK_GB_PER_S = 1e-3
MAX_LATENCY_US = 1e6


# a node's name is its host's (RFC 1123 labels, '_' too, as Slurm and DNS-less clusters use):
# it goes into hostfiles ('name slots=N') and shell scripts, where anything else breaks them
# or runs as a command
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def check_name(name, what: str, src: str, fld: str, host: bool = False) -> None:
    """A name is a non-empty string without control characters (it ends up in hostfiles,
    shell scripts and TOML); a node's (`host`) is a host name (_HOST_NAME)."""
    if not isinstance(name, str) or not name.strip():
        raise SpecError(f"{what} must be a non-empty string, got {name!r}", source=src,
                        field=fld)
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise SpecError(f"{what} {name!r} holds a control character (a newline, tab, ...); "
                        "use a plain name", source=src, field=fld)
    if host and not _HOST_NAME.fullmatch(name):
        raise SpecError(f"{what} {name!r} is not a host name (letters, digits, '.', '-', '_'; "
                        "a node is named as its host in hostfiles and launch scripts): use "
                        "its host name", source=src, field=fld)


@dataclass(frozen=True, eq=False)
class ClusterSpec:
    name: str
    nodes: tuple[NodeSpec, ...]
    inter_gb_per_s: np.ndarray
    latency_us: float = 5.0
    source: str = "cluster"
    intra_latency_us: float = INTRA_LATENCY_US

    def __post_init__(self):
        n = len(self.nodes)
        src = self.source
        if n == 0:
            raise SpecError("no nodes; add [[nodes]] entries", source=src, field="nodes")
        if n > MAX_NODES:
            raise SpecError(f"{n} nodes; at most {MAX_NODES} are supported (the node-by-node "
                            "matrix grows with the square)", source=src, field="nodes")
        check_name(self.name, "the cluster name", src, "name")
        for nd in self.nodes:
            check_name(nd.name, "a node name", src, "nodes.name", host=True)
        names = [nd.name for nd in self.nodes]
        check_unique_hosts(names, src, "nodes.name")
        # one GPU type per name: the cost model keys its per-GPU caches by the name
        # (costs.CostModel), so two different specs under one name would share their times
        seen: dict = {}
        for nd in self.nodes:
            first = seen.setdefault(nd.gpu.name, nd.gpu)
            if first is not nd.gpu and first != nd.gpu:
                raise SpecError(f"two different GPU specs are both named {nd.gpu.name!r} (node "
                                f"{nd.name}); give each its own name", source=src,
                                field="nodes.gpu")
        m = self.inter_gb_per_s
        if m.shape != (n, n):
            raise SpecError(f"matrix is {m.shape[0]}x{m.shape[1] if m.ndim > 1 else '?'} but "
                            f"there are {n} nodes; give one row and column per node",
                            source=src, field="inter.gb_per_s")
        off = ~np.eye(n, dtype=bool)
        bad = off & ~(np.isfinite(m) & (m >= MIN_LINK_GB_PER_S) & (m <= MAX_LINK_GB_PER_S))
        if bad.any():
            i, j = map(int, np.argwhere(bad)[0])
            raise SpecError(f"bandwidth from {names[i]} to {names[j]} is {float(m[i, j])!r}; "
                            f"every off-diagonal entry must be {MIN_LINK_GB_PER_S:g} to "
                            f"{MAX_LINK_GB_PER_S:g} GB/s (below, the link is down: re-measure "
                            "it or leave the node out)", source=src, field="inter.gb_per_s")
        for fld in ("latency_us", "intra_latency_us"):
            lat = getattr(self, fld)
            if isinstance(lat, bool) or not (0 <= lat <= MAX_LATENCY_US):
                raise SpecError(f"is {lat!r}; give 0 to {MAX_LATENCY_US:g} microseconds",
                                source=src, field=fld)
        for nd in self.nodes:
            g = nd.num_gpus
            if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or not (
                    0 < g <= MAX_GPUS_PER_NODE):
                raise SpecError(f"node {nd.name}: gpus is {g!r}; give 1 to "
                                f"{MAX_GPUS_PER_NODE}", source=src, field="nodes.gpus")
            b = nd.intra_gb_per_s
            if isinstance(b, bool) or not (MIN_LINK_GB_PER_S <= b <= MAX_LINK_GB_PER_S):
                raise SpecError(f"node {nd.name}: intra_gb_per_s is {b!r}; give "
                                f"{MIN_LINK_GB_PER_S:g} to {MAX_LINK_GB_PER_S:g} GB/s",
                                source=src, field="nodes.intra_gb_per_s")
            im = nd.intra_matrix_gb_per_s
            if im is not None:
                offg = ~np.eye(g, dtype=bool)
                if im.shape != (g, g) or (offg & ~(np.isfinite(im) & (
                        im >= MIN_LINK_GB_PER_S) & (im <= MAX_LINK_GB_PER_S))).any():
                    raise SpecError(f"node {nd.name}: the GPU-by-GPU matrix must be {g}x{g} "
                                    f"with {MIN_LINK_GB_PER_S:g} to {MAX_LINK_GB_PER_S:g} GB/s "
                                    "off the diagonal", source=src,
                                    field="nodes.intra_matrix_gb_per_s")

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
    def node_kinds(self) -> tuple[NodeSpec, ...]:
        """One node of each kind (GPU type, GPU count, intra-node links), in first-seen order:
        what a maximum or minimum of an intra-node quantity over the nodes needs to visit
        (1024 equal nodes: one)."""
        return self._kinds[0]

    @cached_property
    def gpu_types(self) -> tuple:
        """Each GPU type of the cluster once (GPUSpec, by name), in first-seen order."""
        return tuple({nd.gpu.name: nd.gpu for nd in self.node_kinds}.values())

    @cached_property
    def node_kind_index(self) -> np.ndarray:
        """Per node, its kind's index in `node_kinds`."""
        return self._kinds[1]

    @cached_property
    def _kinds(self) -> tuple[tuple[NodeSpec, ...], np.ndarray]:
        first: dict = {}
        index = []
        for nd in self.nodes:
            m = nd.intra_matrix_gb_per_s
            key = (id(nd.gpu), nd.num_gpus, nd.intra_gb_per_s, None if m is None else m.tobytes())
            index.append(first.setdefault(key, (len(first), nd))[0])
        return tuple(nd for _i, nd in first.values()), np.array(index, dtype=np.int64)

    @cached_property
    def max_intra_link_gb_per_s(self) -> float:
        """The fastest one-direction GPU-to-GPU link inside any node (0 where no node has two
        GPUs); one node of each kind is enough to look at (`node_kinds`)."""
        best = 0.0
        for nd in self.node_kinds:
            if nd.num_gpus < 2:
                continue
            m = nd.intra_matrix_gb_per_s
            if m is None:
                best = max(best, nd.intra_gb_per_s)
            else:
                off = ~np.eye(nd.num_gpus, dtype=bool)
                best = max(best, float(np.asarray(m, dtype=float)[off].max()))
        return best

    @cached_property
    def inbound_max_gb_per_s(self) -> np.ndarray:
        """Per receiving node m, the fastest stream into it from another node: max over n != m
        of inter_gb_per_s[n][m] (0 for a single node)."""
        n = self.num_nodes
        if n < 2:
            return np.zeros(n)
        m = np.array(self.inter_gb_per_s, dtype=float, copy=True)
        np.fill_diagonal(m, -np.inf)
        return m.max(axis=0)

    @cached_property
    def all_node_ring_max_gb_per_s(self) -> float:
        """An upper bound on the slowest inter-node stream of any ring through all nodes: the
        largest t for which the streams of at least t GB/s connect the nodes strongly (a ring
        through all nodes is a directed cycle: it leaves and enters every node, so it is
        strongly connected). inf for a single node. A degraded NIC shows here: every ring
        through its node uses one of its slow links."""
        n = self.num_nodes
        if n < 2:
            return float("inf")
        bw = np.asarray(self.inter_gb_per_s, dtype=float)
        vals = np.unique(bw[~np.eye(n, dtype=bool)])
        lo, hi = 0, len(vals) - 1  # vals[lo] always connects (every link), find the largest
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _strongly_connected(bw >= vals[mid]):
                lo = mid
            else:
                hi = mid - 1
        return float(vals[lo])

    @cached_property
    def gpu_specific_links(self) -> bool:
        """Some node's intra-node links differ by GPU pair (an intra-node matrix is given):
        rings and transfers inside it then depend on which GPUs, not only how many."""
        return any(nd.intra_matrix_gb_per_s is not None for nd in self.nodes)

    @cached_property
    def homogeneous(self) -> bool:
        return len({nd.gpu.name for nd in self.nodes}) == 1 and self.gpus_per_node is not None

    def uniform(self, rel_tol: float = 0.0) -> bool:
        """Every node interchangeable: one GPU type and count, the same uniform intra-node
        link, and every inter-node stream within `rel_tol` (relative) of every other. Then
        every permutation of nodes over a layout's slots costs the same: no placement search
        is needed."""
        if not self.homogeneous or self.gpu_specific_links:
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
