"""What the command line prints: tables (rich) and JSON documents for every command.

cli.py declares the commands and options and calls the library; everything a user reads on the
terminal is shaped here. Nothing here computes a number the cost model or the solvers did not.
"""

from __future__ import annotations

import json
import statistics
import time

import typer
from rich.markup import escape
from rich.table import Table

from formats.planfile import gpu_to_dict, json_safe, model_to_dict
from formats.views import estimate_to_dict, plan_to_dict
from model.fp8 import fp8_label
from model.plan import slot_label
from model import plan as plan_rules


def console():
    """A rich console at least 150 columns wide, so tables stay readable when piped."""
    from rich.console import Console
    c = Console()
    return c if c.width >= 150 else Console(width=150)


def say_err(text: str) -> None:
    """One line to stderr (what a command says while --json owns stdout)."""
    from rich.console import Console
    Console(stderr=True).print(escape(text), highlight=False)


def echo_json(doc) -> None:
    """Strict JSON: an infinite bound or a NaN is null (json.dumps would write Infinity)."""
    typer.echo(json.dumps(json_safe(doc), indent=1, allow_nan=False, default=str))


class Progress:
    """Live progress on stderr for searches longer than about two seconds."""

    def __init__(self, enabled: bool):
        self.enabled, self.t0, self.status = enabled, time.perf_counter(), None

    def __call__(self, msg: str) -> None:
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


# ---------------------------------------------------------------------------------------------
# estimates and plans


def print_estimate(est, plan, cluster, title: str = "Estimate", job=None) -> None:
    con = console()
    sh = plan.shape
    con.print(f"[bold]{title}[/bold]: {sh.describe()}{fp8_label(job, sh)}  "
              f"layers={list(sh.layers)}  "
              f"micro-batches/replica={est.num_microbatches}")
    con.print(f"iteration {est.iteration_ms / 1e3:.3f} s   {est.tokens_per_s:,.0f} tokens/s   "
              f"MFU {est.mfu * 100:.1f}%"
              # eq. (3) counts the full s x s attention (as torchtitan does); where a causal
              # count (Megatron-Bridge's) differs by a point or more, it is given beside; with
              # a sliding window, the count of the pairs the window keeps
              + (f" ({'causal, window pairs only' if est.windowed else 'causal'} "
                 f"{est.mfu_causal * 100:.1f}%)"
                 if est.mfu - est.mfu_causal >= 0.01 else "")
              + f"   HFU {est.hfu * 100:.1f}%   "
              # FP8 runs: against the 16-bit dense peak (model.estimator), so the FP8 GEMMs
              # can take both past what the bf16 tensor cores could reach
              + ("(of the 16-bit peak)   " if sh.fp8 else "")
              + f"peak memory {est.peak_memory_gib:.1f} GiB   "
              + ("[green]fits[/green]" if est.fits else "[red]does not fit[/red]"))
    t = Table(title="Time breakdown (critical path of the slowest replica)")
    t.add_column("part")
    t.add_column("ms", justify="right")
    t.add_column("share", justify="right")
    # the path's parts add up to the iteration; the bubble (the slowest stage idle) is not a
    # further part: it lies inside them (the other stages' compute and transfers on the path)
    bubble = None
    for k, v in est.breakdown_ms.items():
        if k == "bubble_ms":
            bubble = v
            continue
        t.add_row(k.removesuffix("_ms"), f"{v:,.1f}", f"{v / est.iteration_ms * 100:.1f}%")
    if bubble is not None:
        t.add_section()
        t.add_row("of which bubble", f"{bubble:,.1f}", f"({bubble / est.iteration_ms * 100:.1f}%)")
    con.print(t)
    if bubble is not None:
        con.print("the parts above the line add up to the iteration; the bubble, the time the "
                  "slowest stage waits, lies inside them", highlight=False)
    t = Table(title="Per stage (one GPU; memory in GiB)")
    for col in ("stage", "layers", "fwd ms", "bwd ms", "dp sync ms", "opt ms", "weights",
                "grads", "optim", "activ", "in-flight", "work", "allow", "total", "limit"):
        t.add_column(col, justify="right")
    windowed = any(s.full_layers for s in est.stages)
    for s in est.stages:
        mm = s.memory
        style = "red" if mm.total_gib > s.limit_gib else None
        # a windowed model's full-attention layers among the stage's, where it has any
        lay = f"{s.layers} ({s.full_layers} full)" if windowed else str(s.layers)
        t.add_row(str(s.stage), lay, f"{s.fwd_ms:.2f}", f"{s.bwd_ms:.2f}",
                  f"{s.sync_exposed_ms:.1f}", f"{s.optimizer_ms:.1f}", f"{mm.weights_gib:.1f}",
                  f"{mm.grads_gib:.1f}", f"{mm.optimizer_gib:.1f}", f"{mm.activations_gib:.1f}",
                  "/".join(map(str, mm.inflight)), f"{mm.working_gib:.1f}",
                  f"{mm.allowance_gib:.1f}", f"{mm.total_gib:.1f}", f"{s.limit_gib:.1f}",
                  style=style)
    con.print(t)
    buf = max(s.memory.dispatcher_gib for s in est.stages)
    if buf:
        who = {"deepep": "DeepEP", "hybridep": "HybridEP"}.get(
            getattr(job, "moe_dispatcher", None), "the dispatcher")
        con.print(f"the allowance holds {who}'s buffers, {buf:.2f} GiB a GPU, outside "
                  "PyTorch's allocator", highlight=False)
    if est.hops_ms:
        con.print("pipeline transfers, slowest replica (ms fwd/bwd): " + "  ".join(
            f"{h}->{(h + 1) % sh.pp}: {f:.2f}/{b:.2f}" for h, (f, b) in enumerate(est.hops_ms)))


