"""Command-line entry point: declares the commands and their options, builds the specs from them
and calls the library (formats/, model/, solvers/, launch/); render.py prints the results.

Domain errors are caught here only, printed as one line, and exit with code 2.
"""

from __future__ import annotations

import time

# when this command began: for the first command of the process, before the imports below
# (~0.3-0.6 s); for each later one (a test's CliRunner, a caller of `app`), its own start.
# solve's time limit counts from here, not from the search's start (_search_limit_s)
_START_S = time.perf_counter()
_COMMANDS_RUN = [0]

import functools
import inspect
import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from model.specs import MAX_GLOBAL_BATCH, MAX_SEQ_LENGTH, MOE_DISPATCHERS

import render


def _one_line_usage(run, ctx, *a):
    """Run a click parsing step; its UsageError (typer vendors click: matched by name) becomes
    one error line and exit 2, where click would draw a box of five."""
    try:
        return run(ctx, *a)
    except Exception as e:
        if not any(c.__name__ == "UsageError" for c in type(e).__mro__):
            raise
        what = "commands and options" if hasattr(ctx.command, "commands") else "options"
        fail(f"options: {e.format_message()} (`{ctx.command_path} --help` lists the {what})")


class OneLineGroup(TyperGroup):
    """A command group whose usage errors (an unknown command, an unknown option before the
    command) are one line, as the commands' own."""

    def parse_args(self, ctx, args):
        return _one_line_usage(super().parse_args, ctx, args)

    def resolve_command(self, ctx, args):
        return _one_line_usage(super().resolve_command, ctx, args)


app = typer.Typer(add_completion=False, no_args_is_help=True, cls=OneLineGroup,
                  help="Pipette-style configurator for LLM training on real, uneven clusters.")

EXAMPLE_MODEL = "llama2-70b"
EXAMPLE_CLUSTER = "example"
EXAMPLE_GBS = 256
EXAMPLE_SEQ = 4096

# Old spellings still accepted, hidden from --help: one spelling per concept across commands.
ALIASES = {"--global-batch": "--gbs", "--output": "--out"}


def _aliased(extra: dict[str, str] | None = None):
    """A command class that rewrites old option spellings to the current ones before parsing
    (`--global-batch 8` and `--global-batch=8` both become `--gbs ...`)."""
    table = dict(ALIASES, **(extra or {}))

    class AliasedCommand(TyperCommand):
        def parse_args(self, ctx, args):
            out = []
            for a in args:
                if a == "--":
                    out += args[len(out):]
                    break
                name, eq, val = a.partition("=")
                out.append(table[name] + eq + val if name in table else a)
            # errors of the options themselves (callbacks, usage) come before the command
            # runs: --json on the line makes them JSON on stdout too
            _JSON_ERRORS[0] = "--json" in (out[:out.index("--")] if "--" in out else out)
            _both_sides(self, out)
            return _one_line_usage(super().parse_args, ctx, out)

    return AliasedCommand


def _both_sides(cmd, args: list[str]) -> None:
    """An on/off flag given both ways (--sp --no-sp, --blocking --overlapped) is one error
    line: click keeps the last without a word."""
    given = set(args[:args.index("--")] if "--" in args else args)
    for p in cmd.params:
        on = given & set(getattr(p, "opts", ()))
        off = given & set(getattr(p, "secondary_opts", None) or ())
        if on and off:
            fail(f"options: {min(on)} and {min(off)} both given; give one of them")


def command(name: str | None = None, aliases: dict[str, str] | None = None, parent=None):
    """`@app.command` with the hidden old spellings and the one-line error handling."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            global _START_S
            from model.errors import PipetteError
            if _COMMANDS_RUN[0]:
                _START_S = time.perf_counter()
            _COMMANDS_RUN[0] += 1
            _JSON_ERRORS[0] = bool(k.get("as_json"))
            try:
                return fn(*a, **k)
            except PipetteError as e:
                fail(str(e), getattr(e, "details", None))
            finally:
                _JSON_ERRORS[0] = False
        # The command list shows the docstring's first paragraph as one line (typer keeps its
        # line breaks there, which the list then prints mid-sentence).
        short = " ".join(inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0].split())
        return (parent or app).command(name, cls=_aliased(aliases), short_help=short)(wrapper)
    return deco


# whether the running command was given --json: its errors then also go to stdout as JSON
# ({"error": ..., "exit_code": 2}), so that a script reading stdout gets an object, not nothing
_JSON_ERRORS = [False]


def fail(msg: str, details: dict | None = None) -> None:
    """One line on stderr and exit 2; under --json also the object on stdout, with the
    error's `details` (InfeasibleError: the closest shape, the GPUs the model states need)."""
    from model.errors import one_line

    typer.echo(f"error: {one_line(msg)}", err=True)
    if _JSON_ERRORS[0]:
        typer.echo(json.dumps({"error": one_line(msg), "exit_code": 2, **(details or {})}))
    raise typer.Exit(2)


class Schedule(str, Enum):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved = "interleaved"


class KvRotate(str, Enum):
    allgather = "allgather"
    alltoall = "alltoall"


class Recompute(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


class JobFramework(str, Enum):
    megatron = "megatron"
    deepspeed = "deepspeed"
    torchtitan = "torchtitan"


class Attention(str, Enum):
    flash = "flash"
    eager = "eager"


class Method(str, Enum):
    auto = "auto"
    exact = "exact"
    anneal = "anneal"


class Clock(str, Enum):
    wall = "wall"
    work = "work"


# Shared option types: one spelling and one help text per concept.
ModelOpt = Annotated[str, typer.Option("--model", "-m",
                                       help="Model preset name or a Hugging Face config.json.")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c",
                                         help="Cluster preset name or a cluster .toml file.")]
def _bounded(flag: str, lo: float, hi: float, why: str = ""):
    """A typer callback: the value must be finite and within [lo, hi] (hi may be inf), or one
    error line and exit 2 (the command's own error handling does not run during option parsing)."""
    import math

    def exact(x: float) -> str:  # whole bounds in full (2,147,483,648, not 2.14748e+09)
        return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"

    def check(value):
        if value is None:
            return value
        if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
            span = f"{exact(lo)} or more" if hi == math.inf else f"{exact(lo)} to {exact(hi)}"
            fail(f"options: {flag}: {value!r} is out of range; give {span}"
                 + (f" ({why})" if why else ""))
        return value
    return check


# bounds of the job options, with the reason (model.specs)
GbsOpt = Annotated[int, typer.Option("--gbs", help="Global batch (sequences).",
                                     callback=_bounded("--gbs", 1, MAX_GLOBAL_BATCH))]
SeqOpt = Annotated[Optional[int], typer.Option("--seq", help="Sequence length in tokens.",
                                               callback=_bounded("--seq", 1, MAX_SEQ_LENGTH))]
PrecOpt = Annotated[str, typer.Option(
    "--precision", help="fp32, fp16, bf16 or fp8 (FP8 linear layers over bf16); solve and "
    "compare also take a list, e.g. bf16,fp8, and choose.")]
FrameworkOpt = Annotated[JobFramework, typer.Option(
    "--framework", help="Whose optimizer byte rules and pipeline transfers the job follows.")]
