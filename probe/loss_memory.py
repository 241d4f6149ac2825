"""Peak memory of the language-model loss, per logit, as the frameworks compute it: a
measurement of the installed PyTorch, which the memory model's loss terms are checked against
(model/memory.py `LOSS_PEAK_BYTES_PER_LOGIT`; tests/test_probe.py).

    pip install -e '.[probe]'
    python probe/loss_memory.py [--tokens 4096 --vocab 8192]

What is measured: torch.profiler's allocator events (profile_memory=True) over one loss step,
from the bf16 logits' matmul to the end of the backward, summed in time order; the peak of the
live bytes over the step, divided by the number of logits. The paths, each written after the
framework's own code:
- `torchtitan`: `F.cross_entropy(pred.flatten(0, 1).float(), labels)`, `del pred` before the
  backward (torchtitan train.py, `loss_fn` and the training step, 2024-12): ATen's
  log_softmax and nll_loss.
- `torchtitan-loss-parallel`: the same under `loss_parallel()` on vocabulary-sharded logits
  (torchtitan applies it with TP: the output layer is ColwiseParallel with Shard(-1) outputs,
  parallelize_llama.py); PyTorch's DTensor handlers (torch/distributed/tensor/parallel/loss.py)
  materialize x - max and its exp in the forward, and zeros_like(x), exp(x), their sum and
  product in the backward. One rank of a gloo process group: the tensors are the same as on
  each of TP ranks, whose vocabulary shard this is.

On the CPU: the ATen operators and the tensors they allocate are the ones CUDA runs (one
kernel per operator, the same outputs); what differs on a GPU is the caching allocator's
rounding, which is immaterial at these sizes. The figures are bytes per logit, independent
of the sizes (`--tokens`, `--vocab` only check that).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PATHS = ("torchtitan", "torchtitan-loss-parallel")


def peak_bytes(step) -> int:
    """Peak live bytes allocated while `step()` runs (what existed before is not counted)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def measure(tokens: int = 4096, vocab: int = 8192, hidden: int = 64) -> dict[str, float]:
    """Peak bytes per logit of each path in PATHS (bf16 logits of `tokens` x `vocab`)."""
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
    out = {}

    h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()

    def plain():
        pred = F.linear(h, w)
        loss = F.cross_entropy(pred.float(), labels)
        del pred
        loss.backward()

    out["torchtitan"] = peak_bytes(plain) / (tokens * vocab)

    started = not dist.is_initialized()
    if started:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
        dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        hd = distribute_tensor(h0.clone(), mesh, [Replicate()]).requires_grad_()
        wd = distribute_tensor(w0.clone(), mesh, [Shard(0)]).requires_grad_()
        yd = distribute_tensor(labels, mesh, [Replicate()])

        def sharded():
            pred = F.linear(hd, wd)  # column-parallel: logits sharded on the vocabulary
            with loss_parallel():
                loss = F.cross_entropy(pred.float(), yd)
                del pred
                loss.backward()

        out["torchtitan-loss-parallel"] = peak_bytes(sharded) / (tokens * vocab)
    finally:
        if started:
            dist.destroy_process_group()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    import torch

    from model.memory import LOSS_PEAK_BYTES_PER_LOGIT
    got = measure(args.tokens, args.vocab)
    if args.json:
        print(json.dumps({"torch": torch.__version__, "bytes_per_logit": got}))
        return 0
    print(f"peak bytes per logit of the loss step (torch {torch.__version__}, CPU, "
          f"{args.tokens} tokens x {args.vocab} vocabulary)")
    for name, v in got.items():
        print(f"  {name:<26} measured {v:6.2f}   model/memory.py "
              f"{LOSS_PEAK_BYTES_PER_LOGIT[name]:5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
