"""Sweep specs (TOML) as tasks with stable ids, and a task's inputs built from presets, files
or synthetic-cluster parameters. The spec's format is in solvers/sweep.py's docstring and the
README."""

from __future__ import annotations

import hashlib
import itertools
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

from model.errors import SpecError
from .reading import read_text

METHODS = ("exact", "anneal", "megatron", "amp-style")


@dataclass(frozen=True)
class Task:
    model: str
    cluster: dict  # {"preset": name} | {"file": path} | {"synth": {...}}
    job: dict
    method: str
    budget_s: float
    seed: int

    def inputs(self) -> dict:
        return {"model": self.model, "cluster": self.cluster, "job": self.job,
                "method": self.method, "budget_s": self.budget_s, "seed": self.seed}

    @property
    def id(self) -> str:
        blob = json.dumps(self.inputs(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _grid(d: dict) -> list[dict]:
    """Expand every list value of a flat dict into the grid of its combinations."""
    keys = sorted(d)
    vals = [d[k] if isinstance(d[k], list) else [d[k]] for k in keys]
    return [dict(zip(keys, combo)) for combo in itertools.product(*vals)]


def load_spec(path) -> tuple[str, list[Task]]:
    """Read a sweep spec; every problem is one SpecError naming the file and the field."""
    src = str(path)
    text = read_text(path, field="spec", what="the sweep spec")
    try:
        spec = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"not TOML ({e})", source=src, field="spec") from None
    sw = spec.get("sweep", {})
    methods = sw.get("methods", list(METHODS))
    for m in methods:
        if m not in METHODS:
            raise SpecError(f"unknown method {m!r}; use {', '.join(METHODS)}", source=src,
                            field="sweep.methods")
    budgets = sw.get("budgets", [10.0])
    if not budgets or any(not isinstance(b, (int, float)) or b <= 0 for b in budgets):
        raise SpecError("budgets must be positive numbers (seconds)", source=src,
                        field="sweep.budgets")
    seeds = sw.get("seeds", [0])
    models = [m.get("name") for m in spec.get("models", [])]
    if not models or any(not isinstance(m, str) for m in models):
        raise SpecError("give at least one [[models]] with a name", source=src, field="models")
    jobs = spec.get("jobs", [])
    if not jobs:
        raise SpecError("give at least one [[jobs]] (global_batch, seq_length)", source=src,
                        field="jobs")
    clusters: list[dict] = []
    for k, c in enumerate(spec.get("clusters", [])):
        if "preset" in c:
            clusters.append({"preset": c["preset"]})
        elif "file" in c:
            clusters.append({"file": str((Path(path).parent / c["file"]).resolve())})
        elif "synth" in c:
            clusters += [{"synth": g} for g in _grid(c["synth"])]
        else:
            raise SpecError("a [[clusters]] entry needs preset, file or synth", source=src,
                            field=f"clusters[{k}]")
    if not clusters:
        raise SpecError("give at least one [[clusters]]", source=src, field="clusters")
    tasks = [Task(m, c, dict(j), meth, float(b), int(s))
             for m, c, j, meth, b, s in itertools.product(models, clusters, jobs, methods,
                                                           budgets, seeds)]
    for t in tasks[:1]:  # the inputs must build (one clear error before any work)
        build_inputs(t, src)
    return sw.get("name", Path(path).stem), tasks


def build_inputs(t: Task, src: str = "sweep"):
    from formats import presets
    from formats.clusters import SynthParams, cluster, synth_cluster
    from model.specs import JobSpec
    model = presets.model(t.model)
    if "preset" in t.cluster:
        c = cluster(t.cluster["preset"])
    elif "file" in t.cluster:
        c = cluster(t.cluster["file"])
    else:
        try:
            c = synth_cluster(SynthParams(**t.cluster["synth"]))
        except TypeError as e:
            raise SpecError(f"synth parameters: {e}", source=src, field="clusters.synth") \
                from None
    try:
        job = JobSpec(**t.job, source=src)
    except TypeError as e:
        raise SpecError(f"job fields: {e}", source=src, field="jobs") from None
    return model, c, job


