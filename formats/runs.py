"""The runs `calibrate` fits: each training log paired with the plan it ran, from a plan file
(--plan), or on a named cluster (--cluster) read from the Megatron-LM arguments the log printed
(formats/megatron_args.py), from a torchtitan run's TOML (formats/torchtitan_config.py), from
a Megatron-Bridge run's run_config.yaml (formats/bridge_config.py) or from the configuration a
NeMo 1.x log printed (formats/nemo_config.py).
Either way a Megatron-LM log's printed arguments are checked against the plan, so that a log
is never fitted as the run of another plan."""

from __future__ import annotations

from pathlib import Path

from model.calibration import Run
from model.errors import SpecError
from model.estimator import estimate
from model.fp8 import fp8_label
from model.specs import Options, priced_as

from .bridge_config import bridge_summary_args, plan_from_bridge_config
from .clusters import cluster as load_cluster
from .clusters import hostfile_order
from .logs import LogReading, read_log
from .megatron_args import (loss_unpriced, megatron_args_mismatch, plan_from_megatron_args,
                            vocab_mismatch)
from .nemo_config import load_nemo_config, nemo_printed, plan_from_nemo_config
from .planfile import load_plan, save_plan
from .torchtitan_config import (TORCHTITAN_VERSIONS, plan_from_torchtitan_doc,
                                plan_from_torchtitan_toml, printed_config_doc,
                                torchtitan_logged_mismatch)


def _pick(given: list | None, k: int, n_logs: int, flag: str):
    """The k-th log's entry of an option given once per log or once for all (None if not
    given)."""
    if not given:
        return None
    if len(given) not in (1, n_logs):
        raise SpecError(f"{len(given)} {flag} for {n_logs} logs; give one per log or one for "
                        "all", source="options", field=flag)
    return given[k if len(given) > 1 else 0]


def torchtitan_printed_mismatch(job, plan, cluster, printed: tuple[str, str],
                                source: str) -> list[tuple]:
    """Where the job config a torchtitan log printed (formats/torchtitan_config.py) differs
    from a plan on what the cost model prices: the plan read from the print on the plan's
    cluster, compared field by field (degrees, micro-batch, schedule, recompute, FP8,
    sharding, batch, sequence, compile); (name, printed, planned) each. A print the reader
    refuses is another run than any plan prices: its refusal is the difference."""
    try:
        doc, version = printed_config_doc(*printed, source)
    except SpecError:
        # a print this reader does not take (v0.2.0/v0.2.1's, or one cut short): the plan
        # file stands, checked against the start-up prints (torchtitan_logged_mismatch)
        return []
    try:
        _m, pjob, pplan = plan_from_torchtitan_doc(doc, cluster, version, source)
    except SpecError as e:
        return [(e.field or "job config", str(e).split(": ")[-1], "a priced plan")]
    sh, ps = plan.shape, pplan.shape
    out = [(f, getattr(ps, f), getattr(sh, f)) for f in (
        "tp", "pp", "cp", "dp", "micro_batch", "schedule", "chunks", "recompute", "fp8", "zero")
        if getattr(ps, f) != getattr(sh, f)]
    out += [(f, getattr(pjob, f), getattr(job, f)) for f in (
        "global_batch", "seq_length", "compile", "loss_compiled", "repeat_kv")
        if getattr(pjob, f) != getattr(job, f)]
    return out


def nemo_printed_mismatch(model, job, plan, text: str, source: str) -> list[tuple]:
    """Where the configuration a NeMo 1.x log printed differs from a plan
    (megatron_args_mismatch on its settings in Megatron-LM's names); a print that is not a
    whole configuration leaves the plan file standing."""
    try:
        printed = nemo_printed(load_nemo_config(text, source), source, strict=False)
    except SpecError:
        return []
    return megatron_args_mismatch(model, job, plan, printed)


