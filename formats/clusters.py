"""Every way to obtain a cluster spec: cluster TOML files (read and write), the presets in
data/clusters/, synthetic leaf/spine clusters and uniform clusters.

File format (TOML), nodes in matrix order (the bandwidth convention is model/cluster.py's):

    name = "my-cluster"
    latency_us = 5.0                  # per message between nodes
    intra_latency_us = 10.0           # optional: per step of a collective inside a node
    [[nodes]]
    name = "node00"
    gpu = "A100-80GB"
    gpus = 8
    intra_gb_per_s = 240.0            # or intra_topology = "<preset>" (formats/topologies.py)
                                      # or intra_matrix_gb_per_s = [[...], ...] (GPU by GPU)

A node's intra_gb_per_s is the best ring through all its GPUs: beside intra_topology it scales
the preset's matrix to that ring (a measured, e.g. degraded, NVLink); beside
intra_matrix_gb_per_s it may be left out, and where given must agree with the matrix.
    [inter]
    gb_per_s = [[0.0, 23.1, ...], ...]
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from model.cluster import (INTRA_LATENCY_US, MAX_GPUS_PER_NODE, MAX_NODES, ClusterSpec,
                           NodeSpec, check_name)
from model.errors import SpecError

from . import presets
from .reading import finite_number as _number, read_text, unknown_keys


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read a cluster TOML; every problem names the file and field."""
    path = Path(path)
    src = str(path)
    text = read_text(path, what="the cluster file")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"not valid TOML ({e})", source=src) from None
    return cluster_from_dict(raw, src)


def cluster_from_dict(raw: dict, src: str) -> ClusterSpec:
    unknown_keys(raw, ("name", "latency_us", "intra_latency_us", "nodes", "inter"), src)
    nodes_raw = raw.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise SpecError("missing; add one [[nodes]] table per node", source=src, field="nodes")
    if len(nodes_raw) > MAX_NODES:
        raise SpecError(f"{len(nodes_raw)} nodes; at most {MAX_NODES} are supported (the "
                        "node-by-node matrix grows with the square)", source=src, field="nodes")
    nodes = []
    for i, nd in enumerate(nodes_raw):
        where = f"nodes[{i}]"
        if not isinstance(nd, dict):
            raise SpecError(f"must be a table ([[nodes]] with name, gpu, gpus, "
                            f"intra_gb_per_s), got {nd!r}", source=src, field=where)
        unknown_keys(nd, ("name", "gpu", "gpus", "intra_gb_per_s", "intra_topology",
                          "intra_matrix_gb_per_s"), src, where)
        topo_name = nd.get("intra_topology")
        for key in ("name", "gpu", "gpus", "intra_gb_per_s"):
            if key not in nd and not (key == "intra_gb_per_s" and (
                    topo_name is not None or "intra_matrix_gb_per_s" in nd)):
                raise SpecError("missing", source=src, field=f"{where}.{key}")
        if not isinstance(nd["gpu"], str):
            raise SpecError(f"must be a GPU preset name, got {nd['gpu']!r}", source=src,
                            field=f"{where}.gpu")
        check_name(nd["name"], "the node name", src, f"{where}.name", host=True)
        try:
            gpu = presets.gpu(nd["gpu"])
        except SpecError as e:
            raise SpecError(e.problem, source=src, field=f"{where}.gpu") from None
        gpus = nd["gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not (
                0 < gpus <= MAX_GPUS_PER_NODE):
            raise SpecError(f"must be an integer from 1 to {MAX_GPUS_PER_NODE}, got {gpus!r}",
                            source=src, field=f"{where}.gpus")
        intra = nd.get("intra_gb_per_s")
        if intra is not None:
            _number(intra, src, f"{where}.intra_gb_per_s", "a positive number of GB/s")
        if topo_name is not None:
            # intra_topology = "<preset>" (data/topologies/) fills the GPU-by-GPU matrix,
            # scaled so that its best ring over all GPUs is intra_gb_per_s where given
            intra, mat = _topology_matrix(nd, topo_name, gpus, src, where)
        elif "intra_matrix_gb_per_s" in nd:
            mat = _matrix(nd["intra_matrix_gb_per_s"], gpus, src,
                          f"{where}.intra_matrix_gb_per_s",
                          f"GPU of the node (its 'gpus': {gpus})")
            intra = _matrix_ring(mat, intra, src, where)
        else:
            mat = None
        _number(intra, src, f"{where}.intra_gb_per_s", "a positive number of GB/s")
        nodes.append(NodeSpec(str(nd["name"]), gpu, gpus, float(intra), mat))
    inter = raw.get("inter", {})
    if not isinstance(inter, dict) or "gb_per_s" not in inter:
        raise SpecError("missing; give the node-by-node matrix in GB/s", source=src,
                        field="inter.gb_per_s")
    unknown_keys(inter, ("gb_per_s",), src, "inter")
    mat = _matrix(inter["gb_per_s"], len(nodes), src, "inter.gb_per_s")
    # ranges and names are ClusterSpec's to check; here only that the types are right
    lat = _number(raw.get("latency_us", 5.0), src, "latency_us", "a number >= 0")
    intra_lat = _number(raw.get("intra_latency_us", INTRA_LATENCY_US), src, "intra_latency_us",
                        "a number >= 0")
    return ClusterSpec(name=raw.get("name", Path(src).stem), nodes=tuple(nodes),
                       inter_gb_per_s=mat, latency_us=lat, source=src,
                       intra_latency_us=intra_lat)


