"""Import measured inter-node bandwidth (nccl-tests, mpiGraph, CSV/JSON) into a cluster spec.

Every reader returns a `Measured` matrix: node names and GB/s of one GPU-to-GPU stream from the
row node to the column node, NaN where a pair was not measured (kept apart from a measured NaN,
which is an error). `check_and_fill` then rejects zeros, NaN, negatives, unknown or duplicated
names, non-square input and missing pairs (unless an explicit fill rule is given) and warns on
strong asymmetry; `build_cluster` turns the result into a `ClusterSpec` through
`formats.clusters.cluster_from_dict`, so an imported cluster passes the same checks as a file.

Units: GB/s = 1e9 bytes/s throughout (the cluster convention, model/cluster.py).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from networkx.utils import UnionFind

from model.cluster import INTRA_LATENCY_US, check_unique_hosts
from model.errors import SpecError

from .reading import read_text, unknown_keys

from .clusters import cluster_from_dict

ASYMMETRY_WARN_RATIO = 1.5  # max(m_ij, m_ji) / min(...) above this is reported
FILL_RULES = ("symmetric", "min-row")
NCCL_TESTS = ("sendrecv", "all_reduce")
MPIGRAPH_TABLES = ("recv", "send", "min")
NCCL_SUFFIXES = (".txt", ".log", ".out")
# mpiGraph prints MB/s with MB = 2^20 bytes: MBsec = size * 1e6 / (1024 * 1024) per usec
# (LLNL/mpiGraph, mpiGraph.c, the send/recv table printing code).
MIB = 1024 * 1024
UNIT_TO_GB_PER_S = {
    "gb_per_s": 1.0,               # 1e9 bytes/s
    "mb_per_s": 1e6 / 1e9,         # 1e6 bytes/s
    "mib_per_s": MIB / 1e9,        # 2^20 bytes/s
    "gbit_per_s": 1e9 / 8 / 1e9,   # 1e9 bits/s = 1.25e8 bytes/s
}
# how a JSON matrix's "units" text (the probe writes "GB/s (1e9 bytes/s) ...") must begin for
# each matrix key; the key decides the unit, the text may only agree with it
_UNIT_TEXT = {"gb_per_s": "GB/s", "mb_per_s": "MB/s", "mib_per_s": "MiB/s",
              "gbit_per_s": "Gbit/s"}
# the other fields a JSON matrix may hold: probe/p2p_bandwidth.py's record of its run
_JSON_RECORD_KEYS = ("format", "units", "backend", "size_bytes", "iters", "warmup", "rounds",
                     "measured_at")


@dataclass
class Measured:
    names: list[str]
    gb_per_s: np.ndarray                 # n x n, NaN where not measured; diagonal ignored
    source: str
    measured_nan: np.ndarray | None = None  # True where the input itself said NaN
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # pair files whose run named other hosts than the file name: (the file name's two, the
    # run's two, the warning said of it), for check_and_fill's --fill guard
    renamed: list[tuple[tuple[str, str], tuple[str, str], str]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# CSV / JSON


def _number(cell: str, src: str, where: str) -> tuple[float, bool]:
    """(value, measured_nan); an empty cell is a missing pair (NaN, False)."""
    s = cell.strip()
    if s == "":
        return math.nan, False
    try:
        v = float(s)
    except ValueError:
        raise SpecError(f"'{s}' is not a number; give GB/s or leave the cell empty for a "
                        "pair that was not measured", source=src, field=where) from None
    return v, math.isnan(v)


# a rate written in a CSV's first header cell (e.g. 'from\\to (Gbit/s)'): a prefix, an
# optional binary 'i', bits ('bit', 'bits', or a lower-case 'b' after an upper-case prefix)
# or bytes ('byte', 'B'), then '/s', 'ps' or '_s' / '_per_s'
_CSV_RATE = re.compile(r"(?<![A-Za-z])([kKmMgGtT])(i?)(bits?|bytes?|B|b)\s*(?:/\s*s|ps|_s\b|"
                       r"_per_s\b)", re.IGNORECASE)
# which --units a (prefix, binary, bits) names; the others are refused, never misread
_CSV_RATE_UNITS = {("g", False, True): "gbit_per_s", ("g", False, False): "gb_per_s",
                   ("m", False, False): "mb_per_s", ("m", True, False): "mib_per_s"}


def _csv_rate(label: str, src: str) -> tuple[str, str] | None:
    """(text, --units key) of the rate a CSV's first header cell names, None if it names
    none; a rate the import does not read (Mbit/s, TB/s, GiB/s, ...) or an ambiguous one
    (lower-case 'gb': bits or bytes?) is refused. (A case-sensitive list had read '(GBit/s)'
    and '(Mbit/s)' matrices as GB/s.)"""
    keys = re.search(r"(?<![A-Za-z])(" + "|".join(_UNIT_TEXT) + r")(?![A-Za-z])", label)
    if keys:  # the --units names themselves
        return keys.group(1), keys.group(1)
    mt = _CSV_RATE.search(label)
    if mt is None:
        return None
    text, (prefix, binary, unit) = mt.group(0), mt.groups()[:3]
    word = unit.lower()
    if word.startswith("bit"):
        bits = True
    elif word.startswith("byte") or unit == "B":
        bits = False
    elif prefix.isupper():  # Gb/s: bits, as network rates are written
        bits = True
    else:
        raise SpecError(f"the header's {text} does not say bits or bytes; write GB/s "
                        "(bytes) or Gbit/s (bits)", source=src, field="header")
    key = _CSV_RATE_UNITS.get((prefix.lower(), bool(binary), bits))
    if key is None:
        raise SpecError(f"the header names {text}, which is not a unit the import reads; "
                        f"convert the matrix to one of {', '.join(_UNIT_TEXT.values())}",
                        source=src, field="header")
    return text, key


def _csv_units(label: str, units: str | None, src: str) -> str:
    """The unit of a CSV matrix: the one its first header cell names, which --units (where
    given) must agree with; else --units, else GB/s."""
    said = _csv_rate(label, src)
    if said is None:
        return units or "gb_per_s"
    text, key = said
    if units is not None and units != key:
        raise SpecError(f"the header says {text} ({key}) but --units {units} was given; drop "
                        "--units or fix the header", source=src, field="header")
    return key


def read_csv(path: str | Path, units: str | None = None) -> Measured:
    """Square matrix with a header row of node names; each row starts with its node's name.

    The first header cell is a free label (e.g. `from\\to`); a unit written in it (e.g.
    `from\\to (Gbit/s)`) is the matrix's (_csv_units). Rows may come in any order; they are
    matched to columns by name. An empty cell is a pair that was not measured.
    """
    src = str(path)
    text = _read_text(path)
    try:
        rows = [r for r in csv.reader(io.StringIO(text)) if any(c.strip() for c in r)]
    except csv.Error as e:
        raise SpecError(f"not CSV ({e})", source=src) from None
    if len(rows) < 2:
        raise SpecError("needs a header row of node names and one row per node", source=src)
    units = _csv_units(rows[0][0] if rows[0] else "", units, src)
    header = [c.strip() for c in rows[0][1:]]
    while header and header[-1] == "":
        header.pop()
    _check_names(header, src, "header")
    n = len(header)
    data = rows[1:]
    if len(data) != n:
        sep = next((ch for ch in (";", "\t", "|") if n <= 1 and ch in text.splitlines()[0]),
                   None)
        # a header without its corner cell: its first node name was read as the corner
        corner = rows[0][0].strip() if rows[0] else ""
        shifted = (len(data) == n + 1 and corner and corner in
                   {r[0].strip() for r in data if r})
        raise SpecError(f"matrix is not square: {len(data)} data rows but {n} node columns "
                        f"in the header; give one row per node"
                        + (f" (the header is split by {sep!r}: the import reads commas)"
                           if sep else "")
                        + (f" (the header's first cell, {corner!r}, is read as the corner "
                           "label over the row names: start the header with an empty cell or "
                           "a label such as 'from\\to')" if shifted else ""),
                        source=src, field="rows")
    m = np.full((n, n), math.nan)
    nan = np.zeros((n, n), dtype=bool)
    seen: dict[str, int] = {}
    for r, row in enumerate(data, start=2):
        label = row[0].strip() if row else ""
        cells = row[1:]
        while len(cells) > n and cells[-1].strip() == "":
            cells = cells[:-1]
        if label not in header:
            raise SpecError(f"unknown node '{label}' (not in the header: "
                            f"{', '.join(header)})", source=src, field=f"row {r}")
        if label in seen:
            raise SpecError(f"duplicated node name '{label}' (also row {seen[label]})",
                            source=src, field=f"row {r}")
        seen[label] = r
        if len(cells) != n:
            raise SpecError(f"has {len(cells)} values but there are {n} node columns; the "
                            "matrix must be square", source=src, field=f"row {r} ({label})")
        i = header.index(label)
        for j, cell in enumerate(cells):
            v, isnan = _number(cell, src, f"row {r} ({label}), column {header[j]}")
            m[i, j], nan[i, j] = v, isnan
    scale = _unit(units)
    return Measured(header, m * scale, src, nan, notes=[f"CSV matrix in {units}"])


def read_json(path: str | Path, units: str | None = None) -> Measured:
    """{"nodes": [...], "gb_per_s": [[...]]} (or "mb_per_s" / "mib_per_s" / "gbit_per_s");
    null is a pair that was not measured. The probe (probe/p2p_bandwidth.py) writes this."""
    src = str(path)
    try:
        raw = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise SpecError(f"not valid JSON ({e})", source=src) from None
    if not isinstance(raw, dict) or "nodes" not in raw:
        raise SpecError('missing; give {"nodes": [names], "gb_per_s": [[...]]}', source=src,
                        field="nodes")
    names = raw["nodes"]
    if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
        raise SpecError("must be a list of node names (strings)", source=src, field="nodes")
    _check_names(names, src, "nodes")
    keys = [k for k in UNIT_TO_GB_PER_S if k in raw]
    if len(keys) != 1:
        raise SpecError(f"give exactly one matrix key of {', '.join(UNIT_TO_GB_PER_S)}; "
                        f"found {keys or 'none'}", source=src, field="gb_per_s")
    key = keys[0]
    if units is not None and units != key:
        raise SpecError(f"the file says {key} but --units {units} was given; drop --units",
                        source=src, field=key)
    unknown_keys(raw, ("nodes", key, *_JSON_RECORD_KEYS), src)
    said = raw.get("units")
    if said is not None and not (isinstance(said, str)
                                 and said.strip().startswith(_UNIT_TEXT[key])):
        raise SpecError(f"says {str(said)[:40]!r} but the matrix key {key} means "
                        f"{_UNIT_TEXT[key]}; the key decides the unit: rename the key or fix "
                        "the text", source=src, field="units")
    rows = raw[key]
    n = len(names)
    if not isinstance(rows, list) or len(rows) != n:
        raise SpecError(f"matrix is not square: {len(rows) if isinstance(rows, list) else '?'}"
                        f" rows for {n} nodes; give one row per node", source=src, field=key)
    m = np.full((n, n), math.nan)
    nan = np.zeros((n, n), dtype=bool)
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != n:
            raise SpecError(f"row {i} ({names[i]}) has "
                            f"{len(row) if isinstance(row, list) else '?'} values for {n} "
                            "nodes; the matrix must be square", source=src, field=key)
        for j, v in enumerate(row):
            if v is None:
                continue
            if isinstance(v, str) and v.lower() == "nan":
                v = math.nan
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise SpecError(f"{v!r} is not a number (use null for a pair not measured)",
                                source=src, field=f"{key}[{i}][{j}] ({names[i]} -> {names[j]})")
            m[i, j] = float(v)
            nan[i, j] = math.isnan(float(v))
    return Measured(list(names), m * UNIT_TO_GB_PER_S[key], src, nan,
                    notes=[f"JSON matrix in {key}"])


def _unit(units: str) -> float:
    if units not in UNIT_TO_GB_PER_S:
        raise SpecError(f"unknown unit '{units}'; use one of {', '.join(UNIT_TO_GB_PER_S)}",
                        source="options", field="--units")
    return UNIT_TO_GB_PER_S[units]


# ---------------------------------------------------------------------------------------------
# mpiGraph


_MPIGRAPH_LABEL = re.compile(r"^(?P<host>.+):(?P<rank>\d+)(?:\s+(?:to|from))?$")


def read_mpigraph(path: str | Path, table: str = "recv") -> Measured:
    """mpiGraph output: its `Send` and `Recv` tables, MB/s (MB = 2^20 bytes), one row and
    column per rank labelled `host:rank`.

    In `Send`, row j (`host:j to`) column k is what rank j sent to rank k; in `Recv`, row j
    (`host:j from`) column k is what rank j received from rank k, so it is transposed here to
    put the sender on the row (LLNL/mpiGraph, mpiGraph.c). `table`: `recv` (default: the
    receiver's clock, data that arrived), `send`, or `min` of the two. Several ranks on one
    host: the node-pair entry is the mean over all rank pairs joining the two hosts; pairs
    within a host (intra-node) are not used.
    """
    src = str(path)
    if table not in MPIGRAPH_TABLES:
        raise SpecError(f"unknown mpiGraph table '{table}'; use recv, send or min", source=src,
                        field="--mpigraph-table")
    lines = _read_text(path).splitlines()
    tables = {}
    for kind in ("Send", "Recv"):
        tables[kind] = _mpigraph_table(lines, kind, src)
    hosts_s, ms = tables["Send"]
    hosts_r, mr = tables["Recv"]
    if hosts_s != hosts_r:
        raise SpecError("the Send and Recv tables list different ranks", source=src,
                        field="Recv")
    mr = mr.T  # Recv[j][k] is the stream k -> j
    m_mib = {"send": ms, "recv": mr, "min": np.minimum(ms, mr)}[table]
    # per-host aggregation: mean over rank pairs (a, b) with host(a) = A, host(b) = B, A != B
    names = list(dict.fromkeys(hosts_s))
    idx = {h: i for i, h in enumerate(names)}
    n = len(names)
    tot = np.zeros((n, n))
    cnt = np.zeros((n, n))
    for a, ha in enumerate(hosts_s):
        for b, hb in enumerate(hosts_s):
            if ha != hb:
                tot[idx[ha], idx[hb]] += m_mib[a, b]
                cnt[idx[ha], idx[hb]] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(cnt > 0, tot / np.maximum(cnt, 1), math.nan)
    nan = np.isnan(tot) & (cnt > 0)
    ranks_per_host = max(hosts_s.count(h) for h in names)
    notes = [f"mpiGraph {table} table, MiB/s -> GB/s (x 2^20 / 1e9)"]
    if ranks_per_host > 1:
        notes.append(f"up to {ranks_per_host} ranks per host: node pair = mean over rank pairs")
    # MiB/s -> GB/s: x 2^20 bytes / 1e9 bytes (mpiGraph.c MBsec uses 1024*1024)
    return Measured(names, mean * MIB / 1e9, src, nan, notes=notes)


def _mpigraph_table(lines: list[str], kind: str, src: str) -> tuple[list[str], np.ndarray]:
    start = next((i for i, ln in enumerate(lines) if ln.split("\t")[0].strip() == kind), None)
    if start is None:
        raise SpecError(f"no '{kind}' table found; is this mpiGraph output (START mpiGraph)?",
                        source=src, field=kind)
    cols = [c.strip() for c in lines[start].split("\t")[1:] if c.strip()]
    hosts = []
    for c in cols:
        mt = _MPIGRAPH_LABEL.match(c)
        if not mt:
            raise SpecError(f"column label '{c}' is not host:rank", source=src,
                            field=f"{kind} header (line {start + 1})")
        if int(mt["rank"]) != len(hosts):
            raise SpecError(f"column label '{c}': ranks must run 0, 1, 2, ...", source=src,
                            field=f"{kind} header (line {start + 1})")
        hosts.append(mt["host"])
    n = len(hosts)
    m = np.full((n, n), math.nan)
    for r in range(n):
        ln_no = start + 1 + r
        if ln_no >= len(lines) or not lines[ln_no].strip():
            raise SpecError(f"table has {r} rows but {n} columns; the matrix must be square "
                            "(output cut short?)", source=src, field=f"{kind} table")
        cells = [c.strip() for c in lines[ln_no].split("\t")]
        while cells and cells[-1] == "":
            cells.pop()
        mt = _MPIGRAPH_LABEL.match(cells[0])
        if not mt:
            raise SpecError(f"table has {r} rows but {n} columns; the matrix must be square "
                            "(output cut short?)", source=src, field=f"{kind} table (line "
                            f"{ln_no + 1})")
        if int(mt["rank"]) != r or mt["host"] != hosts[r]:
            raise SpecError(f"row label '{cells[0]}' should be '{hosts[r]}:{r}'", source=src,
                            field=f"{kind} table (line {ln_no + 1})")
        vals = cells[1:]
        if len(vals) != n:
            raise SpecError(f"row has {len(vals)} values for {n} ranks; the matrix must be "
                            "square", source=src, field=f"{kind} table (line {ln_no + 1})")
        for k, v in enumerate(vals):
            m[r, k], _ = _number(v, src, f"{kind} table (line {ln_no + 1}), column {k}")
    return hosts, m


# ---------------------------------------------------------------------------------------------
# nccl-tests


# nccl-tests since 2.13 print 'Group N' in it; older versions and rccl-tests do not
_RANK_LINE = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")


@dataclass
class NcclRun:
    source: str
    hosts: list[str]        # host of each rank, from the "# Rank N ... on HOST" lines
    size_bytes: int         # the largest message size in the table
    algbw_gb_per_s: float   # mean of out-of-place and in-place at that size
    busbw_gb_per_s: float
    rows: int
    # every row: (size in bytes, time in us), the mean of out-of-place and in-place
    times_us: list[tuple[int, float]] = field(default_factory=list)


# a file holding two runs (a rerun appended with >>): which to read would be a guess
_TWO_RUNS = ("a second {} starts here: the file holds more than one nccl-tests run (appended?); "
             "keep one run per file")


def parse_nccl(text: str, src: str) -> NcclRun:
    """The standard nccl-tests table (`size count type redop root time algbw busbw #wrong`,
    out-of-place then in-place; older versions without `root`, with `error`). Columns are
    found by header name. Returns the row with the largest size."""
    hosts: dict[int, str] = {}
    header = None
    best = None
    nrows = 0
    times: list[tuple[int, float]] = []
    for ln_no, ln in enumerate(text.splitlines(), start=1):
        s = ln.strip()
        mt = _RANK_LINE.match(s)
        if mt:
            if int(mt[1]) in hosts or header is not None:
                raise SpecError(_TWO_RUNS.format("rank list"), source=src, field=f"line {ln_no}")
            hosts[int(mt[1])] = mt[2]
            continue
        if s.startswith("#"):
            toks = s.lstrip("#").split()
            if "size" in toks and "algbw" in toks and "busbw" in toks:
                if header is not None:
                    raise SpecError(_TWO_RUNS.format("table"), source=src,
                                    field=f"line {ln_no}")
                header = toks
            elif "Out of bounds values" in s and "FAILED" in s:
                # nccl-tests' check of the results (src/common.cu): the data came out wrong
                raise SpecError("nccl-tests says its results were wrong ('" + s.lstrip("# ")
                                + "'): the run is not a measurement; re-run it",
                                source=src, field=f"line {ln_no}")
            continue
        if not s or header is None:
            continue
        toks = s.split()
        if not toks[0].isdigit():
            continue
        if len(toks) != len(header):
            raise SpecError(f"row has {len(toks)} fields but the header has {len(header)} "
                            f"({' '.join(header)})", source=src, field=f"line {ln_no}")
        alg = [i for i, h in enumerate(header) if h == "algbw"]
        bus = [i for i, h in enumerate(header) if h == "busbw"]
        tim = [i for i, h in enumerate(header) if h == "time"]
        try:
            size = int(toks[header.index("size")])
            algs = [float(toks[i]) for i in alg]
            buses = [float(toks[i]) for i in bus]
            ts = [float(toks[i]) for i in tim]
        except ValueError:
            raise SpecError("size, time, algbw and busbw must be numbers", source=src,
                            field=f"line {ln_no}") from None
        # (a small message's rate prints as 0.00 GB/s: rates may be 0, never negative)
        if not (all(math.isfinite(x) and x >= 0 for x in (*algs, *buses))
                and all(math.isfinite(x) and x > 0 for x in ts)):
            raise SpecError("time must be positive, algbw and busbw not negative (a failed "
                            "or damaged run)", source=src, field=f"line {ln_no}")
        # the '#wrong' count (older versions: 'error', a max error) of each half: 0 or N/A
        # (nccl-tests run without checking, -c 0) where the data arrived intact
        for i in (i for i, h in enumerate(header) if h in ("#wrong", "error")):
            if toks[i] != "N/A" and _float_or(toks[i]) != 0.0:
                raise SpecError(f"nccl-tests counted {toks[i]} wrong values at {size} bytes: "
                                "the data arrived damaged; the run is not a measurement, "
                                "re-run it", source=src, field=f"line {ln_no}")
        if ts:
            times.append((size, float(np.mean(ts))))
        nrows += 1
        if best is None or size > best[0]:
            best = (size, float(np.mean(algs)), float(np.mean(buses)))
    if header is None:
        raise SpecError("no nccl-tests table header (# size count type ... algbw busbw) found",
                        source=src)
    if best is None:
        raise SpecError("the nccl-tests table has no data rows (did the run fail?)", source=src)
    if not best[2] > 0:
        raise SpecError(f"busbw at the largest size ({best[0]} bytes) is 0: no rate to read; "
                        "run nccl-tests up to large messages (-e 1G)", source=src, field="busbw")
    ranks = [hosts[r] for r in sorted(hosts)]
    return NcclRun(src, ranks, best[0], best[1], best[2], nrows, times)


# the smallest message of an intra-node all-reduce run above this: its time is mostly bandwidth,
# so the latency taken from it is imprecise (nccl-tests sweeps from -b 8 bytes)
LATENCY_MAX_BYTES = 1 << 16


def intra_node_allreduce(path: str | Path, gpus_per_node: int | None = None
                         ) -> tuple[float, float, str, list[str]]:
    """(per-step latency in us, busbw in GB/s, a note, warnings) of an all_reduce_perf run
    among the GPUs of one node; refused where it ran another number of GPUs than the
    cluster's nodes have (`gpus_per_node`): its busbw and per-step latency are of rings of
    its own size.

    busbw at the largest size is the rate each link of the ring carries (nccl-tests
    doc/PERFORMANCE.md, "AllReduce": busbw = algbw x 2(n-1)/n), the cluster's intra_gb_per_s.
    The cost model's all-reduce of S bytes over n GPUs takes 2(n-1)/n S / rate + 2(n-1) steps
    of latency (model/communication.py ring_ms), so the latency per step is the smallest
    message's time less its bandwidth part, over 2(n-1)."""
    src = str(path)
    run = parse_nccl(_read_text(path), src)
    n = len(run.hosts)
    if n < 2:
        raise SpecError("needs the '# Rank N ... on HOST' lines of at least 2 ranks (keep the "
                        "full all_reduce_perf output, run with -g 8 or one process per GPU)",
                        source=src)
    if len(set(run.hosts)) != 1:
        raise SpecError(f"ranks on {len(set(run.hosts))} hosts; an intra-node run keeps every "
                        "rank on one node", source=src, field="# Rank lines")
    if gpus_per_node is not None and n != gpus_per_node:
        raise SpecError(f"the run all-reduces over {n} GPUs and the cluster's nodes have "
                        f"{gpus_per_node} (--gpus-per-node): measure one node's GPUs "
                        f"(all_reduce_perf -g {gpus_per_node})", source=src,
                        field="# Rank lines")
    _check_busbw_factor(run, 2 * (n - 1) / n, "all_reduce")
    bw = run.busbw_gb_per_s
    if not run.times_us:
        raise SpecError("no time column in the table", source=src)
    size, t_us = min(run.times_us)
    steps = 2 * (n - 1)
    bw_part_us = steps / n * size / (bw * 1e3)  # GB/s = 1e3 bytes per us
    lat = max(0.0, t_us - bw_part_us) / steps
    warnings = []
    if size > LATENCY_MAX_BYTES:
        warnings.append(f"{src}: smallest message is {size} B (> {LATENCY_MAX_BYTES} B); the "
                        "latency taken from it is imprecise, rerun with -b 8")
    note = (f"intra-node all_reduce over {n} GPUs of {run.hosts[0]}: busbw {bw:.1f} GB/s at {run.size_bytes} B; "
            f"{t_us:.1f} us at {size} B = {steps} steps of {lat:.2f} us")
    return lat, bw, note, warnings


def nccl_stream_gb_per_s(run: NcclRun, test: str) -> tuple[float, str]:
    """GB/s of one GPU-to-GPU stream from a pair run, and a note saying what was taken.

    sendrecv_perf: busbw == algbw = bytes / time of each rank's send (nccl-tests
    doc/PERFORMANCE.md, "SendRecv": bus bandwidth factor 1); we take busbw.
    all_reduce_perf: busbw = algbw x 2(n-1)/n (PERFORMANCE.md, "AllReduce"), the rate every
    link of the ring carries, i.e. one stream per hop; we take busbw. We check that the printed
    busbw matches this factor (within 3%), which also catches a file from the other test.
    """
    n = len(run.hosts)
    if test == "sendrecv":
        factor = 1.0
    elif test == "all_reduce":
        if n == 0:
            raise SpecError("all_reduce_perf output without '# Rank N ... on HOST' lines: the "
                            "rank count, needed for busbw = algbw x 2(n-1)/n, is unknown; keep "
                            "the full output", source=run.source)
        if len(set(run.hosts)) != n:
            raise SpecError(f"all_reduce_perf with {n} ranks on {len(set(run.hosts))} hosts "
                            "measures a node's aggregate, not one stream; run one rank per "
                            "node (-g 1, one process per host) or use sendrecv_perf",
                            source=run.source)
        factor = 2 * (n - 1) / n  # nccl-tests PERFORMANCE.md, AllReduce bus bandwidth
    else:
        raise SpecError(f"unknown nccl test '{test}'; use {' or '.join(NCCL_TESTS)}",
                        source=run.source, field="--nccl-test")
    _check_busbw_factor(run, factor, test)
    note = (f"{test}: busbw at {run.size_bytes} B"
            + (f" (= algbw x 2(n-1)/n, n={n})" if test == "all_reduce" else " (= algbw)"))
    return run.busbw_gb_per_s, note


def _check_busbw_factor(run: NcclRun, factor: float, test: str) -> None:
    """The printed busbw / algbw is the test's factor (within 3%): a file from another test
    fails here."""
    if run.algbw_gb_per_s > 0:
        ratio = run.busbw_gb_per_s / run.algbw_gb_per_s
        if abs(ratio - factor) > 0.03 * factor:
            raise SpecError(f"busbw/algbw = {ratio:.3f} but {test} over {len(run.hosts) or '?'}"
                            f" ranks gives {factor:.3f}; is this file from another nccl test?",
                            source=run.source, field="busbw")


_PAIR_NAME = re.compile(r"^(?P<test>sendrecv|all_reduce)(?:_perf)?_(?P<a>[^_]+)_(?P<b>[^_]+)$")


def read_nccl_pairs(paths: list[Path], test: str | None = None) -> Measured:
    """One nccl-tests run per node pair. Node names come from the '# Rank N ... on HOST' lines
    (rank 0 = sender side, the pair's first node) or, where a file has none, from its name
    `<test>_<nodeA>_<nodeB>.txt` (`sendrecv_node01_node02.txt`, `all_reduce_node01_node02.log`;
    host names contain no `_`). The test comes from the file name prefix or `test`.

    A sendrecv or all_reduce run between two nodes moves data both ways at once and reports the
    slower, so a file for (A, B) gives both A->B and B->A, unless a file for (B, A) also
    exists: then each file gives its own direction (row A, column B from the A_B file).
    """
    entries: dict[tuple[str, str], tuple[float, str]] = {}
    notes: list[str] = []
    warnings: list[str] = []
    renamed: list = []  # Measured.renamed
    for p in paths:
        src = str(p)
        mt = _PAIR_NAME.match(p.stem)
        t = test or (mt["test"] if mt else None)
        if t is None:
            raise SpecError("cannot tell the nccl test from the file name; name it "
                            "sendrecv_<nodeA>_<nodeB>.txt / all_reduce_<nodeA>_<nodeB>.txt or "
                            "pass --nccl-test", source=src)
        if mt and test and mt["test"] != test:
            raise SpecError(f"file name says {mt['test']} but --nccl-test {test} was given",
                            source=src)
        run = parse_nccl(_read_text(p), src)
        hosts = list(dict.fromkeys(run.hosts))
        if hosts:
            if len(hosts) != 2:
                what = ("both ranks on one host: that is an intra-node link" if len(hosts) == 1
                        else f"{len(hosts)} hosts ({', '.join(hosts)})")
                raise SpecError(f"a pair file must span exactly two nodes; found {what}",
                                source=src, field="# Rank lines")
            a, b = hosts
            if mt and {mt["a"], mt["b"]} != {a, b}:
                renamed.append(((mt["a"], mt["b"]), (a, b),
                                f"file name says {mt['a']}/{mt['b']} but the run was on "
                                f"{a}/{b}"))
                warnings.append(f"{src}: file name says {mt['a']}/{mt['b']} but the run was on "
                                f"{a}/{b}; using the host names from the output")
        elif mt:
            a, b = mt["a"], mt["b"]
        else:
            raise SpecError("no '# Rank N ... on HOST' lines and the file name is not "
                            "<test>_<nodeA>_<nodeB>.txt; cannot tell which nodes it measured",
                            source=src)
        if a == b:
            raise SpecError(f"both ends are node {a}", source=src)
        bw, note = nccl_stream_gb_per_s(run, t)
        if run.size_bytes < 1 << 26:
            warnings.append(f"{src}: largest message is {run.size_bytes} B (< 64 MiB); "
                            "bandwidth may be latency-bound, rerun with -e 1G or more")
        if (a, b) in entries:
            raise SpecError(f"pair {a} -> {b} measured twice (also {entries[(a, b)][1]}); "
                            "keep one file per pair", source=src)
        entries[(a, b)] = (bw, src)
        notes.append(note)
    if not entries:
        raise SpecError("no nccl-tests files given")
    names = _natural_sorted({x for pair in entries for x in pair})
    idx = {h: i for i, h in enumerate(names)}
    n = len(names)
    m = np.full((n, n), math.nan)
    # a file covers both directions of its pair, unless the set measured pairs one way each:
    # then a direction without its file is filled from the reverse, and said
    directional = any((b, a) in entries for a, b in entries)
    for (a, b), (bw, f) in entries.items():
        m[idx[a], idx[b]] = bw
        if (b, a) not in entries:
            m[idx[b], idx[a]] = bw
            if directional:
                warnings.append(f"filled {b} -> {a} = {bw:.2f} GB/s from the reverse "
                                f"direction's file ({f}): the other pairs were measured both "
                                "ways; measure this direction to replace it")
    src = str(paths[0].parent) if len(paths) > 1 else str(paths[0])
    return Measured(names, m, src, np.zeros((n, n), bool), notes=sorted(set(notes)),
                    warnings=warnings, renamed=renamed)


# ---------------------------------------------------------------------------------------------
# Dispatch


# the options of one reading format each (cluster import): given for another, refused
_FORMAT_OPTIONS = (("--nccl-test", ("nccl",), NCCL_TESTS), ("--mpigraph-table", ("mpigraph",),
                   MPIGRAPH_TABLES), ("--units", ("csv", "json"), tuple(UNIT_TO_GB_PER_S)))


def load_measurements(sources: list[str | Path], fmt: str = "auto", *, units: str | None = None,
                      mpigraph_table: str | None = None, nccl_test: str | None = None
                      ) -> Measured:
    """Read one CSV / JSON / mpiGraph file, or nccl-tests pair files and directories of them.

    `fmt` auto: a directory or several files -> nccl; .csv -> csv; .json -> json; otherwise the
    text decides ('START mpiGraph' -> mpigraph, an algbw/busbw header -> nccl). `units` (CSV,
    JSON), `mpigraph_table` (mpiGraph: recv where None) and `nccl_test` (nccl-tests) given for
    another format, or with a value not known, are refused (they had been ignored)."""
    paths = [Path(s) for s in sources]
    if fmt not in ("auto", *_FORMATS):
        raise SpecError(f"unknown format '{fmt}'; use auto, {', '.join(_FORMATS)}",
                        source="options", field="--format")
    given = {"--nccl-test": nccl_test, "--mpigraph-table": mpigraph_table, "--units": units}
    for flag, _fmts, known in _FORMAT_OPTIONS:
        if known and given[flag] is not None and given[flag] not in known:
            raise SpecError(f"unknown value {given[flag]!r}; use {', '.join(known)}",
                            source="options", field=flag)
    if not paths:
        raise SpecError("give at least one file or directory", source="options",
                        field="SOURCES")
    for p in paths:
        if not p.exists():
            raise SpecError("file not found", source=str(p))
    if fmt == "auto":
        fmt = _detect(paths)
    for flag, fmts, _known in _FORMAT_OPTIONS:
        if given[flag] is not None and fmt not in fmts:
            said = {"nccl": "nccl-tests", "mpigraph": "mpiGraph", "csv": "CSV", "json": "JSON"}
            raise SpecError(f"applies to {' and '.join(said[f] for f in fmts)} files; "
                            f"{', '.join(map(str, paths))[:80]} is read as {said[fmt]}: drop "
                            "it", source="options", field=flag)
    if fmt == "nccl":
        files: list[Path] = []
        skipped: list[str] = []
        for p in paths:
            if p.is_dir():
                for q in sorted(p.iterdir()):
                    if q.is_file() and q.suffix in NCCL_SUFFIXES:
                        files.append(q)
                    elif q.is_file():
                        skipped.append(q.name)
                    elif q.is_dir():  # folders are not searched: give them as sources
                        skipped.append(f"{q.name}/")
            else:
                files.append(p)
        if not files:
            raise SpecError(f"no nccl-tests files ({'/'.join(NCCL_SUFFIXES)}) found",
                            source=", ".join(map(str, paths)))
        meas = read_nccl_pairs(files, nccl_test)
        if skipped:
            meas.warnings.append(f"not read (not {'/'.join(NCCL_SUFFIXES)} files; a folder's "
                                 "subfolders are not searched, name them as sources): "
                                 + ", ".join(skipped))
        return meas
    if len(paths) != 1 or paths[0].is_dir():
        raise SpecError(f"format {fmt} reads exactly one file", source=", ".join(map(str, paths)))
    p = paths[0]
    if fmt == "csv":
        return read_csv(p, units)
    if fmt == "json":
        return read_json(p, units)
    return read_mpigraph(p, mpigraph_table or "recv")


_FORMATS = ("nccl", "mpigraph", "csv", "json")


def _detect(paths: list[Path]) -> str:
    if len(paths) > 1:
        matrices = [p for p in paths if p.suffix.lower() in (".csv", ".json")]
        if matrices:  # several files are nccl-tests pairs; a matrix had been read as one
            raise SpecError(f"a CSV/JSON matrix is read one file at a time ({len(paths)} "
                            "sources given): import each apart", source=str(matrices[0]))
        return "nccl"
    if paths[0].is_dir():
        return "nccl"
    p = paths[0]
    if p.suffix.lower() == ".csv":
        return "csv"
    if p.suffix.lower() == ".json":
        return "json"
    head = _read_text(p)[:20000]
    if "START mpiGraph" in head or re.search(r"^Send\t", head, re.M):
        return "mpigraph"
    if "algbw" in head and "busbw" in head:
        return "nccl"
    raise SpecError("cannot tell the format (not .csv/.json, no mpiGraph or nccl-tests "
                    "header); pass --format", source=str(p))


# ---------------------------------------------------------------------------------------------
# Checks and fills


# an outlier's mean links to two groups within this share of each other are alike
# (`summarize`): a measured stream varies by a few percent run to run (the synthetic preset's
# 3% noise; nccl-tests repeats), so a closer call is noise, not where the node sits
ATTACH_TIE = 0.05
def check_and_fill(meas: Measured, *, nodes: list[str] | None = None,
                   fill: tuple[str, ...] | list[str] = (), strict: bool = False,
                   asym_ratio: float = ASYMMETRY_WARN_RATIO) -> tuple[list[str], np.ndarray,
                                                                       list[str]]:
    """(names, complete GB/s matrix with 0 diagonal, warnings) or a SpecError.

    `nodes`: the expected node names, in the order the cluster should list them; a measured
    name outside it is an error, a node of it without measurements is a missing pair.
    `fill`: rules applied in order to missing pairs only; each filled entry is reported.
      symmetric: m[a][b] = m[b][a] if that direction was measured.
      min-row:   m[a][b] = the lowest measured stream in or out of a or b (conservative: a
                 degraded NIC at either end bounds the pair); a node with no measured stream
                 at all is not filled.
    Asymmetry above `asym_ratio` is a warning, an error with `strict`.
    """
    src = meas.source
    names = list(meas.names)
    m = meas.gb_per_s
    _check_names(names, src, "nodes")
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] != len(names):
        raise SpecError(f"matrix is {m.shape} for {len(names)} nodes; it must be square",
                        source=src)
    nan = meas.measured_nan if meas.measured_nan is not None else np.zeros(m.shape, bool)
    if nodes is not None:
        _check_names(nodes, "options", "--node-names")
        unknown = [x for x in names if x not in nodes]
        if unknown:
            lower = {x.lower(): x for x in nodes}
            case = [f"{x} (--node-names has {lower[x.lower()]})" for x in unknown
                    if x.lower() in lower]
            raise SpecError(f"unknown node(s) {', '.join(unknown)}: measured but not in "
                            "--node-names; add them there or remove their measurements"
                            + (f"; differing only in case: {', '.join(case)}" if case else ""),
                            source=src, field="nodes")
        order = [names.index(x) if x in names else -1 for x in nodes]
        n = len(nodes)
        m2 = np.full((n, n), math.nan)
        nan2 = np.zeros((n, n), bool)
        for i, oi in enumerate(order):
            for j, oj in enumerate(order):
                if oi >= 0 and oj >= 0:
                    m2[i, j], nan2[i, j] = m[oi, oj], nan[oi, oj]
        names, m, nan = list(nodes), m2, nan2
    n = len(names)
    if n < 2:
        raise SpecError(f"only {n} node(s) measured; a matrix needs at least two", source=src)
    m = m.astype(float).copy()
    off = ~np.eye(n, dtype=bool)
    for mask, what, hint in (
            (off & nan, "NaN", "the measurement failed; rerun it, or leave the pair out "
                               "and pass --fill"),
            (off & ~np.isnan(m) & (m < 0), "negative", "bandwidth cannot be negative"),
            (off & ~np.isnan(m) & (m == 0), "0", "a link that delivered nothing failed or was "
                                                 "not measured; rerun it, or leave the pair out "
                                                 "(empty cell / null) and pass --fill"),
            (off & np.isinf(m), "infinite", "give a finite GB/s")):
        if mask.any():
            i, j = map(int, np.argwhere(mask)[0])
            more = f" ({int(mask.sum())} such entries)" if mask.sum() > 1 else ""
            raise SpecError(f"bandwidth {names[i]} -> {names[j]} is {what}{more}; {hint}",
                            source=src, field=f"{names[i]} -> {names[j]}")
    measured = off & ~np.isnan(m)
    # each node's slowest measured stream, in or out (inf where none): min-row's bound
    ends = [float(min(np.min(m[k][measured[k]], initial=np.inf),
                      np.min(m[:, k][measured[:, k]], initial=np.inf))) for k in range(n)]
    warnings: list[str] = []
    filled: set[str] = set()
    for rule in fill:
        if rule not in FILL_RULES:
            raise SpecError(f"unknown fill rule '{rule}'; use {' or '.join(FILL_RULES)}",
                            source="options", field="--fill")
        missing = off & np.isnan(m)
        for i, j in map(tuple, np.argwhere(missing)):
            if rule == "symmetric" and measured[j, i]:
                v = m[j, i]
            elif rule == "min-row" and math.isfinite(ends[i]) and math.isfinite(ends[j]):
                v = float(min(ends[i], ends[j]))
            else:
                continue
            m[i, j] = v
            warnings.append(f"filled {names[i]} -> {names[j]} = {v:.2f} GB/s ({rule})")
            filled.add(names[i])
            filled.add(names[j])
    # a host a file's run named otherwise than its file name (n3.cluster.local in
    # sendrecv_n1_n3.txt) may be another node's second name: filling its pairs would make a
    # node of it that the cluster does not have
    for said, ran, what in meas.renamed if filled else ():
        said, ran = set(said), set(ran)
        alias = sorted((ran - said) & filled)
        if alias and said - ran <= set(names):
            raise SpecError(f"--fill would fill the pairs of {alias[0]}, which only a file "
                            f"named for {'/'.join(sorted(said - ran))} measured ({what}): "
                            "if they are one host, give it one name in every file's "
                            "'# Rank ... on HOST' lines; otherwise measure its pairs",
                            source=src, field=alias[0])
    missing = off & np.isnan(m)
    if missing.any():
        pairs = [f"{names[i]} -> {names[j]}" for i, j in np.argwhere(missing)]
        shown = ", ".join(pairs[:6]) + (f" and {len(pairs) - 6} more" if len(pairs) > 6 else "")
        dark = [names[k] for k in range(n) if not (measured[k].any() or measured[:, k].any())]
        other = [r for r in FILL_RULES if r not in fill]
        hint = ("measure them, or pass --fill symmetric (use the reverse direction) and/or "
                "--fill min-row (the slowest measured stream of either node)") if not fill else (
            f"{', '.join(dark)} {'has' if len(dark) == 1 else 'have'} no measured stream at "
            "all: measure {}".format("it" if len(dark) == 1 else "them") if dark else
            "no rule given could fill them; measure them"
            + (f" or add --fill {other[0]}" if other else ""))
        # what reading noticed that may explain the gaps (a file named for one host whose
        # run was on another, e.g. a fully qualified name): said with the error, as the
        # warnings of a failed import are not printed
        why = [w.split(": ", 1)[-1] for w in meas.warnings if "file name says" in w]
        raise SpecError(f"{len(pairs)} missing pair(s): {shown}; {hint}"
                        + (f" (note: {why[0]}" + (f"; {len(why) - 1} more such file(s)"
                                                   if len(why) > 1 else "") + ")"
                           if why else ""), source=src, field=pairs[0])
    np.fill_diagonal(m, 0.0)
    for i in range(n):
        for j in range(i + 1, n):
            lo, hi = sorted((m[i, j], m[j, i]))
            if hi / lo > asym_ratio:
                msg = (f"asymmetric: {names[i]} -> {names[j]} {m[i, j]:.2f} GB/s but "
                       f"{names[j]} -> {names[i]} {m[j, i]:.2f} GB/s ({hi / lo:.2f}x > "
                       f"{asym_ratio}x)")
                if strict:
                    raise SpecError(msg + "; remeasure, or drop --strict to accept it",
                                    source=src, field=f"{names[i]} -> {names[j]}")
                warnings.append(msg)
    return names, m, meas.warnings + warnings


