"""Validation against published training runs (data/published_runs.json, copied with its
citations from shared/reference; see data/published_runs.README.md).

Each usable run is turned into a model, a job, a uniform cluster and a plan. Where the source is
silent, the assumption used is listed per run in `assumptions`; runs we cannot model (missing
shapes, batch sizes, timings or interconnects) are listed as skipped with the reason.

Cluster bandwidths per source group (per GPU, one direction):
- Selene (Narayanan et al. 2021, MT-NLG): 8 HDR InfiniBand 200 Gb/s HCAs per node, one per GPU:
  25 GB/s line rate per GPU stream.
- Jean Zay (BLOOM): 4 Omni-Path 100 Gb/s links per 8-GPU node: 50 GB/s per node, 6.25 GB/s per
  GPU stream.
- torchtitan's Grand Teton H100 cluster: RDMA 400 Gb/s per GPU: 50 GB/s per GPU stream; H100
  NVLink4 450 GB/s per direction times NVLINK_ACHIEVED.
- Intra-node: NVLink3/NVSwitch A100, 300 GB/s per direction per GPU (datasheet) times
  NVLINK_ACHIEVED = 0.8 (the all-reduce bus bandwidth nccl-tests reports on DGX A100 is about
  230-240 GB/s).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import statistics
from dataclasses import dataclass, field

from model.estimator import Estimate, estimate, make_plan
from model.plan import deepspeed_runs_zero, deepspeed_split
from model.specs import JobSpec, ModelSpec, Options

from . import presets
from .clusters import NVLINK_ACHIEVED, uniform_cluster

NETWORKS_GB_PER_S = {  # source_group prefix -> (inter-node GB/s per GPU stream, description)
    "narayanan_sc21": (25.0, "Selene: HDR 200 Gb/s per GPU"),
    "bloom": (6.25, "Jean Zay: 4x OPA 100 Gb/s per 8 GPUs"),
    "mt_nlg": (25.0, "Selene: HDR 200 Gb/s per GPU"),
    "torchtitan": (50.0, "Grand Teton: RDMA 400 Gb/s per GPU"),
    "megatron_bridge": (50.0, "DGX H100 / B200: ConnectX-7 400 Gb/s per GPU"),
}


@dataclass
class Comparison:
    id: str
    group: str = ""
    params: int | None = None
    predicted_s: float | None = None
    published_s: float | None = None
    time_source: str = ""
    predicted_gib: float | None = None
    published_gib: float | None = None
    # torchtitan: the prediction without the CUDA context, as its reading (the allocator's
    # reserved peak) counts memory; `predicted_gib` keeps the whole prediction
    predicted_reserved_gib: float | None = None
    config: tuple = ()  # the configuration run (model, layout, batch): repeated readings share it
    oom_published: bool | None = None
    predicted_fits: bool | None = None
    limit_gib: float | None = None
    assumptions: list[str] = field(default_factory=list)
    skipped: str | None = None
    estimate: Estimate | None = None
    # the 95% prediction interval (s) where a calibration profile applies to the run
    interval_low_s: float | None = None
    interval_high_s: float | None = None

    @property
    def inside_interval(self) -> bool | None:
        """Whether the published time lies in the calibrated interval (None: no interval or
        no published time)."""
        if self.interval_low_s is None or self.published_s is None:
            return None
        return self.interval_low_s <= self.published_s <= self.interval_high_s

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


def load_moe_runs() -> list[dict]:
    """Published mixture-of-experts runs (data/published_moe_runs.json): kept apart from the
    reference set, to judge the model with; nothing is fitted to them."""
    with open(presets.data_path("published_moe_runs.json")) as f:
        return json.load(f)


def load_dense_heldout_runs() -> list[dict]:
    """Published dense runs on H100, B200, GB200 and GB300 (data/published_dense_heldout_runs.json):
    kept apart from the reference set like the mixture-of-experts runs; nothing is fitted to
    them."""
    with open(presets.data_path("published_dense_heldout_runs.json")) as f:
        return json.load(f)


def load_bloom_heldout(kind: str) -> dict:
    """BLOOM's pre-launch readings that are not in the reference set
    (data/published_bloom_{kind}_heldout.json, kind "memory" or "time"): kept apart to judge
    the model with; nothing is fitted to them."""
    with open(presets.data_path(f"published_bloom_{kind}_heldout.json")) as f:
        return json.load(f)


# The reference rows a held-out BLOOM row is built from: fp16 rows from a 02-25 row (ZeRO-1,
# partition_method 'type:transformer'), bf16 rows from the production run (the BF16 optimizer,
# its sharding and pipeline split)
BLOOM_HELDOUT_BASES = {"fp16": "bloom_prequel_02-25_181B_h14336_l72_dp12_tp8_pp4_mbs2_nh64",
                       "bf16": "bloom176b_production"}


def bloom_heldout_record(row: dict, runs: list[dict] | None = None) -> dict:
    """A reference-set-shaped record for one held-out BLOOM row: its base run
    (BLOOM_HELDOUT_BASES by precision) with the row's shape, layout, batch and pipeline
    partition method in place."""
    base_id = BLOOM_HELDOUT_BASES[row["precision"]]
    base = next(r for r in (runs if runs is not None else load_runs()) if r["id"] == base_id)
    r = copy.deepcopy(base)
    r.update(id=f"{row['date']} h{row['hidden_size']} l{row['num_layers']} "
                f"nh{row['num_attention_heads']} dp{row['dp']} tp{row['tp']} pp{row['pp']} "
                f"mbs{row['micro_batch_size']} gbs{row['global_batch_size']}"
                + (" zero0" if row["zero_stage"] == 0 else ""),
             hidden_size=row["hidden_size"], num_layers=row["num_layers"],
             num_attention_heads=row["num_attention_heads"],
             num_kv_heads=row["num_attention_heads"], ffn_hidden_size=4 * row["hidden_size"],
             dp=row["dp"], tp=row["tp"], pp=row["pp"], num_gpus=row["dp"] * row["tp"] * row["pp"],
             micro_batch_size=row["micro_batch_size"],
             global_batch_size=row["global_batch_size"],
             pipeline_schedule=f"DeepSpeed pipeline engine, --pp-partition-method "
                               f"'{row['partition_method']}'")
    if row["zero_stage"] == 0:
        r["dp_sharding"] = "none"
    return r


def bloom_heldout_inputs(kind: str):
    """Each held-out BLOOM row of `kind` ("memory" or "time") with the inputs it is built into:
    (row, record, (model, job, cluster, plan, notes))."""
    runs = load_runs()
    for row in load_bloom_heldout(kind)["rows"]:
        r = bloom_heldout_record(row, runs)
        yield row, r, run_to_inputs(r)


def _skip_reason(r: dict) -> str | None:
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


def with_gpu(cluster, gpu):
    """The same cluster with every node's GPU replaced (for fits of the curve parameters)."""
    nodes = tuple(dataclasses.replace(nd, gpu=gpu) for nd in cluster.nodes)
    return dataclasses.replace(cluster, nodes=nodes)