def check_logged_args(reading: LogReading, model, job, plan, plan_label: str,
                      cluster=None) -> None:
    """A Megatron-LM log whose printed arguments (any of its blocks: restarts print their
    own), a Megatron-Bridge log's configuration summary, a NeMo 1.x log's printed
    configuration, a torchtitan log whose start-up
    prints (model size, batch, sequence, mesh) or a DeepSpeed log whose engine configuration
    (batch, micro-batch, ZeRO stage) differ from the plan on what the cost model prices is the
    log of another run: one line naming the log and the first differences."""
    diffs = [megatron_args_mismatch(model, job, plan, logged)
             + vocab_mismatch(model, plan, logged, reading.padded_vocab)
             for logged in reading.megatron_args]
    diffs += [torchtitan_logged_mismatch(model, job, plan, logged)
              for logged in reading.torchtitan_settings]
    diffs.append(deepspeed_config_mismatch(job, plan, reading.deepspeed_config))
    diffs += [megatron_args_mismatch(model, job, plan, bridge_summary_args(summary))
              for summary in reading.bridge_summaries]
    diffs += [nemo_printed_mismatch(model, job, plan, text, reading.path)
              for text in reading.nemo_configs]
    if cluster is not None:
        diffs += [torchtitan_printed_mismatch(job, plan, cluster, printed, reading.path)
                  for printed in reading.torchtitan_configs]
    for diff in diffs:
        if diff:
            said = "; ".join(f"{n} {a} in the log, {b} in the plan" for n, a, b in diff[:3])
            more = f" (and {len(diff) - 3} more)" if len(diff) > 3 else ""
            raise SpecError(f"the run differs from its plan ({plan_label}): {said}{more}; pair "
                            "each log with the plan file of the run it logged (estimate "
                            "--save-plan with the run's settings), and split a log whose "
                            "restarts ran other arguments", source=reading.path,
                            field=diff[0][0])


def deepspeed_config_mismatch(job, plan, printed: dict[str, int]) -> list[tuple]:
    """Where DeepSpeed's printed engine configuration (deepspeed/runtime/config.py
    DeepSpeedConfig.print: the values that ran) differs from the plan: its global and
    micro-batch and its ZeRO stage; (name, printed, planned) each."""
    want = {"train_batch_size": job.global_batch,
            "train_micro_batch_size_per_gpu": plan.shape.micro_batch,
            "zero_optimization_stage": plan.shape.zero}
    return [(k, printed[k], v) for k, v in want.items() if k in printed and printed[k] != v]


def plan_from_log(reading: LogReading, cluster_name: str, hostfile: Path | None,
                  run_config: Path | None = None, version: str | None = None):
    """(model, job, cluster, plan, the settings read in Megatron-LM's names or None) of a
    log's run on the named cluster, ranks over its nodes in
    the hostfile's order where one is given: a Megatron-LM log's from the arguments it printed
    (its last block: a restart's), a torchtitan log's from the TOML it was launched with
    (`run_config`, torchtitan release `version`, 0.2 by default) or else from the job config
    it printed (its last; the release its format says), a Megatron-Bridge log's from
    its run_config.yaml (`run_config`), a NeMo 1.x log's from the configuration it printed (its
    last: a restart's)."""
    printed_titan = reading.framework == "torchtitan" and run_config is None
    if printed_titan and not reading.torchtitan_configs:
        raise SpecError("torchtitan's log prints neither its batch nor its layout unless [job] "
                        "print_config (v0.1: print_args) is set; give --run-config (the TOML "
                        "the run was launched with) or --plan", source=reading.path,
                        field="log")
    bridge = reading.framework == "megatron" and run_config is not None
    if reading.framework not in ("torchtitan", "megatron") and run_config is not None:
        raise SpecError(f"--run-config is the TOML of a torchtitan run or the run_config.yaml "
                        f"of a Megatron-Bridge run; this is a {reading.framework} log",
                        source=reading.path, field="--run-config")
    if bridge and version is not None:
        raise SpecError("--framework-version is torchtitan's release; a Megatron-Bridge run "
                        "config carries its own", source=reading.path,
                        field="--framework-version")
    if version is not None and reading.framework != "torchtitan":
        raise SpecError(f"--framework-version is torchtitan's release (read with its TOML); "
                        f"this is a {reading.framework} log", source=reading.path,
                        field="--framework-version")
    nemo = reading.framework == "nemo" and bool(reading.nemo_configs)
    if reading.framework != "torchtitan" and not reading.megatron_args and not bridge \
            and not nemo:
        raise SpecError("no Megatron-LM arguments block in the log (its start-up print of "
                        "'---- arguments ----') nor NeMo 1.x experiment configuration; give "
                        "--plan for it, or for a Megatron-Bridge run --run-config (a "
                        "checkpoint's iter_N/run_config.yaml)",
                        source=reading.path, field="log")
    c = load_cluster(cluster_name)
    order = hostfile_order(hostfile, c) if hostfile else None
    if bridge:
        m, job, pl, settings = plan_from_bridge_config(run_config, c, node_order=order)
    elif nemo:
        m, job, pl, settings = plan_from_nemo_config(reading.nemo_configs[-1], c,
                                                     source=reading.path,
                                                     vocab=reading.padded_vocab,
                                                     node_order=order)
    elif run_config is not None:
        m, job, pl = plan_from_torchtitan_toml(run_config, c, version or TORCHTITAN_VERSIONS[0],
                                               node_order=order)
        settings = None
    elif printed_titan:  # the whole job config the run printed (its last: a restart's)
        doc, printed_version = printed_config_doc(*reading.torchtitan_configs[-1],
                                                  reading.path)
        if version is not None and version != printed_version:
            raise SpecError(f"the log printed torchtitan {printed_version}'s job config; "
                            f"--framework-version {version} contradicts it",
                            source=reading.path, field="--framework-version")
        m, job, pl = plan_from_torchtitan_doc(doc, c, printed_version, reading.path,
                                              node_order=order)
        settings = None
    else:
        settings = reading.megatron_args[-1]
        m, job, pl = plan_from_megatron_args(settings, c, source=reading.path,
                                             vocab=reading.padded_vocab,
                                             deepspeed_zero=reading.deepspeed_zero,
                                             deepspeed_layers=reading.deepspeed_layers,
                                             node_order=order)
    return m, job, c, pl, settings