def build_cluster(names: list[str], gb_per_s: np.ndarray, *, gpu: str, gpus_per_node: int,
                  intra_gb_per_s: float | None = None, intra_topology: str | None = None,
                  latency_us: float = 5.0, name: str = "imported", source: str = "import",
                  intra_latency_us: float = INTRA_LATENCY_US):
    """A ClusterSpec through formats.clusters.cluster_from_dict (the file format's own checks)."""
    if intra_gb_per_s is None and intra_topology is None:
        raise SpecError("give --intra-gb-per-s (one direction of one GPU's NVLink, as measured)"
                        " or --intra-topology", source="options", field="--intra-gb-per-s")
    nodes = []
    for nm in names:
        nd = {"name": nm, "gpu": gpu, "gpus": gpus_per_node}
        if intra_gb_per_s is not None:
            nd["intra_gb_per_s"] = intra_gb_per_s
        if intra_topology is not None:
            nd["intra_topology"] = intra_topology
        nodes.append(nd)
    raw = {"name": name, "latency_us": latency_us, "intra_latency_us": intra_latency_us,
           "nodes": nodes, "inter": {"gb_per_s": [[float(v) for v in row] for row in gb_per_s]}}
    return cluster_from_dict(raw, source)


# the fastest stream one GPU's NIC delivers in 2026: 800 Gbit/s (NVIDIA ConnectX-8 SuperNIC
# datasheet), 100 GB/s
MAX_NIC_GB_PER_S = 100.0