def _local_batch(r: dict) -> int | None:
    """torchtitan rows state "Local batch size N per FSDP rank" in their notes."""
    m = re.search(r"Local batch size (\d+) per FSDP rank", r.get("notes") or "")
    return int(m.group(1)) if m else None


def _cluster(r: dict, gpu: str, gpu_params: dict | None):
    """The run's uniform cluster: its GPU preset (fields replaced by `gpu_params`), NVLink at
    NVLINK_ACHIEVED of the datasheet, the source group's network stream per GPU."""
    g = presets.gpu(gpu)
    inter, desc = next(v for k, v in NETWORKS_GB_PER_S.items()
                       if r["source_group"].startswith(k))
    G = r["gpus_per_node"]
    cluster = uniform_cluster(r["num_gpus"] // G, G, gpu, g.nvlink_gb_per_s * NVLINK_ACHIEVED,
                              inter, name=desc)
    return with_gpu(cluster, dataclasses.replace(g, **gpu_params)) if gpu_params else cluster


def run_to_inputs(r: dict, gpu_params: dict | None = None):
    """(model, job, cluster, plan, assumptions) for one published run; `gpu_params` replaces
    fields of the GPU preset (bench/fit_compute.py fits them)."""
    if r["source_group"].startswith("torchtitan"):
        return _torchtitan_inputs(r, gpu_params)
    if r["source_group"].startswith("megatron_bridge"):
        return _bridge_inputs(r, gpu_params)
    notes = []
    vocab = r.get("vocab_size")
    if vocab is None:
        vocab = 250880 if r["source_group"].startswith("bloom") else 51200
        notes.append(f"vocab {vocab} (unpublished)")
    ffn = r.get("ffn_hidden_size") or 4 * r["hidden_size"]
    group = r["source_group"]
    if group.startswith("bloom"):
        # BLOOM: ALiBi, an embedding LayerNorm, no dropout (the released config.json:
        # hidden_dropout and attention_dropout 0.0; assumed for the pre-launch candidates too)
        arch = dict(position_embedding="alibi", dropout=False, embedding_norm=True)
        notes.append("no dropout, embedding LayerNorm (BLOOM's config)")
    else:  # Megatron-LM GPT defaults: learned positions, dropout 0.1
        arch = dict(position_embedding="learned", dropout=True)
    model = ModelSpec(name=r["model_name"], num_layers=r["num_layers"],
                      hidden_size=r["hidden_size"], num_heads=r["num_attention_heads"],
                      num_kv_heads=r.get("num_kv_heads") or r["num_attention_heads"],
                      ffn_hidden_size=ffn, vocab_size=vocab, seq_length=r["seq_length"],
                      gated_mlp=False, tied_embeddings=True, norm="layernorm", bias=True, **arch)
    prec = r.get("precision") or ""
    precision = "bf16" if prec.startswith("bf16") else "fp16"
    if not prec.startswith(("bf16", "fp16")):  # "16-bit (fp16 vs bf16 not stated)": said
        notes.append("fp16 assumed (the source says 16-bit mixed precision, not which)")
    sharding = (r.get("dp_sharding") or "none").lower()
    zero = 3 if ("zero-3" in sharding or "fsdp" in sharding) else int("zero-1" in sharding)
    if r.get("dp_sharding") is None and "zero" in (
            f"{r.get('framework') or ''} {r.get('notes') or ''}").lower():
        notes.append("no ZeRO sharding (the source names ZeRO without a stage)")
    # these runs (2021-2022) predate FlashAttention in Megatron: Megatron-LM's fused
    # scale-mask-softmax kernels store the scores (the attention Korthikanti et al. count)
    # DeepSpeed's pipeline engine and optimizers (BLOOM's Megatron-DeepSpeed, MT-NLG) and
    # its ZeRO-3 (Narayanan et al. Table 2) follow DeepSpeed's byte rules
    framework = "deepspeed" if "deepspeed" in (r.get("framework") or "").lower() else "megatron"
    if deepspeed_runs_zero(framework, precision, zero, r["pp"]) != zero:
        zero = 1  # (the runs without ZeRO are all pipelined: MT-NLG's)
        notes.append("ZeRO-1 (DeepSpeed runs bf16 under its pipeline engine with "
                     "BF16_Optimizer, which shards the optimizer state; no stage published)")
    # and Megatron-LM's pipeline transfers of that time: scattered over the tensor ranks and
    # gathered (JobSpec.p2p_scatter_gather)
    job = JobSpec(global_batch=r["global_batch_size"], seq_length=r["seq_length"],
                  precision=precision, zero=zero, attention="eager", framework=framework,
                  p2p_scatter_gather=framework == "megatron")
    gpu = "A100-80GB" if "80" in (r.get("gpu_type") or "") else "A100-40GB"
    cluster = _cluster(r, gpu, gpu_params)
    mbs = r.get("micro_batch_size")
    if mbs is None:
        mbs = 1
        notes.append("micro-batch 1 (unpublished)")
    rc = (r.get("recompute") or "").lower()
    recompute = "full" if rc.startswith("full") else None
    if recompute is None:
        recompute = "full"
        notes.append("full recompute (not restated; BLOOM's production script uses it)"
                     if group.startswith("bloom") else
                     "full recompute assumed (unpublished)")
    sched, chunks = "1f1b", 1
    if r["pp"] > 1 and "interleaved" in (r.get("pipeline_schedule") or ""):
        # the source says interleaved and chose batches that Megatron's interleaved schedule
        # accepts; the chunk count is not published: the smallest Megatron-LM accepts, which
        # must divide the layers per stage
        per_stage = r["num_layers"] // r["pp"]
        chunks = r.get("vp") or next((v for v in range(2, per_stage + 1)
                                      if per_stage % v == 0), 1)
        sched = "interleaved" if chunks > 1 else "1f1b"
        if not r.get("vp"):
            notes.append(f"interleaved with {chunks} model chunks per stage (the smallest "
                         "count that divides the layers per stage; unpublished)")
    layers = None
    if framework == "deepspeed" and r["pp"] > 1 and chunks == 1:
        layers, note = _deepspeed_partition(r, r["num_layers"], r["pp"],
                                            model.tied_embeddings)
        notes.append(note)
    plan = make_plan(model, job, cluster, tp=r["tp"], pp=r["pp"], dp=r["dp"], micro_batch=mbs,
                     schedule=sched, chunks=chunks, recompute=recompute, zero=zero,
                     layers=layers)
    return model, job, cluster, plan, notes


