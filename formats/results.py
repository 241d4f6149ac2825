"""The sweep results store (SQLite) and its report.

SQLite, not Parquet: it is in the standard library, every task's row is one committed
transaction (a kill at any moment leaves the committed rows whole and the one in flight absent),
and a rerun can query which task ids are done. Each row carries the SHA-256 of its JSON payload;
a row whose payload does not match (a damaged file) is reported and dropped, never read
silently. Tables: `tasks` (one row per finished task), `starts` (every dispatch, for auditing
that no recorded task runs again).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import sqlite3
import statistics
import time
from collections import defaultdict
from pathlib import Path

from .atomic import write_atomic
from .sweepspec import BASELINES


class Store:
    def __init__(self, path, create: bool = True):
        """Open the store (`create`: make it where it is absent, for a sweep; a report only
        reads one). A path that is not a store is one SpecError naming it."""
        from model.errors import SpecError

        self.path = Path(path)
        src, fld = str(self.path), "--results" if create else "RESULTS"
        if self.path.is_dir():
            raise SpecError("is a folder; give the results store file (.sqlite)", source=src,
                            field=fld)
        if not create and not self.path.exists():
            raise SpecError("file not found; give the results store a sweep wrote", source=src,
                            field=fld)
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # a report only reads: it changes nothing in the store (a damaged row is skipped and
        # left for the next sweep run to drop and run again)
        self.read_only = not create
        try:
            # read-only for a report: a plain connection's close folds the write-ahead log
            # into the file (a store left by a killed sweep changed on a report)
            self.conn = (sqlite3.connect(self.path) if create else
                         sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True))
            if create:
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=FULL")
                with self.conn:
                    self.conn.execute("CREATE TABLE IF NOT EXISTS tasks (id TEXT PRIMARY KEY, "
                                      "payload TEXT NOT NULL, sha TEXT NOT NULL, "
                                      "recorded REAL)")
                    self.conn.execute("CREATE TABLE IF NOT EXISTS starts (id TEXT, t REAL)")
                    # each sweep run: its spec's name and every task id it asks for (JSON), so
                    # that a report can say what is unfinished and what comes from another spec
                    self.conn.execute("CREATE TABLE IF NOT EXISTS sweeps (name TEXT, ids TEXT, "
                                      "t REAL)")
            tables = {r[0] for r in self.conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"tasks", "starts"} <= tables:
                raise sqlite3.DatabaseError("no tasks and starts tables")
        except sqlite3.Error as e:  # not a database, or one this sweep cannot write
            raise SpecError(f"is not a sweep results store (SQLite: {e}); give another path",
                            source=src, field=fld) from None
        self.warnings: list[str] = []
        self._revision: str | None = None  # `record`'s stamp

    def record(self, result: dict) -> None:
        """Commit one finished task, stamped with the cost model's revision that priced it
        (planfile.cost_model_revision, hashed once per store: its sources do not change under
        a running sweep): rows of several revisions are told apart."""
        if self._revision is None:
            from .planfile import cost_model_revision
            self._revision = cost_model_revision()
        result = {"cost_model_revision": self._revision, **result}
        payload = json.dumps(result, sort_keys=True, allow_nan=True)
        sha = hashlib.sha256(payload.encode()).hexdigest()
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO tasks VALUES (?, ?, ?, ?)",
                              (result["id"], payload, sha, time.time()))

    def started(self, task_id: str) -> None:
        with self.conn:
            self.conn.execute("INSERT INTO starts VALUES (?, ?)", (task_id, time.time()))

    def rows(self) -> list[dict]:
        out = []
        bad = []
        for tid, payload, sha in self.conn.execute("SELECT id, payload, sha FROM tasks"):
            if hashlib.sha256(payload.encode()).hexdigest() != sha:
                bad.append(tid)
                continue
            try:
                out.append(json.loads(payload))
            except json.JSONDecodeError:
                bad.append(tid)
        if bad and self.read_only:
            self.warnings.append(f"{self.path}: {len(bad)} damaged row(s) skipped (checksum "
                                 f"mismatch): {', '.join(bad[:5])}; left in the store, which "
                                 "the next sweep run drops and runs again")
        elif bad:
            self.warnings.append(f"{self.path}: {len(bad)} damaged row(s) dropped (checksum "
                                 f"mismatch): {', '.join(bad[:5])}; they will run again")
            with self.conn:
                self.conn.executemany("DELETE FROM tasks WHERE id = ?", [(b,) for b in bad])
        return out

    def done_ids(self) -> set[str]:
        """Tasks finished successfully (a failed task runs again on the next run)."""
        return {r["id"] for r in self.rows() if r.get("status") == "done"}

    def starts(self) -> list[tuple[str, float]]:
        return list(self.conn.execute("SELECT id, t FROM starts"))

    def note_sweep(self, name: str, ids: list[str]) -> None:
        """Record a sweep run: its spec's name and the ids of all its tasks."""
        with self.conn:
            self.conn.execute("INSERT INTO sweeps VALUES (?, ?, ?)",
                              (name, json.dumps(sorted(ids)), time.time()))

    def coverage_warnings(self, rows: list[dict]) -> list[str]:
        """What a report of `rows` (this store's finished tasks) should say besides its
        tables: tasks a sweep asked for and the store has no result of (a sweep stopped
        early), and tasks of several specs reported together. A store written before the
        sweeps table (2026-12-07) tells only the tasks started and not finished."""
        finished = {r["id"] for r in rows}
        tables = {r[0] for r in self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        out = []
        asked: dict[str, set[str]] = {}
        if "sweeps" in tables:
            # each spec's latest run: an edited spec no longer asks for the tasks it dropped
            damaged = 0
            for name, ids in self.conn.execute("SELECT name, ids FROM sweeps ORDER BY t"):
                try:
                    got = json.loads(ids)
                except (TypeError, json.JSONDecodeError):
                    got = None
                if not isinstance(got, list) or not all(isinstance(i, str) for i in got):
                    damaged += 1
                    continue
                asked[str(name)] = set(got)
            if damaged:
                out.append(f"{damaged} damaged row(s) of the store's sweeps table skipped: what "
                           "those runs asked for is not known")
            if len(asked) > 1:
                out.append(f"the store holds the tasks of {len(asked)} sweep specs "
                           f"({', '.join(sorted(asked))}): the tables report them together")
            every = set().union(*asked.values()) if asked else set()
            if asked and (extra := finished - every):
                out.append(f"{len(extra)} finished task(s) in the store are not in the latest "
                           "run of any spec (an earlier version of one): the tables include "
                           "them")
        else:
            every = {i for i, _t in self.starts()}
        revs = {r.get("cost_model_revision") for r in rows if r.get("status") == "done"}
        if len(revs) > 1:
            # a row without one was stored before 2026-12-08
            out.append(f"the finished tasks were priced by {len(revs)} cost-model revisions "
                       f"({', '.join(sorted(str(x) for x in revs))}; points.csv names each): "
                       "their times compare only within a revision; run the sweep into a "
                       "new store to price them all alike")
        if missing := every - finished:
            out.append(f"{len(missing)} of the {len(every)} tasks the sweep"
                       f"{'s' if len(asked) > 1 else ''} asked for have no result in "
                       f"{self.path} (stopped before they finished): "
                       f"the tables cover the {len(every & finished)} finished; run the sweep "
                       "again to finish it")
        return out

    def close(self) -> None:
        self.conn.close()


def _instance(r: dict) -> str:
    i = r["inputs"]
    return json.dumps({"model": i["model"], "cluster": i["cluster"], "job": i["job"],
                       "files": i.get("files")}, sort_keys=True)


def summarize(rows: list[dict]) -> tuple[list[dict], dict]:
    """Per (method, nodes): median and worst gap to the best known plan of the instance
    (time / best - 1), median and worst gap to the instance's best bound as solve reports a
    gap ((time - bound) / time), and the median smallest budget within 0.5% (none for the
    baselines, which use no budget); `failed` counts the group's failed tasks and `no_bound`
    its finished ones whose instance has no bound above 0, both left out of the gaps."""
    ok = [r for r in rows if r.get("status") == "done" and r.get("iteration_ms")]
    best = defaultdict(lambda: math.inf)
    bound = defaultdict(lambda: 0.0)
    for r in ok:
        k = _instance(r)
        best[k] = min(best[k], r["iteration_ms"])
        if r.get("bound_ms"):
            bound[k] = max(bound[k], r["bound_ms"])
    groups = defaultdict(list)
    for r in ok:
        groups[(r["inputs"]["method"], r["nodes"])].append(r)
    # tasks that failed (nothing fits, a bad input) and finished tasks whose instance has no
    # bound above 0: counted in their own columns, never silently out of the gaps
    failed = defaultdict(int)
    for r in rows:
        if r not in ok:
            failed[(r["inputs"]["method"], r.get("nodes"))] += 1
    for key in failed:
        groups.setdefault(key, [])
    table = []
    for (method, nodes), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        gaps = [r["iteration_ms"] / best[_instance(r)] - 1 for r in rs]
        bgaps = [1 - bound[_instance(r)] / r["iteration_ms"] for r in rs
                 if bound[_instance(r)] > 0]
        unbounded = sum(1 for r in rs if not bound[_instance(r)] > 0)
        within = defaultdict(lambda: math.inf)
        for r in rs:
            if r["iteration_ms"] <= best[_instance(r)] * 1.005:
                within[_instance(r)] = min(within[_instance(r)], r["inputs"]["budget_s"])
        insts = {_instance(r) for r in rs}
        t05 = [within[i] for i in insts]
        table.append({"method": method, "nodes": nodes, "tasks": len(rs),
                      "failed": failed[(method, nodes)],
                      # baselines too: their gap to the bound is to the instance's bound
                      "no_bound": unbounded,
                      "median_gap_to_best": statistics.median(gaps) if gaps else None,
                      "worst_gap_to_best": max(gaps) if gaps else None,
                      "median_gap_to_bound": statistics.median(bgaps) if bgaps else None,
                      "worst_gap_to_bound": max(bgaps) if bgaps else None,
                      "median_budget_within_0.5pct_s": statistics.median(t05)
                      if method not in BASELINES and t05 and all(math.isfinite(x) for x in t05)
                      else None,
                      "median_wall_s": statistics.median(r["wall_s"] for r in rs) if rs
                      else None})
    return table, {"best": dict(best), "bound": dict(bound)}


def _finish(plt, fig, ax, xlabel: str, ylabel: str, title: str, path: Path,
            legend: bool = True) -> Path:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if legend:
        ax.legend()
    fmt = ax.yaxis.get_major_formatter()
    if hasattr(fmt, "set_useOffset"):  # ticks as values, not '+1.001' and small offsets
        fmt.set_useOffset(False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")  # long labels kept whole
    plt.close(fig)
    write_atomic(Path(path), buf.getvalue(), field="report")
    return path


POINT_COLUMNS = ("id", "status", "method", "budget_s", "seed", "clock", "model", "cluster",
                 "job", "nodes", "bw_spread", "plan", "iteration_ms", "bound_ms", "gap",
                 "gap_to_best", "peak_memory_gib", "termination", "wall_s", "work_s",
                 "cost_model_revision", "error")


def point_rows(rows: list[dict], best: dict) -> list[dict]:
    """One row per task as the store holds it (points.csv): its inputs (the cluster and job
    as JSON), its plan, time, bound and solver gap, its gap to the best plan known for its
    instance (`best`: summarize's), how it ended; failed tasks with their error."""
    out = []
    for r in sorted(rows, key=lambda r: r.get("id", "")):
        i = r["inputs"]
        t, b = r.get("iteration_ms"), best.get(_instance(r))
        out.append({
            "id": r.get("id"), "status": r.get("status"), "method": i["method"],
            "budget_s": i.get("budget_s"), "seed": i.get("seed"), "clock": i.get("clock"),
            "model": i["model"], "cluster": json.dumps(i["cluster"], sort_keys=True),
            "job": json.dumps(i["job"], sort_keys=True), "nodes": r.get("nodes"),
            "bw_spread": r.get("bw_spread"), "plan": r.get("plan"), "iteration_ms": t,
            "bound_ms": r.get("bound_ms"), "gap": r.get("gap"),
            "gap_to_best": t / b - 1 if t and b and math.isfinite(b) else None,
            "peak_memory_gib": r.get("peak_memory_gib"),
            "termination": r.get("termination"), "wall_s": r.get("wall_s"),
            "work_s": r.get("work_s"), "cost_model_revision": r.get("cost_model_revision"),
            "error": r.get("error")})
    return out


def report(rows: list[dict], out_dir) -> list[Path]:
    """Tables (CSV and Markdown; points.csv one row per task) and three PNGs: gap vs nodes
    per method, quality vs budget,
    the plain launch's loss (the sweep's "megatron" task: Megatron-LM's placement and balanced
    split of the best shape it scores, over the best plan) vs the bandwidth spread."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from model.errors import SpecError

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise SpecError("is a file; the report writes a folder of tables and plots: give a "
                        "folder", source=str(out), field="--out")
    out.mkdir(parents=True, exist_ok=True)
    table, ref = summarize(rows)
    files = []
    cols = list(table[0]) if table else []
    for name, fields, body in (("summary.csv", cols, table),
                               ("points.csv", POINT_COLUMNS, point_rows(rows, ref["best"]))):
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=fields)
        w.writeheader()
        w.writerows(body)
        write_atomic(out / name, buf.getvalue(), field="report")
        files.append(out / name)

    def fmt(v):
        return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
    p = out / "summary.md"
    write_atomic(p, "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n" + "".join(
        "| " + " | ".join(fmt(r[c]) for c in cols) + " |\n" for r in table), field="report")
    files.append(p)
    ok = [r for r in rows if r.get("status") == "done" and r.get("iteration_ms")]
    methods = sorted({r["inputs"]["method"] for r in ok})
    # 1. median gap to the best known vs nodes, per method
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in methods:
        pts = sorted((r["nodes"], r["median_gap_to_best"]) for r in table if r["method"] == m
                     and r["median_gap_to_best"] is not None and r["nodes"] is not None)
        ax.plot([x for x, _ in pts], [100 * y for _, y in pts], marker="o", label=m)
    files.append(_finish(plt, fig, ax, "nodes", "median gap to the best known plan (%)",
                         "Gap vs cluster size", out / "gap_vs_nodes.png"))
    # 2. quality vs budget
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in methods:
        by_b = defaultdict(list)
        for r in ok:
            if r["inputs"]["method"] == m:
                by_b[r["inputs"]["budget_s"]].append(
                    r["iteration_ms"] / ref["best"][_instance(r)] - 1)
        if m in BASELINES:  # no budget: a level line across the budgets
            y = 100 * statistics.median(v for vs in by_b.values() for v in vs)
            # axhline spans the axis whatever the budgets (from the one budget to itself,
            # a plotted segment had no length and nothing showed)
            # each baseline its own dashes: equal levels show both, not the last drawn
            ax.axhline(y, linestyle=(0, (5, 3)) if m == "megatron" else (4, (1, 3)),
                       linewidth=2, color=f"C{methods.index(m)}", label=m + " (no budget)")
            continue
        bs = sorted(by_b)
        ax.plot(bs, [100 * statistics.median(by_b[b]) for b in bs], marker="o", label=m)
    ax.set_xscale("log")
    budgets = sorted({r["inputs"]["budget_s"] for r in ok
                      if r["inputs"]["method"] not in BASELINES})
    if budgets:  # the budgets run as plain numbers, not 2 x 10^0
        from matplotlib.ticker import NullFormatter, ScalarFormatter
        ax.set_xticks(budgets)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    clocks = {r["inputs"].get("clock", "wall") for r in ok}
    unit = {"wall": "s", "work": "work-s"}.get(clocks.pop(), "s") if len(clocks) == 1 else \
        "s, or work-s with clock = work"
    files.append(_finish(plt, fig, ax, f"budget ({unit})", "median gap to the best known plan (%)",
                         "Quality vs budget", out / "quality_vs_budget.png"))
    # 3. plain Megatron-LM launch (placement and balanced split) vs bandwidth spread
    fig, ax = plt.subplots(figsize=(6, 4))
    meg = {}
    for r in ok:
        if r["inputs"]["method"] == "megatron":
            meg[_instance(r)] = r
    xs, ys = [], []
    for k, r in meg.items():
        xs.append(r["bw_spread"])
        ys.append(r["iteration_ms"] / ref["best"][k])
    ax.scatter(xs, ys)
    if not xs:  # an empty frame said nothing
        ax.text(0.5, 0.5, "no megatron task finished in this store", ha="center",
                va="center", transform=ax.transAxes)
    files.append(_finish(plt, fig, ax, "bandwidth spread (fastest / slowest inter-node stream)",
                         "Megatron-LM placement and balanced split / best plan",
                         "Plain Megatron-LM launch vs link spread",
                         out / "gain_vs_spread.png", legend=False))
    return files
