"""The memory model judged on BLOOM's pre-launch readings that are not in the reference set.

    python bench/bloom_memory_heldout.py [--context-gib X --fragmentation Y]

data/published_bloom_memory_heldout.json holds the memory readings of the other dated tables
of BigScience's chronicles-prequel.md (02-21 to 02-28: other micro-batches, head counts, hidden
sizes and depths, ZeRO stage 0, the BF16 optimizer, two more out-of-memory runs). Each row is
built as the reference set's 02-25 rows are (formats/published.py bloom_heldout_inputs: the
reference row of its precision with the row's shape and layout in place) and its stage-0
memory (the first node's nvidia-smi) is set against the reading; out-of-memory rows check that
some stage is predicted above the GPU. Nothing is fitted to these rows; the allowance in use
(bench/calibrate_overheads.py) was chosen on the reference set's readings alone.
Prints per row the reading, the prediction and the error, then the median and largest |error|
by tensor-parallel size and precision, and the out-of-memory outcomes. `--context-gib` and
`--fragmentation` judge another allowance (Overheads) than the defaults.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats.published import bloom_heldout_inputs, load_bloom_heldout  # noqa: E402
from model.estimator import estimate  # noqa: E402
from model.specs import Options, Overheads  # noqa: E402

def main() -> None:
    ap = argparse.ArgumentParser()
    default = Overheads()
    ap.add_argument("--context-gib", type=float, default=default.context_gib)
    ap.add_argument("--fragmentation", type=float, default=default.fragmentation)
    args = ap.parse_args()
    options = Options(overheads=Overheads(context_gib=args.context_gib,
                                          fragmentation=args.fragmentation))
    doc = load_bloom_heldout("memory")
    print(f"{len(doc['rows'])} held-out rows ({doc['source_url']}); allowance: context "
          f"{args.context_gib} GiB, fragmentation {args.fragmentation}\n")
    # the held-out readings are nvidia-smi's, written "GB": read as GiB (MiB / 1024), as in
    # validate; err is signed here, predicted / published - 1
    print(f"{'row':<52} {'pub GiB':>7} {'pred GiB':>8} {'err':>7}   OOM pub/pred")
    errs: dict[tuple, list[float]] = {}
    oom_ok = []
    for row, r, (model, job, cluster, plan, _notes) in bloom_heldout_inputs("memory"):
        est = estimate(model, job, cluster, plan, options)
        stage0 = est.stages[0].memory.total_gib
        oom_ok.append(est.fits != row["oom"])
        outcome = f"{'OOM' if row['oom'] else 'ran'}/{'fits' if est.fits else 'OOM'}"
        if row["memory_gb"] is None:
            print(f"{r['id']:<52} {'-':>7} {est.peak_memory_gib:8.1f} {'':>7}   {outcome}")
            continue
        e = 100 * (stage0 - row["memory_gb"]) / row["memory_gb"]
        errs.setdefault((row["precision"], row["tp"]), []).append(e)
        print(f"{r['id']:<52} {row['memory_gb']:7.0f} {stage0:8.1f} {e:+6.1f}%   {outcome}")
    every = [abs(e) for v in errs.values() for e in v]
    print(f"\nstage-0 memory |error|: median {statistics.median(every):.1f}%, "
          f"max {max(every):.1f}% over {len(every)} readings")
    for (prec, tp), v in sorted(errs.items()):
        print(f"  {prec} TP {tp}: {len(v):2d} readings, signed median "
              f"{statistics.median(v):+.1f}%, |error| median "
              f"{statistics.median(abs(e) for e in v):.1f}%, max {max(abs(e) for e in v):.1f}%")
    print(f"fits/OOM predicted correctly: {sum(oom_ok)}/{len(oom_ok)}")


if __name__ == "__main__":
    main()