def _deepspeed_partition(r: dict, num_layers: int, pp: int, tied: bool
                         ) -> tuple[tuple[int, ...] | None, str]:
    """The layers per stage DeepSpeed's pipeline engine gave the run, and a note saying so.

    Megatron-DeepSpeed's GPTModelPipe hands PipelineModule partition_method='type:transformer'
    (bigscience-workshop/Megatron-DeepSpeed, megatron/model/gpt_model.py): the transformer
    layers, weight 1 each, split evenly over the stages, the embedding on the first and the
    tied output layer and loss on the last whatever they cost. BLOOM's production run counts
    the two embedding layers as well ('type:transformer|embedding', its pipeline_schedule
    field): 70 + 2 over 12 stages, 6 each, so the first and last stages hold 5 layers (as
    bigscience's train/tr11-176B-ml/README.md, Architecture, lists them). The rule, uneven
    counts included: model.plan.deepspeed_split."""
    with_embeddings = "type:transformer|embedding" in (r.get("pipeline_schedule") or "")
    method = "type:transformer|embedding" if with_embeddings else "type:transformer"
    layers = deepspeed_split(num_layers, pp, method, tied_embeddings=tied)
    if layers is None:
        return None, (f"DeepSpeed's partition_method='{method}' would leave a stage without a "
                      "transformer layer: the time-balanced split instead")
    return layers, (f"layers per stage as DeepSpeed's partition_method='{method}' splits "
                    f"them: {'/'.join(map(str, layers))}")


