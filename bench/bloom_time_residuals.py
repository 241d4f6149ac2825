"""What BLOOM's time residuals follow: in the reference set, on readings held out, and what
launch blocking and the network cost as BigScience measured them.

    python bench/bloom_time_residuals.py

1. In-sample. The BLOOM runs of data/published_runs.json; N = (layers of the fullest stage) x
   (micro-batches per pipeline), about the kernels one GPU runs per iteration whatever their
   size. Three forms, fitted by least squares on the relative error (nothing in the model is
   changed):
     t = a x predicted            (a scale only),
     t = a x predicted + c x N    (a cost per layer and micro-batch),
     t = a x predicted + c x N x TP,
   with per run the error of each, and for each form the median error of the runs left out
   when it is fitted on 3 of the 14 pre-launch runs (every choice of 3; a prior keeps a near
   1, sd 0.15, as `calibrate`'s on gemm_scale).
2. Held out. data/published_bloom_time_heldout.json: 97 iteration times from the same
   document's other tables (02-17 to 02-28), built as the reference rows are
   (formats/published.py bloom_heldout_inputs). Per row the model's error; medians overall,
   for rows whose head dimension is not a multiple of 8 elements (16 bytes in 16-bit; the
   eager attention's batched GEMMs take the head dimension as K and N, and the cost model
   prices aligned kernels only: model/compute.py head_dim_aligned), by tensor parallelism and
   micro-batch, and for the aligned rows before and from 02-25 (the document: that day the
   nodes' "PCI-Express/NUMA was improved ... (1-5%)"). Then the two forms of 1, as fitted
   there on the reference runs, applied unchanged to the aligned held-out rows.
3. Launch blocking. BigScience ran BLOOM with CUDA_LAUNCH_BLOCKING=1 (the production script:
   "do not remove or the training will hang", train/tr11-176B-ml/tr11-176B-ml.slurm). The
   document measured its cost on the 200B model (its `launch_blocking` table, TFLOPs at one
   iteration). This part turns those TFLOPs into seconds per iteration (the same model's 02-17
   row reads 844.81 s at 98.87 TFLOPs on 80 GPUs at GBS 2048, in the same formula), prints the
   blocking / async ratio, and what the c x N of 1 would add on those runs.
4. The network as BigScience measured it. Judging only: nothing here changes the model or
   its data. BigScience timed one NCCL all-reduce of 4 GB over 4 of these nodes (32 A100s,
   January 2022; experiments/bandwidth/all_reduce_bench-a100-n4.txt at the same commit as the
   data, 160 readings of its bus bandwidth 2 (n - 1) / n x size / time). NCCL's own log there
   builds 2 channels whose rings leave each node through 2 of its 4 Omni-Path NICs (NET/IB/1,
   NET/IB/3). If each NIC carries what one channel did, a node moves 4 x that, shared by the 8
   data-parallel rings of a TP 8 run: the per-GPU stream that would be, against the 6.25 GB/s
   (4 x 100 Gb/s per 8 GPUs) the reference runs are given, and the BLOOM runs' errors at
   presets with it, beside the 0.18-0.23 x network that calibrate's fits on all of them ask for
   (bench/README.md).
"""

from __future__ import annotations

import itertools
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats.published import (_skip_reason, bloom_heldout_inputs,  # noqa: E402
                                load_bloom_heldout, load_runs, run_to_inputs)
from model.calibration import NOISE_SD, PRIOR_SD  # noqa: E402
from model.compute import GEMM_ALIGN_BYTES, head_dim_aligned  # noqa: E402
from model.estimator import estimate  # noqa: E402

ALIGN_ELEMENTS = GEMM_ALIGN_BYTES // 2  # of a 16-bit element (module docstring)


