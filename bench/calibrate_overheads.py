"""How the memory allowance defaults (Overheads.context_gib, .fragmentation) were chosen.

    python bench/calibrate_overheads.py

Grid search over the BLOOM runs of data/published_runs.json (nvidia-smi of the first node, which
holds stage 0, and the published out-of-memory outcomes); nothing else is used. A pair is
acceptable only when every OOM run is predicted above the GPU's memory and every run that ran
within it; among those, the pair with the smallest worst relative error is chosen (ties: the
smaller median). Prints the best pairs, then per run the reading, the prediction and its error
for the best pair.
"""

import statistics
import sys
from pathlib import Path

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


def main():
    runs = [r for r in load_runs() if not _skip_reason(r) and r["source_group"].startswith("bloom")]
    inputs = [(r, run_to_inputs(r)) for r in runs]
    results = []
    for ctx in CONTEXT_GIB:
        for frag in FRAGMENTATION:
            mx, med, ok, rows = evaluate(inputs, ctx, frag)
            results.append((not ok, mx, med, ctx, frag, rows))
    results.sort(key=lambda x: x[:3])
    print(f"{len(runs)} BLOOM runs, {sum(1 for r in runs if r.get('peak_memory'))} with a reading")
    print("max_err  median_err  context_gib  fragmentation  oom_ok")
    for bad, mx, med, ctx, frag, _rows in results[:8]:
        print(f"{mx:.4f}   {med:.4f}      {ctx:<11}  {frag:<13}  {not bad}")
    best = results[0]
    print(f"\nper run at context_gib={best[3]}, fragmentation={best[4]}:")
    for rid, pub, pred in best[5]:
        print(f"  {rid:66s} {pub:5.0f} GB  {pred:6.1f} GiB  {100 * (pred - pub) / pub:+6.1f}%")


if __name__ == "__main__":
    main()