def _job_dict(job) -> dict | None:
    from formats.planfile import job_to_dict
    return job_to_dict(job) if job is not None else None


def estimate_json(model, cluster, plan, est, files=None, warnings=None, job=None) -> dict:
    d = {"model": model.name, "cluster": cluster.name, "plan": plan_to_dict(plan, cluster),
         "estimate": estimate_to_dict(est)}
    if job is not None:  # what was priced beyond the plan (precision, FP8 recipe, framework)
        d["job"] = _job_dict(job)
    if files is not None:
        d["files"] = [str(p) for p in files]
    d["warnings"] = list(warnings or ())  # always there, as solve's
    return d


def slots_by_node(plan, gpus: bool = False) -> dict[int, list[str]]:
    """Node index -> the placement slots it hosts (s<stage>/r<replica>[c<CP rank>]), with
    their local GPUs in brackets when `gpus`."""
    pl = plan.placement
    out: dict[int, list[str]] = {}
    for s in range(pl.pp):
        for r in range(pl.cols):
            label = slot_label(s, r, plan.shape.cp)
            if gpus:
                label += f"[{','.join(map(str, pl.gpus[s][r]))}]"
            out.setdefault(pl.node[s][r], []).append(label)
    return out


def print_placement(plan, cluster) -> None:
    t = Table(title="Placement (node: stage/replica [GPUs])")
    t.add_column("node")
    t.add_column("hosts")
    by_node = slots_by_node(plan, gpus=True)
    for n, nd in enumerate(cluster.nodes):
        t.add_row(nd.name, "  ".join(by_node.get(n, ["-"])))
    console().print(t)


def print_interval(interval, profile: str) -> None:
    t, lo, hi, why_none = interval
    if lo is None:
        console().print(f"calibrated ({profile}): iteration {t:.3f} s; {why_none}",
                        highlight=False)
        return
    console().print(f"calibrated ({profile}): iteration {t:.3f} s ({lo:.3f}-{hi:.3f}, 95% "
                    "prediction interval)")


def print_memory_interval(mi, profile: str) -> None:
    con = console()
    if mi.low_gib is None:
        con.print(f"calibrated ({profile}): peak memory {mi.peak_gib:.1f} GiB; "
                  f"{mi.none_because}", highlight=False)
        return
    con.print(f"calibrated ({profile}): peak memory {mi.peak_gib:.1f} GiB ({mi.low_gib:.1f}-"
              f"{mi.high_gib:.1f}, 95% prediction interval)", highlight=False)
    if mi.may_not_fit_stage is not None:
        con.print(f"[yellow]warning:[/yellow] {may_not_fit(mi)}", highlight=False)


def may_not_fit(mi) -> str:
    """The warning of a memory interval that reaches past a stage's GPU memory."""
    return (f"may not fit: stage {mi.may_not_fit_stage}'s 95% memory interval reaches past its "
            "GPU's memory")


def print_safe_memory(cal: dict) -> None:
    sm = cal["safe_memory"]
    console().print(f"calibrated ({cal['profile']}): memory judged at the top of its 95% "
                    f"interval (fragmentation {sm['fragmentation']:.3f}; fitted "
                    f"{sm['fitted_fragmentation']:.3f})", highlight=False)


def log_reading_dict(r, global_batch: int, plan_read: str | None = None) -> dict:
    """What calibrate read from one log (paired with a plan of this global batch; `plan_read`:
    the plan read from its printed arguments, None when a plan file was given): its
    framework, the readings it used and those it left out."""
    used = len(r.at_batch(global_batch))
    return {"log": r.path, "framework": r.framework, "readings_used": used,
            "warmup_skipped": r.skipped, "processes": r.processes,
            "other_batch_left_out": len(r.values) - used,
            "validation_lines_left_out": r.validation_lines,
            "same_steps_lines_left_out": r.same_steps_lines,
            "gzip_cut_short": r.cut_short,
            "unfinished_last_line_left_out": r.unfinished_line,
            "plan_from_arguments": plan_read,
            # a plan file is checked against what the log printed of the run's settings
            "plan_checked_against_log": plan_read is not None or r.prints_settings}



def _stage_words(at) -> str:
    """', stage 0' / ', stages 1, 3' for a calibration run's memory reading (a profile's JSON
    holds a tuple as a list); '' where it is the largest stage's."""
    if at is None:
        return ""
    at = [at] if isinstance(at, int) else list(at)
    return f", stage{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}"

