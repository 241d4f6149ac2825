"""Intra-node topology as the cost model sees it: the best ring through a set of GPUs, and the
choice of tensor-parallel groups on a node whose links are uneven (DGX-1, PCIe servers).

Topology presets (files in data/topologies/) are read by `formats/topologies.py`.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np

from .errors import SpecError

EXHAUSTIVE_MAX_GPUS = 8


def best_ring_gb_per_s(matrix_gb_per_s: np.ndarray, gpus: tuple[int, ...]) -> float:
    """Bandwidth of the best ring through `gpus` on a GPU-by-GPU matrix: the ring's slowest
    link, maximized over the orders of the GPUs (NCCL searches rings the same way)."""
    m = np.ascontiguousarray(matrix_gb_per_s, dtype=float)
    return _best_ring(m.tobytes(), m.shape[0], tuple(gpus))


@lru_cache(maxsize=4096)
def _best_ring(mat_bytes: bytes, n: int, gpus: tuple[int, ...]) -> float:
    mat = np.frombuffer(mat_bytes).reshape(n, n)
    first, rest = gpus[0], gpus[1:]
    best = 0.0
    for perm in itertools.permutations(rest):
        ring = (first,) + perm
        bw = min(mat[ring[i], ring[(i + 1) % len(ring)]] for i in range(len(ring)))
        best = max(best, bw)
    return float(best)


# ---------------------------------------------------------------------------------------------
# Tensor-parallel groups


def best_tp_groups(node, tp: int) -> list[tuple[int, ...]]:
    """Partition the GPUs of `node` (a model.cluster.NodeSpec) into groups of `tp` maximizing
    the minimum over groups of `node.ring_gb_per_s(group)` (ties: larger sum, then the
    lexicographically first partition, so a uniform node gets contiguous groups 0..tp-1,
    tp..2tp-1, ...).

    Exhaustive for nodes of up to 8 GPUs (at most 105 partitions); above that, greedy: the
    lowest free GPU takes the best tp-1 companions among the free ones.
    """
    n = node.num_gpus
    if not isinstance(tp, int) or tp < 1 or n % tp:
        raise SpecError(f"tensor-parallel degree {tp} must divide the node's {n} GPUs",
                        field="tp")
    if tp == 1:
        return [(g,) for g in range(n)]
    if tp == n or node.intra_matrix_gb_per_s is None:
        return [tuple(range(k, k + tp)) for k in range(0, n, tp)]
    if n <= EXHAUSTIVE_MAX_GPUS:
        best: tuple[float, float] | None = None
        best_part: list[tuple[int, ...]] = []
        for part in _partitions(tuple(range(n)), tp):
            rings = [node.ring_gb_per_s(g) for g in part]
            key = (min(rings), sum(rings))
            if best is None or key > best:
                best, best_part = key, part
        return best_part
    free = list(range(n))
    groups = []
    while free:
        first, rest = free[0], free[1:]
        comp = max(itertools.combinations(rest, tp - 1),
                   key=lambda c: node.ring_gb_per_s((first,) + c))
        g = (first,) + comp
        groups.append(g)
        free = [x for x in free if x not in g]
    return groups


def _partitions(gpus: tuple[int, ...], tp: int):
    """All partitions of `gpus` into groups of size tp, each group sorted, in lexicographic
    order (the first group always holds the lowest GPU)."""
    if not gpus:
        yield []
        return
    first, rest = gpus[0], gpus[1:]
    for comp in itertools.combinations(rest, tp - 1):
        group = (first,) + comp
        remaining = tuple(x for x in rest if x not in comp)
        for tail in _partitions(remaining, tp):
            yield [group] + tail
