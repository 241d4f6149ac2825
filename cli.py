"""Command-line entry point: a thin shell over model/ and solvers/.

Domain errors are caught here only, printed as one line, and exit with code 2.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Pipette-style configurator for LLM training on real, uneven clusters.")

EXAMPLE_MODEL = "llama2-70b"
EXAMPLE_CLUSTER = "example"
EXAMPLE_GBS = 256
EXAMPLE_SEQ = 4096


class Schedule(str, Enum):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved = "interleaved"


class Recompute(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


class Precision(str, Enum):
    fp16 = "fp16"
    bf16 = "bf16"
    fp32 = "fp32"


ModelOpt = Annotated[str, typer.Option("--model", "-m",
                                       help="Model preset name or a Hugging Face config.json.")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c",
                                         help="Cluster preset name or a cluster .toml file.")]
GbsOpt = Annotated[int, typer.Option("--global-batch", "--gbs", help="Global batch (sequences).")]
SeqOpt = Annotated[Optional[int], typer.Option("--seq", help="Sequence length [model's].")]
PrecOpt = Annotated[Precision, typer.Option("--precision", help="Training precision.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
BlockingOpt = Annotated[bool, typer.Option("--blocking/--overlapped",
                                           help="Blocking pipeline send/recv.")]
OverlapGradOpt = Annotated[bool, typer.Option(
    help="Overlap gradient reduction with the last backward.")]
SavePlanOpt = Annotated[Optional[Path], typer.Option(
    "--save-plan", help="Write the plan, inputs, estimate (and solver status) to this JSON file.")]
EmitOpt = Annotated[Optional[str], typer.Option(
    "--emit", help="Write launch files: megatron, nemo, torchtitan or deepspeed.")]
OutOpt = Annotated[Optional[Path], typer.Option(
    "--out", help="Folder for --emit [launch-<framework>].")]
GanttOpt = Annotated[Optional[Path], typer.Option(
    "--gantt", help="Write the schedule's Gantt chart to this PNG.")]
PlacementPngOpt = Annotated[Optional[Path], typer.Option(
    "--placement-png", help="Write the placement on the cluster to this PNG.")]


def console():
    """A rich console at least 150 columns wide, so tables stay readable when piped."""
    from rich.console import Console
    c = Console()
    return c if c.width >= 150 else Console(width=150)


def fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


def guarded(fn):
    """Turn domain errors into one line and exit code 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*a, **k):
        from model.errors import PipetteError
        try:
            return fn(*a, **k)
        except PipetteError as e:
            fail(str(e))
    return wrapper


def _inputs(model: str, cluster: str, gbs: int, seq: int | None, precision: str,
            distopt: bool | None = None):
    from model import presets
    from model.cluster import cluster as load_cluster
    from model.specs import JobSpec

    m = presets.model(model)
    c = load_cluster(cluster)
    job = JobSpec(global_batch=gbs, seq_length=seq or m.seq_length, precision=precision,
                  distributed_optimizer=distopt, source="options")
    return m, job, c


def _options(blocking: bool, overlap_grad_reduce: bool):
    from model.specs import Options
    return Options(blocking_p2p=blocking, overlap_grad_reduce=overlap_grad_reduce)


# ---------------------------------------------------------------------------------------------
# rendering


def print_estimate(est, plan, cluster, title: str = "Estimate") -> None:
    from rich.table import Table

    con = console()
    sh = plan.shape
    con.print(f"[bold]{title}[/bold]: {sh.describe()}  layers={list(sh.layers)}  "
              f"micro-batches/replica={est.num_microbatches}")
    con.print(f"iteration {est.iteration_ms / 1e3:.3f} s   {est.tokens_per_s:,.0f} tokens/s   "
              f"MFU {est.mfu * 100:.1f}%   HFU {est.hfu * 100:.1f}%   "
              f"peak memory {est.peak_memory_gib:.1f} GiB   "
              + ("[green]fits[/green]" if est.fits else "[red]does not fit[/red]"))
    t = Table(title="Time breakdown (critical path of the slowest replica)")
    t.add_column("part")
    t.add_column("ms", justify="right")
    t.add_column("share", justify="right")
    for k, v in est.breakdown_ms.items():
        t.add_row(k.removesuffix("_ms"), f"{v:,.1f}", f"{v / est.iteration_ms * 100:.1f}%")
    con.print(t)
    t = Table(title="Per stage (one GPU; memory in GiB)")
    for col in ("stage", "layers", "fwd ms", "bwd ms", "dp sync ms", "opt ms", "weights",
                "grads", "optim", "activ", "in-flight", "work", "allow", "total", "limit"):
        t.add_column(col, justify="right")
    for s in est.stages:
        mm = s.memory
        style = "red" if mm.total_gib > s.limit_gib else None
        t.add_row(str(s.stage), str(s.layers), f"{s.fwd_ms:.2f}", f"{s.bwd_ms:.2f}",
                  f"{s.sync_exposed_ms:.1f}", f"{s.optimizer_ms:.1f}", f"{mm.weights_gib:.1f}",
                  f"{mm.grads_gib:.1f}", f"{mm.optimizer_gib:.1f}", f"{mm.activations_gib:.1f}",
                  "/".join(map(str, mm.inflight)), f"{mm.working_gib:.1f}",
                  f"{mm.allowance_gib:.1f}", f"{mm.total_gib:.1f}", f"{s.limit_gib:.0f}",
                  style=style)
    con.print(t)
    if est.hops_ms:
        con.print("pipeline transfers, slowest replica (ms fwd/bwd): " + "  ".join(
            f"{h}->{(h + 1) % sh.pp}: {f:.2f}/{b:.2f}" for h, (f, b) in enumerate(est.hops_ms)))