def print_calibration(prof, out, readings=()) -> None:
    """The fitted profile, and before it what was read from each log: `readings` holds (its
    LogReading, its plan's global batch, the plan read from the run's printed arguments or its
    run config, or None)."""
    con = console()
    for r, gbs, plan_read in readings:
        d = log_reading_dict(r, gbs, plan_read)
        extra = (f" over {r.processes} training processes (restarts or ranks), each warming up"
                 if r.processes > 1 else "")
        if d["other_batch_left_out"]:
            extra += (f"; {d['other_batch_left_out']} at a global batch other than the plan's "
                      f"{gbs} left out")
        if r.validation_lines:
            extra += f"; {r.validation_lines} validation lines left out"
        if r.same_steps_lines:
            extra += (f"; {r.same_steps_lines} DeepSpeed lines timing the same steps left "
                      "out")
        if r.cut_short:
            extra += "; the gzip stream ends before its end marker: read up to there"
        if r.unfinished_line:
            extra += ("; its last line has no line end (a log still being written): left "
                      "out")
        con.print(f"{r.path}: {r.framework}, {d['readings_used']} readings used, {r.skipped} "
                  f"warm-up skipped{extra}", highlight=False)
        if plan_read:
            con.print(f"  plan read from the run's own settings: {plan_read}", highlight=False)
        elif not d["plan_checked_against_log"]:
            con.print("  the log prints none of the run's settings (no arguments block or "
                      "configuration): its plan file is taken as what ran, unchecked",
                      highlight=False)
    t = Table(title=f"Calibration for {prof.gpu} (written to {out})")
    for col in ("parameter", "value", "std. error"):
        t.add_column(col, justify="right" if col != "parameter" else "left")
    edges = prof.at_bounds()
    for k, v in prof.values.items():
        e = prof.stderr.get(k)
        t.add_row(k, f"{v:.4f}" + (f" ({edges[k]} bound)" if k in edges else ""),
                  "-" if e is None else f"{e:.4f}")
    con.print(t)
    if "intra_latency_scale" in prof.values:
        from model.cluster import INTRA_LATENCY_US
        con.print(f"intra_latency_scale: every step of a collective inside a node costs "
                  f"{prof.values['intra_latency_scale']:.2f} x the cluster's intra_latency_us "
                  f"({INTRA_LATENCY_US:g} us unless its file sets one); far above 1, the runs "
                  "pay a fixed cost per tensor-parallel collective that the links do not "
                  "explain",
                  highlight=False)
    for k in prof.uninformed:
        con.print(f"[yellow]{k}: no run's time depends on it (doubling it moves each by less "
                  "than 0.1%), so the runs cannot tell its value; add runs that exercise it "
                  "(for intra_latency_scale: tensor parallelism inside a node)[/yellow]",
                  highlight=False)
    for k, edge in edges.items():
        con.print(f"[yellow]{k} ended at its {edge} bound: the runs ask for more than its range "
                  "allows; the cost model misses something in them, or a run's plan is not "
                  "the plan that ran[/yellow]", highlight=False)
    t = Table(title="Runs: measured and predicted iteration time (s), before and after")
    for col in ("run", "measured", "before", "err", "after", "err", "memory GiB"):
        t.add_column(col, justify="right" if col != "run" else "left")
    for r in prof.runs:
        m = r["measured_s"]
        t.add_row(r["label"], f"{m:.3f}", f"{r['before_s']:.3f}",
                  f"{100 * (r['before_s'] / m - 1):+.1f}%", f"{r['after_s']:.3f}",
                  f"{100 * (r['after_s'] / m - 1):+.1f}%",
                  "-" if r["memory_gib"] is None else f"{r['memory_gib']:.1f} "
                  f"({r['memory_kind']}"
                  + _stage_words(r.get("memory_stage"))
                  + ")")
    con.print(t)
    sd = prof.residual_sd
    if sd is None:
        con.print("residual sd of log time: not determined (no more runs than parameters, and "
                  "no prior): estimates under this profile have no prediction interval")
    elif prof.residual_sd_assumed:
        k = prof.noise_prior_dof
        prior = (f", worth {k} degree{'s' * (k != 1)} of freedom to the intervals"
                 if prof.noise_prior_dof else "")
        con.print(f"residual sd of log time: {100 * sd:.1f}% assumed, not measured (no more "
                  f"runs than parameters): the run-to-run noise the prior is weighed "
                  f"against{prior}; the standard errors are the prior's and these runs' "
                  "together", highlight=False)
    else:
        from model.calibration import NOISE_SD, spread_dof, t975
        d = prof.residual_dof
        pooled = (f", pooled with the prior's {100 * NOISE_SD:.0f}% as "
                  f"{prof.noise_prior_dof} more" if prof.noise_prior_dof else "")
        con.print(f"residual sd of log time: {100 * sd:.1f}% ({d} degree{'s' * (d != 1)} of "
                  f"freedom{pooled})", highlight=False)
        dof = spread_dof(prof)
        if dof is not None and dof <= 2:
            fewer = (", or fit fewer parameters (--fit gemm_scale)" if len(prof.names) > 1
                     else "")
            con.print(f"  so few that the 95% intervals span +-{t975(dof):.1f} sd: add runs"
                      f"{fewer}", highlight=False)
    n = prof.fragmentation_readings
    if n:
        con.print(f"memory: {n} reading{'s' * (n != 1)} of the reserved peak; "
                  + ("one leaves no spread: estimates under this profile have no memory "
                     "interval" if prof.fragmentation_sd is None else
                     f"their fragmentation spreads by {100 * prof.fragmentation_sd:.1f} points "
                     "(sample sd), which the memory intervals carry"), highlight=False)


