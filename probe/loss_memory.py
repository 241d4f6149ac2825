"""Memory of the language-model loss, per logit, as torchtitan computes it: a measurement of
the installed PyTorch, which the memory model's loss terms are checked against
(model/memory.py `LOSS_BYTES_PER_LOGIT`; tests/test_probe.py).

    pip install -e '.[probe]'
    python probe/loss_memory.py [--tokens 4096 --vocab 8192] [--json]

What is measured: torch.profiler's allocator events (profile_memory=True) over one loss step,
from the bf16 logits' matmul to the end of the backward, summed in time order, divided by the
number of logits: what is still allocated when the forward ends (kept for the backward, the
logits themselves deleted as torchtitan does) and the peak over the step. The step is
torchtitan's: `F.cross_entropy(pred.flatten(0, 1).float(), labels)`, `del pred` before the
backward (train.py and its loss_fn, 2024-12; torchtitan/components/loss.py since v0.1.0), on
four paths:
- `torchtitan`: eager, ATen's log_softmax and nll_loss;
- `torchtitan-loss-parallel`: the same under `loss_parallel()` on vocabulary-sharded logits
  (torchtitan applies it with TP: the output layer is ColwiseParallel with Shard(-1) outputs);
  PyTorch's DTensor handlers (torch/distributed/tensor/parallel/loss.py) run it. One rank of a
  gloo process group: the tensors are the same as on each of TP ranks, whose shard this is;
- `torchtitan-compiled`, `torchtitan-compiled-loss-parallel`: the loss function under
  torch.compile, as torchtitan builds it with compile on (build_cross_entropy_loss; v0.2's
  [compile] components ["model", "loss"]); one warm-up step compiles it first.

On the CPU: the ATen operators and the tensors they allocate are the ones CUDA runs (one
kernel per operator, the same outputs; a compiled loss's buffers are inductor's, which plans
them alike for either device); what differs on a GPU is the caching allocator's rounding,
immaterial at these sizes. The figures are bytes per logit, independent of the sizes
(`--tokens`, `--vocab` only check that).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PATHS = ("torchtitan", "torchtitan-loss-parallel", "torchtitan-compiled",
         "torchtitan-compiled-loss-parallel")
MARK_BYTES = 12347  # an allocation of this size marks the forward's end


def allocations(step) -> list[int]:
    """The allocator's events while `step()` runs, in time order: bytes allocated (positive)
    and freed (negative); what existed before is not counted."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    return [e.nbytes() for e in events]


def live_bytes(sizes, mark: int = MARK_BYTES) -> tuple[int, int]:
    """(bytes live when the step allocates `mark` bytes, its mark of the forward's end; peak
    bytes) of a sequence of allocator events (`allocations`; bench/activation_memory.py reads
    the frameworks' own steps' the same way)."""
    live = peak = 0
    kept = None
    for n in sizes:
        if kept is None and n == mark:
            kept = live
        live += n
        peak = max(peak, live)
    if kept is None:
        raise RuntimeError("the forward's mark was not seen among the allocator's events")
    return kept, peak


def measure(tokens: int = 4096, vocab: int = 8192, hidden: int = 64
            ) -> dict[str, tuple[float, float]]:
    """(kept, peak) bytes per logit of each path in PATHS (bf16 logits of `tokens` x `vocab`)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    from probe.gemm import free_port

    gen = torch.Generator().manual_seed(0)
    h0 = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
    w0 = torch.randn(vocab, hidden, generator=gen).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (tokens,), generator=gen)

    def loss_fn(pred, target):  # torchtitan's cross_entropy_loss on [tokens, vocab] logits
        return F.cross_entropy(pred.float(), target)

    started = not dist.is_initialized()
    if started:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
        dist.init_process_group("gloo", rank=0, world_size=1)
    out = {}
    try:
        mesh = init_device_mesh("cpu", (1,))
        for name in PATHS:
            fn = torch.compile(loss_fn) if "compiled" in name else loss_fn
            if "loss-parallel" in name:
                h = distribute_tensor(h0.clone(), mesh, [Replicate()]).requires_grad_()
                w = distribute_tensor(w0.clone(), mesh, [Shard(0)]).requires_grad_()
                y = distribute_tensor(labels, mesh, [Replicate()])
                ctx = loss_parallel
            else:
                h, w, y = h0.clone().requires_grad_(), w0.clone().requires_grad_(), labels
                ctx = contextlib.nullcontext

            def step(fn=fn, h=h, w=w, y=y, ctx=ctx):
                pred = F.linear(h, w)  # column-parallel under TP: sharded on the vocabulary
                with ctx():
                    loss = fn(pred, y)
                    del pred
                    torch.empty(MARK_BYTES, dtype=torch.uint8)  # the forward's end
                    loss.backward()

            step()  # warm-up (and compile)
            h.grad = w.grad = None
            kept, peak = live_bytes(allocations(step))
            out[name] = (kept / (tokens * vocab), peak / (tokens * vocab))
    finally:
        if started:
            dist.destroy_process_group()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--tokens", type=int, default=4096,
                    help="Tokens of the loss step (its logits: tokens x vocab) [4096].")
    ap.add_argument("--vocab", type=int, default=8192, help="Vocabulary size [8192].")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.vocab < 1:
        ap.error("--tokens and --vocab must be 1 or more")
    import torch

    from model.memory import LOSS_BYTES_PER_LOGIT
    got = measure(args.tokens, args.vocab)
    if args.json:
        print(json.dumps({"torch": torch.__version__, "bytes_per_logit": got}))
        return 0
    print(f"bytes per logit of torchtitan's loss step (torch {torch.__version__}, CPU, "
          f"{args.tokens} tokens x {args.vocab} vocabulary): kept for the backward, and peak")
    for name, (kept, peak) in got.items():
        mk, mp = LOSS_BYTES_PER_LOGIT[name]
        print(f"  {name:<35} measured {kept:6.2f} {peak:6.2f}   model/memory.py "
              f"{mk:5.1f} {mp:5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
