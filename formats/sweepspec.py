"""Sweep specs (TOML) as tasks with stable ids, and a task's inputs built from presets, files
or synthetic-cluster parameters. The spec's format is in solvers/sweep.py's docstring and the
README."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from model.errors import SpecError
from model.specs import JobSpec

from .reading import read_text, unknown_keys

METHODS = ("exact", "anneal", "megatron", "amp-style")
# the methods that search nothing: their plan depends on neither budget nor seed
BASELINES = ("megatron", "amp-style")
CLOCKS = ("wall", "work")


@dataclass(frozen=True)
class Task:
    model: str
    cluster: dict  # {"preset": name} | {"file": path} | {"synth": {...}}
    job: dict
    method: str
    budget_s: float
    seed: int
    # moves per annealing run instead of cooling by the clock (same answer on any machine)
    anneal_moves: int | None = None
    # "work": budgets in work seconds (model.work), the same answer on any machine and under
    # any load; "wall" (the default) is solve's --time-limit
    clock: str = "wall"
    # SHA-256 of the files the task reads (a cluster file, a model's config.json): an edited
    # file is another task, not the stored result of the old one (load_spec fills it)
    file_digests: tuple = ()

    def inputs(self) -> dict:
        d = {"model": self.model, "cluster": self.cluster, "job": self.job,
             "method": self.method, "budget_s": self.budget_s, "seed": self.seed}
        if self.file_digests:  # absent without files: preset-only task ids stay valid
            d["files"] = dict(self.file_digests)
        if self.anneal_moves is not None:  # absent otherwise: earlier task ids stay valid
            d["anneal_moves"] = self.anneal_moves
        if self.clock != "wall":  # likewise
            d["clock"] = self.clock
        return d

    @property
    def id(self) -> str:
        blob = json.dumps(self.inputs(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


# bounds of a spec, with the reason: a study of a million tasks is past any machine's run;
# budgets as solve's --time-limit
MAX_TASKS = 1_000_000
MAX_BUDGET_S = 7 * 86400
MAX_ANNEAL_MOVES = 10**8  # about a day of moves on one core


def _grid(d: dict, src: str, fld: str) -> list[dict]:
    """Expand every list value of a flat dict into the grid of its combinations."""
    if not isinstance(d, dict) or not d:
        raise SpecError("must be a table of parameters (lists expand into a grid)", source=src,
                        field=fld)
    keys = sorted(d)
    vals = [d[k] if isinstance(d[k], list) else [d[k]] for k in keys]
    if any(not v for v in vals):
        raise SpecError("an empty list expands into no cluster", source=src, field=fld)
    n = 1
    for v in vals:
        n *= len(v)
        if n > MAX_TASKS:
            raise SpecError(f"expands into more than {MAX_TASKS:,} clusters", source=src,
                            field=fld)
    return [dict(zip(keys, combo)) for combo in itertools.product(*vals)]


def _list(spec: dict, key: str, default, src: str, fld: str) -> list:
    v = spec.get(key, default)
    if not isinstance(v, list) or not v:
        raise SpecError("must be a non-empty list", source=src, field=fld)
    return v


def _tables(spec: dict, key: str, src: str) -> list[dict]:
    v = spec.get(key, [])
    if not isinstance(v, list) or any(not isinstance(x, dict) for x in v):
        raise SpecError(f"must be [[{key}]] tables", source=src, field=key)
    return v


def _config_file(p: Path) -> Path | None:
    """The file a model path reads: itself, or a folder's config.json (as presets.model)."""
    if p.is_file():
        return p
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    return None


def _spec_relative(spec_path, name: str) -> str:
    """A model name that is a path (a file next to the spec, a folder there holding a
    config.json, or a name ending in .json) as an absolute path relative to the spec's folder;
    a preset name as given (an unrelated folder of that name beside the spec included)."""
    p = Path(name)
    if p.is_absolute():
        return name
    here = Path(spec_path).parent / p
    if _config_file(here) is not None or p.suffix.lower() == ".json":
        return str(here.resolve())
    return name


def _is_file(x) -> bool:
    return isinstance(x, str) and _config_file(Path(x)) is not None


def _digest(path: str, src: str) -> str:
    try:
        return hashlib.sha256(_config_file(Path(path)).read_bytes()).hexdigest()[:20]
    except OSError as e:
        raise SpecError(f"cannot read {path}: {e.strerror}", source=src, field="files") \
            from None