class SweepProgress:
    """A live bar for sweeps: done / failed / running, with rich's ETA."""

    def __init__(self, total: int, already: int):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RP, TextColumn,
                                   TimeRemainingColumn)
        self.p = RP(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                    console=console(), transient=True)
        self.p.start()
        self.t = self.p.add_task("sweep", total=total, completed=already, info="")
        self.already = already

    def update(self, counts: dict, running: int) -> None:
        self.p.update(self.t, completed=self.already + counts["done"] + counts["failed"],
                      info=f"failed {counts['failed']}, running {running}")

    def stop(self) -> None:
        self.p.stop()


def print_written(files, warnings) -> None:
    con = console()
    for p in files:
        con.print(f"wrote {p}", highlight=False)
    for w in warnings:
        con.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)


# ---------------------------------------------------------------------------------------------
# solve and compare


def slow_nodes(plan, cluster) -> list[dict]:
    """The nodes `cluster show` calls outliers (a degraded NIC: best stream out or in below
    OUTLIER_RATIO x the other nodes' best; a degraded NVLink: best ring below it x the
    median node's) and what `plan` gives each: its placement slots (none: idle)."""
    from formats.bandwidth import outlier_nodes

    hosts = slots_by_node(plan)
    rows = []
    for n, link, o in outlier_nodes(cluster):
        row = {"node": o["node"], "link": link, "ratio": o["ratio"], "slots": hosts.get(n, []),
               "gb_per_s": o["best_gb_per_s" if link == "network" else "intra_gb_per_s"]}
        if link == "network":
            row["direction"] = o.get("direction", "both")
        rows.append(row)
    return rows


def print_slow_nodes(plan, cluster) -> None:
    for o in slow_nodes(plan, cluster):
        # cluster show's direction: a node slow only sending (or receiving) says which
        way = {"out": " sending", "in": " receiving"}.get(o.get("direction", "both"), "")
        what = (f"best network stream{way}" if o["link"] == "network" else
                "best NVLink ring")
        where = (f"hosts {' '.join(o['slots'])}" if o["slots"] else
                 "left idle by this plan")
        console().print(f"slow node {o['node']}: {what} {o['gb_per_s']:.1f} GB/s, "
                        f"{o['ratio']:.2f}x the cluster's (cluster show); {where}",
                        highlight=False)


def solve_json(res, model, cluster, files, warnings, space=None, job=None) -> dict:
    import dataclasses

    return {
        **({"job": _job_dict(job)} if job is not None else {}),
        "space": dataclasses.asdict(space) if space is not None else None,
        "plan": plan_to_dict(res.plan, cluster), "estimate": estimate_to_dict(res.estimate),
        "slow_nodes": slow_nodes(res.plan, cluster), "solver": res.status_dict(),
        "candidates": [{"shape": x.describe, "lower_bound_ms": x.lower_bound_ms,
                        "megatron_placement_ms": x.quick_ms, "best_ms": x.best_ms,
                        "status": x.status} for x in res.candidates],
        "model": model.name, "cluster": cluster.name, "files": [str(p) for p in files],
        "warnings": list(warnings),
    }


def print_solve(res, c, job=None) -> None:
    con = console()
    print_estimate(res.estimate, res.plan, c, title="Best plan", job=job)
    print_placement(res.plan, c)
    print_slow_nodes(res.plan, c)
    proven = ("proven optimal" + res.proven_note if res.termination == "optimal"
              else "NOT proven optimal")
    con.print(f"solver: {res.method}, {res.termination} ({proven}); objective "
              f"{res.objective_ms / 1e3:.4f} s, bound {res.bound_ms / 1e3:.4f} s, gap "
              f"{res.gap * 100:.4f}%"
              + (" (the bound covers block placements, and every placement of a shape "
                 "with no block layout)" if res.outside_blocks else "")
              + f", {res.wall_s:.1f} s"
              + (f" ({res.work_s:.1f} work-s, clock: work)" if res.clock == "work" else "")
              + f"; {res.shapes_total} shapes, "
              f"{res.shapes_solved} placement-optimized"
              + (f" ({res.blocks_enumerated} block(s) small enough to enumerate every "
                 "placement and split)" if res.blocks_enumerated else ""), highlight=False)
    for b in res.beyond:
        if not (b.checked and b.could_beat == 0):
            con.print(f"beyond the search: {escape(b.describe(res.objective_ms))}",
                      highlight=False)
    if res.shapes_too_long:
        con.print(f"left out: {res.shapes_too_long} shapes whose schedules are longer than "
                  f"the {plan_rules.MAX_SCHEDULE_SLOTS:,} slots (micro-batches per replica x "
                  "PP x chunks) the cost model builds; the plan and its bound cover the "
                  "others (a smaller global batch or larger micro-batches bring them in)",
                  highlight=False)
    if res.shapes_unbounded:
        con.print(f"bound: {res.shapes_unbounded} of {res.shapes_total} shapes were not "
                  "bounded within the time limit, so the bound is the trivial 0; a longer "
                  "--time-limit bounds them", highlight=False)
    for e in res.errors:
        con.print(f"[yellow]solver error caught (search went on):[/yellow] {escape(e)}",
                  highlight=False)
    for why, n in res.not_covered.items():
        con.print(f"certificate: {n} placement problem(s) annealed and bounded in closed form, "
                  f"not by the MILP: {escape(why)}", highlight=False)
    t = Table(title="Next best plans and why they lost")
    for col in ("shape", "best found s", "Megatron placement s", "lower bound s", "status"):
        t.add_column(col)
    for x in res.runners_up(8):
        t.add_row(x.describe, f"{x.best_ms / 1e3:.3f}" if x.best_ms else "-",
                  f"{x.quick_ms / 1e3:.3f}" if x.quick_ms else "-",
                  f"{x.lower_bound_ms / 1e3:.3f}", escape(x.status))
    con.print(t)
    misfits = [x for x in res.candidates if x.status.startswith("does not fit")]
    if misfits:
        t = Table(title=f"Shapes that do not fit ({len(misfits)}; closest first)")
        t.add_column("shape")
        t.add_column("why")
        for x in sorted(misfits, key=lambda x: x.needs_gib)[:6]:
            t.add_row(x.describe, escape(x.status))
        con.print(t)
    if res.plan.shape.cp > 1:
        print_without_cp(res)


