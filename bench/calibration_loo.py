"""Calibration on a few runs of a group, judged on the group's other runs.

    python bench/calibration_loo.py [--k 3] [--fit gemm_scale,network_scale] [--draws 5]
                                    [--no-prior] [--floor] [--bloom-heldout]

For every source group of data/published_runs.json with at least 5 runs that have a time: draw
k runs (seeded, `--draws` times), fit the named parameters on them (model/calibration.py, the
same fit as `python cli.py calibrate`, with the published times as the measurements; `--no-prior`
drops its prior), and
predict the group's other runs. Prints per group the median |time error| of the held-out runs
before (presets) and after, the median over the draws, the share of held-out runs inside the
fit's 95% prediction interval (over all draws) and the intervals' median width (high / low -
1), and the fitted values of the first draw. The issue's goal: after, at most 5% for every
group with 5+ runs.

`--bloom-heldout` also judges each BLOOM draw's fit on the 83 held-out BLOOM iteration times
whose head dimension is a multiple of 8 (data/published_bloom_time_heldout.json; the other 14 run
kernels the model does not price: bench/bloom_time_residuals.py), before and after, and the
same fit (with the prior) on all of the group's runs, judged on those 83.

`--refit-presets` makes "before" out of sample: for each A100 group, A100's curve is first
refitted (bench/fit_compute.py, the same fit as the presets') on every A100 run outside the
group, and the group's runs are built on that GPU. Without it the presets were fitted on the
groups themselves, so "before" is in-sample. torchtitan's two 500 W H100 factors come from 3 of
its 18 runs (bench/fit_h100_500w.py) and are not refitted.

`--floor` adds what no draw of k runs can beat by calibrating these parameters: the median
|time error| over all of the group's runs when the parameters are fitted on all of them (no
prior; in-sample), and the smallest median over a log-spaced grid of the parameters within
their bounds (`FLOOR_GRID` points per parameter, one or two parameters).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats.published import (_skip_reason, bloom_heldout_inputs, load_runs,  # noqa: E402
                                run_to_inputs)
from model.calibration import TIME_PARAMETERS, Run, _predict, fit, interval_s  # noqa: E402
from model.compute import head_dim_aligned  # noqa: E402
from model.specs import Options  # noqa: E402


def group_runs(gpu_params: dict | None = None) -> dict[str, list[Run]]:
    """Each source group's runs with a time, as Runs (`gpu_params` replaces the GPU preset's
    fields, as formats.published.run_to_inputs does)."""
    groups: dict[str, list[Run]] = {}
    for r in load_runs():
        if _skip_reason(r) or r.get("oom"):
            continue
        pub = r.get("iteration_time_s") or r.get("iteration_time_s_derived")
        if pub is None:
            continue
        model, job, cluster, plan, _notes = run_to_inputs(r, gpu_params)
        groups.setdefault(r["source_group"], []).append(
            Run(model, job, cluster, plan, Options(), float(pub), label=r["id"]))
    return {g: v for g, v in groups.items() if len(v) >= 5}


def bloom_heldout_runs() -> list[Run]:
    """The held-out BLOOM iteration times whose head dimension is a multiple of 8, as Runs."""
    out = []
    for row, _r, (model, job, cluster, plan, _notes) in bloom_heldout_inputs("time"):
        if not head_dim_aligned(model, job):
            continue
        out.append(Run(model, job, cluster, plan, Options(), row["sec_per_iteration"],
                       label=f"line {row['line']}"))
    return out


def refit_without(group: str) -> dict:
    """A100's curve parameters refitted by bench/fit_compute.py's fit (least squares on log
    time, Nelder-Mead from its neutral start) on every A100 run outside `group`."""
    import fit_compute as fc
    runs = [r for r in fc.runs_with_time() if r["source_group"] != group]
    x, _loss = fc.nelder_mead(lambda x: fc.loss(runs, x, "runs"), fc.START, [0.05, 0.05, 4.0])
    return dict(zip(fc.NAMES, (float(v) for v in x)))


FLOOR_GRID = 21  # grid points per parameter for --floor (log-spaced over the bounds)


def _median_err(runs: list[Run], values: dict, gpu: str) -> float:
    return statistics.median(abs(_predict(r, values, gpu) / r.measured_s - 1) for r in runs)


def floor(runs: list[Run], names: tuple[str, ...], gpu: str) -> tuple[float, float | None,
                                                                        dict, dict]:
    """(in-sample median of the fit on every run, grid minimum of the median or None for
    more than two parameters, the fit's values, the grid minimum's values)."""
    prof, _ = fit(runs, names, gpu, fit_fragmentation=False, prior=False)
    in_sample = _median_err(runs, prof.values, gpu)
    if len(names) > 2:
        return in_sample, None, prof.values, {}
    axes = [np.geomspace(*TIME_PARAMETERS[n], FLOOR_GRID) for n in names]
    best, best_at = float("inf"), {}
    for point in np.array(np.meshgrid(*axes)).reshape(len(names), -1).T:
        vals = dict(zip(names, point.tolist()))
        m = _median_err(runs, vals, gpu)
        if m < best:
            best, best_at = m, vals
    return in_sample, best, prof.values, best_at


def _show(values: dict) -> str:
    return ", ".join(f"{k}={x:.3f}" for k, x in values.items())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--fit", default="gemm_scale,network_scale")
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--no-prior", action="store_true")
    ap.add_argument("--floor", action="store_true",
                    help="also fit on all of a group's runs, and grid-search the parameters")
    ap.add_argument("--refit-presets", action="store_true",
                    help="refit A100's curve without each A100 group first (before = out of "
                    "sample)")
    ap.add_argument("--bloom-heldout", action="store_true",
                    help="also judge the BLOOM fits on the held-out BLOOM iteration times")
    args = ap.parse_args()
    if args.refit_presets and args.bloom_heldout:
        ap.error("--bloom-heldout judges the presets' BLOOM fits; run it without --refit-presets")
    held = bloom_heldout_runs() if args.bloom_heldout else []
    names = tuple(args.fit.split(","))
    print(f"calibrate on {args.k} runs of a group ({', '.join(names)}), predict the others; "
          f"{args.draws} seeded draws, {'no prior' if args.no_prior else 'with the prior'}\n")
    print(f"{'group':<34} {'runs':>4} {'before':>8} {'after':>8} {'after range':>16} "
          f"{'in 95%':>7} {'width':>7}  fitted (first draw)")
    for g, runs in sorted(group_runs().items()):
        if args.refit_presets and not g.startswith("torchtitan"):
            params = refit_without(g)
            runs = group_runs(params)[g]
            print(f"{'':<34} A100 curve refitted without this group: {_show(params)}")
        gpu = runs[0].cluster.nodes[0].gpu.name
        befores, afters, first, held_after = [], [], None, []
        inside = judged = 0
        widths = []
        for d in range(args.draws):
            rng = np.random.default_rng(d)
            pick = set(rng.choice(len(runs), size=args.k, replace=False).tolist())
            train = [r for i, r in enumerate(runs) if i in pick]
            test = [r for i, r in enumerate(runs) if i not in pick]
            prof, _ = fit(train, names, gpu, fit_fragmentation=False,
                          prior=not args.no_prior)
            first = first or prof
            befores.append(statistics.median(abs(_predict(r, {}, gpu) / r.measured_s - 1)
                                             for r in test))
            afters.append(statistics.median(abs(_predict(r, prof.values, gpu) / r.measured_s
                                                - 1) for r in test))
            # the fit's 95% prediction intervals on the runs it did not see
            for r in test:
                _t, lo, hi = interval_s(prof, r.model, r.job, r.cluster, r.plan, r.options)
                if lo is not None:
                    judged += 1
                    inside += lo <= r.measured_s <= hi
                    widths.append(hi / lo - 1)
            if held and g.startswith("bloom_prequel"):
                held_after.append(_median_err(held, prof.values, gpu))
        fitted = ", ".join(f"{k}={v:.3f}" for k, v in first.values.items())
        cover = f"{100 * inside / judged:6.0f}%" if judged else f"{'-':>7}"
        width = f"{100 * statistics.median(widths):6.0f}%" if widths else f"{'-':>7}"
        print(f"{g:<34} {len(runs):4d} {100 * statistics.median(befores):7.1f}% "
              f"{100 * statistics.median(afters):7.1f}% "
              f"{100 * min(afters):7.1f}-{100 * max(afters):5.1f}% {cover} {width}  {fitted}")
        if held_after:
            print(f"{'':<34} held out, {len(held)} BLOOM iteration times: "
                  f"{100 * _median_err(held, {}, gpu):.1f}% before, "
                  f"{100 * statistics.median(held_after):.1f}% after (median over the draws; "
                  f"{100 * min(held_after):.1f}-{100 * max(held_after):.1f}%)")
            whole, _ = fit(runs, names, gpu, fit_fragmentation=False, prior=not args.no_prior)
            print(f"{'':<34} fitted on all {len(runs)} runs ({_show(whole.values)}; in-sample "
                  f"{100 * _median_err(runs, whole.values, gpu):.1f}%): the {len(held)} held "
                  f"out {100 * _median_err(held, whole.values, gpu):.1f}%")
        if args.floor:
            ins, grid, at_fit, at_grid = floor(runs, names, gpu)
            line = (f"{'':<34} floor: fitted on all {len(runs)} runs {100 * ins:.1f}% "
                    f"({_show(at_fit)})")
            if grid is not None:
                line += f"; grid minimum {100 * grid:.1f}% ({_show(at_grid)})"
            print(line)


if __name__ == "__main__":
    main()