def print_placement(plan, cluster) -> None:
    from rich.table import Table

    pl = plan.placement
    t = Table(title="Placement (node: stage/replica [GPUs])")
    t.add_column("node")
    t.add_column("hosts")
    by_node: dict[int, list[str]] = {}
    for s in range(pl.pp):
        for r in range(pl.dp):
            by_node.setdefault(pl.node[s][r], []).append(
                f"s{s}/r{r}[{','.join(map(str, pl.gpus[s][r]))}]")
    for n, nd in enumerate(cluster.nodes):
        t.add_row(nd.name, "  ".join(by_node.get(n, ["-"])))
    console().print(t)


# ---------------------------------------------------------------------------------------------
# commands


@app.command()
@guarded
def estimate(
    ctx: typer.Context,
    model: ModelOpt = EXAMPLE_MODEL,
    cluster: ClusterOpt = EXAMPLE_CLUSTER,
    global_batch: GbsOpt = EXAMPLE_GBS,
    seq: SeqOpt = EXAMPLE_SEQ,
    precision: PrecOpt = Precision.bf16,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 8,
    pp: Annotated[int, typer.Option(help="Pipeline-parallel degree.")] = 4,
    dp: Annotated[Optional[int], typer.Option(help="Data-parallel degree [GPUs/(TP*PP)].")] = None,
    mbs: Annotated[int, typer.Option("--mbs", help="Micro-batch size.")] = 1,
    schedule: Annotated[Schedule, typer.Option(help="Pipeline schedule.")] = Schedule.one_f_one_b,
    chunks: Annotated[int, typer.Option(help="Model chunks per stage (interleaved).")] = 1,
    layers: Annotated[Optional[str], typer.Option(
        help="Layers per virtual stage, comma-separated [balanced].")] = None,
    recompute: Annotated[Recompute, typer.Option(help="Activation recompute.")] = Recompute.none,
    sp: Annotated[bool, typer.Option("--sp/--no-sp", help="Sequence parallelism.")] = False,
    distopt: Annotated[bool, typer.Option("--distopt/--no-distopt",
                                          help="Distributed optimizer (ZeRO-1).")] = False,
    blocking: BlockingOpt = True,
    overlap_grad_reduce: OverlapGradOpt = False,
    as_json: JsonOpt = False,
    plan_file: Annotated[Optional[Path], typer.Option(
        "--plan", help="Read inputs and decisions from a plan file (no other plan options).")] = None,
    save_plan: SavePlanOpt = None,
    emit: EmitOpt = None,
    out: OutOpt = None,
    gantt: GanttOpt = None,
    placement_png: PlacementPngOpt = None,
):
    """Per-stage memory and iteration time of one plan (Megatron-LM placement)."""
    from model.errors import SpecError
    from model.estimator import estimate as run_estimate, make_plan
    from model.serialize import estimate_to_dict, plan_to_dict

    if plan_file is not None:  # issue 5: inputs and decisions from a plan file
        m, job, c, plan, opts, _meta = _load_plan_only(ctx, plan_file)
        est = run_estimate(m, job, c, plan, opts)
        _launch_outputs(m, job, c, plan, est, opts, save_plan, emit, out, gantt, placement_png,
                        as_json)
        return
    m, job, c = _inputs(model, cluster, global_batch, seq, precision.value)
    lay = None
    if layers:
        try:
            lay = tuple(int(x) for x in layers.split(","))
        except ValueError:
            raise SpecError("must be comma-separated integers, e.g. 20,20,20,20",
                            source="options", field="--layers") from None
    opts = _options(blocking, overlap_grad_reduce)
    plan = make_plan(m, job, c, tp=tp, pp=pp, dp=dp, micro_batch=mbs, schedule=schedule.value,
                     chunks=chunks, layers=lay, recompute=recompute.value,
                     sequence_parallel=sp, distributed_optimizer=distopt, options=opts)
    est = run_estimate(m, job, c, plan, opts)
    if any(x is not None for x in (save_plan, emit, out, gantt, placement_png)):
        _launch_outputs(m, job, c, plan, est, opts, save_plan, emit, out, gantt, placement_png,
                        as_json)
        return
    if as_json:
        typer.echo(json.dumps({"model": m.name, "cluster": c.name, "plan": plan_to_dict(plan, c),
                               "estimate": estimate_to_dict(est)}, indent=1))
        return
    print_estimate(est, plan, c)