def print_toss_up(toss, maybe) -> None:
    """What SolveResult.toss_up found inside the best plan's 95% interval."""
    if toss is not None:
        console().print(f"toss-up: the next best plan, {toss.describe}, at "
                        f"{toss.timed_ms / 1e3:.3f} s, "
                        "is inside the best plan's 95% interval", highlight=False)
    elif maybe is not None:
        console().print(f"possible toss-up: {maybe.describe} was not timed inside the best "
                        f"plan's 95% interval, but its lower bound, "
                        f"{maybe.lower_bound_ms / 1e3:.3f} s, is inside it", highlight=False)


def print_without_cp(res) -> None:
    """Why no plan without context parallelism won: per TP x PP x DP, how many variants
    (micro-batch, schedule, recompute, sharding) do not fit, with the closest one's
    overflowing stage, and the best of those that fit (every one is in --json)."""
    groups: dict = {}
    for x in res.candidates:
        if x.shape is not None and x.shape.cp == 1:
            groups.setdefault((x.shape.tp, x.shape.pp, x.shape.dp), []).append(x)
    if not groups:
        return
    t = Table(title="Plans without context parallelism (CP = 1) and why each lost")
    for col in ("TP x PP x DP", "variants", "do not fit (closest: stage that overflows)",
                "fit (best: time or lower bound, s)"):
        t.add_column(col)
    for (tp, pp, dp), xs in sorted(groups.items()):
        mis = [x for x in xs if x.status.startswith("does not fit")]
        ok = [x for x in xs if not x.status.startswith("does not fit")]
        if mis:
            c = min(mis, key=lambda x: x.needs_gib)
            why = f"{len(mis)}; {c.shape.describe(degrees=False)}: " + c.status.removeprefix(
                "does not fit: ").split(" even")[0]
        else:
            why = "0"
        fit = "-"
        if ok:
            best = min(ok, key=lambda x: x.best_ms or x.lower_bound_ms)
            fit = (f"{len(ok)}; {best.best_ms / 1e3:.3f}" if best.best_ms else
                   f"{len(ok)}; >= {best.lower_bound_ms / 1e3:.3f} ({best.status.split(':')[0]})")
        t.add_row(f"{tp} x {pp} x {dp}", str(len(xs)), escape(why), escape(fit))
    console().print(t)


def print_compare(rows, title: str, csv_path=None) -> None:
    refs = {r["reference"] for r in rows}
    over = ("over optimum" if refs == {"proven optimum"} else
            "over lower bound" if refs == {"lower bound"} else "over reference")
    t = Table(title=title)
    calibrated = any("interval_low_s" in r for r in rows)
    for col in ("cluster", "method", "plan", "iteration s") + (
            ("95% interval s",) if calibrated else ()) + (over, "solve s (wall)", "proven"):
        t.add_column(col)
    for r in rows:
        gap = r["over_reference"]
        iv = (_interval_cell(r),) if calibrated else ()
        ms = r["iteration_ms"]
        # four significant places at least: millisecond-scale jobs had read as ties
        t.add_row(r["cluster"], r["method"], r["plan"], "-" if ms is None else
                  f"{ms / 1e3:.{3 if ms >= 10_000 else 4}f}",
                  *iv, "-" if gap is None else f"{gap * 100:.2f}%", f"{r['solve_s']:.1f}",
                  r["proven"])
    con = console()
    con.print(t)
    con.print(f"{over}: iteration time / "
              + ("the exact search's proven optimum" if over == "over optimum" else
                 "the larger of the two searches' lower bounds (optimality not proven: not a "
                 "gap to the optimum)" if over == "over lower bound" else
                 "the exact search's proven optimum, or the larger of the searches' lower "
                 "bounds where not proven (column reference)")
              + " - 1; solver gap: (time - bound) / time, as solve reports it", highlight=False)
    if csv_path is not None:
        con.print(f"wrote {csv_path}")


