"""torchtitan's TOML job configs: the releases and model flavors the emitter writes for
(launch/emit.py `torchtitan_config`), and the way back, a plan read from the TOML a run was
launched with (`calibrate LOG --cluster C --run-config TOML`) or from the whole job config the
run printed at start-up (`[job] print_config`, v0.1 `print_args`, which the emitted TOML sets;
`PrintedConfigs`): otherwise torchtitan's log prints neither its batch nor its layout.

Read back: the model is the preset with the dimensions of [model] name/flavor; the job and plan
follow torchtitan's own defaults where a key is absent (torchtitan/config/job_config.py at
v0.2.2, torchtitan/config_manager.py at v0.1.0: local_batch_size 8, global_batch_size -1 =
local x DP, seq_len 2048, bfloat16, data_parallel_shard_degree -1 = the ranks left,
activation checkpointing "selective" with selective_ac_option "2", compile off). Ranks follow
its device mesh (pp, dp_replicate, dp_shard, cp, tp: Megatron-LM's order) over the nodes in the
hostfile's order. What the cost model cannot price as it ran is refused naming the key:
layer-wise selective checkpointing ("2": every second layer), memory-budget checkpointing,
converters other than float8, schedules other than 1F1B, GPipe and Interleaved1F1B, and a
pipeline split left to torchtitan's default (give module_fqns_per_model_part or
pipeline_parallel_split_points).
"""

from __future__ import annotations

import re
import tomllib

from model.cluster import ClusterSpec
from model.errors import SpecError
from model.estimator import make_plan
from model.plan import Plan, megatron_placement
from model.specs import JobSpec, ModelSpec

from . import presets
from .reading import FieldReader, read_text

# torchtitan releases whose TOML job config the emitter writes: "0.2" (v0.2.x, the current
# release: torchtitan/config/job_config.py, layers per pipeline part as
# module_fqns_per_model_part) and "0.1" (v0.1.0 .. the 2025-10 main: torchtitan/config_manager.py,
# pipeline_parallel_split_points). torchtitan main after v0.2.2 replaced the TOML by Python
# configurations (--module/--config), not targeted here.
TORCHTITAN_VERSIONS = ("0.2", "0.1")
# torchtitan model flavors by their dimensions: (name, flavor, layers, hidden, heads, kv heads,
# dense FFN, routed experts, vocabulary, oldest version). From torchtitan/models/<name>/
# __init__.py and model/args.py at v0.2.2 (llama3 also at v0.1.0, where the vocabulary comes
# from the Llama-3 tokenizer); the FFN is llama3's rounding of ffn_dim_multiplier x 8/3 dim up
# to multiple_of, the others' hidden_dim / inter_dim. Llama-2 70B has Llama-3 70B's layers but
# a 32,000 vocabulary: no flavor.
TORCHTITAN_FLAVORS = (
    ("llama3", "8B", 32, 4096, 32, 8, 14336, 0, 128256, "0.1"),
    ("llama3", "70B", 80, 8192, 64, 8, 28672, 0, 128256, "0.1"),
    ("llama3", "405B", 126, 16384, 128, 8, 53248, 0, 128256, "0.1"),
    ("qwen3", "30B-A3B", 48, 2048, 32, 4, 6144, 128, 151936, "0.2"),
    ("qwen3", "235B-A22B", 94, 4096, 64, 4, 12288, 128, 151936, "0.2"),
    ("deepseek_v3", "671B", 61, 7168, 128, 128, 18432, 256, 129280, "0.2"),
)


def torchtitan_flavor(model: ModelSpec, version: str) -> tuple[str, str] | None:
    """The torchtitan (name, flavor) with the model's dimensions in that release, if any."""
    dims = (model.num_layers, model.hidden_size, model.num_heads, model.num_kv_heads,
            model.ffn_hidden_size, model.num_experts, model.vocab_size)
    for name, flavor, *d, oldest in TORCHTITAN_FLAVORS:
        if tuple(d) == dims and float(version) >= float(oldest):
            return name, flavor
    return None



# torch.distributed.pipelining schedule names -> (schedule, one model part per stage)
_SCHEDULES = {"1F1B": ("1f1b", True), "GPipe": ("gpipe", True),
              "Interleaved1F1B": ("interleaved", False)}