def _llama_model(r: dict, **extra) -> ModelSpec:
    """A Llama-style row's model: RoPE, RMSNorm, SwiGLU, untied embeddings, no biases or
    dropout; `extra`: further ModelSpec fields (a Qwen3 mixture of experts')."""
    return ModelSpec(name=r["model_name"], num_layers=r["num_layers"],
                     hidden_size=r["hidden_size"], num_heads=r["num_attention_heads"],
                     num_kv_heads=r["num_kv_heads"], ffn_hidden_size=r["ffn_hidden_size"],
                     vocab_size=r["vocab_size"], seq_length=r["seq_length"], gated_mlp=True,
                     tied_embeddings=False, position_embedding="rope", norm="rmsnorm",
                     bias=False, dropout=False, **extra)


def _torchtitan_inputs(r: dict, gpu_params: dict | None = None):
    """A torchtitan Llama 3.1 benchmark row (FSDP2, TP with sequence parallelism, PP, CP,
    Float8, async TP): Llama architecture, FSDP2's byte table, flash attention (SDPA)."""
    notes = []
    model = _llama_model(r)
    other = r.get("other_settings") or ""
    fp8 = "Float8" in other
    compiled = "compile" in other
    # the loss stayed eager in torchtitan's code of the time (train.py: "compiling loss
    # function causes CUDA errors, turning off for now"), whose memory differs from a
    # compiled loss's (model/memory.py LOSS_BYTES_PER_LOGIT); its Llama repeated K and V to
    # the query heads before SDPA (repeat_kv, models/llama/model.py at ba24697)
    job = JobSpec(global_batch=r["global_batch_size"], seq_length=r["seq_length"],
                  precision="bf16", fp8=fp8, zero=3, attention="flash", framework="torchtitan",
                  compile=compiled, compile_loss=False, repeat_kv=True)
    if not compiled:
        notes.append("eager PyTorch element-wise kernels (no torch.compile)")
    else:
        notes.append("the loss eager (torchtitan 2024-12 did not compile it)")
    cluster = _cluster(r, "H100-96GB-500W", gpu_params)
    tp, pp, cp = r["tp"], r["pp"], r.get("cp") or 1
    dp = r["dp"]
    local = _local_batch(r) or r["global_batch_size"] // dp
    if pp > 1:
        # torchtitan (2024-12): pipeline_parallel_microbatches unset = one micro-batch per
        # stage, so the local batch is cut into pp micro-batches
        mbs = max(1, local // pp)
        notes.append(f"{pp} micro-batches of {mbs} per step (torchtitan's default of one per "
                     "pipeline stage; unpublished)")
    else:
        mbs = local  # no gradient accumulation: the local batch is one micro-batch
    rc = (r.get("recompute") or "").lower()
    recompute = "full" if rc.startswith("full") else "selective"
    sched, chunks = "1f1b", 1
    if pp > 1 and "interleaved" in (r.get("pipeline_schedule") or "").lower():
        sched, chunks = "interleaved", 2
        notes.append("interleaved with 2 stages per rank (unpublished)")
    plan = make_plan(model, job, cluster, tp=tp, pp=pp, dp=dp, cp=cp, micro_batch=mbs,
                     schedule=sched, chunks=chunks, recompute=recompute, zero=3,
                     sequence_parallel=tp > 1, tp_comm_overlap=tp > 1 and "AsyncTP" in other,
                     fp8=fp8)
    return model, job, cluster, plan, notes


BRIDGE_GPUS = {"H100": "H100-SXM-80GB", "B200": "B200", "GB200": "GB200", "GB300": "GB300"}


def layout_layers(layout: str) -> tuple[int, ...]:
    """Transformer layers per virtual pipeline stage of a Megatron-LM
    --pipeline-model-parallel-layout string: stages split by "|", "t" a layer, "x*n" and
    "(...)*n" repetitions, "E" / "L" the embedding and the loss (no layers); a "," only ends
    a repetition."""
    while "(" in layout:
        layout = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), layout)
    layout = re.sub(r"t\*(\d+)", lambda m: "t" * int(m.group(1)), layout.replace(",", ""))
    return tuple(st.count("t") for st in layout.rstrip("|").split("|"))