@app.command()
@guarded
def validate(as_json: JsonOpt = False,
             verbose: Annotated[bool, typer.Option("--verbose", "-v",
                                                   help="Show assumptions per run.")] = False):
    """Compare the estimator with published training runs (data/published_runs.json)."""
    from rich.table import Table

    from model.reference import validate as run_validate

    s = run_validate()
    if as_json:
        typer.echo(json.dumps({
            "runs": [{"id": x.id, "skipped": x.skipped, "predicted_s": x.predicted_s,
                      "published_s": x.published_s, "time_source": x.time_source,
                      "time_abs_pct_err": None if x.time_err is None else 100 * x.time_err,
                      "predicted_gib": x.predicted_gib, "published_gib": x.published_gib,
                      "memory_abs_pct_err": None if x.mem_err is None else 100 * x.mem_err,
                      "oom_published": x.oom_published, "predicted_fits": x.predicted_fits,
                      "assumptions": x.assumptions} for x in s.rows],
            "time_median_pct": 100 * s.time_median, "time_mean_pct": 100 * s.time_mean,
            "memory_median_pct": 100 * s.mem_median, "memory_max_pct": 100 * s.mem_max,
            "oom_correct": list(s.oom_correct)}, indent=1))
        return
    t = Table(title="Estimator vs published runs")
    for col in ("run", "pred s", "pub s", "err", "pred GiB", "pub GiB", "err", "OOM pub/pred"):
        t.add_column(col, justify="right" if col != "run" else "left")
    for x in s.rows:
        if x.skipped:
            continue
        oom = "" if x.oom_published is None else (
            f"{'OOM' if x.oom_published else 'ran'}/{'fits' if x.predicted_fits else 'OOM'}")
        t.add_row(x.id, f"{x.predicted_s:.2f}", f"{x.published_s:.2f}" if x.published_s else "-",
                  f"{x.time_err * 100:.1f}%" if x.time_err is not None else "-",
                  f"{x.predicted_gib:.1f}" if x.predicted_gib else "-",
                  f"{x.published_gib:.0f}" if x.published_gib else "-",
                  f"{x.mem_err * 100:.1f}%" if x.mem_err is not None else "-",
                  oom + ("" if x.oom_ok in (None, True) else " [red]WRONG[/red]"))
        if verbose and x.assumptions:
            t.add_row("  assumed: " + "; ".join(x.assumptions), *[""] * 7)
    con = console()
    con.print(t)
    for x in s.rows:
        if x.skipped:
            con.print(f"skipped {x.id}: {x.skipped}")
    ok, n = s.oom_correct
    con.print(f"iteration time |error|: median {s.time_median * 100:.1f}%, mean "
              f"{s.time_mean * 100:.1f}% over {len(s._errs('time_err'))} runs")
    con.print(f"memory |error| (BLOOM, stage 0): median {s.mem_median * 100:.1f}%, max "
              f"{s.mem_max * 100:.1f}% over {len(s._errs('mem_err'))} runs")
    con.print(f"fits/OOM predicted correctly: {ok}/{n}")