_LAYER = re.compile(r"^layers\.(\d+)$")


def _model_of(name: str, flavor: str, version: str, src: str) -> ModelSpec:
    """The preset whose dimensions are torchtitan's flavor in that release."""
    for key in presets.model_names():
        m = presets.model(key)
        if torchtitan_flavor(m, version) == (name, flavor):
            return m
    raise SpecError(f"torchtitan {version}'s {name} {flavor} matches no model preset "
                    "(TORCHTITAN_FLAVORS); give --plan for this run", source=src,
                    field="model.flavor")


def _split(par: dict, version: str, num_layers: int, parts: int, src: str) -> tuple[int, ...]:
    """Transformer layers per model part from the explicit split: v0.2's
    module_fqns_per_model_part (the modules of each part; 'layers.<i>' are the blocks), v0.1's
    pipeline_parallel_split_points (the first module of every part after the first)."""
    if version == "0.2" and par.get("module_fqns_per_model_part"):
        fqns = par["module_fqns_per_model_part"]
        counts = tuple(sum(bool(_LAYER.match(str(x))) for x in part) for part in fqns)
    elif version == "0.1" and par.get("pipeline_parallel_split_points"):
        cuts = []
        for x in par["pipeline_parallel_split_points"]:
            if not (m := _LAYER.match(str(x))):
                raise SpecError(f"split point {x!r} is not a transformer block (layers.<i>)",
                                source=src, field="parallelism.pipeline_parallel_split_points")
            cuts.append(int(m.group(1)))
        edges = [0, *cuts, num_layers]
        counts = tuple(b - a for a, b in zip(edges, edges[1:]))
    else:
        key = ("module_fqns_per_model_part" if version == "0.2"
               else "pipeline_parallel_split_points")
        raise SpecError(f"the pipeline split is left to torchtitan's default; give {key} (or "
                        "--plan) for this run", source=src, field=f"parallelism.{key}")
    if len(counts) != parts or sum(counts) != num_layers or min(counts) < 1:
        raise SpecError(f"the split gives layers {list(counts)}, not {num_layers} over {parts} "
                        "model parts", source=src, field="parallelism")
    return counts


def plan_from_torchtitan_toml(path, cluster: ClusterSpec, version: str = "0.2",
                              node_order: list[int] | None = None
                              ) -> tuple[ModelSpec, JobSpec, Plan]:
    """(model, job, plan) of the torchtitan run launched with the TOML at `path` (release
    `version`: "0.2" or "0.1") on `cluster`."""
    src = str(path)
    if version not in TORCHTITAN_VERSIONS:
        raise SpecError(f"torchtitan version {version!r}; one of "
                        f"{', '.join(TORCHTITAN_VERSIONS)}", source=src, field="version")
    try:
        cfg = tomllib.loads(read_text(path, field="run config", what="the torchtitan TOML"))
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"not TOML ({e})", source=src, field="run config") from None
    return plan_from_torchtitan_doc(cfg, cluster, version, src, node_order)


# what torchtitan prints of its whole job config at start-up when [job] asks for it:
# v0.2.2 train.py -> JobConfig.maybe_log (print_config): 'Running with configs: ' and
# json.dumps(to_dict(), indent=2); v0.1.0 train.py (print_args) and v0.2.0/v0.2.1
# (print_config): 'Running with args: ' and the dict's repr on one line
PRINTED_CONFIG = re.compile(r"Running with (configs|args): (\{.*)$")


class PrintedConfigs:
    """The job configs a torchtitan log printed (PRINTED_CONFIG), fed line by line (a rank
    prefix already taken off): (format, text) per print, format 'json' (v0.2.2: the dict
    spans lines up to its closing brace at the line's start) or 'repr' (one line)."""

    def __init__(self):
        self.found: list[tuple[str, str]] = []
        self.block: list[str] | None = None

    # a print longer than this is no job config (v0.2.2's is about 250 lines): it is closed
    # there, and read as cut short
    MAX_LINES = 20_000

    def feed(self, line: str) -> None:
        if self.block is not None:
            self.block.append(line)
            if line.rstrip() == "}" or len(self.block) > self.MAX_LINES:
                self.found.append(("json", "\n".join(self.block)))
                self.block = None
            return
        if "Running with" in line and (m := PRINTED_CONFIG.search(line)):
            if m.group(1) == "args":
                self.found.append(("repr", m.group(2)))
            elif m.group(2).rstrip() == "{":
                self.block = ["{"]
            else:
                self.found.append(("json", m.group(2)))

    def done(self) -> list[tuple[str, str]]:
        """Every print read, one the log's end cut short included (read as incomplete)."""
        if self.block is not None:
            self.found.append(("json", "\n".join(self.block)))
            self.block = None
        return self.found


