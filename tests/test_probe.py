"""The bandwidth probe: its round-robin schedule, and a real run over gloo on local processes."""

import itertools
import json
import multiprocessing
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from formats.clusters import load_cluster
from probe.gemm import free_port
from probe.p2p_bandwidth import round_robin

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("n", range(2, 11))
def test_round_robin_covers_every_pair_once(n):
    rounds = round_robin(n)
    # n even: n-1 rounds of n/2 pairs; n odd: n rounds of (n-1)/2 pairs (one node rests)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    for r in rounds:
        assert len(r) == n // 2
        flat = [x for p in r for x in p]
        assert len(flat) == len(set(flat))  # pairs of a round are disjoint
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))


def _node(rank: int, port: str, out: str) -> None:
    """One emulated node: the probe's own entry point, with torchrun's environment."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=port)
    from probe.p2p_bandwidth import main
    sys.exit(main(["-o", out, "--backend", "gloo", "--name-by", "rank", "--size-mb", "0.5",
                   "--iters", "2", "--warmup", "1"]))


def test_probe_gloo_four_local_nodes_round_trips(tmp_path):
    pytest.importorskip("torch")
    import torch.distributed  # noqa: F401  (imported once here, inherited by the forked nodes)

    out = tmp_path / "bw.json"
    port = str(free_port())
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_node, args=(rank, port, str(out))) for rank in range(4)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    d = json.loads(out.read_text())
    assert d["nodes"] == ["rank0", "rank1", "rank2", "rank3"]
    assert len(d["rounds"]) == 3 and all(len(r) == 2 for r in d["rounds"])
    m = d["gb_per_s"]
    assert all(m[i][i] is None for i in range(4))
    assert all(m[i][j] > 0 for i in range(4) for j in range(4) if i != j)
    toml = tmp_path / "c.toml"
    r = CliRunner().invoke(app, ["cluster", "import", str(out), "--gpu", "A100-80GB",
                                 "--gpus-per-node", "8", "--intra-gb-per-s", "240",
                                 "-o", str(toml)])
    assert r.exit_code == 0, r.output
    c = load_cluster(toml)
    assert [nd.name for nd in c.nodes] == d["nodes"]
    assert c.inter_gb_per_s[1, 2] == pytest.approx(m[1][2], abs=0.006)


# -- the kernel probe (probe/gemm.py) ------------------------------------------------------------

def _synthetic_readings(truth: dict, noise: float, seed: int):
    """Readings the cost model itself predicts under known multipliers, with log-normal noise:
    the GEMM, attention and element-wise shapes of the GPU run and an 8-GPU node's rings."""
    import numpy as np

    from formats.presets import gpu as gpu_preset
    from formats.presets import model as model_preset
    from model.calibration import KernelReading, kernel_ms, scaled_gpu
    from model.cluster import INTRA_LATENCY_US
    from probe.gemm import GPU_COLLECTIVE_MIB, GPU_ELEMENTWISE_MIB, Sizes, gemm_shapes

    gpu = gpu_preset("H100-SXM-80GB")
    sz = Sizes(model_preset("llama3-8b"), 4096, (1, 2, 4, 8), (1, 2), GPU_ELEMENTWISE_MIB,
               GPU_COLLECTIVE_MIB, 8, "bf16")
    kernels = [KernelReading("elementwise", (int(3 * m * 2 ** 20),), "bf16", 1.0)
               for m in sz.elementwise_mib]
    kernels += [KernelReading("gemm", s, "bf16", 1.0) for s in gemm_shapes(sz, gpu)]
    kernels += [KernelReading("attention", (b, 32 // t, 4096, 128), "bf16", 1.0)
                for t in sz.tps for b in sz.mbs]
    kernels += [KernelReading(kind, (int(m * 2 ** 20), 8), "bf16", 1.0)
                for kind in ("allreduce", "allgather") for m in sz.collective_mib]
    rng = np.random.default_rng(seed)
    g = scaled_gpu(gpu, truth)
    intra = gpu.nvlink_gb_per_s * truth["nvlink_scale"]
    lat = INTRA_LATENCY_US * truth["intra_latency_scale"]
    return gpu, [KernelReading(k.kind, k.shape, k.dtype, kernel_ms(k, g, intra, lat)
                               * float(np.exp(rng.normal(0, noise)))) for k in kernels]


def test_kernel_fit_recovers_known_multipliers():
    """Readings made by the cost model under known multipliers (2% noise) are fitted back to
    them within 3 reported standard errors and 3%; noiseless ones exactly."""
    from model.calibration import fit_kernels
    truth = {"hbm_scale": 0.9, "gemm_scale": 0.85, "attention_scale": 1.3,
             "nvlink_scale": 0.7, "intra_latency_scale": 0.4, "kernel_overhead_us": 4.0}
    for seed in range(3):
        gpu, readings = _synthetic_readings(truth, 0.02, seed)
        prof = fit_kernels(readings, gpu, gpu.nvlink_gb_per_s)
        assert set(prof.values) == set(truth) and prof.planning
        for k, v in truth.items():
            se = prof.stderr[k]
            assert se is not None and 0 < se < 0.05 * v
            assert abs(prof.values[k] - v) <= max(3 * se, 0.03 * v), (k, prof.values[k], se)
    gpu, readings = _synthetic_readings(truth, 0.0, 0)
    prof = fit_kernels(readings, gpu, gpu.nvlink_gb_per_s)
    for k, v in truth.items():
        assert prof.values[k] == pytest.approx(v, rel=1e-4)
    assert all(r["after_ms"] == pytest.approx(r["measured_ms"], rel=1e-3) for r in prof.kernels)


def test_probe_profile_plans_with_an_interval_from_the_parameters(tmp_path):
    """A GPU probe's profile (no iteration residuals) is read back and used by `estimate`: the
    scales apply, and the interval comes from the parameters' standard errors alone."""
    from formats.profile import load_profile, save_profile
    from model.calibration import fit_kernels
    truth = {"hbm_scale": 0.9, "gemm_scale": 0.85, "attention_scale": 1.3,
             "nvlink_scale": 0.7, "intra_latency_scale": 0.4, "kernel_overhead_us": 4.0}
    gpu, readings = _synthetic_readings(truth, 0.03, 5)
    path = tmp_path / "probe.json"
    save_profile(path, fit_kernels(readings, gpu, gpu.nvlink_gb_per_s, device="H100 test"))
    back = load_profile(path)
    assert back.device == "H100 test" and len(back.kernels) == len(readings)
    assert back.residual_sd is None and len(back.covariance) == 6
    runner = CliRunner()
    args = ["estimate", "-m", "llama3-8b", "-c", "h100-8x8", "--tp", "2", "--pp", "2",
            "--gbs", "64", "--seq", "4096", "--json"]
    base = runner.invoke(app, args)
    cal = runner.invoke(app, args + ["--calibration", str(path)])
    assert base.exit_code == 0 and cal.exit_code == 0, cal.output
    t0 = json.loads(base.output)["estimate"]["iteration_ms"]
    d = json.loads(cal.output)
    assert d["estimate"]["iteration_ms"] != pytest.approx(t0, rel=1e-3)
    iv = d["interval_s"]
    assert iv["low"] < iv["estimate"] < iv["high"] and iv["high"] / iv["low"] < 1.2


def test_probe_fit_says_what_leaves_a_profile_without_interval_or_at_its_cap(tmp_path):
    """Impossible or thin readings are said, not passed on silently: GEMMs faster than the
    datasheet peak allows put gemm_efficiency at its cap (said, with what to check); a
    parameter with one reading has no standard error, which the probe says, and `estimate`
    then names that parameter as why there is no interval (it had advised calibrating on more
    runs, which a probe profile has none of); a reading of 0 ms names its kernel."""
    from formats.profile import load_profile, save_profile
    from model.calibration import KernelReading, fit_kernels, no_interval_reason
    from model.errors import SpecError
    truth = {"hbm_scale": 0.9, "gemm_scale": 0.85, "attention_scale": 1.3,
             "nvlink_scale": 0.7, "intra_latency_scale": 0.4, "kernel_overhead_us": 4.0}
    gpu, readings = _synthetic_readings(truth, 0.01, 7)
    fast = [KernelReading(k.kind, k.shape, k.dtype, k.measured_ms / 3 if k.kind == "gemm"
                          else k.measured_ms) for k in readings]
    prof = fit_kernels(fast, gpu, gpu.nvlink_gb_per_s)
    assert any(n.startswith("gemm_scale = ") and "gemm_efficiency at its cap" in n
               for n in prof.fit_notes), prof.fit_notes
    assert not any("gemm" in n for n in fit_kernels(readings, gpu,
                                                    gpu.nvlink_gb_per_s).fit_notes)
    attention = [k for k in readings if k.kind == "attention"]
    one = [k for k in readings if k.kind != "attention"] + attention[:1]
    prof = fit_kernels(one, gpu, gpu.nvlink_gb_per_s)
    assert prof.stderr["attention_scale"] is None and not prof.covariance
    assert ("attention_scale has no standard error (1 reading measures it; 2 or more give "
            "one): plans under this profile get no prediction interval") in prof.fit_notes
    path = tmp_path / "one.json"
    save_profile(path, prof)
    why = no_interval_reason(load_profile(path))
    assert why.startswith("no prediction interval: attention_scale has no standard error")
    assert "more runs" not in why and "probe/gemm.py" in why
    zero = readings[:-1] + [KernelReading(readings[-1].kind, readings[-1].shape, "bf16", 0.0)]
    with pytest.raises(SpecError) as e:
        fit_kernels(zero, gpu, gpu.nvlink_gb_per_s)
    assert e.value.field == "kernels" and f"{tuple(readings[-1].shape)}" in str(e.value)


@pytest.mark.parametrize("edit,field", [
    (lambda k: k.update(measured_ms=-5), "kernels[0].measured_ms"),
    (lambda k: k.update(measured_ms="abc"), "kernels[0].measured_ms"),
    (lambda k: k.clear(), "kernels[0].kind"),
    (lambda k: k.update(shape="bogus"), "kernels[0].shape"),
    (lambda k: k.update(shape=[1, 2]), "kernels[0].shape"),
    (lambda k: k.update(dtype="fp64"), "kernels[0].dtype"),
    (lambda k: k.update(after_ms=float("nan")), "kernels[0].after_ms")])
def test_probe_profile_kernel_records_are_checked(tmp_path, edit, field):
    """A probe profile's kernel records travel into plan files whole: a malformed one is one
    line naming it, not carried on (they had been checked for unknown keys only)."""
    from formats.profile import load_profile, save_profile
    from model.calibration import fit_kernels
    from model.errors import SpecError
    truth = {"hbm_scale": 0.9, "gemm_scale": 0.85, "attention_scale": 1.3,
             "nvlink_scale": 0.7, "intra_latency_scale": 0.4, "kernel_overhead_us": 4.0}
    gpu, readings = _synthetic_readings(truth, 0.02, 1)
    path = tmp_path / "p.json"
    save_profile(path, fit_kernels(readings, gpu, gpu.nvlink_gb_per_s))
    doc = json.loads(path.read_text())
    gemm = next(i for i, k in enumerate(doc["kernels"]) if k["kind"] == "gemm")
    doc["kernels"].insert(0, doc["kernels"].pop(gemm))
    edit(doc["kernels"][0])
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError) as e:
        load_profile(path)
    assert e.value.field == field, str(e.value)


def test_device_names_map_to_presets():
    from formats.presets import gpu_names
    from probe.gemm import DEVICE_PRESETS, device_preset
    assert device_preset("NVIDIA H100 80GB HBM3") == "H100-SXM-80GB"
    assert device_preset("NVIDIA H100 PCIe") == "H100-PCIe-80GB"
    assert device_preset("NVIDIA A100-SXM4-80GB") == "A100-80GB"
    assert device_preset("NVIDIA A100-SXM4-40GB") == "A100-40GB"
    assert device_preset("NVIDIA H200") == "H200-141GB"
    assert device_preset("NVIDIA B200") == "B200"
    assert device_preset("NVIDIA GB200") == "GB200"
    assert device_preset("Some Other GPU") is None
    assert {p for _, p in DEVICE_PRESETS} <= set(gpu_names())


def test_gemm_probe_cpu_test_mode_runs_and_is_refused_for_planning(tmp_path):
    """The probe's own entry point on the CPU (tiny shapes, gloo between 2 processes): it
    times every kind of kernel, fits every multiplier, marks the profile not for planning,
    and the CLI refuses that profile in one line with exit 2."""
    pytest.importorskip("torch")
    from probe.gemm import main
    out = tmp_path / "cpu.json"
    assert main(["-o", str(out), "--cpu", "--iters", "2", "--warmup", "1"]) == 0
    d = json.loads(out.read_text())
    assert d["kind"] == "pipette-calibration" and d["planning"] is False
    assert {k["kind"] for k in d["kernels"]} == {"elementwise", "gemm", "attention",
                                                 "allreduce", "allgather"}
    assert all(k["measured_ms"] > 0 and k["before_ms"] > 0 for k in d["kernels"])
    assert set(d["parameters"]) == {"hbm_scale", "gemm_scale", "attention_scale",
                                    "nvlink_scale", "intra_latency_scale", "kernel_overhead_us"}
    # a CPU is far slower than the A100 preset it is held against: lower rates; the gap per
    # kernel and gloo's latency are whatever the large kernels leave to them (a busy CPU's
    # memory is slow enough that a 48 KiB add is all bytes), so only their range is checked
    assert all(0 < p["value"] < 1 for k, p in d["parameters"].items()
               if k not in ("intra_latency_scale", "kernel_overhead_us"))
    assert d["parameters"]["kernel_overhead_us"]["value"] >= 0
    assert d["parameters"]["intra_latency_scale"]["value"] > 0
    r = CliRunner().invoke(app, ["estimate", "-m", "llama3-8b", "--tp", "2", "--pp", "2",
                                 "--gbs", "64", "--calibration", str(out)])
    assert r.exit_code == 2 and "not for planning" in r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1
    # --gpus 1 skips the collectives here as on a GPU (the CPU mode had run them anyway);
    # what the test mode does not take of the options given is said
    one = tmp_path / "one.json"
    said = []
    from probe.gemm import run
    run(["-o", str(one), "--cpu", "--gpus", "1", "--iters", "5", "--warmup", "1", "--seq",
         "8192", "--dtype", "fp16"], log=said.append)
    assert said[0] == ("test mode (CPU) runs tiny fp32 shapes: --seq, --dtype not used; "
                       "--iters 5 -> 3"), said[0]
    d = json.loads(one.read_text())
    assert {k["kind"] for k in d["kernels"]} == {"elementwise", "gemm", "attention"}


def test_loss_memory_matches_the_measured_peak():
    """The memory model's loss terms are the installed PyTorch's: the probe measures what
    torchtitan's loss step keeps for its backward and its peak, bytes per logit (fused
    cross-entropy and loss_parallel under TP, eager and compiled) with the profiler's
    allocator events, in its own process."""
    pytest.importorskip("torch")
    import subprocess

    from model.memory import LOSS_BYTES_PER_LOGIT
    out = subprocess.run([sys.executable, str(ROOT / "probe" / "loss_memory.py"), "--json",
                          "--tokens", "1024", "--vocab", "4096"],
                         capture_output=True, text=True, check=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])["bytes_per_logit"]
    assert set(got) == {"torchtitan", "torchtitan-loss-parallel", "torchtitan-compiled",
                        "torchtitan-compiled-loss-parallel"}
    for path, measured in got.items():
        assert measured == pytest.approx(LOSS_BYTES_PER_LOGIT[path], abs=0.05), path


@pytest.mark.parametrize("args, field", [
    (["--tp", "0"], "--tp"), (["--tp", "3"], "--tp"), (["--seq", "-5"], "--seq"),
    (["--gpus", "0"], "--gpus"), (["--nvlink-gb-per-s", "-3"], "--nvlink-gb-per-s"),
    (["--model", "nosuch"], "model")])
def test_gemm_probe_checks_its_arguments_in_either_mode(tmp_path, args, field, capsys):
    """The CPU test mode checks what the GPU mode uses, before measuring: a command that
    passes here passes on the GPU (it had written a profile for --tp 0)."""
    pytest.importorskip("torch")
    from probe import gemm
    out = tmp_path / "g.json"
    assert gemm.main(["--cpu", "-o", str(out), *args]) == 2
    assert f"{field}:" in capsys.readouterr().err and not out.exists()
