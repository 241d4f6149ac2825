"""Calibration to the user's cluster: log readers on excerpts in each framework's own format,
the fit recovering known parameters from synthetic logs, prediction intervals, the profile
file and the CLI."""

import dataclasses
import json
import math
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from formats import presets
from formats.clusters import uniform_cluster
from formats.logs import WARMUP_READINGS, megatron_arg_blocks, read_log
from formats.planfile import save_plan
from formats.profile import load_profile, save_profile
from model.calibration import Run, _predict, apply_profile, fit, interval_s
from model.errors import SpecError
from model.estimator import make_plan
from model.specs import JobSpec, Options
from render import log_reading_dict

LOGS = Path(__file__).parent / "fixtures" / "logs"


def _megatron_timing_64() -> str:
    """The Megatron-LM fixture's timing and memory lines for a 64-GPU plan (the argument
    blocks of megatron_args_70b.txt): its second memory line from rank 48 (stage 3 at PP 4),
    not 96, which such a plan does not have."""
    return (LOGS / "megatron.log").read_text().replace("[Rank 96]", "[Rank 48]")


def _log_text(lines) -> str:
    """A log's text from its lines, each ended as a framework's logger ends it."""
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name,framework,median_s,mem", [
    ("megatron", "megatron", 43.48, 75.0),       # max reserved over ranks, MB / 1024
    # printed by Megatron-LM d98e8a6's own training loop functions (run_megatron_log.py)
    ("megatron_train", "megatron", 43.6229, 74650 / 1024),
    ("torchtitan", "torchtitan", 256 * 4096 / (6005.5 * 128), 61.27),
    # printed by torchtitan v0.2.2's own MetricsProcessor.log under torchrun (run_torchtitan_log)
    ("torchtitan_metrics", "torchtitan", 256 * 4096 / (6059 * 128), 61.27),
    ("nemo", "nemo", 43.52, None),
    # NeMo 1.x's TQDM bar (bench/upstream/run_nemo1_log.py): each step's last refresh, by
    # the bar's count; max_memory_reserved in bytes, 3 significant digits
    ("nemo1_bar", "nemo", 43.3, 7.83e10 / 2 ** 30),
    # the same run with exp_manager.log_delta_step_timing: NeMo's logger lines, full precision
    ("nemo1_delta", "nemo", 43.284, 7.83e10 / 2 ** 30),
    # the same run shown by NeMo 2's ProgressPrinter: its '| metric: value' line, memory bytes
    ("nemo2_printer", "nemo", 43.28, 78299996160 / 2 ** 30),
    # ... and by NeMo 2's MegatronProgressBar: one refresh per step, a step late, 3 digits
    ("nemo2_bar", "nemo", 43.1, 7.83e10 / 2 ** 30),
    ("deepspeed", "deepspeed", 256 / 5.86, 61.4),
    # its pipeline engine's 'iter time (s)' read over the ThroughputTimer's lines of the steps
    ("deepspeed_pipe", "deepspeed", 43.51, 61.4),
    # Megatron-Bridge: Megatron's iteration line, memory in GB (10^9 bytes) by named key
    ("megatron_bridge", "megatron", 43.48, 80.531e9 / 2 ** 30),
    # printed by Megatron-Bridge 067f987's own training_log (run_bridge_log.py)
    ("megatron_bridge_train", "megatron", 43.6229, 80.531e9 / 2 ** 30),
])
def test_readers_on_each_frameworks_format(name, framework, median_s, mem):
    """Warm-up readings are skipped; the median of the rest is the iteration time for the
    paired job (here global batch 256, sequence 4096, 128 GPUs)."""
    r = read_log(LOGS / f"{name}.log")
    assert r.framework == framework and r.skipped == WARMUP_READINGS
    assert r.iteration_s(256, 4096, 128) == pytest.approx(median_s, rel=1e-3)
    assert r.memory_gib == (pytest.approx(mem) if mem is not None else None)


def test_bridge_configuration_summary_is_checked_against_the_plan(tmp_path):
    """Megatron-Bridge's configuration summary (log_non_default_values), as Bridge 067f987
    printed it for the recipe emitted for the 70B plan (fixtures/logs/README.md), read from a
    log: its plan file passes calibrate's check; a plan differing in a value the summary prints
    (TP, recompute) or in one it leaves at Megatron Core's default (interleaving) is another
    run's. The same log with its run_config.yaml passes too."""
    from formats.clusters import cluster as load_cluster
    from model.estimator import estimate

    log = tmp_path / "bridge.log"
    log.write_text((LOGS / "bridge_summary_70b.txt").read_text()
                   + (LOGS / "megatron_bridge.log").read_text())
    r = read_log(log)
    assert len(r.bridge_summaries) == 1
    got = r.bridge_summaries[0]
    assert (got["model.tensor_model_parallel_size"], got["model.normalization"],
            got["train.global_batch_size"], got["dataset.seq_length"]) == \
        ("8", "'RMSNorm'", "256", "4096")
    ex = load_cluster("example")
    l70 = presets.model("llama2-70b")
    job = JobSpec(global_batch=256, seq_length=4096)
    kw = dict(pp=4, sequence_parallel=True, distributed_optimizer=True)
    runner = CliRunner()
    out = tmp_path / "cal.json"
    for name, knobs, code in (("ran", dict(tp=8, recompute="selective", layers=(20,) * 4), 0),
                              ("tp", dict(tp=4, recompute="selective"), 2),
                              ("recompute", dict(tp=8, recompute="full"), 2),
                              ("vp", dict(tp=8, recompute="selective", schedule="interleaved",
                                          chunks=2), 2)):
        plan = make_plan(l70, job, ex, **knobs, **kw)
        pf = tmp_path / f"{name}.json"
        save_plan(pf, l70, job, ex, plan, estimate(l70, job, ex, plan), options=Options())
        res = runner.invoke(app, ["calibrate", str(log), "--plan", str(pf), "--out", str(out)])
        assert res.exit_code == code, (name, res.output)
        if code:
            assert "differs from its plan" in res.output, res.output
    res = runner.invoke(app, ["calibrate", str(log), "--cluster", "example", "--run-config",
                              str(LOGS / "bridge_run_config_70b.yaml"), "--out", str(out)])
    assert res.exit_code == 0, res.output


def test_bridge_log_as_bridge_prints_it(tmp_path):
    """A Megatron-Bridge log printed by Bridge's own code (megatron_bridge_train.log, from the
    recipe emitted for the 70B plan; fixtures/logs/README.md): its configuration summary, its
    'Step Time' and iteration lines, its memory lines in GB. Unlike Megatron-LM's, its first
    log resets the timer: iteration 2 prints step 2 alone. Paired with the plan it was emitted
    for, calibrate takes it; with a plan of another TP, the summary tells them apart."""
    from formats.clusters import cluster as load_cluster
    from model.estimator import estimate

    log = LOGS / "megatron_bridge_train.log"
    r = read_log(log)
    assert len(r.bridge_summaries) == 1 and r.padded_vocab == 32000
    assert r.memory_kind == "reserved" and len(r.values) == 12 - WARMUP_READINGS
    assert "elapsed time per iteration (ms): 43217.1" in log.read_text()
    ex = load_cluster("example")
    l70 = presets.model("llama2-70b")
    job = JobSpec(global_batch=256, seq_length=4096)
    runner = CliRunner()
    for tp, code in ((8, 0), (4, 2)):
        plan = make_plan(l70, job, ex, tp=tp, pp=4, recompute="selective", zero=1)
        pf = tmp_path / f"tp{tp}.json"
        save_plan(pf, l70, job, ex, plan, estimate(l70, job, ex, plan), options=Options())
        res = runner.invoke(app, ["calibrate", str(log), "--plan", str(pf), "--fit",
                                  "gemm_scale", "--out", str(tmp_path / "c.json")])
        assert res.exit_code == code, (tp, res.output)
    assert "tensor_model_parallel_size 8 in the log, 4 in the plan" in res.output


def test_bridge_documented_iteration_line(tmp_path):
    """The iteration line as Megatron-Bridge's own documentation prints it (docs/training/
    multi-token-prediction.md at 067f987, verbatim, with its extra loss columns), six steps of
    it: read as Megatron-LM's, at its printed global batch."""
    line = ("iteration      100/  300000 | consumed samples:         3200 | elapsed time per "
            "iteration (ms): 3738.6 | learning rate: 6.000000E-05 | global batch size:    32 | "
            "lm loss: 7.968678E+00 | load_balancing_loss: 1.329517E+00 | mtp_1 loss: "
            "7.925096E+00 | loss scale: 1.0 | grad norm: 1.040 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |")
    p = tmp_path / "bridge_doc.log"
    p.write_text(_log_text(line.replace("iteration      100/", f"iteration {100 * k:8d}/")
                           for k in range(1, 7)))
    r = read_log(p)
    assert r.framework == "megatron" and r.skipped == WARMUP_READINGS
    assert r.values == [3.7386] * 3 and r.batches == [32] * 3
    assert r.iteration_s(32, 4096, 8) == pytest.approx(3.7386)


@pytest.mark.parametrize("gz", [False, True])
def test_a_last_line_without_its_line_end_is_left_out_and_said(tmp_path, gz):
    """A log copied while the job still writes it ends in the middle of a line: Megatron-LM's
    'elapsed time per iteration (ms): 38' of what became 3850.2, torchtitan's 'tps: 9,2' of
    9,1xx. That line is left out (it would be read as a reading 100x off) and the reading
    says so; the same log with its line end keeps it (plain text and gzip)."""
    import gzip
    for name, cut in (("megatron.log", "elapsed time per iteration (ms):"),
                      ("torchtitan.log", "tps:")):
        lines = (LOGS / name).read_text().splitlines()
        last = max(i for i, x in enumerate(lines) if cut in x)
        whole = read_log(LOGS / name)
        partial = lines[:last] + [lines[last][:lines[last].index(cut) + len(cut) + 3]]
        for text, unfinished in (("\n".join(partial), True),
                                 ("\n".join(lines[:last + 1]) + "\n", False)):
            p = tmp_path / (name + (".gz" if gz else ""))
            p.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
            r = read_log(p)
            assert r.unfinished_line is unfinished
            assert r.values == whole.values[:len(r.values)]
            assert len(r.values) == len(whole.values) - (1 if unfinished else 0) - sum(
                cut in x for x in lines[last + 1:])
            d = log_reading_dict(r, 256 if name == "megatron.log" else 32)
            assert d["unfinished_last_line_left_out"] is unfinished
    # too few readings once it is left out: the refusal says why, not only "log more"
    lines = (LOGS / "megatron.log").read_text().splitlines()
    timing = [k for k, x in enumerate(lines) if "elapsed time per iteration" in x]
    p = tmp_path / "few.log"
    from formats.logs import MIN_READINGS
    last = timing[WARMUP_READINGS + MIN_READINGS - 1]
    p.write_text("\n".join(lines[:last + 1]))
    with pytest.raises(SpecError) as e:
        read_log(p)
    assert "last line has no line end" in str(e.value)
    p.write_text("\n".join(lines[:last + 1]) + "\n")
    assert len(read_log(p).values) == MIN_READINGS


def test_bridge_memory_without_reserved_keys_is_reported_not_fitted(tmp_path):
    """A Megatron-Bridge run whose memory_keys leave out the reserved peak: its allocated
    peak is read as allocated (reported; calibration fits fragmentation on reserved only)."""
    text = (LOGS / "megatron_bridge.log").read_text()
    p = tmp_path / "bridge.log"
    p.write_text(text.replace("mem-max-reserved-gigabytes", "mem-other-gigabytes"))
    r = read_log(p)
    assert r.memory_kind == "allocated"
    assert r.memory_gib == pytest.approx(75.223e9 / 2 ** 30)
    assert read_log(LOGS / "megatron_bridge.log").memory_kind == "reserved"


def test_nemo1_bar_reads_each_steps_own_refresh(tmp_path):
    """NeMo 1.x's progress bar refreshes twice a step (Lightning's _update_n with the last
    step's postfix, then set_postfix with its own): each step is read once, from the last line
    at its count (count 4 shows step 2's 43.90 s, then step 3's 42.90 s). NeMo 2's bar
    refreshes once a step, with the last step's metrics: each read one count late. Its memory
    is rank 0's: stage 0's."""
    r = read_log(LOGS / "nemo1_bar.log")
    assert r.values == pytest.approx([42.9, 42.7, 43.5, 43.8, 43.4, 42.9, 43.3, 44.1, 42.9])
    assert r.processes == 1 and r.memory_kind == "reserved" and r.memory_stage == 0
    text = (LOGS / "nemo1_bar.log").read_text()
    p = tmp_path / "once.log"
    seen, kept = set(), []
    for part in text.replace("\n", "\r").split("\r"):
        count = re.search(r"\| (\d+)/12 \[", part)
        if count and count.group(1) in seen:
            continue
        seen.add(count.group(1)) if count else None
        kept.append(part)
    p.write_text("\r".join(kept) + "\n")
    r = read_log(p)
    # counts 2-12 carry steps 0-10; counts 2-4 are the warm-up
    assert r.values == pytest.approx([42.9, 42.7, 43.5, 43.8, 43.4, 42.9, 43.3, 44.1])
    # a restart: the bar's count starts again, a process of its own, warmed up again
    p.write_text(text + text)
    r = read_log(p)
    assert r.processes == 2 and len(r.values) == 18


def _paired(tmp_path, log, model, job, cluster, plans) -> list[tuple[int, str]]:
    """`calibrate LOG --plan P` for each plan (saved as a plan file): (exit code, output)."""
    from model.estimator import estimate

    got = []
    for k, plan in enumerate(plans):
        pf = tmp_path / f"paired{k}.json"
        save_plan(pf, model, job, cluster, plan, estimate(model, job, cluster, plan),
                  options=Options())
        res = CliRunner().invoke(app, ["calibrate", str(log), "--plan", str(pf), "--fit",
                                       "gemm_scale", "--out", str(tmp_path / "paired.json")])
        got.append((res.exit_code, res.output))
    return got


def test_deepspeed_engine_log_from_deepspeeds_own_code(tmp_path):
    """The log DeepSpeed's own code prints for an emitted ds_config.json (configuration print,
    ThroughputTimer every steps_per_print = 10 steps: fixtures/logs/README.md): 8 readings, 3 of
    them warm-up, the iteration time global batch / samples per second; its configuration
    agrees with the emitted plan's file and not with one of another ZeRO stage."""
    from formats.clusters import cluster as load_cluster

    log = LOGS / "deepspeed_engine.log"
    r = read_log(log)
    assert r.framework == "deepspeed" and r.skipped == WARMUP_READINGS and len(r.values) == 5
    assert r.deepspeed_config == {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1,
                                  "gradient_accumulation_steps": 4,
                                  "zero_optimization_stage": 1}
    assert r.iteration_s(256, 4096, 64) == pytest.approx(5.5, rel=0.01)
    ex = load_cluster("example")
    m = presets.model("llama2-7b")
    job = JobSpec(global_batch=256, seq_length=4096, framework="deepspeed")
    got = _paired(tmp_path, log, m, job, ex, [
        make_plan(m, job, ex, tp=1, pp=1, zero=zero, recompute="full") for zero in (1, 2)])
    assert [code for code, _out in got] == [0, 2], got
    assert "zero_optimization_stage 1 in the log, 2 in the plan" in got[1][1]


def test_rank0_memory_fits_fragmentation_on_stage_0():
    """A memory reading of rank 0 only (NeMo 1.x) is compared with pipeline stage 0's
    tensors, not with the largest stage's: the fitted fragmentation is the reading over stage
    0's tensors, less 1."""
    from formats.clusters import cluster as load_cluster
    from model.estimator import estimate
    c = load_cluster("example")
    m = presets.model("llama2-70b")
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(m, job, c, tp=8, pp=4, recompute="full", sequence_parallel=True,
                     layers=(17, 21, 21, 21))
    est = estimate(m, job, c, plan)
    tensors = [st.memory.total_gib - st.memory.allowance_gib for st in est.stages]
    assert tensors[0] != max(tensors)
    t = est.iteration_ms / 1e3
    got = {}
    for stage in (0, None, (0, 2)):
        runs = [Run(m, job, c, plan, Options(), t * (1 + 0.01 * k),
                    memory_gib=1.1 * max(tensors), memory_kind="reserved", label=f"r{k}",
                    memory_stage=stage)
                for k in range(3)]
        prof, _ = fit(runs, ("gemm_scale",), c.nodes[0].gpu.name)
        got[stage] = prof.values["fragmentation"]
    assert got[None] == pytest.approx(0.1, abs=1e-6)
    assert got[0] == pytest.approx(1.1 * max(tensors) / tensors[0] - 1, abs=1e-6) != got[None]
    two = max(tensors[0], tensors[2])
    assert got[(0, 2)] == pytest.approx(1.1 * max(tensors) / two - 1, abs=1e-6)


def test_memory_is_fitted_on_the_stages_of_the_ranks_that_printed(tmp_path):
    """A memory reading is compared with the stages of the ranks that printed it: torchtitan's
    torchrun prefix (local ranks: on every node of the log), Megatron-LM's own `[Rank N]`
    (global). A PP 4 torchtitan job logged from `[rank63]:` (the last stage's, where the loss
    is) had been fitted as the largest stage's: fragmentation 0 for a true 0.2."""
    from types import SimpleNamespace as NS

    from formats.runs import memory_stages
    text = (LOGS / "torchtitan.log").read_text()
    p = tmp_path / "r63.log"
    p.write_text(text.replace("[rank0]:", "[rank63]:"))
    r = read_log(p)
    assert r.memory_ranks == ("local", (63,))
    cluster = NS(num_gpus=64, gpus_per_node=8)
    plan = NS(shape=NS(pp=4, tp=1, cp=1))
    assert memory_stages(r, plan, cluster) == (3,)  # 63 >= 8: torchrun given a global rank
    r.memory_ranks = ("local", (7,))  # local rank 7 of each of the 8 nodes: every stage
    assert memory_stages(r, plan, cluster) is None
    r.memory_ranks = ("local", (1,))
    assert memory_stages(r, NS(shape=NS(pp=16, tp=1, cp=1)), cluster) == tuple(range(0, 16, 2))
    mg = read_log(LOGS / "megatron.log")
    assert memory_stages(mg, NS(shape=NS(pp=4, tp=8, cp=1)),
                         NS(num_gpus=128, gpus_per_node=8)) == (0, 3)
    # with --use-tp-pp-dp-mapping the stage sits inside the replica: ranks 0 and 96 at TP 8 are
    # stages 0 and (96 // 8) mod 4 = 0 (it had taken the default order's rule)
    mg.megatron_args = [{"use_tp_pp_dp_mapping": "True"}]
    assert memory_stages(mg, NS(shape=NS(pp=4, tp=8, cp=1)),
                         NS(num_gpus=128, gpus_per_node=8)) == (0,)
    # a rank the plan does not have: the log is another run's (it had been read as the
    # largest stage's), whatever the plan's PP
    for pp in (4, 1):
        with pytest.raises(SpecError) as e:
            memory_stages(mg, NS(shape=NS(pp=pp, tp=8, cp=1)), NS(num_gpus=64,
                                                                 gpus_per_node=8))
        assert e.value.field == "memory" and "rank 96" in str(e.value) and "64 GPUs" in str(
            e.value)
    # unprefixed lines: every rank printed, the largest stage's
    q = tmp_path / "bare.log"
    q.write_text(text.replace("[rank0]:", ""))
    assert read_log(q).memory_ranks is None and memory_stages(read_log(q), plan, cluster) is None


def test_restarted_log_warms_up_again():
    """An in-job restart from the step-10 checkpoint (NeMo's resiliency notebook's pattern):
    the iteration number falls back, and the restarted process's first readings are warm-up
    too (58.9, 45.2 and 43.7 s here), not iteration times."""
    r = read_log(LOGS / "nemo_restart.log")
    assert r.framework == "nemo" and r.processes == 2
    assert r.skipped == 2 * WARMUP_READINGS
    assert r.values == pytest.approx([43.55, 43.49, 43.52, 43.50, 43.57, 43.48, 43.53, 43.51,
                                      43.56, 43.49, 43.54, 43.50, 43.52,
                                      43.53, 43.55, 43.49, 43.51, 43.58, 43.50, 43.54])