def implausible_rates(c) -> list[str]:
    """Warnings for a matrix whose inter-node streams are faster than any NIC, or than the
    nodes' own NVLink: most likely a Gbit/s matrix read as GB/s (8x too fast)."""
    m = np.asarray(c.inter_gb_per_s, dtype=float)
    top = float(m[~np.eye(len(m), dtype=bool)].max()) if len(m) > 1 else 0.0
    intra = min(nd.ring_gb_per_s(tuple(range(nd.num_gpus))) if nd.num_gpus > 1 else math.inf
                for nd in c.nodes)
    out = []
    if top > MAX_NIC_GB_PER_S or top > intra:
        out.append(f"the fastest inter-node stream is {top:.1f} GB/s, above "
                   + (f"any NIC's ({MAX_NIC_GB_PER_S:g} GB/s, 800 Gbit/s)"
                      if top > MAX_NIC_GB_PER_S else f"the nodes' own NVLink ({intra:.1f} GB/s)")
                   + ": if the matrix is in Gbit/s, say so (--units gbit_per_s or a header "
                   "unit)")
    return out


# ---------------------------------------------------------------------------------------------
# Looking at a cluster


OUTLIER_RATIO = 0.75  # a node whose best stream out or in is below this x the other nodes'
                      # best (summarize)
