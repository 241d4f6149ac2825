"""How the per-operation cost model moves with micro-batch and tensor parallelism.

    python bench/microbatch_curve.py

1. GPT-3 175B (fp16, eager attention, full recompute, as Narayanan et al. 2021 trained it) on 64
   A100-80GB (8 nodes, Selene-like links), TP=8, PP=8, DP=1, global batch 1536: iteration time
   for micro-batch 1..16; then TP 1..8 at micro-batch 1 with PP=8 (DP = 64 / (8 TP)).
   For each: iteration s, one layer's forward per sequence (ms), the share of GEMMs in it,
   the large-GEMM rate reached (TFLOP/s), pipeline bubble share, MFU, peak memory.
2. Llama-3 8B, sequence 8192, bf16, no recompute, TP=8 on one 8 x H100 node: per-GPU memory
   with FlashAttention and with eager attention.
Prints what it measures; no goals are asserted here (bench/README.md explains the shapes).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from formats.clusters import uniform_cluster  # noqa: E402
from model.estimator import Evaluator, make_plan  # noqa: E402
from model.specs import JobSpec  # noqa: E402


def gemm_share(ev) -> tuple[float, float, float]:
    """(layer forward ms per sequence, GEMM share of it, GEMM TFLOP/s) on the first node."""
    gpu = ev.cluster.nodes[0].gpu
    lc = ev.costs.compute(gpu).layer()
    gemm = {k: v for k, v in lc.fwd.ms.items() if k in ("qkv", "proj", "fc1", "fc2", "qk", "pv")}
    flops = 2.0 * ev.costs.tokens * ev.model.hidden_size * (
        4 * ev.model.hidden_size + 2 * ev.model.ffn_hidden_size) / ev.shape.tp
    lt = ev.costs.layer_times(gpu, ev.cluster.nodes[0].ring_gb_per_s(
        tuple(range(ev.shape.tp))))
    gemm_ms = sum(v for k, v in gemm.items() if k in ("qkv", "proj", "fc1", "fc2"))
    return (lt.fwd_ms / ev.shape.micro_batch, sum(gemm.values()) / lc.fwd.total_ms,
            flops / (gemm_ms / 1e3) / 1e12)


def row(label, m, job, c, **kw):
    plan = make_plan(m, job, c, pp=8, recompute="full", **kw)
    ev = Evaluator(m, job, c, plan.shape)
    e = ev.estimate(plan.placement)
    per_seq, share, rate = gemm_share(ev)
    bubble = e.breakdown_ms["bubble_ms"] / e.iteration_ms
    print(f"{label:>10s} {e.iteration_ms / 1e3:9.2f} {per_seq:12.2f} {100 * share:7.1f}% "
          f"{rate:9.1f} {100 * bubble:8.1f}% {100 * e.mfu:6.1f}% {e.peak_memory_gib:8.1f}"
          f"{'' if e.fits else ' (does not fit)'}")


def main():
    m = presets.model("gpt3-175b")
    c = uniform_cluster(8, 8, "A100-80GB", 240.0, 25.0)
    job = JobSpec(global_batch=1536, seq_length=2048, precision="fp16", attention="eager")
    head = (f"{'':>10s} {'iter s':>9s} {'layer fwd':>12s} {'GEMM':>8s} {'GEMM TF/s':>9s} "
            f"{'bubble':>9s} {'MFU':>7s} {'peak GiB':>8s}")
    print("GPT-3 175B, 64 A100-80GB, fp16, eager attention, full recompute, global batch 1536")
    print("TP=8 PP=8 DP=1, micro-batch 1..16 (layer fwd: ms per sequence)")
    print(head)
    for mbs in (1, 2, 4, 8, 16):
        row(f"mbs={mbs}", m, job, c, tp=8, dp=1, micro_batch=mbs)
    print("\nPP=8, micro-batch 1, TP 1..8 (DP = 64 / (8 TP))")
    print(head)
    for tp in (1, 2, 4, 8):
        row(f"TP={tp}", m, job, c, tp=tp, micro_batch=1)

    print("\nLlama-3 8B, sequence 8192, bf16, no recompute, TP=8 (SP) on one 8 x H100 node")
    m8 = presets.model("llama3-8b")
    h100 = uniform_cluster(1, 8, "H100-SXM-80GB", 360.0, 50.0)
    for attn in ("flash", "eager"):
        j = JobSpec(global_batch=8, seq_length=8192, precision="bf16", attention=attn)
        plan = make_plan(m8, j, h100, tp=8, pp=1, micro_batch=1, sequence_parallel=True)
        e = Evaluator(m8, j, h100, plan.shape).estimate(plan.placement)
        print(f"  {attn:6s} attention: {e.peak_memory_gib:6.1f} GiB per GPU, iteration "
              f"{e.iteration_ms:7.1f} ms, MFU {100 * e.mfu:5.1f}%")


if __name__ == "__main__":
    main()