AttentionOpt = Annotated[Attention, typer.Option(
    "--attention", help="flash (FlashAttention / fused attention) or eager (scores stored).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
BlockingOpt = Annotated[bool, typer.Option("--blocking/--overlapped",
                                           help="Blocking pipeline send/recv (Megatron-LM's; "
                                           "DeepSpeed's always block, --overlapped is refused "
                                           "for it); torchtitan's interleaved schedule never "
                                           "blocks on a send and is priced overlapped either "
                                           "way.")]
OverlapGradOpt = Annotated[Optional[bool], typer.Option(
    "--overlap-grad-reduce/--no-overlap-grad-reduce",
    help="Reduce gradients bucket by bucket during the last backward (Megatron-LM; "
         "DeepSpeed's overlap_comm, ZeRO-2 or ZeRO-1 outside bf16). Unset: off, but on under "
         "Megatron-FSDP's ZeRO-2, which always overlaps it.")]
OverlapParamOpt = Annotated[bool, typer.Option(
    "--overlap-param-gather/--no-overlap-param-gather",
    help="Gather parameters during the first forward (distributed optimizer; Megatron-LM).")]
TpOverlapOpt = Annotated[bool, typer.Option(
    "--tp-comm-overlap/--no-tp-comm-overlap",
    help="Pipeline TP all-gathers / reduce-scatters with their GEMMs (Megatron-LM "
    "--tp-comm-overlap, torchtitan async TP); needs TP > 1 with sequence parallelism.")]
EpOverlapOpt = Annotated[bool, typer.Option(
    "--ep-comm-overlap/--no-ep-comm-overlap",
    help="Mixture of experts: run one micro-batch's forward beside another's backward, layer "
    "by layer, hiding the expert all-to-alls (Megatron-LM --overlap-moe-expert-parallel-comm "
    "with --delay-wgrad-compute); needs EP > 1, PP 1, expert TP 1.")]
SavePlanOpt = Annotated[Optional[Path], typer.Option(
    "--save-plan", help="Write the plan, inputs, estimate (and solver status) to this JSON file.")]
EmitOpt = Annotated[Optional[str], typer.Option(
    "--emit", help="Write launch files: megatron, nemo, torchtitan or deepspeed.")]
LaunchOutOpt = Annotated[Optional[Path], typer.Option(
    "--out", "-o", help="Folder for the launch files \\[launch-<framework>].")]
FileOutOpt = Annotated[Optional[Path], typer.Option("--out", "-o",
                                                   help="Write the TOML here \\[stdout].")]
ForceOpt = Annotated[bool, typer.Option(
    "--force", help="Emit a plan that does not fit in memory (every file then says so), and "
    "write into an --out folder holding files this tool did not write.")]
TokenizerOpt = Annotated[Optional[str], typer.Option(
    "--tokenizer", help="Hugging Face tokenizer (name or path) for the emitted Megatron-LM "
    "arguments and NeMo configs \\[NullTokenizer of the model's vocabulary].")]
FwVersionOpt = Annotated[Optional[str], typer.Option(
    "--framework-version", help="The framework release (of the emitted files, the estimate, "
    "or the logs calibrate reads): NeMo bridge (a "
    "Megatron-Bridge recipe) or 1 (NeMo 1.x YAML); torchtitan 0.2 (v0.2.x, the current "
    "release) or 0.1 (v0.1.0 to the 2025-10 main; its estimate counts K and V repeated to "
    "the query heads, as v0.1 runs attention) \\[the current one].")]
GanttOpt = Annotated[Optional[Path], typer.Option(
    "--gantt", help="Write the schedule's Gantt chart to this PNG (or .pdf, .svg).")]
PlacementPngOpt = Annotated[Optional[Path], typer.Option(
    "--placement-png", help="Write the placement on the cluster to this PNG (or .pdf, .svg).")]
MethodOpt = Annotated[Method, typer.Option(
    "--method", help="exact (MILP on HiGHS), anneal, or auto (exact up to "
    "solvers.search.AUTO_EXACT_MAX_NODES nodes).")]
TimeOpt = Annotated[float, typer.Option("--time-limit", help="Seconds for the whole command "
                                        "on the wall clock (--clock work: the search's work "
                                        "seconds).",
                                        callback=_bounded("--time-limit", 0.01, 7 * 86400,
                                                          "at most a week"))]
ClockOpt = Annotated[Clock, typer.Option(
    "--clock", help="wall: --time-limit is wall seconds; work: work seconds (model/work.py: "
    "counted solver and estimator operations), the same result on any machine and under any "
    "load, for reproducible research.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed.",
                                      callback=_bounded("--seed", 0, 2**32 - 1,
                                                        "numpy seeds are 32-bit"))]
TpListOpt = Annotated[Optional[str], typer.Option(
    "--tp", help="Tensor-parallel degrees to search: a value or a list, e.g. 4,8 \\[all].")]
PpListOpt = Annotated[Optional[str], typer.Option(
    "--pp", help="Pipeline-parallel degrees to search: a value or a list \\[all].")]
MbsListOpt = Annotated[Optional[str], typer.Option(
    "--mbs", help="Micro-batch sizes to search: a value or a list \\[1,2,4,8].")]
ScheduleListOpt = Annotated[Optional[str], typer.Option(
    "--schedule", help="Schedules to search: 1f1b, gpipe, interleaved, interleaved:V, "
    "comma-separated \\[1f1b,interleaved].")]
MbGroupsOpt = Annotated[Optional[str], typer.Option(
    "--mb-groups", help="Interleaved schedule's micro-batch groups to search (Megatron-LM's "
    "stack): smallest (the smallest it runs: PP where PP divides the micro-batches), whole "
    "(one group of every micro-batch), comma-separated \\[smallest].")]
RecomputeListOpt = Annotated[Optional[str], typer.Option(
    "--recompute", help="Recompute modes to search: none, selective, full, comma-separated "
    "\\[all].")]
ZeroListOpt = Annotated[Optional[str], typer.Option(
    "--zero", help="ZeRO stages to search (0 none, 1 optimizer state / distributed optimizer, 2 "
    "+ gradients, 3 + parameters / FSDP), e.g. 1,3 \\[Megatron-LM 0,1 (its FSDP is opt-in; "
    "solve looks at ZeRO-3 after the search); DeepSpeed 0-3, in bf16 1-3; torchtitan 0,3].")]
ShardListOpt = Annotated[Optional[str], typer.Option(
    "--shard-size", help="HSDP: data-parallel ranks per shard group for ZeRO-3, a value or a "
    "list; 0 shards over the whole group \\[0 and one node's replicas].")]
CpListOpt = Annotated[Optional[str], typer.Option(
    "--cp", help="Context-parallel degrees to search: a value or a list \\[1; for sequences of "
    "16k tokens or more, every power of two the sequence admits; below, solve looks at CP "
    "after the search].")]
KvRotateListOpt = Annotated[Optional[str], typer.Option(
    "--kv-rotate", help="torchtitan with CP: its K/V rotation (context_parallel_rotate_method) "
    "to search, allgather, alltoall or both comma-separated \\[both].")]
SafeMemoryOpt = Annotated[bool, typer.Option(
    "--safe-memory", help="With --calibration fitted on 2+ memory readings: judge and report "
    "memory at the top of its 95% interval, so a plan that fits fits there.")]
CalibrationOpt = Annotated[Optional[Path], typer.Option(
    "--calibration", help="A calibration profile (`calibrate`): its fitted parameters replace "
    "the presets' for its GPU type, and estimates carry 95% prediction intervals.")]
GradBf16Opt = Annotated[bool, typer.Option(
    "--grad-reduce-in-bf16", help="Megatron-LM: bf16 main gradients, reduced in bf16 (2 bytes "
    "per parameter instead of fp32's 4).")]
FusedLossOpt = Annotated[bool, typer.Option(
    "--fused-loss", help="Megatron-LM: Megatron-Core's fused cross-entropy, its native "
    "implementation (--cross-entropy-loss-fusion; Megatron-Bridge's default): the loss step "
    "peaks at 10 bytes per logit instead of 6.")]
Fp8ParamsOpt = Annotated[bool, typer.Option(
    "--fp8-param-gather", help="Megatron-LM: keep FP8 linear layers' weights in FP8 only "
    "(--fp8-param-gather; plans with fp8 and the distributed optimizer): the recipe's FP8 "
    "copies without the 16-bit weight (on Hopper 2 bytes, the FP8 data and its transpose, "
    "instead of 2 + 2), all-gathered in 1 byte; MXFP8 weights (both copies with their scales) "
    "are gathered in 16 bits; not with the blockwise recipe (model/fp8.py).")]
class Fp8Recipe(str, Enum):
    delayed = "delayed"
    tensorwise = "tensorwise"
    mxfp8 = "mxfp8"
    blockwise = "blockwise"


Fp8RecipeOpt = Annotated[Fp8Recipe, typer.Option(
    "--fp8-recipe", help="Transformer Engine's FP8 scaling: delayed (amax history; Megatron-LM's "
    "default), tensorwise (per-tensor current scaling, as Megatron-Bridge's FP8-CS recipes: "
    "each cast reads its tensor once more for the amax), mxfp8 (blocks of 32, Blackwell: "
    "B200, GB200, B300, GB300; FP8-MX) or blockwise (1x128 / 128x128 blocks, H100 / H200). "
    "Copies and casts by recipe and GPU: model/fp8.py.")]
CompileOpt = Annotated[bool, typer.Option(
    "--compile/--no-compile", help="torchtitan: torch.compile each transformer block (fused "
    "element-wise kernels) and the loss, as torchtitan does; --no-compile estimates eager "
    "PyTorch kernels and loss. Other frameworks always run fused kernels.")]
CapacityOpt = Annotated[float, typer.Option(
    "--moe-capacity-factor", help="Mixture of experts: tokens per expert relative to a "
    "balanced router (1.0: balanced and dropless; c > 1: token dropping at capacity c, inputs "
    "padded).")]
# the dispatchers priced (model.specs.MOE_DISPATCHERS), as typer's choices
MoeDispatcher = Enum("MoeDispatcher", {d: d for d in MOE_DISPATCHERS}, type=str)


DispatcherOpt = Annotated[MoeDispatcher, typer.Option(
    "--moe-dispatcher", help="Mixture of experts: Megatron-Core's token dispatcher. alltoall "
    "(NCCL all-to-all of every routed copy), or the flex dispatcher with deepep or hybridep "
    "(each token once per destination GPU, once per destination node over the network, "
    "forwarded over NVLink; expert TP 1; hybridep for nodes of more than 8 GPUs).")]
EpListOpt = Annotated[Optional[str], typer.Option(
    "--ep", help="Expert-parallel degrees to search (mixture-of-experts models): a value or a "
    "list \\[every degree dividing the experts and DP x CP].")]
GpuOpt = Annotated[str, typer.Option("--gpu", help="GPU preset of every node (see `presets`).")]
GpusPerNodeOpt = Annotated[int, typer.Option("--gpus-per-node", help="GPUs per node.")]
IntraTopologyOpt = Annotated[Optional[str], typer.Option(
    "--intra-topology", help="Intra-node topology preset (data/topologies: dgx-a100, "
    "dgx1-v100, ...) instead of a uniform link.")]
LatencyOpt = Annotated[float, typer.Option("--latency-us", help="Per-message latency, us.")]
IntraLatencyOpt = Annotated[Optional[float], typer.Option(
    "--intra-latency-us", help="Per step of a collective inside a node, us \\[10].")]


def _precision(text: str, allow_list: bool) -> tuple[str, bool | None]:
    """--precision: one of fp32, fp16, bf16, fp8 (bf16 base with FP8 linear layers), or, where
    the solver chooses, a comma-separated list (bf16,fp8): (base precision, fp8 True / False /
    None for the solver's choice)."""
    from model.errors import SpecError
    from model.specs import PRECISIONS

    parts = [x.strip().lower() for x in text.split(",")]
    known = PRECISIONS + ("fp8",)
    bad = [x for x in parts if x not in known]  # an empty item (bf16,,fp8) too
    if not parts or bad or len(set(parts)) != len(parts):
        raise SpecError(f"{text!r} is not a precision; use one of {', '.join(known)}"
                        + (" or a list such as bf16,fp8" if allow_list else ""),
                        source="options", field="--precision")
    if len(parts) > 1 and not allow_list:
        raise SpecError("takes one precision here; solve and compare take a list",
                        source="options", field="--precision")
    bases = [x for x in parts if x != "fp8"]
    if len(bases) > 1:
        raise SpecError(f"give one base precision (of {', '.join(PRECISIONS)}), with or "
                        "without fp8", source="options", field="--precision")
    if "fp8" not in parts:
        return bases[0], False
    return (bases[0], None) if bases else ("bf16", True)


def _inputs(model: str, cluster: str, gbs: int, seq: int | None, precision: str,
            distopt: bool | None = None, attention: str = "flash", allow_list: bool = False,
            framework: str = "megatron", grad_reduce_in_bf16: bool = False,
            fused_loss: bool = False, fp8_param_gather: bool = False,
            fp8_recipe: str = "delayed",
            moe_capacity_factor: float = 1.0, compile_blocks: bool = True,
            framework_version: str | None = None, moe_dispatcher: str = "alltoall"):
    from formats import presets
    from formats.clusters import cluster as load_cluster
    from model.errors import SpecError
    from model.specs import JobSpec

    base, fp8 = _precision(precision, allow_list)
    m = presets.model(model)
    c = load_cluster(cluster)
    job = JobSpec(global_batch=gbs, seq_length=seq or m.seq_length, precision=base, fp8=fp8,
                  attention=attention, distributed_optimizer=distopt, framework=framework,
                  grad_reduce_in_bf16=grad_reduce_in_bf16, fused_loss=fused_loss,
                  fp8_param_gather=fp8_param_gather,
                  fp8_recipe=fp8_recipe,
                  moe_capacity_factor=moe_capacity_factor, compile=compile_blocks,
                  moe_dispatcher=moe_dispatcher,
                  # torchtitan v0.1 repeats K and V to the query heads (JobSpec.repeat_kv)
                  repeat_kv=framework == "torchtitan" and framework_version == "0.1",
                  source="options")
    from model.plan import dense_moe_option, dispatcher_problem
    if bad := dense_moe_option(m, job):
        raise SpecError(bad[1], source="options", field="--" + bad[0].replace("_", "-"))
    if m.is_moe and (why := dispatcher_problem(job, c)):
        # every EP > 1 plan would be refused, leaving the option without effect
        raise SpecError(why, source="options", field="--moe-dispatcher")
    return m, job, c


def _options(blocking: bool):
    from model.specs import Options
    return Options(blocking_p2p=blocking)


def _calibrated(c, opts, calibration: Path | None, safe_memory: bool = False,
                recorded=None):
    """(cluster, options, profile, what the plan file records) with the profile applied;
    `safe_memory`: memory at the top of the profile's 95% memory interval (its fragmentation
    there), for every plan judged and reported. `recorded`: (profile, its record) a plan
    file carries, used where no --calibration is given (which replaces it)."""
    import dataclasses

    from model.errors import SpecError
    if calibration is None and recorded is None:
        if safe_memory:
            raise SpecError("needs --calibration, a profile fitted on two or more memory "
                            "readings", source="options", field="--safe-memory")
        return c, opts, None, None
    from formats.profile import load_profile
    from model.calibration import apply_profile, fragmentation_at_interval_top
    if calibration is not None:
        prof, label = load_profile(calibration), str(calibration)
    else:  # the path as recorded (it had carried "(recorded in the plan file)" into JSON
        # and into plan files saved again); the terminal says where it came from
        prof, label = recorded[0], str(recorded[1].get("profile"))
    c2, o2 = apply_profile(prof, c, opts)
    cal = {"profile": label, "gpu": prof.gpu, "parameters": dict(prof.values),
           "document": prof.to_dict()}
    if calibration is None:
        cal["recorded_in_plan"] = True
    others = sorted({nd.gpu.name for nd in c.nodes} - {prof.gpu})
    if others:
        links = [k for k in ("network_scale", "nvlink_scale", "intra_latency_scale")
                 if k in prof.values]
        cal["notes"] = [
            f"the profile is for {prof.gpu}: the {', '.join(others)} nodes keep their presets' "
            "efficiencies" + (f", while its {', '.join(links)} apply to every link" if links
                              else "") + "; its interval does not cover what those nodes do"]
    if safe_memory:
        f_top = fragmentation_at_interval_top(prof)
        o2 = dataclasses.replace(o2, overheads=dataclasses.replace(o2.overheads,
                                                                   fragmentation=f_top))
        cal["safe_memory"] = {"fragmentation": f_top,
                              "fitted_fragmentation": prof.values["fragmentation"]}
    return c2, o2, prof, cal


def _int_list(text: str | None, flag: str, allow_zero: bool = False
              ) -> tuple[int, ...] | None:
    """A value or a comma-separated list of positive integers ("8" or "2,4,8")."""
    from model.errors import SpecError

    if text is None:
        return None
    try:
        vals = tuple(int(x) for x in text.split(","))  # "8,,4": an empty item, refused
    except ValueError:
        vals = ()
    if not vals or any(v < (0 if allow_zero else 1) for v in vals):
        raise SpecError(f"{text!r}: give a {'non-negative' if allow_zero else 'positive'} "
                        "integer or a comma-separated list of them, e.g. 2,4,8",
                        source="options", field=flag)
    return tuple(sorted(set(vals)))


def _zero_against_distopt(zeros: tuple[int, ...] | None, distopt: bool | None) -> None:
    """--zero and --distopt / --no-distopt must agree (ZeRO-1 to 3 are the distributed
    optimizer): one line where they do not (--no-distopt had made the job ZeRO-0, which won
    over --zero without a word in solve; estimate had let --zero win)."""
    from model.errors import SpecError

    clash = [z for z in zeros or () if distopt is not None and (z >= 1) != distopt]
    if clash:
        raise SpecError(f"--zero {','.join(map(str, clash))} with --{'' if distopt else 'no-'}"
                        "distopt: ZeRO-1 to 3 shard the optimizer state (Megatron-LM's "
                        "distributed optimizer), ZeRO-0 does not; give one of the two",
                        source="options", field="--zero")


def _zero_list(text: str | None) -> tuple[int, ...] | None:
    from model.errors import SpecError

    vals = _int_list(text, "--zero", allow_zero=True)
    if vals is not None and any(v > 3 for v in vals):
        raise SpecError(f"{text!r}: ZeRO stages are 0, 1, 2 and 3", source="options",
                        field="--zero")
    return vals


def _choice_list(text: str | None, flag: str, allowed: tuple[str, ...]) -> tuple[str, ...] | None:
    from model.errors import SpecError

    if text is None:
        return None
    vals = tuple(x.strip().lower() for x in text.split(","))
    bad = [v for v in vals if v not in allowed]  # an empty item too
    if not vals or bad:
        raise SpecError(f"{text!r}: use one or more of {', '.join(allowed)}, comma-separated",
                        source="options", field=flag)
    return vals


def _schedules(text: str | None) -> tuple[tuple[str, int], ...] | None:
    """1f1b, gpipe, interleaved (2 chunks per stage) or interleaved:V, comma-separated."""
    from model.errors import SpecError

    if text is None:
        return None
    out = []
    for x in (y.strip().lower() for y in text.split(",") if y.strip()):
        name, _, v = x.partition(":")
        if name in ("1f1b", "gpipe") and not v:
            out.append((name, 1))
        elif name == "interleaved" and (not v or (v.isdigit() and int(v) >= 2)):
            out.append((name, int(v) if v else 2))
        else:
            raise SpecError(f"{x!r} is not a schedule; use 1f1b, gpipe, interleaved or "
                            "interleaved:V (V >= 2 chunks per stage)", source="options",
                            field="--schedule")
    return tuple(out)


# torchtitan's K/V rotations under context parallelism (Shape.cp_alltoall)
KV_ROTATIONS = tuple(r.value for r in KvRotate)


def _mb_groups(text: str | None, framework: str | None) -> tuple[str, ...] | None:
    """--mb-groups: Megatron-LM's stack's interleaved micro-batch groups; refused for
    torchtitan (PyTorch runs its own rounds) and DeepSpeed (no interleaved schedule), not
    ignored."""
    from model.errors import SpecError

    vals = _choice_list(text, "--mb-groups", ("smallest", "whole"))
    if vals and "whole" in vals and framework in ("torchtitan", "deepspeed"):
        raise SpecError("the micro-batch groups are Megatron-LM's; "
                        + ("torchtitan's interleaved schedule runs PyTorch's own rounds"
                           if framework == "torchtitan" else
                           "DeepSpeed's pipeline engine has no interleaved schedule")
                        + ": drop --mb-groups", source="options", field="--mb-groups")
    return vals


def _p2p_check(blocking: bool, framework: str) -> None:
    """--overlapped for DeepSpeed is refused: its pipeline engine blocks on every send and
    receive (p2p.py dist.send / dist.recv), so an overlapped price is of nothing it runs."""
    from model.errors import SpecError

    if not blocking and framework == "deepspeed":
        raise SpecError("DeepSpeed's pipeline engine blocks on every send and receive (its "
                        "p2p.py), so it cannot run overlapped pipeline transfers: drop "
                        "--overlapped", source="options", field="--overlapped")


def _kv_rotate_check(kv_rotate, framework: str) -> None:
    """--kv-rotate is torchtitan's; given for another framework it is refused, not ignored."""
    from model.errors import SpecError

    if kv_rotate is not None and framework != "torchtitan":
        raise SpecError(f"is torchtitan's K/V rotation under context parallelism; {framework} "
                        "has its own ring: drop it or use --framework torchtitan",
                        source="options", field="--kv-rotate")


def _space(tp_comm_overlap: bool, overlap_grad_reduce: bool | None, overlap_param_gather: bool,
           tp: str | None = None, pp: str | None = None, mbs: str | None = None,
           schedule: str | None = None, recompute: str | None = None,
           zero: str | None = None, shard_size: str | None = None, cp: str | None = None,
           ep: str | None = None, kv_rotate: str | None = None, distopt: bool | None = None,
           ep_comm_overlap: bool = False, framework: str | None = None,
           mb_groups: str | None = None):
    """The search space the options allow: the listed degrees, micro-batches, schedules and
    recompute modes (all of them where an option is absent), with the overlaps the user asked
    for (the frameworks' defaults, off, otherwise)."""
    from model.specs import RECOMPUTE
    from solvers.space import SearchSpace

    base = SearchSpace()
    zeros = _zero_list(zero)
    _zero_against_distopt(zeros, distopt)
    if overlap_grad_reduce is False and framework == "megatron" and zeros and 2 in zeros:
        # (plan.fsdp_overlaps_grads: the search would have overlapped it anyway)
        from model.errors import SpecError
        raise SpecError("Megatron-FSDP's ZeRO-2 always overlaps its gradient reduce-scatter "
                        "(megatron_fsdp.py asserts it): drop --no-overlap-grad-reduce, or 2 "
                        "from --zero", source="options", field="--no-overlap-grad-reduce")
    return SearchSpace(tp=_int_list(tp, "--tp"), pp=_int_list(pp, "--pp"),
                       micro_batch=_int_list(mbs, "--mbs") or base.micro_batch,
                       schedules=_schedules(schedule) or base.schedules,
                       recompute=_choice_list(recompute, "--recompute", RECOMPUTE)
                       or base.recompute,
                       zero=zeros,
                       shard_sizes=_int_list(shard_size, "--shard-size", allow_zero=True),
                       cp=_int_list(cp, "--cp"),
                       ep=_int_list(ep, "--ep"),
                       cp_alltoall=tuple(dict.fromkeys(
                           r == "alltoall" for r in _choice_list(kv_rotate, "--kv-rotate",
                                                                 KV_ROTATIONS) or KV_ROTATIONS)),
                       tp_comm_overlap=(tp_comm_overlap,),
                       overlap_grad_reduce=(bool(overlap_grad_reduce),),
                       overlap_param_gather=(overlap_param_gather,),
                       ep_comm_overlap=(ep_comm_overlap,),
                       mb_groups=_mb_groups(mb_groups, framework) or base.mb_groups)


def _interval_json(interval, profile: str) -> dict:
    """The 95% prediction interval (estimate, low, high in s) as --json gives it; low and
    high null, with the reason, where the profile gives none."""
    d = {"estimate": interval[0], "low": interval[1], "high": interval[2], "level": 0.95,
         "profile": profile}
    if interval[1] is None:
        d["none_because"] = interval[3]
    return d


def _memory_json(mi) -> dict:
    """The peak memory's 95% prediction interval (GiB) as --json gives it."""
    return {"peak": mi.peak_gib, "low": mi.low_gib, "high": mi.high_gib, "level": 0.95,
            "may_not_fit_stage": mi.may_not_fit_stage, "none_because": mi.none_because}


def _write_and_report(m, job, c, plan, est, opts, as_json: bool, *, solver=None,
                      calibration=None, interval=None, mem_interval=None, notes=(),
                      measured=None, **outputs):
    """Write the outputs asked for, then print the estimate and what was written
    (`measured`: the cluster and options before the profile, what a plan file holds;
    `notes`: warnings to add)."""
    from launch.outputs import write_outputs
    from model.compute import shape_warnings
    from model.plan import own_split_warnings

    files, warnings = [], []
    if any(outputs.get(k) is not None
           for k in ("save_plan", "emit", "out", "gantt", "placement_png")):
        files, warnings = write_outputs(m, job, c, plan, est, opts, solver=solver,
                                        calibration=calibration, measured=measured,
                                        **outputs)
    # an emitted DeepSpeed config says the same in its [split] warning
    own = [] if outputs.get("emit") == "deepspeed" else own_split_warnings(m, job, plan.shape)
    # the model's unmodelled settings: the emit's [model] lines say them where it ran
    unmodelled = [] if outputs.get("emit") else _unmodelled_warnings(m, job)
    from model.memory import fp8_param_gather_note
    # an emitted set says it in its [precision] warning
    fp8w = [] if outputs.get("emit") else [n for n in (fp8_param_gather_note(job, plan.shape),)
                                           if n]
    if job.framework == "megatron" and plan.shape.schedule == "gpipe" and plan.shape.pp > 1 \
            and not outputs.get("emit"):  # (the emitted set's [schedule] line says it there)
        fp8w.append("Megatron-LM has no GPipe schedule: it runs 1F1B "
                    "(forward_backward_pipelining_without_interleaving), whose memory (PP - "
                    "stage micro-batches in flight, not all) and time this estimate is not; "
                    "estimate with --schedule 1f1b, or --framework torchtitan, which runs GPipe")
    warnings = [*notes, *(calibration or {}).get("notes", []), *unmodelled,
                *shape_warnings(m, job, plan.shape), *own, *fp8w,
                *_moe_warnings(job, c, plan, emitted=bool(outputs.get("emit"))), *warnings]
    if as_json:
        if mem_interval is not None and mem_interval.may_not_fit_stage is not None:
            warnings.append(render.may_not_fit(mem_interval))  # the terminal says it too
        d = render.estimate_json(m, c, plan, est, files if files else None, warnings, job=job)
        render.echo_json(_with_calibration(d, calibration, interval, mem_interval))
        return
    render.print_estimate(est, plan, c, job=job)
    # which GPUs play which rank, and the slow nodes' share of the plan, as solve says them
    # (estimate --plan of a solved plan had left both out)
    render.print_placement(plan, c)
    render.print_slow_nodes(plan, c)
    _print_calibration(calibration, interval, mem_interval)
    render.print_written(files, warnings)


# what `solve` spends after its search, writing the report (the next-best table's estimates,
# plan and launch files, tables): 0.55 s measured on a 64-node DeepSeek-V3 solve
# (2026-12-07, this machine), kept back from the search's limit
REPORT_RESERVE_S = 0.5


def _search_limit_s(limit_s: float, clock: str) -> float:
    """The search's share of `solve --time-limit` on the wall clock: what is left after the
    process's start-up (imports, reading the inputs: 0.4-0.6 s here) and REPORT_RESERVE_S, so
    that the command, not only its search, returns within the limit (an auditor's T = 5
    solves took 5.5-6.3 s). A work-clock limit (--clock work) is the search's own."""
    if clock != "wall":
        return limit_s
    return max(0.05, limit_s - (time.perf_counter() - _START_S) - REPORT_RESERVE_S)


def _moe_warnings(job, c, plan, asked_ep_overlap: bool = False,
                  emitted: bool = False) -> list[str]:
    """What the MoE options asked for that the plan does not do as asked: a dispatcher with
    EP 1 (no tokens move; the alltoall dispatcher is written, DeepEP refusing a group of one;
    not where a launch set was `emitted`, whose [model] line says it), a placement DeepEP
    cannot start, the all-to-all overlap the best plan cannot use."""
    from model.plan import deepep_layout_problem
    sh, out = plan.shape, []
    if job.moe_dispatcher != "alltoall" and sh.ep <= 1 and not emitted:
        out.append(f"moe dispatcher {job.moe_dispatcher}: the plan has EP 1, so no tokens move "
                   "between GPUs; emit writes the alltoall dispatcher (Megatron-Core's flex "
                   "dispatcher refuses a group of one)")
    if job.moe_dispatcher == "deepep" and sh.ep > 1 and (
            why := deepep_layout_problem(plan, c)):
        out.append(why)
    if asked_ep_overlap and not sh.ep_comm_overlap:
        out.append("--ep-comm-overlap: the plan does not use it (it needs EP > 1 without "
                   "pipelining, whole experts, no full recompute and a 16-bit model); the "
                   "plans that could were slower or did not fit")
    return out


def _profile_label(cal: dict) -> str:
    """The profile as the terminal names it: its path, and where a plan file carried it."""
    return cal["profile"] + (" (recorded in the plan file)" if cal.get("recorded_in_plan")
                             else "")


def _unmodelled_warnings(m, job) -> list[str]:
    """One warning per setting of the model's source the cost model does not price for this
    job (ModelSpec.unmodelled_at)."""
    return [f"{m.origin}: {x}" for x in m.unmodelled_at(job.seq_length)]


def _with_calibration(d: dict, cal, interval, mem_interval, **about_interval) -> dict:
    """`d` (--json) with what a calibration profile adds: the time and memory intervals
    (`about_interval`: more keys for the time interval) and --safe-memory's fragmentation."""
    if interval is not None:
        d["interval_s"] = {**_interval_json(interval, cal["profile"]), **about_interval}
        if cal.get("recorded_in_plan"):
            d["interval_s"]["profile_recorded_in_plan"] = True
    if mem_interval is not None:
        d["memory_interval_gib"] = _memory_json(mem_interval)
    if cal and cal.get("safe_memory"):
        d["safe_memory"] = cal["safe_memory"]
    return d


def _print_calibration(cal, interval, mem_interval, toss_up=None) -> None:
    """What a calibration profile adds to the terminal output (`toss_up`: solve's pair)."""
    if interval is not None:
        render.print_interval(interval, _profile_label(cal))
        if toss_up is not None:
            render.print_toss_up(*toss_up)
    if mem_interval is not None:
        render.print_memory_interval(mem_interval, _profile_label(cal))
    if cal and cal.get("safe_memory"):
        render.print_safe_memory(cal)


def _plan_calibrated(plan_file: Path, meta: dict, c0, opts0, calibration: Path | None,
                     safe_memory: bool):
    """`_calibrated` for a plan file's inputs, plus notes: --calibration replaces the profile
    the file carries; without it the carried one applies (with its --safe-memory). A schema 2
    file that was calibrated holds the scaled cluster: used as it is, never scaled again."""
    from formats.planfile import recorded_profile
    from model.errors import SpecError

    rec = meta.get("calibration")
    if meta.get("calibrated_cluster"):
        if calibration is not None or safe_memory:
            raise SpecError("this plan file (schema 2) holds its cluster already scaled by "
                            f"the profile {str(rec.get('profile'))[:60]!r} and cannot be "
                            "calibrated again; re-create it without a profile (estimate or "
                            "solve with --save-plan) to apply another", source=str(plan_file),
                            field="calibration")
        return c0, opts0, None, None, [
            f"the plan file's cluster is calibrated with {rec.get('profile')} (schema 2: no "
            "interval; re-create the plan with --calibration for one)"]
    if calibration is None:
        prof = recorded_profile(meta, str(plan_file))
    else:  # replaced: a damaged recorded profile does not stand in the way
        try:
            prof = recorded_profile(meta, str(plan_file))
        except SpecError:
            prof = None
    notes = []
    if calibration is not None and prof is not None:
        notes.append(f"--calibration {calibration} replaces the profile the plan file "
                     f"carries ({rec.get('profile')})")
        if rec.get("safe_memory") and not safe_memory:
            notes.append("the plan was judged with --safe-memory (memory at the top of its "
                         "interval); without it here, memory is judged at the estimate: give "
                         "--safe-memory to judge it as it was solved")
    if calibration is None and prof is not None:
        safe_memory = safe_memory or bool(rec.get("safe_memory"))
    c, opts, prof, cal = _calibrated(c0, opts0, calibration, safe_memory,
                                     recorded=None if prof is None else (prof, rec))
    return c, opts, prof, cal, notes


def _interval(prof, m, job, c0, plan, opts0):
    """95% prediction interval of a plan under a calibration profile: (estimate, low, high in
    s, why there is none: low and high then None), or None without a profile."""
    if prof is None:
        return None
    from model.calibration import interval_s, no_interval_reason
    return (*interval_s(prof, m, job, c0, plan, opts0), no_interval_reason(prof))


def _memory_interval(prof, est, cal):
    """The peak memory's 95% prediction interval under a calibration profile
    (model.calibration.MemoryInterval), or None without a profile or a plan, or where memory
    is already at the interval's top (--safe-memory)."""
    if prof is None or est is None or cal.get("safe_memory"):
        return None
    from model.calibration import memory_interval_gib
    return memory_interval_gib(prof, est)


# ---------------------------------------------------------------------------------------------
# estimate, validate, presets


@command()
def estimate(
    ctx: typer.Context,
    model: ModelOpt = EXAMPLE_MODEL,
    cluster: ClusterOpt = EXAMPLE_CLUSTER,
    gbs: GbsOpt = EXAMPLE_GBS,
    seq: SeqOpt = EXAMPLE_SEQ,
    precision: PrecOpt = "bf16",
    attention: AttentionOpt = Attention.flash,
    framework: FrameworkOpt = JobFramework.megatron,
    grad_reduce_in_bf16: GradBf16Opt = False,
    fused_loss: FusedLossOpt = False,
    fp8_param_gather: Fp8ParamsOpt = False,
    fp8_recipe: Fp8RecipeOpt = Fp8Recipe.delayed,
    compile_blocks: CompileOpt = True,
    moe_capacity_factor: CapacityOpt = 1.0,
    moe_dispatcher: DispatcherOpt = MoeDispatcher.alltoall,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 8,
    pp: Annotated[int, typer.Option(help="Pipeline-parallel degree.")] = 4,
    dp: Annotated[Optional[int], typer.Option(
        help="Data-parallel degree \\[GPUs/(TP*PP*CP)].")] = None,
    cp: Annotated[int, typer.Option(help="Context-parallel degree.")] = 1,
    kv_rotate: Annotated[Optional[KvRotate], typer.Option(
        "--kv-rotate", help="torchtitan with CP: its K/V rotation "
        "(context_parallel_rotate_method) \\[allgather, its default].")] = None,
    ep: Annotated[int, typer.Option(help="Expert-parallel degree (mixture of experts).")] = 1,
    etp: Annotated[Optional[int], typer.Option(
        "--etp", help="Expert tensor-parallel degree: 1 (whole experts) or TP \\[TP].")] = None,
    mbs: Annotated[int, typer.Option("--mbs", help="Micro-batch size.")] = 1,
    schedule: Annotated[Schedule, typer.Option(help="Pipeline schedule.")] = Schedule.one_f_one_b,
    chunks: Annotated[int, typer.Option(help="Model chunks per stage (interleaved).")] = 1,
    mb_group: Annotated[Optional[int], typer.Option(
        "--mb-group", help="Interleaved: micro-batches run through one chunk before the next "
        "(Megatron-LM --microbatch-group-size-per-virtual-pipeline-stage) \\[PP; torchtitan: "
        "PyTorch's own].")] = None,
    layers: Annotated[Optional[str], typer.Option(
        help="Layers per virtual stage, comma-separated \\[balanced].")] = None,
    recompute: Annotated[Recompute, typer.Option(help="Activation recompute.")] = Recompute.none,
    sp: Annotated[Optional[bool], typer.Option(
        "--sp/--no-sp", help="Sequence parallelism \\[on with TP > 1 for torchtitan, whose "
        "tensor parallelism shards the norms, and for mixtures of experts, which Megatron-LM "
        "runs with TP only so; off otherwise, Megatron-LM's default].")] = None,
    distopt: Annotated[Optional[bool], typer.Option(
        "--distopt/--no-distopt", help="Distributed optimizer (ZeRO-1); default off, but on "
        "for DeepSpeed's bf16, which runs as priced from ZeRO-1.")] = None,
    zero: Annotated[Optional[int], typer.Option(
        "--zero", help="ZeRO stage 0-3 (with --distopt / --no-distopt: they must agree); "
        "default 0, or 1 for DeepSpeed's bf16.")
    ] = None,
    shard_size: Annotated[int, typer.Option(
        "--shard-size", help="HSDP shard group (ZeRO-3); 0: the whole data-parallel group.")] = 0,
    blocking: BlockingOpt = True,
    tp_comm_overlap: TpOverlapOpt = False,
    ep_comm_overlap: EpOverlapOpt = False,
    overlap_grad_reduce: OverlapGradOpt = None,
    overlap_param_gather: OverlapParamOpt = False,
    as_json: JsonOpt = False,
    plan_file: Annotated[Optional[Path], typer.Option(
        "--plan", help="Read inputs and decisions from a plan file (no other plan options).")] = None,
    save_plan: SavePlanOpt = None,
    emit: EmitOpt = None,
    out: LaunchOutOpt = None,
    gantt: GanttOpt = None,
    placement_png: PlacementPngOpt = None,
    calibration: CalibrationOpt = None,
    safe_memory: SafeMemoryOpt = False,
    force: ForceOpt = False,
    tokenizer: TokenizerOpt = None,
    framework_version: FwVersionOpt = None,
):
    """Per-stage memory and iteration time of one plan (Megatron-LM placement)."""
    from launch.outputs import check_outputs
    from model.errors import SpecError
    from model.estimator import estimate as run_estimate, make_plan

    outputs = dict(save_plan=save_plan, emit=emit, out=out, gantt=gantt,
                   placement_png=placement_png, force=force, tokenizer=tokenizer,
                   version=framework_version)
    check_outputs(**outputs, job_framework=None if plan_file is not None else framework.value)
    if plan_file is not None:  # inputs and decisions from a plan file
        m, job, c0, plan, opts0, meta = _load_plan_only(ctx, plan_file)
        c, opts, prof, cal, notes = _plan_calibrated(plan_file, meta, c0, opts0, calibration,
                                                     safe_memory)
        notes = [*meta["read_notes"], *notes]  # fields an older file lacks: their defaults
        est = run_estimate(m, job, c, plan, opts)
        if calibration is None:  # as the file was estimated: its numbers should be these
            from formats.planfile import recorded_estimate_drift
            drift = recorded_estimate_drift(meta, est, str(plan_file))
            notes = [*notes, drift] if drift else notes
        _write_and_report(m, job, c, plan, est, opts, as_json, calibration=cal,
                          interval=_interval(prof, m, job, c0, plan, opts0),
                          mem_interval=_memory_interval(prof, est, cal), notes=notes,
                          measured=(c0, opts0), **outputs)
        return
    _kv_rotate_check(kv_rotate, framework.value)
    m, job, c = _inputs(model, cluster, gbs, seq, precision, attention=attention.value,
                        framework=framework.value, grad_reduce_in_bf16=grad_reduce_in_bf16,
                        fused_loss=fused_loss,
                        fp8_param_gather=fp8_param_gather, fp8_recipe=fp8_recipe.value,
                        moe_capacity_factor=moe_capacity_factor, compile_blocks=compile_blocks,
                        moe_dispatcher=moe_dispatcher.value,
                        framework_version=framework_version)
    lay = None
    if layers is not None:
        try:
            lay = tuple(int(x) for x in layers.split(","))
        except ValueError:
            raise SpecError("must be comma-separated integers, e.g. 20,20,20,20",
                            source="options", field="--layers") from None
    _zero_against_distopt(None if zero is None else (zero,), distopt)
    _p2p_check(blocking, job.framework)
    c0, opts0 = c, _options(blocking)
    c, opts, prof, cal = _calibrated(c0, opts0, calibration, safe_memory)
    if sp is None:
        sp = (tp or 1) > 1 and (job.framework == "torchtitan" or m.is_moe)
    plan = make_plan(m, job, c, tp=tp, pp=pp, dp=dp, cp=cp,
                     cp_alltoall=kv_rotate == KvRotate.alltoall, ep=ep,
                     etp=0 if etp is None else etp, micro_batch=mbs,
                     schedule=schedule.value,
                     chunks=chunks, mb_group=mb_group or 0, layers=lay, recompute=recompute.value,
                     sequence_parallel=sp, distributed_optimizer=distopt, zero=zero,
                     shard_size=shard_size,
                     tp_comm_overlap=tp_comm_overlap, overlap_grad_reduce=overlap_grad_reduce,
                     overlap_param_gather=overlap_param_gather,
                     ep_comm_overlap=ep_comm_overlap, options=opts)
    est = run_estimate(m, job, c, plan, opts)
    _write_and_report(m, job, c, plan, est, opts, as_json, calibration=cal,
                      interval=_interval(prof, m, job, c0, plan, opts0),
                      mem_interval=_memory_interval(prof, est, cal), measured=(c0, opts0),
                      **outputs)


@command()
def calibrate(
    logs: Annotated[list[Path], typer.Argument(help="Training logs (Megatron-LM, torchtitan, "
                                                "Megatron-Bridge, NeMo, DeepSpeed), one per run.")],
    plan: Annotated[Optional[list[Path]], typer.Option(
        "--plan", help="The plan file each log ran (--save-plan): one per log, in order, or one "
        "for all.")] = None,
    cluster: Annotated[Optional[list[str]], typer.Option(
        "--cluster", "-c", help="Instead of --plan: the cluster each run ran on (preset or file; "
        "one per log or one for all); the plan is read from the arguments a Megatron-LM or "
        "Megatron-DeepSpeed log printed, the configuration a NeMo 1.x or torchtitan log "
        "printed, or the --run-config of a torchtitan or Megatron-Bridge run; ranks in "
        "Megatron-LM's order over the cluster's nodes as listed (or as --hostfile lists "
        "them).")]
    = None,
    hostfile: Annotated[Optional[list[Path]], typer.Option(
        "--hostfile", help="With --cluster: the hostfile each run used (one per log or one for "
        "all): ranks fill the nodes in its order, not the cluster file's.")] = None,
    run_config: Annotated[Optional[list[Path]], typer.Option(
        "--run-config", help="With --cluster, one per log or one for all: for torchtitan logs "
        "the TOML job config each run was launched with (--framework-version 0.1 or 0.2); for "
        "Megatron-Bridge logs the run_config.yaml of one of its checkpoints (iter_N/).")]
    = None,
    framework_version: FwVersionOpt = None,
    save_plans: Annotated[Optional[Path], typer.Option(
        "--save-plans", help="With --cluster: write each plan read from a log to this folder "
        "(<log name>.plan.json, for estimate --plan, emit, or beside solve's choice).")] = None,
    fit_params: Annotated[str, typer.Option(
        "--fit", help="Time parameters to fit, comma-separated: gemm_scale, attention_scale, "
        "network_scale, nvlink_scale, hbm_scale, intra_latency_scale, "
        "kernel_overhead_us.")] = "gemm_scale,network_scale",
    out: Annotated[Path, typer.Option("--out", help="The profile file to write.")] = Path(
        "calibration.json"),
    prior: Annotated[bool, typer.Option(
        "--prior/--no-prior", help="Keep each multiplier near its preset unless the runs say "
        "otherwise (a normal prior on its log; model/calibration.py PRIOR_SD); --no-prior: "
        "plain robust least squares.")] = True,
    as_json: JsonOpt = False,
):
    """Fit a few named cost-model parameters to your own runs' logs; write a profile for
    --calibration (fragmentation too, where the logs report reserved memory)."""
    from formats.profile import save_profile
    from formats.runs import calibration_runs
    from model.calibration import fit
    from model.errors import SpecError

    inputs = [*logs, *(plan or []), *(hostfile or []), *(run_config or [])]
    if any(out.resolve() == Path(x).resolve() for x in inputs):
        raise SpecError(f"{out} is one of the inputs; write the profile to another file",
                        source="options", field="--out")
    runs, readings = calibration_runs(logs, plan, cluster, hostfile, save_plans, run_config,
                                      framework_version)
    gpus = {nd.gpu.name for r in runs for nd in r.cluster.nodes}
    if len(gpus) != 1:
        raise SpecError(f"the plans run on several GPU types ({', '.join(sorted(gpus))}); a "
                        "profile is for one: calibrate each type apart", source="options",
                        field="--plan")
    names = tuple(x.strip() for x in fit_params.split(","))  # "a,,b": refused by fit
    from model.calibration import TIME_PARAMETERS
    if not prior and len(runs) < len(names) and len(set(names)) == len(names) and \
            set(names) <= set(TIME_PARAMETERS):  # (fit names a bad list first)
        # fewer runs (one iteration time each) than unknowns: many values fit them exactly,
        # and the one a plain least-squares fit lands on says nothing (it had been written)
        raise SpecError(f"{len(names)} parameters from {len(runs)} run"
                        f"{'s' * (len(runs) != 1)} without the prior is underdetermined: give "
                        f"at least {len(names)} runs' logs, fit fewer parameters, or keep the "
                        "prior (drop --no-prior)", source="options", field="--fit")
    prof, _ = fit(runs, names, gpus.pop(), prior=prior)
    save_profile(out, prof)
    if as_json:
        render.echo_json({**prof.to_dict(), "written": str(out), "at_bound": prof.at_bounds(),
                          "logs": [render.log_reading_dict(*x) for x in readings]})
        return
    render.print_calibration(prof, out, readings)


@command()
def sweep(
    spec: Annotated[str, typer.Argument(help="A sweep spec (TOML; data/sweeps/example.toml), "
                                        "or `report` followed by a results store.")],
    rest: Annotated[Optional[list[str]], typer.Argument(help="With `report`: the results "
                                                        "store.")] = None,
    results: Annotated[Optional[Path], typer.Option(
        "--results", help="The results store (SQLite) \\[sweeps/<name>.sqlite].")] = None,
    jobs: Annotated[Optional[int], typer.Option(
        "--jobs", help="Worker processes \\[all cores].",
        callback=_bounded("--jobs", 1, 4096))] = None,  # as solve's --jobs
    ray: Annotated[Optional[str], typer.Option(
        "--ray", help="Run on Ray: a cluster address, or `local` for ray.init() here.")] = None,
    out: Annotated[Optional[Path], typer.Option(
        "--out", help="With `report`: the folder for tables and plots \\[sweep-report].")
    ] = None,
):
    """Run a sweep of solves, resumable (a rerun skips the tasks the store holds); or
    `sweep report RESULTS`: tables (CSV, Markdown) and plots (PNG)."""
    from formats.results import Store, report
    from formats.sweepspec import build_inputs, load_spec, spec_notes
    from model.errors import SpecError
    from solvers.sweep import run_sweep

    if rest and spec != "report":
        import difflib
        if difflib.get_close_matches(spec, ["report"], n=1, cutoff=0.6) and \
                not Path(spec).exists():
            raise SpecError(f"{spec[:40]!r} is neither a spec file nor a command; did you mean "
                            f"`sweep report {' '.join(rest)[:60]}`?", source="options",
                            field="SPEC")
        raise SpecError(f"{' '.join(rest)[:60]}: a sweep runs one spec; give the others "
                        "in turn", source="options", field="SPEC")
    if spec == "report":
        if not rest:
            raise SpecError("give the results store: sweep report RESULTS.sqlite",
                            source="options", field="RESULTS")
        if len(rest) > 1:
            raise SpecError(f"{len(rest)} stores given; a report reads one: report each apart",
                            source="options", field="RESULTS")
        store = Store(rest[0], create=False)
        rows = store.rows()
        for w in store.warnings + store.coverage_warnings(rows):
            typer.echo(f"warning: {w}", err=True)
        if not rows:
            raise SpecError("no finished task in the store", source=rest[0], field="tasks")
        files = report(rows, out or Path("sweep-report"))
        render.print_written(files, [])
        return
    if out is not None:  # a run writes its store only (--out had been ignored)
        raise SpecError("is the folder of `sweep report`'s tables and plots; a sweep run "
                        "writes its results to --results: drop --out, then run `sweep report "
                        f"STORE --out {str(out)[:60]}`", source="options", field="--out")
    name, tasks = load_spec(spec)
    store = Store(results or Path("sweeps") / f"{name}.sqlite")
    store.note_sweep(name, [t.id for t in tasks])
    done_before = len(store.done_ids())
    for w in [*(f"{spec}: {x}" for x in spec_notes(tasks)), *store.warnings]:
        typer.echo(f"warning: {w}", err=True)
    bar = render.SweepProgress(len(tasks), done_before)
    try:
        counts = run_sweep(tasks, store, build_inputs, jobs=jobs, progress=bar.update,
                           executor="ray" if ray else "local",
                           ray_address=None if ray in (None, "local") else ray)
    except KeyboardInterrupt:
        # Ctrl-C: every finished task's row is committed, and its workers are stopped and
        # joined (run_sweep); say where the sweep stands
        bar.stop()
        done_now = len(store.done_ids() & {t.id for t in tasks})
        store.close()
        render.say_err(f"stopped by Ctrl-C: {done_now} of the spec's {len(tasks)} tasks done "
                       f"in {store.path}; run the same command again to finish the rest")
        raise typer.Exit(130) from None  # 128 + SIGINT, as a shell reports it
    finally:
        bar.stop()
    render.console().print(f"sweep {name}: {counts['total']} tasks, {counts['skipped']} already "
                           f"in {store.path}, {counts['done']} done, {counts['failed']} failed")
    if counts["failed"]:  # each distinct reason once, with how many tasks it stopped
        ids = {t.id for t in tasks}
        why: dict[str, int] = {}
        for r in store.rows():
            if r["id"] in ids and r.get("status") != "done":
                key = f"{r['inputs']['method']}: {str(r.get('error'))[:160]}"
                why[key] = why.get(key, 0) + 1
        for k, n in why.items():
            typer.echo(f"warning: {n} task(s) failed: {k}", err=True)


@command()
def validate(as_json: JsonOpt = False,
             verbose: Annotated[bool, typer.Option("--verbose", "-v",
                                                   help="Show assumptions per run.")] = False,
             calibration: CalibrationOpt = None):
    """Compare the estimator with published training runs (data/published_runs.json, and the
    held-out mixture-of-experts and dense H100/B200/GB200/GB300 runs of data/published_moe_runs.json
    and data/published_dense_heldout_runs.json)."""
    from formats.published import validate as run_validate, validate_dense_heldout, validate_moe

    prof = None
    if calibration is not None:
        from formats.profile import load_profile
        prof = load_profile(calibration)
    s, moe = run_validate(profile=prof), validate_moe(profile=prof)
    dense = validate_dense_heldout(profile=prof)
    cal = None
    if prof is not None:  # which runs the profile calibrated: those on its GPU type
        on = sum(any(a.startswith("calibrated with") for a in x.assumptions)
                 for x in (*s.rows, *moe.rows, *dense.rows))
        judged = [x.inside_interval for x in (*s.rows, *moe.rows, *dense.rows)
                  if x.inside_interval is not None]
        cal = {"profile": str(calibration), "gpu": prof.gpu, "runs_calibrated": on,
               "runs": len(s.rows) + len(moe.rows) + len(dense.rows),
               # published times inside their calibrated 95% prediction interval
               "inside_interval": sum(judged), "judged": len(judged)}
    if as_json:
        render.echo_json({**render.validate_json(s), "moe": render.validate_heldout_json(moe),
                          "dense_heldout": render.validate_heldout_json(dense),
                          **({"calibration": cal} if cal else {})})
        return
    render.print_validate(s, verbose)
    render.print_validate_heldout(moe, verbose)
    render.print_validate_heldout(dense, verbose, kind="dense")
    if cal:
        render.console().print(
            f"calibrated with {cal['profile']} ({cal['gpu']}): {cal['runs_calibrated']} of "
            f"{cal['runs']} runs are on {cal['gpu']} and use it; the others keep the presets"
            + (f"; {cal['inside_interval']} of the {cal['judged']} published times lie in "
               "their 95% prediction interval" if cal["judged"] else ""),
            highlight=False)


@command()
def presets(as_json: JsonOpt = False):
    """List GPU, model and cluster presets."""
    from formats import presets as P
    from formats.clusters import cluster as load_cluster, cluster_names

    gpus = [P.gpu(n) for n in P.gpu_names()]
    models = [P.model(n) for n in P.model_names()]
    clusters = [(n, load_cluster(n)) for n in cluster_names()]
    if as_json:
        render.echo_json(render.presets_json(gpus, models, clusters))
        return
    render.print_presets(gpus, models, clusters)


# ---------------------------------------------------------------------------------------------
# solve and compare: the main job (solvers/search.py) and the research comparison


@command()
def solve(
    model: ModelOpt = EXAMPLE_MODEL,
    cluster: ClusterOpt = EXAMPLE_CLUSTER,
    gbs: GbsOpt = EXAMPLE_GBS,
    seq: SeqOpt = EXAMPLE_SEQ,
    precision: PrecOpt = "bf16",
    attention: AttentionOpt = Attention.flash,
    framework: FrameworkOpt = JobFramework.megatron,
    grad_reduce_in_bf16: GradBf16Opt = False,
    fused_loss: FusedLossOpt = False,
    fp8_param_gather: Fp8ParamsOpt = False,
    fp8_recipe: Fp8RecipeOpt = Fp8Recipe.delayed,
    compile_blocks: CompileOpt = True,
    moe_capacity_factor: CapacityOpt = 1.0,
    moe_dispatcher: DispatcherOpt = MoeDispatcher.alltoall,
    method: MethodOpt = Method.auto,
    time_limit: TimeOpt = 120.0,
    clock: ClockOpt = Clock.wall,
    seed: SeedOpt = 0,
    distopt: Annotated[Optional[bool], typer.Option(
        "--distopt/--no-distopt", help="Force the distributed optimizer on or off "
        "\\[solver chooses].")] = None,
    tp: TpListOpt = None,
    pp: PpListOpt = None,
    mbs: MbsListOpt = None,
    schedule: ScheduleListOpt = None,
    mb_groups: MbGroupsOpt = None,
    recompute: RecomputeListOpt = None,
    zero: ZeroListOpt = None,
    shard_size: ShardListOpt = None,
    cp: CpListOpt = None,
    ep: EpListOpt = None,
    kv_rotate: KvRotateListOpt = None,
    blocking: BlockingOpt = True,
    tp_comm_overlap: TpOverlapOpt = False,
    ep_comm_overlap: EpOverlapOpt = False,
    overlap_grad_reduce: OverlapGradOpt = None,
    overlap_param_gather: OverlapParamOpt = False,
    as_json: JsonOpt = False,
    save_plan: SavePlanOpt = None,
    emit: EmitOpt = None,
    out: LaunchOutOpt = None,
    gantt: GanttOpt = None,
    placement_png: PlacementPngOpt = None,
    calibration: CalibrationOpt = None,
    safe_memory: SafeMemoryOpt = False,
    force: ForceOpt = False,
    tokenizer: TokenizerOpt = None,
    framework_version: FwVersionOpt = None,
    jobs: Annotated[Optional[int], typer.Option(
        "--jobs", help="Worker processes that bound and screen the shapes \\[all cores]; the "
        "plan found does not depend on it.",
        callback=_bounded("--jobs", 1, 4096))] = None,
):
    """Fastest plan that fits on the cluster as measured (defaults: the built-in example)."""
    from launch.outputs import check_outputs, write_outputs
    from solvers.search import solve as run_solve

    check_outputs(save_plan=save_plan, emit=emit, out=out, gantt=gantt,
                  placement_png=placement_png, force=force, tokenizer=tokenizer,
                  version=framework_version, job_framework=framework.value)

    m, job, c0 = _inputs(model, cluster, gbs, seq, precision, distopt, attention.value,
                         allow_list=True, framework=framework.value,
                         grad_reduce_in_bf16=grad_reduce_in_bf16, fused_loss=fused_loss,
                         fp8_param_gather=fp8_param_gather, fp8_recipe=fp8_recipe.value,
                         moe_capacity_factor=moe_capacity_factor, compile_blocks=compile_blocks,
                         moe_dispatcher=moe_dispatcher.value,
                         framework_version=framework_version)
    _p2p_check(blocking, framework.value)
    opts0 = _options(blocking)
    c, opts, prof, cal = _calibrated(c0, opts0, calibration, safe_memory)
    _kv_rotate_check(kv_rotate, framework.value)
    space = _space(tp_comm_overlap, overlap_grad_reduce, overlap_param_gather, tp, pp, mbs,
                   schedule, recompute, zero, shard_size, cp, ep, kv_rotate, distopt,
                   ep_comm_overlap, framework.value, mb_groups)
    if emit is not None:
        # a plan to launch: only placements torchrun can start in the framework's rank orders
        from dataclasses import replace
        from launch.emit import check_framework
        from launch.ranks import ORDERS
        space = replace(space, launch_orders=ORDERS[check_framework(emit)])
        if c.gpus_per_node is None and not force:
            # torchrun starts one count of processes a node: said before the search, whose
            # result emit would then refuse (nothing written, --save-plan included)
            from model.errors import SpecError
            counts = "/".join(map(str, sorted({nd.num_gpus for nd in c.nodes})))
            raise SpecError(f"launch.sh starts every node with one --nproc_per_node and the "
                            f"cluster's nodes have {counts} GPUs, so no launch.sh or "
                            "hostfile can be written: solve without --emit (--save-plan keeps "
                            "the plan), or add --force to write the configuration without "
                            "them", source="options", field="--emit")
    prog = render.Progress(not as_json)
    from solvers.workers import stop_on_sigint
    try:
        with stop_on_sigint(render.say_err):
            res = run_solve(m, job, c, method=method.value,
                            time_limit_s=_search_limit_s(time_limit, clock.value),
                            seed=seed, options=opts, space=space, progress=prog, jobs=jobs,
                            clock=clock.value)
    finally:
        prog.stop()
    files, warnings = write_outputs(m, job, c, res.plan, res.estimate, opts, save_plan=save_plan,
                                    emit=emit, out=out, gantt=gantt,
                                    placement_png=placement_png, solver=res.status_dict(),
                                    calibration=cal, measured=(c0, opts0), force=force,
                                    tokenizer=tokenizer, version=framework_version)
    warnings = [*res.notes, *(cal or {}).get("notes", []), *warnings]
    if res.plan is not None:
        from model.compute import shape_warnings
        warnings = [*([] if emit else _unmodelled_warnings(m, job)),
                    *shape_warnings(m, job, res.plan.shape),
                    *_moe_warnings(job, c, res.plan, ep_comm_overlap, emitted=bool(emit)),
                    *warnings]
    if res.plan is not None and not emit:
        from model.memory import fp8_param_gather_note
        if note := fp8_param_gather_note(job, res.plan.shape):
            warnings = [*warnings, note.replace("the plan", "the best plan", 1)]
    if clock == Clock.wall and (took := time.perf_counter() - _START_S) > time_limit * 1.05:
        # a limit below what start-up and the search's first pass take cannot be kept: said
        warnings = [*warnings, f"--time-limit {time_limit:g} s: the command took {took:.2f} s "
                    f"(the search {res.wall_s:.2f} s); start-up and the search's first pass over "
                    f"its {res.shapes_total} shapes cannot be cut shorter: give a longer limit"]
    elif clock == Clock.work and res.work_s and res.work_s > time_limit * 1.05:
        warnings = [*warnings, f"--time-limit {time_limit:g} work-s: the search used "
                    f"{res.work_s:.2f} work-s; its first pass over its {res.shapes_total} shapes "
                    "cannot be cut shorter: give a longer limit"]
    interval = _interval(prof, m, job, c0, res.plan, opts0)
    mem_interval = _memory_interval(prof, res.estimate, cal)
    toss, maybe = (res.toss_up(interval[2] * 1e3) if interval is not None
                   and interval[2] is not None else (None, None))
    if as_json:
        d = render.solve_json(res, m, c, files, warnings, space, job=job)
        render.echo_json(_with_calibration(
            d, cal, interval, mem_interval, toss_up_with=toss.describe if toss else None,
            toss_up_with_ms=toss.timed_ms if toss else None,
            toss_up_possible_with=maybe.describe if maybe else None,
            toss_up_possible_with_bound_ms=maybe.lower_bound_ms if maybe else None))
        return
    render.print_solve(res, c, job=job)
    _print_calibration(cal, interval, mem_interval, toss_up=(toss, maybe))
    render.print_written(files, warnings)


@command()
def compare(
    ctx: typer.Context,
    model: ModelOpt = EXAMPLE_MODEL,
    cluster: ClusterOpt = EXAMPLE_CLUSTER,
    gbs: GbsOpt = EXAMPLE_GBS,
    seq: SeqOpt = EXAMPLE_SEQ,
    precision: PrecOpt = "bf16",
    attention: AttentionOpt = Attention.flash,
    framework: FrameworkOpt = JobFramework.megatron,
    grad_reduce_in_bf16: GradBf16Opt = False,
    fused_loss: FusedLossOpt = False,
    fp8_param_gather: Fp8ParamsOpt = False,
    fp8_recipe: Fp8RecipeOpt = Fp8Recipe.delayed,
    compile_blocks: CompileOpt = True,
    moe_capacity_factor: CapacityOpt = 1.0,
    moe_dispatcher: DispatcherOpt = MoeDispatcher.alltoall,
    generated: Annotated[Optional[int], typer.Option(
        help="Instead of --cluster, compare on this many synthetic clusters "
        "(cluster synth's model; see --nodes).",
        # 0 and -1 had compared on --cluster without a word
        callback=_bounded("--generated", 1, float("inf")))] = None,
    nodes: Annotated[int, typer.Option(help="Nodes of each generated cluster.")] = 8,
    cluster_seed: Annotated[Optional[int], typer.Option(
        "--cluster-seed", help="Seed of the first generated cluster (the i-th gets it + i) "
        "\\[--seed]: fix it to vary the solvers' --seed on the same clusters.")] = None,
    time_limit: Annotated[float, typer.Option(
        "--time-limit", help="Seconds each search gets (the same for each, a fair race): the "
        "exact and the annealing search each, per cluster; with --sharding, the search under "
        "each sharding.", callback=_bounded("--time-limit", 0.01, 7 * 86400,
                                            "at most a week"))] = 120.0,
    clock: ClockOpt = Clock.wall,
    seed: SeedOpt = 0,
    distopt: Annotated[Optional[bool], typer.Option(
        "--distopt/--no-distopt", help="Force the distributed optimizer on or off "
        "\\[solver chooses].")] = None,
    tp: TpListOpt = None,
    pp: PpListOpt = None,
    mbs: MbsListOpt = None,
    schedule: ScheduleListOpt = None,
    mb_groups: MbGroupsOpt = None,
    recompute: RecomputeListOpt = None,
    zero: ZeroListOpt = None,
    shard_size: ShardListOpt = None,
    cp: CpListOpt = None,
    ep: EpListOpt = None,
    kv_rotate: KvRotateListOpt = None,
    sharding: Annotated[bool, typer.Option(
        "--sharding", help="Instead: the best plan under ZeRO-1, ZeRO-3 and HSDP, side by "
        "side (time and memory).")] = False,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="Also write the table as CSV.")] = None,
    as_json: JsonOpt = False,
    calibration: CalibrationOpt = None,
    blocking: BlockingOpt = True,
    tp_comm_overlap: TpOverlapOpt = False,
    ep_comm_overlap: EpOverlapOpt = False,
    overlap_grad_reduce: OverlapGradOpt = None,
    overlap_param_gather: OverlapParamOpt = False,
    framework_version: FwVersionOpt = None,
):
    """Exact solver vs annealer vs baselines (Megatron-LM placement, AMP-style choice), all
    re-evaluated with this cost model; or, with --sharding, ZeRO-1 vs ZeRO-3 vs HSDP."""
    from formats.clusters import SynthParams, synth_cluster
    from formats.views import plan_to_dict, write_csv
    from solvers.compare import compare_instance

    _generated_or_cluster(ctx, generated)
    if framework_version is not None:
        # compare writes no files: the release only prices a torchtitan job
        from launch.emit import check_framework
        from model.errors import SpecError
        if framework.value != "torchtitan":
            raise SpecError("prices a torchtitan job's release here (compare writes no "
                            "files); drop it, or add --framework torchtitan",
                            source="options", field="--framework-version")
        check_framework("torchtitan", framework_version)
    m, job, c = _inputs(model, cluster, gbs, seq, precision, distopt, attention.value,
                        allow_list=True, framework=framework.value,
                        grad_reduce_in_bf16=grad_reduce_in_bf16, fused_loss=fused_loss,
                        fp8_param_gather=fp8_param_gather, fp8_recipe=fp8_recipe.value,
                        moe_capacity_factor=moe_capacity_factor, compile_blocks=compile_blocks,
                        moe_dispatcher=moe_dispatcher.value,
                        framework_version=framework_version)
    _kv_rotate_check(kv_rotate, framework.value)
    if sharding and (zero is not None or distopt is not None):
        from model.errors import SpecError
        raise SpecError(f"{'--zero' if zero is not None else '--distopt/--no-distopt'} with "
                        "--sharding: the rows are the shardings (ZeRO-1, ZeRO-3, HSDP); leave "
                        "it out, or compare without --sharding", source="options",
                        field="--zero" if zero is not None else "--distopt")
    space = _space(tp_comm_overlap, overlap_grad_reduce, overlap_param_gather, tp, pp, mbs,
                   schedule, recompute, zero, shard_size, cp, ep, kv_rotate, distopt,
                   ep_comm_overlap, framework.value, mb_groups)
    c_seed = seed if cluster_seed is None else cluster_seed
    instances = [c] if generated is None else [
        synth_cluster(SynthParams(num_nodes=nodes, seed=c_seed + i)) for i in range(generated)]
    _p2p_check(blocking, framework.value)
    opts = _options(blocking)
    measured = instances  # as given (a profile scales them)
    if calibration is not None:
        calibrated = [_calibrated(inst, _options(blocking), calibration)
                      for inst in instances]
        instances = [x[0] for x in calibrated]
        opts = calibrated[0][1]
    prog = render.Progress(not as_json)
    rows, details = [], []  # details: each row's plan as solve --json gives it (for --json)
    from model import work
    from solvers.workers import stop_on_sigint
    stopped = None
    try:
        with stop_on_sigint(render.say_err):
            for idx, inst in enumerate(instances):
                plans: dict = {}
                if sharding:
                    from solvers.compare import compare_sharding
                    got = [{"cluster": inst.name, **r} for r in compare_sharding(
                        m, job, inst, time_limit_s=time_limit, seed=seed, progress=prog,
                        space=space, options=opts, clock=clock.value, plans=plans)]
                else:
                    got = compare_instance(m, job, inst, time_limit_s=time_limit, seed=seed,
                                           progress=prog, space=space, options=opts,
                                           clock=clock.value, plans=plans)
                for r in got:
                    p = plans.get(r["sharding"] if sharding else r["method"])
                    details.append(plan_to_dict(p, inst) if p is not None else None)
                    if calibration is not None:
                        # each plan's 95% prediction interval under the profile, as estimate's
                        iv = (_interval(calibrated[idx][2], m, job, measured[idx], p,
                                        _options(blocking)) if p is not None else None)
                        r["interval_low_s"], r["interval_high_s"] = (
                            (iv[1], iv[2]) if iv is not None else (None, None))
                rows += got
                if work.stop_offset():  # Ctrl-C: this instance's rows, no more instances
                    left = len(instances) - idx - 1
                    stopped = (f"stopped by Ctrl-C during instance {idx + 1} of "
                               f"{len(instances)}: its searches stopped early (their rows say "
                               "whether they are proven)"
                               + (f"; {left} instance(s) not compared" if left else ""))
                    break
    finally:
        prog.stop()
    notes = []
    if calibration is not None:
        for r in rows:
            r["calibration"] = str(calibration)
        notes = list(dict.fromkeys(n for x in calibrated for n in (x[3] or {}).get("notes", [])))
    if stopped:
        notes.append(stopped)
    if csv is not None:
        write_csv(csv, rows)
    if as_json:
        render.echo_json([{**r, "plan_detail": d} for r, d in zip(rows, details)])
        if stopped:
            render.say_err(stopped)
        return
    title = (f"{m.name}, global batch {job.global_batch}, seq {job.seq_length}; time limit "
             f"{time_limit:g} {'work-' if clock.value == 'work' else ''}s per search, seed "
             f"{seed}" + (f"; calibrated with {calibration} ({calibrated[0][2].gpu})"
                          if calibration else ""))
    if sharding:
        render.print_sharding(rows, title, csv)
    else:
        render.print_compare(rows, title, csv)
    render.print_written([], notes)