def _not_a_plan_file(log) -> None:
    """A plan file where a log belongs (`--plan P1 P2`: typer takes P2 as a LOG) is named as
    such, not read as a log without a training line."""
    try:
        with open(log, "rb") as f:
            head = f.read(4096)
    except OSError:
        return  # read_log names the problem
    if head.lstrip().startswith(b"{") and b'"pipette-plan"' in head:
        raise SpecError("is a plan file, not a training log: give each plan with its own "
                        "--plan (--plan P1 --plan P2), in the order of the logs", source=str(log),
                        field="LOG")


def memory_stages(reading: LogReading, plan, cluster):
    """The pipeline stages the log's memory readings are of, for the fit (model.calibration.Run
    .memory_stage): the reader's own (NeMo's: stage 0), else those of the ranks that printed
    them (a tuple), else None, the largest stage's (every rank printed: lines without a rank).
    Megatron-LM's order (tp-cp-ep-dp-pp, megatron/core/parallel_state.py) and torchtitan's mesh
    (pp outermost, torchtitan/distributed/parallel_dims.py) both give rank r the stage
    r // (GPUs / PP); Megatron-LM's --use-tp-pp-dp-mapping (tp-cp-ep-pp-dp) the stage
    (r // (TP x CP)) mod PP. A local rank is torchrun's on every node the log holds the
    output of. A rank the plan's GPUs do not have is refused: the log is another run's."""
    if reading.memory_stage is not None or not reading.memory_ranks:
        return reading.memory_stage
    kind, ranks = reading.memory_ranks
    world, gpn = cluster.num_gpus, cluster.gpus_per_node
    if max(ranks) >= world:  # a torchrun prefix past a node's GPUs is a global rank
        raise SpecError(f"its memory lines come from rank {max(ranks)}, and its plan runs "
                        f"{world} GPUs; pair each log with the plan file of the run it logged",
                        source=reading.path, field="memory")
    if plan.shape.pp == 1:
        return reading.memory_stage
    sh = plan.shape
    per_stage = world // sh.pp
    if kind == "local" and gpn and world > gpn and max(ranks) < gpn:
        ranks = [k * gpn + r for k in range(world // gpn) for r in ranks]
    # --use-tp-pp-dp-mapping (order tp-cp-ep-pp-dp): the stage sits inside the replica
    tp_pp_dp = any(b.get("use_tp_pp_dp_mapping") == "True" for b in reading.megatron_args)
    stages = tuple(sorted({(r // (sh.tp * sh.cp)) % sh.pp if tp_pp_dp else r // per_stage
                           for r in ranks}))
    return None if len(stages) == plan.shape.pp else stages


def _version_against_plan(reading: LogReading, job, version: str, plan_file) -> None:
    """--framework-version beside --plan: the plan fixes the release it was priced for
    (torchtitan's 0.1 repeats K and V: JobSpec.repeat_kv, as cli.py's _inputs sets it), so a
    release of another framework than the log's, or another than the plan's, is refused (it
    had been ignored)."""
    if reading.framework != "torchtitan":
        raise SpecError(f"--framework-version {version} is torchtitan's release; this is a "
                        f"{reading.framework} log, whose plan file {plan_file} fixes the run: "
                        "drop it", source=reading.path, field="--framework-version")
    if version not in TORCHTITAN_VERSIONS:
        raise SpecError(f"torchtitan's releases are {', '.join(TORCHTITAN_VERSIONS)}, not "
                        f"{version!r}", source="options", field="--framework-version")
    priced = "0.1" if job.repeat_kv else TORCHTITAN_VERSIONS[0]
    if version != priced:
        raise SpecError(f"--framework-version {version}, but the plan file {plan_file} was "
                        f"priced for torchtitan {priced}: drop it, or estimate the plan with "
                        f"--framework-version {version} and --save-plan it again",
                        source=reading.path, field="--framework-version")


def calibration_runs(logs: list, plans: list | None = None, clusters: list | None = None,
                     hostfiles: list | None = None, save_plans: Path | None = None,
                     run_configs: list | None = None, version: str | None = None):
    """(runs, readings): a Run per log, and per log (its LogReading, the plan's global batch,
    the plan read from it or None). `plans` (plan files) or `clusters` (with optional
    `hostfiles`, torchtitan `run_configs` and `version`, and `save_plans`, a folder for the
    plans read), each once per log or once for all."""
    if bool(plans) == bool(clusters):  # neither had been told 'not both' too
        raise SpecError("give --plan (the plan file each log ran), or --cluster to read each "
                        "log's plan from the settings it printed" + ("; not both" if plans else
                                                                     ": neither was given"),
                        source="options", field="--plan" if plans else "--plan/--cluster")
    if (hostfiles or save_plans or run_configs) and not clusters:
        flag = "--hostfile" if hostfiles else "--save-plans" if save_plans else "--run-config"
        raise SpecError(f"{flag} goes with --cluster (the plans are read from the logs then)",
                        source="options", field=flag)
    twice = [x for k, x in enumerate(logs) if any(Path(x).resolve() == Path(y).resolve()
                                                  for y in logs[:k])]
    if twice:
        raise SpecError(f"{twice[0]} is given more than once; each run counts once in the fit "
                        "(twice, it would shrink the uncertainty as if measured again)",
                        source="options", field="LOG")
    runs, readings, to_save = [], [], []
    seen: dict = {}  # each log's readings -> its name: a copy of a log is the same run
    for k, log in enumerate(logs):
        plan_file = _pick(plans, k, len(logs), "--plan")
        cluster_name = _pick(clusters, k, len(logs), "--cluster")
        hosts = _pick(hostfiles, k, len(logs), "--hostfile")
        run_config = _pick(run_configs, k, len(logs), "--run-config")
        _not_a_plan_file(log)
        reading = read_log(log)
        same = seen.setdefault((reading.framework, tuple(reading.values)), str(log))
        if same != str(log):
            raise SpecError(f"the same readings as {same} (a copy of one run's log?); each run "
                            "counts once in the fit", source=str(log), field="log")
        settings = None
        if plan_file:
            m, job, c, pl, opts, meta = load_plan(plan_file)
            if version is not None:
                _version_against_plan(reading, job, version, plan_file)
            if meta["calibrated_cluster"]:
                raise SpecError("this plan file (schema 2) holds a cluster already scaled by "
                                "a calibration profile; a fit on it would scale twice: "
                                "re-create the plan without --calibration", source=str(plan_file),
                                field="calibration")
            described = None
        else:
            m, job, c, pl, settings = plan_from_log(reading, cluster_name, hosts, run_config,
                                                    version)
            opts, described = Options(), pl.shape.describe() + fp8_label(job, pl.shape)
            if save_plans:  # written once every log has been read (none on an error)
                written = Path(save_plans) / f"{Path(log).name}.plan.json"
                to_save.append((written, m, job, c, pl, opts))
                described += f" (saved to {written})"
        check_logged_args(reading, m, job, pl, str(plan_file) if plan_file
                          else "read from the run's own settings", cluster=c)
        # the framework that printed the log ran the plan: a plan priced for another one
        # would have the fit absorb the frameworks' difference into the cost parameters
        ran = priced_as(reading.framework)
        if plan_file and ran != job.framework:
            raise SpecError(f"the log is {reading.framework}'s, but its plan {plan_file} was "
                            f"priced for {job.framework}: estimate the plan with --framework "
                            f"{ran} and --save-plan it again", source=str(log), field="log")
        # a loss fused by Transformer Engine: its memory is not priced, so not fitted
        kind = reading.memory_kind
        if kind and any(loss_unpriced(s) for s in
                        reading.megatron_args + ([settings] if settings else [])):
            kind += ", TE fused loss: not fitted"
        readings.append((reading, job.global_batch, described))
        runs.append(Run(m, job, c, pl, opts, reading.iteration_s(
            job.global_batch, job.seq_length, c.num_gpus), reading.memory_gib,
            kind, label=Path(log).name, memory_stage=memory_stages(reading, pl, c)))
    for written, m, job, c, pl, opts in to_save:
        save_plan(written, m, job, c, pl, estimate(m, job, c, pl, opts), options=opts)
    return runs, readings
