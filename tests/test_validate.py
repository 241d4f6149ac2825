"""The estimator against published runs: the goals of the cost-model and sharding issues, held
by a test.

A100 runs (Megatron-LM, DeepSpeed): median |time error| at most 7%, no source group's median
above 12%, and no trend with model size over Narayanan et al. Table 1 (slope within 3 points
per decade). Memory (BLOOM nvidia-smi readings of stage 0): every published OOM predicted above
the GPU's memory and every run that ran within it; median at most 5%; worst error as measured
(13.4%, above the issue's 10% goal: see bench/README.md), held here so that it cannot grow
unnoticed. ZeRO-3 runs of Narayanan et al. Table 2: each within 15%. torchtitan's H100 runs
(FSDP2, Float8, async TP, PP, CP): at least 16 of the 18 modelled, median |time error| at most
7%, median |memory error| at most 10% and none above 10% (9.5% measured), and the eager and
torch.compile 8B rows within 5% each.
"""

import dataclasses
import functools
import math
import statistics

from formats.published import Summary, load_runs, run_to_inputs, validate as _validate
from model.estimator import estimate


@functools.lru_cache(maxsize=1)
def validate():
    """All published runs, compared once for the three tests."""
    return _validate()


def test_published_runs_within_goals():
    everything = validate()
    s = everything.a100()
    assert len(s._errs("time_err")) >= 30
    assert s.time_median <= 0.07, f"median iteration-time error {s.time_median:.3f}"
    for group, (med, n) in s.group_medians().items():
        assert med <= 0.12, f"{group}: median {med:.3f} over {n} runs"
    slope = s.size_trend()
    assert abs(slope) <= 3.0, f"error vs log10(params): {slope:+.2f} points per decade"
    bloom_mem = [x.mem_err for x in s.rows if x.mem_err is not None]
    assert len(bloom_mem) >= 10
    assert s.mem_median <= 0.05, f"BLOOM memory median {s.mem_median:.3f}"
    assert max(bloom_mem) <= 0.135, f"BLOOM memory errors {sorted(bloom_mem)}"
    # per configuration: the DP 8 / TP 4 / PP 12 / micro-batch 2 run read twice (44 and 38 GB)
    # by the mean of its readings; 13 configurations, worst 13.4% as measured
    conf = s.config_mem_errs("bloom")
    assert len(conf) == len(bloom_mem) - 1 and max(conf) <= 0.135, sorted(conf)
    ok, n = s.oom_correct
    assert n >= 15 and ok == n, f"fits/OOM correct {ok}/{n}"


def test_deepspeed_rows_split_layers_as_deepspeed_did():
    """DeepSpeed's pipeline engine splits the transformer layers evenly (Megatron-DeepSpeed's
    partition_method='type:transformer'); BLOOM's production run also counted its two
    embedding layers ('type:transformer|embedding': 70 + 2 over 12 stages)."""
    runs = {r["id"]: r for r in load_runs()}
    prod = run_to_inputs(runs["bloom176b_production"])
    assert prod[3].shape.layers == (5,) + (6,) * 10 + (5,)
    pre = run_to_inputs(runs["bloom_prequel_02-25_181B_h14336_l72_dp8_tp2_pp24_mbs1_nh64"])
    assert pre[3].shape.layers == (3,) * 24
    assert any("type:transformer" in n for n in pre[4])
    megatron = run_to_inputs(runs["narayanan21_t1_145.6B"])  # Megatron-LM: its own split
    assert not any("partition_method" in n for n in megatron[4])


def test_zero3_rows_of_narayanan_table2():
    """Their throughput is far below PTD-P's on the same GPUs; the model has to say why:
    every layer's weights are gathered twice and its gradients reduce-scattered over all the
    data-parallel GPUs, and at 768 GPUs and more that traffic, not compute, sets the time."""
    rows = [x for x in validate().rows if "_zero3_" in x.id]
    assert len(rows) == 6 and all(x.skipped is None for x in rows)
    for x in rows:
        assert x.time_err <= 0.15, f"{x.id}: {x.predicted_s:.1f} s vs {x.published_s:.1f} s"
    # why: with the network 1000x faster the same plans would take at least 30% less time at
    # 768 GPUs and more (the all-gathers and reduce-scatters outlast the layers' compute)
    runs = {r["id"]: r for r in load_runs()}
    for x in rows:
        if int(x.id.rsplit("_", 1)[1].removesuffix("gpu")) < 768:
            continue
        model, job, cluster, plan, _ = run_to_inputs(runs[x.id])
        fast = dataclasses.replace(cluster, inter_gb_per_s=cluster.inter_gb_per_s * 1000)
        assert estimate(model, job, fast, plan).iteration_ms < 0.7 * x.estimate.iteration_ms