def test_torchtitan_validation_lines_are_not_steps():
    """torchtitan's `validate step:` lines (forward only: tps about 18,200 here, their own
    memory peak, 48.6 GiB) are neither timing readings nor the training memory peak, nor a
    restart (their step repeats the last). The log is torchtitan v0.2.2's own MetricsProcessor
    validating every 5 steps (run_torchtitan_log.py --validate 5)."""
    r = read_log(LOGS / "torchtitan_validation.log")
    assert r.validation_lines == 2 and r.processes == 1 and r.skipped == WARMUP_READINGS
    assert r.values == [6125, 6009, 6090, 6095, 6150, 6161, 6169, 6193, 6099]
    assert r.memory_gib == pytest.approx(61.27)


def test_ranks_and_start_lines_are_processes_of_their_own(tmp_path):
    """Two ranks' lines interleaved under torchrun's `[rankN]:` prefixes warm up apart; a
    Megatron-LM job resumed from a checkpoint (its start-of-training line, then iterations above
    the last) warms up again; ranks printing the same step without a prefix are one process."""
    one = read_log(LOGS / "torchtitan.log")
    lines = (LOGS / "torchtitan.log").read_text().splitlines()
    p = tmp_path / "two_ranks.log"
    p.write_text(_log_text(x for line in lines
                           for x in (line, line.replace("[rank0]:", "[rank1]:", 1))))
    r = read_log(p)
    assert r.processes == 2 and r.skipped == 2 * WARMUP_READINGS
    assert sorted(r.values) == sorted(one.values * 2)
    text = (LOGS / "megatron.log").read_text()
    resumed = re.sub(r"iteration\s+(\d+)/",
                     lambda m: f"iteration {int(m.group(1)) + 50:8d}/", text)
    assert resumed != text
    p.write_text(text + resumed)
    r = read_log(p)
    m1 = read_log(LOGS / "megatron.log")
    assert r.processes == 2 and sorted(r.values) == sorted(m1.values * 2)
    # under torchrun's prefixes Megatron-LM's start line is rank 0's (print_rank_0) and the
    # iterations the last rank's (print_rank_last): the start line resumes the whole job
    # (it had resumed rank 0 only, so the resumed job's warm-up was fitted as iteration time)
    def ranked(t):
        return "\n".join(("[rank0]:" if "before the start" in ln else "[rank63]:") + ln
                         for ln in t.splitlines())
    p.write_text(ranked(text) + "\n" + ranked(resumed) + "\n")
    r = read_log(p)
    assert r.processes == 2 and sorted(r.values) == sorted(m1.values * 2)
    # DeepSpeed's timer prints on every rank, without a prefix: each step's lines repeat, one
    # process, and every rank's line of the warm-up steps is skipped
    ds = read_log(LOGS / "deepspeed.log")
    p.write_text(_log_text(x for line in (LOGS / "deepspeed.log").read_text().splitlines()
                           for x in [line] * 4))
    r = read_log(p)
    assert r.processes == 1 and r.skipped == 4 * WARMUP_READINGS
    assert sorted(r.values) == sorted(ds.values * 4)


@pytest.mark.parametrize("prefix", [b"0: ", b"worker-3: "])  # srun --label, pdsh
def test_every_fixture_reads_the_same_under_a_launchers_prefix(tmp_path, prefix):
    """Each log fixture with the prefix srun or pdsh puts on every line (over torchrun's own
    prefixes, restarts, progress bars' carriage returns) gives the same readings, memory,
    processes, arguments, vocabulary and summaries as bare, or the same refusal."""
    def reading(path):
        try:
            r = read_log(path)
        except SpecError:
            return "refused"
        return (r.values, r.memory_gib, r.processes, r.megatron_args, r.padded_vocab,
                r.bridge_summaries, r.validation_lines)

    for path in sorted(LOGS.glob("*.log")):
        data = path.read_bytes()
        p = tmp_path / path.name
        p.write_bytes(b"".join(prefix + ln for ln in data.splitlines(keepends=True)))
        assert reading(p) == reading(path), path.name


def test_deepspeed_pipeline_engine_as_it_prints_now_under_pdsh(tmp_path):
    """DeepSpeed 0.19.8's pipeline engine prints its `steps: .. iter time (s)` line with
    print() after its step's progress report (deepspeed/runtime/pipe/engine.py train_batch;
    runtime/engine.py _report_progress through log_dist: '[Rank 0] step=N, skipped=..,
    lr=.., mom=..') and never stops its ThroughputTimer, so no timer line comes; under pdsh,
    DeepSpeed's multi-node launcher, each line carries its host. Read as the 2021 log's
    pipeline lines are: the same readings, no memory."""
    old = read_log(LOGS / "deepspeed_pipe.log")
    out = []
    for ln in (LOGS / "deepspeed_pipe.log").read_text().splitlines():
        if ln.startswith("steps: "):
            n = int(ln.split()[1])
            out.append(f"[2026-11-30 10:0{n % 10}:00,000] [INFO] [logging.py:107:log_dist] "
                       f"[Rank 0] step={n}, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]")
            out.append(ln)
    p = tmp_path / "pipe.log"
    p.write_text("".join(f"worker-0: {ln}\n" for ln in out))
    r = read_log(p)
    assert r.framework == "deepspeed" and r.unit == "s" and r.values == old.values
    assert r.memory_gib is None and r.processes == 1


def test_megatron_deepspeed_prints_two_timers_of_the_same_steps(tmp_path):
    """Megatron-DeepSpeed prints Megatron's iteration line and DeepSpeed's pipeline engine line
    for each step (as BigScience's experiments/gpt2-meg-ds-3d-old logs show): Megatron's is
    read and DeepSpeed's counted as left out; the pipeline engine's line over the timer's in a
    DeepSpeed log; without the arguments block saying `deepspeed True`, two frameworks' lines
    are refused."""
    pipe = read_log(LOGS / "deepspeed_pipe.log")
    assert pipe.unit == "s" and pipe.same_steps_lines == 10 and len(pipe.values) == 7
    mega = (LOGS / "megatron.log").read_text().splitlines()
    steps = [i for i, line in enumerate(mega) if "elapsed time per iteration" in line]
    for k, i in enumerate(reversed(steps)):
        mega.insert(i, f"steps: {len(steps) - k} loss: 10.0000 iter time (s): 99.000 "
                       "samples/sec: 2.586")
    block = ["-------------------- arguments --------------------",
             "  deepspeed ....................... True",
             "---------------- end of arguments ----------------"]
    p = tmp_path / "meg_ds.log"
    p.write_text(_log_text(block + mega))
    r = read_log(p)
    m1 = read_log(LOGS / "megatron.log")
    assert r.framework == "megatron" and r.values == m1.values
    assert r.same_steps_lines == len(steps)
    p.write_text(_log_text(mega))
    with pytest.raises(SpecError) as e:
        read_log(p)
    assert "several frameworks" in str(e.value)


def test_deepspeed_configuration_print_is_checked_against_the_plan(tmp_path):
    """DeepSpeed's engine configuration print (deepspeed/runtime/config.py DeepSpeedConfig.print:
    '  {name} {dots} {value}', dots 29 - len(name), none past 29 characters) gives the batch,
    micro-batch and ZeRO stage that ran; a plan that differs in any is another run's."""
    from formats.clusters import cluster as load_cluster
    from formats.runs import deepspeed_config_mismatch

    head = "[2026-11-30 09:59:00,000] [INFO] [config.py:1013:print]   "
    cfg = [f"{name} {'.' * (29 - len(name))} {v}" for name, v in (
        ("gradient_accumulation_steps", 2), ("train_batch_size", 256),
        ("train_micro_batch_size_per_gpu", 2), ("zero_optimization_stage", 1))]
    log = tmp_path / "ds.log"
    log.write_text("".join(head + c + "\n" for c in cfg) + (LOGS / "deepspeed.log").read_text())
    r = read_log(log)
    assert r.deepspeed_config == {"gradient_accumulation_steps": 2, "train_batch_size": 256,
                                  "train_micro_batch_size_per_gpu": 2,
                                  "zero_optimization_stage": 1}
    assert r.deepspeed_zero == 1
    ex = load_cluster("example")
    m = presets.model("llama2-7b")
    job = JobSpec(global_batch=256, seq_length=4096, framework="deepspeed")
    assert deepspeed_config_mismatch(job, make_plan(m, job, ex, tp=1, pp=1, micro_batch=2,
                                                    zero=1), r.deepspeed_config) == []
    other = make_plan(m, job, ex, tp=1, pp=1, micro_batch=4, zero=2)
    assert [d[0] for d in deepspeed_config_mismatch(job, other, r.deepspeed_config)] == \
        ["train_micro_batch_size_per_gpu", "zero_optimization_stage"]


def test_readings_at_another_global_batch(tmp_path):
    """Where the log prints its global batch (Megatron-LM, NeMo): a batch-size ramp-up's
    smaller batches are left out of the plan's time, and a log paired with the plan of another
    batch is refused in one line."""
    text = (LOGS / "nemo_restart.log").read_text()
    for i in range(3, 7):  # four readings after warm-up at batch 128
        text = text.replace(f"global_batch_size: 256 | global_step: {i} |",
                            f"global_batch_size: 128 | global_step: {i} |")
    p = tmp_path / "ramp.log"
    p.write_text(text)
    r = read_log(p)
    assert len(r.values) == 20 and len(r.at_batch(256)) == 16
    assert r.iteration_s(128, 4096, 8) == pytest.approx(43.51)  # 43.55, 43.49, 43.52, 43.50
    with pytest.raises(SpecError) as e:
        r.iteration_s(512, 4096, 8)
    assert e.value.field == "global batch size" and "128, 256" in str(e.value)
    runner = CliRunner()
    pf = tmp_path / "p512.json"
    assert runner.invoke(app, ["estimate", "--gbs", "512", "--save-plan", str(pf)]).exit_code == 0
    res = runner.invoke(app, ["calibrate", str(LOGS / "nemo.log"), "--plan", str(pf)])
    assert res.exit_code == 2 and "nemo.log" in res.output and "global batch 256" in res.output
    assert len(res.output.strip().splitlines()) == 1


def _megatron_args_block(args: dict) -> str:
    """Megatron-LM's start-up print of its arguments (megatron/training/arguments.py,
    _print_args): '  {name} {48 - len(name) dots} {value}', sorted case-insensitively."""
    lines = sorted((f"  {k} {'.' * (48 - len(k))} {v}" for k, v in args.items()),
                   key=str.lower)
    return "\n".join(["------------------------ arguments ------------------------", *lines,
                      "-------------------- end of arguments ---------------------"]) + "\n"