def _given(ctx, name: str) -> bool:
    """Whether the user gave the option `name` (a parameter name), not its default."""
    src = ctx.get_parameter_source(name)
    # typer vendors click: compare the enum by name (COMMANDLINE, ENVIRONMENT, ...)
    return src is not None and src.name not in ("DEFAULT", "DEFAULT_MAP")


def _generated_or_cluster(ctx, generated: int | None) -> None:
    """compare's cluster comes from --cluster or from --generated (with --nodes and
    --cluster-seed); an option of the other kind given beside them is refused, not ignored
    (--nodes 4 without --generated had compared on the example cluster of 8 nodes)."""
    from model.errors import SpecError

    if generated is not None and _given(ctx, "cluster"):
        raise SpecError("given with --generated: the generated clusters replace it; give "
                        "one of the two", source="options", field="--cluster")
    if generated is None:
        for name, flag in (("nodes", "--nodes"), ("cluster_seed", "--cluster-seed")):
            if _given(ctx, name):
                raise SpecError("shapes the generated clusters and applies only with "
                                "--generated N; drop it, or add --generated",
                                source="options", field=flag)


# ---------------------------------------------------------------------------------------------
# cluster commands: import measured bandwidth, look at a cluster, synthesize one

cluster_app = typer.Typer(no_args_is_help=True, cls=OneLineGroup,
                          help="Measured clusters: import bandwidth, look at it, synthesize one.")