def _bridge_inputs(r: dict, gpu_params: dict | None = None):
    """A Megatron-Bridge benchmark row (a dense Llama or a Qwen3 mixture of experts) as its
    performance recipe runs: RoPE, RMSNorm, SwiGLU, no biases (QK-norm not counted), FP8
    linear layers with per-tensor current scaling and FP8 weights (the FP8-CS preset's
    fp8_param_gather; Megatron-FSDP gathers 16-bit weights here), or MXFP8 (FP8-MX) with MXFP8
    weights (its presets' fp8_param_gather), flash attention, the distributed
    optimizer's overlaps with more than one replica (the library turns them on then:
    training/comm_overlap.py), no recompute, the recipe's pipeline layout where it names one.
    Gradients reduce in bf16 where other_settings says the recipe does (grad_reduce_in_fp32
    False), in fp32 otherwise.
    Dense rows: TP communication overlap with TP > 1. Mixture of experts: expert TP 1 where EP
    exceeds the data-parallel ranks (Megatron-LM's expert grid), the alltoall dispatcher's
    all-to-all counted exposed."""
    notes = []
    moe = bool(r.get("num_experts"))
    model = _llama_model(r, **(dict(kv_channels=r.get("kv_channels") or 0,
                                    num_experts=r["num_experts"], moe_topk=r["moe_topk"],
                                    moe_ffn_hidden_size=r["moe_ffn_hidden_size"]) if moe else {}))
    tp, pp, dp, cp, ep = r["tp"], r["pp"], r["dp"], r.get("cp") or 1, r.get("ep") or 1
    fsdp = "fsdp" in (r.get("dp_sharding") or "").lower()
    zero = 3 if fsdp else 1
    other = r.get("other_settings") or ""
    precision = (r.get("precision") or "").upper()
    fp8 = precision.startswith("FP8")
    mx = precision.startswith("FP8-MX")
    # the recipe's token dispatcher where the data names it (its other_settings): Megatron-
    # Core's flex dispatcher with the HybridEP or DeepEP backend; otherwise alltoall
    flex = re.search(r"flex dispatcher with (HybridEP|DeepEP)", other)
    dispatcher = flex.group(1).lower() if moe and flex else "alltoall"
    bf16_grads = "grad_reduce_in_fp32 False" in other
    if not bf16_grads:
        notes.append("gradients reduced in fp32 (Megatron-Core's default; other_settings "
                     "does not give the recipe's grad_reduce_in_fp32)")
    job = JobSpec(global_batch=r["global_batch_size"], seq_length=r["seq_length"],
                  precision="bf16", fp8=fp8, zero=zero, attention="flash",
                  framework="megatron",
                  grad_reduce_in_bf16=bf16_grads,
                  fp8_param_gather=fp8 and not fsdp,
                  fp8_recipe="mxfp8" if mx else "tensorwise" if fp8 else "delayed",
                  moe_dispatcher=dispatcher)
    if moe:
        notes.append(f"{dispatcher} dispatcher"
                     + (" (the recipe's flex backend)" if flex else "")
                     + "; its transfers counted exposed (the cost model overlaps them with "
                     "another micro-batch's compute only without pipelining, and these "
                     "recipes' overlap runs with PP > 1 where they have it: other_settings)")
    if fsdp:
        notes.append("Megatron-FSDP gathers 16-bit weights here (FP8 weights are modelled "
                     "with the distributed optimizer only)")
    gpu = next(v for k, v in BRIDGE_GPUS.items() if f"DGX-{k}" in r["gpu_type"])
    cluster = _cluster(r, gpu, gpu_params)
    if r.get("recompute") is None:
        notes.append("no recompute (unpublished; the recipes of the same commit use none)")
    tp_overlap = tp > 1 and not moe
    if tp_overlap:
        notes.append("TP overlap costed with Transformer Engine's default userbuffers "
                     "configuration (the recipe names its own: comm_overlap.py)")
    if "not in this snapshot" in other:
        notes.append(("MXFP8" if mx else "FP8 current scaling") + " with FP8 weights"
                     + (", TP overlap" if tp_overlap else "") + " and the distributed "
                     "optimizer's overlaps as in the recipes of the same commit (this "
                     "container's recipe is not in the snapshot)")
    etp = 1 if moe and ep > dp else 0
    if etp:
        notes.append("expert TP 1 (EP exceeds DP; the recipes leave expert TP at 1)")
    vp = r.get("vp")
    m = re.search(r"pipeline layout (\S+)", other)
    layers = layout_layers(m.group(1).rstrip(",")) if m else None
    overlap = dp * cp > 1 and zero in (1, 2)
    plan = make_plan(model, job, cluster, tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp,
                     micro_batch=r["micro_batch_size"],
                     schedule="interleaved" if vp else "1f1b", chunks=vp or 1, layers=layers,
                     recompute="none", zero=zero, sequence_parallel=tp > 1, fp8=fp8,
                     tp_comm_overlap=tp_overlap, overlap_grad_reduce=overlap,
                     overlap_param_gather=overlap)
    return model, job, cluster, plan, notes


