"""A constructed start for the node permutation: data-parallel rings and pipelines of fast links.

What the cost model charges for a placement's links (model/communication.py): the nodes of one
node-stage form its data-parallel ring in slot order, and the ring is only as fast as its
slowest consecutive pair, cyclic (`dp_ring`); a pipeline hop between consecutive node-stages of a
replica sends activations one way and their gradients back. On a measured matrix those
bottlenecks are most of what a placement changes: on bench/anneal_vs_paper.py's 512 random
nodes the gradient all-reduce of stage 0, limited by one slow link of its ring, is a third of the
iteration. The annealer's moves rarely hit the one slot pair that matters among 512 nodes; a
construction that sees the bottlenecks gets there in milliseconds.

1. D > 1 (rings): A rings of D nodes, built one after another from the nodes left (each from the
   node with the fastest link among them, grown at whichever end has the fastest link), then
   improved by swaps of an end of the slowest ring link with any other slot, best swap first,
   lexicographically on (slowest ring's bottleneck, sum of ring bottlenecks). The rings are then
   ordered fastest first (stage 0 finishes its backward pass last, so its gradient sync is the
   most exposed) and each is rotated (a rotation keeps its links) to the rotation whose pipeline
   hops to the previous stage are fastest (a hop counts its slower direction).
2. D == 1 (one pipeline): a path of A nodes grown the same way by its fastest hops, then the
   same swaps on its slowest hop.

It is a heuristic start, scored by the cost model like any other plan: `anneal` takes the better
of it and the identity.
"""

from __future__ import annotations

import numpy as np

from model import work

from .problem import PlacementProblem


def constructed_perm(prob: PlacementProblem, *, max_steps: int | None = None,
                     deadline_s: float | None = None) -> list[int] | None:
    """The node in each (node-stage a, node-replica b) slot, b fastest; None for a single
    node, or when `deadline_s` (on the search clock, model.work) passes before the greedy
    sequences are built. Swaps stop after `max_steps` (default 4 per slot) or at the
    deadline."""
    blk, cluster = prob.block, prob.cluster
    n = blk.A * blk.D
    if n < 2 or cluster.num_nodes != n:
        return None
    bw = np.asarray(cluster.inter_gb_per_s, dtype=float)
    steps = 4 * n if max_steps is None else max_steps
    if blk.D > 1:
        rows = _greedy_rows(bw, blk.A, blk.D, deadline_s)
        if rows is None:
            return None
        rows = _climb(rows, bw, cyclic=True, max_steps=steps, deadline_s=deadline_s)
        return [int(x) for x in _align(rows, bw).ravel()]
    hop = np.minimum(bw, bw.T)  # a hop is as slow as its slower direction
    rows = _greedy_rows(hop, 1, n, deadline_s)
    if rows is None:
        return None
    rows = _climb(rows, hop, cyclic=False, max_steps=steps, deadline_s=deadline_s)
    return [int(x) for x in rows.ravel()]


def _greedy_rows(m: np.ndarray, g: int, length: int,
                 deadline_s: float | None = None) -> np.ndarray | None:
    """g sequences of `length` nodes, one after another from the nodes left: each starts at the
    node with the fastest link to another node left and grows at whichever end has the fastest
    link to a node left (into its head or out of its tail). None if `deadline_s` passes."""
    work.charge("construct_slot", g * length)
    left = np.ones(m.shape[0], dtype=bool)
    rows = np.empty((g, length), dtype=np.int64)
    masked = np.where(np.eye(m.shape[0], dtype=bool), -np.inf, m)
    for r in range(g):
        if deadline_s is not None and work.now() >= deadline_s:
            return None
        idx = np.flatnonzero(left)
        sub = masked[np.ix_(idx, idx)]
        seq = [int(idx[int(np.argmax(sub.max(axis=1)))]) if len(idx) > 1 else int(idx[0])]
        left[seq[0]] = False
        while len(seq) < length:
            cand = np.flatnonzero(left)
            out_tail = masked[seq[-1], cand]
            into_head = masked[cand, seq[0]]
            i, j = int(np.argmax(out_tail)), int(np.argmax(into_head))
            if out_tail[i] >= into_head[j]:
                node = int(cand[i])
                seq.append(node)
            else:
                node = int(cand[j])
                seq.insert(0, node)
            left[node] = False
        rows[r] = seq
    return rows


def _edges(row: np.ndarray, m: np.ndarray, cyclic: bool) -> np.ndarray:
    """Link values along one sequence: position p is the link from slot p to slot p + 1."""
    nxt = np.roll(row, -1) if cyclic else row[1:]
    return m[row[:len(nxt)], nxt]


def _excl_min(e: np.ndarray, length: int, cyclic: bool) -> np.ndarray:
    """For every slot p, the slowest link of the sequence that does not touch p."""
    E = len(e)
    touch = np.zeros((length, E), dtype=bool)
    p = np.arange(length)
    if cyclic:
        touch[p, (p - 1) % E] = True
        touch[p, p % E] = True
    else:
        touch[p[1:], p[1:] - 1] = True
        touch[p[:-1], p[:-1]] = True
    out = np.where(touch, np.inf, e[None, :]).min(axis=1) if E else np.full(length, np.inf)
    return out