app.add_typer(cluster_app, name="cluster")


def _emit_cluster(c, out: Optional[Path], as_json: bool = False,
                  warnings: list[str] = ()) -> None:
    from formats.clusters import cluster_to_toml, save_cluster

    if out is not None:
        save_cluster(c, out)
    if as_json:
        render.echo_json(render.cluster_json(c, out, warnings))
    elif out is None:
        typer.echo(cluster_to_toml(c), nl=False)
    else:
        typer.echo(f"wrote {out} ({c.num_nodes} nodes, {c.num_gpus} GPUs)", err=True)


# the option each field of the cluster that `cluster import` builds comes from
_IMPORT_OPTION_OF = (("gpus", "--gpus-per-node"), ("gpu", "--gpu"),
                     ("intra_topology", "--intra-topology"),
                     ("intra_gb_per_s", "--intra-gb-per-s"),
                     ("intra_latency_us", "--intra-latency-us"), ("latency_us", "--latency-us"))


def _check_import_options(gpu, gpus_per_node, intra_gb_per_s, intra_topology, latency_us,
                          intra_latency_us) -> None:
    """The node and link options of `cluster import`, checked on a two-node stand-in before
    any file is read, and blamed on the option (they had been blamed on the measurement
    file: 't8.csv: nodes[0].gpu: unknown GPU type')."""
    import numpy as np

    from formats.bandwidth import build_cluster
    from model.cluster import INTRA_LATENCY_US
    from model.errors import SpecError

    if intra_topology is None and intra_gb_per_s is None:
        return  # --intra-allreduce may give it; build_cluster says so otherwise
    try:
        build_cluster(["a", "b"], np.array([[0.0, 1.0], [1.0, 0.0]]), gpu=gpu,
                      gpus_per_node=gpus_per_node, intra_gb_per_s=intra_gb_per_s,
                      intra_topology=intra_topology, latency_us=latency_us,
                      intra_latency_us=(INTRA_LATENCY_US if intra_latency_us is None
                                        else intra_latency_us), source="options")
    except SpecError as e:
        fld = e.field or ""
        opt = next((o for key, o in _IMPORT_OPTION_OF
                    if fld.split(".")[-1].split("[")[0] == key), fld)
        raise SpecError(e.problem.replace("node a: ", ""), source="options",
                        field=opt) from None


