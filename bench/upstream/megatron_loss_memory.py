"""Peak memory of Megatron-LM's language-model loss per logit, measured on the CPU with its own
vocabulary-parallel cross-entropy (run by bench/activation_memory.py from the root of a
Megatron-LM checkout; imports nothing of this project).

The step as GPTModel runs it (megatron/core/models/common/language_module/language_module.py,
`compute_language_model_loss`): bf16 logits [s, b, V/t] from the output layer's matmul, held by
the caller while the loss runs, dropped before the backward; the loss summed and
backpropagated. Two paths: "unfused", megatron.core.tensor_parallel.cross_entropy.
vocab_parallel_cross_entropy (Megatron-LM's default, without --cross-entropy-loss-fusion), and
"fused", megatron.core.fusions.fused_cross_entropy.fused_vocab_parallel_cross_entropy (with it
and cross_entropy_fusion_impl "native", the default implementation; its helpers go through
megatron.core.jit's jit_fuser, torch.compile). torch.profiler's allocator events
(profile_memory=True) over the step, written in time order, with an allocation of MARK_BYTES
at the forward's end; bench/activation_memory.py reads off them what is live there (kept for
the backward) and the peak, per logit.

Stand-ins, so that the module loads without the rest of megatron.core (which needs triton and
a GPU): `megatron.core.parallel_state` and `megatron.core.utils` give the five functions the
module and its `.utils` import (the group is a one-rank gloo group: its vocabulary shard is
what each of t ranks holds); the packages `megatron`, `megatron.core` and
`megatron.core.tensor_parallel` point at the checkout's directories, so that cross_entropy.py
and tensor_parallel/utils.py are the checkout's own.

usage: python megatron_loss_memory.py RESULTS.json MARK_BYTES [TOKENS VOCAB]
"""

import importlib
import json
import os
import sys
import types



def _load_cross_entropy():
    import torch
    import torch.distributed as dist

    root = os.getcwd()
    for name in ("megatron", "megatron.core", "megatron.core.tensor_parallel",
                 "megatron.core.fusions"):
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = pkg
    ps = types.ModuleType("megatron.core.parallel_state")
    ps.get_tensor_model_parallel_group = lambda *a, **k: dist.group.WORLD
    ut = types.ModuleType("megatron.core.utils")
    ut.get_pg_rank = lambda group=None: dist.get_rank(group)
    ut.get_pg_size = lambda group=None: dist.get_world_size(group)
    ut.divide = lambda a, b: a // b
    ut.get_tensor_model_parallel_group_if_none = lambda group=None, **k: group or dist.group.WORLD
    ut.is_torch_min_version = lambda version, check_equality=True: bool(torch.__version__)
    sys.modules.update({"megatron.core.parallel_state": ps, "megatron.core.utils": ut})
    return (importlib.import_module("megatron.core.tensor_parallel.cross_entropy"),
            importlib.import_module("megatron.core.fusions.fused_cross_entropy"))


def main(out_path, mark_bytes, tokens=4096, vocab=8192, hidden=64):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("gloo", rank=0, world_size=1)
    unfused, fused = _load_cross_entropy()
    gen = torch.Generator().manual_seed(0)
    s, b = tokens, 1
    h = torch.randn(s, b, hidden, generator=gen).to(torch.bfloat16).requires_grad_()
    w = torch.randn(vocab, hidden, generator=gen).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, vocab, (s, b), generator=gen)
    losses = {"unfused": lambda x: unfused.vocab_parallel_cross_entropy(x, labels),
              "fused": lambda x: fused.fused_vocab_parallel_cross_entropy(
                  x, labels, dist.group.WORLD)}
    result = {}
    for name, loss_fn in losses.items():
        def postprocess(loss_fn=loss_fn):
            logits = F.linear(h, w)  # the output layer: [s, b, V/t] in bf16
            return loss_fn(logits)  # the logits are dropped on return

        def step():
            loss = postprocess()
            torch.empty(mark_bytes, dtype=torch.uint8)  # the forward's end, as an event
            loss.sum().backward()

        step()  # warm-up (and torch.compile of the fused path's helpers)
        h.grad = w.grad = None
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        events = sorted((e for e in prof.profiler.kineto_results.events()
                         if e.name() == "[memory]"), key=lambda e: e.start_ns())
        h.grad = w.grad = None
        result[name] = [e.nbytes() for e in events]
    dist.destroy_process_group()
    json.dump({"torch": torch.__version__, "tokens": s * b, "vocab": vocab,
               "allocations": result}, open(out_path, "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *map(int, sys.argv[2:5])))