def _topology_matrix(nd: dict, topo_name, gpus: int, src: str, where: str):
    """(intra_gb_per_s, matrix) for a node that names an intra_topology preset."""
    from .topologies import load_topology

    fld = f"{where}.intra_topology"
    if "intra_matrix_gb_per_s" in nd:
        raise SpecError("give intra_topology or intra_matrix_gb_per_s, not both", source=src,
                        field=fld)
    if not isinstance(topo_name, str):
        raise SpecError(f"must be a preset name (string), got {topo_name!r}", source=src,
                        field=fld)
    try:
        topo = load_topology(topo_name)
    except SpecError as e:
        raise SpecError(e.problem if e.source is None else str(e), source=src,
                        field=fld) from None
    if topo.num_gpus != gpus:
        raise SpecError(f"topology '{topo.name}' has {topo.num_gpus} GPUs but this node has "
                        f"gpus = {gpus}; pick a matching preset", source=src, field=fld)
    from .topologies import scaled_matrix
    return scaled_matrix(topo, nd.get("intra_gb_per_s"))


# a node's intra_gb_per_s and its matrix's best ring agree within this (rounding in files)
RING_AGREEMENT = 0.01


def _matrix_ring(mat: np.ndarray, intra, src: str, where: str) -> float:
    """The node's intra_gb_per_s where it gives a GPU-by-GPU matrix: the matrix's best ring
    over all GPUs (what the cost model reads from it); a value given must agree with it."""
    from model.topology import best_ring_gb_per_s

    n = mat.shape[0]
    ring = best_ring_gb_per_s(mat, tuple(range(n))) if n > 1 else float(intra or 0.0)
    if n > 1 and intra is not None and abs(float(intra) - ring) > RING_AGREEMENT * ring:
        raise SpecError(f"is {intra:g} GB/s, but intra_matrix_gb_per_s's best ring over the "
                        f"node's {n} GPUs is {ring:.4g} GB/s and the matrix is what the cost "
                        "model uses: leave intra_gb_per_s out, or give the matrix as measured",
                        source=src, field=f"{where}.intra_gb_per_s")
    return ring if n > 1 else intra