def printed_config_doc(fmt: str, text: str, source: str) -> tuple[dict, str]:
    """(the job config as a mapping, the release whose rules read it) from one print: the
    JSON print is v0.2.2's ("0.2"); the repr print is v0.1.0's ("0.1") where its schema is
    v0.1's (training.compile), and v0.2.0/v0.2.1's otherwise, which repeat K and V with v0.2's
    schema, a pair no --framework-version prices: refused."""
    import ast
    import json

    try:
        doc = json.loads(text) if fmt == "json" else ast.literal_eval(text)
    except (ValueError, SyntaxError, RecursionError, MemoryError):
        doc = None
    if not isinstance(doc, dict):
        raise SpecError("its printed job config (Running with ...) is not a complete mapping; "
                        "give --run-config (the TOML it was launched with) or --plan",
                        source=source, field="log")
    if fmt == "json":
        return doc, "0.2"
    if isinstance(doc.get("compile"), dict):
        raise SpecError("torchtitan v0.2.0 / v0.2.1 (v0.2's config, K and V repeated to the "
                        "query heads) is not read from its log; give --plan for this run",
                        source=source, field="log")
    return doc, "0.1"


# torchtitan's float8 converter for linear layers, per release: (its registered name, the
# config section of its settings) (v0.1.0 components/quantization/float8.py:131 'float8',
# config_manager.py [float8]; v0.2.0-v0.2.2 float8.py:238 'quantize.linear.float8',
# job_config.py Quantize.linear.float8)
FLOAT8_CONVERTER = {"0.1": ("float8", "float8"),
                    "0.2": ("quantize.linear.float8", "quantize.linear.float8")}


