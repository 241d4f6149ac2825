"""Each pipeline stage's own mix of windowed and full-attention layers, as the cost model prices
it (costs.CostModel.virtual_stage_ms with plan.full_attention_layers), against a per-layer mean
of the two (every layer at the model's average), the simpler pricing this replaced.

A Gemma-3-27B-like shape (62 layers, a 1024-key window, every 6th layer full: 10 full, 52
windowed) on H100s, TP 8, Megatron-LM's even split over PP 2, 4 and 8, sequences of 8k and
32k. For each stage: its layers, how many of them attend fully (Megatron-Core's
is_layer_window_attention: layer numbers from 1, full where 6 divides them), its forward +
backward per micro-batch as the estimator prices it (model.estimator.Evaluator, its own mix)
and at the mean layer, and how far the mean is off; then the slowest stage both ways, which
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
from model.estimator import Evaluator, make_plan  # noqa: E402
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
            win = layer_ms(GEMMA, job, c, sh)
            full = layer_ms(dataclasses.replace(GEMMA, sliding_window=0, window_full_every=0),
                            job, c, sh)
            n_full = GEMMA.num_layers - GEMMA.windowed_layers
            mean = (n_full * full + GEMMA.windowed_layers * win) / GEMMA.num_layers
            ev = Evaluator(GEMMA, job, c, sh, Options())
            durs = ev.replica_durations(plan.placement, 0, [0.0] * pp)
            print(f"\nseq {seq}, PP {pp}: layer fwd+bwd ms  windowed {win:.3f}  full "
                  f"{full:.3f}  mean {mean:.3f}")
            print("  stage  layers  full   priced ms   at the mean    mean off")
            worst, worst_mean = 0.0, 0.0
            for s_, n in enumerate(sh.layers):
                k = ev.kinds
                priced = durs[k.F(s_)] + durs[k.B(s_)]
                at_mean = priced + n * mean - (ev.full_layers[s_] * full
                                               + (n - ev.full_layers[s_]) * win)
                worst, worst_mean = max(worst, priced), max(worst_mean, at_mean)
                print(f"  {s_:5d}  {n:6d}  {ev.full_layers[s_]:4d}  {priced:10.2f}  "
                      f"{at_mean:11.2f}  {100 * (at_mean - priced) / priced:+6.2f}%")
            print(f"  slowest stage: priced {worst:.2f} ms, at the mean {worst_mean:.2f} ms "
                  f"({100 * (worst_mean - worst) / worst:+.2f}%)")

if __name__ == "__main__":
    main()
