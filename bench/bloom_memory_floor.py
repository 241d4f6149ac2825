"""How close any memory model of the estimator's form can come to BLOOM's readings.

    python bench/bloom_memory_floor.py

Issue 10 asks for BLOOM's stage-0 memory within 10% on every reading. The readings are single
nvidia-smi snapshots (BigScience chronicles-prequel.md, 02-25), one configuration read twice
(DP 8 / TP 4 / PP 12 / micro-batch 2: 44 and 38 GB). This bench asks what the best model of the
estimator's own form could reach, whatever its constants. It splits the estimator's
prediction for each reading into model states S (weights, gradients, optimizer: fixed by the
layout), micro-batch-dependent memory A (stored activations and the working memory of one
layer) and the rest R (allowance, context). It then finds the family members
a S + b A + d R + c (a, b, d >= 0, c in GiB; the model is a = b = d = 1, c = 0) with the
smallest largest relative error over the 14 readings: a linear program (HiGHS through
solvers/linear.py), the exact minimax; and the same with a = d = 1 (only the micro-batch part
and a constant free). A floor above
10% means no re-weighting of the model's parts reaches the goal on these readings. The bench
also prints each pair of readings that differ only in micro-batch: the growth the readings show
against the growth the model predicts. Nothing is fitted into the model; this judges the data.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats.published import validate  # noqa: E402
from solvers.linear import LinearModel  # noqa: E402


def parts(x):
    """(S, A, R) GiB of the estimator's stage-0 memory for one reading."""
    m = x.estimate.stages[0].memory
    s = m.weights_gib + m.grads_gib + m.optimizer_gib
    a = m.activations_gib + m.working_gib
    return s, a, m.total_gib - s - a


def minimax(rows, free_scale: bool = True) -> tuple[float, tuple[float, ...]]:
    """Smallest t with |a S + b A + d R + c - y| <= t y for every reading (a = d = 1 if not
    free_scale), and the (a, b, d, c) that reach it."""
    lm = LinearModel("bloom-memory-floor")
    t = lm.var(0.0)
    a, d = (lm.var(0.0), lm.var(0.0)) if free_scale else (None, None)
    b, c = lm.var(0.0), lm.var(-1e3, 1e3)
    for (s, act, r), y in rows:
        pred = (a * s + d * r if a is not None else s + r) + b * act + c
        lm.add(pred - y <= t * y)
        lm.add(y - pred <= t * y)
    lm.minimize(t)
    res = lm.solve(60.0, 0.0)

    def val(x) -> float:
        return float(res.values[next(iter(x.terms))])
    one = (val(a), val(d)) if a is not None else (1.0, 1.0)
    return float(res.objective), (one[0], val(b), one[1], val(c))


def main() -> None:
    rows = [x for x in validate().rows if x.group.startswith("bloom") and x.mem_err is not None]
    data = [(parts(x), x.published_gib) for x in rows]
    print(f"{len(rows)} BLOOM readings with stage-0 memory (GB as written; nvidia-smi)\n")
    print(f"{'run':<64} {'read':>5} {'pred':>6} {'S':>6} {'A':>6} {'R':>5}")
    for x, ((s, a, r), y) in zip(rows, data):
        print(f"{x.id:<64} {y:5.1f} {x.predicted_gib:6.1f} {s:6.1f} {a:6.1f} {r:5.1f}")
    worst = max(abs(x.predicted_gib / x.published_gib - 1) for x in rows)
    print(f"\nthe model as it is: largest |error| {100 * worst:.1f}%")
    for free in (False, True):
        t, (a, b, d, c) = minimax(data, free)
        form = "a S + b A + d R + c" if free else "S + b A + R + c"
        print(f"best {form:<19}: largest |error| {100 * t:.1f}% at a = {a:.3f}, b = {b:.3f}, "
              f"d = {d:.3f}, c = {c:+.2f} GiB")
    print("\npairs that differ only in micro-batch (same TP, PP, DP; a configuration read twice:"
          " the mean of its readings): growth from the smaller, and the read growth per GiB of "
          "the model's A growth")
    by: dict = {}
    for x, (p, y) in zip(rows, data):
        if "_mbs" not in x.id:
            continue
        key, rest = x.id.split("_mbs")
        by.setdefault(key, {}).setdefault(int(rest.split("_")[0]), []).append((x, p, y))
    for key, mbs in sorted(by.items()):
        if len(mbs) < 2:
            continue
        lo, hi = min(mbs), max(mbs)
        (x0, p0, _), (x1, p1, _) = mbs[lo][0], mbs[hi][0]
        y0 = sum(r[2] for r in mbs[lo]) / len(mbs[lo])
        y1 = sum(r[2] for r in mbs[hi]) / len(mbs[hi])
        da = p1[1] - p0[1]
        print(f"  {key.split('_l72_')[-1]:<14} mbs {lo} -> {hi}: read {y1 - y0:+5.1f}, model "
              f"{x1.predicted_gib - x0.predicted_gib:+5.1f} (A {da:+5.1f}); read / A "
              f"{(y1 - y0) / da:4.2f}")


if __name__ == "__main__":
    main()