@app.command()
@guarded
def presets(as_json: JsonOpt = False):
    """List GPU, model and cluster presets."""
    from rich.table import Table

    from model import presets as P
    from model.cluster import cluster as load_cluster, cluster_names

    gpus = [P.gpu(n) for n in P.gpu_names()]
    models = [P.model(n) for n in P.model_names()]
    clusters = [load_cluster(n) for n in cluster_names()]
    if as_json:
        typer.echo(json.dumps({
            "gpus": {g.name: {"peak_tflops": dict(g.peak_tflops), "memory_gib": g.memory_gib,
                              "hbm_gb_per_s": g.hbm_gb_per_s,
                              "nvlink_gb_per_s": g.nvlink_gb_per_s,
                              "efficiency": g.efficiency, "source": g.source} for g in gpus},
            "models": {m.name: {"params_billion": m.total_params / 1e9,
                                "num_layers": m.num_layers, "hidden_size": m.hidden_size,
                                "num_heads": m.num_heads, "num_kv_heads": m.num_kv_heads,
                                "ffn_hidden_size": m.ffn_hidden_size,
                                "vocab_size": m.vocab_size, "seq_length": m.seq_length,
                                "gated_mlp": m.gated_mlp, "tied_embeddings": m.tied_embeddings,
                                "source": m.source} for m in models},
            "clusters": {c.name: {"nodes": c.num_nodes, "gpus": c.num_gpus} for c in clusters},
        }, indent=1))
        return
    con = console()
    t = Table(title="GPUs")
    for col in ("name", "bf16/fp16 TFLOP/s", "memory GiB", "HBM GB/s", "NVLink GB/s", "eff."):
        t.add_column(col)
    for g in gpus:
        t.add_row(g.name, str(g.peak_tflops.get("bf16", g.peak_tflops.get("fp16"))),
                  str(g.memory_gib), str(g.hbm_gb_per_s), str(g.nvlink_gb_per_s),
                  str(g.efficiency))
    con.print(t)
    t = Table(title="Models")
    for col in ("name", "params B", "layers", "hidden", "heads/kv", "ffn", "vocab", "seq",
                "MLP"):
        t.add_column(col)
    for m in models:
        t.add_row(m.name, f"{m.total_params / 1e9:.1f}", str(m.num_layers), str(m.hidden_size),
                  f"{m.num_heads}/{m.num_kv_heads}", str(m.ffn_hidden_size), str(m.vocab_size),
                  str(m.seq_length), "gated" if m.gated_mlp else "plain")
    con.print(t)
    t = Table(title="Clusters")
    for col in ("preset", "name", "nodes", "GPUs", "GPU types"):
        t.add_column(col)
    for name, c in zip(cluster_names(), clusters):
        t.add_row(name, c.name, str(c.num_nodes), str(c.num_gpus),
                  ", ".join(sorted({n.gpu.name for n in c.nodes})))
    con.print(t)


# --- solver commands (issue 3) ---
# The main job: choose the fastest plan that fits (solvers/search.py), and compare solvers.


class Method(str, Enum):
    auto = "auto"
    exact = "exact"
    anneal = "anneal"


MethodOpt = Annotated[Method, typer.Option(
    "--method", help="exact (MILP on HiGHS), anneal, or auto (exact up to "
    "solvers.search.AUTO_EXACT_MAX_NODES nodes).")]
TimeOpt = Annotated[float, typer.Option("--time-limit", help="Seconds for the whole search.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for the annealer.")]


class _Progress:
    """Live progress on stderr for searches longer than about two seconds."""

    def __init__(self, enabled: bool):
        import time
        self.enabled, self.t0, self.status = enabled, time.perf_counter(), None

    def __call__(self, msg: str) -> None:
        import time
        if not self.enabled or time.perf_counter() - self.t0 < 2.0:
            return
        if self.status is None:
            from rich.console import Console
            self.status = Console(stderr=True).status("")
            self.status.start()
        self.status.update(f"[{time.perf_counter() - self.t0:5.1f} s] {msg}")

    def stop(self):
        if self.status is not None:
            self.status.stop()


def _result_dict(res, c) -> dict:
    from model.serialize import estimate_to_dict, plan_to_dict

    return {
        "plan": plan_to_dict(res.plan, c), "estimate": estimate_to_dict(res.estimate),
        "solver": res.status_dict(),
        "candidates": [{"shape": x.describe, "lower_bound_ms": x.lower_bound_ms,
                        "megatron_placement_ms": x.quick_ms, "best_ms": x.best_ms,
                        "status": x.status} for x in res.candidates],
    }


def print_solve(res, c) -> None:
    from rich.markup import escape
    from rich.table import Table

    con = console()
    print_estimate(res.estimate, res.plan, c, title="Best plan")
    print_placement(res.plan, c)
    proven = "proven optimal" if res.termination == "optimal" else "NOT proven optimal"
    con.print(f"solver: {res.method}, {res.termination} ({proven}); objective "
              f"{res.objective_ms / 1e3:.4f} s, bound {res.bound_ms / 1e3:.4f} s, gap "
              f"{res.gap * 100:.4f}%, {res.wall_s:.1f} s; {res.shapes_total} shapes, "
              f"{res.shapes_solved} placement-optimized", highlight=False)
    others = [x for x in res.candidates if x.status != "best" and
              (x.best_ms is not None or x.quick_ms is not None)]
    t = Table(title="Next best plans and why they lost")
    for col in ("shape", "best found s", "Megatron placement s", "lower bound s", "status"):
        t.add_column(col)
    for x in others[:8]:
        t.add_row(x.describe, f"{x.best_ms / 1e3:.3f}" if x.best_ms else "-",
                  f"{x.quick_ms / 1e3:.3f}" if x.quick_ms else "-",
                  f"{x.lower_bound_ms / 1e3:.3f}", escape(x.status))
    con.print(t)
    misfits = [x for x in res.candidates if x.status.startswith("does not fit")]
    if misfits:
        def need(x):
            try:
                return float(x.status.split("needs ")[1].split(" ")[0])
            except (IndexError, ValueError):
                return float("inf")
        t = Table(title=f"Shapes that do not fit ({len(misfits)}; closest first)")
        t.add_column("shape")
        t.add_column("why")
        for x in sorted(misfits, key=need)[:6]:
            t.add_row(x.describe, escape(x.status))
        con.print(t)


