"""Plan files: one versioned, self-contained JSON document per plan.

A plan file holds the inputs in full (model, job, modelling options and the cluster inline, GPU
types included, so it reads back without presets), the decisions (shape and placement), what
the cost model predicted (time and memory breakdown) and the solver's status. The README section
"Plan files" documents the schema; `load_plan` validates every field and names the file and the
field in its error.

    {"schema_version": 3, "kind": "pipette-plan", "generator": ..., "cost_model_revision": ...,
     "model": {...}, "job": {...}, "options": {...}, "cluster": {...},
     "plan": {"shape": {...}, "placement": [{"stage", "replica", "node", "gpus"}, ...]},
     "estimate": {...} (formats.views.estimate_to_dict), "solver": {...} | null,
     "calibration": {"profile", "gpu", "parameters", "document", ...} | null}

The cluster and options are as measured; a calibrated plan carries its profile whole
("calibration.document"), which `recorded_profile` reads back and the commands apply, so
that a plan file re-evaluates to its stored estimate and a profile is never applied twice.
Schema 2 files are read too; one of them with a calibration holds the calibrated cluster
(`meta["calibrated_cluster"]`), which no second profile may scale.
"""

from __future__ import annotations

import functools
import hashlib

import json
import math
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from formats.atomic import write_atomic
from model.cluster import INTRA_LATENCY_US, ClusterSpec, NodeSpec
from model.errors import SpecError
from model.estimator import Estimate
from model.plan import (Placement, Plan, Shape, dense_moe_option, fsdp_overlaps_grads,
                        validate_placement, validate_shape)
from model.specs import GPUSpec, JobSpec, ModelSpec, Options, Overheads

from .views import estimate_to_dict, placement_to_dict, shape_to_dict
from formats.reading import FieldReader, read_text

# 2: the per-operation cost model (GPU curve, FP8, attention, overlaps); 3: the cluster as
# measured and the calibration profile whole (schema 2 wrote the calibrated cluster)
SCHEMA_VERSION = 3
READS = (2, 3)
KIND = "pipette-plan"
GENERATOR = "pipette-configurator 0.1.0"