def test_megatron_log_of_another_run_is_refused(tmp_path):
    """The arguments a Megatron-LM log printed are checked against the paired plan on what the
    cost model prices (the built-in example: Llama-2 70B, TP 8, PP 4, micro-batch 1, bf16);
    the run's own arguments pass, one different degree is one line, exit 2."""
    runner = CliRunner()
    pf = tmp_path / "plan.json"
    assert runner.invoke(app, ["estimate", "--save-plan", str(pf)]).exit_code == 0
    ran = {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 4,
           "context_parallel_size": 1, "data_parallel_size": 2, "micro_batch_size": 1,
           "global_batch_size": 256,
           "seq_length": 4096, "num_layers": 80, "hidden_size": 8192,
           "ffn_hidden_size": 28672, "num_attention_heads": 64, "num_query_groups": 8,
           "virtual_pipeline_model_parallel_size": None, "sequence_parallel": False,
           "use_distributed_optimizer": False, "recompute_granularity": None, "bf16": True,
           "fp16": False, "fp8": None, "lr": 0.0003, "attention_backend": "AttnBackend.auto",
           "a_name_longer_than_forty_eight_characters_in_all_of_it": True}
    timing = _megatron_timing_64()
    log = tmp_path / "run.log"
    log.write_text(_megatron_args_block(ran) + timing)
    assert read_log(log).megatron_args[0]["lr"] == "0.0003"
    out = tmp_path / "cal.json"
    res = runner.invoke(app, ["calibrate", str(log), "--plan", str(pf), "--out", str(out),
                              "--fit", "gemm_scale"])
    assert res.exit_code == 0, res.output
    log.write_text(_megatron_args_block({**ran, "tensor_model_parallel_size": 4,
                                         "fp8": "hybrid"}) + timing)
    res = runner.invoke(app, ["calibrate", str(log), "--plan", str(pf), "--out", str(out)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "tensor_model_parallel_size 4 in the log, 8 in the plan" in res.output
    assert "fp8 hybrid in the log, None in the plan" in res.output


def test_logs_are_streamed_gzip_or_plain_whatever_their_size(tmp_path, monkeypatch):
    """A rotated log gzipped reads as the plain one; logs are not held to the input size cap
    (a long run's log can be gigabytes); a damaged gzip or a folder is one error naming it."""
    import gzip

    from formats import reading
    plain = read_log(LOGS / "megatron.log")
    gz = tmp_path / "megatron.log.1"  # rotated: recognized by its bytes, not its name
    data = gzip.compress((LOGS / "megatron.log").read_bytes())
    gz.write_bytes(data)
    r = read_log(gz)
    assert (r.values, r.memory_gib, r.skipped) == (plain.values, plain.memory_gib, plain.skipped)
    monkeypatch.setattr(reading, "MAX_INPUT_BYTES", 100)
    assert read_log(LOGS / "megatron.log").values == plain.values
    # cut short (a job killed while its log was piped through gzip): read up to the cut, as
    # zcat does, and said; it had been refused whole
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(data[: int(len(data) * 0.95)])
    r = read_log(cut)
    assert r.cut_short and not plain.cut_short and 0 < len(r.values) < len(plain.values)
    assert r.values == plain.values[:len(r.values)]
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(SpecError, match="gzip stream ends before the end marker"):
        read_log(cut)
    bad = tmp_path / "bad.log.gz"  # damaged inside: refused
    bad.write_bytes(data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF])
                    + data[len(data) // 2 + 1:])
    with pytest.raises(SpecError) as e:
        read_log(bad)
    assert "damaged gzip" in str(e.value) and str(bad) in str(e.value)
    with pytest.raises(SpecError) as e:
        read_log(tmp_path)
    assert "folder" in str(e.value)


def _set_arg(text: str, name: str, value) -> str:
    """A Megatron-LM arguments block with one printed value changed."""
    out, n = re.subn(rf"(?m)^  {name} \.* ?.*$", f"  {name} {'.' * (48 - len(name))} {value}",
                     text)
    assert n == 1, name
    return out


def test_plan_read_from_megatron_arguments():
    """Megatron-LM's own arguments block (printed for the launch set emitted from a plan) reads
    back as that plan: the model, job and plan time the same as the preset's; the layout string,
    first/last counts with interleaving (Megatron-Core's get_num_layers_to_build: per pipeline
    rank, even over its virtual stages) and a mixture of experts too; what the cost model
    cannot price as it ran is refused naming the argument."""
    from formats.clusters import cluster as load_cluster
    from formats.megatron_args import plan_from_megatron_args
    from model.estimator import estimate
    from model.plan import TP_PP_DP_ORDER, ordered_placement

    ex = load_cluster("example")
    text = (LOGS / "megatron_args_70b.txt").read_text()
    m, job, plan = plan_from_megatron_args(megatron_arg_blocks(text)[0], ex, source="t")
    sh = plan.shape
    assert (sh.tp, sh.pp, sh.dp, sh.micro_batch, sh.schedule, sh.recompute, sh.layers,
            sh.sequence_parallel, sh.zero, sh.fp8) == (8, 4, 2, 1, "1f1b", "selective",
                                                       (20, 20, 20, 20), True, 1, False)
    ref = presets.model("llama2-70b")
    ref_job = JobSpec(global_batch=256, seq_length=4096, precision="bf16")
    ref_plan = make_plan(ref, ref_job, ex, tp=8, pp=4, recompute="selective",
                         sequence_parallel=True, distributed_optimizer=True)
    assert (m.num_layers, m.hidden_size, m.num_kv_heads, m.vocab_size, m.norm, m.gated_mlp) == \
        (80, 8192, 8, 32000, "rmsnorm", True)
    assert job.global_batch == 256 and job.precision == "bf16"
    assert estimate(m, job, ex, plan).iteration_ms == \
        pytest.approx(estimate(ref, ref_job, ex, ref_plan).iteration_ms, rel=1e-12)

    def read(t):
        return plan_from_megatron_args(megatron_arg_blocks(t)[0], ex, source="t")[2].shape
    lay = "E" + "t" * 19 + "|" + "t" * 21 + "|" + "t" * 20 + "|" + "t" * 20 + "L"
    assert read(_set_arg(text, "pipeline_model_parallel_layout", lay)).layers == \
        (19, 21, 20, 20)
    # Megatron-Core's shorthand (pipeline_parallel_layer_layout.py: ',' cosmetic, (..)*n, x*n)
    for short in ("Et*19|t*21|t*20|t*20L", "E(t*19,|)*1t*21|(t*20|)*1t*20L"):
        assert read(_set_arg(text, "pipeline_model_parallel_layout", short)).layers == \
            (19, 21, 20, 20), short
    for bad in ("Et*99999999999|t|t|tL", "E((t|)*2)*2L"):
        with pytest.raises(SpecError) as e:
            read(_set_arg(text, "pipeline_model_parallel_layout", bad))
        assert e.value.field == "pipeline_model_parallel_layout"
    fl = _set_arg(_set_arg(_set_arg(text, "virtual_pipeline_model_parallel_size", 2),
                           "decoder_first_pipeline_num_layers", 18),
                  "decoder_last_pipeline_num_layers", 18)
    assert read(fl).layers == (9, 11, 11, 9, 9, 11, 11, 9)
    mx = read((LOGS / "megatron_args_mixtral.txt").read_text())
    assert (mx.tp, mx.pp, mx.ep, mx.etp, mx.chunks, mx.layers) == (2, 4, 8, 1, 2, (4,) * 8)
    # a plan file of the same degrees but expert TP 2, token dropping or another expert width
    # is another run (calibrate had fitted on it): each difference is named
    from formats.megatron_args import megatron_args_mismatch
    mx_args = megatron_arg_blocks((LOGS / "megatron_args_mixtral.txt").read_text())[0]
    mm, mjob, mplan = plan_from_megatron_args(mx_args, ex, source="t")[:3]
    assert megatron_args_mismatch(mm, mjob, mplan, mx_args) == []
    etp2 = dataclasses.replace(mplan, shape=dataclasses.replace(mplan.shape, etp=0))
    assert ("expert_tensor_parallel_size", "1", "2") in megatron_args_mismatch(
        mm, mjob, etp2, mx_args)
    dropping = dataclasses.replace(mjob, moe_capacity_factor=1.5)
    assert {x[0] for x in megatron_args_mismatch(mm, dropping, mplan, mx_args)} == {
        "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity"}
    narrow = dataclasses.replace(mm, moe_ffn_hidden_size=7168)
    assert ("moe_ffn_hidden_size", "14336", "7168") in megatron_args_mismatch(
        narrow, mjob, mplan, mx_args)
    mapped = plan_from_megatron_args(
        megatron_arg_blocks(_set_arg(text, "use_tp_pp_dp_mapping", True))[0], ex,
        source="t", node_order=list(range(7, -1, -1)))[2]
    assert mapped.placement == ordered_placement(ex, 8, 4, 2, 1, TP_PP_DP_ORDER,
                                                 list(range(7, -1, -1)))
    assert mapped.placement != plan.placement
    for name, value in (("multi_latent_attention", True),
                        ("recompute_method", "block"), ("normalization", "Foo")):
        changed = _set_arg(text, name, value)
        if name == "recompute_method":
            changed = _set_arg(changed, "recompute_granularity", "full")
        with pytest.raises(SpecError) as e:
            read(changed)
        assert e.value.field in (name, "recompute_granularity") and "--plan" in str(e.value)
    with pytest.raises(SpecError) as e:  # the run's GPUs against the cluster's
        read(_set_arg(text, "data_parallel_size", 4))
    assert "cluster has 64" in str(e.value)


def test_fp8_recipes_read_back_from_megatron_arguments():
    """A logged --fp8-recipe reads back as the job's recipe (each one the cost model prices);
    one it has no rules for (custom), or FP8 options it does not price (the first and last
    layers in bf16, 16-bit weight gradients), are refused on that argument."""
    from formats.clusters import uniform_cluster
    from formats.megatron_args import plan_from_megatron_args
    b200 = uniform_cluster(8, 8, "B200", 900.0, 50.0)
    base = megatron_arg_blocks((LOGS / "megatron_args_70b.txt").read_text())[0]
    for recipe in ("delayed", "tensorwise", "mxfp8"):
        _m, job, plan = plan_from_megatron_args(
            {**base, "fp8": "e4m3", "fp8_recipe": recipe}, b200, source="t")
        assert job.fp8 and plan.shape.fp8 and job.fp8_recipe == recipe
    for bad, field in (({"fp8_recipe": "custom"}, "fp8_recipe"),
                       ({"first_last_layers_bf16": "True"}, "first_last_layers_bf16"),
                       ({"fp8_wgrad": "False"}, "fp8_wgrad")):
        with pytest.raises(SpecError) as e:
            plan_from_megatron_args({**base, "fp8": "e4m3", **bad}, b200, source="t")
        assert e.value.field == field and "not priced" in str(e.value)
    # a bf16 run prints them too, unused
    plan_from_megatron_args({**base, "first_last_layers_bf16": "True", "fp8_wgrad": "False"},
                            b200, source="t")


def test_hsdp_reads_back_from_megatron_arguments():
    """Megatron-FSDP's HSDP (--num-distributed-optimizer-instances R, launch/emit.py) reads
    back as shard groups of DP / R ranks, and the plan's instance count is among what a log's
    arguments must say; R instances of the plain distributed optimizer are refused."""
    from formats.clusters import cluster as load_cluster
    from formats.megatron_args import (megatron_args_mismatch, megatron_planned_args,
                                       plan_from_megatron_args)
    ex = load_cluster("example")
    text = (LOGS / "megatron_args_70b.txt").read_text()
    base = megatron_arg_blocks(text)[0]
    hsdp = {**base, "use_megatron_fsdp": "True", "fsdp_double_buffer": "True",
            "data_parallel_sharding_strategy": "optim_grads_params",
            "num_distributed_optimizer_instances": "2", "pipeline_model_parallel_size": "1",
            "data_parallel_size": "8", "recompute_granularity": "full",
            "recompute_method": "uniform", "recompute_num_layers": "1"}
    m, job, plan = plan_from_megatron_args(hsdp, ex, source="t")
    assert (plan.shape.zero, plan.shape.dp, plan.shape.shard_size) == (3, 8, 4)
    assert megatron_planned_args(m, job, plan)["num_distributed_optimizer_instances"] == "2"
    assert megatron_args_mismatch(m, job, plan, hsdp) == []
    whole = dataclasses.replace(plan, shape=dataclasses.replace(plan.shape, shard_size=0))
    assert ("num_distributed_optimizer_instances", "2", "1") in megatron_args_mismatch(
        m, job, whole, hsdp)
    for bad, why in ((dict(num_distributed_optimizer_instances="3"), "does not divide"),
                     (dict(use_megatron_fsdp="False"), "not priced")):
        with pytest.raises(SpecError) as e:
            plan_from_megatron_args({**hsdp, **bad}, ex, source="t")
        assert e.value.field == "num_distributed_optimizer_instances" and why in str(e.value)


def _megatron_fsdp_zero3_args() -> dict:
    """The 70B fixture's arguments as a Megatron-FSDP ZeRO-3 run on 8 GPUs printed them (its
    double buffer on, as emitted; no gradient dtype printed)."""
    base = megatron_arg_blocks((LOGS / "megatron_args_70b.txt").read_text())[0]
    base = {k: v for k, v in base.items() if not k.startswith("megatron_fsdp_")}
    return {**base, "use_megatron_fsdp": "True", "fsdp_double_buffer": "True",
            "data_parallel_sharding_strategy": "optim_grads_params",
            "pipeline_model_parallel_size": "1", "data_parallel_size": "8",
            "recompute_granularity": "full", "recompute_method": "uniform",
            "recompute_num_layers": "1", "bf16": "True", "grad_reduce_in_bf16": "False"}


def test_megatron_fsdp_gradient_dtype_reads_back():
    """Megatron-FSDP (Megatron-Core 0.17 on) keeps and reduces gradients in its own dtypes,
    not grad_reduce_in_fp32's: 'auto' (printed None) in a bf16 run is bf16 gradients
    (JobSpec.grad_reduce_in_bf16), torch.float32 is fp32; a reduction in another dtype than the
    gradients is refused, and the emitted fp32 plan's dtypes are among what a log must say. A
    log that prints no such dtype (older Megatron-FSDP) reads --grad-reduce-in-bf16."""
    from formats.clusters import cluster as load_cluster
    from formats.megatron_args import (megatron_args_mismatch, megatron_planned_args,
                                       plan_from_megatron_args)
    ex = load_cluster("example")
    fsdp = _megatron_fsdp_zero3_args()
    assert not plan_from_megatron_args(fsdp, ex, source="t")[1].grad_reduce_in_bf16
    auto = {**fsdp, "megatron_fsdp_main_grads_dtype": "None",
            "megatron_fsdp_grad_comm_dtype": "None"}
    m, job, plan = plan_from_megatron_args(auto, ex, source="t")
    assert job.grad_reduce_in_bf16 and job.grad_bytes == 2
    assert megatron_args_mismatch(m, job, plan, auto) == []  # None ran as bf16
    f32 = {**auto, "megatron_fsdp_main_grads_dtype": "torch.float32",
           "megatron_fsdp_grad_comm_dtype": "torch.float32"}
    m, job, plan = plan_from_megatron_args(f32, ex, source="t")
    assert not job.grad_reduce_in_bf16 and job.grad_bytes == 4
    assert megatron_planned_args(m, job, plan)["megatron_fsdp_main_grads_dtype"] == (
        "torch.float32")
    assert megatron_args_mismatch(m, job, plan, f32) == []
    # the emitted fp32 plan run with Megatron-FSDP's defaults: the log says what differs
    assert ("megatron_fsdp_main_grads_dtype", "None", "torch.float32") in (
        megatron_args_mismatch(m, job, plan, auto))
    with pytest.raises(SpecError) as e:
        plan_from_megatron_args({**f32, "megatron_fsdp_grad_comm_dtype": "torch.bfloat16"},
                                ex, source="t")
    assert e.value.field == "megatron_fsdp_grad_comm_dtype" and "not priced" in str(e.value)
    with pytest.raises(SpecError) as e:
        plan_from_megatron_args({**auto, "megatron_fsdp_main_grads_dtype": "torch.float16"},
                                ex, source="t")
    assert e.value.field == "megatron_fsdp_main_grads_dtype"


def test_megatron_log_checks_fsdp_stage_vocabulary_and_cp_exchange():
    """What a Megatron-LM log printed is checked against its plan also on Megatron-FSDP's use
    and strategy (a ZeRO-2 or ZeRO-1 run had calibrated a ZeRO-3 plan without a word), the
    vocabulary built (another tokenizer's 32000 against 152064 had too; a tokenizer's size
    padded by the run is the plan's), and the context-parallel exchange: only the ring (p2p)
    is priced, so another --cp-comm-type is refused when read and named against a plan."""
    from formats.clusters import cluster as load_cluster
    from formats.megatron_args import (megatron_args_mismatch, plan_from_megatron_args,
                                       vocab_mismatch)
    ex = load_cluster("example")
    base = megatron_arg_blocks((LOGS / "megatron_args_70b.txt").read_text())[0]
    z3 = _megatron_fsdp_zero3_args()
    m, job, plan = plan_from_megatron_args(z3, ex, source="t")
    assert plan.shape.zero == 3 and megatron_args_mismatch(m, job, plan, z3) == []
    # Megatron-FSDP's ZeRO-3 overlaps its collectives whatever the overlap flags printed
    # (such a log had been refused: 'ZeRO-3 prefetches and overlaps ...')
    ovl = {**z3, "overlap_grad_reduce": "True", "overlap_param_gather": "True"}
    m3, job3, plan3 = plan_from_megatron_args(ovl, ex, source="t")
    assert plan3.shape.zero == 3 and not plan3.shape.overlap_grad_reduce
    assert megatron_args_mismatch(m3, job3, plan3, ovl) == []
    # without its double buffer Megatron-FSDP holds more than priced: refused when read,
    # named against a plan
    with pytest.raises(SpecError) as e:
        plan_from_megatron_args({**z3, "fsdp_double_buffer": "False"}, ex, source="t")
    assert e.value.field == "fsdp_double_buffer"
    assert ("fsdp_double_buffer", "False", "True") in megatron_args_mismatch(
        m, job, plan, {**z3, "fsdp_double_buffer": "False"})
    z2 = {**z3, "data_parallel_sharding_strategy": "optim_grads"}
    assert ("data_parallel_sharding_strategy", "optim_grads", "optim_grads_params") in (
        megatron_args_mismatch(m, job, plan, z2))
    # a ZeRO-2 run overlapped its reduce-scatters whatever it printed (megatron_fsdp.py)
    for printed in ("False", "True"):
        m2, job2, plan2 = plan_from_megatron_args({**z2, "overlap_grad_reduce": printed}, ex,
                                                  source="t")
        assert plan2.shape.zero == 2 and plan2.shape.overlap_grad_reduce
        assert megatron_args_mismatch(m2, job2, plan2, {**z2, "overlap_grad_reduce": printed}
                                      ) == []
    z1 = {**z3, "use_megatron_fsdp": "False", "data_parallel_sharding_strategy": "no_shard"}
    assert ("use_megatron_fsdp", "False", "True") in megatron_args_mismatch(m, job, plan, z1)
    m1, job1, plan1 = plan_from_megatron_args(z1, ex, source="t")
    assert plan1.shape.zero == 1
    assert ("use_megatron_fsdp", "True", "False") in megatron_args_mismatch(m1, job1, plan1, z3)
    # the vocabulary: the plan's, or it padded to make_vocab_size_divisible_by x TP
    tp = plan.shape.tp
    assert vocab_mismatch(m, plan, z3, None) == []
    assert vocab_mismatch(m, plan, z3, m.vocab_size) == []
    assert m.vocab_size == 32000
    assert vocab_mismatch(m, plan, z3, 50304) == [("padded vocab size", "50304", "32000")]
    mult = int(z3["make_vocab_size_divisible_by"]) * tp  # as vocab_utils.py pads
    assert vocab_mismatch(m, plan, {**z3, "vocab_size": "50257"}, None)[0][1] == str(
        -(-50257 // mult) * mult)
    from dataclasses import replace
    odd = replace(m, vocab_size=m.vocab_size - 100)  # a tokenizer's size, padded by the run
    assert vocab_mismatch(odd, plan, z3, m.vocab_size) == []
    # context parallelism: the ring only
    cp2 = {**base, "context_parallel_size": "2", "data_parallel_size": "1"}
    m2, job2, plan2 = plan_from_megatron_args(cp2, ex, source="t")
    assert plan2.shape.cp == 2 and megatron_args_mismatch(m2, job2, plan2, cp2) == []
    for kind in ("['a2a']", "['allgather']", "['a2a+p2p']", "['p2p', 'a2a']"):
        with pytest.raises(SpecError) as e:
            plan_from_megatron_args({**cp2, "cp_comm_type": kind}, ex, source="t")
        assert e.value.field == "cp_comm_type" and "not priced" in str(e.value)
        assert ("cp_comm_type", kind, "['p2p']") in megatron_args_mismatch(
            m2, job2, plan2, {**cp2, "cp_comm_type": kind})
    assert plan_from_megatron_args({**cp2, "cp_comm_type": "['p2p', 'p2p']"}, ex,
                                   source="t")[2].shape.cp == 2


def test_plan_read_from_older_megatron_and_megatron_deepspeed_logs(tmp_path):
    """Older arguments blocks: --checkpoint-activations (1 layer per group) is full recompute,
    no attention backend printed is Megatron's fused softmax (scores stored: eager); a
    Megatron-DeepSpeed run (--deepspeed) takes DeepSpeed's printed ZeRO stage and pipeline
    partition (deepspeed/runtime/config.py DeepSpeedConfig.print, dots 29 - len(name);
    deepspeed/runtime/pipe/module.py _partition_layers: 'stage={s} layers={n}', then
    '    {index:2d}: {name}'), and refuses without them."""
    from formats.clusters import cluster as load_cluster
    from formats.megatron_args import plan_from_megatron_args

    text = (LOGS / "megatron_args_70b.txt").read_text()
    old = re.sub(r"(?m)^  (recompute_\w+|attention_backend) .*\n", "", text)
    old = _set_arg(_set_arg(old, "sequence_parallel", False), "use_distributed_optimizer", False)
    old = old.replace("-------------------- end of arguments",
                      f"  checkpoint_activations {'.' * 26} True\n"
                      f"  checkpoint_num_layers {'.' * 27} 1\n"
                      f"  deepspeed {'.' * 39} True\n"
                      "-------------------- end of arguments")
    timing = _megatron_timing_64()
    stages = "".join(f"stage={k} layers={20 + (k in (0, 3)) * 2}\n"
                     + ("     0: EmbeddingPipe\n     1: <lambda>\n" if k == 0 else "")
                     + "".join(f"    {2 + 20 * k + i:2d}: ParallelTransformerLayerPipe\n"
                               for i in range(20))
                     + ("    82: <lambda>\n    83: EmbeddingPipe\n" if k == 3 else "")
                     for k in range(4))
    ds_config = ("[2021-06-10 20:47:51,887] [INFO] [config.py:904:print]   "
                 f"zero_optimization_stage {'.' * 6} 1\n")
    log = tmp_path / "ds.log"
    log.write_text(old + stages + ds_config + timing)
    r = read_log(log)
    assert r.deepspeed_zero == 1 and r.deepspeed_layers == (20, 20, 20, 20)
    m, job, plan = plan_from_megatron_args(r.megatron_args[-1], load_cluster("example"),
                                           source="t", deepspeed_zero=r.deepspeed_zero,
                                           deepspeed_layers=r.deepspeed_layers)
    assert (plan.shape.recompute, plan.shape.zero, plan.shape.layers) == \
        ("full", 1, (20, 20, 20, 20))
    assert (job.attention, job.framework) == ("eager", "deepspeed")
    bloomish = old.replace("-------------------- end of arguments",
                           f"  embed_layernorm {'.' * 33} True\n"
                           "-------------------- end of arguments")
    bloomish = _set_arg(bloomish, "position_embedding_type", "PositionEmbeddingType.alibi")
    m2 = plan_from_megatron_args(megatron_arg_blocks(bloomish)[0], load_cluster("example"),
                                 source="t", deepspeed_zero=1, deepspeed_layers=(20,) * 4)[0]
    assert (m2.position_embedding, m2.embedding_norm, m2.rope_base) == ("alibi", True, 0.0)
    # BLOOM's production ds_config: bf16 with ZERO_STAGE 0 under the pipeline engine runs
    # BF16_Optimizer, which shards as ZeRO-1 (plan.deepspeed_problem); without the pipeline
    # engine it is pure bf16, not priced
    bf16 = megatron_arg_blocks(_set_arg(_set_arg(old, "bf16", True), "fp16", False))[0]
    assert plan_from_megatron_args(bf16, load_cluster("example"), source="t", deepspeed_zero=0,
                                   deepspeed_layers=(20,) * 4)[2].shape.zero == 1
    flat = {**bf16, "pipeline_model_parallel_size": "1", "data_parallel_size": "8"}
    with pytest.raises(SpecError) as e:
        plan_from_megatron_args(flat, load_cluster("example"), source="t", deepspeed_zero=0)
    assert e.value.field == "deepspeed" and "DDP_BFLOAT16" in str(e.value)
    with pytest.raises(SpecError) as e:  # no DeepSpeed configuration print
        plan_from_megatron_args(r.megatron_args[-1], load_cluster("example"), source="t")
    assert e.value.field == "deepspeed"
    with pytest.raises(SpecError) as e:  # checkpointing in groups of two layers
        plan_from_megatron_args(megatron_arg_blocks(_set_arg(old, "checkpoint_num_layers", 2))[0],
                                load_cluster("example"), source="t", deepspeed_zero=1,
                                deepspeed_layers=(20,) * 4)
    assert e.value.field == "checkpoint_num_layers"


def test_cli_calibrate_reads_plans_from_megatron_logs(tmp_path):
    """`calibrate LOG --cluster C`: the plan of a Megatron-LM log from its arguments block; the
    fit runs and the report names the plan read; without --plan or --cluster, or for a log
    without arguments, one line and exit 2."""
    runner = CliRunner()
    log = tmp_path / "run.log"
    log.write_text((LOGS / "megatron_args_70b.txt").read_text()
                   + _megatron_timing_64())
    out = tmp_path / "cal.json"
    res = runner.invoke(app, ["calibrate", str(log), "--cluster", "example", "--fit",
                              "gemm_scale", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert ("plan read from the run's own settings: TP=8 PP=4 DP=2 mbs=1 1f1b "
            "recompute=selective") in res.output
    res = runner.invoke(app, ["calibrate", str(log), "--cluster", "example", "--json",
                              "--out", str(out), "--save-plans", str(tmp_path / "plans")])
    assert json.loads(res.output)["logs"][0]["plan_from_arguments"].startswith("TP=8 PP=4")
    res = runner.invoke(app, ["estimate", "--plan", str(tmp_path / "plans" / "run.log.plan.json"),
                              "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["estimate"]["fits"] is True
    # a tokenizer's vocabulary: --vocab-size prints None, the padding line gives the size
    hf = _set_arg((LOGS / "megatron_args_70b.txt").read_text(), "vocab_size", None)
    log.write_text(hf + _megatron_timing_64())
    res = runner.invoke(app, ["calibrate", str(log), "--cluster", "example", "--out", str(out)])
    assert res.exit_code == 2 and "vocab_size" in res.output, res.output
    log.write_text(hf + " > padded vocab (size: 31999) with 1 dummy tokens (new size: 32000)\n"
                   + _megatron_timing_64())
    assert read_log(log).padded_vocab == 32000
    res = runner.invoke(app, ["calibrate", str(log), "--cluster", "example", "--out", str(out)])
    assert res.exit_code == 0, res.output
    # the run's hostfile: ranks fill its nodes in its order; a host not in the cluster is
    # one line
    hosts = tmp_path / "hostfile"
    hosts.write_text("# hosts\n" + "".join(f"node{k:02d} slots=8\n" for k in range(7, -1, -1)))
    res = runner.invoke(app, ["calibrate", str(log), "--cluster", "example", "--hostfile",
                              str(hosts), "--json", "--out", str(out)])
    assert res.exit_code == 0, res.output
    hosts.write_text("node00\nnodeXX\n")
    res = runner.invoke(app, ["calibrate", str(log), "--cluster", "example", "--hostfile",
                              str(hosts), "--out", str(out)])
    assert res.exit_code == 2 and "nodeXX" in res.output, res.output
    for args in (["calibrate", str(log)],
                 ["calibrate", str(LOGS / "nemo.log"), "--cluster", "example"],
                 ["calibrate", str(log), "--plan", str(out), "--hostfile", str(hosts)]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output


def test_megatron_log_as_megatron_prints_it(tmp_path):
    """A Megatron-LM log printed by Megatron-LM's own code (megatron_train.log, from the launch
    set emitted for the 70B plan; fixtures/logs/README.md): its arguments block (parse_args),
    its logger's padded-vocabulary line, its iteration lines, its theoretical and measured
    memory lines. Its first line (iteration 1, at start-up) does not reset Megatron's timer,
    so iteration 2 prints the mean of steps 1 and 2: both are among the warm-up readings
    skipped. Alone with the cluster, the log gives the plan it was emitted for, and calibrate
    predicts it as `estimate` predicts that plan."""
    from formats.clusters import cluster as load_cluster
    from formats.megatron_args import plan_from_megatron_args
    from model.estimator import estimate

    log = LOGS / "megatron_train.log"
    r = read_log(log)
    assert r.padded_vocab == 32000 and r.processes == 1 and r.memory_kind == "reserved"
    assert len(r.values) == 12 - WARMUP_READINGS and min(r.values) > 43.4
    text = log.read_text()
    assert "elapsed time per iteration (ms): 52208.6" in text  # (61.2 + 43.2) / 2: skipped
    ex = load_cluster("example")
    m, job, plan = plan_from_megatron_args(r.megatron_args[-1], ex, source="t",
                                           vocab=r.padded_vocab)
    l70 = presets.model("llama2-70b")
    emitted = make_plan(l70, JobSpec(global_batch=256, seq_length=4096), ex, tp=8, pp=4,
                        recompute="selective", zero=1)
    assert plan.shape == emitted.shape
    res = CliRunner().invoke(app, ["calibrate", str(log), "--cluster", "example", "--json",
                                   "--fit", "gemm_scale", "--out", str(tmp_path / "c.json")])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)["runs"][0]
    assert got["before_s"] == pytest.approx(
        estimate(l70, JobSpec(global_batch=256, seq_length=4096), ex, emitted).iteration_ms / 1e3)


@pytest.mark.parametrize("first,last,other", [("00: ", "63: ", "48: "),  # srun --label
                                              ("node00: ", "node07: ", "node06: ")])  # pdsh
def test_launcher_prefixes_are_ranks(tmp_path, first, last, other):
    """Under Slurm's `srun --label` every line starts with its task's number, zero-padded to
    the widest (Slurm's write_labelled_message.c); under pdsh, DeepSpeed's multi-node launcher,
    with its host's name. Megatron-LM's arguments block and rank 0's memory line under the
    first, the iteration lines under the last, another stage's memory line under its own:
    they read as the bare log does, the largest memory line counts, and calibrate reads the
    plan from the prefixed arguments. Where srun starts torchrun, the torchrun prefix after
    the label names the rank."""
    lines = (LOGS / "megatron_train.log").read_text().splitlines()
    labelled = [(last if "elapsed time per iteration" in ln else first) + ln for ln in lines]
    labelled.append(f"{other}[Rank 48] (after 2 iterations) memory (MB) | allocated: 41000.00"
                    " | max allocated: 70000.00 | reserved: 76000.00 | max reserved: 76800.00")
    log = tmp_path / "prefixed.log"
    log.write_text("\n".join(labelled) + "\n")
    r, plain = read_log(log), read_log(LOGS / "megatron_train.log")
    assert r.values == plain.values and r.megatron_args == plain.megatron_args
    assert r.padded_vocab == 32000 and r.memory_gib == pytest.approx(76800 / 1024)
    res = CliRunner().invoke(app, ["calibrate", str(log), "--cluster", "example", "--fit",
                                   "gemm_scale", "--out", str(tmp_path / "c.json")])
    assert res.exit_code == 0 and "plan read from the run's own settings: TP=8 PP=4" \
        in res.output, res.output
    titan = (LOGS / "torchtitan_metrics.log").read_text().splitlines()
    log.write_text("".join(f"1: {ln}\n" for ln in titan))  # srun's task 1 runs torchrun
    r = read_log(log)
    assert r.values == read_log(LOGS / "torchtitan_metrics.log").values and r.processes == 1


def test_hostfile_order_and_option_counts(tmp_path):
    """A hostfile orders the cluster's nodes (names first on each line, comments and blank
    lines skipped); a host twice, a host outside the cluster or a node left out is one error;
    --plan / --cluster / --hostfile given neither once nor once per log is one error."""
    from formats.clusters import cluster as load_cluster
    from formats.clusters import hostfile_order

    ex = load_cluster("example")
    names = [nd.name for nd in ex.nodes]
    h = tmp_path / "hosts"
    h.write_text("# job 42\n\n" + "".join(f"{n} slots=8\n" for n in reversed(names)))
    assert hostfile_order(h, ex) == list(range(len(names)))[::-1]
    for text, says in (("\n".join(names + names[:1]), "twice"),
                       ("\n".join(names[:-1]), "not listed"),
                       ("\n".join(names[:-1] + ["elsewhere"]), "not a node")):
        h.write_text(text)
        with pytest.raises(SpecError) as e:
            hostfile_order(h, ex)
        assert says in str(e.value) and e.value.field == "hostfile"
    runner = CliRunner()
    logs = []
    for k in range(3):  # three logs (one log given three times is refused on its own)
        logs.append(str(tmp_path / f"m{k}.log"))
        Path(logs[-1]).write_text((LOGS / "megatron.log").read_text())
    for args in (["--plan", "a.json", "--plan", "b.json"],
                 ["--cluster", "example", "--hostfile", str(h), "--hostfile", str(h)]):
        res = runner.invoke(app, ["calibrate", *logs, *args])
        assert res.exit_code == 2 and "give one per log or one for all" in res.output, \
            res.output


def test_plan_read_from_torchtitan_printed_config(tmp_path):
    """torchtitan prints its whole job config with [job] print_config (v0.2.2: JSON over many
    lines) or print_args (v0.1.0: the dict's repr), which the emitted TOML sets; both printed
    by torchtitan's own code for an emitted plan (fixtures/logs/README.md). The plan read from
    the print is the one read from the TOML; `calibrate --cluster` needs no --run-config then.
    A v0.2.0/v0.2.1 print (v0.2's schema, K and V repeated), a print cut short, or a
    --framework-version that contradicts the print are refused in one line."""
    from formats.clusters import cluster as load_cluster
    from formats.torchtitan_config import (plan_from_torchtitan_doc, plan_from_torchtitan_toml,
                                           printed_config_doc)
    from launch.emit import emit
    from model.estimator import estimate

    c = load_cluster("h100-8x8")
    m = presets.model("llama3-8b")
    job = JobSpec(global_batch=128, seq_length=8192, framework="torchtitan")
    plan = make_plan(m, job, c, tp=2, pp=2, zero=3, sequence_parallel=True, recompute="full")
    log = LOGS / "torchtitan_printed_config.log"
    r = read_log(log)
    assert [f for f, _t in r.torchtitan_configs] == ["json"]
    for version, printed in (("0.2", r.torchtitan_configs[0]),
                             ("0.1", ("repr", (LOGS / "torchtitan01_printed_args.txt")
                                      .read_text().split("Running with args: ", 1)[1]))):
        emit("torchtitan", m, job, c, plan, tmp_path / version, version=version, force=True)
        toml = (tmp_path / version / "torchtitan.toml").read_text()
        assert ("print_config = true" if version == "0.2" else "print_args = true") in toml
        # launched as torchtitan's run_train.sh launches: rank 0's lines only, prefixed
        assert "--local-ranks-filter=0 --role=rank --tee=3" in (
            tmp_path / version / "launch.sh").read_text()
        doc, got_version = printed_config_doc(*printed, "t")
        assert got_version == version
        m1, j1, p1 = plan_from_torchtitan_doc(doc, c, version, "t")
        m2, j2, p2 = plan_from_torchtitan_toml(tmp_path / version / "torchtitan.toml", c,
                                               version)
        assert p1.shape == p2.shape and p1.placement == p2.placement and j1 == \
            dataclasses.replace(j2, source=j1.source)
        assert p1.shape.describe() == plan.shape.describe()
        assert estimate(m1, j1, c, p1).iteration_ms == estimate(m2, j2, c, p2).iteration_ms
    out = tmp_path / "cal.json"
    res = CliRunner().invoke(app, ["calibrate", str(log), "--cluster", "h100-8x8", "--fit",
                                   "gemm_scale", "--out", str(out)])
    assert res.exit_code == 0 and "plan read from" in res.output, res.output
    res = CliRunner().invoke(app, ["calibrate", str(log), "--cluster", "h100-8x8",
                                   "--framework-version", "0.1", "--out", str(out)])
    assert res.exit_code == 2 and "contradicts" in res.output
    # with a plan file the print is checked against it: the plan's own file passes, one that
    # recomputes selectively is another run's
    got = _paired(tmp_path, log, m, job, c, [
        make_plan(m, job, c, tp=2, pp=2, zero=3, sequence_parallel=True, recompute=rc)
        for rc in ("full", "selective")])
    assert [code for code, _out in got] == [0, 2], got
    assert "recompute full in the log, selective in the plan" in got[1][1]
    # v0.2.0/v0.2.1's repr print has v0.2's [compile] section: refused as a plan's source;
    # beside a plan file the file stands (the start-up prints are still checked)
    with pytest.raises(SpecError, match="v0.2.0"):
        printed_config_doc("repr", repr({**doc, "compile": {"enable": True}}), "t")
    head = "[rank0]:[titan] 2026-12-03 18:16:00,000 - root - INFO - "
    lines = log.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if "Running with configs" in line)
    last = lines.index("[rank0]:}", first)
    doc02 = printed_config_doc(*r.torchtitan_configs[0], "t")[0]
    old_print = tmp_path / "v020.log"
    old_print.write_text(_log_text(lines[:first] + [head + "Running with args: " + repr(doc02)]
                                   + lines[last + 1:]) + "\n")
    assert [code for code, _o in _paired(tmp_path, old_print, m, job, c, [plan])] == [0]
    # a print cut short by the log's end
    text = log.read_text()
    cut = tmp_path / "cut.log"
    cut.write_text(text.replace("[rank0]:}\n", "", 1))
    res = CliRunner().invoke(app, ["calibrate", str(cut), "--cluster", "h100-8x8", "--out",
                                   str(out)])
    assert res.exit_code == 2 and "not a complete mapping" in res.output
    # no print at all: the message says how to get one
    bare = tmp_path / "bare.log"
    bare.write_text((LOGS / "torchtitan.log").read_text())
    res = CliRunner().invoke(app, ["calibrate", str(bare), "--cluster", "h100-8x8", "--out",
                                   str(out)])
    assert res.exit_code == 2 and "print_config" in res.output


def test_plan_read_from_torchtitan_toml(tmp_path):
    """A torchtitan run's plan from the TOML it was launched with: the TOML the emitter writes
    for a plan (both releases) reads back as that plan, costing the same; absent keys take
    torchtitan's defaults (job_config.py at v0.2.2: local batch 8, global = local x DP,
    sequence 2048, data_parallel_shard_degree -1 = the ranks left); what is not priced as it
    ran is refused naming the key."""
    from formats.clusters import cluster as load_cluster
    from formats.torchtitan_config import plan_from_torchtitan_toml
    from launch.emit import to_toml, torchtitan_config
    from model.estimator import estimate

    h100 = load_cluster("h100-8x8")
    l8, l70 = presets.model("llama3-8b"), presets.model("llama3-70b")
    job8 = JobSpec(global_batch=64, seq_length=8192, precision="bf16", zero=3,
                   framework="torchtitan")
    cases = [(l8, job8, dict(tp=1, pp=1, recompute="full", zero=3)),
             (l8, job8, dict(tp=2, pp=1, cp=2, cp_alltoall=True, sequence_parallel=True,
                             recompute="selective", zero=3, shard_size=8)),
             (l70, JobSpec(global_batch=64, seq_length=4096, precision="bf16", fp8=True,
                           zero=3, framework="torchtitan"),
              dict(tp=8, pp=4, schedule="interleaved", chunks=2, sequence_parallel=True,
                   recompute="full", zero=3, tp_comm_overlap=True, fp8=True))]
    f = tmp_path / "run.toml"
    for m, job, knobs in cases:
        plan = make_plan(m, job, h100, **knobs)
        for version in ("0.2", "0.1"):
            f.write_text(to_toml(torchtitan_config(m, job, h100, plan, version)[0]))
            m2, j2, p2 = plan_from_torchtitan_toml(f, h100, version)
            assert p2.shape == plan.shape and p2.placement == plan.placement
            if version == "0.2":  # v0.1 repeats K and V to the query heads (JobSpec.repeat_kv)
                assert estimate(m2, j2, h100, p2).iteration_ms == \
                    pytest.approx(estimate(m, job, h100, plan).iteration_ms, rel=1e-12)
            if plan.shape.fp8:  # the converter each release registers (v0.2: float8.py:238),
                # the output layer left in bf16 as priced; v0.2 had been given v0.1's name
                doc = tomllib.loads(f.read_text())
                sec = doc["quantize"]["linear"]["float8"] if version == "0.2" else doc["float8"]
                assert doc["model"]["converters"] == (["quantize.linear.float8"]
                                                      if version == "0.2" else ["float8"])
                assert sec["filter_fqns"] == ["output"]
    f.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\n'
                 'mode = "full"\n')
    m, job, plan = plan_from_torchtitan_toml(f, h100)
    assert (m.num_layers, job.global_batch, job.seq_length, job.precision, job.compile) == \
        (32, 8 * 64, 2048, "bf16", False)
    assert (plan.shape.dp, plan.shape.zero, plan.shape.micro_batch, plan.shape.recompute) == \
        (64, 3, 8, "full")
    for toml, field in (('[model]\nname = "llama3"\nflavor = "8B"\n',
                         "activation_checkpoint.selective_ac_option"),
                        ('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["mx"]\n',
                         "model.converters"),
                        ('[model]\nname = "llama3"\nflavor = "debugmodel"\n', "model.flavor"),
                        ('[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\n'
                         'mode = "none"\n[parallelism]\npipeline_parallel_degree = 2\n',
                         "parallelism.module_fqns_per_model_part"),
                        # a misspelt compile key, a v0.1 key read as v0.2, recipes not priced
                        ('[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\n'
                         'mode = "full"\n[compile]\nenabled = true\n', "compile.enabled"),
                        ('[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\n'
                         'mode = "full"\n[training]\ncompile = true\n', "training.compile"),
                        ('[model]\nname = "llama3"\nflavor = "8B"\n'
                         'converters = ["quantize.linear.float8"]\n'
                         '[activation_checkpoint]\nmode = "full"\n[quantize.linear.float8]\n'
                         'recipe_name = "rowwise"\nfilter_fqns = ["output"]\n',
                         "quantize.linear.float8.recipe_name"),
                        # v0.1's converter name in a v0.2 config: torchtitan stops at the
                        # lookup; the output layer in FP8 is not what is priced
                        ('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["float8"]\n'
                         '[activation_checkpoint]\nmode = "full"\n', "model.converters"),
                        ('[model]\nname = "llama3"\nflavor = "8B"\n'
                         'converters = ["quantize.linear.float8"]\n'
                         '[activation_checkpoint]\nmode = "full"\n',
                         "quantize.linear.float8.filter_fqns")):
        f.write_text(toml)
        with pytest.raises(SpecError) as e:
            plan_from_torchtitan_toml(f, h100)
        assert e.value.field == field, str(e.value)
        if 'converters = ["float8"]' in toml:  # names the release whose name it is
            assert "give --framework-version 0.1" in str(e.value)
    # the CLI: a torchtitan log with its TOML; without it, or a TOML for a Megatron-LM log,
    # one line
    f.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[activation_checkpoint]\n'
                 'mode = "full"\n')
    runner = CliRunner()
    out = tmp_path / "cal.json"
    res = runner.invoke(app, ["calibrate", str(LOGS / "torchtitan.log"), "--cluster", "h100-8x8",
                              "--run-config", str(f), "--fit", "gemm_scale", "--out", str(out)])
    assert res.exit_code == 0 and "plan read from" in res.output, res.output
    # what torchtitan prints of the run at start-up (train.py, parallel_dims.py at v0.2.2 and
    # v0.1.0) must be the plan's: model size, batch, sequence, mesh
    head = "[rank0]:[titan] 2026-11-30 09:59:00,000 - root - INFO - "
    start = [head + "Building device mesh with parallelism: pp=1, dp_replicate=1, "
             "dp_shard=64, cp=1, tp=1, ep=1, etp=1",
             head + "\x1b[34mModel llama3 8B \x1b[31msize: 8,030,261,248 total "
             "parameters\x1b[39m",
             head + "Trainer is initialized with local batch size 8, global batch size 512, "
             "gradient accumulation steps 1, sequence length 2048, total steps 1000 (warmup "
             "200)"]
    titan_log = tmp_path / "tt.log"
    for change, exit_code, named in (
            ({}, 0, None), ({"global batch size 512": "global batch size 256"}, 2,
                            "global batch"),
            ({"8,030,261,248": "70,553,706,496"}, 2, "total parameters"),
            ({"Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=64, "
              "cp=1, tp=1, ep=1, etp=1": "Building 2-D device mesh with ['dp_shard', 'tp'], "
              "[32, 2]"}, 2, "tp")):
        text = "\n".join(start) + "\n" + (LOGS / "torchtitan.log").read_text()
        for a, b in change.items():
            text = text.replace(a, b)
        titan_log.write_text(text)
        assert len(read_log(titan_log).torchtitan_settings) == 1
        res = runner.invoke(app, ["calibrate", str(titan_log), "--cluster", "h100-8x8",
                                  "--run-config", str(f), "--out", str(out)])
        assert res.exit_code == exit_code, (change, res.output)
        if named:
            assert f"{named} " in res.output and "in the plan" in res.output, res.output
    for args in ([str(LOGS / "torchtitan.log"), "--cluster", "h100-8x8"],
                 [str(tmp_path / "m.log"), "--cluster", "example", "--run-config", str(f)]):
        (tmp_path / "m.log").write_text((LOGS / "megatron_args_70b.txt").read_text()
                                        + _megatron_timing_64())
        res = runner.invoke(app, ["calibrate", *args, "--out", str(out)])
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output


def test_plan_read_from_nemo1_printed_configuration(tmp_path):
    """NeMo 1.x's log prints its composed configuration and padded vocabulary (written by
    NeMo's own code for an emitted 70B launch set: fixtures/logs/README.md): the plan read from
    them is the emitted plan, with the same estimate; `calibrate --cluster` runs on the log
    alone, and a plan file of another run is refused. What the cost model cannot price as NeMo
    ran it is refused in one line naming the key; NeMo's local layer spec (no Transformer
    Engine) is read as attention that stores the scores."""
    from formats.clusters import cluster as load_cluster
    from formats.nemo_config import plan_from_nemo_config
    from model.estimator import estimate

    log = LOGS / "nemo1_config_70b.log"
    r = read_log(log)
    assert r.framework == "nemo" and len(r.nemo_configs) == 1 and r.padded_vocab == 32000
    ex = load_cluster("example")
    m = presets.model("llama2-70b")
    job = JobSpec(global_batch=256, seq_length=4096)
    # the emit of that day wrote no overlap keys, so NeMo's distributed Adam ran with apex's
    # defaults, both overlaps on: the plan read says so (it had read them off)
    want = make_plan(m, job, ex, tp=8, pp=4, recompute="selective", zero=1,
                     overlap_grad_reduce=True, overlap_param_gather=True)
    text = r.nemo_configs[0]
    gm, gjob, got, _printed = plan_from_nemo_config(text, ex, source="t", vocab=32000)
    assert got.shape.describe() == want.shape.describe()
    assert got.placement == want.placement
    assert estimate(gm, gjob, ex, got).iteration_ms == pytest.approx(
        estimate(m, job, ex, want).iteration_ms, rel=1e-9)

    runner = CliRunner()
    out = tmp_path / "cal.json"
    res = runner.invoke(app, ["calibrate", str(log), "--cluster", "example", "--fit",
                              "gemm_scale", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    got_json = json.loads(res.output)
    assert got_json["logs"][0]["plan_from_arguments"].startswith("TP=8 PP=4 DP=2")
    assert got_json["runs"][0]["memory_stage"] == 0
    other = tmp_path / "other.json"
    plain = make_plan(m, job, ex, tp=8, pp=4, recompute="selective", zero=0)
    save_plan(other, m, job, ex, plain, estimate(m, job, ex, plain), options=Options())
    res = runner.invoke(app, ["calibrate", str(log), "--plan", str(other), "--out", str(out)])
    assert res.exit_code == 2 and "use_distributed_optimizer True in the log" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = runner.invoke(app, ["calibrate", str(log), "--cluster", "example",
                              "--framework-version", "0.2", "--out", str(out)])
    assert res.exit_code == 2 and "--framework-version" in res.output

    # without Transformer Engine, NeMo's Megatron-Core model takes the local spec: eager
    _m, ejob, _p, _a = plan_from_nemo_config(
        text.replace("transformer_engine: true", "transformer_engine: false"), ex, source="t",
        vocab=32000)
    assert ejob.attention == "eager" and gjob.attention == "flash"
    # refusals, each naming its key
    for old, new, key in [
            ("mcore_gpt: true", "mcore_gpt: false", "model.mcore_gpt"),
            ("megatron_amp_O2: true", "megatron_amp_O2: false", "model.megatron_amp_O2"),
            ("    name: distributed_fused_adam", "    name: sgd", "model.optim.name"),
            ("activation: fast-swiglu", "activation: softplus", "model.activation"),
            ("rampup_batch_size: null", "rampup_batch_size: [32, 32, 1000]",
             "model.rampup_batch_size"),
            ("  devices: 8", "  devices: [0, 1, 2, 3, 4, 5, 6, 7]", "trainer.devices"),
            ("encoder_seq_length: 4096", "encoder_seq_length: ${oc.env:SEQ}",
             "model.encoder_seq_length"),
            ("cpu_offloading: false", "cpu_offloading: true", "model.cpu_offloading")]:
        assert old in text, old
        with pytest.raises(SpecError) as e:
            plan_from_nemo_config(text.replace(old, new, 1), ex, source="t", vocab=32000)
        assert e.value.field == key, (key, e.value)
    with pytest.raises(SpecError) as e:
        plan_from_nemo_config(text, ex, source="t", vocab=None)
    assert "Padded vocab_size" in str(e.value)
    # NeMo turns sequence parallelism off at TP 1, after printing the configuration
    tp1 = text.replace("tensor_model_parallel_size: 8", "tensor_model_parallel_size: 1", 1)
    tp1 = tp1.replace("sequence_parallel: false", "sequence_parallel: true", 1)
    assert not plan_from_nemo_config(tp1, ex, source="t", vocab=32000)[2].shape.sequence_parallel
    # a reference to another key resolves (megatron_gpt_config.yaml's own kind)
    ref = text.replace("max_position_embeddings: 4096",
                       "max_position_embeddings: ${.encoder_seq_length}")
    assert ref != text
    assert plan_from_nemo_config(ref, ex, source="t", vocab=32000)[0].seq_length == 4096


def test_nemo_bf16_gradients_read_and_settings_the_estimate_prices_checked(tmp_path):
    """NeMo 1.x's optim.grad_sync_dtype bf16 (what emit writes for --grad-reduce-in-bf16
    under the distributed optimizer) is read as bf16 main gradients: the reader had dropped
    it (4.85 GiB more a GPU). A log whose printed arguments contradict the plan on what the
    estimate prices beside the degrees (bf16 main gradients, the overlaps, FP8 weights, the
    FP8 recipe) is refused: megatron_planned_args had left them out, and calibrate fitted a
    Megatron-LM log against a plan with overlaps and bf16 gradients it never ran."""
    from formats.megatron_args import megatron_args_mismatch, megatron_planned_args
    from formats.nemo_config import plan_from_nemo_config
    from formats.clusters import cluster as load_cluster
    from model.estimator import estimate

    ex = load_cluster("example")
    text = read_log(LOGS / "nemo1_config_70b.log").nemo_configs[0]
    anchor = "    name: distributed_fused_adam\n"
    assert text.count(anchor) == 1
    indent = " " * (len(anchor) - len(anchor.lstrip()))
    bf16 = text.replace(anchor, anchor + indent + "grad_sync_dtype: bf16\n")
    _m, job, plan, printed = plan_from_nemo_config(bf16, ex, source="t", vocab=32000)
    assert job.grad_reduce_in_bf16 and printed["grad_reduce_in_bf16"] == "True"
    _m, job0, plan0, _p = plan_from_nemo_config(text, ex, source="t", vocab=32000)
    assert not job0.grad_reduce_in_bf16  # fp32, NeMo's default
    m = presets.model("llama2-70b")
    assert estimate(m, job, ex, plan).peak_memory_gib < \
        estimate(m, job0, ex, plan0).peak_memory_gib - 1
    with pytest.raises(SpecError) as e:
        plan_from_nemo_config(text.replace(anchor, anchor + indent + "grad_sync_dtype: fp16\n"),
                              ex, source="t", vocab=32000)
    assert e.value.field == "model.optim.grad_sync_dtype"

    job = JobSpec(global_batch=256, seq_length=4096)
    plain = make_plan(m, job, ex, tp=8, pp=4, recompute="selective", zero=1)
    logged = megatron_planned_args(m, job, plain)
    assert megatron_args_mismatch(m, job, plain, logged) == []
    other_job = JobSpec(global_batch=256, seq_length=4096, grad_reduce_in_bf16=True)
    other = make_plan(m, other_job, ex, tp=8, pp=4, recompute="selective", zero=1,
                      overlap_grad_reduce=True, overlap_param_gather=True)
    assert {x[0] for x in megatron_args_mismatch(m, other_job, other, logged)} == {
        "grad_reduce_in_bf16", "overlap_grad_reduce", "overlap_param_gather"}
    fp8_job = JobSpec(global_batch=256, seq_length=4096, fp8=True, fp8_recipe="tensorwise")
    fp8 = make_plan(m, fp8_job, load_cluster("h100-8x8"), tp=8, pp=4, recompute="selective",
                    zero=1)
    fp8_logged = {**megatron_planned_args(m, fp8_job, fp8), "fp8": "hybrid",
                  "fp8_recipe": "delayed"}
    assert megatron_args_mismatch(m, fp8_job, fp8, fp8_logged) == [
        ("fp8_recipe", "delayed", "tensorwise")]
    # the CLI: the Megatron-LM fixture log (no overlaps, fp32 main gradients) against such a
    # plan is refused in one line
    pf = tmp_path / "other.json"
    save_plan(pf, m, other_job, ex, other, estimate(m, other_job, ex, other), options=Options())
    res = CliRunner().invoke(app, ["calibrate", str(LOGS / "megatron_train.log"), "--plan",
                                   str(pf), "--fit", "gemm_scale", "--out",
                                   str(tmp_path / "c.json")])
    assert res.exit_code == 2 and "overlap_grad_reduce" in res.output, res.output


def test_log_of_another_architecture_than_its_plan_is_refused():
    """Printed arguments of an architecture the plan does not have, in what the estimate
    prices beyond the sizes (an auditor's Qwen3 log with kv_channels 64 against its plan's
    128, fitted 15% off; a Llama log without SwiGLU and with tied output weights, 20% off):
    each named; the same arguments as the plan's, or NeMo's unvalidated kv_channels None for
    the default width, pass."""
    from formats.megatron_args import megatron_args_mismatch, megatron_planned_args
    from formats.clusters import cluster as load_cluster
    m = presets.model("llama3-8b")
    job = JobSpec(global_batch=256, seq_length=4096)
    plan = make_plan(m, job, load_cluster("h100-8x8"), tp=2, pp=1, zero=1)
    same = {**megatron_planned_args(m, job, plan), "kv_channels": "128", "swiglu": "True",
            "untie_embeddings_and_output_weights": "True", "add_bias_linear": "False",
            "normalization": "RMSNorm", "position_embedding_type": "rope"}
    assert megatron_args_mismatch(m, job, plan, same) == []
    assert megatron_args_mismatch(m, job, plan, {**same, "kv_channels": "None"}) == []
    # YaRN and multimodal RoPE are rotary embeddings at RoPE's cost (a reviewer's Bridge log
    # with yarn had been refused against its own plan)
    for rotary in ("yarn", "mrope", "PositionEmbeddingType.rotary"):
        assert megatron_args_mismatch(m, job, plan,
                                      {**same, "position_embedding_type": rotary}) == []
    for name, value in (("kv_channels", "64"), ("swiglu", "False"),
                        ("untie_embeddings_and_output_weights", "False"),
                        ("add_bias_linear", "True"), ("normalization", "LayerNorm"),
                        ("position_embedding_type", "learned_absolute")):
        got = megatron_args_mismatch(m, job, plan, {**same, name: value})
        assert [x[:2] for x in got] == [(name, value)], (name, got)


def test_emit_from_a_plan_file_writes_the_release_it_was_saved_with(tmp_path):
    """A plan saved beside files emitted for NeMo 1.x records that release (`emitted`), and
    `emit` from the file writes NeMo 1.x's files again (they had come back as a
    Megatron-Bridge recipe, without a word); another --framework-version still chooses."""
    runner = CliRunner()
    pf = tmp_path / "v.json"
    base = ["-m", "llama3-8b", "-c", "h100-8x8", "--gbs", "128", "--seq", "8192", "--tp", "4",
            "--pp", "2"]
    r = runner.invoke(app, ["estimate", *base, "--framework-version", "1", "--save-plan",
                            str(pf), "--emit", "nemo", "--out", str(tmp_path / "A")])
    assert r.exit_code == 0, r.output
    assert json.loads(pf.read_text())["emitted"] == {"framework": "nemo", "version": "1"}
    r = runner.invoke(app, ["emit", str(pf), "-f", "nemo", "--out", str(tmp_path / "B")])
    assert r.exit_code == 0 and "the release it was emitted for" in " ".join(
        r.output.split()), r.output
    for f in (tmp_path / "A").iterdir():
        assert (tmp_path / "B" / f.name).read_bytes() == f.read_bytes(), f.name
    r = runner.invoke(app, ["emit", str(pf), "-f", "nemo", "--framework-version", "bridge",
                            "--out", str(tmp_path / "C")])
    assert r.exit_code == 0 and (tmp_path / "C" / "bridge_recipe.py").exists(), r.output
    doc = json.loads(pf.read_text())
    doc["emitted"]["version"] = "7"
    pf.write_text(json.dumps(doc))
    r = runner.invoke(app, ["emit", str(pf), "-f", "nemo", "--out", str(tmp_path / "D")])
    assert r.exit_code == 2 and "emitted.version" in r.output, r.output


def test_plan_read_from_bridge_run_config(tmp_path):
    """A Megatron-Bridge run's plan from the run_config.yaml its checkpoints hold, files written
    by Bridge (067f987) itself (fixtures/logs/README.md): those of the recipes emitted for two
    plans read back as the plans, placement and cost included; Bridge's own 70B recipe (its
    TransformerConfig nested under model.transformer) as Bridge built it; what is not priced is
    refused naming the field. The CLI pairs a Bridge log with its file; a run that fused its
    loss has its memory reported and not fitted."""
    import yaml

    from formats.bridge_config import plan_from_bridge_config
    from formats.clusters import cluster as load_cluster
    from model.estimator import estimate

    ex, h100 = load_cluster("example"), load_cluster("h100-8x8")
    job = JobSpec(global_batch=256, seq_length=4096)
    l70, mx = presets.model("llama2-70b"), presets.model("mixtral-8x7b")
    for name, m, plan in (
            ("bridge_run_config_70b.yaml", l70,
             make_plan(l70, job, ex, tp=8, pp=4, recompute="selective", sequence_parallel=True,
                       distributed_optimizer=True, layers=(20,) * 4)),
            ("bridge_run_config_mixtral.yaml", mx,
             make_plan(mx, job, ex, tp=2, pp=4, ep=8, etp=1, schedule="interleaved", chunks=2,
                       sequence_parallel=True, distributed_optimizer=True))):
        m2, j2, p2, settings = plan_from_bridge_config(LOGS / name, ex)
        assert p2.shape == plan.shape and p2.placement == plan.placement, name
        assert estimate(m2, j2, ex, p2).iteration_ms == \
            pytest.approx(estimate(m, job, ex, plan).iteration_ms, rel=1e-12)
        assert settings["cross_entropy_loss_fusion"] == "False"  # the emitter turns it off
    m, j, p, settings = plan_from_bridge_config(LOGS / "bridge_recipe_llama3_70b.yaml", h100)
    sh = p.shape
    assert (sh.tp, sh.pp, sh.cp, sh.dp, sh.chunks, sh.micro_batch, sh.recompute,
            sh.sequence_parallel, sh.tp_comm_overlap, sh.zero) == \
        (4, 4, 2, 2, 5, 1, "none", True, True, 1)
    # NullTokenizer's 32000 padded to 128 x TP (should_pad_vocab, set by Bridge's setup)
    assert (m.num_layers, m.hidden_size, m.num_kv_heads, m.vocab_size, m.rope_base,
            m.tied_embeddings) == (80, 8192, 8, 32256, 500000.0, False)
    assert (j.global_batch, j.seq_length, j.precision, j.attention, j.fp8) == \
        (512, 8192, "bf16", "flash", False)
    assert settings["cross_entropy_loss_fusion"] == "True" and not j.fused_loss  # TE's

    doc = yaml.safe_load((LOGS / "bridge_run_config_70b.yaml").read_text())
    f = tmp_path / "run_config.yaml"

    def refused(change, cl=ex) -> str:
        d = yaml.safe_load(yaml.safe_dump(doc))
        change(d)
        f.write_text(yaml.safe_dump(d))
        with pytest.raises(SpecError) as e:
            plan_from_bridge_config(f, cl)
        assert str(f) in str(e.value)
        return e.value.field

    assert refused(lambda d: d.update(mixed_precision="bf16_mixed")) == "mixed_precision"
    assert refused(lambda d: d["model"].update(multi_latent_attention=True)) == \
        "multi_latent_attention"
    assert refused(lambda d: d["mixed_precision"].update(fp8="hybrid",
                                                         first_last_layers_bf16=True)) == \
        "first_last_layers_bf16"
    assert refused(lambda d: d["mixed_precision"].update(fp4="nvfp4")) == "fp4"
    assert refused(lambda d: d["model"].update(recompute_granularity="full",
                                               recompute_method="block")) == \
        "recompute_granularity"
    assert refused(lambda d: d.update(comm_overlap={"data_parallel_size": 4})) == \
        "comm_overlap.data_parallel_size"
    assert refused(lambda d: d.pop("train")) == "train"
    assert refused(lambda d: None, uniform_cluster(3, 8, "H100-SXM-80GB", 360.0, 50.0)) == \
        "tensor_model_parallel_size"  # TP 8 x PP 4 does not divide 24 GPUs
    f.write_text("model: [unclosed\n")
    with pytest.raises(SpecError) as e:
        plan_from_bridge_config(f, ex)
    assert e.value.field == "--run-config"

    # the CLI: a Bridge log (its iteration line at global batch 256) with its run_config.yaml;
    # with the loss fused, the reserved peak is reported, and no fragmentation is fitted
    runner = CliRunner()
    out = tmp_path / "cal.json"
    args = ["calibrate", str(LOGS / "megatron_bridge.log"), "--cluster", "example",
            "--run-config", str(LOGS / "bridge_run_config_70b.yaml"), "--fit", "gemm_scale",
            "--out", str(out), "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["runs"][0]["memory_kind"] == "reserved" and "fragmentation" in got["parameters"]
    assert got["logs"][0]["plan_from_arguments"].startswith("TP=8 PP=4 DP=2")
    d = yaml.safe_load(yaml.safe_dump(doc))
    d["model"]["cross_entropy_loss_fusion"] = True
    f.write_text(yaml.safe_dump(d))
    res = runner.invoke(app, args[:5] + [str(f)] + args[6:])
    got = json.loads(res.output)
    assert got["runs"][0]["memory_kind"] == "reserved" and "fragmentation" in got["parameters"]
    d["model"]["cross_entropy_fusion_impl"] = "te"
    f.write_text(yaml.safe_dump(d))
    res = runner.invoke(app, args[:5] + [str(f)] + args[6:])
    got = json.loads(res.output)
    assert got["runs"][0]["memory_kind"] == "reserved, TE fused loss: not fitted"
    assert "fragmentation" not in got["parameters"]
    for bad in (args[:4], args[:5] + [str(LOGS / "bridge_run_config_70b.yaml"),
                                      "--framework-version", "0.2"]):
        res = runner.invoke(app, bad + ["--out", str(out)])
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output


def test_fused_loss_read_and_priced_or_not_fitted(tmp_path):
    """A Megatron-LM run's loss from its arguments block: unfused, or fused natively
    (--cross-entropy-loss-fusion, JobSpec.fused_loss, priced at its measured 10 bytes per logit)
    read into the plan and fitted; fused by Transformer Engine (not measured) read as a run
    whose memory is reported and not fitted. A plan file whose loss differs from the log's is
    refused."""
    from formats.clusters import cluster as load_cluster
    from formats.megatron_args import plan_from_megatron_args
    from model.estimator import estimate

    text = (LOGS / "megatron_args_70b.txt").read_text()
    log = tmp_path / "m.log"
    out = tmp_path / "cal.json"
    got_kinds, peaks = [], []
    ex = load_cluster("example")
    for fused, impl in ((False, "native"), (True, "native"), (True, "te")):
        block = _set_arg(_set_arg(text, "cross_entropy_loss_fusion", fused),
                         "cross_entropy_fusion_impl", impl)
        m, job, plan = plan_from_megatron_args(megatron_arg_blocks(block)[0], ex, source="t")
        assert job.fused_loss == (fused and impl == "native")
        peaks.append(estimate(m, job, ex, plan).stages[-1].memory.total_gib)
        log.write_text(block + _megatron_timing_64())
        res = CliRunner().invoke(app, ["calibrate", str(log), "--cluster", "example", "--fit",
                                       "gemm_scale", "--out", str(out), "--json"])
        assert res.exit_code == 0, res.output
        got = json.loads(res.output)
        got_kinds.append((got["runs"][0]["memory_kind"], "fragmentation" in got["parameters"]))
    assert got_kinds == [("reserved", True), ("reserved", True),
                         ("reserved, TE fused loss: not fitted", False)]
    assert peaks[1] > peaks[0] == peaks[2]  # the native fused loss peaks higher (10 vs 6)
    # the unfused plan's file against the natively fused run's log: another run
    m, job, plan = plan_from_megatron_args(megatron_arg_blocks(text)[0], ex, source="t")
    plan_file = tmp_path / "p.json"
    save_plan(plan_file, m, job, ex, plan, estimate(m, job, ex, plan), options=Options())
    log.write_text(_set_arg(text, "cross_entropy_loss_fusion", True)
                   + _megatron_timing_64())
    res = CliRunner().invoke(app, ["calibrate", str(log), "--plan", str(plan_file), "--out",
                                   str(out)])
    assert res.exit_code == 2 and "cross_entropy_loss_fusion" in res.output, res.output


def test_foreign_and_short_logs_are_one_line_errors(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("hello\nnot a training log\n")
    with pytest.raises(SpecError) as e:
        read_log(p)
    assert e.value.field == "log" and str(p) in str(e.value)
    lines = (LOGS / "megatron.log").read_text().splitlines()
    p.write_text(_log_text(lines[:6]))  # three timing lines: all warm-up
    with pytest.raises(SpecError) as e:
        read_log(p)
    assert "warm-up" in str(e.value)
    mixed = (LOGS / "megatron.log").read_text() + (LOGS / "nemo.log").read_text()
    p.write_text(mixed)
    with pytest.raises(SpecError) as e:
        read_log(p)
    assert "several frameworks" in str(e.value)


# the synthetic runs' shapes (also bench/interval_coverage.py's)
SHAPES = [dict(tp=1, pp=1, micro_batch=4), dict(tp=2, pp=1, micro_batch=4),
          dict(tp=8, pp=1, micro_batch=8), dict(tp=1, pp=4, micro_batch=2),
          dict(tp=2, pp=2, micro_batch=4), dict(tp=4, pp=2, micro_batch=8),
          dict(tp=8, pp=4, micro_batch=4), dict(tp=1, pp=2, micro_batch=8),
          dict(tp=4, pp=1, micro_batch=2), dict(tp=2, pp=4, micro_batch=8),
          dict(tp=8, pp=2, micro_batch=2), dict(tp=4, pp=4, micro_batch=4)]


def _runs(truth: dict, noise: float, seed: int, n: int):
    """Plans of different shapes on 4 nodes with slow links, their times predicted with the
    true parameters, times log-normal noise."""
    model = presets.model("gpt-3.6b")
    c = uniform_cluster(4, 8, "A100-80GB", 240.0, 6.0)
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        kw = SHAPES[k % len(SHAPES)]
        job = JobSpec(global_batch=128 * (1 + k // len(SHAPES)), seq_length=2048)
        plan = make_plan(model, job, c, sequence_parallel=kw["tp"] > 1,
                         distributed_optimizer=True, recompute="full", **kw)
        run = Run(model, job, c, plan, Options(), 1.0, label=f"run{k}")
        run.measured_s = _predict(run, truth, "A100-80GB") * math.exp(noise * rng.normal())
        out.append(run)
    return out


def _assert_recovered(truth: dict, seed: int):
    """12 runs made with `truth` and 2% noise fit back to it within 3 standard errors; the
    runs."""
    runs = _runs(truth, 0.02, seed=seed, n=12)
    prof, _ = fit(runs, tuple(truth), "A100-80GB", fit_fragmentation=False)
    for k, v in truth.items():
        assert prof.stderr[k] is not None
        assert abs(prof.values[k] - v) <= 3 * prof.stderr[k] + 1e-9, (k, prof.values[k])
    return runs


def test_a_parameter_the_runs_push_past_its_range_is_reported_at_its_bound():
    """Runs 4x slower than the GEMM curve allows (gemm_scale 0.25 against a lower bound of
    0.3): the fit ends on the bound and says so (the calibrate table and JSON name it)."""
    runs = _runs({"gemm_scale": 0.25}, 0.0, seed=1, n=4)
    prof, _ = fit(runs, ("gemm_scale",), "A100-80GB", prior=False, fit_fragmentation=False)
    assert prof.values["gemm_scale"] == pytest.approx(0.3)
    assert prof.at_bounds() == {"gemm_scale": "lower"}
    good, _ = fit(_runs({"gemm_scale": 0.9}, 0.0, seed=1, n=4), ("gemm_scale",), "A100-80GB",
                  prior=False, fit_fragmentation=False)
    assert good.at_bounds() == {}


def test_synthetic_round_trip_recovers_the_parameters():
    """Logs from the estimator with known parameters and 2% noise calibrate back to them within
    their reported uncertainty (3 standard errors), and 95% intervals on held-out plans
    cover their true times."""
    truth = {"gemm_scale": 0.85, "network_scale": 0.6}
    runs = _runs(truth, 0.02, seed=1, n=12)
    prof, _ = fit(runs, ("gemm_scale", "network_scale"), "A100-80GB")
    for k, v in truth.items():
        assert prof.stderr[k] is not None and prof.stderr[k] > 0
        assert abs(prof.values[k] - v) <= 3 * prof.stderr[k] + 1e-9, (k, prof.values[k])
    assert 0.005 < prof.residual_sd < 0.05
    held = _runs(truth, 0.0, seed=2, n=24)[12:]
    covered = 0
    for r in held:
        t, lo, hi = interval_s(prof, r.model, r.job, r.cluster, r.plan, r.options)
        assert lo < t < hi
        covered += lo <= r.measured_s <= hi
    assert covered >= 10  # of 12 held-out plans (95% nominal)
    # before the fit the presets are off by the true scales; after, within the noise
    med_before = np.median([abs(x["before_s"] / x["measured_s"] - 1) for x in prof.runs])
    med_after = np.median([abs(x["after_s"] / x["measured_s"] - 1) for x in prof.runs])
    assert med_after < 0.03 < med_before


def test_intervals_hold_new_measurements_at_their_rate_with_few_runs():
    """With 5 runs for 2 parameters the spread is measured with 3 degrees of freedom, and the
    interval uses Student's t for it: over 16 seeded fits, new measurements (2% noise) of 12
    other plans fall inside their 95% intervals at least 95% of the time (99% here; with the
    normal's 1.96 instead, 93.8% on these seeds, 89% over bench/interval_coverage.py's 40)."""
    from model.calibration import t975
    truth = {"gemm_scale": 0.85, "network_scale": 0.6}
    rng = np.random.default_rng(7)
    held = _runs(truth, 0.0, seed=2, n=24)[12:]
    inside = total = 0
    for seed in range(16):
        prof, _ = fit(_runs(truth, 0.02, seed=300 + seed, n=5), tuple(truth), "A100-80GB",
                      fit_fragmentation=False)
        assert prof.residual_dof == 3 and not prof.residual_sd_assumed
        for r in held:
            t, lo, hi = interval_s(prof, r.model, r.job, r.cluster, r.plan, r.options)
            assert hi / t == pytest.approx(t / lo)
            inside += lo <= r.measured_s * math.exp(0.02 * rng.normal()) <= hi
            total += 1
    assert inside >= 0.95 * total
    # the quantiles: the table, the expansion beyond it, the normal for an assumed spread
    assert t975(1) == 12.706 and t975(3) == 3.182 and t975(None) == pytest.approx(1.96, 1e-4)
    assert t975(40) == pytest.approx(2.021, abs=1e-3)
    assert t975(120) == pytest.approx(1.980, abs=1e-3)
    qs = [t975(d) for d in range(1, 200)]
    assert all(a > b for a, b in zip(qs, qs[1:]))


def test_no_more_runs_than_parameters(tmp_path):
    """One run for two parameters: with the prior the noise is the assumed NOISE_SD (marked so)
    and the parameters' error bars are the posterior's, so plans get an interval, not a
    point; without the prior nothing is determined: no interval, and `estimate` and `solve`
    say why instead of printing a zero-width one."""
    from model.calibration import NOISE_SD
    names = ("gemm_scale", "network_scale")
    runs = _runs({"gemm_scale": 0.9}, 0.0, seed=3, n=1)
    prof, _ = fit(runs, names, "A100-80GB", fit_fragmentation=False)
    assert prof.residual_sd == NOISE_SD and prof.residual_sd_assumed
    assert prof.residual_dof is None
    assert all(0 < prof.stderr[n] < 1 for n in names)
    r = _runs({}, 0.0, seed=4, n=6)[5]
    t, lo, hi = interval_s(prof, r.model, r.job, r.cluster, r.plan, r.options)
    assert lo < t / math.exp(1.96 * NOISE_SD) * 1.0001 and hi > t * math.exp(1.96 * NOISE_SD)
    p = tmp_path / "one.json"
    save_profile(p, prof)
    back = load_profile(p)
    assert back.residual_sd_assumed and back.residual_dof is None
    assert interval_s(back, r.model, r.job, r.cluster, r.plan, r.options) == pytest.approx(
        (t, lo, hi))
    free, _ = fit(runs, names, "A100-80GB", prior=False, fit_fragmentation=False)
    assert free.residual_sd is None and not free.covariance
    t2, lo2, hi2 = interval_s(free, r.model, r.job, r.cluster, r.plan, r.options)
    assert t2 > 0 and lo2 is None and hi2 is None
    q = tmp_path / "free.json"
    save_profile(q, free)
    res = CliRunner().invoke(app, ["estimate", "--calibration", str(q), "--tp", "8",
                                   "--pp", "4", "--distopt", "--recompute", "selective"])
    assert res.exit_code == 0, res.output
    assert "no prediction interval: 2 parameters fitted to 1 run with no prior" in (
        " ".join(res.output.split()))
    res = CliRunner().invoke(app, ["estimate", "--calibration", str(q), "--tp", "8",
                                   "--pp", "4", "--distopt", "--recompute", "selective",
                                   "--json"])
    iv = json.loads(res.output)["interval_s"]
    assert iv["low"] is None and iv["high"] is None and "no prediction interval" in (
        iv["none_because"])
    # a degrees-of-freedom field that is not a count is one line naming it
    doc = json.loads(p.read_text())
    doc["residual_dof"] = 0
    p.write_text(json.dumps(doc))
    with pytest.raises(SpecError) as e:
        load_profile(p)
    assert e.value.field == "residual_dof"


def test_intervals_do_not_narrow_with_fewer_runs(tmp_path):
    """Two parameters fitted with the prior to 1, 2, 3, 4 and 6 runs (2% noise): with no more
    runs than parameters the assumed 5% spread is worth NOISE_PRIOR_DOF = 1 degree of freedom
    to Student's t, as a spread measured on one run more would be, so 2 runs no longer give a
    narrower interval than 3 (it had been taken as exact, 1.96 x 5%: an auditor's 2-run
    interval was half the width of the 3-run one); measured spreads stay the runs' alone. The
    profile file keeps it; one written before it reads as exact."""
    from model.calibration import NOISE_PRIOR_DOF, Z95, spread_dof, t975
    names = ("gemm_scale", "network_scale")
    pool = _runs({"gemm_scale": 0.9}, 0.02, seed=21, n=7)
    r = pool[6]
    widths = {}
    for n in (1, 2, 3, 4, 6):
        prof, _ = fit(pool[:n], names, "A100-80GB", fit_fragmentation=False)
        assert spread_dof(prof) == (n - 2 if n > 2 else NOISE_PRIOR_DOF)
        assert prof.noise_prior_dof == (NOISE_PRIOR_DOF if n <= 2 else 0)
        if n > 2:
            measured = sum(math.log(x["after_s"] / x["measured_s"]) ** 2 for x in prof.runs)
            assert prof.residual_sd == pytest.approx(math.sqrt(measured / (n - 2)))
        t, lo, hi = interval_s(prof, r.model, r.job, r.cluster, r.plan, r.options)
        widths[n] = hi / lo
        if n == 2:
            p = tmp_path / "two.json"
            save_profile(p, prof)
            assert interval_s(load_profile(p), r.model, r.job, r.cluster, r.plan,
                              r.options)[1:] == pytest.approx((lo, hi))
            doc = json.loads(p.read_text())
            del doc["noise_prior_dof"]  # a profile written before it: the 1.96 rule
            p.write_text(json.dumps(doc))
            old = interval_s(load_profile(p), r.model, r.job, r.cluster, r.plan, r.options)
            assert math.log(old[2] / t) == pytest.approx(
                math.log(hi / t) * Z95 / t975(NOISE_PRIOR_DOF), rel=1e-9)
    assert min(widths[1], widths[2]) > max(widths[3], widths[4], widths[6]), widths


@pytest.mark.parametrize("edit,field", [
    (lambda d: d.update(covariance=[[1e-4, "x"], [0.0, 2e-3]]), "covariance"),
    (lambda d: d.update(covariance=[[1e-4, 1.0], [1.0, 2e-3]]), "covariance"),  # not PSD
    (lambda d: d.update(covariance=[[1e-4, 0.0], [1e-3, 2e-3]]), "covariance"),  # asymmetric
    (lambda d: d.update(fitted=["gemm_scale", "hbm_scale"]), "fitted"),  # no value for it
    (lambda d: d.update(fitted=["gemm_scale", "gemm_scale"]), "fitted"),
    (lambda d: d.update(fitted="gemm_scale"), "fitted"),
    (lambda d: d["parameters"]["gemm_scale"].update(stderr=-1), "parameters.gemm_scale.stderr"),
    (lambda d: d.update(uninformed=[["gemm_scale"]]), "uninformed"),
    (lambda d: d.update(runs=3), "runs"),
    (lambda d: d.update(residual_sd_log=float("nan")), "residual_sd_log"),
    (lambda d: d.update(residual_sd_assumed="yes"), "residual_sd_assumed"),
    # an integer beyond any float (JSON allows it) is a number no interval can use
    (lambda d: d.update(covariance=[[10 ** 400, 0.0], [0.0, 2e-3]]), "covariance"),
    (lambda d: d["parameters"]["gemm_scale"].update(stderr=10 ** 400),
     "parameters.gemm_scale.stderr"),
    # fields that had been read as anything (a user's run-through): true is not schema 1, an
    # unknown key of a nested object is not dropped, runs and kernels are objects
    (lambda d: d.update(schema_version=True), "schema_version"),
    (lambda d: d.update(fragmentation_spread={"sd": 0.01, "readings": 3, "foo": 1}),
     "fragmentation_spread.foo"),
    (lambda d: d.update(runs=[1, 2, "a"]), "runs"),
    (lambda d: d["runs"][0].update(extra=1), "runs[0].extra"),
    # a run's times and memory are measurements: above 0 (a -1 had been read)
    (lambda d: d["runs"][0].update(measured_s=-1), "runs[0].measured_s"),
    (lambda d: d["runs"][1].update(after_s=0), "runs[1].after_s"),
    (lambda d: d["runs"][0].pop("before_s"), "runs[0].before_s"),
    (lambda d: d["runs"][0].update(memory_gib=-3.0), "runs[0].memory_gib"),
    (lambda d: d.update(kernels="abc"), "kernels"),
    (lambda d: d.update(device=123), "device"),
    (lambda d: d.update(residual_sd_assumed=True), "residual_sd_assumed"),  # dof given
    # an sd wider than the parameter's whole range (intervals to 1e22 s had been printed),
    # a fragmentation spread wider than fragmentation's 0 to 1
    (lambda d: d.update(covariance=[[1e6, 0.0], [0.0, 2e-3]]), "covariance"),
    (lambda d: d.update(fragmentation_spread={"sd": 1e9, "readings": 3}),
     "fragmentation_spread"),
    # an auditor's hand edits: each had been read (a spread without its fragmentation said
    # "fitted on no reading"; degrees of freedom without a spread were dropped) or named
    # another field
    (lambda d: d.update(fragmentation_spread={"sd": 0.01, "readings": 3}),
     "fragmentation_spread"),
    (lambda d: d.update(residual_sd_log=None), "residual_sd_log"),
    (lambda d: d.update(noise_prior_dof=-1), "noise_prior_dof"),
    (lambda d: d.pop("gpu"), "gpu"),
    (lambda d: d.pop("fitted"), "fitted"),
])
def test_profile_fields_that_would_break_an_interval_are_refused(tmp_path, edit, field):
    """What estimate and solve compute an interval from is checked when the profile is read:
    one SpecError naming the field (bench/fuzz.py's profile family found each as a traceback
    or a non-finite interval)."""
    prof, _ = fit(_runs({"gemm_scale": 0.9}, 0.02, seed=3, n=4),
                  ("gemm_scale", "network_scale"), "A100-80GB", fit_fragmentation=False)
    p = tmp_path / "cal.json"
    save_profile(p, prof)
    load_profile(p)
    doc = json.loads(p.read_text())
    edit(doc)
    p.write_text(json.dumps(doc))
    with pytest.raises(SpecError) as e:
        load_profile(p)
    assert e.value.field == field


def test_a_log_twice_or_a_measurement_no_parameter_explains_is_refused(tmp_path):
    """The same log given twice (or a copy of it) would count one run as several and shrink
    the intervals; a measurement 10x off its plan's prediction is another plan's run or a
    garbled line, and its fit had written a profile every command then refused
    (residual_sd_log 18.5)."""
    from formats.runs import calibration_runs
    log = tmp_path / "run.log"
    log.write_text((LOGS / "megatron_args_70b.txt").read_text()
                   + _megatron_timing_64())
    plan = tmp_path / "p.json"
    with pytest.raises(SpecError, match="more than once"):
        calibration_runs([str(log), str(log)], [str(plan)])
    copy = tmp_path / "copy.log"
    copy.write_text(log.read_text())
    runs, _ = calibration_runs([str(log)], None, ["example"])
    with pytest.raises(SpecError, match="the same readings as"):
        calibration_runs([str(log), str(copy)], None, ["example"])
    r = runs[0]
    for factor in (1e12, 1e-3):
        odd = dataclasses.replace(r, measured_s=r.measured_s * factor, label="odd.log")
        with pytest.raises(SpecError) as e:
            fit([r, odd], ("gemm_scale",), r.cluster.nodes[0].gpu.name)
        assert e.value.source == "odd.log" and "no parameter bridges" in str(e.value)


def _memory_runs(f_true: float, noise: float, seed: int, n: int, gbs_runs=None):
    """`_runs` with a reserved-peak reading each: the largest stage's tensors x (1 + f_true +
    noise x N(0, 1))."""
    from model.estimator import estimate
    rng = np.random.default_rng(seed)
    runs = gbs_runs if gbs_runs is not None else _runs({}, 0.01, seed=seed, n=n)
    for r in runs:
        est = estimate(r.model, r.job, r.cluster, r.plan, r.options)
        tensors = max(st.memory.total_gib - st.memory.allowance_gib for st in est.stages)
        r.memory_gib = tensors * (1 + f_true + noise * rng.normal())
        r.memory_kind = "reserved"
    return runs


def test_memory_interval_from_the_readings_spread(tmp_path):
    """Six runs with reserved-peak readings (fragmentation 0.15, 3 points of noise): the
    profile keeps their spread, plans under it get a 95% memory interval that holds new
    readings of 12 other plans, a plan whose interval reaches past the GPU's memory is flagged,
    and one reading gives no interval and says why (estimate and solve print both)."""
    from model.calibration import memory_interval_gib
    from model.estimator import estimate
    runs = _memory_runs(0.15, 0.03, seed=11, n=6)
    prof, _ = fit(runs, ("gemm_scale",), "A100-80GB")
    assert prof.fragmentation_readings == 6 and 0.005 < prof.fragmentation_sd < 0.08
    assert prof.values["fragmentation"] == pytest.approx(0.15, abs=0.05)
    held = _runs({}, 0.0, seed=2, n=24)[12:]
    rng = np.random.default_rng(12)
    inside = 0
    for r in held:
        c, opts = apply_profile(prof, r.cluster, r.options)
        est = estimate(r.model, r.job, c, r.plan, opts)
        mi = memory_interval_gib(prof, est)
        assert mi.low_gib < mi.peak_gib < mi.high_gib
        big = max(est.stages, key=lambda st: st.memory.total_gib)
        tensors = big.memory.total_gib - big.memory.allowance_gib
        new = tensors * (1.15 + 0.03 * rng.normal()) + big.memory.context_gib
        inside += mi.low_gib <= new <= mi.high_gib
        # the same plan on GPUs whose memory ends inside the interval: flagged
        tight = [dataclasses.replace(st, limit_gib=mi.high_gib - 0.01) for st in est.stages]
        assert memory_interval_gib(prof, dataclasses.replace(est, stages=tuple(tight))
                                   ).may_not_fit_stage is not None
        assert mi.may_not_fit_stage is None or mi.high_gib > 80
    assert inside >= 11
    # a wide spread: the interval's ends keep fragmentation within the fit's 0 to 1 (its low
    # end had implied an allocator reserving less than its tensors, its top f = 1.135)
    from model.calibration import fragmentation_at_interval_top
    wide = dataclasses.replace(prof, fragmentation_sd=0.5)
    assert fragmentation_at_interval_top(wide) == 1.0
    c, opts = apply_profile(wide, held[0].cluster, held[0].options)
    est = estimate(held[0].model, held[0].job, c, held[0].plan, opts)
    mi = memory_interval_gib(wide, est)
    f = wide.values["fragmentation"]
    for st in est.stages:
        tensors = st.memory.total_gib - st.memory.allowance_gib
        assert mi.low_gib >= st.memory.total_gib - f * tensors - 1e-9
        assert mi.high_gib >= st.memory.total_gib
    big = max(est.stages, key=lambda st: st.memory.total_gib)
    tensors = big.memory.total_gib - big.memory.allowance_gib
    assert mi.high_gib == pytest.approx(big.memory.total_gib + (1.0 - f) * tensors)
    # the low end reaches down as far as the spread says, whatever the top's hold at f = 1:
    # at f = 0.98 it had been held to the top's 0.02 (an auditor's 87.3 GiB for 44.9)
    near_top = dataclasses.replace(wide, values={**wide.values, "fragmentation": 0.98})
    c, opts = apply_profile(near_top, held[0].cluster, held[0].options)
    est = estimate(held[0].model, held[0].job, c, held[0].plan, opts)
    mi = memory_interval_gib(near_top, est)
    lows = [st.memory.total_gib - 0.98 * (st.memory.total_gib - st.memory.allowance_gib)
            for st in est.stages]
    assert mi.low_gib == pytest.approx(max(lows))
    p = tmp_path / "mem.json"
    save_profile(p, prof)
    back = load_profile(p)
    assert (back.fragmentation_sd, back.fragmentation_readings) == (
        prof.fragmentation_sd, prof.fragmentation_readings)
    res = CliRunner().invoke(app, ["estimate", "--calibration", str(p), "-m", "gpt-3.6b",
                                   "--cluster", "example", "--gbs", "128", "--seq", "2048",
                                   "--tp", "2", "--pp", "2", "--recompute", "full", "--json"])
    assert res.exit_code == 0, res.output
    mj = json.loads(res.output)["memory_interval_gib"]
    assert mj["low"] < mj["peak"] < mj["high"] and mj["none_because"] is None
    one, _ = fit(_memory_runs(0.15, 0.03, seed=11, n=1), ("gemm_scale",), "A100-80GB")
    save_profile(p, one)
    res = CliRunner().invoke(app, ["estimate", "--calibration", str(p), "-m", "gpt-3.6b",
                                   "--cluster", "example", "--gbs", "128", "--seq", "2048",
                                   "--tp", "2", "--pp", "2", "--recompute", "full"])
    assert res.exit_code == 0, res.output
    assert "no memory interval: one memory reading" in " ".join(res.output.split())
    doc = json.loads(p.read_text())
    doc["fragmentation_spread"] = {"sd": 0.02, "readings": 1}
    p.write_text(json.dumps(doc))
    with pytest.raises(SpecError) as e:
        load_profile(p)
    assert e.value.field == "fragmentation_spread"


def test_safe_memory_judges_at_the_interval_top(tmp_path):
    """--safe-memory: memory is the top of the profile's 95% memory interval, the same number
    the interval gives (one memory model), solve chooses and records by it, and without a
    profile with a spread of memory readings it is one line naming the option."""
    prof, _ = fit(_memory_runs(0.15, 0.03, seed=11, n=6), ("gemm_scale",), "A100-80GB")
    p = tmp_path / "mem.json"
    save_profile(p, prof)
    args = ["estimate", "--calibration", str(p), "-m", "gpt-3.6b", "--cluster", "example",
            "--gbs", "128", "--seq", "2048", "--tp", "2", "--pp", "2", "--recompute", "full",
            "--json"]
    runner = CliRunner()
    point = json.loads(runner.invoke(app, args).output)
    safe = json.loads(runner.invoke(app, [*args, "--safe-memory"]).output)
    assert safe["estimate"]["peak_memory_gib"] == pytest.approx(
        point["memory_interval_gib"]["high"], rel=1e-9)
    assert safe["safe_memory"]["fragmentation"] > safe["safe_memory"]["fitted_fragmentation"]
    assert "memory_interval_gib" not in safe
    assert safe["estimate"]["iteration_ms"] == pytest.approx(point["estimate"]["iteration_ms"],
                                                             rel=1e-12)
    plan = tmp_path / "plan.json"
    from formats.clusters import cluster_to_toml
    (tmp_path / "c.toml").write_text(cluster_to_toml(uniform_cluster(2, 4, "A100-80GB", 240.0,
                                                                     25.0)))
    res = runner.invoke(app, ["solve", "--calibration", str(p), "--safe-memory", "-m",
                              "gpt-3.6b", "--cluster", str(tmp_path / "c.toml"), "--gbs", "32",
                              "--seq", "2048", "--time-limit", "30", "--json", "--save-plan",
                              str(plan)])
    assert res.exit_code == 0, res.output
    doc = json.loads(plan.read_text())
    assert doc["calibration"]["safe_memory"] == safe["safe_memory"]
    again = tmp_path / "again.json"
    res = runner.invoke(app, ["estimate", "--plan", str(plan), "--json", "--save-plan",
                              str(again)])
    got = json.loads(res.output)
    assert got["estimate"]["peak_memory_gib"] == pytest.approx(
        doc["estimate"]["peak_memory_gib"], rel=1e-9)
    # the recorded profile's path stays a path, in the JSON and in a plan saved again (it had
    # carried "(recorded in the plan file)")
    assert got["interval_s"]["profile"] == str(p) and got["interval_s"][
        "profile_recorded_in_plan"] is True
    assert json.loads(again.read_text())["calibration"]["profile"] == str(p)
    # another profile given for it: the plan's --safe-memory is not carried over, and that
    # is said (it had gone without a word, so fits could flip)
    res = runner.invoke(app, ["estimate", "--plan", str(plan), "--calibration", str(p),
                              "--json"])
    assert any("judged with --safe-memory" in w for w in json.loads(res.output)["warnings"])
    res = runner.invoke(app, ["estimate", "--plan", str(plan), "--calibration", str(p),
                              "--safe-memory", "--json"])
    assert not any("judged with --safe-memory" in w
                   for w in json.loads(res.output)["warnings"])
    res = runner.invoke(app, [*args[:1], *args[3:], "--safe-memory"])
    assert res.exit_code == 2 and "--safe-memory" in res.output
    one, _ = fit(_memory_runs(0.15, 0.03, seed=11, n=1), ("gemm_scale",), "A100-80GB")
    save_profile(p, one)
    res = runner.invoke(app, [*args, "--safe-memory"])
    assert res.exit_code == 2 and "--safe-memory" in res.output and "Traceback" not in res.output


def test_profile_file_round_trip_and_errors(tmp_path):
    runs = _runs({"gemm_scale": 0.9, "network_scale": 0.8}, 0.01, seed=3, n=4)
    prof, _ = fit(runs, ("gemm_scale",), "A100-80GB")
    p = tmp_path / "cal.json"
    save_profile(p, prof)
    again = load_profile(p)
    assert again.values == prof.values and again.gpu == "A100-80GB"
    c, _ = apply_profile(again, runs[0].cluster, Options())
    assert c.nodes[0].gpu.gemm_efficiency == pytest.approx(
        min(1.0, runs[0].cluster.nodes[0].gpu.gemm_efficiency * prof.values["gemm_scale"]))
    doc = json.loads(p.read_text())
    doc["parameters"]["gemm_scale"]["value"] = 9.0
    p.write_text(json.dumps(doc))
    with pytest.raises(SpecError) as e:
        load_profile(p)
    assert e.value.field == "parameters.gemm_scale.value"
    with pytest.raises(SpecError) as e:
        apply_profile(again, uniform_cluster(2, 8, "H100-SXM-80GB", 360.0, 45.0), Options())
    assert e.value.field == "gpu"


def _megatron_log(path: Path, seconds: float, n: int = 8) -> None:
    """A log in Megatron-LM's training_log format (megatron/training/training.py)."""
    lines = [f" [2026-11-30 10:00:{k:02d}.000000] iteration {k + 1:8d}/{100:8d} | consumed "
             f"samples: {256 * (k + 1):12d} | elapsed time per iteration (ms): "
             f"{seconds * 1e3 * (1.3 if k == 0 else 1.0):.1f} | learning rate: 1.0E-04 |"
             for k in range(n)]
    path.write_text("\n".join(lines) + "\n")


def test_cli_calibrate_then_estimate_with_intervals(tmp_path):
    runner = CliRunner()
    plans, logs = [], []
    truth = {"gemm_scale": 0.8, "network_scale": 0.7}
    for k, r in enumerate(_runs(truth, 0.01, seed=4, n=5)):
        pf = tmp_path / f"p{k}.json"
        from model.estimator import estimate
        save_plan(pf, r.model, r.job, r.cluster, r.plan, estimate(r.model, r.job, r.cluster,
                                                                  r.plan))
        lf = tmp_path / f"run{k}.log"
        _megatron_log(lf, r.measured_s)
        plans += ["--plan", str(pf)]
        logs.append(str(lf))
    out = tmp_path / "cal.json"
    res = runner.invoke(app, ["calibrate", *logs, *plans, "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["parameters"]["gemm_scale"]["value"] == pytest.approx(0.8, abs=0.08)
    assert [x["log"] for x in d["logs"]] == logs
    assert {x["warmup_skipped"] for x in d["logs"]} == {WARMUP_READINGS}
    # logs that print none of the run's settings: each plan taken unchecked, and said so
    assert {x["plan_checked_against_log"] for x in d["logs"]} == {False}
    res = runner.invoke(app, ["calibrate", *logs, *plans, "--out", str(out)])
    assert res.exit_code == 0 and f"{WARMUP_READINGS} warm-up skipped" in res.output
    assert res.output.count("taken as what ran, unchecked") == len(logs)
    res = runner.invoke(app, ["estimate", "--plan", str(tmp_path / "p0.json"),
                              "--calibration", str(out), "--json"])
    assert res.exit_code == 0, res.output
    iv = json.loads(res.output)["interval_s"]
    assert iv["low"] < iv["estimate"] < iv["high"]
    # a foreign log: one line, exit 2
    bad = tmp_path / "bad.log"
    bad.write_text("nothing here\n")
    res = runner.invoke(app, ["calibrate", str(bad), "--plan", str(tmp_path / "p0.json")])
    assert res.exit_code == 2 and "bad.log" in res.output and "Traceback" not in res.output


def test_a_calibrated_plan_file_carries_its_profile_and_is_never_scaled_twice(tmp_path):
    """A plan saved under a profile holds the cluster as measured and the profile whole: read
    back it re-evaluates to its stored estimate with the interval; --calibration replaces the
    carried profile (the same profile gives the same figures, not a second scaling); a fit on
    it starts from the measured cluster; calibrate refuses to overwrite an input."""
    runner = CliRunner()
    r = _runs({"gemm_scale": 0.8, "network_scale": 0.7}, 0.01, seed=4, n=4)[0]
    from model.estimator import estimate
    raw = tmp_path / "raw.json"
    save_plan(raw, r.model, r.job, r.cluster, r.plan, estimate(r.model, r.job, r.cluster, r.plan))
    prof, _ = fit(_runs({"gemm_scale": 0.8, "network_scale": 0.7}, 0.01, seed=5, n=5),
                  ("gemm_scale", "network_scale"), "A100-80GB")
    cal = tmp_path / "cal.json"
    save_profile(cal, prof)

    def est(*args):
        res = runner.invoke(app, ["estimate", *args, "--json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.output)

    first = est("--plan", str(raw), "--calibration", str(cal), "--save-plan",
                str(tmp_path / "c.json"))
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["calibration"]["document"]["parameters"] == prof.to_dict()["parameters"]
    assert doc["cluster"] == json.loads(raw.read_text())["cluster"]  # as measured
    for again in (est("--plan", str(tmp_path / "c.json")),
                  est("--plan", str(tmp_path / "c.json"), "--calibration", str(cal))):
        assert again["estimate"]["iteration_ms"] == pytest.approx(
            first["estimate"]["iteration_ms"], rel=1e-12)
        assert again["interval_s"]["high"] == pytest.approx(first["interval_s"]["high"])
    assert doc["estimate"]["iteration_ms"] == pytest.approx(first["estimate"]["iteration_ms"],
                                                            rel=1e-12)
    plain = est("--plan", str(raw))["estimate"]["iteration_ms"]
    assert abs(plain / first["estimate"]["iteration_ms"] - 1) > 0.01  # the profile matters
    # a fit on the calibrated plan file starts from the measured cluster, as on the raw one
    log = tmp_path / "run.log"
    _megatron_log(log, r.measured_s)
    got = []
    for pf in (raw, tmp_path / "c.json"):
        res = runner.invoke(app, ["calibrate", str(log), "--plan", str(pf), "--fit",
                                  "gemm_scale", "--out", str(tmp_path / "f.json"), "--json"])
        assert res.exit_code == 0, res.output
        got.append(json.loads(res.output)["parameters"]["gemm_scale"]["value"])
    assert got[0] == pytest.approx(got[1], rel=1e-9)
    # a schema 2 plan file that was calibrated holds the scaled cluster: no second profile
    doc2 = dict(doc, schema_version=2)
    (tmp_path / "v2.json").write_text(json.dumps(doc2))
    res = runner.invoke(app, ["estimate", "--plan", str(tmp_path / "v2.json"),
                              "--calibration", str(cal)])
    assert res.exit_code == 2 and "cannot be calibrated again" in res.output
    res = runner.invoke(app, ["calibrate", str(log), "--plan", str(tmp_path / "v2.json")])
    assert res.exit_code == 2 and "scale twice" in res.output
    # the outputs never overwrite an input; a parameter named twice is refused
    res = runner.invoke(app, ["calibrate", str(log), "--plan", str(raw), "--out", str(log)])
    assert res.exit_code == 2 and "--out" in res.output and log.read_text().startswith(" [")
    res = runner.invoke(app, ["calibrate", str(log), "--plan", str(raw), "--fit",
                              "gemm_scale,gemm_scale", "--out", str(tmp_path / "x.json")])
    assert res.exit_code == 2 and "more than once" in res.output
    assert not (tmp_path / "x.json").exists()


def test_unknown_fields_of_plans_and_profiles_are_named_not_dropped(tmp_path):
    runner = CliRunner()
    r = _runs({"gemm_scale": 0.8}, 0.01, seed=4, n=4)[0]
    from model.estimator import estimate
    pf = tmp_path / "p.json"
    save_plan(pf, r.model, r.job, r.cluster, r.plan, estimate(r.model, r.job, r.cluster, r.plan))
    prof, _ = fit(_runs({"gemm_scale": 0.8}, 0.01, seed=5, n=4), ("gemm_scale",), "A100-80GB")
    cal = tmp_path / "cal.json"
    save_profile(cal, prof)
    for path, edit, field in (
            (pf, lambda d: d["job"].update(global_bach=8), "job.global_bach"),
            (pf, lambda d: d["plan"]["shape"].update(tpp=2), "plan.shape.tpp"),
            (pf, lambda d: d["cluster"]["nodes"][0].update(gpu_count=4),
             "cluster.nodes[0].gpu_count"),
            (pf, lambda d: d.update(extra=1), "extra"),
            (cal, lambda d: d.update(residual_sd_lg=0.1), "residual_sd_lg"),
            (cal, lambda d: d["parameters"]["gemm_scale"].update(std=0.1),
             "parameters.gemm_scale.std")):
        keep = path.read_text()
        d = json.loads(keep)
        edit(d)
        path.write_text(json.dumps(d))
        res = runner.invoke(app, ["estimate", "--plan", str(pf), "--calibration", str(cal)])
        path.write_text(keep)
        assert res.exit_code == 2, res.output
        line = " ".join(res.output.split())
        assert f"{field}: unknown field" in line and str(path) in line, line


def test_a_log_whose_readings_are_not_positive_is_refused(tmp_path):
    log = tmp_path / "zero.log"
    _megatron_log(log, 0.0)
    with pytest.raises(SpecError) as e:
        read_log(log)
    assert e.value.field == "log" and "must be positive" in e.value.problem


def test_solve_with_a_profile_gives_an_interval_and_names_a_toss_up(tmp_path):
    """`solve --calibration`: the profile's GPU-type scales apply, the best plan carries a 95%
    interval, and a runner-up inside it is named; the plan file records the profile."""
    from formats.clusters import SynthParams, cluster_to_toml, synth_cluster
    from model.calibration import Profile
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 1024,
           "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 2816,
           "vocab_size": 8000, "max_position_embeddings": 1024}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    c = synth_cluster(SynthParams(num_nodes=4, gpus_per_node=2, nic_gb_per_s=2.0, leaf_size=2,
                                  oversubscription=3, degraded=1, degraded_factor=0.3,
                                  noise=0.1, seed=0))
    (tmp_path / "c.toml").write_text(cluster_to_toml(c))
    # a wide interval (20% residual spread): the runner-up is a toss-up
    prof = Profile("A100-80GB", {"gemm_scale": 0.9, "network_scale": 0.8},
                   {"gemm_scale": 0.02, "network_scale": 0.05},
                   ("gemm_scale", "network_scale"), [[4e-4, 0.0], [0.0, 2.5e-3]], 0.2)
    save_profile(tmp_path / "cal.json", prof)
    plan = tmp_path / "plan.json"
    res = CliRunner().invoke(app, ["solve", "--model", str(tmp_path / "config.json"),
                                   "--cluster", str(tmp_path / "c.toml"), "--gbs", "8",
                                   "--seq", "1024", "--time-limit", "30", "--json",
                                   "--calibration", str(tmp_path / "cal.json"),
                                   "--save-plan", str(plan)])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    iv = d["interval_s"]
    assert iv["low"] < iv["estimate"] < iv["high"]
    assert iv["estimate"] == pytest.approx(d["solver"]["objective_ms"] / 1e3, rel=1e-9)
    assert iv["toss_up_with"] is not None and iv["toss_up_possible_with"] is None
    # the toss-up's own time, inside the best plan's interval and no faster than the best
    assert iv["estimate"] * 1e3 * (1 - 1e-9) <= iv["toss_up_with_ms"] <= iv["high"] * 1e3
    assert iv["toss_up_possible_with_bound_ms"] is None
    assert json.loads(plan.read_text())["calibration"]["gpu"] == "A100-80GB"


def test_compare_with_a_profile_gives_each_plan_its_interval(tmp_path):
    """compare --calibration: each row's plan carries its 95% interval (the README had
    promised one; rows had none), around the calibrated time the row reports."""
    from formats.clusters import SynthParams, cluster_to_toml, synth_cluster
    from model.calibration import Profile
    c = synth_cluster(SynthParams(num_nodes=2, gpus_per_node=4, seed=0))
    (tmp_path / "c.toml").write_text(cluster_to_toml(c))
    prof = Profile("A100-80GB", {"gemm_scale": 0.9, "network_scale": 0.8},
                   {"gemm_scale": 0.02, "network_scale": 0.05},
                   ("gemm_scale", "network_scale"), [[4e-4, 0.0], [0.0, 2.5e-3]], 0.05)
    save_profile(tmp_path / "cal.json", prof)
    args = ["compare", "-m", "gpt-1.7b", "-c", str(tmp_path / "c.toml"), "--gbs", "16",
            "--seq", "1024", "--time-limit", "2", "--clock", "work",
            "--calibration", str(tmp_path / "cal.json")]
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    for r in json.loads(res.output):
        t = r["iteration_ms"] / 1e3
        assert r["interval_low_s"] < t < r["interval_high_s"], r
        assert t == pytest.approx((r["interval_low_s"] * r["interval_high_s"]) ** 0.5,
                                  rel=1e-6)  # symmetric in log time
    res = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert res.exit_code == 0 and "95% interval s" in res.output, res.output


def test_toss_up_separates_timed_runners_up_from_bounds_only():
    """A runner-up timed inside the interval is a toss-up; failing that, a shape whose lower
    bound lies inside it (pruned, or timed only above it) is one the search cannot rule out;
    shapes that do not fit, and bounds above the interval, are neither."""
    from solvers.result import Candidate, SolveResult

    def result(*cands):
        return SolveResult(None, None, 100.0, 99.9, "optimal", "exact", 1.0,
                           [Candidate("best", 99.9, best_ms=100.0, status="best"), *cands])

    oom = Candidate("oom", 50.0, status="does not fit: stage 0 needs 90 GiB > 80 GiB")
    pruned = Candidate("pruned", 103.0, status="pruned: its lower bound is above the best plan")
    slow = Candidate("slow", 101.0, quick_ms=110.0, best_ms=108.0, status="slower")
    fast = Candidate("fast", 101.0, quick_ms=104.0, status="slower")
    assert result(oom, pruned, slow).toss_up(105.0) == (None, slow)
    assert result(oom, pruned).toss_up(105.0) == (None, pruned)
    assert result(oom, pruned, slow, fast).toss_up(105.0) == (fast, None)
    assert result(oom, pruned, slow, fast).toss_up(100.5) == (None, None)


def test_prior_keeps_what_few_runs_cannot_pin_near_the_presets():
    """Three noisy runs of a cluster whose presets are right: without the prior two
    parameters chase the noise; with it they stay nearer 1 and predict held-out plans
    better. With many runs the prior moves nothing beyond the error bars (the round-trip
    test above fits with it)."""
    names = ("gemm_scale", "network_scale")
    runs = _runs({}, 0.05, seed=3, n=3)
    free, _ = fit(runs, names, "A100-80GB", prior=False)
    held, _ = fit(runs, names, "A100-80GB")
    assert max(abs(math.log(held.values[n])) for n in names) < max(
        abs(math.log(free.values[n])) for n in names)
    test = _runs({}, 0.0, seed=4, n=12)
    err = [np.median([abs(_predict(r, p.values, "A100-80GB") / r.measured_s - 1) for r in test])
           for p in (free, held)]
    assert err[1] < err[0]


def test_runs_the_parameters_cannot_reconcile_weigh_the_prior_more(monkeypatch):
    """Three runs off by +25%, -20% and 0% from a right preset: the spread the fit leaves is
    far above NOISE_SD, so the empirical-Bayes fit keeps the parameters nearer 1 than one fit
    at NOISE_SD does. Runs the model explains (2% noise) fit the same either way."""
    from model import calibration
    names = ("gemm_scale", "network_scale")
    runs = _runs({}, 0.0, seed=5, n=3)
    for run, f in zip(runs, (1.25, 0.8, 1.0)):
        run.measured_s *= f
    eb, _ = fit(runs, names, "A100-80GB")
    monkeypatch.setattr(calibration, "EMPIRICAL_NOISE", False)
    once, _ = fit(runs, names, "A100-80GB")
    dist = [max(abs(math.log(p.values[n])) for n in names) for p in (eb, once)]
    assert dist[0] < 0.8 * dist[1]
    good = _runs({"gemm_scale": 0.9}, 0.02, seed=6, n=6)
    a, _ = fit(good, names, "A100-80GB")
    monkeypatch.setattr(calibration, "EMPIRICAL_NOISE", True)
    b, _ = fit(good, names, "A100-80GB")
    assert a.values == pytest.approx(b.values, rel=1e-9)


def test_runs_all_far_from_the_presets_are_calibrated():
    """Runs the parameters explain, all 2x slower than the presets (a throttled cluster):
    the fit reaches them (gemm_scale had stayed at 0.96, every run still -49%: the spread of
    the prior's own fit had been fed back as noise, making the prior heavier each round)."""
    names = ("gemm_scale",)
    runs = _runs({"gemm_scale": 0.45}, 0.01, seed=7, n=3)
    prof, pairs = fit(runs, names, "A100-80GB")
    assert prof.values["gemm_scale"] == pytest.approx(0.45, rel=0.1)
    assert all(abs(after / r.measured_s - 1) < 0.05 for r, (_b, after) in
               zip(runs, pairs.values()))


def test_intra_node_latency_is_a_parameter_the_fit_recovers(tmp_path):
    """intra_latency_scale multiplies the cluster's per-step latency of collectives inside a
    node (ClusterSpec.intra_latency_us), which each tensor-parallel all-reduce pays 2 (TP - 1)
    times: it slows a TP 8 plan far more than a TP 1 plan of the same node; runs with 20x the
    preset latency and 2% noise calibrate back to it within 3 standard errors; cluster and
    plan files keep a cluster's own latency; the solver's objective is the estimator's time
    under it (one cost model)."""
    import dataclasses

    from formats.clusters import cluster_to_toml, load_cluster
    from formats.planfile import load_plan, save_plan
    from model.estimator import estimate
    from solvers.search import solve
    c = uniform_cluster(4, 8, "A100-80GB", 240.0, 6.0)
    slow, _ = apply_profile(None, c, Options(), {"intra_latency_scale": 20.0})
    assert slow.intra_latency_us == pytest.approx(20 * c.intra_latency_us)
    m, job = presets.model("gpt-3.6b"), JobSpec(global_batch=128, seq_length=2048)
    one = uniform_cluster(1, 8, "A100-80GB", 240.0, 6.0)
    one_slow, _ = apply_profile(None, one, Options(), {"intra_latency_scale": 20.0})
    ratio = {}
    for tp in (8, 1):
        plan = make_plan(m, job, one, tp=tp, pp=1, micro_batch=1, recompute="full")
        a, b = (estimate(m, job, cl, plan).iteration_ms for cl in (one, one_slow))
        ratio[tp] = b / a
    assert ratio[8] > 1.05 and ratio[1] < 1.001, ratio  # TP 1: one data-parallel sync only
    runs = _assert_recovered({"gemm_scale": 0.9, "intra_latency_scale": 20.0}, seed=3)
    odd = dataclasses.replace(c, intra_latency_us=37.5)
    p = tmp_path / "c.toml"
    p.write_text(cluster_to_toml(odd))
    assert load_cluster(str(p)).intra_latency_us == 37.5
    res = solve(m, job, odd, time_limit_s=30)
    est = estimate(m, job, odd, res.plan)
    assert est.iteration_ms == pytest.approx(res.objective_ms)
    save_plan(tmp_path / "p.json", m, job, odd, res.plan, est)
    assert load_plan(tmp_path / "p.json")[2].intra_latency_us == 37.5
    # the CLI fits it from logs and says what the value means
    args = []
    for k, r in enumerate(runs[:6]):
        pf, lf = tmp_path / f"q{k}.json", tmp_path / f"q{k}.log"
        save_plan(pf, r.model, r.job, r.cluster, r.plan, estimate(r.model, r.job, r.cluster,
                                                                  r.plan))
        _megatron_log(lf, r.measured_s)
        args += [str(lf), "--plan", str(pf)]
    out = CliRunner().invoke(app, ["calibrate", *args, "--fit", "gemm_scale,intra_latency_scale",
                                   "--out", str(tmp_path / "cal.json")])
    assert out.exit_code == 0, out.output
    assert "x the cluster's intra_latency_us" in " ".join(out.output.split())


def test_a_parameter_no_run_depends_on_is_reported_uninformed(tmp_path):
    """Runs without tensor parallelism whose data-parallel rings all cross nodes never pay the
    intra-node latency: fitting intra_latency_scale on them leaves it at its prior and the
    profile names it (the calibrate report says to add runs that exercise it); the GEMM scale,
    which every run depends on, is not named."""
    model = presets.model("gpt-3.6b")
    c = uniform_cluster(4, 1, "A100-80GB", 240.0, 6.0)  # one GPU per node: no intra ring
    runs = []
    for k, pp in enumerate((1, 2, 4, 1)):
        job = JobSpec(global_batch=64 * (1 + k), seq_length=2048)
        plan = make_plan(model, job, c, tp=1, pp=pp, micro_batch=1, recompute="full")
        run = Run(model, job, c, plan, Options(), 1.0, label=f"r{k}")
        run.measured_s = _predict(run, {"gemm_scale": 0.9}, "A100-80GB")
        runs.append(run)
    prof, _ = fit(runs, ("gemm_scale", "intra_latency_scale"), "A100-80GB",
                  fit_fragmentation=False)
    assert prof.uninformed == ("intra_latency_scale",)
    assert prof.values["intra_latency_scale"] == pytest.approx(1.0, abs=0.05)
    assert prof.values["gemm_scale"] == pytest.approx(0.9, rel=0.02)
    assert prof.to_dict()["uninformed"] == ["intra_latency_scale"]
    save_profile(tmp_path / "p.json", prof)
    assert load_profile(tmp_path / "p.json").uninformed == ("intra_latency_scale",)
    d = json.loads((tmp_path / "p.json").read_text())
    d["uninformed"] = ["nvlink_scale"]  # not fitted
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(SpecError, match="uninformed"):
        load_profile(tmp_path / "bad.json")


def test_kernel_overhead_is_an_absolute_parameter_the_fit_recovers():
    """kernel_overhead_us is fitted as the GPU's per-kernel gap itself (the presets' is 0, so a
    multiplier could not move it): it starts at the preset, its prior is on the distance from
    it, runs made with 8 us and 2% noise fit back to it within 3 standard errors, and ending
    at 0 (no overhead) is not reported as a bound the runs push against."""
    _assert_recovered({"gemm_scale": 0.9, "kernel_overhead_us": 8.0}, seed=5)
    zero, _ = fit(_runs({"gemm_scale": 0.9}, 0.0, seed=5, n=6),
                  ("gemm_scale", "kernel_overhead_us"), "A100-80GB", fit_fragmentation=False)
    # the prior pulls gemm_scale toward 1 a little, the overhead makes up for it: < 2 us
    assert zero.values["kernel_overhead_us"] < 2.0 and zero.at_bounds() == {}
    from model.calibration import Profile
    assert Profile("A100-80GB", {"kernel_overhead_us": 0.0}).at_bounds() == {}
    assert Profile("A100-80GB", {"kernel_overhead_us": 50.0}).at_bounds() == {
        "kernel_overhead_us": "upper"}


def test_every_command_says_which_runs_and_nodes_a_profile_calibrates(tmp_path):
    """validate names the profile and how many runs it calibrated; compare puts it in its
    title and rows; on a cluster mixing GPU types estimate says what the profile leaves out."""
    runner = CliRunner()
    prof, _ = fit(_runs({"gemm_scale": 0.8, "network_scale": 0.7}, 0.01, seed=5, n=5),
                  ("gemm_scale", "network_scale"), "A100-80GB")
    cal = tmp_path / "cal.json"
    save_profile(cal, prof)
    res = runner.invoke(app, ["validate", "--calibration", str(cal), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    d = out["calibration"]
    assert d["gpu"] == "A100-80GB" and 0 < d["runs_calibrated"] < d["runs"]
    # each calibrated run with a published time is judged against its 95% interval (it had
    # none), and the count is what the rows say
    rows = [r for r in out["runs"] if r["interval_low_s"] is not None]
    judged = [r for r in rows if r["published_s"] is not None]
    assert d["judged"] == len(judged) > 0 and len(rows) == d["runs_calibrated"]
    assert d["inside_interval"] == sum(r["interval_low_s"] <= r["published_s"]
                                       <= r["interval_high_s"] for r in judged)
    assert all(r["interval_low_s"] < r["predicted_s"] < r["interval_high_s"] for r in rows)
    # the table shows them too (only the JSON had), a column of its own
    res = runner.invoke(app, ["validate", "--calibration", str(cal)])
    assert res.exit_code == 0 and "95% interval s" in res.output, res.output
    r0 = rows[0]
    assert f"{r0['interval_low_s']:.2f}-{r0['interval_high_s']:.2f}" in res.output
    res = runner.invoke(app, ["compare", "--calibration", str(cal), "--json", "--tp", "8",
                              "--pp", "4", "--time-limit", "5"])
    assert res.exit_code == 0, res.output
    assert {r["calibration"] for r in json.loads(res.output)} == {str(cal)}
    mixed = tmp_path / "mixed.toml"
    mixed.write_text('name = "mixed"\n[[nodes]]\nname = "a"\ngpu = "A100-80GB"\ngpus = 8\n'
                     'intra_gb_per_s = 240.0\n[[nodes]]\nname = "h"\ngpu = "H100-SXM-80GB"\n'
                     'gpus = 8\nintra_gb_per_s = 360.0\n[inter]\n'
                     'gb_per_s = [[0.0, 20.0], [20.0, 0.0]]\n')
    res = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-c", str(mixed), "--gbs", "32",
                              "--seq", "4096", "--tp", "8", "--pp", "2", "--calibration",
                              str(cal), "--json"])
    assert res.exit_code == 0, res.output
    warns = json.loads(res.output)["warnings"]
    assert any("H100-SXM-80GB nodes keep their presets" in w and "network_scale" in w
               for w in warns), warns


def test_a_plan_files_calibration_section_is_checked(tmp_path):
    """The calibration a plan file carries: an unknown key, or a gpu / parameters summary that
    contradicts the profile document it applies, is one line naming the field (they had been
    accepted and ignored); --calibration replaces it, damaged or not."""
    prof, _ = fit(_runs({"gemm_scale": 0.9}, 0.02, seed=3, n=4), ("gemm_scale",), "A100-80GB",
                  fit_fragmentation=False)
    cal = tmp_path / "cal.json"
    save_profile(cal, prof)
    plan = tmp_path / "plan.json"
    runner = CliRunner()
    base = ["estimate", "-m", "gpt-1.7b", "--gbs", "64", "--seq", "2048", "--tp", "2",
            "--pp", "2"]
    r = runner.invoke(app, [*base, "--calibration", str(cal), "--save-plan", str(plan)])
    assert r.exit_code == 0, r.output
    good = json.loads(plan.read_text())
    for edit, field in ((lambda c: c.update(foo=1), "calibration.foo"),
                        (lambda c: c.update(gpu="H100-SXM-80GB"), "calibration.gpu"),
                        (lambda c: c["parameters"].update(gemm_scale=0.5),
                         "calibration.parameters")):
        doc = json.loads(json.dumps(good))
        edit(doc["calibration"])
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(doc))
        r = runner.invoke(app, ["estimate", "--plan", str(bad)])
        assert r.exit_code == 2 and f"{field}:" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1
        r = runner.invoke(app, ["estimate", "--plan", str(bad), "--calibration", str(cal)])
        assert r.exit_code == 0, r.output


def test_a_log_of_another_framework_than_its_plan_is_refused(tmp_path):
    """A torchtitan log paired with a plan priced for Megatron-LM: the fit would put the
    frameworks' difference into the cost parameters; one line says how to re-price the plan
    (it had been fitted without a word)."""
    plan = tmp_path / "mg.json"
    r = CliRunner().invoke(app, ["estimate", "-m", "llama3-8b", "-c", "h100-8x8", "--gbs",
                                 "64", "--seq", "8192", "--tp", "1", "--pp", "1",
                                 "--save-plan", str(plan)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["calibrate", str(LOGS / "torchtitan.log"), "--plan", str(plan),
                                 "--out", str(tmp_path / "c.json")])
    assert r.exit_code == 2 and "the log is torchtitan's" in r.output, r.output
    assert "--framework torchtitan" in r.output and not (tmp_path / "c.json").exists()


def test_calibrate_without_plan_or_cluster_asks_for_one():
    """Neither --plan nor --cluster: the line asks for one of them (it had ended '; not both',
    as if both were given)."""
    r = CliRunner().invoke(app, ["calibrate", str(LOGS / "megatron.log")])
    line = " ".join(r.output.split())
    assert r.exit_code == 2 and "options: --plan/--cluster: give --plan" in line, line
    assert line.endswith("neither was given") and "not both" not in line


def test_framework_version_beside_a_plan_must_be_the_logs_and_the_plans(tmp_path):
    """--framework-version with --plan had been ignored: refused for a Megatron-LM log
    (torchtitan's release), and for a torchtitan log where the plan was priced for another
    release; the plan's own release is accepted."""
    plans = {}
    for fw, extra in (("megatron", []), ("torchtitan", ["--framework", "torchtitan"])):
        plans[fw] = tmp_path / f"{fw}.json"
        r = CliRunner().invoke(app, ["estimate", "-m", "llama3-8b", "-c", "h100-8x8", "--gbs",
                                     "64", "--seq", "8192", "--tp", "1", "--pp", "1", *extra,
                                     "--save-plan", str(plans[fw])])
        assert r.exit_code == 0, r.output
    out = tmp_path / "c.json"
    for log, plan, version, says in (
            ("megatron.log", "megatron", "0.1", "is torchtitan's release; this is a megatron"),
            ("torchtitan.log", "torchtitan", "0.1", "was priced for torchtitan 0.2"),
            ("torchtitan.log", "torchtitan", "0.3", "torchtitan's releases are 0.2, 0.1")):
        r = CliRunner().invoke(app, ["calibrate", str(LOGS / log), "--plan", str(plans[plan]),
                                     "--framework-version", version, "--out", str(out)])
        line = " ".join(r.output.split())
        assert r.exit_code == 2 and "--framework-version: " in line and says in line, line
    assert not out.exists()
    r = CliRunner().invoke(app, ["calibrate", str(LOGS / "torchtitan.log"), "--plan",
                                 str(plans["torchtitan"]), "--framework-version", "0.2",
                                 "--out", str(out)])
    assert "--framework-version" not in r.output, r.output


@pytest.mark.parametrize("ms,says", [("nan", "reads nan s"), ("-5.0", "reads -0.005 s"),
                                     ("0.0", "reads 0 s")])
def test_a_nan_or_negative_iteration_time_is_refused_as_a_zero_is(tmp_path, ms, says):
    """'elapsed time per iteration (ms): nan' or ': -5.0' had been passed over as no reading
    (neither read nor counted), while ': 0.0' was refused: each is refused, naming its step."""
    log = tmp_path / "bad.log"
    _megatron_log(log, 1.0)
    lines = log.read_text().splitlines()
    lines[5] = lines[5].replace("1000.0 |", f"{ms} |")
    log.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecError) as e:
        read_log(log)
    assert e.value.field == "log" and f"step 6 {says}" in e.value.problem


def test_a_profile_of_another_schema_says_how_to_get_one(tmp_path):
    """A profile of another schema_version: the line says to calibrate again (it had said
    only which version is read)."""
    prof, _ = fit(_runs({"gemm_scale": 0.9}, 0.02, seed=3, n=4), ("gemm_scale",), "A100-80GB",
                  fit_fragmentation=False)
    p = tmp_path / "cal.json"
    save_profile(p, prof)
    doc = json.loads(p.read_text())
    doc["schema_version"] += 1
    p.write_text(json.dumps(doc))
    with pytest.raises(SpecError) as e:
        load_profile(p)
    assert e.value.field == "schema_version" and "`calibrate` on the runs' logs" in (
        e.value.problem) and "probe/gemm.py" in e.value.problem


def test_an_underdetermined_fit_without_the_prior_is_refused(tmp_path):
    """--no-prior with fewer runs than fitted parameters: many values fit the runs exactly, so
    no profile is written (one had been, from 1 run for all 7 parameters); with the prior, or
    with as many runs as parameters, the fit goes on."""
    from model.calibration import TIME_PARAMETERS
    from model.estimator import estimate
    args = []
    for k, r in enumerate(_runs({"gemm_scale": 0.9}, 0.01, seed=5, n=2)):
        pf, lf = tmp_path / f"p{k}.json", tmp_path / f"run{k}.log"
        save_plan(pf, r.model, r.job, r.cluster, r.plan,
                  estimate(r.model, r.job, r.cluster, r.plan))
        _megatron_log(lf, r.measured_s)
        args.append((str(lf), "--plan", str(pf)))
    out = tmp_path / "cal.json"
    every = ",".join(TIME_PARAMETERS)
    r = CliRunner().invoke(app, ["calibrate", *args[0], "--fit", every, "--no-prior",
                                 "--out", str(out)])
    line = " ".join(r.output.split())
    n = len(TIME_PARAMETERS)
    assert r.exit_code == 2 and (f"options: --fit: {n} parameters from 1 run without the prior "
                                 f"is underdetermined: give at least {n}") in line, line
    assert not out.exists()
    two = [args[0][0], args[1][0], args[0][1], args[0][2], args[1][1], args[1][2]]
    for extra in (["--fit", "gemm_scale,network_scale", "--no-prior"], ["--fit", every]):
        r = CliRunner().invoke(app, ["calibrate", *two, *extra, "--out", str(out)])
        assert r.exit_code == 0, r.output


def test_a_parameter_at_its_cap_fits_downward():
    """hbm_scale at 1 on a GPU whose hbm_efficiency is already 1: a larger scale changes
    nothing (the efficiency is capped), a smaller one slows the element-wise kernels. Runs made
    with hbm_scale 0.5 fit back to it, and the parameter is not reported as one no run depends
    on (the step up alone had read so, and the fit had stayed at the preset)."""
    model = presets.model("gpt-3.6b")
    c = uniform_cluster(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    assert c.nodes[0].gpu.hbm_efficiency == 1.0
    runs = []
    for k, (tp, pp) in enumerate(((1, 1), (2, 2), (4, 1), (1, 4))):
        job = JobSpec(global_batch=64 * (1 + k), seq_length=2048)
        plan = make_plan(model, job, c, tp=tp, pp=pp, micro_batch=1)
        run = Run(model, job, c, plan, Options(), 1.0, label=f"r{k}")
        run.measured_s = _predict(run, {"hbm_scale": 0.5}, "H100-SXM-80GB")
        assert run.measured_s > _predict(run, {}, "H100-SXM-80GB") * 1.01
        runs.append(run)
    prof, _ = fit(runs, ("hbm_scale",), "H100-SXM-80GB", fit_fragmentation=False, prior=False)
    assert prof.uninformed == ()
    assert prof.values["hbm_scale"] == pytest.approx(0.5, rel=0.02)


def test_a_legacy_megatron_log_is_priced_with_its_scattered_pipeline_transfers():
    """Megatron-LM before Megatron-Core's pipeline schedules (2023-03) scattered each pipeline
    transfer over the tensor ranks: a log printing scatter_gather_tensors_in_pipeline True and
    none of the later versions' overlap_p2p_comm / context_parallel_size is read as such
    (JobSpec.p2p_scatter_gather; a 2021 BigScience Megatron-LM log had been priced with whole
    tensors). A later version prints the flag too, unused: whole tensors."""
    from formats.clusters import cluster as load_cluster
    from formats.megatron_args import plan_from_megatron_args

    ex = load_cluster("example")
    args = megatron_arg_blocks((LOGS / "megatron_args_70b.txt").read_text())[0]
    assert "context_parallel_size" in args
    core = {**args, "scatter_gather_tensors_in_pipeline": "True"}
    assert not plan_from_megatron_args(core, ex, source="t")[1].p2p_scatter_gather
    legacy = {k: v for k, v in core.items()
              if k not in ("context_parallel_size", "overlap_p2p_comm")}
    assert plan_from_megatron_args(legacy, ex, source="t")[1].p2p_scatter_gather
    off = {**legacy, "scatter_gather_tensors_in_pipeline": "False"}
    assert not plan_from_megatron_args(off, ex, source="t")[1].p2p_scatter_gather


def test_few_degrees_advice_does_not_ask_for_fewer_parameters_than_one(tmp_path):
    """calibrate's note on a spread of one or two degrees of freedom: with two parameters it
    suggests --fit gemm_scale; with gemm_scale alone fitted it asks for runs only (it had
    suggested the fit it was already running)."""
    import io

    from rich.console import Console

    import render
    runs = _runs({"gemm_scale": 0.9}, 0.02, seed=3, n=3)
    outs = {}
    for names in (("gemm_scale", "network_scale"), ("gemm_scale",)):
        prof, _ = fit(runs[:len(names) + 1], names, "A100-80GB", fit_fragmentation=False)
        assert prof.residual_dof == 1
        buf = io.StringIO()
        old = render.console
        render.console = lambda: Console(file=buf, width=300)
        try:
            render.print_calibration(prof, tmp_path / "c.json")
        finally:
            render.console = old
        outs[len(names)] = buf.getvalue()
    assert "so few that the 95% intervals span" in outs[1] and "--fit gemm_scale" not in outs[1]
    assert "fit fewer parameters (--fit gemm_scale)" in outs[2]
