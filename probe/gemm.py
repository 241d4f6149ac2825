"""Kernel rates of one node's GPUs, fitted to the cost model's named parameters and written as
a calibration profile (the format `python cli.py calibrate` writes; README "Calibration
profiles").

    pip install -e '.[probe]'
    python probe/gemm.py -o probe_profile.json [--model llama3-70b --seq 4096] [--gpu NAME]
    python cli.py solve ... --calibration probe_profile.json

What is timed (each kernel: `--warmup` untimed calls, then `--iters` timed calls, CUDA events
around each on a GPU, perf_counter on the CPU; the median per call is the reading):
- GEMMs at the shapes the plan space uses: the four linear layers of one transformer layer of
  `--model` (QKV, output projection, MLP up and down: model/compute.py
  `ComputeModel.dense_linears`) at every TP of `--tp` that divides the heads and every
  micro-batch of `--mbs`, each as its forward, data- and weight-gradient GEMM
  (`linear_gemms`): `torch.matmul` on `--dtype` operands;
- causal attention: `torch.nn.functional.scaled_dot_product_attention(is_causal=True)`,
  forward plus backward, at the model's head dimension and heads / TP, per micro-batch;
- an element-wise kernel: `torch.add(a, b, out=c)` on 64 and 256 MiB tensors (3 tensors'
  bytes through HBM), and on 4 and 16 KiB ones (the per-kernel gap: launch and host dispatch);
- NCCL all-reduce and all-gather among `--gpus` GPUs of the node (one process each), buffers
  of 64 MiB to 1 GiB (the links' rate) and of 64 and 256 KiB (the per-step latency).

The fit (model/calibration.py `fit_kernels`) compares each reading with the cost model's own
prediction for it against the GPU preset (the device's name mapped to a preset, or `--gpu`):
`hbm_scale`, `gemm_scale`, `attention_scale`, `nvlink_scale` (against the node's NVLink rate
as the presets state it: the GPU's datasheet figure, or `--nvlink-gb-per-s`) and
`intra_latency_scale` (against the preset 10 us per ring step) and `kernel_overhead_us` (the
tiny kernels' time itself), each with its standard error.
The profile keeps every reading with its predicted time before and after, so
the fitted curve (achieved TFLOP/s against shape) can be read off it.

Test mode: without a CUDA device (or with `--cpu`) the same code runs on the CPU with tiny
shapes in fp32 and gloo between 2 processes, so that its test runs in CI. Those numbers are not
for planning: the profile says `"planning": false` and every command refuses it.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats.atomic import check_target  # noqa: E402
from formats.presets import gpu as gpu_preset  # noqa: E402
from formats.presets import model as model_preset  # noqa: E402
from formats.profile import save_profile  # noqa: E402
from model.calibration import KernelReading, fit_kernels  # noqa: E402
from model.compute import ComputeModel, linear_gemms  # noqa: E402
from model.errors import SpecError  # noqa: E402
from model.specs import GPUSpec, JobSpec, ModelSpec  # noqa: E402

# torch's device names -> GPU presets (data/gpus.json); the first match wins
DEVICE_PRESETS = (
    ("GB200", "GB200"), ("B200", "B200"), ("H200", "H200-141GB"),
    ("H100 PCIe", "H100-PCIe-80GB"), ("H100", "H100-SXM-80GB"),
    ("A100-PCIE-80GB", "A100-PCIe-80GB"), ("A100-SXM4-40GB", "A100-40GB"),
    ("A100-PCIE-40GB", "A100-40GB"), ("A100", "A100-80GB"), ("V100", "V100-32GB"),
    ("MI300X", "MI300X"), ("L40S", "L40S"),
)
GPU_COLLECTIVE_MIB = (0.0625, 0.25, 64, 256, 1024)
GPU_ELEMENTWISE_MIB = (1 / 256, 1 / 64, 64.0, 256.0)


@dataclass(frozen=True)
class Sizes:
    """What one run times: the model whose layer shapes the GEMMs take, TP degrees,
    micro-batches, the element-wise tensor, collective buffers and their ring size."""

    model: ModelSpec
    seq: int
    tps: tuple[int, ...]
    mbs: tuple[int, ...]
    elementwise_mib: tuple[float, ...]
    collective_mib: tuple[float, ...]
    gpus: int
    dtype: str


def tiny_model() -> ModelSpec:
    """The CPU test mode's model: a layer small enough to time in milliseconds on a CPU."""
    return ModelSpec(name="probe-tiny", num_layers=1, hidden_size=128, num_heads=4,
                     num_kv_heads=4, ffn_hidden_size=512, vocab_size=1024, seq_length=64)


