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
    blocking: Annotated[bool, typer.Option("--blocking/--overlapped",
                                           help="Blocking pipeline send/recv.")] = True,
    overlap_grad_reduce: Annotated[bool, typer.Option(
        help="Overlap gradient reduction with the last backward.")] = False,
    as_json: JsonOpt = False,
):
    """Per-stage memory and iteration time of one plan (Megatron-LM placement)."""
    from model.errors import SpecError
    from model.estimator import estimate as run_estimate, make_plan
    from model.serialize import estimate_to_dict, plan_to_dict

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


if __name__ == "__main__":
    app()
