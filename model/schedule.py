"""Pipeline schedules as dependency graphs, and their longest (critical) path.

A schedule fixes, on every stage, the order in which it runs the forward (F) and backward (B)
of each micro-batch and model chunk. The graph has one node per F/B operation, one node per
pipeline transfer, and one "tail" node per stage (its gradient reduction and optimizer step).

Edges:
- consecutive operations of one stage (a GPU runs one operation at a time);
- F of virtual stage j -> transfer -> F of virtual stage j+1 (same micro-batch);
  B of virtual stage j+1 -> transfer -> B of virtual stage j; F and B of the last virtual stage;
- blocking point-to-point (Megatron-LM's default, Pipette Sec. III): a transfer starts only when
  the receiver has finished the operation before the one that consumes it (rendezvous), and the
  sender's next operation waits for the transfer to finish. This is how communication lands on
  the critical path in every 1F1B cycle. Overlapped mode drops both edges.
- the last operation of each stage -> its tail node -> the end of the iteration.

Every operation of one kind has the same duration for every micro-batch, so a duration vector
indexes "kinds": F and B per virtual stage, each transfer direction per hop, and the tail per
stage. Any path's length is then `counts @ durations`: a linear function of the kinds' durations,
which is what the MILP uses (see solvers/milp.py).

`CompiledSchedule.longest_path` is the hot path (a single pass in topological order); tests check
it equals `networkx.dag_longest_path_length` on `to_networkx()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from model import walk_jit, work


def interleaved_table(m: int, v: int, n: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each virtual micro-batch of the interleaved schedule, for groups
    of n micro-batches run chunk by chunk (Megatron-LM schedules.py get_schedule_table; n is
    --microbatch-group-size-per-virtual-pipeline-stage, by default PP): every group runs its
    micro-batches through chunk 0, then chunk 1, ...; the last group takes whatever is left
    (m % n of them, or n). PyTorch's ScheduleInterleaved1F1B (torchtitan) orders its rounds of
    m // max(1, m // PP) micro-batches the same way."""
    table = []
    for lo in range(0, m, n):
        hi = m if lo + n >= m else lo + n
        table += [(i, c) for c in range(v) for i in range(lo, hi)]
    return table


def interleaved_warmup(p: int, m: int, v: int, s: int, n: int) -> int:
    """Warm-up forwards of stage s in the interleaved schedule: 2 per stage after it, plus
    (v - 1) groups of n (Megatron-LM get_pp_rank_microbatches; PyTorch _get_warmup_ops), at
    most every virtual micro-batch."""
    return min((p - s - 1) * 2 + (v - 1) * n, m * v)


def stage_order(schedule: str, p: int, m: int, v: int, s: int,
                group: int = 0) -> list[tuple[str, int, int]]:
    """Operations of stage s in execution order: (kind 'F'/'B', micro-batch, chunk).

    - gpipe: all forwards, then all backwards (Huang et al. 2019).
    - 1f1b: Megatron-LM's non-interleaved schedule: min(p - s - 1, m) warm-up forwards, then
      one forward / one backward, then the remaining backwards (Narayanan et al. 2021 Fig. 4).
    - interleaved: Megatron-LM's interleaved schedule with v chunks (Narayanan et al. 2021
      Sec. 2.2.2) and groups of `group` micro-batches (0: p, Megatron's default):
      `interleaved_warmup` forwards over m*v virtual micro-batches, virtual micro-batch k
      running `interleaved_table`'s k-th (micro-batch, chunk), chunks reversed for backwards
      (schedules.py get_model_chunk_id). With m a multiple of p and groups of p, virtual
      micro-batch k runs chunk (k // p) % v of micro-batch (k // (p v)) p + k % p.
    """
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule == "1f1b":
        w = min(p - s - 1, m)
        ops = [("F", i, 0) for i in range(w)]
        for i in range(m - w):
            ops += [("F", w + i, 0), ("B", i, 0)]
        ops += [("B", i, 0) for i in range(m - w, m)]
        return ops
    if schedule == "interleaved":
        total = m * v
        table = interleaved_table(m, v, group or p)

        def fwd(k):
            return ("F", *table[k])

        def bwd(k):
            return ("B", table[k][0], v - 1 - table[k][1])

        w = interleaved_warmup(p, m, v, s, group or p)
        ops = [fwd(k) for k in range(w)]
        for j in range(total - w):
            ops += [fwd(w + j), bwd(j)]
        ops += [bwd(k) for k in range(total - w, total)]
        return ops
    raise ValueError(schedule)