def load_spec(path) -> tuple[str, list[Task]]:
    """Read a sweep spec; every problem is one SpecError naming the file and the field."""
    src = str(path)
    text = read_text(path, field="spec", what="the sweep spec")
    try:
        spec = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"not TOML ({e})", source=src, field="spec") from None
    unknown_keys(spec, ("sweep", "models", "jobs", "clusters"), src)
    sw = spec.get("sweep", {})
    if not isinstance(sw, dict):
        raise SpecError("must be a [sweep] table", source=src, field="sweep")
    unknown_keys(sw, ("methods", "budgets", "seeds", "anneal_moves", "clock", "name"), src,
                 "sweep")
    methods = _list(sw, "methods", list(METHODS), src, "sweep.methods")
    for m in methods:
        if m not in METHODS:
            raise SpecError(f"unknown method {str(m)[:40]!r}; use {', '.join(METHODS)}",
                            source=src, field="sweep.methods")
    budgets = _list(sw, "budgets", [10.0], src, "sweep.budgets")
    if any(isinstance(b, bool) or not isinstance(b, (int, float)) or not
           0 < b <= MAX_BUDGET_S for b in budgets):
        raise SpecError(f"budgets must be seconds, above 0 and at most {MAX_BUDGET_S:,}",
                        source=src, field="sweep.budgets")
    seeds = _list(sw, "seeds", [0], src, "sweep.seeds")
    if any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2**32
           for x in seeds):
        raise SpecError("seeds must be integers from 0 to 2^32 - 1", source=src,
                        field="sweep.seeds")
    moves = sw.get("anneal_moves")
    if moves is not None and (isinstance(moves, bool) or not isinstance(moves, int)
                              or not 1 <= moves <= MAX_ANNEAL_MOVES):
        raise SpecError(f"must be an integer from 1 to {MAX_ANNEAL_MOVES:,} (moves per "
                        "annealing run), or absent (cooling by the clock)", source=src,
                        field="sweep.anneal_moves")
    clock = sw.get("clock", "wall")
    if clock not in CLOCKS:
        raise SpecError(f"is {str(clock)[:40]!r}; use \"work\" (budgets in work seconds: "
                        "the same results on any machine and executor) or \"wall\"",
                        source=src, field="sweep.clock")
    name = sw.get("name", Path(path).stem)
    if not isinstance(name, str) or not name.strip():
        raise SpecError("must be a non-empty string", source=src, field="sweep.name")
    for k, m in enumerate(_tables(spec, "models", src)):
        unknown_keys(m, ("name",), src, f"models[{k}]")
    models = [m.get("name") for m in _tables(spec, "models", src)]
    if not models or any(not isinstance(m, str) for m in models):
        raise SpecError("give at least one [[models]] with a name", source=src, field="models")
    # a model given as a config.json path is read relative to the spec, as a cluster file
    # (it had been relative to the working directory)
    models = [_spec_relative(path, m) for m in models]
    jobs = _tables(spec, "jobs", src)
    if not jobs:
        raise SpecError("give at least one [[jobs]] (global_batch, seq_length)", source=src,
                        field="jobs")
    # each job's fields are JobSpec's, named here by the spec's own keys (a misspelt or
    # missing one had been JobSpec.__init__()'s TypeError: "got an unexpected keyword")
    job_keys = [f.name for f in dataclasses.fields(JobSpec) if f.name != "source"]
    for k, j in enumerate(jobs):
        unknown_keys(j, job_keys, src, f"jobs[{k}]")
        for f in dataclasses.fields(JobSpec):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING \
                    and f.name not in j:
                raise SpecError("missing", source=src, field=f"jobs[{k}].{f.name}")
        # the job's own checks, named by its place in the spec (they had named the bare field:
        # 'fp8', of which job?)
        try:
            JobSpec(**j, source=src)
        except SpecError as e:
            raise SpecError(e.problem, source=src, field=f"jobs[{k}].{e.field}") from None
    clusters: list[dict] = []
    for k, c in enumerate(_tables(spec, "clusters", src)):
        fld = f"clusters[{k}]"
        unknown_keys(c, ("preset", "file", "synth"), src, fld)
        if len(c) > 1:
            raise SpecError(f"gives {' and '.join(sorted(c))}; a [[clusters]] entry is one of "
                            "preset, file or synth", source=src, field=fld)
        if "preset" in c:
            if not isinstance(c["preset"], str):
                raise SpecError("must be a cluster preset name", source=src,
                                field=f"{fld}.preset")
            clusters.append({"preset": c["preset"]})
        elif "file" in c:
            if not isinstance(c["file"], str):
                raise SpecError("must be a path", source=src, field=f"{fld}.file")
            clusters.append({"file": str((Path(path).parent / c["file"]).resolve())})
        elif "synth" in c:
            from .clusters import SynthParams
            if isinstance(c["synth"], dict):  # as a job's fields (above)
                unknown_keys(c["synth"], [f.name for f in dataclasses.fields(SynthParams)],
                             src, f"{fld}.synth")
            clusters += [{"synth": g} for g in _grid(c["synth"], src, f"{fld}.synth")]
        else:
            raise SpecError("a [[clusters]] entry needs preset, file or synth", source=src,
                            field=fld)
    if not clusters:
        raise SpecError("give at least one [[clusters]]", source=src, field="clusters")
    searched = [m for m in methods if m not in BASELINES]
    base = [m for m in methods if m in BASELINES]
    count = len(models) * len(clusters) * len(jobs) * (
        len(searched) * len(budgets) * len(seeds) + len(base))
    if count > MAX_TASKS:
        raise SpecError(f"{count:,} tasks; at most {MAX_TASKS:,}", source=src, field="sweep")
    # a baseline uses no budget and no seed: one task per instance (budget 0, seed 0), not one
    # per budget and seed that would all give the same plan
    digests = {x: _digest(x, src) for x in [*models, *(c["file"] for c in clusters
                                                      if "file" in c)] if _is_file(x)}

    def files(m: str, c: dict) -> tuple:
        return tuple((role, digests[x]) for role, x in (("model", m), ("cluster", c.get("file")))
                     if x in digests)
    tasks = [Task(m, c, dict(j), meth, float(b), int(s), moves, clock, files(m, c))
             for m, c, j, meth, b, s in itertools.product(models, clusters, jobs, searched,
                                                           budgets, seeds)]
    tasks += [Task(m, c, dict(j), meth, 0.0, 0, moves, clock, files(m, c))
              for m, c, j, meth in itertools.product(models, clusters, jobs, base)]
    for t in {(t.model, json.dumps(t.cluster, sort_keys=True), json.dumps(t.job, sort_keys=True)):
              t for t in tasks}.values():  # every input builds: one clear error before any work
        build_inputs(t, src)
    return name, tasks


