"""How far the per-layer mean of windowed and full attention (model/compute.py: every layer is
priced at the model's mean) is from each pipeline stage's own mix of layers.

A Gemma-3-27B-like shape (62 layers, a 1024-key window, every 6th layer full: 10 full, 52
windowed) on H100s, TP 8, Megatron-LM's even split over PP 2, 4 and 8, sequences of 8k and
32k. For each stage: its layers, how many of them attend fully (Megatron-Core's
is_layer_window_attention: layer numbers from 1, full where 6 divides them), its forward +
backward per micro-batch as priced (layers x the mean layer) and as its own mix would cost
(each layer its own attention), and the difference; then the slowest stage both ways, which
sets the pipeline's steady state.

    python bench/window_mix.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from formats.clusters import uniform_cluster  # noqa: E402
from model.costs import CostModel  # noqa: E402
from model.estimator import make_plan  # noqa: E402
from model.specs import JobSpec, ModelSpec, Options  # noqa: E402

GEMMA = ModelSpec("gemma3-27b-like", 62, 5376, 32, 16, 21504, 262144, 131072, gated_mlp=True,
                  tied_embeddings=True, position_embedding="rope", norm="rmsnorm", bias=False,
                  dropout=False, kv_channels=128, sliding_window=1024, window_full_every=6)


def layer_ms(model: ModelSpec, job: JobSpec, cluster, shape) -> float:
    """Forward + backward of one layer on one GPU (ms per micro-batch)."""
    lc = CostModel(model, job, cluster, shape, Options()).compute(cluster.nodes[0].gpu).layer()
    return lc.fwd.total_ms + lc.bwd.total_ms


def main() -> None:
    c = uniform_cluster(8, 8, "H100-SXM-80GB", 360.0, 50.0)
    every = GEMMA.window_full_every
    print(f"{GEMMA.name}: {GEMMA.num_layers} layers, window {GEMMA.sliding_window}, full every "
          f"{every} ({GEMMA.num_layers - GEMMA.windowed_layers} full), TP 8, H100")
    for seq in (8192, 32768):
        job = JobSpec(global_batch=64, seq_length=seq)
        for pp in (2, 4, 8):
            plan = make_plan(GEMMA, job, c, tp=8, pp=pp, sequence_parallel=True)
            sh = plan.shape
            mean = layer_ms(GEMMA, job, c, sh)
            win = layer_ms(dataclasses.replace(GEMMA, window_full_every=0), job, c, sh)
            full = layer_ms(dataclasses.replace(GEMMA, sliding_window=0, window_full_every=0),
                            job, c, sh)
            print(f"\nseq {seq}, PP {pp}: layer fwd+bwd ms  mean {mean:.3f}  windowed "
                  f"{win:.3f}  full {full:.3f}")
            print("  stage  layers  full   priced ms   own mix ms    diff")
            first, worst_priced, worst_own = 1, 0.0, 0.0
            for s, n in enumerate(sh.layers):
                nums = range(first, first + n)
                n_full = sum(1 for g in nums if g % every == 0)
                priced = n * mean
                own = n_full * full + (n - n_full) * win
                worst_priced, worst_own = max(worst_priced, priced), max(worst_own, own)
                print(f"  {s:5d}  {n:6d}  {n_full:4d}  {priced:10.2f}  {own:11.2f}  "
                      f"{100 * (priced - own) / own:+6.2f}%")
                first += n
            print(f"  slowest stage: priced {worst_priced:.2f} ms, own mix {worst_own:.2f} ms "
                  f"({100 * (worst_priced - worst_own) / worst_own:+.2f}%)")


if __name__ == "__main__":
    main()