def _matrix(rows, n: int, src: str, fld: str, per: str = "node, in [[nodes]] order"
            ) -> np.ndarray:
    if not isinstance(rows, list) or len(rows) != n or any(
            not isinstance(r, list) or len(r) != n for r in rows):
        raise SpecError(f"must be a {n}x{n} list of rows, one per {per}", source=src,
                        field=fld)
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for r in rows for v in r):
        raise SpecError("entries must be numbers (GB/s)", source=src, field=fld)
    m = np.array(rows, dtype=float)
    if not np.isfinite(np.diag(m)).all():
        raise SpecError("the diagonal must hold finite numbers (it is unused: write 0)",
                        source=src, field=fld)
    off = ~np.eye(n, dtype=bool)
    bad = off & ~(np.isfinite(m) & (m > 0))
    if bad.any():
        i, j = map(int, np.argwhere(bad)[0])
        raise SpecError(f"entry [{i}][{j}] is {float(m[i, j])!r}; bandwidth must be a positive "
                        "number of GB/s", source=src, field=fld)
    return m


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a TOML basic string (same escapes)


def _toml_num(v) -> str:
    """A plain float (numpy scalars included) that reads back exactly."""
    return repr(float(v))


def cluster_to_toml(c: ClusterSpec) -> str:
    """Serialize a cluster to the TOML format `load_cluster` reads (names escaped, numbers
    written in full so that the file reads back to the same cluster)."""
    out = [f"name = {_toml_str(c.name)}", f"latency_us = {_toml_num(c.latency_us)}",
           f"intra_latency_us = {_toml_num(c.intra_latency_us)}", ""]
    for nd in c.nodes:
        out += ["[[nodes]]", f"name = {_toml_str(nd.name)}", f"gpu = {_toml_str(nd.gpu.name)}",
                f"gpus = {int(nd.num_gpus)}", f"intra_gb_per_s = {_toml_num(nd.intra_gb_per_s)}"]
        if nd.intra_matrix_gb_per_s is not None:
            out.append("intra_matrix_gb_per_s = [")
            out += ["  [" + ", ".join(_toml_num(v) for v in row) + "],"
                    for row in nd.intra_matrix_gb_per_s]
            out.append("]")
        out.append("")
    out += ["[inter]", "# GB/s of one GPU-to-GPU stream from the row node to the column node",
            "gb_per_s = ["]
    out += ["  [" + ", ".join(_toml_num(v) for v in row) + "]," for row in c.inter_gb_per_s]
    out += ["]", ""]
    return "\n".join(out)


def save_cluster(c: ClusterSpec, path: str | Path) -> None:
    """Write `cluster_to_toml(c)` to `path` (formats.atomic: whole or not at all)."""
    from .atomic import write_atomic

    write_atomic(Path(path), cluster_to_toml(c), field="--out")


# ---------------------------------------------------------------------------------------------
# Synthetic clusters


@dataclass(frozen=True)
class SynthParams:
    """Generating model for synthetic clusters (documented in the README).

    Nodes sit in leaf switches of `leaf_size` nodes. A stream between two nodes of one leaf gets
    `nic_gb_per_s`; across leaves it gets `nic_gb_per_s / oversubscription` (the spine is
    oversubscribed). `degraded` nodes, drawn at random, have a NIC at `degraded_factor` of its
    rate, which limits both what they send and what they receive. Every entry is then multiplied
    by an independent factor drawn uniformly from [1 - noise, 1 + noise], so the matrix is
    slightly asymmetric, like a measurement.
    """

    num_nodes: int = 8
    gpus_per_node: int = 8
    gpu: str = "A100-80GB"
    # None: the GPU's NVLink (datasheet, one direction) x NVLINK_ACHIEVED: 240 for A100
    intra_gb_per_s: float | None = None
    nic_gb_per_s: float = 23.0
    leaf_size: int = 4
    oversubscription: float = 1.6
    degraded: int = 1
    degraded_factor: float = 0.5
    noise: float = 0.03
    latency_us: float = 5.0
    seed: int = 0
    name: str | None = None
    intra_latency_us: float = INTRA_LATENCY_US
    degraded_nodes: tuple[int, ...] | None = field(default=None)