@functools.lru_cache(maxsize=1)
def cost_model_revision() -> str:
    """The cost model's revision: SHA-256 (12 hex digits) of its sources (model/*.py). A plan
    file records it, so that a recorded estimate this build does not reproduce is told apart:
    another revision (the cost model changed) or the same (the file's numbers were edited, or
    computed with other inputs). The version string alone could not: it stays 0.1.0 across
    cost-model changes, and such a file had been called edited."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1] / "model"
    for f in sorted(root.glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]

_MODEL_FIELDS = ("name", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
                 "ffn_hidden_size", "vocab_size", "seq_length", "gated_mlp", "tied_embeddings",
                 "position_embedding", "norm", "bias", "dropout", "embedding_norm", "qk_norm",
                 "qkv_bias", "num_experts", "moe_topk", "moe_ffn_hidden_size", "moe_shared_experts",
                 "kv_channels", "first_dense_layers", "mla_kv_lora_rank", "mla_q_lora_rank",
                 "mla_qk_rope_dim", "mla_v_head_dim", "rope_base", "rotary_percent", "norm_eps",
                 "sliding_window", "window_full_every", "source", "unmodelled")
_GPU_FLOATS = ("memory_gib", "hbm_gb_per_s", "nvlink_gb_per_s", "gemm_efficiency",
               "attention_efficiency", "hbm_efficiency", "kernel_overhead_us")
_SOLVER_KEYS = ("method", "termination", "objective_ms", "bound_ms", "gap", "wall_s")


# ---------------------------------------------------------------------------------------------
# writing


def json_safe(x):
    """JSON-safe copy: numpy scalars to Python, non-finite floats to None (JSON has no
    Infinity or NaN: a strict parser refuses them)."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, np.ndarray):
        return json_safe(x.tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def model_to_dict(m: ModelSpec) -> dict:
    return {f: getattr(m, f) for f in _MODEL_FIELDS}


def job_to_dict(j: JobSpec) -> dict:
    return {"global_batch": j.global_batch, "seq_length": j.seq_length,
            "precision": j.precision, "fp8": j.fp8, "attention": j.attention,
            "framework": j.framework, "zero": j.zero,
            "distributed_optimizer": j.distributed_optimizer,
            "grad_reduce_in_bf16": j.grad_reduce_in_bf16,
            "fp8_param_gather": j.fp8_param_gather, "fp8_recipe": j.fp8_recipe,
            "moe_capacity_factor": j.moe_capacity_factor,
            "moe_dispatcher": j.moe_dispatcher, "compile": j.compile,
            "compile_loss": j.compile_loss, "repeat_kv": j.repeat_kv,
            "fused_loss": j.fused_loss, "p2p_scatter_gather": j.p2p_scatter_gather}


def options_to_dict(o: Options) -> dict:
    return {"blocking_p2p": o.blocking_p2p,
            "overheads": {"context_gib": o.overheads.context_gib,
                          "fragmentation": o.overheads.fragmentation,
                          "latency_overhead_ms": o.overheads.latency_overhead_ms}}


def gpu_to_dict(g: GPUSpec) -> dict:
    d = {"peak_tflops": dict(g.peak_tflops), "sm_count": g.sm_count}
    d.update({f: getattr(g, f) for f in _GPU_FLOATS})
    # the FP8 rate the estimate used, whatever its origin (the GPU's own figure, or
    # FP8_GEMM_RATIO x its bf16 one): a file reads back to the same estimate whatever later
    # versions assume (null had meant "the bf16 fraction" before 2026-12-06, then the ratio)
    d.update(source=g.source, curve_source=g.curve_source,
             fp8_gemm_efficiency=(g.fp8_efficiency if "fp8" in g.peak_tflops else
                                  g.fp8_gemm_efficiency),
             compute_capability=g.compute_capability)
    return d


def cluster_to_dict(c: ClusterSpec) -> dict:
    gpus = {}
    for nd in c.nodes:
        gpus.setdefault(nd.gpu.name, gpu_to_dict(nd.gpu))
    nodes = []
    for nd in c.nodes:
        row = {"name": nd.name, "gpu": nd.gpu.name, "gpus": nd.num_gpus,
               "intra_gb_per_s": nd.intra_gb_per_s}
        if nd.intra_matrix_gb_per_s is not None:
            row["intra_matrix_gb_per_s"] = nd.intra_matrix_gb_per_s.tolist()
        nodes.append(row)
    return {"name": c.name, "latency_us": c.latency_us,
            "intra_latency_us": c.intra_latency_us, "gpu_types": gpus, "nodes": nodes,
            "inter": {"gb_per_s": c.inter_gb_per_s.tolist()}}


def plan_document(model: ModelSpec, job: JobSpec, cluster: ClusterSpec, plan: Plan,
                  estimate: Estimate | None, solver: dict | None = None,
                  options: Options | None = None, calibration: dict | None = None,
                  emitted: dict | None = None) -> dict:
    """The plan file's document. `cluster` and `options` as measured, before any profile;
    `calibration`: what the estimate was calibrated with, its profile whole under
    "document" (cli.py `_calibrated`); `emitted`: the framework and release the command that
    wrote it emitted files for, where a release was given ({"framework", "version"}: `emit`
    from the file writes that release's files again)."""
    options = options or Options()
    return json_safe({
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "generator": GENERATOR,
        "cost_model_revision": cost_model_revision(),
        "model": model_to_dict(model),
        "job": job_to_dict(job),
        "options": options_to_dict(options),
        "cluster": cluster_to_dict(cluster),
        "plan": {"shape": shape_to_dict(plan.shape),
                 "placement": placement_to_dict(plan.placement, cluster, plan.shape.cp)},
        "estimate": estimate_to_dict(estimate) if estimate is not None else None,
        "solver": dict(solver) if solver is not None else None,
        "calibration": calibration,
        "emitted": emitted,
    })


def save_plan(path, model: ModelSpec, job: JobSpec, cluster: ClusterSpec, plan: Plan,
              estimate: Estimate, solver: dict | None = None,
              options: Options | None = None, calibration: dict | None = None,
              emitted: dict | None = None) -> None:
    """Write the plan file (schema_version 3) to `path`, creating parent folders."""
    path = Path(path)
    doc = plan_document(model, job, cluster, plan, estimate, solver, options, calibration,
                        emitted)
    write_atomic(path, json.dumps(doc, indent=1) + "\n", field="--save-plan")


# ---------------------------------------------------------------------------------------------
# reading


def _matrix(rd: FieldReader, rows, n: int, fld: str, per: str = "node, in nodes order"
            ) -> np.ndarray:
    if not isinstance(rows, list) or len(rows) != n or any(
            not isinstance(r, list) or len(r) != n for r in rows):
        raise rd.err(fld, f"must be a {n}x{n} list of rows, one per {per}")
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) for r in rows for v in r):
        raise rd.err(fld, "entries must be numbers (GB/s)")
    return np.array(rows, dtype=float)