def _interval_cell(r: dict) -> str:
    """A row's 95% interval under a calibration profile (compare --calibration), or '-'."""
    return (f"{r['interval_low_s']:.3f}-{r['interval_high_s']:.3f}"
            if r.get("interval_low_s") is not None else "-")


def print_sharding(rows, title: str, csv_path=None) -> None:
    t = Table(title=title + ": best plan under each data-parallel sharding")
    calibrated = any("interval_low_s" in r for r in rows)
    for col in ("cluster", "sharding", "plan", "iteration s") + (
            ("95% interval s",) if calibrated else ()) + ("peak GiB", "search", "solve s"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["cluster"], r["sharding"], r["plan"],
                  "-" if r["iteration_ms"] is None else f"{r['iteration_ms'] / 1e3:.3f}",
                  *((_interval_cell(r),) if calibrated else ()),
                  "-" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.1f}",
                  escape(str(r["termination"])),
                  "-" if r["solve_s"] is None else f"{r['solve_s']:.1f}")
    con = console()
    con.print(t)
    if csv_path is not None:
        con.print(f"wrote {csv_path}")


# ---------------------------------------------------------------------------------------------
# validate and presets


def validate_json(s) -> dict:
    a100 = s.a100()

    def pct(v):
        return None if v is None else 100 * v
    return {
        "runs": [{"id": x.id, "skipped": x.skipped, "predicted_s": x.predicted_s,
                  "published_s": x.published_s, "time_source": x.time_source,
                  "time_abs_pct_err": None if x.time_err is None else 100 * x.time_err,
                  "predicted_gib": x.predicted_gib, "published_gib": x.published_gib,
                  "memory_abs_pct_err": None if x.mem_err is None else 100 * x.mem_err,
                  "oom_published": x.oom_published, "predicted_fits": x.predicted_fits,
                  "interval_low_s": x.interval_low_s, "interval_high_s": x.interval_high_s,
                  "assumptions": x.assumptions} for x in s.rows],
        "time_median_pct": 100 * s.time_median, "time_mean_pct": 100 * s.time_mean,
        "time_median_pct_by_group": {g: {"median_pct": 100 * m, "runs": n}
                                     for g, (m, n) in s.group_medians().items()},
        "a100_time_median_pct": pct(a100.time_median),
        "table1_error_slope_pct_per_decade": s.size_trend(),
        "bloom_memory_median_pct": pct(a100.mem_median),
        "bloom_memory_max_pct": pct(a100.mem_max),
        "memory_median_pct": 100 * s.mem_median, "memory_max_pct": 100 * s.mem_max,
        "memory_bloom_per_configuration_pct": [100 * e for e in s.config_mem_errs("bloom")],
        "memory_reserved_without_context_pct": [100 * e for e in s.reserved_mem_errs()],
        "oom_correct": list(s.oom_correct)}


def validate_heldout_json(s) -> dict:
    """The held-out runs (mixture-of-experts or dense) of `validate --json`."""
    return {
        "runs": [{"id": x.id, "predicted_s": x.predicted_s, "published_s": x.published_s,
                  "time_signed_pct_err": 100 * (x.predicted_s / x.published_s - 1),
                  "alltoall_share": (x.estimate.breakdown_ms.get("ep_alltoall_ms", 0.0)
                                     / x.estimate.iteration_ms),
                  "predicted_peak_gib": x.estimate.peak_memory_gib, "ran_published": True,
                  "predicted_fits": x.predicted_fits,
                  "interval_low_s": x.interval_low_s, "interval_high_s": x.interval_high_s,
                  "assumptions": x.assumptions}
                 for x in s.rows if not x.skipped],
        "time_median_pct": 100 * s.time_median, "oom_correct": list(s.oom_correct)}


def print_validate_heldout(s, verbose: bool, kind: str = "mixture of experts") -> None:
    """The held-out runs' table: the mixture-of-experts ones (with their all-to-all's share of
    the iteration) or, kind "dense", the dense H100/B200/GB200/GB300 ones."""
    moe = kind != "dense"
    title = "Mixture-of-experts runs" if moe else "Dense H100 / B200 / GB200 / GB300 runs"
    t = Table(title=f"{title} (held out: nothing is fitted to them)")
    cols = ("run", "pred s", "pub s", "err") + (("all-to-all",) if moe else ()) + (
        "pred peak GiB", "ran/pred")
    for col in cols:
        t.add_column(col, justify="right" if col != "run" else "left")
    for x in s.rows:
        if x.skipped:
            continue
        e = x.estimate
        a2a = (f"{100 * e.breakdown_ms.get('ep_alltoall_ms', 0.0) / e.iteration_ms:.0f}%",)
        t.add_row(x.id, f"{x.predicted_s:.2f}", f"{x.published_s:.2f}",
                  f"{100 * (x.predicted_s / x.published_s - 1):+.1f}%",
                  *(a2a if moe else ()), f"{e.peak_memory_gib:.1f}",
                  "ran/" + ("fits" if x.predicted_fits else "[red]OOM[/red]"))
        if verbose and x.assumptions:
            t.add_row("  assumed: " + "; ".join(x.assumptions), *[""] * (len(cols) - 1))
    con = console()
    con.print(t)
    ok, n = s.oom_correct
    con.print(f"{kind}: iteration time |error| median {s.time_median * 100:.1f}% "
              f"over {len(s._errs('time_err'))} runs; fits predicted correctly: {ok}/{n}")