# What an all-GPU ring reaches of the NVLink datasheet rate (one direction per GPU): the
# all-reduce bus bandwidth nccl-tests reports on a DGX A100 is about 230-240 GB/s of 300
NVLINK_ACHIEVED = 0.8


def synth_cluster(p: SynthParams) -> ClusterSpec:
    n = p.num_nodes
    src = "synth"
    if p.intra_gb_per_s is None and isinstance(p.gpu, str):
        p = replace(p, intra_gb_per_s=presets.gpu(p.gpu).nvlink_gb_per_s * NVLINK_ACHIEVED)
    # degraded nodes are at most the nodes (a count past them had been offered up to 4096)
    n_max = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_NODES \
        else MAX_NODES
    for f, lo, hi in (("num_nodes", 1, MAX_NODES), ("gpus_per_node", 1, MAX_GPUS_PER_NODE),
                      ("leaf_size", 1, MAX_NODES), ("degraded", 0, n_max),
                      ("seed", 0, 2**32 - 1)):
        v = getattr(p, f)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise SpecError(f"is {v!r}; give an integer from {lo} to {hi}", source=src,
                            field=f)
    if not isinstance(p.gpu, str):
        raise SpecError(f"must be a GPU preset name, got {str(p.gpu)[:40]}", source=src,
                        field="gpu")
    for f in ("intra_gb_per_s", "nic_gb_per_s", "oversubscription", "degraded_factor",
              "noise", "latency_us", "intra_latency_us"):
        _number(getattr(p, f), src, f, "a finite number")
    for f in ("nic_gb_per_s", "intra_gb_per_s"):  # each named (intra's had been nic's)
        if not getattr(p, f) > 0:
            raise SpecError(f"link rates must be positive GB/s, got {getattr(p, f):g}",
                            source=src, field=f)
    if p.leaf_size < 1:
        raise SpecError("must be >= 1", source=src, field="leaf_size")
    if p.oversubscription < 1:
        raise SpecError(f"is {p.oversubscription:g}; it must be >= 1 (1 = full bisection)",
                        source=src, field="oversubscription")
    if not 0 < p.degraded_factor <= 1:
        raise SpecError(f"is {p.degraded_factor:g}; it must be in (0, 1]", source=src,
                        field="degraded_factor")
    if not 0 <= p.noise < 1:
        raise SpecError(f"is {p.noise:g}; it must be in [0, 1)", source=src, field="noise")
    rng = np.random.default_rng(p.seed)
    leaf = np.arange(n) // p.leaf_size
    bw = np.where(leaf[:, None] == leaf[None, :], p.nic_gb_per_s,
                  p.nic_gb_per_s / p.oversubscription)
    bad = (p.degraded_nodes if p.degraded_nodes is not None
           else tuple(sorted(rng.choice(n, size=p.degraded, replace=False).tolist())))
    nic = np.ones(n)
    nic[list(bad)] = p.degraded_factor
    bw = bw * np.minimum(nic[:, None], nic[None, :])
    bw = bw * rng.uniform(1 - p.noise, 1 + p.noise, size=(n, n))
    np.fill_diagonal(bw, 0.0)
    bw = np.round(bw, 2)
    gpu = presets.gpu(p.gpu)
    width = max(2, len(str(n - 1)))
    nodes = tuple(NodeSpec(f"node{i:0{width}d}", gpu, p.gpus_per_node, p.intra_gb_per_s)
                  for i in range(n))
    name = p.name or f"synth-{n}x{p.gpus_per_node}-{gpu.name}-s{p.seed}"
    return ClusterSpec(name=name, nodes=nodes, inter_gb_per_s=bw, latency_us=p.latency_us,
                       source=src, intra_latency_us=p.intra_latency_us)