def _climb(rows: np.ndarray, m: np.ndarray, *, cyclic: bool, max_steps: int,
           deadline_s: float | None) -> np.ndarray:
    """Swap an end of the slowest link with the slot that improves (min over sequences of their
    slowest link, sum of those) the most, until no swap of either end improves."""
    rows = rows.copy()
    g, L = rows.shape
    if L < 2:
        return rows
    edges = [_edges(rows[r], m, cyclic) for r in range(g)]
    mins = np.array([e.min() for e in edges])
    excl = np.array([_excl_min(edges[r], L, cyclic) for r in range(g)])
    for _ in range(max_steps):
        work.charge("construct_step")
        if deadline_s is not None and work.now() >= deadline_s:
            break
        r = int(np.argmin(mins))
        p = int(np.argmin(edges[r]))
        best = (mins.min(), mins.sum())
        move = None
        for s in {p, (p + 1) % L}:  # (a set of ints iterates in a fixed order)
            cand = _best_swap(rows, m, edges, mins, excl, r, s, cyclic, best)
            if cand is not None:
                best, move = cand[0], (s,) + cand[1]
        if move is None:
            break
        s, r2, q = move
        rows[r, s], rows[r2, q] = rows[r2, q], rows[r, s]
        for rr in dict.fromkeys((r, r2)):
            edges[rr] = _edges(rows[rr], m, cyclic)
            mins[rr] = edges[rr].min()
            excl[rr] = _excl_min(edges[rr], L, cyclic)
    return rows


def _with_node(m, base, prev, node, nxt, has_prev, has_next):
    """The slowest of `base` and the links into and out of `node` placed between `prev` and
    `nxt` (where it has them), elementwise over numpy-broadcast arguments."""
    out = np.where(has_prev, np.minimum(base, m[prev, node]), base)
    return np.where(has_next, np.minimum(out, m[node, nxt]), out)


def _best_swap(rows, m, edges, mins, excl, r, s, cyclic, best):
    """The swap of slot (r, s) with another slot that gives the best (global min, sum) above
    `best`, as ((min, sum), (r2, q)); None if no swap improves."""
    g, L = rows.shape
    x = rows[r, s]
    out = None
    prev_s, next_s = rows[r, (s - 1) % L], rows[r, (s + 1) % L]
    s_prev, s_next = cyclic or s > 0, cyclic or s < L - 1  # whether slot s has those links
    q = np.arange(L)
    q_prev = np.ones(L, dtype=bool) if cyclic else q > 0
    q_next = np.ones(L, dtype=bool) if cyclic else q < L - 1
    # within sequence r: partners next to s by recomputing the sequence, the others at once
    near = [p for p in ((s - 1) % L, (s + 1) % L) if p != s and (cyclic or abs(p - s) == 1)]
    others_min = np.delete(mins, r).min() if g > 1 else np.inf
    base_sum = mins.sum() - mins[r]
    for p in set(near):
        row = rows[r].copy()
        row[s], row[p] = row[p], row[s]
        mr = _edges(row, m, cyclic).min()
        key = (min(mr, others_min), base_sum + mr)
        if key > best:
            best, out = key, (r, int(p))
    far = np.array([p for p in range(L) if p != s and p not in near], dtype=np.int64)
    if len(far):
        e = edges[r].copy()
        E = len(e)
        if s_prev:
            e[(s - 1) % E] = np.inf
        if s_next:
            e[s % E] = np.inf
        row = rows[r]
        mr = _excl_min(e, L, cyclic)[far]  # links touching neither s nor q
        mr = _with_node(m, mr, prev_s, row[far], next_s, s_prev, s_next)  # y at s
        mr = _with_node(m, mr, row[(far - 1) % L], x, row[(far + 1) % L],
                        q_prev[far], q_next[far])  # x at q
        gm = np.minimum(mr, others_min)
        i = int(np.lexsort((base_sum + mr, gm))[-1])
        key = (float(gm[i]), float(base_sum + mr[i]))
        if key > best:
            best, out = key, (r, int(far[i]))
    if g == 1:
        return None if out is None else (best, out)
    # across sequences: slot (r, s) takes y = rows[r2, q], slot (r2, q) takes x
    new_r = _with_node(m, np.full(rows.shape, excl[r, s]), prev_s, rows, next_s, s_prev, s_next)
    new_r2 = _with_node(m, excl, np.roll(rows, 1, axis=1), x, np.roll(rows, -1, axis=1),
                        q_prev[None, :], q_next[None, :])
    # the slowest of the sequences other than r and r2
    order = np.argsort(mins)
    others = np.empty(g)
    for r2 in range(g):
        rest = [i for i in order[:3] if i != r and i != r2]
        others[r2] = mins[rest[0]] if rest else np.inf
    gmin = np.minimum(np.minimum(new_r, new_r2), others[:, None])
    gsum = mins.sum() - mins[r] - mins[:, None] + new_r + new_r2
    gmin[r, :] = -np.inf  # same-sequence swaps were handled above
    # lexicographic best: highest min, then highest sum
    flat = np.lexsort((gsum.ravel(), gmin.ravel()))[-1]
    r2, q2 = divmod(int(flat), L)
    key = (float(gmin[r2, q2]), float(gsum[r2, q2]))
    if key > best:
        return key, (r2, q2)
    return None if out is None else (best, out)


def _align(rows: np.ndarray, bw: np.ndarray) -> np.ndarray:
    """Rings fastest first; each ring rotated so that its hops to the previous stage's ring are
    fastest ((slowest hop, sum of hops), a hop as slow as its slower direction)."""
    g, D = rows.shape
    speed = np.array([_edges(rows[r], bw, True).min() for r in range(g)])
    rows = rows[np.argsort(-speed, kind="stable")]
    hop = np.minimum(bw, bw.T)
    rot = (np.arange(D)[:, None] + np.arange(D)[None, :]) % D  # rot[k, b] = (b + k) % D
    for a in range(1, g):
        h = hop[rows[a - 1][None, :], rows[a][rot]]  # (rotation, column)
        k = int(np.lexsort((h.sum(axis=1), h.min(axis=1)))[-1])
        rows[a] = rows[a][rot[k]]
    return rows