_TOP_KEYS = ("schema_version", "kind", "generator", "cost_model_revision", "model", "job",
             "options", "cluster", "plan", "estimate", "solver", "calibration", "emitted")
_JOB_KEYS = tuple(job_to_dict(JobSpec(global_batch=1, seq_length=1)))
_GPU_KEYS = ("peak_tflops", "sm_count", *_GPU_FLOATS, "source", "curve_source",
             "fp8_gemm_efficiency", "compute_capability")
_SHAPE_KEYS = tuple(f.name for f in fields(Shape))


def _later(rd: FieldReader, d: dict, key: str, where: str, kind, default, ver: int,
           notes: list, nullable: bool = False, since: int | None = 3):
    """A field that changes the estimate and that every file of schema `since` and later holds
    (None: none need hold it, files of that schema written before it existed lack it): missing
    from such a file, refused; missing from an older one, its default, listed in `notes` (a
    schema 3 file without options.overheads, job.fused_loss or cluster.intra_latency_us had
    been read with their defaults without a word)."""
    if key in d:
        return rd.get(d, key, where, kind, nullable=nullable)
    fld = f"{where}.{key}" if where else key
    if since is not None and ver >= since:
        raise rd.err(fld, f"missing; schema {ver} writes it: add it or save the plan again")
    notes.append(f"{fld} {json.dumps(default)}")
    return default


def _read_model(rd: FieldReader, d: dict, ver: int = SCHEMA_VERSION,
                notes: list | None = None) -> ModelSpec:
    w = "model"
    notes = [] if notes is None else notes
    rd.known(d, w, _MODEL_FIELDS)
    kw = {"name": rd.get(d, "name", w, str)}
    for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
              "vocab_size", "seq_length"):
        kw[f] = rd.get(d, f, w, int)
    kw["gated_mlp"] = _later(rd, d, "gated_mlp", w, bool, False, ver, notes)
    kw["tied_embeddings"] = _later(rd, d, "tied_embeddings", w, bool, False, ver, notes)
    kw["position_embedding"] = rd.get(d, "position_embedding", w, str)
    kw["norm"] = rd.get(d, "norm", w, str)
    kw["bias"] = rd.get(d, "bias", w, bool)
    kw["dropout"] = rd.get(d, "dropout", w, bool)
    kw["embedding_norm"] = rd.get(d, "embedding_norm", w, bool)
    # written since 2026-12-06, after schema 3 began: an earlier schema 3 file lacks it
    kw["qk_norm"] = _later(rd, d, "qk_norm", w, bool, False, ver, notes, since=None)
    # written since 2026-12-07
    kw["qkv_bias"] = _later(rd, d, "qkv_bias", w, bool, False, ver, notes, since=None)
    for f in ("num_experts", "moe_topk", "moe_ffn_hidden_size", "moe_shared_experts",
              "kv_channels", "first_dense_layers", "mla_kv_lora_rank", "mla_q_lora_rank",
              "mla_qk_rope_dim", "mla_v_head_dim"):
        kw[f] = _later(rd, d, f, w, int, 0, ver, notes)
    kw["rope_base"] = _later(rd, d, "rope_base", w, float, 0.0, ver, notes)
    kw["rotary_percent"] = _later(rd, d, "rotary_percent", w, float, 1.0, ver, notes)
    # written since 2026-12-07; not priced, so an older file's model is the framework default
    kw["norm_eps"] = rd.get(d, "norm_eps", w, float, 0.0)
    # written since 2026-12-08 (priced: an older file's model attends fully, said in notes)
    for f in ("sliding_window", "window_full_every"):
        kw[f] = _later(rd, d, f, w, int, 0, ver, notes, since=None)
    kw["source"] = rd.get(d, "source", w, str, "")
    kw["unmodelled"] = tuple(rd.get(d, "unmodelled", w, list, []))
    try:
        return ModelSpec(**kw)
    except SpecError as e:
        raise rd.wrap(e, w) from None