@app.command()
@guarded
def solve(
    model: ModelOpt = EXAMPLE_MODEL,
    cluster: ClusterOpt = EXAMPLE_CLUSTER,
    global_batch: GbsOpt = EXAMPLE_GBS,
    seq: SeqOpt = EXAMPLE_SEQ,
    precision: PrecOpt = Precision.bf16,
    method: MethodOpt = Method.auto,
    time_limit: TimeOpt = 120.0,
    seed: SeedOpt = 0,
    distopt: Annotated[Optional[bool], typer.Option(
        "--distopt/--no-distopt", help="Force the distributed optimizer on or off "
        "[solver chooses].")] = None,
    blocking: BlockingOpt = True,
    overlap_grad_reduce: OverlapGradOpt = False,
    as_json: JsonOpt = False,
    save_plan: SavePlanOpt = None,
    emit: EmitOpt = None,
    out: OutOpt = None,
    gantt: GanttOpt = None,
    placement_png: PlacementPngOpt = None,
):
    """Fastest plan that fits on the cluster as measured (defaults: the built-in example)."""
    from solvers.search import solve as run_solve

    m, job, c = _inputs(model, cluster, global_batch, seq, precision.value, distopt)
    opts = _options(blocking, overlap_grad_reduce)
    prog = _Progress(not as_json)
    try:
        res = run_solve(m, job, c, method=method.value, time_limit_s=time_limit, seed=seed,
                        options=opts, progress=prog)
    finally:
        prog.stop()
    files, warnings = _write_outputs(m, job, c, res.plan, res.estimate, opts, save_plan, emit,
                                     out, gantt, placement_png, solver=res.status_dict())
    if as_json:
        d = _result_dict(res, c)
        d.update({"model": m.name, "cluster": c.name, "files": [str(p) for p in files],
                  "warnings": warnings})
        typer.echo(json.dumps(d, indent=1, default=_json_default))
        return
    print_solve(res, c)
    _print_written(files, warnings)


def _json_default(x):
    import math
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


@app.command()
@guarded
def compare(
    model: ModelOpt = EXAMPLE_MODEL,
    cluster: ClusterOpt = EXAMPLE_CLUSTER,
    global_batch: GbsOpt = EXAMPLE_GBS,
    seq: SeqOpt = EXAMPLE_SEQ,
    precision: PrecOpt = Precision.bf16,
    generated: Annotated[int, typer.Option(
        help="Instead of --cluster, compare on this many synthetic clusters "
        "(cluster synth's model; see --nodes).")] = 0,
    nodes: Annotated[int, typer.Option(help="Nodes of each generated cluster.")] = 8,
    time_limit: TimeOpt = 120.0,
    seed: SeedOpt = 0,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="Also write the table as CSV.")] = None,
    as_json: JsonOpt = False,
):
    """Exact solver vs annealer vs baselines (Megatron-LM placement, AMP-style choice), all
    re-evaluated with this cost model."""
    from rich.table import Table

    from model.cluster import SynthParams, synth_cluster
    from solvers.compare import compare_instance

    m, job, c = _inputs(model, cluster, global_batch, seq, precision.value)
    instances = [c] if generated <= 0 else [
        synth_cluster(SynthParams(num_nodes=nodes, seed=seed + i)) for i in range(generated)]
    prog = _Progress(not as_json)
    rows = []
    try:
        for inst in instances:
            rows += compare_instance(m, job, inst, time_limit_s=time_limit, seed=seed,
                                     progress=prog)
    finally:
        prog.stop()
    if csv is not None:
        import csv as csvmod
        with open(csv, "w", newline="") as f:
            w = csvmod.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    if as_json:
        typer.echo(json.dumps(rows, indent=1, default=_json_default))
        return
    t = Table(title=f"{m.name}, global batch {job.global_batch}, seq {job.seq_length}")
    for col in ("cluster", "method", "plan", "iteration s", "gap to optimum", "solve s",
                "proven"):
        t.add_column(col)
    for r in rows:
        gap = r["gap_to_optimum"]
        t.add_row(r["cluster"], r["method"], r["plan"], f"{r['iteration_ms'] / 1e3:.3f}",
                  "-" if gap is None else f"{gap * 100:.2f}%", f"{r['solve_s']:.1f}",
                  r["proven"])
    con = console()
    con.print(t)
    if csv is not None:
        con.print(f"wrote {csv}")