GROUP_RATIO = 0.85    # links >= this x the fastest link join one switch group


def outlier_nodes(c) -> list[tuple[int, str, dict]]:
    """The nodes `summarize` calls outliers, as (node index, "network" or "NVLink", its
    summary entry): a degraded NIC, then a degraded NVLink (what solve's slow-node lines and
    the placement picture's frames name)."""
    s = summarize(c)
    idx = {nd.name: n for n, nd in enumerate(c.nodes)}
    return ([(idx[o["node"]], "network", o) for o in s.get("outliers", [])]
            + [(idx[o["node"]], "NVLink", o) for o in s.get("intra_outliers", [])])


def summarize(c, slowest: int = 5, outlier_ratio: float = OUTLIER_RATIO,
              group_ratio: float = GROUP_RATIO, asym_ratio: float = ASYMMETRY_WARN_RATIO
              ) -> dict:
    """Slowest links, outlier nodes, inferred switch groups, asymmetric pairs (JSON-ready).

    Outliers: nodes whose median link (in and out) is < outlier_ratio x the median of all
    links. Switch groups: connected components of the graph whose edges are node pairs with
    mean(m_ab, m_ba) >= group_ratio x the largest such mean, computed without the outliers;
    each outlier is then attached to the group its links are fastest to ("attached").
    """
    names = [nd.name for nd in c.nodes]
    m = np.asarray(c.inter_gb_per_s, dtype=float)
    n = len(names)
    off = ~np.eye(n, dtype=bool)
    out: dict = {"name": c.name, "nodes": n, "gpus": c.num_gpus, "latency_us": c.latency_us,
                 "intra_latency_us": c.intra_latency_us}
    # inside each node: its GPUs, its best ring through all of them and, where it has a
    # GPU-by-GPU matrix, its slowest link; nodes whose ring is below outlier_ratio x the
    # median ring are intra-node outliers (a degraded NVLink)
    kinds = []
    for nd in c.nodes:
        k = {"node": nd.name, "gpu": nd.gpu.name, "gpus": nd.num_gpus,
             "intra_gb_per_s": nd.ring_gb_per_s(tuple(range(nd.num_gpus)))
             if nd.num_gpus > 1 else None}
        mat = nd.intra_matrix_gb_per_s
        if mat is not None and nd.num_gpus > 1:
            k["intra_min_link_gb_per_s"] = float(
                np.asarray(mat, dtype=float)[~np.eye(nd.num_gpus, dtype=bool)].min())
        kinds.append(k)
    out["node_detail"] = kinds
    rings = [k["intra_gb_per_s"] for k in kinds if k["intra_gb_per_s"] is not None]
    ring_med = float(np.median(rings)) if rings else None
    out["intra_outliers"] = [
        {"node": k["node"], "intra_gb_per_s": k["intra_gb_per_s"],
         "ratio": k["intra_gb_per_s"] / ring_med} for k in kinds
        if k["intra_gb_per_s"] is not None and k["intra_gb_per_s"] < outlier_ratio * ring_med]
    if n < 2:
        out.update(median_gb_per_s=None, slowest_links=[], outliers=[],
                   groups=[names], attached={}, unattached=[], asymmetric=[])
        return out
    vals = m[off]
    med = float(np.median(vals))
    out.update(median_gb_per_s=med, min_gb_per_s=float(vals.min()),
               max_gb_per_s=float(vals.max()))
    links = sorted(((float(m[i, j]), names[i], names[j]) for i in range(n) for j in range(n)
                    if i != j))
    out["slowest_links"] = [{"from": a, "to": b, "gb_per_s": v} for v, a, b in links[:slowest]]
    node_med = [float(np.median(np.concatenate([m[i][off[i]], m[:, i][off[:, i]]])))
                for i in range(n)]
    out["node_median_gb_per_s"] = dict(zip(names, node_med))
    # A node is an outlier when its best stream out (or in) is below outlier_ratio x the
    # median of the other nodes' best streams out (in). A degraded NIC slows every stream of
    # its node, to its leaf-mates too; a healthy node of a small leaf still has a fast one,
    # to a leaf-mate. (Against the cluster's median link, one degraded node of three went
    # unflagged, its links two thirds of them, and a node slow only to send sat on the line;
    # against the links not touching the node, the nodes of a small leaf were flagged.) A node
    # alone in its leaf is flagged: its every stream crosses the spine. On synthetic clusters
    # (3-16 nodes, leaves of 2-16, 3 seeds) it finds every degraded node (210 of 210, the
    # median rule 193) and flags no healthy node outside a lone leaf up to +-10% noise per
    # link (0 of 162; the median rule 9), 13 of 162 at +-20% (5).
    outl, rows = [], []
    if n >= 3:
        best_out = [float(m[k, off[k]].max()) for k in range(n)]
        best_in = [float(m[off[:, k], k].max()) for k in range(n)]
        for i in range(n):
            ref_out = float(np.median([best_out[k] for k in range(n) if k != i]))
            ref_in = float(np.median([best_in[k] for k in range(n) if k != i]))
            out_r, in_r = best_out[i] / ref_out, best_in[i] / ref_in
            low = min(out_r, in_r)
            if low < outlier_ratio:
                outl.append(i)
                rows.append({"node": names[i], "median_gb_per_s": node_med[i],
                             "best_gb_per_s": min(best_out[i], best_in[i]),
                             "ratio": float(low),
                             "direction": ("both" if max(out_r, in_r) < outlier_ratio else
                                           "out" if out_r < in_r else "in")})
    out["outliers"] = rows
    sym = (m + m.T) / 2
    core = [i for i in range(n) if i not in outl] or list(range(n))
    top = max(sym[i, j] for i in core for j in core if i != j) if len(core) > 1 else 0.0
    comp = UnionFind(core)
    for i in core:
        for j in core:
            if i < j and sym[i, j] >= group_ratio * top:
                comp.union(i, j)
    groups: dict[int, list[int]] = {}
    for i in core:
        groups.setdefault(comp[i], []).append(i)
    glist = sorted(groups.values())
    attached, untold = {}, []
    for i in outl:
        if i in core:
            continue
        means = [float(np.mean([sym[i, j] for j in g])) for g in glist]
        best = max(range(len(glist)), key=lambda g: means[g])
        if sum(x >= (1 - ATTACH_TIE) * means[best] for x in means) > 1:
            # its links to two groups alike (a node degraded to one rate everywhere): which
            # switch it hangs on is not in the measurements, and is not guessed
            untold.append(names[i])
            continue
        glist[best].append(i)
        attached[names[i]] = best
    out["groups"] = [[names[i] for i in sorted(g)] for g in glist]
    out["attached"] = attached
    out["unattached"] = untold
    asym = []
    for i in range(n):
        for j in range(i + 1, n):
            lo, hi = sorted((m[i, j], m[j, i]))
            if hi / lo > asym_ratio:
                asym.append({"a": names[i], "b": names[j], "ratio": float(hi / lo)})
    out["asymmetric"] = asym
    return out


# ---------------------------------------------------------------------------------------------
# helpers


def _read_text(path: str | Path) -> str:
    return read_text(path, what="the measurement file")


def _float_or(text: str, default: float = math.nan) -> float:
    try:
        return float(text)
    except ValueError:
        return default


def _check_names(names: list[str], src: str, fld: str) -> None:
    empty = [i for i, x in enumerate(names) if not str(x).strip()]
    if empty:
        raise SpecError(f"node name #{empty[0]} is empty", source=src, field=fld)
    check_unique_hosts(names, src, fld)


def _natural_sorted(xs) -> list[str]:
    return sorted(xs, key=lambda s: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)])