@command("import", aliases={"--nodes": "--node-names"}, parent=cluster_app)
def cluster_import(
    sources: Annotated[list[Path], typer.Argument(
        help="nccl-tests pair files or a directory of them, one mpiGraph output, or one "
             "CSV/JSON matrix.")],
    gpu: GpuOpt,
    gpus_per_node: GpusPerNodeOpt,
    intra_gb_per_s: Annotated[Optional[float], typer.Option(
        help="One direction of one GPU's intra-node link, GB/s \\[from --intra-topology].")] = None,
    intra_topology: IntraTopologyOpt = None,
    fmt: Annotated[str, typer.Option("--format",
                                     help="auto, nccl, mpigraph, csv or json.")] = "auto",
    node_names: Annotated[Optional[str], typer.Option(
        "--node-names", help="Expected node names, comma-separated, in cluster order "
        "\\[as measured].")] = None,
    fill: Annotated[Optional[list[str]], typer.Option(
        help="Fill missing pairs (repeatable, applied in order): symmetric, min-row.")] = None,
    strict: Annotated[bool, typer.Option(help="Asymmetry is an error, not a warning.")] = False,
    asym_ratio: Annotated[float, typer.Option(help="Asymmetry warning ratio.")] = 1.5,
    units: Annotated[Optional[str], typer.Option(
        help="CSV/JSON units: gb_per_s, mb_per_s, mib_per_s, gbit_per_s \\[gb_per_s].")] = None,
    mpigraph_table: Annotated[Optional[str], typer.Option(
        help="mpiGraph table: recv, send, min \\[recv].")] = None,
    nccl_test: Annotated[Optional[str], typer.Option(
        help="sendrecv or all_reduce \\[from the file names].")] = None,
    name: Annotated[str, typer.Option(help="Cluster name.")] = "imported",
    latency_us: LatencyOpt = 5.0,
    intra_latency_us: IntraLatencyOpt = None,
    intra_allreduce: Annotated[Optional[Path], typer.Option(
        "--intra-allreduce", help="An all_reduce_perf run among one node's GPUs: its "
        "smallest message gives --intra-latency-us, its largest --intra-gb-per-s (unless "
        "given).")] = None,
    out: FileOutOpt = None,
    as_json: JsonOpt = False,
):
    """Build a cluster TOML from measured bandwidth (nccl-tests, mpiGraph, CSV, JSON)."""
    import math

    from formats.bandwidth import (build_cluster, check_and_fill, implausible_rates,
                                   intra_node_allreduce, load_measurements)
    from model.cluster import INTRA_LATENCY_US
    from model.errors import SpecError

    if not (math.isfinite(asym_ratio) and asym_ratio > 1):
        raise SpecError(f"must be a number above 1 (a ratio of the faster direction to the "
                        f"slower), got {asym_ratio}", source="options", field="--asym-ratio")
    _check_import_options(gpu, gpus_per_node, intra_gb_per_s, intra_topology, latency_us,
                          intra_latency_us)
    intra_notes: list[str] = []
    if intra_allreduce is not None:
        if intra_latency_us is not None:
            raise SpecError("give --intra-latency-us or --intra-allreduce (which measures it), "
                            "not both", source="options", field="--intra-latency-us")
        intra_latency_us, bw, note, intra_notes = intra_node_allreduce(intra_allreduce,
                                                                        gpus_per_node)
        intra_notes = [f"read: {note}", *(f"warning: {w}" for w in intra_notes)]
        if intra_gb_per_s is None and intra_topology is None:
            intra_gb_per_s = bw
        else:
            intra_notes.append("read: its busbw is not used (--intra-gb-per-s or "
                               "--intra-topology given)")
    meas = load_measurements(sources, fmt, units=units, mpigraph_table=mpigraph_table,
                             nccl_test=nccl_test)
    node_list = [x.strip() for x in node_names.split(",")] if node_names else None
    names, m, warnings = check_and_fill(meas, nodes=node_list, fill=tuple(fill or ()),
                                        strict=strict, asym_ratio=asym_ratio)
    c = build_cluster(names, m, gpu=gpu, gpus_per_node=gpus_per_node,
                      intra_gb_per_s=intra_gb_per_s, intra_topology=intra_topology,
                      latency_us=latency_us, name=name, source=meas.source,
                      intra_latency_us=(INTRA_LATENCY_US if intra_latency_us is None
                                        else intra_latency_us))
    warnings = warnings + implausible_rates(c)
    # what was read and the warnings, once the cluster is built (an error stays one line)
    for line in intra_notes + _uniform_topology_notes(c, intra_topology):
        typer.echo(line, err=True)
    for note in meas.notes:
        typer.echo(f"read: {note}", err=True)
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
    _emit_cluster(c, out, as_json, warnings)


