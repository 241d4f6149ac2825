"""Iterated local search for one pipeline, on a surrogate built from critical paths.

Where a block is one pipeline (D = 1), on nodes that differ only in their links, a placement
changes nothing but the transfer times of the pipeline hops between nodes: each stage's compute
and tail, and a hop inside a node, cost the same on every node. (With several stages per node
the hops between them stay inside; with interleaving the last stage's hop back to the first
closes the path into a cycle; with tied embeddings the first and last stage's tails carry
their all-reduce over the link between their two nodes, a term of its own like a hop's.)
The iteration time is the longest path of
the schedule graph (model/schedule.py), and a path's length is linear in the durations: if a
path P crosses hop h forward wf_P[h] times and backward wb_P[h] times, then for every
permutation p of nodes over slots

    T(p) >= c_P + sum_h wf_P[h] * L[p(a_h), p(b_h)] + wb_P[h] * L[p(b_h), p(a_h)]

over the hops between nodes, with a_h and b_h the slots of hop h's two stages, L[x, y] the
estimator's transfer time from node x to node y and c_P the rest of P's length; equality
holds for the permutation P was traced on. The maximum over the paths traced so far is a lower
bound of T that is exact where it was traced: the cutting-plane model of Kelley (1960), the
same cuts the placement MILP uses (solvers/milp.py), here scored for a whole neighbourhood at
once with numpy (measured on 32 nodes with one cut: 1.9 ms for the 5,113 neighbours, 0.4 us a
candidate, against 0.25 ms for one estimator evaluation). On bench/exact_scaling.py's 32-node
random matrix a single path is critical for every placement and T is 687.498 ms plus the sum
of hop round trips: an open travelling-salesman path.

The search: best-improvement descent over swaps, segment reversals (2-opt) and segment moves
(one to three nodes, either way round: or-opt), each candidate the surrogate ranks first scored
by the estimator before it is taken, its critical path added as a cut when the surrogate was
low; at a local optimum, a double-bridge kick (Martin, Otto and Felten 1991) and descent again,
keeping the better (Lourenco, Martin and Stuetzle's iterated local search). Every plan it
returns is scored by the estimator; the surrogate only ranks.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from model import work

from .problem import PlacementProblem

# neighbourhoods are built whole: at most this many slots (32 slots: 5,113 candidates, 64:
# 22,457, built once per process in 0.03 and 0.13 s)
MAX_SLOTS = 64
# segment lengths of the or-opt moves
OR_OPT_MAX = 3
# surrogate candidates scored by the estimator per descent step before the step gives up
VERIFY_PER_STEP = 8
# cuts kept (the oldest are dropped first)
MAX_CUTS = 256


class PathSurrogate:
    """The cuts of one (problem, layer split); `None` from `build` where the block is not one
    pipeline of interchangeable nodes."""

    def __init__(self, prob: PlacementProblem, layers: tuple[int, ...]):
        self.prob, self.layers = prob, tuple(layers)
        ev = prob.evaluator(self.layers)
        pp = prob.shape.pp
        # the slot (node) of each stage, read off the identity placement; hop h runs from
        # stage h to stage (h + 1) % pp (the last one only with interleaving)
        ident = prob.placement(list(range(prob.num_slots)))
        slot = [ident.node[st][0] for st in range(pp)]
        hops = [h for h in range(len(ev._idx_xf)) if slot[h] != slot[(h + 1) % pp]]
        # hops inside a node cost the same on every node: they stay in the cuts' constants
        self.xf = np.array([ev._idx_xf[h] for h in hops], dtype=np.int64)
        self.xb = np.array([ev._idx_xb[h] for h in hops], dtype=np.int64)
        self.slot_a = np.array([slot[h] for h in hops], dtype=np.int64)
        self.slot_b = np.array([slot[(h + 1) % pp] for h in hops], dtype=np.int64)
        # L[x, y]: the cost model's transfer from node x to node y (the MILP's hop matrix)
        self.table_ms = ev.costs.hop_matrix_ms()
        # tied embeddings: the first and last stage's tails carry the all-reduce between their
        # nodes (Evaluator.tied_ms), a pair of its own where the two stages' nodes differ
        self.tied_ms = (ev.costs.tied_matrix_ms() if ev.costs.tied_grad_bytes
                        and slot[0] != slot[pp - 1] else None)
        self.tied_tails = np.array([ev.kinds.tail(0), ev.kinds.tail(pp - 1)], dtype=np.int64)
        self.slot_first, self.slot_last = slot[0], slot[pp - 1]
        self.wt: list[float] = []
        self.const: list[float] = []
        self.wf: list[np.ndarray] = []
        self.wb: list[np.ndarray] = []
        self._stack = None

    @staticmethod
    def applies(prob: PlacementProblem) -> bool:
        blk, sh, c = prob.block, prob.shape, prob.cluster
        return (blk.D == 1 and sh.cp == 1 and sh.ep == 1
                and 2 < blk.A <= MAX_SLOTS and c.num_nodes == blk.A and c.homogeneous
                and not c.gpu_specific_links
                and len({nd.intra_gb_per_s for nd in c.nodes}) == 1)

    @classmethod
    def build(cls, prob: PlacementProblem, layers, perm) -> PathSurrogate | None:
        """The surrogate with perm's critical path as its first cut, or None where it does not
        apply or the first cut does not reproduce the estimator's time (a guard: the structure
        above is then not what the estimator computes)."""
        if not cls.applies(prob) or not prob.fits(tuple(layers)):
            return None
        s = cls(prob, layers)
        if len(s.xf) == 0:
            return None
        t = s.add_cut(perm)
        if abs(s.score(np.array([perm]))[0] - t) > 1e-9 * max(1.0, t):
            return None
        return s

    def add_cut(self, perm) -> float:
        """Trace perm's critical path, keep it as a cut; the estimator's time of perm."""
        ((length, counts, d),) = self.prob.critical_paths(perm, self.layers, replicas=(0,))
        work.charge("cut")
        wf, wb = counts[self.xf], counts[self.xb]
        wt = float(counts[self.tied_tails].sum()) if self.tied_ms is not None else 0.0
        tied = self.tied_ms[perm[self.slot_first], perm[self.slot_last]] if wt else 0.0
        self.const.append(length - float(wf @ d[self.xf]) - float(wb @ d[self.xb]) - wt * tied)
        self.wf.append(wf)
        self.wb.append(wb)
        self.wt.append(wt)
        if len(self.const) > MAX_CUTS:
            del self.const[0], self.wf[0], self.wb[0], self.wt[0]
        self._stack = None
        return length

    def score(self, perms: np.ndarray) -> np.ndarray:
        """The surrogate (max over cuts) of each row of perms, in ms."""
        if self._stack is None:
            self._stack = (np.array(self.const), np.stack(self.wf, 1), np.stack(self.wb, 1),
                           np.array(self.wt))
        c, wf, wb, wt = self._stack
        work.charge("surrogate_hop", perms.shape[0] * len(self.xf) * (1 + len(c) / 12))
        a, b = perms[:, self.slot_a], perms[:, self.slot_b]
        out = c + self.table_ms[a, b] @ wf + self.table_ms[b, a] @ wb
        if self.tied_ms is not None:
            out = out + np.outer(self.tied_ms[perms[:, self.slot_first],
                                              perms[:, self.slot_last]], wt)
        return out.max(axis=1)


@lru_cache(maxsize=8)
def neighbourhood(n: int) -> np.ndarray:
    """Rows of position indices: every swap, segment reversal and or-opt move on n slots
    (each distinct rearrangement once)."""
    base = list(range(n))
    out = {tuple(base)}
    for a in range(n):
        for b in range(a + 1, n):
            p = base[:]
            p[a], p[b] = p[b], p[a]
            out.add(tuple(p))
            p = base[:a] + base[a:b + 1][::-1] + base[b + 1:]
            out.add(tuple(p))
    for k in range(1, OR_OPT_MAX + 1):
        for a in range(n - k + 1):
            seg, rest = base[a:a + k], base[:a] + base[a + k:]
            for at in range(len(rest) + 1):
                for s in (seg, seg[::-1]) if k > 1 else (seg,):
                    out.add(tuple(rest[:at] + s + rest[at:]))
    out.discard(tuple(base))
    return np.array(sorted(out), dtype=np.int64)


def path_search(prob: PlacementProblem, layers, perm, *, deadline_s: float, seed: int = 0,
                max_kicks: int | None = None, move_layers: bool = True):
    """(best permutation, its split, its estimator time in ms), or None where the surrogate
    does not apply. Runs until `deadline_s` (the search clock, model.work) or `max_kicks`
    kicks. A kick is a double bridge on the permutation or, with `move_layers` and half the
    time, one layer moved between two stages (each split has its own cuts: the constants
    hold the stages' compute)."""
    sur = PathSurrogate.build(prob, layers, perm)
    if sur is None:
        return None
    surs = {tuple(layers): sur}
    rng = np.random.default_rng(seed)
    nb = neighbourhood(len(perm))
    lay = tuple(layers)
    cur = np.array(perm, dtype=np.int64)
    cur_ms = prob.cost(list(cur), lay)
    best, best_lay, best_ms = cur.copy(), lay, cur_ms
    kicks = 0
    while work.now() < deadline_s:
        cur, cur_ms = _descend(prob, surs[lay], nb, cur, cur_ms, lay, deadline_s)
        if cur_ms < best_ms - 1e-12:
            best, best_lay, best_ms = cur.copy(), lay, cur_ms
        elif cur_ms > best_ms + 1e-12:  # keep the better local optimum
            cur, lay, cur_ms = best.copy(), best_lay, best_ms
        split_kicks = move_layers and prob.can_move_split()
        if (max_kicks is not None and kicks >= max_kicks) or (len(cur) < 4 and not split_kicks):
            break  # (below 4 slots the neighbourhood holds every permutation)
        kicks += 1
        new_lay = _layer_kick(rng, prob, lay) if split_kicks and (
            len(cur) < 4 or rng.random() < 0.5) else None
        if new_lay is not None and new_lay not in surs:
            got = PathSurrogate.build(prob, new_lay, list(cur))
            if got is None:
                new_lay = None
            else:
                surs[new_lay] = got
        if new_lay is not None:
            lay = new_lay
        elif len(cur) >= 4:
            cur = _double_bridge(rng, cur)
        cur_ms = prob.cost(list(cur), lay)
    return [int(x) for x in best], best_lay, best_ms


def _layer_kick(rng, prob: PlacementProblem, lay: tuple[int, ...]):
    """One layer moved from a random stage with more than one to another (where the framework
    has its own splits: another of them); None where the split that gives does not fit."""
    if not prob.split_free:
        new = prob.random_split_move(rng, lay)
        return new if new is not None and prob.fits(new) else None
    src = [i for i, x in enumerate(lay) if x > 1]
    if not src:
        return None
    a = int(rng.choice(src))
    b = int(rng.integers(len(lay) - 1))
    b += b >= a
    new = list(lay)
    new[a] -= 1
    new[b] += 1
    new = tuple(new)
    return new if prob.fits(new) else None


def _descend(prob, sur, nb, cur, cur_ms, lay, deadline_s):
    """Best-improvement descent: rank the neighbourhood by the surrogate, score the first few
    by the estimator; stop where none of the surrogate's candidates improves."""
    while work.now() < deadline_s:
        cands = cur[nb]
        s = sur.score(cands)
        order = np.argsort(s, kind="stable")
        moved = False
        for i in order[:VERIFY_PER_STEP]:
            if s[i] >= cur_ms - 1e-9 or work.now() >= deadline_s:
                break
            cand = list(cands[i])
            t = prob.cost(cand, lay)
            if t < cur_ms - 1e-9:
                cur, cur_ms, moved = cands[i], t, True
                break
            if math.isfinite(t):
                sur.add_cut(cand)  # the surrogate was low there: its path joins the cuts
        if not moved and s[order[0]] >= cur_ms - 1e-9:
            break  # no neighbour is better even on the surrogate: a local optimum
        # else: moved, or the cuts grew where the surrogate was low; rank again
    return cur, cur_ms


def _double_bridge(rng, perm: np.ndarray) -> np.ndarray:
    """Cut the path into four pieces A B C D and join them A C B D."""
    n = len(perm)
    i, j, k = sorted(int(x) for x in rng.choice(np.arange(1, n), 3, replace=False))
    return np.concatenate([perm[:i], perm[j:k], perm[i:j], perm[k:]])
