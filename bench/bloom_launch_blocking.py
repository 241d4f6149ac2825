"""What the BLOOM runs' time residuals follow: a look at a cost the model leaves out.

    python bench/bloom_launch_blocking.py

BigScience ran BLOOM with CUDA_LAUNCH_BLOCKING=1: the production script sets it ("do not remove
or the training will hang", train/tr11-176B-ml/tr11-176B-ml.slurm), and the pre-launch
benchmarks on 48 nodes needed it too (chronicles-prequel.md, "dealing with JZ hanging": without
it 320 GPUs "always hangs"). Every kernel launch then returns only when the kernel has run, so
the host's time per launch and each collective's wait for its slowest rank sit between kernels
instead of behind them. The cost model does not count this: nothing measured gives its size.

This bench asks whether the residuals look like it. Such a cost grows with the kernels one GPU
runs per iteration, about N = (layers of the fullest stage) x (micro-batches per pipeline),
times the recompute and backward passes, whatever each kernel's size. It fits, by least squares
on the relative error over the BLOOM runs of data/published_runs.json (in-sample, nothing is
changed in the model):
  t = a x predicted            (a scale only),
  t = a x predicted + c x N    (a cost per layer and micro-batch),
  t = a x predicted + c x N x TP,
and prints per run the error of each, and for each form the median error of the runs left out
when it is fitted on 3 of the 14 pre-launch runs (every choice of 3; a prior keeps a near 1,
sd 0.15, as `calibrate`'s on gemm_scale).
"""

from __future__ import annotations

import itertools
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats.published import _skip_reason, load_runs, run_to_inputs  # noqa: E402
from model.calibration import NOISE_SD, PRIOR_SD  # noqa: E402
from model.estimator import estimate  # noqa: E402


def bloom_rows():
    rows = []
    for r in load_runs():
        if _skip_reason(r) or r.get("oom") or not r["source_group"].startswith("bloom"):
            continue
        pub = r.get("iteration_time_s") or r.get("iteration_time_s_derived")
        if pub is None:
            continue
        model, job, cluster, plan, _notes = run_to_inputs(r)
        sh = plan.shape
        est = estimate(model, job, cluster, plan)
        layers = max(sh.stage_layers(s) for s in range(sh.pp))
        micro = job.global_batch // (sh.dp * sh.micro_batch)
        rows.append(dict(id=r["id"], group=r["source_group"], tp=sh.tp, pp=sh.pp, dp=sh.dp,
                         mbs=sh.micro_batch, n=layers * micro, pred=est.iteration_ms / 1e3,
                         pub=float(pub)))
    return rows


def fit(P, M, F, idx, prior: bool):
    """Least squares on (a P + c F) / M - 1 over `idx`, c >= 0; with `prior`, one more row
    (noise / sd) (a - 1)."""
    cols = [P] + ([F] if F is not None else [])
    X = np.stack(cols, axis=1)[idx] / M[idx, None]
    y = np.ones(len(idx))
    if prior:
        w = NOISE_SD / PRIOR_SD["gemm_scale"]
        X = np.vstack([X, np.r_[w, np.zeros(X.shape[1] - 1)]])
        y = np.r_[y, w]
    coef = np.linalg.lstsq(X, y, rcond=None)[0]
    if F is not None and coef[1] < 0:  # no negative cost: the scale alone
        coef = np.r_[np.linalg.lstsq(X[:, :1], y, rcond=None)[0], 0.0]
    return coef


def predict(coef, P, F):
    return coef[0] * P + (coef[1] * F if F is not None else 0.0)


def main() -> None:
    rows = bloom_rows()
    P = np.array([r["pred"] for r in rows])
    M = np.array([r["pub"] for r in rows])
    N = np.array([r["n"] for r in rows], dtype=float)
    T = np.array([r["tp"] for r in rows], dtype=float)
    forms = {"scale": None, "+ c N": N, "+ c N TP": N * T}
    everything = list(range(len(rows)))
    fits = {k: fit(P, M, F, everything, prior=False) for k, F in forms.items()}
    errs = {k: 100 * (predict(fits[k], P, F) / M - 1) for k, F in forms.items()}
    base = 100 * (P / M - 1)
    print(f"{len(rows)} BLOOM runs with a time; N = layers of the fullest stage x micro-batches")
    print(f"{'run':<58} {'TP':>2} {'PP':>2} {'DP':>2} {'mbs':>3} {'N':>5} {'model':>7} "
          + " ".join(f"{k:>9}" for k in forms))
    for i, r in enumerate(rows):
        print(f"{r['id'][:58]:<58} {r['tp']:2d} {r['pp']:2d} {r['dp']:2d} {r['mbs']:3d} "
              f"{r['n']:5d} {base[i]:+6.1f}% " + " ".join(f"{errs[k][i]:+8.1f}%" for k in forms))
    print(f"\n{'':<58} median |error|: model {np.median(abs(base)):.1f}%, " + ", ".join(
        f"{k} {np.median(abs(errs[k])):.1f}%" for k in forms))
    for k, F in forms.items():
        c = fits[k]
        extra = "" if F is None else f", c = {1e3 * c[1]:.2f} ms per layer and micro-batch" + (
            " per TP rank" if k.endswith("TP") else "")
        print(f"  {k:<9} fitted on all: a = {c[0]:.3f}{extra}")
    pre = [i for i, r in enumerate(rows) if r["group"] == "bloom_prequel_02-25"]
    print(f"\nfitted on 3 of the {len(pre)} pre-launch runs (every choice of 3, with the prior on "
          "a), median |error| of the others:")
    for k, F in forms.items():
        meds = []
        for pick in itertools.combinations(pre, 3):
            coef = fit(P, M, F, list(pick), prior=True)
            rest = [i for i in pre if i not in pick]
            meds.append(statistics.median(abs(predict(coef, P, F)[rest] / M[rest] - 1)))
        print(f"  {k:<9} median {100 * statistics.median(meds):.1f}%, mean "
              f"{100 * statistics.fmean(meds):.1f}% over {len(meds)} choices")
    before = statistics.median(abs(P[pre] / M[pre] - 1))
    print(f"  (the model as it is: {100 * before:.1f}% over the {len(pre)})")


if __name__ == "__main__":
    main()