def _read_job(rd: FieldReader, d: dict, ver: int = SCHEMA_VERSION,
              notes: list | None = None) -> JobSpec:
    w = "job"
    notes = [] if notes is None else notes
    rd.known(d, w, _JOB_KEYS)

    def later(key: str, kind, default, nullable: bool = False):
        return _later(rd, d, key, w, kind, default, ver, notes, nullable=nullable)
    try:
        return JobSpec(global_batch=rd.get(d, "global_batch", w, int),
                       seq_length=rd.get(d, "seq_length", w, int),
                       precision=rd.get(d, "precision", w, str),
                       fp8=rd.get(d, "fp8", w, bool, nullable=True),
                       attention=rd.get(d, "attention", w, str),
                       framework=rd.get(d, "framework", w, str),
                       zero=later("zero", int, None, nullable=True),
                       distributed_optimizer=later("distributed_optimizer", bool, None,
                                                   nullable=True),
                       grad_reduce_in_bf16=later("grad_reduce_in_bf16", bool, False),
                       fp8_param_gather=later("fp8_param_gather", bool, False),
                       fp8_recipe=later("fp8_recipe", str, "delayed"),
                       moe_capacity_factor=later("moe_capacity_factor", float, 1.0),
                       compile=later("compile", bool, True),
                       compile_loss=later("compile_loss", bool, None, nullable=True),
                       repeat_kv=later("repeat_kv", bool, False),
                       fused_loss=later("fused_loss", bool, False),
                       # (added within schema 3: files written before it lack it)
                       p2p_scatter_gather=_later(rd, d, "p2p_scatter_gather", w, bool, False,
                                                 ver, notes, since=None),
                       moe_dispatcher=_later(rd, d, "moe_dispatcher", w, str, "alltoall", ver,
                                             notes, since=None),
                       source=rd.src)
    except SpecError as e:
        raise rd.wrap(e, w) from None


def _read_options(rd: FieldReader, d: dict | None, ver: int = SCHEMA_VERSION,
                  notes: list | None = None) -> Options:
    notes = [] if notes is None else notes
    w = "options"
    if d is None:
        if ver >= 3:
            raise rd.err(w, f"missing; schema {ver} writes it: add it or save the plan again")
        notes.append(f"{w} (blocking pipeline transfers, the default overheads)")
        return Options()
    rd.known(d, w, ("blocking_p2p", "overheads"))
    oh = rd.obj(d, "overheads", w, optional=True)
    if oh is None:
        if ver >= 3:
            raise rd.err(f"{w}.overheads", f"missing; schema {ver} writes it: add it or save "
                         "the plan again")
        notes.append(f"{w}.overheads (the defaults)")
        oh = {f.name: f.default for f in fields(Overheads)}
    rd.known(oh, f"{w}.overheads", tuple(f.name for f in fields(Overheads)))
    try:
        ov = Overheads(**{f.name: _later(rd, oh, f.name, f"{w}.overheads", float, f.default,
                                         ver, notes) for f in fields(Overheads)})
    except SpecError as e:
        raise rd.wrap(e, f"{w}.overheads") from None
    return Options(blocking_p2p=_later(rd, d, "blocking_p2p", w, bool, True, ver, notes),
                   overheads=ov)