def plan_from_torchtitan_doc(cfg: dict, cluster: ClusterSpec, version: str, src: str,
                             node_order: list[int] | None = None
                             ) -> tuple[ModelSpec, JobSpec, Plan]:
    """(model, job, plan) of the torchtitan run whose job config is the mapping `cfg` (a
    TOML's, or the whole config the run printed), release `version`, on `cluster`."""
    rd = FieldReader(src)
    sec = {k: rd.obj(cfg, k, "", optional=True) or {}
           for k in ("model", "training", "parallelism", "activation_checkpoint", "compile")}
    mod, tr, par, ac = sec["model"], sec["training"], sec["parallelism"], \
        sec["activation_checkpoint"]

    model = _model_of(rd.get(mod, "name", "model", str, "llama3"),
                      rd.get(mod, "flavor", "model", str, "debugmodel"), version, src)
    converters = rd.get(mod, "converters", "model", list, [])
    name, where = FLOAT8_CONVERTER[version]
    if any(x != name for x in converters):
        other = next(x for x in converters if x != name)
        owner = next((v for v, (n, _w) in FLOAT8_CONVERTER.items() if n == other), None)
        why = (f"torchtitan {version} registers its float8 converter as {name!r}, so the run "
               f"stops at the converter lookup; {other!r} is torchtitan {owner}'s: give "
               f"--framework-version {owner} if the run was" if owner
               else f"only {name} is priced; give --plan")
        raise SpecError(f"converters {converters}: {why}", source=src, field="model.converters")
    f8: dict = cfg
    for part in where.split("."):
        f8 = rd.obj(f8, part, where[:where.index(part)].rstrip("."), optional=True) or {}
    # what the Float8 pricing covers: torchao's tensorwise recipe with bf16 FSDP all-gathers
    # (the torchtitan runs it was checked on), the output layer in bf16 (model/compute.py);
    # other recipes, FP8 all-gathers and an FP8 output layer are not priced
    unpriced = {"recipe_name": f8.get("recipe_name") not in (None, "tensorwise"),
                "enable_fsdp_float8_all_gather": bool(f8.get("enable_fsdp_float8_all_gather")),
                "filter_fqns": bool(converters) and "output" not in f8.get("filter_fqns", [])}
    key = next((k for k, off in unpriced.items() if off), None)
    if key is not None:
        what = ("the output layer in FP8 (filter_fqns without 'output')" if key == "filter_fqns"
                else repr(f8[key]))
        raise SpecError(f"{what} is not priced (Float8 is priced as torchao's tensorwise "
                        "recipe with 16-bit FSDP all-gathers and the output layer in bf16); "
                        "give --plan with the run's plan instead", source=src,
                        field=f"{where}.{key}")
    tp = rd.get(par, "tensor_parallel_degree", "parallelism", int, 1)
    pp = rd.get(par, "pipeline_parallel_degree", "parallelism", int, 1)
    cp = rd.get(par, "context_parallel_degree", "parallelism", int, 1)
    rep = rd.get(par, "data_parallel_replicate_degree", "parallelism", int, 1)
    shard = rd.get(par, "data_parallel_shard_degree", "parallelism", int, -1)
    if min(tp, pp, cp, rep) < 1 or shard == 0 or shard < -1:
        raise SpecError("a parallel degree below 1 (data_parallel_shard_degree may be -1)",
                        source=src, field="parallelism")
    if shard == -1:  # the ranks left (ParallelDims)
        shard = cluster.num_gpus // (rep * tp * pp * cp)
    dp = rep * shard
    if dp * tp * pp * cp != cluster.num_gpus or dp < 1:
        raise SpecError(f"degrees for {rep * shard * tp * pp * cp} GPUs, the cluster has "
                        f"{cluster.num_gpus}", source=src, field="parallelism")
    local = rd.get(tr, "local_batch_size", "training", int, 8)
    gbs = rd.get(tr, "global_batch_size", "training", int, -1)
    gbs = local * dp if gbs == -1 else gbs
    if local < 1 or gbs % (local * dp):
        raise SpecError(f"global batch {gbs} is not a multiple of local batch {local} x DP "
                        f"{dp}", source=src, field="training.global_batch_size")
    precision = {"bfloat16": "bf16", "float32": "fp32"}.get(
        rd.get(tr, "mixed_precision_param", "training", str, "bfloat16"))
    if precision is None:
        raise SpecError("mixed_precision_param must be bfloat16 or float32", source=src,
                        field="training.mixed_precision_param")
    # a release's compile keys in the other release's file: read as the release given, it
    # would be priced without torch.compile
    if version == "0.1" and sec["compile"]:
        raise SpecError("is torchtitan v0.2's section (v0.1 has training.compile): give "
                        "--framework-version 0.2, or the v0.1 key", source=src, field="compile")
    if version != "0.1" and "compile" in tr:
        raise SpecError("is torchtitan v0.1's key (v0.2 has [compile] enable): give "
                        "--framework-version 0.1, or the v0.2 section", source=src,
                        field="training.compile")
    if version == "0.1":  # training.compile: the blocks and the loss together
        compiled = loss_compiled = rd.get(tr, "compile", "training", bool, False)
    else:
        comp = sec["compile"]
        rd.known(comp, "compile", ("enable", "components", "backend"))  # v0.2's Compile
        on = rd.get(comp, "enable", "compile", bool, False)
        parts = rd.get(comp, "components", "compile", list, ["model", "loss"])
        compiled, loss_compiled = on and "model" in parts, on and "loss" in parts
    mode = rd.get(ac, "mode", "activation_checkpoint", str, "selective")
    option = str(ac.get("selective_ac_option", "2"))
    if mode == "selective" and option != "op":
        raise SpecError(f"selective_ac_option {option!r}: layer-wise selective checkpointing "
                        "is not priced (op-level 'op' is); give --plan", source=src,
                        field="activation_checkpoint.selective_ac_option")
    if mode not in ("selective", "full", "none"):
        raise SpecError(f"mode {mode!r} is not priced (none, selective with 'op', full)",
                        source=src, field="activation_checkpoint.mode")
    schedule, chunks = "1f1b", 1
    layers = None
    if pp > 1:
        name = rd.get(par, "pipeline_parallel_schedule", "parallelism", str, "1F1B")
        if name not in _SCHEDULES:
            raise SpecError(f"schedule {name!r} is not priced ({', '.join(_SCHEDULES)})",
                            source=src, field="parallelism.pipeline_parallel_schedule")
        schedule, single = _SCHEDULES[name]
        fqns = par.get("module_fqns_per_model_part") or []
        points = par.get("pipeline_parallel_split_points") or []
        if not (isinstance(fqns, list) and all(isinstance(x, list) and
                                               all(isinstance(y, str) for y in x)
                                               for x in fqns)):
            raise SpecError("must be a list of lists of module names", source=src,
                            field="parallelism.module_fqns_per_model_part")
        if not (isinstance(points, list) and all(isinstance(x, str) for x in points)):
            raise SpecError("must be a list of module names", source=src,
                            field="parallelism.pipeline_parallel_split_points")
        parts = (len(fqns) if version == "0.2" else len(points) + 1) or pp
        chunks = 1 if single else parts // pp
        if parts != pp * chunks or (not single and chunks < 2):
            raise SpecError(f"{parts} model parts for PP {pp} and schedule {name}",
                            source=src, field="parallelism")
        layers = _split(par, version, model.num_layers, parts, src)
        mbs = rd.get(par, "pipeline_parallel_microbatch_size", "parallelism", int, 1)
        if mbs < 1 or local % mbs:
            raise SpecError(f"micro-batch {mbs} does not divide the local batch {local}",
                            source=src, field="parallelism.pipeline_parallel_microbatch_size")
    else:
        mbs = local  # each local batch one micro-batch, the rest gradient accumulation
    fp8 = bool(converters)  # the float8 converter, the only one let through above
    job = JobSpec(global_batch=gbs, seq_length=rd.get(tr, "seq_len", "training", int, 2048),
                  precision=precision, fp8=fp8, attention="flash", framework="torchtitan",
                  zero=3 if shard > 1 else 0, compile=compiled, compile_loss=loss_compiled,
                  repeat_kv=version == "0.1", source=src)
    rotate = rd.get(par, "context_parallel_rotate_method", "parallelism", str, "allgather")
    async_tp = rd.get(par, "enable_async_tensor_parallel", "parallelism", bool, False)
    ep = rd.get(par, "expert_parallel_degree", "parallelism", int, 1) if model.num_experts else 1
    plan = make_plan(model, job, cluster, tp=tp, pp=pp, dp=dp, cp=cp,
                     cp_alltoall=rotate == "alltoall", ep=ep,
                     micro_batch=mbs, schedule=schedule, chunks=chunks, layers=layers,
                     recompute=mode, sequence_parallel=tp > 1,  # its TP plan shards norms
                     zero=3 if shard > 1 else 0, shard_size=shard if shard > 1 and rep > 1
                     else 0, fp8=fp8,
                     tp_comm_overlap=async_tp,
                     placement=megatron_placement(cluster, tp, pp, dp * cp, node_order))
    return model, job, plan