def test_torchtitan_rows():
    s = Summary([x for x in validate().rows if x.group.startswith("torchtitan")])
    modelled = [x for x in s.rows if x.skipped is None]
    assert len(modelled) >= 16
    assert s.time_median <= 0.07, f"torchtitan time median {s.time_median:.3f}"
    assert s.mem_median <= 0.10, f"torchtitan memory median {s.mem_median:.3f}"
    # every row, the 70B 2-D runs included (their loss_parallel step: model/memory.py)
    assert s.mem_max <= 0.10, sorted((x.mem_err, x.id) for x in s.rows if x.mem_err)[-3:]
    # what the reading counts (the allocator's reserved peak): the prediction less the CUDA
    # context, reported beside; as measured, median 3.0% and max 10.6%
    from model.specs import Overheads
    res = s.reserved_mem_errs()
    assert len(res) == sum(1 for x in s.rows if x.mem_err is not None) >= 16
    assert all(abs(x.predicted_gib - x.predicted_reserved_gib - Overheads().context_gib) < 1e-9
               for x in s.rows if x.predicted_reserved_gib is not None)
    assert statistics.median(res) <= 0.05 and max(res) <= 0.11, sorted(res)[-3:]
    # torch.compile's gain is the eager kernels' bytes: the eager and compiled 8B rows on 8
    # and 128 GPUs each within 5% (two of the four are the fit's rows, two are not)
    by_id = {x.id: x for x in modelled}
    for n in ("t1_8b_8gpu", "t3_8b_128gpu"):
        for suffix in ("FSDP", "FSDP_torchcompile"):
            x = by_id[f"torchtitan_{n}_{suffix}"]
            assert abs(x.time_err) <= 0.05, (x.id, x.time_err)
    # the rows' context parallelism and FSDP2 are in the plans they became
    runs = {r["id"]: r for r in load_runs()}
    for x in modelled:
        plan = run_to_inputs(runs[x.id])[3]
        assert plan.shape.cp == (runs[x.id]["cp"] or 1) and plan.shape.zero == 3


def test_validate_covers_the_dense_heldout_runs():
    """Every held-out dense run (H100, B200, GB200, GB300) is modelled with its published degrees,
    the recipes' FP8 weights where the distributed optimizer runs, and the 70B recipe's
    pipeline layout; the errors are printed by `validate`, not asserted (nothing is fitted to
    them)."""
    from formats.published import layout_layers, load_dense_heldout_runs, validate_dense_heldout
    runs = load_dense_heldout_runs()
    s = validate_dense_heldout()
    assert len(s.rows) == len(runs) >= 8
    gpus = set()
    for x, r in zip(s.rows, runs):
        assert x.skipped is None and math.isfinite(x.predicted_s) and x.published_s > 0
        m, job, c, plan, _notes = run_to_inputs(r)
        sh = plan.shape
        assert (sh.tp, sh.pp, sh.dp, sh.cp, sh.micro_batch) == (
            r["tp"], r["pp"], r["dp"], r["cp"], r["micro_batch_size"])
        assert job.fp8_param_gather == (sh.zero == 1)
        gpus.add(c.nodes[0].gpu.name)
    assert gpus == {"H100-SXM-80GB", "B200", "GB200", "GB300"}
    # the FP8-MX rows run MXFP8, the others per-tensor current scaling
    assert {run_to_inputs(r)[1].fp8_recipe for r in runs if "FP8-MX" in r["precision"]} == {
        "mxfp8"}
    lay = layout_layers("Et*2|(t*2|)*34,t*3|(t*2|)*3,tL")
    assert len(lay) == 40 and sum(lay) == 80 and lay[35] == 3 and lay[-1] == 1
    first = run_to_inputs(runs[0])[3].shape
    assert first.layers == lay


