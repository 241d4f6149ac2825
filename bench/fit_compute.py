"""Fit A100's curve parameters of the per-operation roofline on the published runs.

    python bench/fit_compute.py [--plain]

Fits `gemm_efficiency`, `hbm_efficiency` and `kernel_overhead_us` (model/compute.py) of the
A100 presets on the runs of data/published_runs.json that publish an iteration time (nothing
else is used). The loss is plain least squares on log(predicted / published) over the runs
(`--weighting groups` averages per source group first, so that the 14 BLOOM pre-launch runs
weigh as much as the one BLOOM production run); the search is Nelder-Mead from a neutral start
(0.8, 0.8, 4 us), with the parameters clamped to their valid ranges (efficiencies in
[0.3, 1], overhead in [0, 50] us).

Prints the fitted values, the loss, and per run the residual (predicted / published - 1) before
and after, per group the median |error|, and the slope of the error against log10(parameters)
over Narayanan et al. Table 1 (points per decade). --plain prints only the fitted values.
`attention_efficiency` is not fitted: every run here predates FlashAttention (eager attention).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats.published import load_runs, compare_run  # noqa: E402

NAMES = ("gemm_efficiency", "hbm_efficiency", "kernel_overhead_us")
LOWER = np.array([0.3, 0.3, 0.0])
UPPER = np.array([1.0, 1.0, 50.0])
START = np.array([0.8, 0.8, 4.0])


def runs_with_time():
    """The A100 runs with an iteration time (the torchtitan H100 rows have their own fit,
    bench/fit_h100_500w.py; the ZeRO-3 rows are kept out as they were when the presets'
    values were fitted)."""
    out = []
    for r in load_runs():
        if r["source_group"].startswith("torchtitan") or "zero-3" in (
                r.get("dp_sharding") or "").lower():
            continue
        c = compare_run(r)
        if c.skipped is None and c.published_s is not None:
            out.append(r)
    return out


def residuals(runs, x) -> list[tuple[str, str, float, float, float]]:
    params = dict(zip(NAMES, (float(v) for v in x)))
    rows = []
    for r in runs:
        c = compare_run(r, gpu_params=params)
        rows.append((c.id, c.group, c.predicted_s / c.published_s - 1.0, c.published_s,
                     float(c.params)))
    return rows


def loss(runs, x, weighting: str = "groups") -> float:
    """Mean squared log error, over runs, or averaged per source group first."""
    groups: dict[str, list[float]] = {}
    for _id, g, err, _p, _n in residuals(runs, x):
        groups.setdefault(g if weighting == "groups" else "all", []).append(
            math.log1p(err) ** 2)
    return statistics.fmean(statistics.fmean(v) for v in groups.values())


def nelder_mead(f, x0, scale, iters=120, tol=1e-7):
    """Plain Nelder-Mead (Nelder and Mead 1965; standard coefficients 1, 2, 0.5, 0.5)."""
    n = len(x0)
    clamp = lambda x: np.minimum(UPPER, np.maximum(LOWER, x))  # noqa: E731
    pts = [clamp(np.array(x0, dtype=float))]
    for i in range(n):
        p = pts[0].copy()
        p[i] += scale[i]
        pts.append(clamp(p))
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        centroid = np.mean(pts[:-1], axis=0)
        xr = clamp(centroid + (centroid - pts[-1]))
        fr = f(xr)
        if fr < vals[0]:
            xe = clamp(centroid + 2 * (centroid - pts[-1]))
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = clamp(centroid + 0.5 * (pts[-1] - centroid))
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                for i in range(1, len(pts)):
                    pts[i] = clamp(pts[0] + 0.5 * (pts[i] - pts[0]))
                    vals[i] = f(pts[i])
    i = int(np.argmin(vals))
    return pts[i], vals[i]


def table1_slope(rows) -> float:
    """Least-squares slope of the signed error (points) against log10(parameters) over
    Narayanan et al. Table 1."""
    pts = [(math.log10(n), 100 * e) for _id, g, e, _p, n in rows if g == "narayanan_sc21_table1"]
    x = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--iters", type=int, default=120)
    ap.add_argument("--weighting", choices=("runs", "groups"), default="runs",
                    help="mean squared log error over all runs (default, least squares), or "
                    "averaged per source group first")
    a = ap.parse_args(argv)
    runs = runs_with_time()
    t0 = time.perf_counter()
    x, val = nelder_mead(lambda x: loss(runs, x, a.weighting), START, [0.05, 0.05, 4.0],
                         iters=a.iters)
    fitted = dict(zip(NAMES, (round(float(v), 3) for v in x)))
    if a.plain:
        print(fitted)
        return
    before = residuals(runs, START)
    after = residuals(runs, x)
    print(f"{len(runs)} A100 runs with a published or derived iteration time; "
          f"fit in {time.perf_counter() - t0:.0f} s")
    print(f"start  {dict(zip(NAMES, START.tolist()))}  loss "
          f"{loss(runs, START, a.weighting):.5f} ({a.weighting} weighted)")
    print(f"fitted {fitted}  loss {val:.5f}")
    print(f"\n{'run':66s} {'before':>8s} {'after':>8s}")
    for (rid, _g, e0, _p, _n), (_r, _g2, e1, _p2, _n2) in zip(before, after):
        print(f"{rid:66s} {100 * e0:+7.1f}% {100 * e1:+7.1f}%")
    print("\nmedian |error| per source group (before -> after):")
    groups = sorted({g for _i, g, *_ in after})
    for g in groups:
        b = [abs(e) for _i, gg, e, *_ in before if gg == g]
        f = [abs(e) for _i, gg, e, *_ in after if gg == g]
        print(f"  {g:32s} {100 * statistics.median(b):5.1f}% -> {100 * statistics.median(f):5.1f}%"
              f"  ({len(f)} runs)")
    print(f"all runs: median |error| {100 * statistics.median(abs(r[2]) for r in before):.1f}% "
          f"-> {100 * statistics.median(abs(r[2]) for r in after):.1f}%")
    print(f"Table 1 error slope vs log10(params): {table1_slope(before):+.1f} -> "
          f"{table1_slope(after):+.1f} points per decade")


if __name__ == "__main__":
    main()