def _n(job, shape) -> int:
    """Layers of the fullest stage x micro-batches per pipeline."""
    layers = max(shape.stage_layers(s) for s in range(shape.pp))
    return layers * (job.global_batch // (shape.dp * shape.micro_batch))


def bloom_runs():
    """(reference run, published seconds) for every BLOOM run with a time that ran."""
    for r in load_runs():
        if _skip_reason(r) or r.get("oom") or not r["source_group"].startswith("bloom"):
            continue
        pub = r.get("iteration_time_s") or r.get("iteration_time_s_derived")
        if pub is not None:
            yield r, float(pub)


def bloom_rows():
    rows = []
    for r, pub in bloom_runs():
        model, job, cluster, plan, _notes = run_to_inputs(r)
        sh = plan.shape
        est = estimate(model, job, cluster, plan)
        rows.append(dict(id=r["id"], group=r["source_group"], tp=sh.tp, pp=sh.pp, dp=sh.dp,
                         mbs=sh.micro_batch, n=_n(job, sh), pred=est.iteration_ms / 1e3,
                         pub=float(pub)))
    return rows


def heldout_rows():
    rows = []
    for row, _r, (model, job, cluster, plan, _notes) in bloom_heldout_inputs("time"):
        sh = plan.shape
        rows.append(dict(row=row, tp=sh.tp, n=_n(job, sh), head_dim=model.qk_head_dim,
                         aligned=head_dim_aligned(model, job),
                         pred=estimate(model, job, cluster, plan).iteration_ms / 1e3,
                         pub=row["sec_per_iteration"]))
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


def _summary(errs: list[float]) -> str:
    if not errs:
        return "no rows"
    return (f"{len(errs):2d} rows, median |error| {100 * statistics.median(map(abs, errs)):4.1f}%,"
            f" signed {100 * statistics.median(errs):+5.1f}%")


def in_sample() -> dict:
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
    print(f"1. In-sample: {len(rows)} BLOOM runs with a time; N = layers of the fullest stage x "
          "micro-batches")
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
    return fits


def held_out(fits: dict) -> None:
    rows = heldout_rows()
    print(f"\n2. Held out: {len(rows)} iteration times of the same document's other tables "
          "(data/published_bloom_time_heldout.json)")
    print(f"{'row':<52} {'line':>4} {'hd':>4} {'N':>5} {'pub s':>7} {'pred s':>7} {'err':>7}")
    for x in rows:
        r = x["row"]
        rid = (f"{r['date']} {r['precision']} h{r['hidden_size']} l{r['num_layers']} "
               f"nh{r['num_attention_heads']} {r['dp']}x{r['tp']}x{r['pp']} mbs"
               f"{r['micro_batch_size']} gbs{r['global_batch_size']}")
        flag = "" if x["aligned"] else "*"
        print(f"{rid:<52} {r['line']:4d} {x['head_dim']:3d}{flag:1} {x['n']:5d} {x['pub']:7.2f} "
              f"{x['pred']:7.2f} {100 * (x['pred'] / x['pub'] - 1):+6.1f}%")
    err = {id(x): x["pred"] / x["pub"] - 1 for x in rows}
    aligned = [x for x in rows if x["aligned"]]
    early = [x for x in aligned if x["row"]["date"] < "02-25"]
    late = [x for x in aligned if x["row"]["date"] >= "02-25"]
    print(f"\nthe model: all {_summary([err[id(x)] for x in rows])}")
    print(f"  head dimension not a multiple of {ALIGN_ELEMENTS} (* above): "
          f"{_summary([err[id(x)] for x in rows if not x['aligned']])}")
    print(f"  aligned: {_summary([err[id(x)] for x in aligned])}")
    print(f"    before 02-25: {_summary([err[id(x)] for x in early])}")
    print(f"    from 02-25:   {_summary([err[id(x)] for x in late])}")
    for prec in ("fp16", "bf16"):
        print(f"    {prec}:         "
              f"{_summary([err[id(x)] for x in aligned if x['row']['precision'] == prec])}")
    print("  aligned, by tensor parallelism and micro-batch (signed median error, rows):")
    cells: dict[tuple[int, int], list[float]] = {}
    for x in aligned:
        cells.setdefault((x["tp"], x["row"]["micro_batch_size"]), []).append(err[id(x)])
    print("    " + "   ".join(f"TP {t} mbs {b}: {100 * statistics.median(v):+5.1f}% ({len(v)})"
                              for (t, b), v in sorted(cells.items())))
    print("\nthe forms of 1, fitted on the reference runs, applied unchanged to the aligned rows:")
    for k in ("+ c N", "+ c N TP"):
        out = {}
        for name, sel in (("all", aligned), ("before 02-25", early), ("from 02-25", late)):
            P, M = (np.array([x[f] for x in sel]) for f in ("pred", "pub"))
            F = np.array([x["n"] * (x["tp"] if k.endswith("TP") else 1) for x in sel], float)
            out[name] = list(predict(fits[k], P, F) / M - 1)
        print(f"  {k:<9} all {_summary(out['all'])}")
        for name in ("before 02-25", "from 02-25"):
            print(f"  {'':<9}   {name}: {_summary(out[name])}")


def launch_blocking(fits: dict) -> None:
    doc = load_bloom_heldout("time")
    # the 200B model's 02-17 row on 80 GPUs turns the table's TFLOPs (same model, same formula)
    # into seconds per iteration
    ref = next(r for r in doc["rows"] if r["date"] == "02-17" and r["num_layers"] == 80
               and r["dp"] == 1)
    t_ref, tf_ref = ref["sec_per_iteration"], ref["tflops_published"]
    gpus_ref, gbs_ref = ref["dp"] * ref["tp"] * ref["pp"], ref["global_batch_size"]
    print(f"\n3. Launch blocking as BigScience measured it ({ref['num_layers']} x "
          f"{ref['hidden_size']}, TP {ref['tp']} x PP {ref['pp']}, micro-batch "
          f"{ref['micro_batch_size']}; 'dealing with JZ hanging'; seconds from the 02-17 row, "
          f"{t_ref} s at {tf_ref} TFLOPs on {gpus_ref} GPUs)")
    print(f"{'GPUs':>4} {'GBS':>5} {'blocking s':>10} {'async s':>8} {'blocking/async':>14} "
          f"{'N':>6} {'c N of 1 (s)':>12}")
    a, c = fits["+ c N"]
    by = {}
    for x in doc["launch_blocking"]:
        sec = t_ref * tf_ref / x["tflops_published"] * (x["global_batch_size"] / gbs_ref) * (
            gpus_ref / x["gpus"])
        by.setdefault((x["gpus"], x["global_batch_size"]), {})[x["async_launch"]] = sec
    for (gpus, gbs), v in sorted(by.items()):
        dp = gpus // (ref["tp"] * ref["pp"])
        n = ref["num_layers"] // ref["pp"] * gbs // (dp * ref["micro_batch_size"])
        blocking, asynchronous = v.get(False), v.get(True)
        ratio = f"{blocking / asynchronous:14.3f}" if blocking and asynchronous else f"{'-':>14}"
        print(f"{gpus:4d} {gbs:5d} {blocking or float('nan'):10.1f} "
              f"{asynchronous or float('nan'):8.1f} {ratio} {n:6d} {c * n:12.1f}")
    print(f"  (c = {1e3 * c:.2f} ms per layer and micro-batch, the in-sample fit of 1)")


# experiments/bandwidth/all_reduce_bench-a100-n4.txt (bigscience-workshop/bigscience at
# 9e64ede): median bus bandwidth of its 160 readings (ranks x 5 trials; the first trial's are
# ~15 Gbps), NCCL's channel count and the NICs its rings use, per its NCCL INFO lines
MEASURED_BUSBW_GBIT_PER_S = 40.54
NCCL_CHANNELS = 2
NICS_PER_NODE, GPUS_PER_NODE = 4, 8


def measured_network() -> None:
    import formats.published as pub
    per_channel_gb_per_s = MEASURED_BUSBW_GBIT_PER_S / 8 / NCCL_CHANNELS
    stream = per_channel_gb_per_s * NICS_PER_NODE / GPUS_PER_NODE
    assumed = pub.NETWORKS_GB_PER_S["bloom"][0]
    print(f"\n4. The network as BigScience measured it: all-reduce bus bandwidth "
          f"{MEASURED_BUSBW_GBIT_PER_S} Gbit/s over {NCCL_CHANNELS} channels = "
          f"{per_channel_gb_per_s:.2f} GB/s per NIC; x {NICS_PER_NODE} NICs / "
          f"{GPUS_PER_NODE} GPUs = {stream:.2f} GB/s per GPU stream, {stream / assumed:.2f} x "
          f"the {assumed} GB/s the reference runs are given")
    saved = dict(pub.NETWORKS_GB_PER_S)
    rows = list(bloom_runs())
    try:
        for bw in (assumed, stream):
            pub.NETWORKS_GB_PER_S["bloom"] = (bw, saved["bloom"][1])
            errs = []
            for r, pub_s in rows:
                model, job, cluster, plan, _ = run_to_inputs(r)
                t = estimate(model, job, cluster, plan).iteration_ms / 1e3
                errs.append(t / pub_s - 1)
            med = statistics.median(map(abs, errs))
            print(f"  {bw:5.2f} GB/s: median |error| {100 * med:4.1f}%, signed median "
                  f"{100 * statistics.median(errs):+5.1f}%, per run "
                  + " ".join(f"{100 * e:+.0f}" for e in errs))
    finally:
        pub.NETWORKS_GB_PER_S.clear()
        pub.NETWORKS_GB_PER_S.update(saved)


def main() -> None:
    fits = in_sample()
    held_out(fits)
    launch_blocking(fits)
    measured_network()


if __name__ == "__main__":
    main()