def print_validate(s, verbose: bool) -> None:
    t = Table(title="Estimator vs published runs",
              caption="err: |predicted / published - 1|. pub GiB: BLOOM's nvidia-smi readings, "
              "written 'GB', are read as GiB (nvidia-smi's MiB / 1024; the data's "
              "memory_measurement field)")
    # under a calibration profile: each run's 95% interval (formats/published.py), where the
    # run is on the profile's GPU
    calibrated = any(x.interval_low_s is not None for x in s.rows)
    for col in ("run", "pred s", *(("95% interval s",) if calibrated else ()), "pub s", "err",
                "pred GiB", "pub GiB", "err", "OOM pub/pred"):
        t.add_column(col, justify="right" if col != "run" else "left")
    for x in s.rows:
        if x.skipped:
            continue
        oom = "" if x.oom_published is None else (
            f"{'OOM' if x.oom_published else 'ran'}/{'fits' if x.predicted_fits else 'OOM'}")
        iv = ((f"{x.interval_low_s:.2f}-{x.interval_high_s:.2f}"
               if x.interval_low_s is not None else "-",) if calibrated else ())
        t.add_row(x.id, f"{x.predicted_s:.2f}", *iv,
                  f"{x.published_s:.2f}" if x.published_s else "-",
                  f"{x.time_err * 100:.1f}%" if x.time_err is not None else "-",
                  f"{x.predicted_gib:.1f}" if x.predicted_gib else "-",
                  f"{x.published_gib:.0f}" if x.published_gib else "-",
                  f"{x.mem_err * 100:.1f}%" if x.mem_err is not None else "-",
                  oom + ("" if x.oom_ok in (None, True) else " [red]WRONG[/red]"))
        if verbose and x.assumptions:
            t.add_row("  assumed: " + "; ".join(x.assumptions), *[""] * (7 + calibrated))
    con = console()
    con.print(t)
    for x in s.rows:
        if x.skipped:
            con.print(f"skipped {x.id}: {x.skipped}")
    ok, n = s.oom_correct
    con.print(f"iteration time |error|: median {s.time_median * 100:.1f}%, mean "
              f"{s.time_mean * 100:.1f}% over {len(s._errs('time_err'))} runs")
    con.print("  median by source group: " + ", ".join(
        f"{g} {100 * m:.1f}% ({n})" for g, (m, n) in s.group_medians().items()))
    a100 = s.a100()
    if a100.time_median is not None:
        con.print(f"  A100 runs (every group but torchtitan's H100 runs): median "
                  f"{a100.time_median * 100:.1f}% over {len(a100._errs('time_err'))}")
    slope = s.size_trend()
    if slope is not None:
        con.print(f"  error vs model size (Narayanan et al. Table 1): {slope:+.1f} points per "
                  "decade of parameters")
    con.print(f"memory |error|: median {s.mem_median * 100:.1f}%, max "
              f"{s.mem_max * 100:.1f}% over {len(s._errs('mem_err'))} runs (BLOOM: nvidia-smi of "
              "stage 0; torchtitan: the largest over all GPUs)")
    con.print("  median by source group: " + ", ".join(
        f"{g} {100 * m:.1f}% ({n})" for g, (m, n) in s.group_medians("mem_err").items()))
    if a100.mem_median is not None:
        con.print(f"  BLOOM, every reading: median {a100.mem_median * 100:.1f}%, max "
                  f"{a100.mem_max * 100:.1f}% over {len(a100._errs('mem_err'))}")
    conf = s.config_mem_errs("bloom")
    if conf:
        con.print("  BLOOM per configuration (a configuration read more than once: the mean of "
                  f"its readings): median "
                  f"{100 * statistics.median(conf):.1f}%, max {100 * max(conf):.1f}% over "
                  f"{len(conf)}")
    res = s.reserved_mem_errs()
    if res:
        ctx = next(x.predicted_gib - x.predicted_reserved_gib for x in s.rows
                   if x.predicted_reserved_gib is not None)
        con.print("  torchtitan against what its reading counts (the allocator's reserved peak: "
                  f"the prediction less the {ctx:.2g} GiB context): median "
                  f"{100 * statistics.median(res):.1f}%, max {100 * max(res):.1f}% over "
                  f"{len(res)}")
    con.print(f"fits/OOM predicted correctly: {ok}/{n}")


def presets_json(gpus, models, clusters) -> dict:
    return {
        "gpus": {g.name: gpu_to_dict(g) for g in gpus},
        "models": {m.name: {"params_billion": m.total_params / 1e9, **model_to_dict(m)}
                   for m in models},
        "clusters": {c.name: {"nodes": c.num_nodes, "gpus": c.num_gpus} for _n, c in clusters},
    }