def compare_run(r: dict, options: Options | None = None,
                gpu_params: dict | None = None, profile=None) -> Comparison:
    """One run against the estimator; `profile` (model.calibration) calibrates the runs on its
    GPU type, the others are left as they are."""
    c = Comparison(id=r["id"], group=r["source_group"])
    reason = _skip_reason(r)
    if reason:
        c.skipped = reason
        return c
    model, job, cluster, plan, c.assumptions = run_to_inputs(r, gpu_params)
    if profile is not None and any(nd.gpu.name == profile.gpu for nd in cluster.nodes):
        from model.calibration import apply_profile, interval_s
        # the interval as estimate gives it (model.calibration.interval_s takes the cluster
        # and options before the profile scales them)
        _t, c.interval_low_s, c.interval_high_s = interval_s(
            profile, model, job, cluster, plan, options or Options())
        cluster, options = apply_profile(profile, cluster, options or Options())
        c.assumptions.append(f"calibrated with {profile.source}")
    c.params = model.total_params
    est = estimate(model, job, cluster, plan, options)
    c.estimate = est
    c.predicted_s = est.iteration_ms / 1e3
    if r.get("iteration_time_s") is not None:
        c.published_s, c.time_source = r["iteration_time_s"], "published"
    elif r.get("iteration_time_s_derived") is not None:
        # the data's own formula (derived_fields): from TFLOP/s (Narayanan eq. 3) or from
        # tokens/s (torchtitan, Megatron-Bridge)
        how = (r.get("derived_fields") or {}).get("iteration_time_s_derived", "")
        c.published_s = r["iteration_time_s_derived"]
        c.time_source = "derived from " + ("tokens/s" if "tokens_per_sec" in how else
                                           "TFLOP/s")
    c.config = (model, job, plan.shape)
    if r.get("peak_memory") is not None:
        # BLOOM's readings are written "GB" from nvidia-smi, whose unit is MiB: read as GiB
        # (MiB / 1024), as the data's memory_measurement field says they likely are
        c.published_gib = float(r["peak_memory"])
        # BLOOM: nvidia-smi on the first node, which holds stage 0 (the data's README);
        # torchtitan: the maximum over all GPUs of its memory monitor, the allocator's reserved
        # peak (torchtitan/metrics.py at 9dec370), compared here with the whole prediction,
        # context included, as the allowance in use was chosen (bench/calibrate_overheads.py;
        # its --joint mode compares it without the context), and also without the context
        # (`predicted_reserved_gib`, `Summary.reserved_mem_errs`)
        if r["source_group"].startswith("torchtitan"):
            c.predicted_gib = est.peak_memory_gib
            c.predicted_reserved_gib = max(st.memory.reserved_gib for st in est.stages)
        else:
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

    def a100(self) -> "Summary":
        """The A100 runs (Megatron-LM, Megatron-DeepSpeed): every group but torchtitan's H100
        runs, the set issue 10's goals are stated over."""
        return Summary([x for x in self.rows if not x.group.startswith("torchtitan")])

    def config_mem_errs(self, group_prefix: str = "") -> list[float]:
        """|memory error| per configuration of the rows whose group starts with
        `group_prefix`: a configuration read more than once (BLOOM's DP 8 / TP 4 / PP 12 /
        micro-batch 2 run, 44 and 38 GB in one table) is compared with the mean of its
        readings, as one deterministic prediction cannot be compared with each."""
        by: dict[tuple, list[Comparison]] = {}
        for x in self.rows:
            if x.mem_err is not None and x.group.startswith(group_prefix):
                by.setdefault((x.group, x.config), []).append(x)
        return [abs(v[0].predicted_gib / statistics.fmean(x.published_gib for x in v) - 1)
                for v in by.values()]

    def reserved_mem_errs(self) -> list[float]:
        """|memory error| of the rows whose reading is the allocator's reserved peak
        (torchtitan), against the prediction without the CUDA context."""
        return [abs(x.predicted_reserved_gib / x.published_gib - 1) for x in self.rows
                if x.predicted_reserved_gib is not None and x.published_gib]

    def group_medians(self, attr: str = "time_err") -> dict[str, tuple[float, int]]:
        """Median |iteration-time error| (or `attr`, e.g. "mem_err") and run count per source
        group."""
        groups: dict[str, list[float]] = {}
        for x in self.rows:
            if getattr(x, attr) is not None:
                groups.setdefault(x.group, []).append(getattr(x, attr))
        return {g: (statistics.median(v), len(v)) for g, v in sorted(groups.items())}

    def size_trend(self, group: str = "narayanan_sc21_table1") -> float | None:
        """Least-squares slope of the signed time error (percentage points) against
        log10(parameters) over one group (Narayanan et al. Table 1: 1.7B to 1T)."""
        pts = [(math.log10(x.params), 100 * (x.predicted_s / x.published_s - 1))
               for x in self.rows if x.group == group and x.time_err is not None]
        if len(pts) < 2:
            return None
        mx = statistics.fmean(p[0] for p in pts)
        my = statistics.fmean(p[1] for p in pts)
        return (sum((x - mx) * (y - my) for x, y in pts)
                / sum((x - mx) ** 2 for x, _y in pts))

    @property
    def oom_correct(self) -> tuple[int, int]:
        v = [x.oom_ok for x in self.rows if x.oom_ok is not None]
        return sum(v), len(v)


def validate(options: Options | None = None, gpu_params: dict | None = None,
             profile=None) -> Summary:
    return Summary([compare_run(r, options, gpu_params, profile) for r in load_runs()])


def validate_moe(options: Options | None = None, profile=None) -> Summary:
    """The mixture-of-experts runs, judged with the model as calibrated on the reference set
    (no GPU parameters of their own)."""
    return Summary([compare_run(r, options, profile=profile) for r in load_moe_runs()])


def validate_dense_heldout(options: Options | None = None, profile=None) -> Summary:
    """The held-out dense runs (H100, B200, GB200), judged as the mixture-of-experts ones."""
    return Summary([compare_run(r, options, profile=profile)
                    for r in load_dense_heldout_runs()])