@dataclass(frozen=True)
class Kinds:
    """Index layout of the duration vector for p stages and V = p * v virtual stages."""

    p: int
    v: int

    @property
    def V(self) -> int:
        return self.p * self.v

    def F(self, j: int) -> int:  # forward of virtual stage j
        return j

    def B(self, j: int) -> int:
        return self.V + j

    def xf(self, h: int) -> int:  # transfer stage h -> stage (h+1) % p, activations
        return 2 * self.V + h

    def xb(self, h: int) -> int:  # transfer stage (h+1) % p -> stage h, gradients
        return 2 * self.V + self.p + h

    def tail(self, s: int) -> int:
        return 2 * self.V + 2 * self.p + s

    @property
    def size(self) -> int:
        return 2 * self.V + 3 * self.p


class CompiledSchedule:
    """The dependency graph of one pipeline replica, in topological order.

    Node ids: the operations stage by stage in execution order, then the transfers (for each
    micro-batch and virtual-stage boundary j, the activation's then the gradient's), then one
    tail per stage (`label`, `labels`). The topological order and the predecessors are kept
    as arrays (`_csr`: CSR form, each node's predecessors sorted and unique); `topo`, `preds`
    and the Python walk's plan are derived from them when first asked for."""

    # Built on first use (`_build`): memory estimates need only the per-stage orders, and the
    # solvers screen many shapes by memory whose graphs are never walked.
    _GRAPH = frozenset({"num_nodes", "kind_of", "tails", "_csr"})
    _DERIVED = {"topo": "_derive_topo", "preds": "_derive_preds", "labels": "_derive_labels",
                "_plan": "_derive_plan"}

    def __init__(self, schedule: str, p: int, m: int, v: int, blocking: bool, group: int = 0,
                 p2p: str = "megatron"):
        self.schedule, self.p, self.m, self.v, self.blocking = schedule, p, m, v, blocking
        # whose blocking 1F1B calls (P2P_STYLES): Megatron-LM's, DeepSpeed's (every send and
        # receive a call of its own) or PyTorch's (warm-up and cool-down sends asynchronous)
        self.p2p = p2p if blocking and (schedule == "1f1b" or (
            schedule == "gpipe" and p2p == "torch")) else "megatron"
        self.group = group or p  # interleaved: micro-batches per group (`stage_order`)
        self.kinds = Kinds(p, v)
        self.orders = [stage_order(schedule, p, m, v, s, group) for s in range(p)]

    def __getattr__(self, name):  # only called for attributes not set yet
        if name in CompiledSchedule._GRAPH and "_csr" not in self.__dict__:
            self._build()
            return self.__dict__[name]
        if name in CompiledSchedule._DERIVED:
            value = getattr(self, CompiledSchedule._DERIVED[name])()
            self.__dict__[name] = value
            return value
        raise AttributeError(name)

    def _steps(self, s: int, n_ops: int) -> np.ndarray:
        """Step index of each position of stage s: the units between two communication calls.
        Megatron-LM communicates after every operation, except in the steady state of the
        interleaved schedule, where one batched exchange follows each (forward, backward)
        pair."""
        pos = np.arange(n_ops)
        if self.schedule != "interleaved":
            return pos
        p, total = self.p, self.m * self.v
        w = interleaved_warmup(p, self.m, self.v, s, self.group)
        end = w + 2 * (total - w)  # the steady state is positions w .. end - 1
        return np.where(pos < w, pos, np.where(pos < end, w + (pos - w) // 2,
                                               pos - end + w + (total - w)))

    def _build(self):
        """The graph as edge arrays (numpy; one Python step per stage, not per node)."""
        p, m, blocking = self.p, self.m, self.blocking
        K = self.kinds
        V = K.V
        # operations: per node its stage, backward flag, micro-batch and virtual stage
        stage_l, isb_l, mb_l, j_l = [], [], [], []
        first_l, last_l, prev_l, next_l = [], [], [], []  # step neighbours, global ids
        off = 0
        for s, ops in enumerate(self.orders):
            ks, mbs, cs = zip(*ops)
            n_ops = len(ops)
            isb_l.append(np.fromiter((k == "B" for k in ks), dtype=bool, count=n_ops))
            mb_l.append(np.array(mbs, dtype=np.int64))
            j_l.append(np.array(cs, dtype=np.int64) * p + s)
            stage_l.append(np.full(n_ops, s, dtype=np.int64))
            g = self._steps(s, n_ops)
            starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
            ends = np.r_[starts[1:] - 1, n_ops - 1]
            first_l.append(off + starts[g])
            last_l.append(off + ends[g])
            prev_l.append(np.where(g > 0, off + ends[g - 1], -1))
            nxt = np.minimum(g + 1, len(starts) - 1)
            next_l.append(np.where(g + 1 < len(starts), off + starts[nxt], -1))
            off += n_ops
        n_ops = off
        stage, isb, mb, j = (np.concatenate(a) for a in (stage_l, isb_l, mb_l, j_l))
        sfirst, slast, sprev, snext = (np.concatenate(a) for a in
                                       (first_l, last_l, prev_l, next_l))
        ids = np.arange(n_ops, dtype=np.int64)
        op = np.full((2, m, V), -1, dtype=np.int64)  # (backward?, micro-batch, virtual stage)
        op[isb.astype(np.int64), mb, j] = ids
        src, dst = [], []

        def edges(a, b):
            src.append(a)
            dst.append(b)

        same = stage[1:] == stage[:-1]  # consecutive operations of one stage
        edges(ids[:-1][same], ids[1:][same])
        # transfers, micro-batch major: the activation over boundary j, then the gradient
        mbg, jg = np.divmod(np.arange(m * (V - 1), dtype=np.int64), max(V - 1, 1))
        t_src = np.stack([op[0, mbg, jg], op[1, mbg, jg + 1]], axis=1).ravel()
        t_dst = np.stack([op[0, mbg, jg + 1], op[1, mbg, jg]], axis=1).ravel()
        t_kind = np.stack([K.xf(jg % p), K.xb(jg % p)], axis=1).ravel()  # hop j % p
        tid = n_ops + np.arange(t_src.size, dtype=np.int64)
        edges(slast[t_src], tid)  # sent after the sender's step
        edges(tid, t_dst)
        if blocking:
            # rendezvous: posted after the receiver's previous step, which waits for it
            post, wait = sprev[t_dst].copy(), sfirst[t_dst].copy()
            if self.schedule == "interleaved":
                self._early_posts(post, wait, op, mbg, jg, slast, snext)
            r = post >= 0
            edges(post[r], tid[r])
            w_ = wait >= 0
            edges(tid[w_], wait[w_])
            sent = np.full(n_ops, -1, dtype=np.int64)
            sent[t_src] = tid  # each operation sends at most one transfer
            nxt = snext[t_src]
            # PyTorch's 1F1B sends asynchronously between two operations of one kind (warm-up,
            # cool-down) and waits for the send only after the next operation
            late = np.zeros(tid.size, dtype=bool)
            if self.p2p == "torch" and self.schedule == "gpipe":
                late[:] = True  # every send waited at the end of its phase (_gpipe_sends)
            elif self.p2p == "torch":
                late[nxt >= 0] = isb[nxt[nxt >= 0]] == isb[t_src[nxt >= 0]]
            s_ = (nxt >= 0) & ~late  # the sender's next step waits for its send to finish
            edges(tid[s_], nxt[s_])
            # PyTorch waits for its last sends before the step ends (the stage's tail)
            to_tail = np.zeros(tid.size, dtype=bool)
            if self.p2p == "torch" and self.schedule == "gpipe":
                to_tail = self._gpipe_sends(edges, tid, t_src, t_dst, isb, stage)
            elif late.any():
                to_tail = self._async_sends(edges, tid, t_src, t_dst, nxt, late, sent, snext,
                                            sprev)
            if self.p2p == "torch":
                to_tail |= nxt < 0  # the stage's last operation's send
            if self.schedule == "interleaved":
                # a stage whose every forward is warm-up (few micro-batches) receives its first
                # gradient in a call of its own (recv_backward) after the last forward's send
                # call has returned
                total = self.m * self.v
                first = np.cumsum([0] + [len(o) for o in self.orders])  # each stage's first id
                for st in range(p):
                    if interleaved_warmup(p, self.m, self.v, st, self.group) < total:
                        continue
                    first_b = first[st] + total  # its first backward, after total forwards
                    last_f = first_b - 1
                    into = np.flatnonzero(t_dst == first_b)
                    if into.size and sent[last_f] >= 0:
                        edges(np.full(into.size, sent[last_f]), tid[into])
            if self.schedule == "1f1b":
                # Megatron-LM's non-interleaved warm-up and cool-down post a step's send and
                # the next step's receive as two calls, one after the other (schedules.py
                # forward_backward_pipelining_without_interleaving: send_forward, then
                # recv_forward; send_backward, then recv_backward), where the steady state
                # batches them (send_forward_recv_backward, send_backward_recv_forward): a
                # receive for a step of the kind of the one before it waits for that step's
                # send to finish. DeepSpeed's pipeline engine makes every send and receive a
                # call of its own (p2p.py dist.send / dist.recv; pipe/schedule.py
                # TrainSchedule): a step's send of the step before's output comes after its
                # receive only in a backward step right after a forward (RecvGrad, then
                # SendActivation), else first (SendGrad, then RecvActivation; or the send in a
                # step of its own where the slot between is idle) (p2p "deepspeed")
                prev = sprev[t_dst]
                w = prev >= 0
                w[w] &= sent[prev[w]] >= 0
                f_b = w.copy()  # a forward, then in the next slot a backward that receives
                f_b[w] &= ~isb[prev[w]] & isb[t_dst[w]]
                if self.p2p == "deepspeed":
                    slot = self._deepspeed_slots(stage, isb, mb)
                    f_b[w] &= slot[t_dst[w]] == slot[prev[w]] + 1
                s_r = w & ~f_b
                if self.p2p == "megatron":
                    s_r[w] &= isb[prev[w]] == isb[t_dst[w]]
                elif self.p2p == "deepspeed":
                    edges(tid[f_b], sent[prev[f_b]])
                if self.p2p != "torch":  # PyTorch posts a receive without waiting for a send
                    edges(sent[prev[s_r]], tid[s_r])
        mbs_ = np.arange(m)
        edges(op[0, mbs_, V - 1], op[1, mbs_, V - 1])  # F then B of the last virtual stage
        ends_ = np.cumsum([len(o) for o in self.orders]) - 1
        tails = n_ops + t_src.size + np.arange(p, dtype=np.int64)
        edges(ends_, tails)
        if blocking and to_tail.any():
            edges(tid[to_tail], tails[stage[t_src[to_tail]]])
        n = int(tails[-1]) + 1
        key = np.sort(np.concatenate(dst) * n + np.concatenate(src))
        key = key[np.r_[True, key[1:] != key[:-1]]]  # by receiver, then sender; unique
        d_, s_all = np.divmod(key, n)
        ptr = np.zeros(n + 1, dtype=np.int64)
        ptr[1:] = np.cumsum(np.bincount(d_, minlength=n))
        kind_of = np.concatenate([np.where(isb, K.B(j), K.F(j)), t_kind,
                                  K.tail(np.arange(p))]).astype(np.int64)
        self._op_arrays = (isb, mb, j, stage, t_src, t_dst)
        self.num_nodes = n
        self.kind_of = kind_of
        self.tails = tails.tolist()
        self._csr = (self._topological(n, d_, s_all), kind_of, ptr, s_all)

    def _async_sends(self, edges, tid, t_src, t_dst, nxt, late, sent, snext,
                     sprev) -> np.ndarray:
        """PyTorch's Schedule1F1B (torch.distributed.pipelining schedules.py) in its warm-up
        and cool-down: a send is started without waiting and waited for after the next
        operation (before the one after it, or before the stage's tail), and the receive for
        an operation is posted after that wait: the operation two before it's send must have
        finished. `late` marks those sends (per transfer); returns those waited for before
        the stage's tail (no operation two after)."""
        two = np.full(tid.size, -1, dtype=np.int64)
        two[late] = snext[nxt[late]]
        later = late & (two >= 0)
        edges(tid[later], two[later])
        is_late = late  # per transfer, in tid's order (tid[i] - tid[0] == i)
        prev = sprev[t_dst]
        prev2 = np.where(prev >= 0, sprev[np.maximum(prev, 0)], -1)
        ok = prev2 >= 0
        ok[ok] &= sent[prev2[ok]] >= 0
        ok[ok] &= is_late[sent[prev2[ok]] - tid[0]]
        edges(sent[prev2[ok]], tid[ok])
        return late & (two < 0)

    def _gpipe_sends(self, edges, tid, t_src, t_dst, isb, stage) -> np.ndarray:
        """PyTorch's ScheduleGPipe (torchtitan's GPipe): every send starts without waiting; the
        forwards' are all waited for before the stage's first backward (and its receive, posted
        after the waits), the backwards' before the step ends (the stage's tail): returned."""
        fwd = ~isb[t_src]
        first_b = np.full(self.p, -1, dtype=np.int64)  # each stage's first backward
        b_ops = np.flatnonzero(isb)
        first_b[stage[b_ops[::-1]]] = b_ops[::-1]
        f_send = fwd & (first_b[stage[t_src]] >= 0)
        edges(tid[f_send], first_b[stage[t_src[f_send]]])
        into_b = np.flatnonzero(isb[t_dst] & (t_dst == first_b[stage[t_dst]]))
        for i in into_b:  # the first backward's receive, after the forward sends' waits
            mine = f_send & (stage[t_src] == stage[t_dst[i]])
            edges(tid[mine], np.full(int(mine.sum()), tid[i]))
        return ~fwd

    def _deepspeed_slots(self, stage, isb, mb) -> np.ndarray:
        """Each operation's step in DeepSpeed's TrainSchedule (pipe/schedule.py
        _step_to_micro_batch: forwards in a stage's even slots and backwards in its odd ones,
        or the other way round on odd stages), inverted: forward of micro-batch i on stage s
        in step 2 (i + s // 2) + s % 2, its backward in 2 (i + p - 1 - s // 2) + 1 on even
        stages and 2 (i + p - (s + 1) // 2) on odd ones."""
        p = self.p
        even = stage % 2 == 0
        fwd = 2 * (mb + stage // 2) + stage % 2
        bwd = np.where(even, 2 * (mb + p - 1 - stage // 2) + 1, 2 * (mb + p - (stage + 1) // 2))
        return np.where(isb, bwd, fwd)

    def _early_posts(self, post, wait, op, mbg, jg, slast, snext) -> None:
        """Interleaved schedule: the receives across a chunk boundary (stage p-1 to stage 0
        forward, stage 0 to stage p-1 backward) are posted where Megatron-LM posts them: at
        virtual step k the leading stage receives what the ending stage produced at its step
        k - (p - 1) (schedules.py recv_tensor_from_previous_stage), and keeps it until its own
        turn; with groups of more than p micro-batches that turn comes later, so `post` and
        `wait` (per transfer, activation then gradient) move to that step's end and the next
        step's start. With groups of p they are the consuming step's neighbours, as for every
        other transfer."""
        p, v = self.p, self.v
        table = np.array(interleaved_table(self.m, v, self.group), dtype=np.int64)
        t_mb, t_c = table[:, 0], table[:, 1]
        pos = np.empty((self.m, v), dtype=np.int64)
        pos[t_mb, t_c] = np.arange(len(table))
        wrap = np.flatnonzero(jg % p == p - 1)
        c = jg[wrap] // p  # the sender's chunk (forward), chunk c + 1 on the other side
        k_f = pos[mbg[wrap], c] + p - 1  # stage 0's forward step that receives it
        x_f = op[0, t_mb[k_f], t_c[k_f] * p]
        k_b = pos[mbg[wrap], v - 2 - c] + p - 1  # stage p-1's backward step, gradients
        x_b = op[1, t_mb[k_b], (v - 1 - t_c[k_b]) * p + p - 1]
        for i, x in ((2 * wrap, x_f), (2 * wrap + 1, x_b)):
            post[i], wait[i] = slast[x], snext[x]

    @staticmethod
    def _topological(n: int, dst: np.ndarray, src: np.ndarray) -> np.ndarray:
        """Kahn's order over the edges src -> dst (compiled once the walks are: the same
        order); the graph is acyclic by construction, checked here."""
        order = np.argsort(src, kind="stable")
        sptr = np.zeros(n + 1, dtype=np.int64)
        sptr[1:] = np.cumsum(np.bincount(src, minlength=n))
        indeg = np.bincount(dst, minlength=n)
        kj = walk_jit.kernels()
        if kj is not None:
            topo = kj.topological(sptr, np.ascontiguousarray(dst[order]), indeg)
        else:
            succ, sptr, indeg = dst[order].tolist(), sptr.tolist(), indeg.tolist()
            stack = [u for u in range(n) if indeg[u] == 0]
            topo = []
            pop, push, out = stack.pop, stack.append, topo.append
            while stack:
                u = pop()
                out(u)
                for w in succ[sptr[u]:sptr[u + 1]]:
                    indeg[w] -= 1
                    if indeg[w] == 0:
                        push(w)
        if len(topo) != n:
            raise RuntimeError("schedule graph has a cycle")  # internal invariant
        return np.asarray(topo, dtype=np.int64)

    def _derive_topo(self) -> list[int]:
        """The topological order as a list (the Python walks'; `_csr` holds it as an array)."""
        return self._csr[0].tolist()

    def preds_of(self, i: int) -> list[int]:
        """Node i's predecessors (without deriving `preds` for every node)."""
        _topo, _k, ptr, idx = self._csr
        return idx[ptr[i]:ptr[i + 1]].tolist()

    def _derive_preds(self) -> list[list[int]]:
        _topo, _k, ptr, idx = self._csr
        flat, bounds = idx.tolist(), ptr.tolist()
        return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def label(self, i: int) -> tuple:
        """Node i as ("F"/"B", micro-batch, virtual stage, stage), ("X", sender, receiver) or
        ("T", stage)."""
        self._csr  # the graph, built on first use
        isb, mb, j, stage, t_src, t_dst = self.__dict__["_op_arrays"]
        n_ops, n_x = isb.size, t_src.size
        if i < n_ops:
            return ("B" if isb[i] else "F", int(mb[i]), int(j[i]), int(stage[i]))
        if i < n_ops + n_x:
            return ("X", int(t_src[i - n_ops]), int(t_dst[i - n_ops]))
        return ("T", i - n_ops - n_x)

    def _derive_labels(self) -> list[tuple]:
        return [self.label(i) for i in range(self.num_nodes)]

    def _derive_plan(self) -> list[tuple[int, tuple, int]]:
        """The Python walk's plan: (node, its predecessors, its kind) in topological order."""
        _topo, _k, ptr, idx = self._csr
        flat, bounds, kind_of = idx.tolist(), ptr.tolist(), self.kind_of.tolist()
        return [(i, tuple(flat[bounds[i]:bounds[i + 1]]), kind_of[i]) for i in self.topo]

    # -- evaluation -------------------------------------------------------------------------

    def longest_path(self, dur) -> float:
        """Length of the critical path for a duration vector indexed by `Kinds`: every path
        ends in a stage's tail node."""
        d = dur.tolist() if isinstance(dur, np.ndarray) else list(dur)
        K = self.kinds
        return max(st + d[K.tail(s)] for s, st in enumerate(self.tail_starts(d)))

    def tail_starts(self, dur) -> list[float]:
        """Start time of every stage's tail node (the end of the stage's last operation), in
        stage order, computed exactly as `longest_path` computes them. Tail nodes have no
        successors, so `longest_path(dur) == max(tail_starts(dur)[s] + dur[kinds.tail(s)])`
        bit for bit, and the starts do not depend on the tails' durations: callers that vary
        only the tails (solvers, through `Evaluator.iteration_ms`) reuse them."""
        end, _arg = self._walk(dur)
        out = []
        for t in self.tails:
            st = 0.0
            for u in self.preds_of(t):
                e = float(end[u])
                if e > st:
                    st = e
            out.append(st)
        return out

    def tail_starts_batch(self, durs: np.ndarray) -> np.ndarray:
        """`tail_starts` of many duration vectors at once (rows of `durs`), as an array of
        shape (rows, p), equal to it bit for bit: the graph is walked level by level (a node's
        level is one more than its deepest predecessor's), all nodes of a level and all rows
        in one numpy step. A predecessor-less node starts at 0.0, as in the scalar walk; padded
        predecessor slots point at a row that stays 0.0, which changes no maximum since every
        end time is >= 0."""
        durs = np.asarray(durs, dtype=float)
        work.charge("walk", durs.shape[0])
        work.charge("walk_node", self.num_nodes * durs.shape[0])
        kj = walk_jit.kernels()
        if kj is not None:
            return kj.tail_starts_batch(*self._csr, self._tails_arr,
                                        np.ascontiguousarray(durs))
        walk_jit.note_python_walk(self.num_nodes * durs.shape[0])
        levels, tail_preds = self._level_plan()
        n = self.num_nodes
        end = np.zeros((n + 1, durs.shape[0]))
        dt = np.ascontiguousarray(durs.T)
        for ids, preds, kinds in levels:
            if preds.shape[1]:
                end[ids] = end[preds].max(axis=1) + dt[kinds]
            else:
                end[ids] = 0.0 + dt[kinds]
        return end[tail_preds].max(axis=1).T

    def _level_plan(self):
        plan = self.__dict__.get("_levels")
        if plan is None:
            n = self.num_nodes
            level = [0] * n
            for i in self.topo:
                level[i] = 1 + max((level[u] for u in self.preds[i]), default=-1)
            by_level: dict[int, list[int]] = {}
            for i in range(n):
                by_level.setdefault(level[i], []).append(i)

            def padded(rows):
                width = max((len(r) for r in rows), default=0)
                return np.array([list(r) + [n] * (width - len(r)) for r in rows],
                                dtype=np.int64).reshape(len(rows), width)

            levels = []
            for lv in sorted(by_level):
                ids = by_level[lv]
                levels.append((np.array(ids, dtype=np.int64),
                               padded([self.preds[i] for i in ids]),
                               self.kind_of[ids]))
            plan = (levels, padded([self.preds[t] for t in self.tails]))
            self.__dict__["_levels"] = plan
        return plan

    def critical_path(self, dur) -> tuple[float, np.ndarray, list[int]]:
        """(length, counts per kind, node ids) of one longest path."""
        end, arg = self._walk(dur)
        last = max(self.tails, key=lambda t: end[t])
        path = self._trace(arg, last)
        counts = np.bincount(self.kind_of[path], minlength=self.kinds.size).astype(float)
        return float(end[last]), counts, path

    def _walk(self, dur) -> tuple[list[float], list[int]]:
        """End time of every node and its latest predecessor (the first of equals; a node
        without predecessors points at index num_nodes), in topological order."""
        work.charge("walk")
        work.charge("walk_node", self.num_nodes)
        kj = walk_jit.kernels()
        if kj is not None:
            return kj.walk(*self._csr, np.asarray(dur, dtype=float))
        d = dur.tolist() if isinstance(dur, np.ndarray) else list(dur)
        n = self.num_nodes
        walk_jit.note_python_walk(n)
        end = [0.0] * (n + 1)  # end[n] = 0.0: the missing predecessor
        arg = [n] * (n + 1)
        pairs = self._pair_plan()
        if pairs is not None:  # every node has at most two predecessors (non-blocking)
            for i, u1, u2, k in pairs:
                e1 = end[u1]
                e2 = end[u2]
                if e2 > e1:
                    end[i] = e2 + d[k]
                    arg[i] = u2
                else:
                    end[i] = e1 + d[k]
                    arg[i] = u1
            return end, arg
        for i, ps, k in self._plan:
            st, a = 0.0, n
            for u in ps:
                e = end[u]
                if a == n or e > st:
                    st, a = e, u
            end[i] = st + d[k]
            arg[i] = a
        return end, arg

    @property
    def _tails_arr(self) -> np.ndarray:
        if "_tails_np" not in self.__dict__:
            self.__dict__["_tails_np"] = np.asarray(self.tails, dtype=np.int64)
        return self.__dict__["_tails_np"]

    def _pair_plan(self):
        """The walk's plan as (node, first predecessor, second predecessor, kind), missing ones
        as num_nodes, or None if some node has more than two (blocking transfers): branch-free
        and about twice as fast as the general loop on 24k nodes."""
        if "_pairs" not in self.__dict__:
            topo, kind, ptr, idx = self._csr
            n = self.num_nodes
            count = np.diff(ptr)[topo]
            pairs = None
            if count.max(initial=0) <= 2:  # from the CSR arrays, in topological order
                padded = np.append(idx, n)  # idx[ptr[i]] may be one past the end: count 0
                first = np.where(count >= 1, padded[ptr[topo]], n)
                second = np.where(count >= 2, padded[np.minimum(ptr[topo] + 1, idx.size)], n)
                pairs = list(zip(topo.tolist(), first.tolist(), second.tolist(),
                                 kind[topo].tolist()))
            self.__dict__["_pairs"] = pairs
        return self.__dict__["_pairs"]

    def _trace(self, arg, last: int) -> list[int]:
        kj = walk_jit.kernels()
        if kj is not None and isinstance(arg, np.ndarray):
            return kj.trace(arg, int(last)).tolist()
        path = []
        u = int(last)
        while u != self.num_nodes:
            path.append(u)
            u = int(arg[u])
        path.reverse()
        return path

    def start_times(self, dur) -> np.ndarray:
        """Start time of every node (its end from the walk, less its own duration)."""
        end, _arg = self._walk(dur)
        return np.asarray(end[:self.num_nodes], dtype=float) - np.asarray(
            dur, dtype=float)[self.kind_of]

    def to_networkx(self, dur):
        """The same graph for networkx: edge u->v weighs the duration of u; a sink closes it."""
        import networkx as nx

        d = np.asarray(dur, dtype=float)
        g = nx.DiGraph()
        for v_, ps in enumerate(self.preds):
            g.add_node(v_)
            for u in ps:
                g.add_edge(u, v_, weight=float(d[self.kind_of[u]]))
        for t in self.tails:
            g.add_edge(t, "end", weight=float(d[self.kind_of[t]]))
        return g

    # -- memory ------------------------------------------------------------------------------

    def inflight_profile(self, s: int) -> list[tuple[str, int, np.ndarray]]:
        """For stage s, the count of stored micro-batches per chunk at each moment that can be
        a memory peak: after each forward ('F'), and during each backward before it frees its
        activations ('B'). Returns (event, chunk, counts per chunk), duplicates removed, in
        schedule order."""
        cache = self.__dict__.setdefault("_inflight_list", {})
        if s not in cache:
            is_b, counts, chunk = self._inflight(s)
            cache[s] = [("B" if b else "F", int(c), n.astype(np.int64))
                        for b, n, c in zip(is_b, counts, chunk)]
        return cache[s]

    def memory_moments(self, s: int) -> list[tuple[str, np.ndarray]]:
        """The moments of `inflight_profile(s)` whose memory is not implied by another's:
        (event 'F'/'B', stored micro-batches per chunk). A chunk's stored activation is never
        negative, and a backward moment adds working memory, so a moment with at least as
        many micro-batches stored in every chunk, and a backward if this one is, needs at
        least as much memory; this one is dropped (PP = 16, 192 micro-batches, v = 2: 1280
        moments -> 144)."""
        cache = self.__dict__.setdefault("_moments", {})
        if s not in cache:
            is_b, counts = self.inflight_arrays(s)
            key = np.concatenate([is_b[:, None].astype(float), counts], axis=1)
            _u, first = np.unique(key, axis=0, return_index=True)
            keep = np.sort(first)
            b, C = is_b[keep], counts[keep]
            geq = np.all(C[None, :, :] >= C[:, None, :], axis=2)  # [i, k]: k has >= i's
            more = np.any(C[None, :, :] > C[:, None, :], axis=2)
            kind_ok = b[None, :] | ~b[:, None]  # k is a backward, or i a forward
            dominated = geq & kind_ok & (more | (b[None, :] & ~b[:, None]))
            front = ~dominated.any(axis=1)
            cache[s] = [("B" if b[i] else "F", C[i]) for i in np.flatnonzero(front)]
        return cache[s]

    def inflight_arrays(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """`inflight_profile(s)` as arrays: (is_backward per event (bool), counts per event and
        chunk (events x v)), for vectorized memory peaks."""
        is_b, counts, _chunk = self._inflight(s)
        return is_b, counts

    def _inflight(self, s: int):
        """(is_backward, counts (events x v, float), chunk) of stage s's distinct events: a
        forward counts itself, a backward counts its micro-batch still stored (it frees it
        after), computed with cumulative sums over the stage's order."""
        cache = self.__dict__.setdefault("_inflight_arr", {})
        if s not in cache:
            ops = self.orders[s]
            fwd = np.array([k == "F" for k, _mb, _c in ops], dtype=bool)
            chunk = np.array([c for _k, _mb, c in ops], dtype=np.int64)
            delta = np.zeros((len(ops), self.v), dtype=np.int64)
            delta[np.arange(len(ops)), chunk] = np.where(fwd, 1, -1)
            counts = np.cumsum(delta, axis=0)
            counts[~fwd, chunk[~fwd]] += 1  # a backward's own micro-batch is still stored
            key = np.concatenate([(~fwd)[:, None].astype(np.int64), chunk[:, None], counts],
                                 axis=1)
            _u, first = np.unique(key, axis=0, return_index=True)
            keep = np.sort(first)
            cache[s] = (~fwd[keep], counts[keep].astype(float), chunk[keep])
        return cache[s]


# the 1F1B call sequences the blocking graph follows (CompiledSchedule._build)
P2P_STYLES = ("megatron", "deepspeed", "torch")


@lru_cache(maxsize=512)
def compile_schedule(schedule: str, p: int, m: int, v: int, blocking: bool,
                     group: int = 0, p2p: str = "megatron") -> CompiledSchedule:
    """The schedule's graph, cached; `group` 0 or p is Megatron's default grouping; `p2p`:
    whose 1F1B calls (P2P_STYLES; blocking 1F1B only)."""
    return CompiledSchedule(schedule, p, m, v, blocking,
                            0 if group == p or schedule != "interleaved" else group,
                            p2p if blocking and (schedule == "1f1b" or (
                                schedule == "gpipe" and p2p == "torch")) else "megatron")
