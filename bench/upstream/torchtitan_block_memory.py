"""Activation memory of torchtitan's own Llama block, eager and under torch.compile, measured
on the CPU (run by bench/activation_memory.py from the root of a torchtitan checkout; imports
nothing of this project).

For each case: torchtitan's TransformerBlock (torchtitan/models/llama/model.py) wrapped by
its own activation checkpointing (parallelisms/parallelize_llama.py,
`_apply_ac_to_transformer_block`: "full", or "selective" with selective_ac_option "op"), and
compiled with torch.compile(fullgraph=True) where asked (its `apply_compile`). One forward and
backward to warm up (and compile), then a second one under torch.profiler's allocator events
(profile_memory=True), written in time order from the block's input on, with an allocation of
`mark_bytes` at the forward's end; bench/activation_memory.py reads off them what is live
there (what the block keeps for its backward, its output included) and the peak.

CPU stand-ins, each so that the CPU runs what CUDA would: the CPU flash-attention operator
(aten._scaled_dot_product_flash_attention_for_cpu) joins torchtitan's save list next to the
CUDA one; `triton` (imported at module level by torchtitan/models/norms.py for its fused
RMSNorm, which the default "rmsnorm" does not use) is an import-only stand-in.

usage: python torchtitan_block_memory.py CASES.json RESULTS.json
CASES: {"dim", "n_heads", "n_kv_heads", "ffn_dim_multiplier"?, "multiple_of", "seq", "batch",
"mark_bytes", "cases": [[ac_mode, compiled], ...]}
"""

import json
import os
import sys
import types


def _import_with_triton_stand_in(name):
    """Import module `name` with an import-only `triton` in place (removed again afterwards,
    so that torch does not take it for the real one): decorators that return the function,
    the names norms.py reads at definition time."""
    import importlib

    def identity(*a, **k):
        return a[0] if len(a) == 1 and callable(a[0]) and not k else identity

    tl = types.ModuleType("triton.language")
    tl.constexpr = int
    triton = types.ModuleType("triton")
    triton.jit = triton.autotune = triton.heuristics = identity
    triton.Config = lambda *a, **k: None
    triton.language = tl
    saved = {k: sys.modules.get(k) for k in ("triton", "triton.language")}
    sys.modules.update({"triton": triton, "triton.language": tl})
    try:
        return importlib.import_module(name)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def main(cases_path, out_path):
    sys.path.insert(0, os.getcwd())  # the torchtitan checkout
    import time

    import torch
    import torch._dynamo  # noqa: F401  (imported before the stand-in, which it must not see)
    import torch.distributed.tensor.parallel  # noqa: F401
    from torch.profiler import ProfilerActivity, profile

    llama = _import_with_triton_stand_in("torchtitan.models.llama.model")
    par = _import_with_triton_stand_in("torchtitan.parallelisms.parallelize_llama")
    ModelArgs, TransformerBlock = llama.ModelArgs, llama.TransformerBlock

    par._save_list.add(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
    spec = json.load(open(cases_path))
    args = ModelArgs(dim=spec["dim"], n_layers=1, n_heads=spec["n_heads"],
                     n_kv_heads=spec["n_kv_heads"], multiple_of=spec["multiple_of"],
                     ffn_dim_multiplier=spec.get("ffn_dim_multiplier"), vocab_size=256,
                     max_seq_len=spec["seq"], norm_type="rmsnorm")
    freqs = llama.precompute_freqs_cis(args.dim // args.n_heads, spec["seq"])
    results = []
    for mode, compiled in spec["cases"]:
        torch.manual_seed(0)
        block = TransformerBlock(0, args)
        block.init_weights()
        block = block.to(torch.bfloat16)
        ffn = block.feed_forward.w1.out_features
        cfg = types.SimpleNamespace(mode=mode, selective_ac_option="op")
        block = par._apply_ac_to_transformer_block(block, cfg)
        if compiled:
            block = torch.compile(block, fullgraph=True)
        x = torch.randn(spec["batch"], spec["seq"], args.dim, dtype=torch.bfloat16,
                        requires_grad=True)
        grad = torch.randn_like(x)

        def step(block=block, x=x, grad=grad):
            out = block(x, freqs)
            torch.empty(spec["mark_bytes"], dtype=torch.uint8)  # the forward's end
            out.backward(grad)

        started = time.perf_counter()
        step()  # warm-up (and compile)
        warm_s = time.perf_counter() - started
        x.grad = None
        for p in block.parameters():
            p.grad = None
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        events = sorted((e for e in prof.profiler.kineto_results.events()
                         if e.name() == "[memory]"), key=lambda e: e.start_ns())
        results.append({"mode": mode, "compiled": bool(compiled),
                        "allocations": [e.nbytes() for e in events],
                        "tokens": spec["batch"] * spec["seq"], "ffn": ffn,
                        "warmup_s": round(warm_s, 1)})
    json.dump({"torch": torch.__version__, "results": results}, open(out_path, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