def _read_cluster(rd: FieldReader, d: dict, ver: int = SCHEMA_VERSION,
                  notes: list | None = None) -> ClusterSpec:
    w = "cluster"
    notes = [] if notes is None else notes
    rd.known(d, w, ("name", "latency_us", "intra_latency_us", "gpu_types", "nodes", "inter"))
    types_raw = rd.obj(d, "gpu_types", w)
    gpus: dict[str, GPUSpec] = {}
    for name, g in types_raw.items():
        gw = f"{w}.gpu_types.{name}"
        if not isinstance(g, dict):
            raise rd.err(gw, "must be an object")
        rd.known(g, gw, _GPU_KEYS)
        peak = rd.obj(g, "peak_tflops", gw)
        for p, v in peak.items():
            rd.get(peak, p, f"{gw}.peak_tflops", float)
        try:
            gpus[name] = GPUSpec(name=name, peak_tflops={p: float(v) for p, v in peak.items()},
                                 sm_count=rd.get(g, "sm_count", gw, int),
                                 **{f: rd.get(g, f, gw, float) for f in _GPU_FLOATS},
                                 source=rd.get(g, "source", gw, str, ""),
                                 curve_source=rd.get(g, "curve_source", gw, str, ""),
                                 fp8_gemm_efficiency=_later(rd, g, "fp8_gemm_efficiency",
                                                            gw, float, None, ver, notes,
                                                            nullable=True),
                                 # written since 2026-12-07 (the FP8 recipes' rules by GPU):
                                 # an earlier file's FP8 plan was priced with Hopper's
                                 compute_capability=_later(rd, g, "compute_capability", gw,
                                                           float, None, ver, notes,
                                                           nullable=True, since=None))
        except SpecError as e:
            raise rd.wrap(e, gw) from None
    nodes_raw = rd.get(d, "nodes", w, list)
    if not nodes_raw:
        raise rd.err(f"{w}.nodes", "empty; list one entry per node")
    nodes = []
    for i, nd in enumerate(nodes_raw):
        nw = f"{w}.nodes[{i}]"
        if not isinstance(nd, dict):
            raise rd.err(nw, "must be an object")
        rd.known(nd, nw, ("name", "gpu", "gpus", "intra_gb_per_s", "intra_matrix_gb_per_s"))
        gname = rd.get(nd, "gpu", nw, str)
        if gname not in gpus:
            raise rd.err(f"{nw}.gpu", f"GPU type '{gname}' is not in cluster.gpu_types "
                         f"({', '.join(gpus) or 'none'}); add it there")
        num = rd.get(nd, "gpus", nw, int)
        if num <= 0:
            raise rd.err(f"{nw}.gpus", f"must be a positive integer, got {num}")
        intra = rd.get(nd, "intra_gb_per_s", nw, float)
        if not intra > 0:
            raise rd.err(f"{nw}.intra_gb_per_s", f"must be a positive number of GB/s, got "
                         f"{intra}")
        mat = None
        if nd.get("intra_matrix_gb_per_s") is not None:
            mat = _matrix(rd, nd["intra_matrix_gb_per_s"], num, f"{nw}.intra_matrix_gb_per_s",
                          f"GPU of the node (its 'gpus': {num})")
        nodes.append(NodeSpec(rd.get(nd, "name", nw, str), gpus[gname], num, intra, mat))
    inter = rd.obj(d, "inter", w)
    rd.known(inter, f"{w}.inter", ("gb_per_s",))
    mat = _matrix(rd, inter.get("gb_per_s"), len(nodes), f"{w}.inter.gb_per_s")
    try:
        return ClusterSpec(name=rd.get(d, "name", w, str, "cluster"), nodes=tuple(nodes),
                           inter_gb_per_s=mat,
                           latency_us=_later(rd, d, "latency_us", w, float, 5.0, ver, notes),
                           source=rd.src,
                           intra_latency_us=_later(rd, d, "intra_latency_us", w, float,
                                                   INTRA_LATENCY_US, ver, notes))
    except SpecError as e:
        raise rd.wrap(e, w) from None