# --- cluster commands (issue 4) ---

cluster_app = typer.Typer(no_args_is_help=True,
                          help="Measured clusters: import bandwidth, look at it, synthesize one.")
app.add_typer(cluster_app, name="cluster")


def _emit_cluster(c, output: Optional[Path], as_json: bool = False,
                  warnings: list[str] = ()) -> None:
    from model.cluster import cluster_to_toml

    text = cluster_to_toml(c)
    if output is not None:
        try:
            output.write_text(text)
        except OSError as e:
            fail(f"{output}: cannot write ({e.strerror})")
    if as_json:
        typer.echo(json.dumps({
            "name": c.name, "latency_us": c.latency_us, "written": str(output) if output else None,
            "nodes": [{"name": nd.name, "gpu": nd.gpu.name, "gpus": nd.num_gpus,
                       "intra_gb_per_s": nd.intra_gb_per_s} for nd in c.nodes],
            "inter_gb_per_s": c.inter_gb_per_s.tolist(), "warnings": list(warnings)}, indent=1))
        return
    if output is None:
        typer.echo(text, nl=False)
        return
    typer.echo(f"wrote {output} ({c.num_nodes} nodes, {c.num_gpus} GPUs)", err=True)


@cluster_app.command("import")
@guarded
def cluster_import(
    sources: Annotated[list[Path], typer.Argument(
        help="nccl-tests pair files or a directory of them, one mpiGraph output, or one "
             "CSV/JSON matrix.")],
    gpu: Annotated[str, typer.Option(help="GPU preset of every node (see `presets`).")],
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")],
    intra_gb_per_s: Annotated[Optional[float], typer.Option(
        help="One direction of one GPU's intra-node link, GB/s [from --intra-topology].")] = None,
    intra_topology: Annotated[Optional[str], typer.Option(
        help="Intra-node topology preset (data/topologies: dgx-a100, dgx1-v100, ...).")] = None,
    fmt: Annotated[str, typer.Option("--format",
                                     help="auto, nccl, mpigraph, csv or json.")] = "auto",
    nodes: Annotated[Optional[str], typer.Option(
        help="Expected node names, comma-separated, in cluster order [as measured].")] = None,
    fill: Annotated[Optional[list[str]], typer.Option(
        help="Fill missing pairs (repeatable, applied in order): symmetric, min-row.")] = None,
    strict: Annotated[bool, typer.Option(help="Asymmetry is an error, not a warning.")] = False,
    asym_ratio: Annotated[float, typer.Option(help="Asymmetry warning ratio.")] = 1.5,
    units: Annotated[Optional[str], typer.Option(
        help="CSV/JSON units: gb_per_s, mb_per_s, mib_per_s, gbit_per_s [gb_per_s].")] = None,
    mpigraph_table: Annotated[str, typer.Option(help="mpiGraph table: recv, send, min.")] = "recv",
    nccl_test: Annotated[Optional[str], typer.Option(
        help="sendrecv or all_reduce [from the file names].")] = None,
    name: Annotated[str, typer.Option(help="Cluster name.")] = "imported",
    latency_us: Annotated[float, typer.Option(help="Per-message latency, us.")] = 5.0,
    output: Annotated[Optional[Path], typer.Option("--output", "-o",
                                                   help="Write the TOML here [stdout].")] = None,
    as_json: JsonOpt = False,
):
    """Build a cluster TOML from measured bandwidth (nccl-tests, mpiGraph, CSV, JSON)."""
    from model.bwimport import build_cluster, check_and_fill, load_measurements

    meas = load_measurements(sources, fmt, units=units, mpigraph_table=mpigraph_table,
                             nccl_test=nccl_test)
    node_list = [x.strip() for x in nodes.split(",")] if nodes else None
    names, m, warnings = check_and_fill(meas, nodes=node_list, fill=tuple(fill or ()),
                                        strict=strict, asym_ratio=asym_ratio)
    for note in meas.notes:
        typer.echo(f"read: {note}", err=True)
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
    c = build_cluster(names, m, gpu=gpu, gpus_per_node=gpus_per_node,
                      intra_gb_per_s=intra_gb_per_s, intra_topology=intra_topology,
                      latency_us=latency_us, name=name, source=meas.source)
    _emit_cluster(c, output, as_json, warnings)


