"""The schedule graph's longest-path walks and its topological order, compiled by numba
(imported only by model.walk_jit, in a background thread, once a process has walked enough
graph nodes for it to pay).

The same arithmetic as the Python walks in model/schedule.py, in the same order: a node starts
at the latest end among its predecessors (0.0 if none; ties go to the first predecessor) and
ends its kind's duration later. Results are equal bit for bit (tests/test_schedule.py)."""

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def walk(order, kind, ptr, idx, d):
    """End time of every node and its latest predecessor (n: none), indexed by node; index n
    is the missing predecessor (end 0.0)."""
    n = order.shape[0]
    end = np.zeros(n + 1)
    arg = np.full(n + 1, n, dtype=np.int64)
    for r in range(n):
        i = order[r]
        st = 0.0
        a = n
        for q in range(ptr[i], ptr[i + 1]):
            u = idx[q]
            e = end[u]
            if a == n or e > st:
                st = e
                a = u
        end[i] = st + d[kind[i]]
        arg[i] = a
    return end, arg


@njit(cache=True, nogil=True)
def tail_starts_batch(order, kind, ptr, idx, tails, durs):
    """For each row of `durs`, the start of every stage's tail node (the latest end among its
    predecessors, 0.0 if none): shape (rows, len(tails))."""
    n = order.shape[0]
    rows = durs.shape[0]
    out = np.zeros((rows, tails.shape[0]))
    end = np.zeros(n + 1)
    for b in range(rows):
        for r in range(n):
            i = order[r]
            end[i] = _latest(end, ptr, idx, i) + durs[b, kind[i]]
        for s in range(tails.shape[0]):
            out[b, s] = _latest(end, ptr, idx, tails[s])
    return out


@njit(cache=True, nogil=True, inline="always")
def _latest(end, ptr, idx, i):
    """The latest end among node i's predecessors, 0.0 if none."""
    st = 0.0
    for q in range(ptr[i], ptr[i + 1]):
        e = end[idx[q]]
        if e > st:
            st = e
    return st


@njit(cache=True, nogil=True)
def topological(sptr, succ, indeg):
    """Kahn's order, as model.schedule.CompiledSchedule._topological computes it (a stack
    seeded with the sources in increasing order, successors pushed in their CSR order); fewer
    than n nodes out means a cycle."""
    n = indeg.shape[0]
    left = indeg.copy()
    stack = np.empty(n, dtype=np.int64)
    top = 0
    for u in range(n):
        if left[u] == 0:
            stack[top] = u
            top += 1
    out = np.empty(n, dtype=np.int64)
    count = 0
    while top > 0:
        top -= 1
        u = stack[top]
        out[count] = u
        count += 1
        for q in range(sptr[u], sptr[u + 1]):
            w = succ[q]
            left[w] -= 1
            if left[w] == 0:
                stack[top] = w
                top += 1
    return out[:count]


@njit(cache=True, nogil=True)
def trace(arg, last):
    """The nodes of the path that ends in `last`, first to last, following `arg` (the latest
    predecessor of each node; len(arg) - 1 marks none)."""
    n = arg.shape[0] - 1
    count = 0
    u = last
    while u != n:
        count += 1
        u = arg[u]
    out = np.empty(count, dtype=np.int64)
    u = last
    for q in range(count - 1, -1, -1):
        out[q] = u
        u = arg[u]
    return out
