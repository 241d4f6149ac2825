"""Intra-node topology presets: GPU-by-GPU bandwidth matrices for node types, read from TOML.

A preset is a TOML file in `data/topologies/` (or any .toml path) with `name`, `description`,
`source` (the citation), `gpus`, and exactly one of:

- `uniform_gb_per_s` (+ optional `efficiency`): every pair gets the same bandwidth (NVSwitch);
- `link_gb_per_s` + `nvlinks` (per-pair link counts) + `other_gb_per_s` (+ `efficiency`,
  optional `links_per_gpu` to check the counts): pair bandwidth = links x link_gb_per_s x
  efficiency, or other_gb_per_s where a pair has no link (DGX-1 hybrid cube-mesh);
- `matrix_gb_per_s`: the matrix itself, as measured (e.g. CUDA's p2pBandwidthLatencyTest).

All figures are one direction of one GPU-to-GPU stream, in GB/s (1e9 bytes/s), like
`NodeSpec.intra_matrix_gb_per_s`. A cluster file's `[[nodes]]` entry selects a preset with
`intra_topology = "dgx1-v100"` (see formats/clusters.py). How the cost model uses the
matrix (best rings, tensor-parallel groups) is in model/topology.py.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from model.cluster import ClusterSpec, NodeSpec
from model.cluster import MAX_GPUS_PER_NODE, MAX_LINK_GB_PER_S
from model.errors import SpecError
from model.topology import best_ring_gb_per_s

from . import presets
from .reading import read_text


@dataclass(frozen=True, eq=False)
class Topology:
    name: str
    description: str
    source: str
    num_gpus: int
    matrix_gb_per_s: np.ndarray  # num_gpus x num_gpus, diagonal 0

    @property
    def ring_gb_per_s(self) -> float:
        """Best ring through all GPUs: its slowest link (what a full-node TP group gets)."""
        if self.num_gpus <= 1:
            return float(self.matrix_gb_per_s.max()) if self.matrix_gb_per_s.size else 0.0
        return best_ring_gb_per_s(self.matrix_gb_per_s, tuple(range(self.num_gpus)))


def topology_names() -> list[str]:
    return sorted(p.stem for p in presets.data_path("topologies").glob("*.toml"))


def load_topology(name_or_path: str) -> Topology:
    """A preset name (data/topologies/<name>.toml) or a .toml path."""
    p = Path(name_or_path)
    if p.suffix == ".toml":
        return _load_file(str(p))
    known = topology_names()
    if name_or_path not in known:
        raise SpecError(f"unknown intra-node topology '{name_or_path}'; known: "
                        f"{', '.join(known)} (or give a .toml file)", field="intra_topology")
    return _load_file(str(presets.data_path("topologies", f"{name_or_path}.toml")))


@lru_cache(maxsize=64)
def _load_file(path: str) -> Topology:
    src = path
    text = read_text(path, what="the topology file")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"not valid TOML ({e})", source=src) from None
    n = raw.get("gpus")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_GPUS_PER_NODE:
        raise SpecError(f"must be an integer from 1 to {MAX_GPUS_PER_NODE}, got "
                        f"{str(n)[:40]}", source=src, field="gpus")
    kinds = [k for k in ("uniform_gb_per_s", "nvlinks", "matrix_gb_per_s") if k in raw]
    if len(kinds) != 1:
        raise SpecError("give exactly one of uniform_gb_per_s, nvlinks (+ link_gb_per_s, "
                        f"other_gb_per_s) or matrix_gb_per_s; found {kinds or 'none'}",
                        source=src, field="gpus")
    eff = raw.get("efficiency", 1.0)
    if isinstance(eff, bool) or not isinstance(eff, (int, float)) or not 0 < eff <= 1:
        raise SpecError(f"must be in (0, 1], got {eff!r}", source=src, field="efficiency")
    kind = kinds[0]
    if kind == "uniform_gb_per_s":
        bw = _positive(raw, "uniform_gb_per_s", src)
        m = np.full((n, n), bw * eff)
    elif kind == "nvlinks":
        link = _positive(raw, "link_gb_per_s", src)
        other = _positive(raw, "other_gb_per_s", src)
        counts = _square(raw["nvlinks"], n, src, "nvlinks", allow_zero=True)
        if (counts != counts.T).any():
            i, j = map(int, np.argwhere(counts != counts.T)[0])
            raise SpecError(f"links [{i}][{j}] and [{j}][{i}] differ; a link joins both GPUs",
                            source=src, field="nvlinks")
        if (counts != np.round(counts)).any():
            raise SpecError("link counts must be integers", source=src, field="nvlinks")
        per_gpu = raw.get("links_per_gpu")
        if per_gpu is not None and (isinstance(per_gpu, bool) or not isinstance(per_gpu, int)):
            raise SpecError(f"must be an integer, got {str(per_gpu)[:40]}", source=src,
                            field="links_per_gpu")
        if per_gpu is not None:
            np.fill_diagonal(counts, 0)
            tot = counts.sum(axis=1)
            if (tot != per_gpu).any():
                g = int(np.argmax(tot != per_gpu))
                raise SpecError(f"GPU {g} has {int(tot[g])} links but links_per_gpu = "
                                f"{per_gpu}", source=src, field="nvlinks")
        # pair bandwidth = number of links x per-link bandwidth x achieved fraction
        # (NVLink links between a pair are aggregated; DGX-1V whitepaper, Sec. "NVLink").
        m = np.where(counts > 0, counts * link * eff, other)
    else:
        m = _square(raw["matrix_gb_per_s"], n, src, "matrix_gb_per_s") * eff
    m = np.array(m, dtype=float)
    np.fill_diagonal(m, 0.0)
    return Topology(name=str(raw.get("name", Path(path).stem)),
                    description=str(raw.get("description", "")),
                    source=str(raw.get("source", "")), num_gpus=n, matrix_gb_per_s=m)


def _positive(raw: dict, key: str, src: str) -> float:
    v = raw.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= MAX_LINK_GB_PER_S:
        raise SpecError(f"must be a positive number of GB/s, at most {MAX_LINK_GB_PER_S:g}, "
                        f"got {str(v)[:40]}", source=src, field=key)
    return float(v)


def _square(rows, n: int, src: str, fld: str, allow_zero: bool = False) -> np.ndarray:
    if not isinstance(rows, list) or len(rows) != n or any(
            not isinstance(r, list) or len(r) != n for r in rows):
        raise SpecError(f"must be a {n}x{n} list of rows (gpus = {n})", source=src, field=fld)
    try:
        m = np.array(rows, dtype=float)
    except (TypeError, ValueError):
        raise SpecError("entries must be numbers", source=src, field=fld) from None
    off = ~np.eye(n, dtype=bool)
    bad = off & ~(np.isfinite(m) & ((m >= 0) if allow_zero else (m > 0)))
    if bad.any():
        i, j = map(int, np.argwhere(bad)[0])
        need = "a number >= 0" if allow_zero else "a positive number of GB/s"
        raise SpecError(f"entry [{i}][{j}] is {m[i, j]!r}; must be {need}", source=src,
                        field=fld)
    return m


# ---------------------------------------------------------------------------------------------
# Applying a topology to nodes


def scaled_matrix(topo: Topology, ring_gb_per_s: float | None) -> tuple[float, np.ndarray]:
    """(best all-GPU ring, matrix) of the preset, its matrix scaled so that its best ring
    through all GPUs delivers `ring_gb_per_s` (a measured rate, e.g. a degraded NVLink) where
    one is given: every link in the same proportion, the preset's shape kept."""
    ring = topo.ring_gb_per_s
    if ring_gb_per_s is None or ring <= 0:
        return ring, topo.matrix_gb_per_s.copy()
    return float(ring_gb_per_s), topo.matrix_gb_per_s * (float(ring_gb_per_s) / ring)


def node_with_topology(node: NodeSpec, topo: Topology,
                       ring_gb_per_s: float | None = None) -> NodeSpec:
    """The node with the preset's matrix (scaled to `ring_gb_per_s`: scaled_matrix)."""
    if topo.num_gpus != node.num_gpus:
        raise SpecError(f"topology '{topo.name}' has {topo.num_gpus} GPUs but node "
                        f"{node.name} has {node.num_gpus}", field="intra_topology")
    ring, mat = scaled_matrix(topo, ring_gb_per_s)
    return dataclasses.replace(node, intra_gb_per_s=ring, intra_matrix_gb_per_s=mat)


def cluster_with_topology(c: ClusterSpec, name_or_path: str,
                          ring_gb_per_s: float | None = None) -> ClusterSpec:
    """The same cluster with every node's intra-node matrix taken from a topology preset
    (scaled to `ring_gb_per_s` where given: scaled_matrix)."""
    topo = load_topology(name_or_path)
    return dataclasses.replace(c, nodes=tuple(node_with_topology(nd, topo, ring_gb_per_s)
                                              for nd in c.nodes))
