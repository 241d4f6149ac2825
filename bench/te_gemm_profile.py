"""The GEMM model against Transformer Engine's published GEMM profile of one layer on a B300.

    python bench/te_gemm_profile.py

Transformer Engine's documentation times the twelve GEMMs of one transformer layer (hidden
4096, MLP 16384, 15,872 tokens: micro-batch 31 x sequence 512) on an NVIDIA B300 SXM6 AC
(NVIDIA/TransformerEngine docs/features/low_precision_training/gemm_profiling/
gemm_profiling.rst at 3329417: "GEMM Benchmark (Model Config Mode) on NVIDIA B300 SXM6 AC",
CUDA events, 10 warm-up and 100 timed iterations). Its pre-quantized mode times the GEMM
kernels alone, the operands quantized before the timed loop; its autocast mode adds the
quantization, and in BF16 there is none, so its BF16 per-operation figures are GEMMs alone too.

This script prices the same GEMMs with the cost model's GEMM roofline (model/compute.py
`gemm_ms`, `linear_gemms`) on the B300 preset (data/gpus.json: A100's fitted large-GEMM
fraction, FP8 at FP8_GEMM_RATIO of it: assumptions) and prints both, held out: nothing here is
fitted to these figures. MXFP8 only (the cost model prices FP8 Block on Hopper only and has no
NVFP4); the quantization of the autocast mode is not compared (how the benchmark quantizes each
operand per call is not the training step's).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from model.compute import gemm_ms, linear_gemms  # noqa: E402

TOKENS, HIDDEN, MLP = 15872, 4096, 16384
# (name, m, n, k) of y[m, n] = x[m, k] W[k, n], as the document's "MxKxN" table lists them
LINEARS = (("QKV Proj", TOKENS, 3 * HIDDEN, HIDDEN), ("Attn Out", TOKENS, HIDDEN, HIDDEN),
           ("MLP Up", TOKENS, MLP, HIDDEN), ("MLP Down", TOKENS, HIDDEN, MLP))
# the document's figures, ms: BF16 forward GEMMs per operation (autocast table: no
# quantization in BF16), and the pre-quantized per-pass sums ("Per-Layer GEMM Time")
PUBLISHED_BF16_FPROP_MS = {"QKV Proj": 1.018, "Attn Out": 0.296, "MLP Up": 1.364,
                           "MLP Down": 1.378}
PUBLISHED_PREQUANT_MS = {"BF16": {"Fprop": 4.146, "Dgrad": 4.318, "Wgrad": 4.372},
                         "MXFP8": {"Fprop": 2.391, "Dgrad": 2.448, "Wgrad": 2.485}}
PASSES = ("Fprop", "Dgrad", "Wgrad")


def model_ms(gpu, precision: str) -> dict[str, dict[str, float]]:
    """Per pass, per operation: the cost model's GEMM time (ms)."""
    fp8 = precision == "MXFP8"
    peak = gpu.peak_flops("fp8" if fp8 else "bf16")
    out: dict[str, dict[str, float]] = {p: {} for p in PASSES}
    for name, m, n, k in LINEARS:
        for p, shape in zip(PASSES, linear_gemms(m, n, k)):
            out[p][name] = gemm_ms(gpu, *shape, peak, in_bytes=1.0 if fp8 else 2.0,
                                   out_bytes=2.0,
                                   efficiency=gpu.fp8_efficiency if fp8 else None)
    return out


def main() -> None:
    gpu = presets.gpu("B300")
    print(f"{gpu.name}: bf16 {gpu.peak_tflops['bf16']:.0f} / fp8 {gpu.peak_tflops['fp8']:.0f} "
          f"TFLOP/s dense, GEMM fraction {gpu.gemm_efficiency:.3f} (bf16), "
          f"{gpu.fp8_efficiency:.3f} (fp8)")
    bf16, mx = model_ms(gpu, "BF16"), model_ms(gpu, "MXFP8")
    print("\nBF16 forward GEMMs (ms)       model  published   model/published")
    for name, *_ in LINEARS:
        got, pub = bf16["Fprop"][name], PUBLISHED_BF16_FPROP_MS[name]
        print(f"  {name:<26} {got:7.3f}  {pub:9.3f}   {got / pub:8.3f}")
    print("\npre-quantized, per pass (ms)   model  published   model/published")
    totals = {}
    for label, res in (("BF16", bf16), ("MXFP8", mx)):
        tm = tp = 0.0
        for p in PASSES:
            m_ms, pub = sum(res[p].values()), PUBLISHED_PREQUANT_MS[label][p]
            tm, tp = tm + m_ms, tp + pub
            print(f"  {label:<6} {p:<19} {m_ms:7.3f}  {pub:9.3f}   {m_ms / pub:8.3f}")
        print(f"  {label:<6} {'layer':<19} {tm:7.3f}  {tp:9.3f}   {tm / tp:8.3f}")
        totals[label] = (tm, tp)
    print(f"\nMXFP8 speed-up over BF16 (GEMMs alone): model "
          f"{totals['BF16'][0] / totals['MXFP8'][0]:.2f}x, published "
          f"{totals['BF16'][1] / totals['MXFP8'][1]:.2f}x")


if __name__ == "__main__":
    main()