def _read_plan(rd: FieldReader, d: dict, model: ModelSpec, job: JobSpec,
               cluster: ClusterSpec, ver: int = SCHEMA_VERSION,
               notes: list | None = None) -> Plan:
    notes = [] if notes is None else notes
    sw = "plan.shape"
    rd.known(d, "plan", ("shape", "placement"))
    sd = rd.obj(d, "shape", "plan")
    rd.known(sd, sw, _SHAPE_KEYS)
    # schema 3 writes every shape field: one left out is refused, not read as its default
    # (schema 2 files may predate context and expert parallelism)
    later = {} if ver >= 3 else {"cp": 1, "cp_alltoall": False, "ep": 1, "etp": 0}

    def dflt(key: str) -> tuple:
        return (later[key],) if key in later else ()
    for key, none in (("cp", 1), ("cp_alltoall", False), ("ep", 1), ("etp", 0)):
        if key not in later and key not in sd:
            raise rd.err(f"{sw}.{key}", f"missing; schema 3 writes every shape field: add it "
                         f"({json.dumps(none)} for a plan without it) or save the plan again")
    # (a stage outside 0-3 is Shape's range error, not this contradiction: zero 5 had been
    # 'distributed_optimizer: False beside zero 5')
    zero = sd.get("zero")
    if sd.get("distributed_optimizer") is not None and zero in (0, 1, 2, 3) and \
            not isinstance(zero, bool) and sd["distributed_optimizer"] is not (zero >= 1):
        raise rd.err(f"{sw}.distributed_optimizer", f"{sd['distributed_optimizer']} beside zero "
                     f"{sd['zero']}: the distributed optimizer is ZeRO-1 and above; make them "
                     "agree")
    layers = rd.get(sd, "layers", sw, list)
    if any(not isinstance(x, int) or isinstance(x, bool) for x in layers):
        raise rd.err(f"{sw}.layers", "must be a list of integers (layers per virtual stage)")
    shape = Shape(tp=rd.get(sd, "tp", sw, int), pp=rd.get(sd, "pp", sw, int),
                  dp=rd.get(sd, "dp", sw, int), cp=rd.get(sd, "cp", sw, int, *dflt("cp")),
                  cp_alltoall=rd.get(sd, "cp_alltoall", sw, bool, *dflt("cp_alltoall")),
                  ep=rd.get(sd, "ep", sw, int, *dflt("ep")),
                  etp=rd.get(sd, "etp", sw, int, *dflt("etp")),
                  micro_batch=rd.get(sd, "micro_batch", sw, int),
                  schedule=rd.get(sd, "schedule", sw, str), chunks=rd.get(sd, "chunks", sw, int),
                  layers=tuple(layers), recompute=rd.get(sd, "recompute", sw, str),
                  sequence_parallel=rd.get(sd, "sequence_parallel", sw, bool),
                  distributed_optimizer=rd.get(sd, "distributed_optimizer", sw, bool),
                  zero=rd.get(sd, "zero", sw, int), shard_size=rd.get(sd, "shard_size", sw, int),
                  **{f: rd.get(sd, f, sw, bool) for f in (
                      "fp8", "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather")},
                  # (added within schema 3: files written before it lack it)
                  ep_comm_overlap=_later(rd, sd, "ep_comm_overlap", sw, bool, False, ver,
                                         notes, since=None),
                  # (added 2026-12-07: earlier files ran Megatron-LM's default grouping)
                  mb_group=_later(rd, sd, "mb_group", sw, int, 0, ver, notes, since=None))
    if fsdp_overlaps_grads(job, shape.zero, shape.dp * shape.cp) and \
            not shape.overlap_grad_reduce:
        # written before 2026-12-07, when the plan said what Megatron-FSDP does not run: it
        # overlaps its ZeRO-2 reduce-scatters always (plan.fsdp_overlaps_grads)
        shape = replace(shape, overlap_grad_reduce=True)
        notes.append(f"{sw}.overlap_grad_reduce true (Megatron-FSDP's ZeRO-2 always overlaps "
                     "its reduce-scatters; the file said false)")
    try:
        validate_shape(model, job, cluster, shape, src=rd.src)
    except SpecError as e:
        # the FP8 recipe is the job's field, not the shape's
        raise rd.wrap(e, "job" if e.field in ("fp8_recipe", "moe_dispatcher") else sw) \
            from None
    pw = "plan.placement"
    rows = rd.get(d, "placement", "plan", list)
    pp, dp, cp = shape.pp, shape.dp, shape.cp
    node = [[None] * (dp * cp) for _ in range(pp)]
    gpus = [[None] * (dp * cp) for _ in range(pp)]
    names = {nd.name: i for i, nd in enumerate(cluster.nodes)}
    rows_of: dict = {}  # (stage, column) -> its row
    gpu_row: dict = {}  # (node name, local GPU) -> the row that holds it
    for k, row in enumerate(rows):
        w = f"{pw}[{k}]"
        if not isinstance(row, dict):
            raise rd.err(w, "must be an object with stage, replica, node, gpus")
        rd.known(row, w, ("stage", "replica", "cp_rank", "node", "gpus"))
        s, r = rd.get(row, "stage", w, int), rd.get(row, "replica", w, int)
        if not (0 <= s < pp and 0 <= r < dp):
            raise rd.err(w, f"stage {s} replica {r} is outside {pp} stages x {dp} replicas")
        c = rd.get(row, "cp_rank", w, int, *(() if cp > 1 else (0,)))
        if not 0 <= c < cp:
            raise rd.err(f"{w}.cp_rank", f"must be 0..{cp - 1} (CP = {cp})")
        col = r * cp + c  # the placement's column
        if node[s][col] is not None:
            raise rd.err(w, f"stage {s} replica {r}" + (f" CP rank {c}" if cp > 1 else "")
                         + f" is listed twice (rows {rows_of[(s, col)]} and {k}); list it once")
        rows_of[(s, col)] = k
        nname = rd.get(row, "node", w, str)
        if nname not in names:
            raise rd.err(f"{w}.node", f"unknown node '{nname}'; it must be one of the "
                         "cluster.nodes names")
        g = rd.get(row, "gpus", w, list)
        if any(not isinstance(x, int) or isinstance(x, bool) for x in g):
            raise rd.err(f"{w}.gpus", "must be a list of local GPU ids (integers)")
        nd = cluster.nodes[names[nname]]
        for x in g:
            if not 0 <= x < nd.num_gpus:
                raise rd.err(f"{w}.gpus", f"GPU {x} is not on {nname} (local ids 0.."
                             f"{nd.num_gpus - 1})")
            if (nname, x) in gpu_row:
                raise rd.err(f"{w}.gpus", f"GPU {x} on {nname} is already in row "
                             f"{gpu_row[(nname, x)]}; each GPU plays one rank")
            gpu_row[(nname, x)] = k
        node[s][col], gpus[s][col] = names[nname], tuple(g)
    for s in range(pp):
        for r in range(dp * cp):
            if node[s][r] is None:
                where = f"replica {r // cp}" + (f" CP rank {r % cp}" if cp > 1 else "")
                raise rd.err(pw, f"stage {s} {where} is missing; list every (stage, "
                             "replica" + (", cp_rank" if cp > 1 else "") + ") once")
    pl = Placement(tuple(map(tuple, node)), tuple(map(tuple, gpus)))
    try:
        validate_placement(cluster, shape, pl, src=rd.src)
    except SpecError as e:
        raise rd.wrap(e, "plan") from None
    return Plan(shape, pl)


