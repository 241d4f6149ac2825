"""What the frameworks' own code keeps and peaks at, measured on the CPU, against the memory
model (model/memory.py): torchtitan's Llama block, eager and compiled (`layer_activation_bytes`,
`op_sac_tensors`), and Megatron-LM's loss step (`LOSS_BYTES_PER_LOGIT`).

    git -C <torchtitan mirror> archive 3f20451bc torchtitan | tar -x -C /tmp/tt
    git -C <Megatron-LM mirror> archive HEAD megatron/core | tar -x -C /tmp/mlm
    python bench/activation_memory.py [--torchtitan /tmp/tt] [--megatron /tmp/mlm] [--python PY]

torchtitan: its TransformerBlock at the commit of its 2024-12 H100 benchmarks
(data/published_runs.json), with its own activation checkpointing ("selective" = per-op SAC,
"full") and torch.compile; bench/upstream/torchtitan_block_memory.py runs it and reads the
allocator's events (its docstring says what is measured and which CPU stand-ins it uses). The
shape has Llama 3 8B's proportions at a CPU's size: hidden 512, 8 heads of 64, 2 KV heads (8B:
4096, 32 of 128, 8: the same 1/4), FFN 1792 (3.5 x hidden, as 14336 / 4096), sequence 512,
batch 2. Prints per case the bytes per token kept at the end of the forward, measured and
modelled, and the measured peak over the forward and backward.

Megatron-LM: bench/upstream/megatron_loss_memory.py runs its loss as GPTModel does, unfused
(vocab_parallel_cross_entropy, the default) and fused (the native implementation), and prints
the peak bytes per logit of each beside the model's figure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model.memory import LOSS_BYTES_PER_LOGIT, layer_activation_bytes  # noqa: E402
from model.plan import Shape  # noqa: E402
from model.specs import JobSpec, ModelSpec  # noqa: E402
from probe.loss_memory import MARK_BYTES, live_bytes  # noqa: E402

SHAPE = {"dim": 512, "n_heads": 8, "n_kv_heads": 2, "multiple_of": 256,
         "ffn_dim_multiplier": 1.3, "seq": 512, "batch": 2}
CASES = [["selective", False], ["selective", True], ["full", False], ["full", True]]


def modelled_bytes(ffn: int, mode: str, compiled: bool) -> float:
    """The memory model's stored bytes of one layer and micro-batch for the measured block."""
    model = ModelSpec(name="torchtitan-block", num_layers=1, hidden_size=SHAPE["dim"],
                      num_heads=SHAPE["n_heads"], num_kv_heads=SHAPE["n_kv_heads"],
                      ffn_hidden_size=ffn, vocab_size=256, seq_length=SHAPE["seq"],
                      gated_mlp=True, tied_embeddings=False, position_embedding="rope",
                      norm="rmsnorm", bias=False, dropout=False)
    job = JobSpec(global_batch=SHAPE["batch"], seq_length=SHAPE["seq"], precision="bf16",
                  attention="flash", framework="torchtitan", compile=compiled, zero=3)
    shape = Shape(tp=1, pp=1, dp=1, micro_batch=SHAPE["batch"], recompute=mode, zero=3)
    return layer_activation_bytes(model, job, shape)


def torchtitan_block(checkout: str, python: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cases, out = Path(tmp) / "cases.json", Path(tmp) / "results.json"
        cases.write_text(json.dumps({**SHAPE, "mark_bytes": MARK_BYTES, "cases": CASES}))
        subprocess.run([python, str(ROOT / "bench" / "upstream" /
                                    "torchtitan_block_memory.py"), str(cases), str(out)],
                       cwd=checkout, check=True, stderr=subprocess.DEVNULL)
        res = json.loads(out.read_text())
    h_bytes = 2 * SHAPE["dim"]  # one hidden-size bf16 tensor per token
    print(f"torchtitan block at {checkout}, torch {res['torch']}, CPU; bytes per token "
          f"(and in hidden-size bf16 tensors, {h_bytes} B)")
    print(f"{'checkpointing':<14} {'compiled':>8} {'kept, measured':>20} {'kept, model':>18} "
          f"{'peak, measured':>20}")
    for r in res["results"]:
        tok = r["tokens"]
        kept, peak = (x / tok for x in live_bytes(r["allocations"]))
        model = modelled_bytes(r["ffn"], r["mode"], r["compiled"]) / tok
        print(f"{r['mode']:<14} {str(r['compiled']):>8} {kept:9.0f} ({kept / h_bytes:5.2f} h) "
              f"{model:8.0f} ({model / h_bytes:5.2f} h) {peak:9.0f} ({peak / h_bytes:5.2f} h)")


def megatron_loss(checkout: str, python: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        subprocess.run([python, str(ROOT / "bench" / "upstream" / "megatron_loss_memory.py"),
                        str(out), str(MARK_BYTES)], cwd=checkout, check=True,
                       stderr=subprocess.DEVNULL)
        res = json.loads(out.read_text())
    logits = res["tokens"] * res["vocab"]
    got = {k: [x / logits for x in live_bytes(v)] for k, v in res["allocations"].items()}
    mk, mp = LOSS_BYTES_PER_LOGIT["megatron"]
    print(f"Megatron-LM loss step at {checkout}, torch {res['torch']}, CPU, {res['tokens']} "
          f"tokens x {res['vocab']} vocabulary, bytes per logit kept for the backward, peak:")
    print(f"  unfused (Megatron-LM's default; what the plans emit) {got['unfused'][0]:6.2f} "
          f"{got['unfused'][1]:6.2f}   model/memory.py {mk:.1f} {mp:.1f}")
    print(f"  fused, native (--cross-entropy-loss-fusion)          {got['fused'][0]:6.2f} "
          f"{got['fused'][1]:6.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torchtitan", help="root of a torchtitan checkout")
    ap.add_argument("--megatron", help="root of a Megatron-LM checkout (megatron/core)")
    ap.add_argument("--python", default=sys.executable, help="the Python that has torch")
    args = ap.parse_args()
    if not (args.torchtitan or args.megatron):
        ap.error("give --torchtitan and/or --megatron")
    if args.torchtitan:
        torchtitan_block(args.torchtitan, args.python)
    if args.megatron:
        megatron_loss(args.megatron, args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
