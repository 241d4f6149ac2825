"""How the memory allowance defaults (Overheads.context_gib, .fragmentation) were chosen.

    python bench/calibrate_overheads.py

Grid search over the BLOOM runs of data/published_runs.json (nvidia-smi of the first node, which
holds stage 0, and the published out-of-memory outcomes); nothing else is used. A pair is
acceptable only when every OOM run is predicted above the GPU's memory and every run that ran
within it; among those, the pair with the smallest worst relative error is chosen (ties: the
smaller median). Prints the best pairs, then per run the reading, the prediction and its error
for the best pair.

    python bench/calibrate_overheads.py --joint

The same search with each reading compared as what it measures, over both groups with memory
readings: BLOOM's nvidia-smi (the device: context + (1 + fragmentation) x tensors; its one
configuration read twice, 44 and 38 GB, by the mean of the two) and torchtitan's memory monitor
(the allocator's reserved peak, torchtitan/metrics.py at 9dec370: (1 + fragmentation) x
tensors, no context); a finer grid. Not the defaults' selection: see bench/README.md for what
its choice does to the held-out runs.
"""

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats.published import _skip_reason, load_runs, run_to_inputs  # noqa: E402
from model.estimator import Evaluator  # noqa: E402
from model.specs import Options, Overheads  # noqa: E402

CONTEXT_GIB = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0]
FRAGMENTATION = [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35]


def evaluate(inputs, ctx, frag):
    o = Options(overheads=Overheads(context_gib=ctx, fragmentation=frag))
    rows, ok = [], True
    for r, (m, j, c, p, _notes) in inputs:
        ev = Evaluator(m, j, c, p.shape, o)
        mem = [x.total_gib for x in ev.memory]
        limit = min(nd.gpu.memory_gib for nd in c.nodes)
        if r.get("oom") is True:
            ok &= max(mem) > limit
        else:
            ok &= max(mem) <= limit
        if r.get("peak_memory"):
            rows.append((r["id"], float(r["peak_memory"]), mem[0]))
    errs = [abs(pred - pub) / pub for _id, pub, pred in rows]
    return max(errs), statistics.median(errs), ok, rows


def search(score, contexts, fragmentations):
    """Every (context, fragmentation) pair scored by `score` -> (worst error, median error,
    every OOM outcome right, per-row detail); prints the best 8 (outcomes right first, then the
    smaller worst error, then the smaller median) and returns the best as (not ok, worst,
    median, context, fragmentation, detail)."""
    results = []
    for ctx in contexts:
        for frag in fragmentations:
            mx, med, ok, detail = score(ctx, frag)
            results.append((not ok, mx, med, ctx, frag, detail))
    results.sort(key=lambda x: x[:3])
    print("max_err  median_err  context_gib  fragmentation  oom_ok")
    for bad, mx, med, ctx, frag, _detail in results[:8]:
        print(f"{mx:.4f}   {med:.4f}      {ctx:<11}  {frag:<13}  {not bad}")
    return results[0]


def main():
    runs = [r for r in load_runs()
            if not _skip_reason(r) and r["source_group"].startswith("bloom")]
    inputs = [(r, run_to_inputs(r)) for r in runs]
    print(f"{len(runs)} BLOOM runs, {sum(1 for r in runs if r.get('peak_memory'))} with a reading")
    best = search(lambda ctx, frag: evaluate(inputs, ctx, frag), CONTEXT_GIB, FRAGMENTATION)
    print(f"\nper run at context_gib={best[3]}, fragmentation={best[4]}:")
    for rid, pub, pred in best[5]:
        print(f"  {rid:66s} {pub:5.0f} GB  {pred:6.1f} GiB  {100 * (pred - pub) / pub:+6.1f}%")


JOINT_CONTEXT_GIB = [round(x, 2) for x in np.arange(0.5, 4.01, 0.25)]
JOINT_FRAGMENTATION = [round(x, 2) for x in np.arange(0.10, 0.351, 0.01)]
NO_ALLOWANCE = Options(overheads=Overheads(context_gib=0.0, fragmentation=0.0))


def joint_readings():
    """Per run: (id, group, configuration key, reading GiB or None, oom flag, the tensors of
    each stage in GiB without any allowance, the GPU's memory)."""
    out = []
    for r in load_runs():
        g = r["source_group"]
        if _skip_reason(r) or not (g.startswith("bloom") or g.startswith("torchtitan")):
            continue
        model, job, cluster, plan, _notes = run_to_inputs(r)
        tensors = [m.total_gib for m in Evaluator(model, job, cluster, plan.shape,
                                                   NO_ALLOWANCE).memory]
        key = (g, model, job, plan.shape)
        out.append((r["id"], g, key, r.get("peak_memory"), r.get("oom"), tensors,
                    min(nd.gpu.memory_gib for nd in cluster.nodes)))
    return out


def joint_evaluate(rows, ctx: float, frag: float):
    """(worst error, median error, every OOM outcome right, per configuration (label,
    reading, prediction)) for one allowance, as `evaluate` returns them."""
    ok, by = True, {}
    for rid, g, key, pub, oom, tensors, limit in rows:
        total = [ctx + (1 + frag) * t for t in tensors]
        if oom is True:
            ok &= max(total) > limit
        elif oom is False or pub:
            ok &= max(total) <= limit
        if pub:
            pred = (1 + frag) * max(tensors) if g.startswith("torchtitan") else total[0]
            by.setdefault(key, (rid, [], pred))[1].append(float(pub))
    conf = [(rid, statistics.fmean(pubs), pred) for rid, pubs, pred in by.values()]
    errs = [abs(pred / pub - 1) for _rid, pub, pred in conf]
    return max(errs), statistics.median(errs), ok, conf


def joint():
    rows = joint_readings()
    n_read = sum(1 for r in rows if r[3])
    n_conf = len({r[2] for r in rows if r[3]})
    print(f"{len(rows)} BLOOM and torchtitan runs, {n_read} memory readings of {n_conf} "
          "configurations")
    best = search(lambda ctx, frag: joint_evaluate(rows, ctx, frag), JOINT_CONTEXT_GIB,
                  JOINT_FRAGMENTATION)
    print(f"\nper configuration at context_gib={best[3]}, fragmentation={best[4]} (BLOOM: the "
          "device, GB as written; torchtitan: the allocator's peak):")
    for rid, pub, pred in best[5]:
        print(f"  {rid:66s} {pub:5.1f}  {pred:6.1f} GiB  {100 * (pred - pub) / pub:+6.1f}%")
    for group in ("bloom", "torchtitan"):
        e = [abs(pred / pub - 1) for rid, pub, pred in best[5]
             if rid.startswith(group)]
        print(f"{group}: {len(e)} configurations, median {100 * statistics.median(e):.1f}%, "
              f"max {100 * max(e):.1f}%")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--joint", action="store_true",
                    help="each reading as what it measures, BLOOM and torchtitan together")
    if ap.parse_args().joint:
        joint()
    else:
        main()