def _uniform_topology_notes(c, intra_topology: str | None) -> list[str]:
    """An intra-node topology whose every GPU pair runs at one rate (an NVSwitch node) is that
    rate (model.cluster.NodeSpec): the file gets intra_gb_per_s, not the matrix; said."""
    if intra_topology is None or any(nd.intra_matrix_gb_per_s is not None for nd in c.nodes):
        return []
    rates = sorted({nd.intra_gb_per_s for nd in c.nodes})
    return [f"read: --intra-topology {intra_topology}: every GPU pair at "
            f"{', '.join(f'{r:g}' for r in rates)} GB/s, written as intra_gb_per_s (a uniform "
            "node: the exact method covers it)"]


@command("show", parent=cluster_app)
def cluster_show(
    cluster: Annotated[str, typer.Argument(help="Cluster preset or .toml file.")] = EXAMPLE_CLUSTER,
    png: Annotated[Optional[Path], typer.Option(
        help="Write a heatmap PNG here (or .pdf, .svg).")] = None,
    slowest: Annotated[int, typer.Option(
        help="How many slowest links to list.",
        # a negative count had sliced the list from its end (-3: all links but 3)
        callback=_bounded("--slowest", 0, float("inf")))] = 5,
    as_json: JsonOpt = False,
):
    """Summary of a cluster's matrix: slowest links, outlier nodes, inferred switch groups."""
    from formats.bandwidth import summarize
    from formats.clusters import cluster as load_cluster
    from launch.pictures import heatmap_png, picture_format

    if png is not None:
        picture_format(png, "--png")  # before any work
    c = load_cluster(cluster)
    s = summarize(c, slowest=slowest)
    if png is not None:
        heatmap_png(c, png)
    if as_json:
        render.echo_json(s)
        return
    render.print_cluster_summary(c, s, png)