def _is_toml(text: str) -> bool:
    """Whether `text` is a TOML document with at least one key (not JSON damaged)."""
    import tomllib
    try:
        return bool(tomllib.loads(text))
    except tomllib.TOMLDecodeError:
        return False


def load_plan(path) -> tuple[ModelSpec, JobSpec, ClusterSpec, Plan, Options, dict]:
    """Read and validate a plan file. Returns (model, job, cluster, plan, options, meta); meta
    holds the stored "estimate", "solver", "schema_version" and "generator" as written."""
    path = Path(path)
    src = str(path)
    rd = FieldReader(src)
    text = read_text(path, what="the plan file (written by --save-plan or solve)")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        if _is_toml(text):  # a cluster file or a job config given for the plan
            raise SpecError("is a TOML file, not a plan file: give the plan file (the JSON "
                            "that --save-plan or solve writes)", source=src) from None
        raise SpecError(f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
                        "the file is damaged, re-create it", source=src) from None
    except RecursionError:
        raise SpecError("nested too deeply to be a plan file", source=src) from None
    if not isinstance(doc, dict):
        raise SpecError("must hold one JSON object (a plan file)", source=src)
    if "schema_version" not in doc:
        raise rd.err("schema_version", "missing; this is not a pipette plan file")
    if doc.get("kind", KIND) != KIND:
        raise rd.err("kind", f"is {doc['kind']!r}, expected '{KIND}' (a plan file, written "
                     "by --save-plan or solve)")
    ver = doc["schema_version"]
    if type(ver) is not int or ver not in READS:  # 3.0 or true are not a version
        raise rd.err("schema_version", f"version {ver!r} is not supported: this "
                     f"pipette-configurator reads plan files of schema_version "
                     f"{' or '.join(map(str, READS))}; re-create the plan with this version")
    rd.known(doc, "", _TOP_KEYS)
    notes: list[str] = []  # fields an older file lacks, read as their defaults
    model = _read_model(rd, rd.obj(doc, "model", ""), ver, notes)
    job = _read_job(rd, rd.obj(doc, "job", ""), ver, notes)
    if bad := dense_moe_option(model, job):  # as the commands refuse it
        raise rd.err(f"job.{bad[0]}", bad[1])
    options = _read_options(rd, rd.obj(doc, "options", "", optional=True), ver, notes)
    if job.framework == "deepspeed" and not options.blocking_p2p:  # as the commands refuse it
        raise rd.err("options.blocking_p2p", "false, but DeepSpeed's pipeline engine blocks on "
                     "every send and receive (its p2p.py): make it true")
    cluster = _read_cluster(rd, rd.obj(doc, "cluster", ""), ver, notes)
    for nd in cluster.nodes:
        if job.precision not in nd.gpu.peak_tflops:
            raise rd.err(f"cluster.gpu_types.{nd.gpu.name}.peak_tflops",
                         f"has no {job.precision} peak, which job.precision needs; add it or "
                         "change the precision")
    plan = _read_plan(rd, rd.obj(doc, "plan", ""), model, job, cluster, ver, notes)
    solver = rd.obj(doc, "solver", "", optional=True)
    estimate = rd.obj(doc, "estimate", "", optional=True)
    calibration = rd.obj(doc, "calibration", "", optional=True)
    emitted = rd.obj(doc, "emitted", "", optional=True)
    if emitted is not None:
        rd.known(emitted, "emitted", ("framework", "version"))
        emitted = {k: rd.get(emitted, k, "emitted", str) for k in ("framework", "version")}
    meta = {"emitted": emitted, "schema_version": ver, "generator": doc.get("generator"),
            "cost_model_revision": doc.get("cost_model_revision"), "estimate": estimate,
            "solver": solver, "calibration": calibration,
            "calibrated_cluster": ver == 2 and calibration is not None,
            # said by the commands that read the file (estimate --plan, emit)
            "read_notes": [f"{src} lacks {', '.join(dict.fromkeys(notes))} (written before "
                           "they were recorded): read as these defaults; save the plan again "
                           "to record its own"] if notes else []}
    return model, job, cluster, plan, options, meta