def device_preset(name: str) -> str | None:
    up = name.upper()
    return next((p for key, p in DEVICE_PRESETS if key.upper() in up), None)


def gemm_shapes(sz: Sizes, gpu: GPUSpec) -> list[tuple[int, int, int]]:
    """The distinct (m, n, k) of the layer's linear layers over the TP and micro-batch
    choices, forward and both gradients (model/compute.py)."""
    out: list[tuple[int, int, int]] = []
    job = JobSpec(global_batch=max(sz.mbs), seq_length=sz.seq, precision=sz.dtype)
    for tp in sz.tps:
        for b in sz.mbs:
            cm = ComputeModel(sz.model, job, gpu, tp=tp, micro_batch=b,
                              sequence_parallel=False, fp8=False)
            for mnk in cm.dense_linears().values():
                out += [s for s in linear_gemms(*mnk) if s not in out and min(s) > 0]
    return out


def _timer(torch, device: str):
    """time_ms(fn, iters, warmup) -> median ms per call."""
    cuda = device == "cuda"

    def time_ms(fn, iters: int, warmup: int) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    return time_ms


def time_kernels(sz: Sizes, gpu: GPUSpec, device: str, iters: int, warmup: int,
                 log=print) -> list[KernelReading]:
    """Element-wise, GEMM and attention readings on this process's device."""
    import torch
    import torch.nn.functional as F
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[sz.dtype]
    esize = torch.tensor([], dtype=dt).element_size()
    time_ms = _timer(torch, device)
    out: list[KernelReading] = []

    for mib in sz.elementwise_mib:
        n = int(mib * 2 ** 20 // esize)
        a, b, c = (torch.randn(n, device=device).to(dt) for _ in range(3))
        ms = time_ms(lambda a=a, b=b, c=c: torch.add(a, b, out=c), iters, warmup)
        out.append(KernelReading("elementwise", (3 * n * esize,), sz.dtype, ms))
        log(f"  elementwise {3 * n * esize / 2 ** 10:.0f} KiB: {ms:.4f} ms, "
            f"{3 * n * esize / ms / 1e6:.1f} GB/s")
        del a, b, c

    shapes = gemm_shapes(sz, gpu)
    for m, nn, k in shapes:
        x = torch.randn(m, k, device=device).to(dt)
        w = torch.randn(k, nn, device=device).to(dt)
        ms = time_ms(lambda: torch.matmul(x, w), iters, warmup)
        out.append(KernelReading("gemm", (m, nn, k), sz.dtype, ms))
    gem = [r for r in out if r.kind == "gemm"]
    rates = [2.0 * r.shape[0] * r.shape[1] * r.shape[2] / r.measured_ms / 1e9 for r in gem]
    log(f"  {len(gem)} GEMMs: {min(rates):.2f}-{max(rates):.2f} TFLOP/s")

    m = sz.model
    for tp in sz.tps:
        for mb in sz.mbs:
            heads = m.num_heads // tp
            q, k_, v = (torch.randn(mb, heads, sz.seq, m.head_dim, device=device).to(dt)
                        .requires_grad_() for _ in range(3))
            g = torch.randn(mb, heads, sz.seq, m.head_dim, device=device).to(dt)

            def step(q=q, k_=k_, v=v, g=g):
                o = F.scaled_dot_product_attention(q, k_, v, is_causal=True)
                o.backward(g)
            ms = time_ms(step, iters, warmup)
            out.append(KernelReading("attention", (mb, heads, sz.seq, m.head_dim), sz.dtype, ms))
    log(f"  {len(sz.tps) * len(sz.mbs)} attention shapes timed")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collective_worker(rank: int, world: int, port: int, backend: str, sizes_bytes, iters: int,
                       warmup: int, dtype: str, queue) -> None:
    """One GPU's process: all-reduce then all-gather of each size; rank 0 puts the readings."""
    import torch
    import torch.distributed as dist
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = "cuda"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        time_ms = _timer(torch, device)
        # torch 2.13 renamed all_gather_into_tensor (same arguments)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        esize = torch.tensor([], dtype=dt).element_size()
        res = []
        for nbytes in sizes_bytes:
            n = int(nbytes // esize // world * world)
            buf = torch.ones(n, device=device, dtype=dt)
            shard = torch.ones(n // world, device=device, dtype=dt)

            # synchronous calls: the caller's stream waits for NCCL's, so the events (or
            # the clock, with gloo) bracket the whole collective
            for kind, fn in (("allreduce", lambda: dist.all_reduce(buf)),
                             ("allgather", lambda: gather(buf, shard))):
                dist.barrier()
                res.append((kind, n * esize, time_ms(fn, iters, warmup)))
        if rank == 0:
            queue.put(res)
    finally:
        dist.destroy_process_group()


def time_collectives(sz: Sizes, backend: str, iters: int, warmup: int,
                     log=print) -> list[KernelReading]:
    """All-reduce and all-gather among `sz.gpus` local processes (buffers in bytes; the
    reading's shape is (bytes, GPUs in the ring))."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    sizes = [int(mib * 2 ** 20) for mib in sz.collective_mib]
    procs = [ctx.Process(target=_collective_worker,
                         args=(r, sz.gpus, port, backend, sizes, iters, warmup, sz.dtype, queue))
             for r in range(sz.gpus)]
    for p in procs:
        p.start()
    try:
        res = queue.get(timeout=600)
    finally:
        for p in procs:
            p.join(timeout=60)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"a collective process failed (exit codes "
                           f"{[p.exitcode for p in procs]})")
    out = [KernelReading(kind, (nbytes, sz.gpus), sz.dtype, ms) for kind, nbytes, ms in res]
    for r in out:
        factor = 2.0 if r.kind == "allreduce" else 1.0
        busbw = factor * (sz.gpus - 1) / sz.gpus * r.shape[0] / r.measured_ms / 1e6
        log(f"  {r.kind} {r.shape[0] / 2 ** 20:.2f} MiB x {sz.gpus}: {r.measured_ms:.3f} ms, "
            f"bus {busbw:.1f} GB/s")
    return out


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SpecError(f"{text!r}: give comma-separated integers", source="options",
                        field=flag) from None
    if not vals or min(vals) < 1:
        raise SpecError(f"{text!r}: every value must be >= 1", source="options", field=flag)
    return vals


def run(argv: list[str] | None = None, log=print) -> dict:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("-o", "--output", required=True, help="Profile JSON to write.")
    ap.add_argument("--model", default="llama3-70b",
                    help="Model preset or HF config.json whose layer shapes the GEMMs take.")
    ap.add_argument("--seq", type=int, default=4096, help="Sequence length [4096].")
    ap.add_argument("--tp", default=None,
                    help="TP degrees [those of 1,2,4,8 that divide the model's heads].")
    ap.add_argument("--mbs", default="1,2", help="Micro-batch sizes [1,2].")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16",
                    help="Element type of the timed kernels [bf16].")
    ap.add_argument("--gpu", default=None, help="GPU preset [from the device name].")
    ap.add_argument("--gpus", type=int, default=None,
                    help="GPUs in the collectives [all visible; 1 skips them].")
    ap.add_argument("--nvlink-gb-per-s", type=float, default=None,
                    help="The node's NVLink rate the cluster files state [the preset's].")
    ap.add_argument("--iters", type=int, default=20, help="Timed runs per kernel [20].")
    ap.add_argument("--warmup", type=int, default=5, help="Untimed runs first [5].")
    ap.add_argument("--cpu", action="store_true", help="Test mode even where CUDA exists.")
    a = ap.parse_args(argv)
    # every argument is checked in either mode, before anything is measured (the CPU test
    # mode does not use the shapes, but a command that passes there must pass on the GPU)
    if a.iters < 1 or a.warmup < 0:
        raise SpecError("--iters must be >= 1 and --warmup >= 0", source="options",
                        field="--iters")
    if a.seq < 1:
        raise SpecError(f"{a.seq}: give a positive sequence length", source="options",
                        field="--seq")
    if a.gpus is not None and a.gpus < 1:
        raise SpecError(f"{a.gpus}: give 1 or more GPUs (1 skips the collectives)",
                        source="options", field="--gpus")
    if a.nvlink_gb_per_s is not None and not (math.isfinite(a.nvlink_gb_per_s)
                                              and a.nvlink_gb_per_s > 0):
        raise SpecError(f"{a.nvlink_gb_per_s}: give a positive number of GB/s",
                        source="options", field="--nvlink-gb-per-s")
    model = model_preset(a.model)
    tps = (tuple(t for t in (1, 2, 4, 8) if model.num_heads % t == 0) if a.tp is None
           else _ints(a.tp, "--tp"))
    mbss = _ints(a.mbs, "--mbs")
    dropped = [t for t in tps if model.num_heads % t]
    if dropped:
        raise SpecError(f"TP {', '.join(map(str, dropped))} does not divide the "
                        f"{model.num_heads} attention heads of {model.name}; leave it out",
                        source="options", field="--tp")
    check_target(Path(a.output), "--output")
    import torch
    cuda = torch.cuda.is_available() and not a.cpu
    if cuda:
        name = torch.cuda.get_device_name(0)
        preset = a.gpu or device_preset(name)
        if preset is None:
            raise SpecError(f"no GPU preset known for {name!r}; name one with --gpu",
                            source="options", field="--gpu")
        gpu = gpu_preset(preset)
        gpus = a.gpus or torch.cuda.device_count()
        sz = Sizes(model, a.seq, tps, mbss, GPU_ELEMENTWISE_MIB, GPU_COLLECTIVE_MIB, gpus,
                   a.dtype)
        device, backend, iters, warmup = "cuda", "nccl", a.iters, a.warmup
    else:
        name = f"CPU ({os.cpu_count()} cores), test mode"
        gpu = gpu_preset(a.gpu or "A100-80GB")
        # tiny shapes; the collectives among 2 local processes unless --gpus says otherwise
        # (--gpus 1 skips them, as on a GPU)
        sz = Sizes(tiny_model(), 64, (1, 2), (1, 2), (1 / 256, 1 / 64, 1.0, 4.0), (0.0625, 16.0),
                   a.gpus or 2, "fp32")
        device, backend, iters, warmup = "cpu", "gloo", min(a.iters, 3), min(a.warmup, 1)
        # what the test mode does not take of what was given: said, not silently dropped
        given = {k: v for k, v in vars(a).items() if v != ap.get_default(k)}
        unused = [f"--{k.replace('_', '-')}" for k in ("model", "seq", "tp", "mbs", "dtype")
                  if k in given]
        cut = [f"--{k} {given[k]} -> {v}" for k, v in (("iters", iters), ("warmup", warmup))
               if k in given and given[k] != v]
        if unused or cut:
            log("test mode (CPU) runs tiny fp32 shapes: "
                + "; ".join(([f"{', '.join(unused)} not used"] if unused else []) + cut))
    log(f"probe on {name}: {gpu.name} preset, {sz.dtype}")
    readings = time_kernels(sz, gpu, device, iters, warmup, log)
    if sz.gpus > 1:
        readings += time_collectives(sz, backend, iters, warmup, log)
    intra = a.nvlink_gb_per_s or gpu.nvlink_gb_per_s
    prof = fit_kernels(readings, gpu, intra, planning=cuda, device=name)
    save_profile(a.output, prof)
    for k, v in prof.values.items():
        se = prof.stderr.get(k)
        log(f"  {k} = {v:.4g}" + (f" +- {se:.2g}" if se is not None else ""))
    for note in prof.fit_notes:
        log(f"warning: {note}")
    if not cuda:
        log("test mode (CPU): these numbers are not for planning; the profile is marked so")
    log(f"wrote {a.output}")
    return json.loads(Path(a.output).read_text())


def main(argv: list[str] | None = None) -> int:
    try:
        run(argv)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"error: {e.name or 'torch'} is not installed: pip install -e '.[probe]'",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