def test_bloom_memory_heldout_bench_builds_every_row():
    """bench/bloom_memory_heldout.py: each of the held-out BLOOM readings becomes a plan the
    estimator prices (no row dropped), and the bench prints its summary lines."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    rows = json.loads((root / "data" / "published_bloom_memory_heldout.json").read_text())["rows"]
    out = subprocess.run([sys.executable, str(root / "bench" / "bloom_memory_heldout.py")],
                         capture_output=True, text=True, check=True).stdout
    assert sum(1 for line in out.splitlines() if line.startswith("02-")) == len(rows) >= 40
    assert f"over {sum(1 for r in rows if r['memory_gb'])} readings" in out
    assert "fits/OOM predicted correctly: " in out and f"/{len(rows)}" in out


def test_bloom_time_heldout_rows_give_back_their_tflops():
    """data/published_bloom_time_heldout.json, transcribed by hand: every row from 02-21 on
    (after bigscience-workshop/Megatron-DeepSpeed PR #251) must give back its published
    TFLOPs from its shape, batch, GPU count and seconds per iteration through the formula that
    logged them, 96 B s l h^2 (1 + s/6h + V/16lh) (Narayanan et al. 2021 eq. 3 with full
    recompute; sequence 2048, vocabulary 250,880). A mistyped digit anywhere fails it."""
    from formats.published import load_bloom_heldout

    rows = load_bloom_heldout("time")["rows"]
    checked = 0
    for r in rows:
        if r["date"] < "02-21":
            continue
        b, s, l, h, v = r["global_batch_size"], 2048, r["num_layers"], r["hidden_size"], 250880
        flops = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        gpus = r["dp"] * r["tp"] * r["pp"]
        tflops = flops / (r["sec_per_iteration"] * gpus) / 1e12
        assert abs(tflops / r["tflops_published"] - 1) < 2e-3, r["line"]
        checked += 1
    assert checked >= 80 and len(rows) == len({r["line"] for r in rows})


def test_bloom_time_residuals_bench_builds_every_row():
    """bench/bloom_time_residuals.py: each held-out BLOOM time becomes a plan the estimator
    prices (no row dropped), and the bench prints the in-sample, held-out and launch-blocking
    parts."""
    import subprocess
    import sys
    from pathlib import Path

    from formats.published import load_bloom_heldout

    root = Path(__file__).resolve().parents[1]
    doc = load_bloom_heldout("time")
    out = subprocess.run([sys.executable, str(root / "bench" / "bloom_time_residuals.py")],
                         capture_output=True, text=True, check=True).stdout
    held = out.split("2. Held out")[1].split("the model: all")[0]
    assert sum(1 for line in held.splitlines() if line.startswith("02-")) == len(doc["rows"])
    assert f"the model: all {len(doc['rows'])} rows" in out
    assert "head dimension not a multiple of 8" in out and "3. Launch blocking" in out
    assert out.count("blocking/async") == 1


def test_every_guess_is_listed_and_each_time_says_its_source():
    """What a record leaves open and the reader fills in is in its assumptions: 16-bit
    precision without its kind (Narayanan et al.), ZeRO named without a stage (MT-NLG), a
    recipe's gradient precision not given (Megatron-Bridge MoE rows); the recompute note
    names BLOOM's script only on BLOOM rows; a derived time says whether it came from TFLOP/s
    or tokens/s (all had read TFLOP/s)."""
    from formats.published import load_moe_runs, validate_moe
    rows = {x.id: x for x in validate().rows}
    for rid, x in rows.items():
        if rid.startswith("narayanan21_"):
            assert any(a.startswith("fp16 assumed") for a in x.assumptions), rid
        if rid.startswith("mtnlg530b_"):
            assert "no ZeRO sharding (the source names ZeRO without a stage)" in x.assumptions
        if not x.group.startswith("bloom"):
            assert not any("production script" in a for a in x.assumptions), rid
        if x.group.startswith("torchtitan") and x.time_source != "published":
            assert x.time_source == "derived from tokens/s", rid
        if x.group.startswith("narayanan") and x.time_source != "published":
            assert x.time_source == "derived from TFLOP/s", rid
    moe = {x.id: x for x in validate_moe().rows}
    for r in load_moe_runs():
        said = any(a.startswith("gradients reduced in fp32") for a in moe[r["id"]].assumptions)
        assert said == ("grad_reduce_in_fp32 False" not in (r.get("other_settings") or "")), (
            r["id"])