def recorded_estimate_drift(meta: dict, est, src: str) -> str | None:
    """The warning when a plan file's recorded estimate (iteration time, peak memory) is not
    what this version computes for it (the cost model changed since the file was written),
    or None. (An older file had been re-estimated 18.9% slower without a word.)"""
    rec = meta.get("estimate") or {}
    it, mem = rec.get("iteration_ms"), rec.get("peak_memory_gib")
    if rec:
        # a recorded number that is not one cannot be compared: said, not skipped (an edited
        # "abc" or -5 had turned the comparison off without a word)
        bad = [f"estimate.{k} {json.dumps(v)[:20]}" for k, v in
               (("iteration_ms", it), ("peak_memory_gib", mem))
               if not (isinstance(v, (int, float)) and not isinstance(v, bool)
                       and math.isfinite(v) and v > 0)]
        if bad:
            return (f"{src} records {' and '.join(bad)}, not a positive number: its recorded "
                    "estimate cannot be compared with this one; estimate the plan again to "
                    "record it")
    said = []
    if isinstance(it, (int, float)) and it > 0 and abs(est.iteration_ms / it - 1) > 1e-6:
        said.append(f"{it / 1e3:.4f} s per iteration (now {est.iteration_ms / 1e3:.4f} s, "
                    f"{100 * (est.iteration_ms / it - 1):+.1f}%)")
    if isinstance(mem, (int, float)) and abs(est.peak_memory_gib - mem) > 1e-6 * max(1.0, mem):
        said.append(f"a peak of {mem:.2f} GiB (now {est.peak_memory_gib:.2f} GiB)")
    if not said:
        return None
    by = meta.get("generator") or "an earlier version"
    rev, now = meta.get("cost_model_revision"), cost_model_revision()
    if rev == now:  # this very cost model: the file's numbers changed, not the model
        return (f"{src} records {' and '.join(said)}, written with this cost model (revision "
                f"{rev}): the recorded estimate was edited, or computed with other inputs "
                "than the file holds; estimate the plan again to record this one")
    since = (f"cost model revision {rev}, now {now}" if isinstance(rev, str) else
             "before plan files recorded the cost model's revision")
    return (f"{src} records {' and '.join(said)}, written by {by} ({since}): the cost model "
            "has changed since; re-solve to plan with this version's")


def recorded_profile(meta: dict, src: str):
    """The calibration profile a plan file carries whole (schema 3), or None: none recorded,
    or a schema 2 file, whose cluster the profile already scaled (`meta["calibrated_cluster"]`;
    the commands refuse a second profile on it)."""
    from formats.profile import profile_from_dict

    cal = meta.get("calibration")
    if cal is None or meta.get("calibrated_cluster"):
        return None
    known = ("profile", "gpu", "parameters", "document", "recorded_in_plan", "safe_memory",
             "notes")
    for key in cal:
        if key not in known:
            raise SpecError(f"unknown field; a plan's calibration holds {', '.join(known)}",
                            source=src, field=f"calibration.{key}")
    doc = cal.get("document")
    if not isinstance(doc, dict):
        raise SpecError("missing: a calibrated plan carries its profile whole; re-create it "
                        "(estimate or solve with --calibration and --save-plan)", source=src,
                        field="calibration.document")
    prof = profile_from_dict(doc, f"{src} (calibration.document)")
    # the summary beside the document says the same, or the file was edited: which one holds?
    for field, want in (("gpu", prof.gpu), ("parameters", dict(prof.values))):
        if cal.get(field, want) != want:
            raise SpecError("does not match calibration.document, the profile the plan "
                            "applies; re-create the plan with --calibration, or give "
                            "--calibration", source=src, field=f"calibration.{field}")
    return prof
