"""When to walk schedule graphs with compiled code (model/_walk_kernels.py, numba).

A Python walk costs about 0.3-0.7 us per graph node on the CI machine (7.4 ms for the 24k
nodes of GPT-3 175B at PP=16 with 192 micro-batches; a uniform 64-node solve walks such graphs
about 400 times); the compiled walk 0.44 ms. Loading numba and the compiled kernels costs
0.75-0.9 s (1.5-2.7 s more the first time, when they are compiled into numba's cache), so a process
switches only once it has walked JIT_AFTER_NODES nodes in Python, and loads them in a
background thread meanwhile (no pause in a search that keeps a time limit). Without numba, or
with PIPETTE_JIT=0 in the environment, the Python walks serve throughout; results are equal bit
for bit either way."""

from __future__ import annotations

import os
import threading

# node visits in Python after which the compiled walks are loaded (about 0.25 s of Python
# walks; the 64-node GPT-3 175B solve reaches it after its screening, 6 s in)
JIT_AFTER_NODES = 500_000

_state: dict = {"visits": 0, "thread": None, "kernels": None, "error": None}


def enabled() -> bool:
    return os.environ.get("PIPETTE_JIT", "1") != "0"


def kernels():
    """The compiled kernels module once loaded, else None."""
    return _state["kernels"]


def note_python_walk(nodes: int) -> None:
    """Count a Python walk; start loading the kernels once enough nodes have been walked."""
    _state["visits"] += nodes
    if _state["visits"] >= JIT_AFTER_NODES and _state["thread"] is None and enabled():
        load(background=True)


def load(background: bool = False) -> bool:
    """Load the kernels (compiling them if numba's cache lacks them); True when loaded."""
    if _state["kernels"] is not None:
        return True
    if _state["thread"] is None:
        t = threading.Thread(target=_load, name="pipette-jit", daemon=True)
        _state["thread"] = t
        t.start()
    if not background:
        _state["thread"].join()
    return _state["kernels"] is not None


def settle() -> None:
    """Wait for a load in progress (before forking workers: a child must not inherit a
    half-done import)."""
    t = _state["thread"]
    if t is not None and t.is_alive():
        t.join()


def _load() -> None:
    try:
        import numpy as np

        from model import _walk_kernels as k

        # compile (or load from the cache) both signatures before any caller may use them
        order = np.zeros(1, dtype=np.int64)
        kind = np.zeros(1, dtype=np.int64)
        ptr = np.zeros(2, dtype=np.int64)
        idx = np.zeros(0, dtype=np.int64)
        k.walk(order, kind, ptr, idx, np.zeros(1))
        k.tail_starts_batch(order, kind, ptr, idx, order, np.zeros((1, 1)))
        k.trace(np.zeros(2, dtype=np.int64) + 1, 0)
        k.topological(ptr, idx, np.zeros(1, dtype=np.int64))
        _state["kernels"] = k
    except Exception as e:  # numba missing or broken: the Python walks serve
        _state["error"] = f"{type(e).__name__}: {e}"