def spec_notes(tasks: list[Task]) -> list[str]:
    """What a spec's synthetic clusters are given that some of them have no use for (as
    `cluster synth` says it): an oversubscription where every node sits in one leaf switch,
    a degraded factor with no degraded node. One line per setting and cluster size."""
    from .clusters import SynthParams
    dflt = SynthParams()
    out: dict[str, None] = {}
    for t in tasks:
        c = t.cluster.get("synth")
        if c is None:
            continue
        n, leaf = c.get("num_nodes", dflt.num_nodes), c.get("leaf_size", dflt.leaf_size)
        if "oversubscription" in c and leaf >= n:
            out[f"oversubscription {c['oversubscription']:g} has no effect on the {n}-node "
                f"clusters: their nodes share one leaf switch (leaf_size {leaf}), so no stream "
                "crosses the spine"] = None
        if "degraded_factor" in c and c.get("degraded", dflt.degraded) == 0:
            out[f"degraded_factor {c['degraded_factor']:g} has no effect where degraded is 0: "
                "no node is degraded"] = None
    return list(out)


def build_inputs(t: Task, src: str = "sweep"):
    from formats import presets
    from formats.clusters import SynthParams, cluster, synth_cluster
    from model.specs import JobSpec
    try:
        model = presets.model(t.model)
        if "preset" in t.cluster:
            c = cluster(t.cluster["preset"])
        elif "file" in t.cluster:
            c = cluster(t.cluster["file"])
    except SpecError as e:
        if e.source is not None:  # a file's own error names the file
            raise
        raise SpecError(e.problem, source=src,
                        field="models" if e.field == "model" else "clusters") from None
    if "synth" in t.cluster:
        try:
            c = synth_cluster(SynthParams(**t.cluster["synth"]))
        except TypeError as e:
            raise SpecError(f"synth parameters: {e}", source=src, field="clusters.synth") \
                from None
        except SpecError as e:
            raise SpecError(f"{e.field}: {e.problem}", source=src, field="clusters.synth") \
                from None
    try:
        job = JobSpec(**t.job, source=src)
    except TypeError as e:
        raise SpecError(f"job fields: {e}", source=src, field="jobs") from None
    from model.plan import fp8_problem
    # every task of a job with fp8 (or with a recipe of its own) that the cluster cannot run
    # would fail at run time
    problem = fp8_problem(job, c) if job.fp8 is not False else None
    if problem and (job.fp8 or problem[0] == "fp8_recipe" or job.fp8_recipe != "delayed"):
        raise SpecError(f"{problem[1]}: a job with fp8 (recipe {job.fp8_recipe}) on cluster "
                        f"{c.name}; pair it with GPUs that run it, or drop fp8", source=src,
                        field="jobs")
    from model.plan import dense_moe_option, dispatcher_problem
    if bad := dense_moe_option(model, job):
        raise SpecError(f"{bad[0]}: {bad[1]}", source=src, field="jobs")
    if model.is_moe and (why := dispatcher_problem(job, c)):
        raise SpecError(f"{why} (cluster {c.name})", source=src, field="jobs")
    return model, c, job