@command("synth", parent=cluster_app)
def cluster_synth(
    ctx: typer.Context,
    nodes: Annotated[int, typer.Option(help="Number of nodes.")] = 8,
    gpus_per_node: GpusPerNodeOpt = 8,
    gpu: GpuOpt = "A100-80GB",
    intra_gb_per_s: Annotated[Optional[float], typer.Option(
        help="Intra-node link, GB/s \\[the GPU's NVLink x 0.8: 240 for A100, 360 for H100, "
        "720 for B200; with --intra-topology its best ring].")] = None,
    intra_topology: IntraTopologyOpt = None,
    nic_gb_per_s: Annotated[float, typer.Option(help="In-leaf stream bandwidth, GB/s.")] = 23.0,
    leaf_size: Annotated[int, typer.Option(help="Nodes per leaf switch.")] = 4,
    oversubscription: Annotated[float, typer.Option(
        help="Spine oversubscription (cross-leaf = nic / this).")] = 1.6,
    degraded: Annotated[int, typer.Option(help="Number of nodes with a degraded NIC.")] = 1,
    degraded_factor: Annotated[float, typer.Option(help="Degraded NIC rate factor.")] = 0.5,
    noise: Annotated[float, typer.Option(help="Uniform multiplicative noise half-width.")] = 0.03,
    latency_us: LatencyOpt = 5.0,
    intra_latency_us: IntraLatencyOpt = None,
    seed: SeedOpt = 0,
    name: Annotated[Optional[str], typer.Option(help="Cluster name \\[synth-...].")] = None,
    out: FileOutOpt = None,
    as_json: JsonOpt = False,
):
    """A synthetic cluster (leaf/spine, degraded NICs, noise; see README)."""
    from formats.clusters import SynthParams, synth_cluster
    from model.cluster import INTRA_LATENCY_US

    c = synth_cluster(SynthParams(
        num_nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu,
        intra_gb_per_s=intra_gb_per_s,
        nic_gb_per_s=nic_gb_per_s, leaf_size=leaf_size, oversubscription=oversubscription,
        degraded=degraded, degraded_factor=degraded_factor, noise=noise, latency_us=latency_us,
        seed=seed, name=name, intra_latency_us=(INTRA_LATENCY_US if intra_latency_us is None
                                                else intra_latency_us)))
    if intra_topology is not None:
        from formats.topologies import cluster_with_topology
        # given beside the topology: the preset's matrix scaled to it, as import does
        c = cluster_with_topology(c, intra_topology, intra_gb_per_s)
    # options given that the generator then has no use for: said, not kept without a word
    warnings = []
    for line in _uniform_topology_notes(c, intra_topology):
        typer.echo(line, err=True)
    if degraded == 0 and _given(ctx, "degraded_factor"):
        warnings.append(f"--degraded-factor {degraded_factor:g} has no effect: no node is "
                        "degraded (--degraded 0)")
    if leaf_size >= nodes and _given(ctx, "oversubscription"):
        warnings.append(f"--oversubscription {oversubscription:g} has no effect: the "
                        f"{nodes} nodes share one leaf switch (--leaf-size {leaf_size}), so no "
                        "stream crosses the spine")
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
    _emit_cluster(c, out, as_json, warnings)


