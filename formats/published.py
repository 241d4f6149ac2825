"""Validation against published training runs (data/published_runs.json, copied with its
citations from shared/reference; see data/published_runs.README.md).

Each usable run is turned into a model, a job, a uniform cluster and a plan. Where the source is
silent, the assumption used is listed per run in `assumptions`; runs we cannot model (ZeRO-3 or
FSDP sharding, missing shapes or timings) are listed as skipped with the reason.

Cluster bandwidths per source group (per GPU, one direction):
- Selene (Narayanan et al. 2021, MT-NLG): 8 HDR InfiniBand 200 Gb/s HCAs per node, one per GPU:
  25 GB/s line rate per GPU stream.
- Jean Zay (BLOOM): 4 Omni-Path 100 Gb/s links per 8-GPU node: 50 GB/s per node, 6.25 GB/s per
  GPU stream.
- Intra-node: NVLink3/NVSwitch A100, 300 GB/s per direction per GPU (datasheet) times
  NVLINK_ACHIEVED = 0.8 (the all-reduce bus bandwidth nccl-tests reports on DGX A100 is about
  230-240 GB/s).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field

from model.estimator import Estimate, estimate, make_plan
from model.specs import JobSpec, ModelSpec, Options

from . import presets
from .clusters import uniform_cluster

NVLINK_ACHIEVED = 0.8
NETWORKS_GB_PER_S = {  # source_group prefix -> (inter-node GB/s per GPU stream, description)
    "narayanan_sc21": (25.0, "Selene: HDR 200 Gb/s per GPU"),
    "bloom": (6.25, "Jean Zay: 4x OPA 100 Gb/s per 8 GPUs"),
    "mt_nlg": (25.0, "Selene: HDR 200 Gb/s per GPU"),
}


@dataclass
class Comparison:
    id: str
    predicted_s: float | None = None
    published_s: float | None = None
    time_source: str = ""
    predicted_gib: float | None = None
    published_gib: float | None = None
    oom_published: bool | None = None
    predicted_fits: bool | None = None
    limit_gib: float | None = None
    assumptions: list[str] = field(default_factory=list)
    skipped: str | None = None
    estimate: Estimate | None = None

    @property
    def time_err(self) -> float | None:
        if self.predicted_s is None or self.published_s is None:
            return None
        return abs(self.predicted_s - self.published_s) / self.published_s

    @property
    def mem_err(self) -> float | None:
        if self.predicted_gib is None or self.published_gib is None:
            return None
        return abs(self.predicted_gib - self.published_gib) / self.published_gib

    @property
    def oom_ok(self) -> bool | None:
        if self.oom_published is None or self.predicted_fits is None:
            return None
        return self.predicted_fits != self.oom_published


def load_runs() -> list[dict]:
    with open(presets.data_path("published_runs.json")) as f:
        return json.load(f)


def _skip_reason(r: dict) -> str | None:
    sharding = (r.get("dp_sharding") or "").lower()
    if "zero-3" in sharding or "fsdp" in sharding:
        return "fully sharded data parallelism (ZeRO-3/FSDP) is outside the cost model"
    for k in ("num_layers", "hidden_size", "num_attention_heads", "global_batch_size", "tp",
              "pp", "dp", "num_gpus", "gpus_per_node"):
        if r.get(k) is None:
            return f"{k} not published"
    if r.get("iteration_time_s") is None and r.get("iteration_time_s_derived") is None \
            and r.get("oom") is not True:
        return "no iteration time published"
    if not any(r["source_group"].startswith(g) for g in NETWORKS_GB_PER_S):
        return "interconnect bandwidth not published"
    return None


def run_to_inputs(r: dict):
    """(model, job, cluster, plan, assumptions) for one published run."""
    notes = []
    vocab = r.get("vocab_size")
    if vocab is None:
        vocab = 250880 if r["source_group"].startswith("bloom") else 51200
        notes.append(f"vocab {vocab} (unpublished)")
    ffn = r.get("ffn_hidden_size") or 4 * r["hidden_size"]
    model = ModelSpec(name=r["model_name"], num_layers=r["num_layers"],
                      hidden_size=r["hidden_size"], num_heads=r["num_attention_heads"],
                      num_kv_heads=r.get("num_kv_heads") or r["num_attention_heads"],
                      ffn_hidden_size=ffn, vocab_size=vocab, seq_length=r["seq_length"],
                      gated_mlp=False, tied_embeddings=True)
    prec = r.get("precision") or ""
    precision = "bf16" if prec.startswith("bf16") else "fp16"
    sharding = (r.get("dp_sharding") or "none").lower()
    distopt = "zero-1" in sharding
    job = JobSpec(global_batch=r["global_batch_size"], seq_length=r["seq_length"],
                  precision=precision, distributed_optimizer=distopt)
    inter, desc = next(v for g, v in NETWORKS_GB_PER_S.items()
                       if r["source_group"].startswith(g))
    gpu = "A100-80GB" if "80" in (r.get("gpu_type") or "") else "A100-40GB"
    g = presets.gpu(gpu)
    G = r["gpus_per_node"]
    cluster = uniform_cluster(r["num_gpus"] // G, G, gpu, g.nvlink_gb_per_s * NVLINK_ACHIEVED,
                              inter, name=desc)
    mbs = r.get("micro_batch_size")
    if mbs is None:
        mbs = 1
        notes.append("micro-batch 1 (unpublished)")
    rc = (r.get("recompute") or "").lower()
    recompute = "full" if rc.startswith("full") else None
    if recompute is None:
        recompute = "full"
        notes.append("full recompute (not restated; the production script uses it)")
    sched = "1f1b"
    if r["pp"] > 1 and "interleaved" in (r.get("pipeline_schedule") or ""):
        notes.append("1F1B without interleaving (chunk count unpublished)")
    plan = make_plan(model, job, cluster, tp=r["tp"], pp=r["pp"], dp=r["dp"], micro_batch=mbs,
                     schedule=sched, recompute=recompute, distributed_optimizer=distopt)
    return model, job, cluster, plan, notes


def compare_run(r: dict, options: Options | None = None) -> Comparison:
    c = Comparison(id=r["id"])
    reason = _skip_reason(r)
    if reason:
        c.skipped = reason
        return c
    model, job, cluster, plan, c.assumptions = run_to_inputs(r)
    est = estimate(model, job, cluster, plan, options)
    c.estimate = est
    c.predicted_s = est.iteration_ms / 1e3
    if r.get("iteration_time_s") is not None:
        c.published_s, c.time_source = r["iteration_time_s"], "published"
    elif r.get("iteration_time_s_derived") is not None:
        c.published_s, c.time_source = r["iteration_time_s_derived"], "derived from TFLOP/s"
    if r.get("peak_memory") is not None:
        # BLOOM: nvidia-smi on the first node, which holds stage 0 (see the README of the data)
        c.published_gib = float(r["peak_memory"])
        c.predicted_gib = est.stages[0].memory.total_gib
    c.oom_published = r.get("oom")
    c.predicted_fits = est.fits
    c.limit_gib = min(s.limit_gib for s in est.stages)
    return c


@dataclass
class Summary:
    rows: list[Comparison]

    def _errs(self, attr):
        return [getattr(x, attr) for x in self.rows if getattr(x, attr) is not None]

    @property
    def time_median(self):
        e = self._errs("time_err")
        return statistics.median(e) if e else None

    @property
    def time_mean(self):
        e = self._errs("time_err")
        return statistics.fmean(e) if e else None

    @property
    def mem_median(self):
        e = self._errs("mem_err")
        return statistics.median(e) if e else None

    @property
    def mem_max(self):
        e = self._errs("mem_err")
        return max(e) if e else None

    @property
    def oom_correct(self) -> tuple[int, int]:
        v = [x.oom_ok for x in self.rows if x.oom_ok is not None]
        return sum(v), len(v)


def validate(options: Options | None = None) -> Summary:
    return Summary([compare_run(r, options) for r in load_runs()])
