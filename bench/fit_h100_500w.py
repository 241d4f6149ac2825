"""Fit the sustained compute rates of torchtitan's power-limited H100 on three of its runs.

    python bench/fit_h100_500w.py

The torchtitan Llama 3.1 benchmarks ran on Grand Teton H100s (96 GB HBM2e, 500 W power limit)
whose sustained clock is not published. Two named parameters, fitted one after the other on
the three 8-GPU Llama 3.1 8B rows of Table 1; the other 15 rows are the test set:

- `f` scales the H100 curve's GEMM and attention efficiencies (gemm 0.608 f, attention 0.35 f;
  0.35 is FlashAttention-2's share of the H100's peak, which PyTorch SDPA runs: Shah et al.
  2024, FlashAttention-3, Fig. 5), on the two bf16 rows (eager and torch.compile; grid
  0.50-1.00 by 0.01, smallest mean |time error|);
- `r` = fp8_gemm_efficiency / gemm_efficiency, the FP8 GEMMs' fraction of the FP8 peak
  against the bf16 GEMMs' fraction of the bf16 peak (torchao float8 with tensor-wise dynamic
  scaling, its amax reductions included), on the Float8 row with `f` fixed (grid 0.40-1.00
  by 0.01).

Prints the fitted values, and per row the predicted and published iteration time and memory,
with the medians on the test rows.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from formats.published import compare_run, load_runs  # noqa: E402

BF16_IDS = ("torchtitan_t1_8b_8gpu_FSDP", "torchtitan_t1_8b_8gpu_FSDP_torchcompile")
FP8_IDS = ("torchtitan_t1_8b_8gpu_FSDP_torchcompile_Float8",)
FIT_IDS = BF16_IDS + FP8_IDS
BASE_GEMM = presets.gpu("H100-SXM-80GB").gemm_efficiency
FA2_ATTENTION = 0.35


def params(f: float, r: float | None = None) -> dict:
    d = dict(gemm_efficiency=BASE_GEMM * f, attention_efficiency=FA2_ATTENTION * f)
    if r is not None:
        d["fp8_gemm_efficiency"] = BASE_GEMM * f * r
    return d


def _grid(rows, lo: int, hi: int, make) -> tuple[float, float]:
    """(value, mean |time error|) of the best grid point lo/100 .. hi/100."""
    best = None
    for i in range(lo, hi + 1):
        x = i / 100
        err = statistics.mean(abs(compare_run(r, gpu_params=make(x)).time_err) for r in rows)
        if best is None or err < best[1]:
            best = (x, err)
    return best


def main() -> None:
    runs = [r for r in load_runs() if r["source_group"].startswith("torchtitan")]
    f, f_err = _grid([r for r in runs if r["id"] in BF16_IDS], 50, 100, params)
    r8, r_err = _grid([r for r in runs if r["id"] in FP8_IDS], 40, 100,
                      lambda x: params(f, x))
    print(f"fitted f = {f:.2f} (mean |time error| on the {len(BF16_IDS)} bf16 rows "
          f"{f_err * 100:.1f}%): gemm_efficiency {BASE_GEMM * f:.3f}, "
          f"attention_efficiency {FA2_ATTENTION * f:.3f}")
    print(f"fitted r = {r8:.2f} (|time error| on the Float8 row {r_err * 100:.1f}%): "
          f"fp8_gemm_efficiency {BASE_GEMM * f * r8:.3f}")
    t_err, m_err = [], []
    print(f"{'run':50s} {'set':5s} {'pred s':>8s} {'pub s':>8s} {'err':>7s} "
          f"{'pred GiB':>9s} {'pub GiB':>8s} {'err':>7s}")
    for r in runs:
        c = compare_run(r, gpu_params=params(f, r8))
        test = r["id"] not in FIT_IDS
        if test:
            t_err.append(c.time_err)
            m_err.append(c.mem_err)
        print(f"{c.id:50s} {'test' if test else 'fit':5s} {c.predicted_s:8.2f} "
              f"{c.published_s:8.2f} {100 * (c.predicted_s / c.published_s - 1):+6.1f}% "
              f"{c.predicted_gib:9.1f} {c.published_gib:8.1f} "
              f"{100 * (c.predicted_gib / c.published_gib - 1):+6.1f}%")
    print(f"test rows: {len(t_err)}; median |time error| {statistics.median(t_err) * 100:.1f}%, "
          f"median |memory error| {statistics.median(m_err) * 100:.1f}%")


if __name__ == "__main__":
    main()