@cluster_app.command("show")
@guarded
def cluster_show(
    cluster: Annotated[str, typer.Argument(help="Cluster preset or .toml file.")] = EXAMPLE_CLUSTER,
    png: Annotated[Optional[Path], typer.Option(help="Write a heatmap PNG here.")] = None,
    slowest: Annotated[int, typer.Option(help="How many slowest links to list.")] = 5,
    as_json: JsonOpt = False,
):
    """Summary of a cluster's matrix: slowest links, outlier nodes, inferred switch groups."""
    from rich.table import Table

    from model.bwimport import GROUP_RATIO, OUTLIER_RATIO, heatmap_png, summarize
    from model.cluster import cluster as load_cluster

    c = load_cluster(cluster)
    s = summarize(c, slowest=slowest)
    if png is not None:
        heatmap_png(c, png)
    if as_json:
        typer.echo(json.dumps(s, indent=1))
        return
    con = console()
    con.print(f"[bold]{c.name}[/bold]: {c.num_nodes} nodes, {c.num_gpus} GPUs "
              f"({', '.join(sorted({nd.gpu.name for nd in c.nodes}))})")
    if s.get("median_gb_per_s") is not None:
        con.print(f"inter-node streams: median {s['median_gb_per_s']:.2f} GB/s, min "
                  f"{s['min_gb_per_s']:.2f}, max {s['max_gb_per_s']:.2f}")
        t = Table(title="Slowest links")
        for col in ("from", "to", "GB/s"):
            t.add_column(col, justify="right" if col == "GB/s" else "left")
        for x in s["slowest_links"]:
            t.add_row(x["from"], x["to"], f"{x['gb_per_s']:.2f}")
        con.print(t)
    if s["outliers"]:
        con.print(f"outlier nodes (median link < {OUTLIER_RATIO} x cluster median): " + ", ".join(
            f"{o['node']} ({o['median_gb_per_s']:.2f} GB/s, {o['ratio']:.2f}x)"
            for o in s["outliers"]))
    else:
        con.print("no outlier nodes")
    con.print(f"switch groups (links >= {GROUP_RATIO} x fastest):")
    for g, members in enumerate(s["groups"]):
        extra = [k for k, v in s["attached"].items() if v == g]
        con.print(f"  group {g}: {', '.join(members)}"
                  + (f"  (outliers attached: {', '.join(extra)})" if extra else ""))
    if s["asymmetric"]:
        con.print(f"{len(s['asymmetric'])} asymmetric pair(s): " + ", ".join(
            f"{a['a']}/{a['b']} {a['ratio']:.2f}x" for a in s["asymmetric"][:5]))
    if png is not None:
        con.print(f"heatmap written to {png}")


@cluster_app.command("synth")
@guarded
def cluster_synth(
    nodes: Annotated[int, typer.Option(help="Number of nodes.")] = 8,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")] = 8,
    gpu: Annotated[str, typer.Option(help="GPU preset.")] = "A100-80GB",
    intra_gb_per_s: Annotated[float, typer.Option(help="Intra-node link, GB/s.")] = 240.0,
    intra_topology: Annotated[Optional[str], typer.Option(
        help="Intra-node topology preset instead of a uniform link.")] = None,
    nic_gb_per_s: Annotated[float, typer.Option(help="In-leaf stream bandwidth, GB/s.")] = 23.0,
    leaf_size: Annotated[int, typer.Option(help="Nodes per leaf switch.")] = 4,
    oversubscription: Annotated[float, typer.Option(
        help="Spine oversubscription (cross-leaf = nic / this).")] = 1.6,
    degraded: Annotated[int, typer.Option(help="Number of nodes with a degraded NIC.")] = 1,
    degraded_factor: Annotated[float, typer.Option(help="Degraded NIC rate factor.")] = 0.5,
    noise: Annotated[float, typer.Option(help="Uniform multiplicative noise half-width.")] = 0.03,
    latency_us: Annotated[float, typer.Option(help="Per-message latency, us.")] = 5.0,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    name: Annotated[Optional[str], typer.Option(help="Cluster name [synth-...].")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o",
                                                   help="Write the TOML here [stdout].")] = None,
    as_json: JsonOpt = False,
):
    """A synthetic cluster (leaf/spine, degraded NICs, noise; see README)."""
    from model.cluster import SynthParams, synth_cluster

    c = synth_cluster(SynthParams(
        num_nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu, intra_gb_per_s=intra_gb_per_s,
        nic_gb_per_s=nic_gb_per_s, leaf_size=leaf_size, oversubscription=oversubscription,
        degraded=degraded, degraded_factor=degraded_factor, noise=noise, latency_us=latency_us,
        seed=seed, name=name))
    if intra_topology is not None:
        from model.topology import cluster_with_topology
        c = cluster_with_topology(c, intra_topology)
    _emit_cluster(c, output, as_json)


# --- launch commands (issue 5) ---
# Plan files, framework launch files and pictures; see launch/ and model/planfile.py.

_PLAN_OPTION_PARAMS = ("model", "cluster", "global_batch", "seq", "precision", "tp", "pp", "dp",
                       "mbs", "schedule", "chunks", "layers", "recompute", "sp", "distopt",
                       "blocking", "overlap_grad_reduce")