def uniform_cluster(num_nodes: int, gpus_per_node: int, gpu: str, intra_gb_per_s: float,
                    inter_gb_per_s: float, latency_us: float = 5.0,
                    name: str = "uniform") -> ClusterSpec:
    """Every inter-node stream gets the same bandwidth (what prior configurators assume)."""
    g = presets.gpu(gpu)
    bw = np.full((num_nodes, num_nodes), float(inter_gb_per_s))
    np.fill_diagonal(bw, 0.0)
    nodes = tuple(NodeSpec(f"node{i:02d}", g, gpus_per_node, intra_gb_per_s)
                  for i in range(num_nodes))
    return ClusterSpec(name=name, nodes=nodes, inter_gb_per_s=bw, latency_us=latency_us,
                       source=name)


EXAMPLE_CLUSTER = "example"


def cluster(name_or_path: str) -> ClusterSpec:
    """A cluster preset (data/clusters/<name>.toml) or a TOML file path."""
    p = Path(name_or_path)
    if p.suffix == ".toml":
        return load_cluster(p)
    known = sorted(q.stem for q in presets.data_path("clusters").glob("*.toml"))
    if name_or_path not in known:
        try:  # a path that exists is said to be what it is, not an unknown preset name
            what = ("is a folder" if p.is_dir() else "is not a .toml file" if p.exists()
                    else None)
        except OSError:  # not a path this system can look up (a name too long, say)
            what = None
        if what:
            raise SpecError(f"{p} {what}; give a cluster .toml file (cluster import or "
                            f"synth writes one) or a preset: {', '.join(known)}",
                            field="cluster")
        raise SpecError(f"unknown cluster '{name_or_path}'; known presets: {', '.join(known)} "
                        "(or give a .toml file)", field="cluster")
    return load_cluster(presets.data_path("clusters", f"{name_or_path}.toml"))


def cluster_names() -> list[str]:
    return sorted(q.stem for q in presets.data_path("clusters").glob("*.toml"))


def hostfile_order(path, cluster: ClusterSpec) -> list[int]:
    """The cluster's node indices in the order a hostfile lists them: one host per line, the
    first word its name (`name slots=N`, the DeepSpeed / OpenMPI format launch/ranks.py writes,
    or a bare name as `scontrol show hostnames` prints); '#' starts a comment. Every node of
    the cluster once, and nothing else."""
    src = str(path)
    index = {nd.name: k for k, nd in enumerate(cluster.nodes)}
    order: list[int] = []
    for line in read_text(path, field="hostfile", what="the hostfile").splitlines():
        name = line.split("#", 1)[0].split()
        if not name:
            continue
        if name[0] not in index:
            raise SpecError(f"host {name[0]!r} is not a node of cluster {cluster.name!r}",
                            source=src, field="hostfile")
        if index[name[0]] in order:
            raise SpecError(f"host {name[0]!r} is listed twice", source=src, field="hostfile")
        gpus = cluster.nodes[index[name[0]]].num_gpus
        for word in name[1:]:  # 'slots=N' (DeepSpeed / OpenMPI): the ranks the host ran
            key, _eq, val = word.partition("=")
            if key == "slots" and val != str(gpus):
                raise SpecError(f"host {name[0]!r} has {word} but {gpus} GPUs in the cluster "
                                "file: a run on fewer GPUs than the nodes hold is not what the "
                                "plans describe; fix the slots or the cluster's gpus",
                                source=src, field="hostfile")
        order.append(index[name[0]])
    if len(order) != cluster.num_nodes:
        missing = [nd.name for k, nd in enumerate(cluster.nodes) if k not in order]
        raise SpecError(f"{len(missing)} of the cluster's nodes are not listed (first: "
                        f"{missing[0]}); list every node the run used", source=src,
                        field="hostfile")
    return order