def print_presets(gpus, models, clusters) -> None:
    con = console()
    t = Table(title="GPUs (dense TFLOP/s; curve: large-GEMM, attention, HBM fractions, "
              "kernel overhead)")
    for col in ("name", "bf16/fp16", "fp8", "memory GiB", "HBM GB/s", "NVLink GB/s", "SMs",
                "curve"):
        t.add_column(col)
    for g in gpus:
        t.add_row(g.name, str(g.peak_tflops.get("bf16", g.peak_tflops.get("fp16"))),
                  str(g.peak_tflops.get("fp8", "-")), str(g.memory_gib), str(g.hbm_gb_per_s),
                  str(g.nvlink_gb_per_s), str(g.sm_count),
                  f"{g.gemm_efficiency:.2f} / {g.attention_efficiency:.2f} / "
                  f"{g.hbm_efficiency:.2f} / {g.kernel_overhead_us:g} us")
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
    for name, c in clusters:
        t.add_row(name, c.name, str(c.num_nodes), str(c.num_gpus),
                  ", ".join(sorted({n.gpu.name for n in c.nodes})))
    con.print(t)


# ---------------------------------------------------------------------------------------------
# clusters


def cluster_json(c, written, warnings=()) -> dict:
    return {"name": c.name, "latency_us": c.latency_us, "intra_latency_us": c.intra_latency_us,
            "written": str(written) if written else None,
            # a node's GPU-to-GPU matrix where its file or topology gives one (None: every
            # pair at intra_gb_per_s)
            "nodes": [{"name": nd.name, "gpu": nd.gpu.name, "gpus": nd.num_gpus,
                       "intra_gb_per_s": nd.intra_gb_per_s,
                       "intra_matrix_gb_per_s": (None if nd.intra_matrix_gb_per_s is None
                                                 else nd.intra_matrix_gb_per_s.tolist())}
                      for nd in c.nodes],
            "inter_gb_per_s": c.inter_gb_per_s.tolist(), "warnings": list(warnings)}


def print_cluster_summary(c, s, png=None) -> None:
    from formats.bandwidth import GROUP_RATIO, OUTLIER_RATIO

    con = console()
    con.print(f"[bold]{c.name}[/bold]: {c.num_nodes} nodes, {c.num_gpus} GPUs "
              f"({', '.join(sorted({nd.gpu.name for nd in c.nodes}))})")
    con.print(f"latency: {c.latency_us:g} us per message between nodes, "
              f"{c.intra_latency_us:g} us per collective step inside a node", highlight=False)
    kinds: dict = {}  # nodes alike inside: GPU, count, ring, slowest link
    for k in s.get("node_detail", []):
        key = (k["gpu"], k["gpus"], k["intra_gb_per_s"], k.get("intra_min_link_gb_per_s"))
        kinds.setdefault(key, []).append(k["node"])
    for (g, n, ring, low), members in kinds.items():
        inside = ("" if ring is None else f", best ring inside {ring:.4g} GB/s"
                  + ("" if low is None else f", slowest GPU-to-GPU link {low:.4g}"))
        shown = ", ".join(members[:6]) + (f" and {len(members) - 6} more"
                                          if len(members) > 6 else "")
        con.print(f"  {len(members)} node{'s' if len(members) > 1 else ''} of {n} {g}{inside}: "
                  f"{shown}", highlight=False)
    if s.get("intra_outliers"):
        con.print(f"intra-node outliers (best ring < {OUTLIER_RATIO} x the median node's): "
                  + ", ".join(f"{o['node']} ({o['intra_gb_per_s']:.4g} GB/s, "
                              f"{o['ratio']:.2f}x)" for o in s["intra_outliers"]))
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
        dirs = {"both": "", "out": ", sending", "in": ", receiving"}
        con.print(f"outlier nodes (best stream out or in < {OUTLIER_RATIO} x the other nodes' "
                  "best): " + ", ".join(
                      f"{o['node']} ({o['best_gb_per_s']:.2f} GB/s, {o['ratio']:.2f}x"
                      f"{dirs[o['direction']]})" for o in s["outliers"]))
    else:
        con.print("no outlier nodes")
    con.print(f"switch groups (links >= {GROUP_RATIO} x fastest):")
    for g, members in enumerate(s["groups"]):
        extra = [k for k, v in s["attached"].items() if v == g]
        con.print(f"  group {g}: {', '.join(members)}"
                  + (f"  (outliers attached: {', '.join(extra)})" if extra else ""))
    if s.get("unattached"):
        con.print(f"  not attached to a group (their links to two or more groups are alike, "
                  f"so the measurements do not say where they sit): "
                  f"{', '.join(s['unattached'])}", highlight=False)
    if s["asymmetric"]:
        con.print(f"{len(s['asymmetric'])} asymmetric pair(s): " + ", ".join(
            f"{a['a']}/{a['b']} {a['ratio']:.2f}x" for a in s["asymmetric"][:5]))
    if png is not None:
        con.print(f"heatmap written to {png}")