def _load_plan_only(ctx, plan_file: Path):
    """Read a plan file for `estimate --plan`, refusing plan options given alongside it."""
    from model.errors import SpecError
    from model.planfile import load_plan

    if ctx is not None:
        given = []
        for p in ctx.command.params:
            src = ctx.get_parameter_source(p.name)
            # typer vendors click: compare the enum by name (COMMANDLINE, ENVIRONMENT, ...)
            if p.name in _PLAN_OPTION_PARAMS and src is not None and \
                    src.name not in ("DEFAULT", "DEFAULT_MAP"):
                given.append(max(p.opts, key=len))
        if given:
            raise SpecError(f"{', '.join(given)} cannot be combined with --plan, which fixes "
                            "the inputs and the plan; drop them or drop --plan",
                            source="options", field="--plan")
    return load_plan(plan_file)


def _launch_outputs(m, job, c, plan, est, opts, save_plan: Path | None, emit: str | None,
                    out: Path | None, gantt: Path | None, placement_png: Path | None,
                    as_json: bool) -> None:
    """Write what was asked (plan file, launch files, PNGs) and report the estimate."""
    from model.serialize import estimate_to_dict, plan_to_dict

    files, warnings = _write_outputs(m, job, c, plan, est, opts, save_plan, emit, out, gantt,
                                     placement_png)
    if as_json:
        typer.echo(json.dumps({"model": m.name, "cluster": c.name, "plan": plan_to_dict(plan, c),
                               "estimate": estimate_to_dict(est),
                               "files": [str(p) for p in files], "warnings": warnings},
                              indent=1))
        return
    print_estimate(est, plan, c)
    _print_written(files, warnings)


def _write_outputs(m, job, c, plan, est, opts, save_plan, emit, out, gantt, placement_png,
                   solver: dict | None = None) -> tuple[list[Path], list[str]]:
    """Plan file, launch files and pictures, as asked; returns (files, warnings)."""
    from model.errors import SpecError

    if out is not None and emit is None:
        raise SpecError("is the folder for --emit; add --emit FRAMEWORK",
                        source="options", field="--out")
    files: list[Path] = []
    warnings: list[str] = []
    if save_plan is not None:
        from model.planfile import save_plan as write_plan
        write_plan(save_plan, m, job, c, plan, est, solver, opts)
        files.append(save_plan)
    if emit is not None:
        from launch.emit import emit as write_launch
        f, w = write_launch(emit, m, job, c, plan, out or Path(f"launch-{emit.lower()}"))
        files += f
        warnings += w
    if gantt is not None or placement_png is not None:
        from launch import pictures
        if gantt is not None:
            from model.estimator import Evaluator
            files.append(pictures.gantt_png(Evaluator(m, job, c, plan.shape, opts),
                                            plan.placement, gantt))
        if placement_png is not None:
            files.append(pictures.placement_png(c, plan, placement_png))
    return files, warnings


def _print_written(files, warnings) -> None:
    from rich.markup import escape

    con = console()
    for p in files:
        con.print(f"wrote {p}", highlight=False)
    for w in warnings:
        con.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)


@app.command("emit")
@guarded
def emit_cmd(
    plan_file: Annotated[Path, typer.Argument(help="A plan file (--save-plan or solve).")],
    framework: Annotated[str, typer.Option(
        "--framework", "-f", help="megatron, nemo, torchtitan or deepspeed.")] = "megatron",
    out: Annotated[Optional[Path], typer.Option(
        "--out", "-o", help="Output folder [launch-<framework>].")] = None,
    gantt: Annotated[Optional[Path], typer.Option(
        "--gantt", help="Also write the schedule's Gantt chart to this PNG.")] = None,
    placement_png: Annotated[Optional[Path], typer.Option(
        "--placement-png", help="Also write the placement picture to this PNG.")] = None,
    as_json: JsonOpt = False,
):
    """Write a saved plan's framework arguments, launch script and hostfile."""
    from launch.emit import emit as write_launch
    from model.planfile import load_plan

    m, job, c, plan, opts, _meta = load_plan(plan_file)
    files, warnings = write_launch(framework, m, job, c, plan,
                                   out or Path(f"launch-{framework.lower()}"))
    if gantt is not None or placement_png is not None:
        from launch import pictures
        if gantt is not None:
            from model.estimator import Evaluator
            files.append(pictures.gantt_png(Evaluator(m, job, c, plan.shape, opts),
                                            plan.placement, gantt))
        if placement_png is not None:
            files.append(pictures.placement_png(c, plan, placement_png))
    if as_json:
        typer.echo(json.dumps({"plan": str(plan_file), "framework": framework.lower(),
                               "files": [str(p) for p in files], "warnings": warnings},
                              indent=1))
        return
    _print_written(files, warnings)


if __name__ == "__main__":
    app()