# ---------------------------------------------------------------------------------------------
# plan files, framework launch files and pictures (formats/planfile.py, launch/)

# estimate's options that do not describe the inputs or the plan: every other option (the
# model, job, cluster and plan ones, including any added later) is refused beside --plan
_NOT_PLAN_OPTION_PARAMS = ("as_json", "plan_file", "save_plan", "emit", "out", "gantt",
                           "placement_png", "calibration", "safe_memory", "force", "tokenizer",
                           "framework_version")


def _load_plan_only(ctx, plan_file: Path):
    """Read a plan file for `estimate --plan`, refusing plan options given alongside it."""
    from formats.planfile import load_plan
    from model.errors import SpecError

    if ctx is not None:
        given = []
        for p in ctx.command.params:
            if p.name not in _NOT_PLAN_OPTION_PARAMS and _given(ctx, p.name):
                # the spelling given: --no-compile is the secondary option of --compile
                off = getattr(p, "secondary_opts", None) and ctx.params.get(p.name) is False
                given.append(max(p.secondary_opts if off else p.opts, key=len))
        if given:
            raise SpecError(f"{', '.join(given)} cannot be combined with --plan, which fixes "
                            "the inputs and the plan; drop them or drop --plan",
                            source="options", field="--plan")
    return load_plan(plan_file)


@command("emit")
def emit_cmd(
    plan_file: Annotated[Path, typer.Argument(help="A plan file (--save-plan or solve).")],
    framework: Annotated[str, typer.Option(
        "--framework", "-f", help="megatron, nemo, torchtitan or deepspeed.")] = "megatron",
    out: LaunchOutOpt = None,
    gantt: GanttOpt = None,
    placement_png: PlacementPngOpt = None,
    as_json: JsonOpt = False,
    force: ForceOpt = False,
    tokenizer: TokenizerOpt = None,
    framework_version: FwVersionOpt = None,
):
    """Write a saved plan's framework arguments, launch script and hostfile."""
    from formats.planfile import load_plan, recorded_estimate_drift
    from launch.emit import check_framework
    from launch.outputs import check_outputs, write_outputs
    from model.errors import SpecError
    from model.estimator import estimate as run_estimate

    check_outputs(emit=framework, out=out, gantt=gantt, placement_png=placement_png,
                  force=force, tokenizer=tokenizer, version=framework_version)
    m, job, c0, plan, opts0, meta = load_plan(plan_file)
    recorded = meta["emitted"]
    release_note = []
    if framework_version is None and framework.lower() == "torchtitan" and job.repeat_kv:
        # the plan was priced for torchtitan v0.1 (K and V repeated: estimate
        # --framework-version 0.1): its files are v0.1's unless the release is given
        framework_version = "0.1"
    elif framework_version is None and recorded and recorded["framework"] == framework.lower():
        # the release the command that wrote the file emitted for (NeMo 1.x had come back as
        # a Megatron-Bridge recipe): said, as the release is not the default
        try:
            check_framework(framework, recorded["version"])
        except SpecError as e:
            raise SpecError(e.problem, source=str(plan_file), field="emitted.version") from None
        framework_version = recorded["version"]
        release_note = [f"{plan_file}: files for {recorded['framework']} "
                        f"--framework-version {framework_version}, the release it was emitted "
                        "for when saved (give --framework-version to choose another)"]
    c, opts, _prof, _cal, _notes = _plan_calibrated(plan_file, meta, c0, opts0, None, False)
    drift = recorded_estimate_drift(meta, run_estimate(m, job, c, plan, opts), str(plan_file))
    try:
        files, warnings = write_outputs(m, job, c, plan, None, opts, emit=framework, out=out,
                                        gantt=gantt, placement_png=placement_png, force=force,
                                        tokenizer=tokenizer, version=framework_version)
        warnings = [*meta["read_notes"], *release_note, *([drift] if drift else []),
                    *warnings]
    except SpecError as e:
        if e.source != "plan":
            raise
        # the plan is this file's: the line names it (it had said "plan: ...")
        raise SpecError(e.problem, source=str(plan_file), field=e.field) from None
    if as_json:
        render.echo_json({"plan": str(plan_file), "framework": framework.lower(),
                          "files": [str(p) for p in files], "warnings": warnings})
        return
    render.print_written(files, warnings)


if __name__ == "__main__":
    app()