def torchtitan_logged_mismatch(model: ModelSpec, job: JobSpec, plan: Plan,
                               logged: dict) -> list[tuple[str, object, object]]:
    """Where what a torchtitan log printed of its run at start-up (formats/logs.py
    LogReading.torchtitan_settings: batch, sequence, mesh degrees, parameter count) differs
    from the plan: (what, logged, planned) per difference; what it did not print is not
    checked. The parameter count is compared within 1% (torchtitan counts the module's
    parameters; the cost model's count is ModelSpec.total_params, the same for Llama 3)."""
    sh = plan.shape
    want = {"global batch": ("global_batch", job.global_batch),
            "sequence length": ("seq_len", job.seq_length),
            "pp": ("pp", sh.pp), "cp": ("cp", sh.cp), "tp": ("tp", sh.tp)}
    out = [(name, logged[k], v) for name, (k, v) in want.items()
           if k in logged and logged[k] != v]
    if "dp_shard" in logged or "dp_replicate" in logged:
        dp = logged.get("dp_replicate", 1) * logged.get("dp_shard", 1)
        if dp != sh.dp:
            out.append(("dp_replicate x dp_shard", dp, sh.dp))
    if model.num_experts and "ep" in logged and logged["ep"] != sh.ep:
        out.append(("ep", logged["ep"], sh.ep))
    if "params" in logged and abs(logged["params"] / model.total_params - 1) > 0.01:
        out.append(("total parameters", f"{logged['params']:,}", f"{model.total_params:,}"))
    return out
