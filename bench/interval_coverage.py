"""How often the calibrated 95% prediction intervals hold a new measurement, by how many runs
the profile was fitted on.

    python bench/interval_coverage.py [--fits 40] [--runs 1,2,3,4,6,12] [--noise 0.02]
                                      [--normal]

Synthetic runs, as tests/test_calibration.py makes them: 12 shapes of GPT 3.6B on 4 nodes of
8 A100s with slow links (TP 1-8, PP 1-4, micro-batch 2-8), each timed by the estimator with
true parameters off the presets (gemm_scale 0.85, network_scale 0.6) and times log-normal
noise (`--noise`, sd of log time). For each number of runs n: `--fits` seeded draws of n runs
(the first n shapes, fresh noise each draw), fitted with `calibrate`'s fit (gemm_scale and
network_scale, its prior on), and every fit's interval judged on the 12 shapes at twice the
batch, each measured once more with fresh noise: the share of those measurements inside their
interval (nominal 95%), the median interval width (high / low - 1) and the median |error| of
the point prediction. `--normal` judges the same fits with the normal's 1.96 in place of
Student's t for a measured spread (the rule before 2026-12-03), side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from formats.clusters import uniform_cluster  # noqa: E402
from model.calibration import Run, _predict, fit, interval_s  # noqa: E402
from model.estimator import make_plan  # noqa: E402
from model.specs import JobSpec, Options  # noqa: E402

from tests.test_calibration import SHAPES  # noqa: E402  (the tests' own shapes)

TRUTH = {"gemm_scale": 0.85, "network_scale": 0.6}


def plans(global_batch: int) -> list[Run]:
    """The 12 shapes at one global batch, with their noise-free true times."""
    model = presets.model("gpt-3.6b")
    c = uniform_cluster(4, 8, "A100-80GB", 240.0, 6.0)
    job = JobSpec(global_batch=global_batch, seq_length=2048)
    out = []
    for k, kw in enumerate(SHAPES):
        plan = make_plan(model, job, c, sequence_parallel=kw["tp"] > 1,
                         distributed_optimizer=True, recompute="full", **kw)
        run = Run(model, job, c, plan, Options(), 1.0, label=f"run{k}")
        run.measured_s = _predict(run, TRUTH, "A100-80GB")
        out.append(run)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fits", type=int, default=40)
    ap.add_argument("--runs", default="1,2,3,4,6,12")
    ap.add_argument("--noise", type=float, default=0.02)
    ap.add_argument("--normal", action="store_true",
                    help="also judge each fit with 1.96 instead of Student's t")
    a = ap.parse_args()
    fit_pool, held = plans(128), plans(256)
    names = tuple(TRUTH)
    print(f"truth {TRUTH}, noise sd {100 * a.noise:.1f}% of log time, fitted: "
          f"{', '.join(names)} (prior on); {a.fits} fits per row, each judged on "
          f"{len(held)} new measurements")
    rules = ("t", "normal") if a.normal else ("t",)
    print(f"{'runs':>4} {'rule':>6} {'covered':>8} {'no interval':>12} {'median width':>13} "
          f"{'median |err|':>13}")
    for n in map(int, a.runs.split(",")):
        rng = np.random.default_rng(1000 + n)
        inside = dict.fromkeys(rules, 0)
        total = dict.fromkeys(rules, 0)
        none = dict.fromkeys(rules, 0)
        widths: dict = {k: [] for k in rules}
        errs: dict = {k: [] for k in rules}
        for _ in range(a.fits):
            runs = []
            for r in fit_pool[:n]:
                rr = Run(r.model, r.job, r.cluster, r.plan, r.options,
                         r.measured_s * math.exp(a.noise * rng.normal()), label=r.label)
                runs.append(rr)
            prof, _ = fit(runs, names, "A100-80GB", fit_fragmentation=False)
            normal = dataclasses.replace(prof, residual_dof=None)
            for r in held:
                new = r.measured_s * math.exp(a.noise * rng.normal())
                for rule in rules:
                    iv = interval_s(prof if rule == "t" else normal, r.model, r.job, r.cluster,
                                    r.plan, r.options)
                    if iv[1] is None:
                        none[rule] += 1
                        continue
                    t, lo, hi = iv
                    total[rule] += 1
                    inside[rule] += lo <= new <= hi
                    widths[rule].append(hi / lo - 1)
                    errs[rule].append(abs(t / new - 1))
        for rule in rules:
            cov = f"{100 * inside[rule] / total[rule]:.1f}%" if total[rule] else "-"
            wid = f"{100 * statistics.median(widths[rule]):.1f}%" if widths[rule] else "-"
            err = f"{100 * statistics.median(errs[rule]):.1f}%" if errs[rule] else "-"
            print(f"{n:>4} {rule:>6} {cov:>8} {none[rule]:>12} {wid:>13} {err:>13}")


if __name__ == "__main__":
    main()
