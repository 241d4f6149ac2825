"""The schedule graph: closed forms for uniform stages, agreement with networkx."""

import networkx as nx
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from model.plan import megatron_group_problem
from model.schedule import (CompiledSchedule, Kinds, compile_schedule, interleaved_table,
                            interleaved_warmup, stage_order)


def uniform(cs, f, b):
    K = cs.kinds
    d = np.zeros(K.size)
    d[:K.V] = f / cs.v
    d[K.V:2 * K.V] = b / cs.v
    return d


@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize("p,m", [(1, 4), (2, 4), (4, 8), (4, 16), (8, 8), (12, 64)])
def test_1f1b_and_gpipe_closed_form(p, m, blocking):
    for sched in ("1f1b", "gpipe"):
        cs = compile_schedule(sched, p, m, 1, blocking)
        assert cs.longest_path(uniform(cs, 1.0, 2.0)) == pytest.approx((m + p - 1) * 3.0)


@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (8, 16, 3), (12, 48, 2)])
def test_interleaved_bubble_is_one_over_v(p, m, v, blocking):
    cs = compile_schedule("interleaved", p, m, v, blocking)
    f, b = 1.0, 2.0
    assert cs.longest_path(uniform(cs, f, b)) == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)


def test_1f1b_in_flight_counts():
    cs = compile_schedule("1f1b", 4, 8, 1, True)
    for s in range(4):
        peak = max(int(c[0]) for _k, _c, c in cs.inflight_profile(s))
        assert peak == min(4 - s, 8)
    gp = compile_schedule("gpipe", 4, 8, 1, True)
    assert max(int(c[0]) for _k, _c, c in gp.inflight_profile(2)) == 8


def test_interleaved_in_flight_matches_megatron_warmup():
    p, m, v = 4, 8, 2
    cs = compile_schedule("interleaved", p, m, v, True)
    for s in range(p):
        peak = max(int(c.sum()) for _k, _c, c in cs.inflight_profile(s))
        assert peak == min((p - s - 1) * 2 + (v - 1) * p + 1, m * v)


def test_every_op_appears_once():
    for sched, v in (("1f1b", 1), ("gpipe", 1), ("interleaved", 2)):
        for s in range(4):
            ops = stage_order(sched, 4, 8, v, s)
            assert sorted(ops) == sorted({(k, mb, c) for k in "FB" for mb in range(8)
                                          for c in range(v)})


@settings(max_examples=40, deadline=None)
@given(sched=st.sampled_from(["1f1b", "gpipe", "interleaved"]), p=st.integers(2, 5),
       mult=st.integers(1, 3), blocking=st.booleans(), seed=st.integers(0, 10**6))
def test_fast_recurrence_equals_networkx(sched, p, mult, blocking, seed):
    v = 2 if sched == "interleaved" else 1
    m = p * mult
    cs = compile_schedule(sched, p, m, v, blocking)
    d = np.random.default_rng(seed).uniform(0.1, 3.0, cs.kinds.size)
    fast = cs.longest_path(d)
    ref = nx.dag_longest_path_length(cs.to_networkx(d))
    length, counts, _ = cs.critical_path(d)
    assert fast == pytest.approx(ref, rel=1e-12)
    assert length == pytest.approx(fast, rel=1e-12)
    assert counts @ d == pytest.approx(fast, rel=1e-9)


def test_blocking_puts_transfers_on_the_critical_path():
    """Pipette's point: with blocking send/recv, every 1F1B cycle pays the transfer."""
    p, m = 4, 32
    blk = compile_schedule("1f1b", p, m, 1, True)
    ovl = compile_schedule("1f1b", p, m, 1, False)
    d = uniform(blk, 1.0, 2.0)
    K = blk.kinds
    for h in range(p - 1):
        d[K.xf(h)] = d[K.xb(h)] = 0.1
    t_blk, t_ovl = blk.longest_path(d), ovl.longest_path(d)
    assert t_blk > t_ovl
    _, counts, _ = blk.critical_path(d)
    assert counts[2 * K.V:2 * K.V + 2 * p].sum() >= m  # at least one transfer per micro-batch


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)]),
       st.integers(2, 5), st.integers(1, 3), st.booleans(), st.integers(0, 10**6))
def test_compiled_walks_equal_python_walks(sched_v, p, mult, blocking, seed):
    """model/_walk_kernels.py (numba) gives the Python walks' results bit for bit: the critical
    path's length and nodes, every stage's tail start, and the batched walk (ties included:
    durations drawn from a few values, zeros among them)."""
    from model import walk_jit
    sched, v = sched_v
    cs = compile_schedule(sched, p, mult * p, v, blocking)
    rng = np.random.default_rng(seed)
    durs = rng.choice([0.0, 0.5, 1.0, 1.7, 3.0], size=(3, cs.kinds.size))
    assert walk_jit.load(), walk_jit._state["error"]
    saved = walk_jit._state["kernels"]
    out = {}
    for mode in ("python", "compiled"):
        walk_jit._state["kernels"] = None if mode == "python" else saved
        try:
            out[mode] = [(cs.critical_path(d)[0], cs.critical_path(d)[2], cs.tail_starts(d),
                          cs.longest_path(d)) for d in durs] + [
                cs.tail_starts_batch(durs).tolist()]
        finally:
            walk_jit._state["kernels"] = saved
    assert out["python"] == out["compiled"]


def reference_preds(sched, p, m, v, blocking):
    """The graph of model/schedule.py's docstring built edge by edge with dicts (the way
    CompiledSchedule built it before its numpy construction): node ids in the same order,
    operations stage by stage, then per micro-batch and boundary the activation's and the
    gradient's transfer, then the tails; each node's predecessors sorted and unique."""
    orders = [stage_order(sched, p, m, v, s) for s in range(p)]
    V = p * v
    op_id, where = {}, {}
    for s, ops in enumerate(orders):
        for pos, (k, mb, c) in enumerate(ops):
            where[len(op_id)] = s
            op_id[(k, mb, c * p + s)] = len(op_id)
    preds = [set() for _ in op_id]
    steps, step_of = [], {}
    for s, ops in enumerate(orders):
        ids = [op_id[(k, mb, c * p + s)] for k, mb, c in ops]
        for a, b in zip(ids, ids[1:]):
            preds[b].add(a)
        groups = [[i] for i in ids]
        if sched == "interleaved":
            total = m * v
            w = min((p - s - 1) * 2 + (v - 1) * p, total)
            steady = ids[w:w + 2 * (total - w)]
            groups = ([[i] for i in ids[:w]] + [steady[i:i + 2] for i in range(0, len(steady), 2)]
                      + [[i] for i in ids[w + 2 * (total - w):]])
        steps.append(groups)
        for gi, g in enumerate(groups):
            for i in g:
                step_of[i] = gi

    kind = {i: k for (k, _mb, _j), i in op_id.items()}
    sent_by, into = {}, []

    def transfer(src, dst):
        t = len(preds)
        sent_by[src] = t
        into.append((t, dst))
        ss, sd, gs, gd = where[src], where[dst], step_of[src], step_of[dst]
        preds.append({steps[ss][gs][-1]})
        preds[dst].add(t)
        if blocking:
            if gd > 0:
                preds[t].add(steps[sd][gd - 1][-1])
            preds[steps[sd][gd][0]].add(t)
            if gs + 1 < len(steps[ss]):
                preds[steps[ss][gs + 1][0]].add(t)

    for mb in range(m):
        for j in range(V - 1):
            transfer(op_id[("F", mb, j)], op_id[("F", mb, j + 1)])
            transfer(op_id[("B", mb, j + 1)], op_id[("B", mb, j)])
        preds[op_id[("B", mb, V - 1)]].add(op_id[("F", mb, V - 1)])
    if blocking and sched == "1f1b":
        # a warm-up or cool-down receive waits for the send of the step before, when that
        # step is of its kind (two calls in Megatron-LM, not one batch)
        for t, dst in into:
            sd, gd = where[dst], step_of[dst]
            if gd > 0:
                prev = steps[sd][gd - 1][-1]
                if kind[prev] == kind[dst] and prev in sent_by:
                    preds[t].add(sent_by[prev])
    if blocking and sched == "interleaved":
        # a stage all of whose forwards are warm-up receives its first gradient in a call of
        # its own, after its last forward's send (recv_backward after the warm-up loop)
        for s, ops in enumerate(orders):
            total = m * v
            if min((p - s - 1) * 2 + (v - 1) * p, total) < total:
                continue
            last_f = op_id[(ops[total - 1][0], ops[total - 1][1], ops[total - 1][2] * p + s)]
            first_b = op_id[(ops[total][0], ops[total][1], ops[total][2] * p + s)]
            for t, dst in into:
                if dst == first_b and last_f in sent_by:
                    preds[t].add(sent_by[last_f])
    for s, ops in enumerate(orders):
        k, mb, c = ops[-1]
        preds.append({op_id[(k, mb, c * p + s)]})
    return [sorted(ps) for ps in preds]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)]),
       st.integers(1, 6), st.integers(1, 9), st.booleans())
def test_graph_equals_the_edge_by_edge_construction(sched_v, p, m, blocking):
    """The numpy construction of the graph gives the reference's nodes and edges exactly, and
    its topological order (Python or compiled Kahn) puts every predecessor first."""
    from model import walk_jit
    sched, v = sched_v
    # Megatron-LM's interleaved schedule needs PP >= 2 and the micro-batches a multiple of it
    assume(sched != "interleaved" or (p >= 2 and m % p == 0))
    ref = reference_preds(sched, p, m, v, blocking)
    assert walk_jit.load(), walk_jit._state["error"]
    saved = walk_jit._state["kernels"]
    topos = []
    for kernels in (None, saved):
        walk_jit._state["kernels"] = kernels
        try:
            cs = CompiledSchedule(sched, p, m, v, blocking)
            assert cs.preds == ref
            topos.append(cs.topo)
        finally:
            walk_jit._state["kernels"] = saved
    assert topos[0] == topos[1]
    rank = {u: r for r, u in enumerate(topos[0])}
    assert sorted(rank) == list(range(len(ref)))
    assert all(rank[u] < rank[i] for i, ps in enumerate(ref) for u in ps)
    K = cs.kinds
    for i in range(cs.num_nodes):  # labels and kinds agree
        lab = cs.label(i)
        if lab[0] in "FB":
            assert cs.kind_of[i] == (K.F(lab[2]) if lab[0] == "F" else K.B(lab[2]))
        elif lab[0] == "T":
            assert cs.kind_of[i] == K.tail(lab[1]) and i in cs.tails


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)]),
       st.integers(2, 5), st.integers(1, 4), st.integers(0, 10**6))
def test_memory_moments_keep_every_peak(sched_v, p, mult, seed):
    """The moments `memory_moments` drops never hold the peak: for any non-negative bytes per
    stored micro-batch of each chunk and working memory of a backward, the largest memory over
    the kept moments equals the largest over all of `inflight_profile`; and fewer are kept
    whenever some moment is dominated."""
    sched, v = sched_v
    cs = compile_schedule(sched, p, mult * p, v, False)
    rng = np.random.default_rng(seed)
    for s in range(p):
        every = cs.inflight_profile(s)
        kept = cs.memory_moments(s)
        assert 1 <= len(kept) <= len(every)
        for _ in range(5):
            act = rng.choice([0.0, 0.3, 1.0, 2.5], size=v)
            work = float(rng.choice([0.0, 0.7, 4.0]))

            def mem(kind, counts):
                return float(np.asarray(counts, dtype=float) @ act) + (work if kind == "B"
                                                                        else 0.0)
            assert max(mem(k, c) for k, c in kept) == max(mem(k, c) for k, _ch, c in every)


def _replay(seq, op_ms, tag_ms, per_stage: bool = False):
    """Run each stage's list of calls (seq[s]: ("F"/"B", arg) computations, ("p2p", tags)
    blocking batches of transfers, ("isend", tags) sends started without waiting and
    ("wait", tags) waiting for them; a tag (src, dst, key) names one transfer) step by step:
    a batch returns when each of its transfers has finished, a transfer taking tag_ms(tag)
    once both its ends have posted it. The time the last stage finishes; a deadlock fails."""
    p = len(seq)
    pos, t, posted = [0] * p, [0.0] * p, {}
    moved = True
    while moved:
        moved = False
        for s in range(p):
            while pos[s] < len(seq[s]):
                kind, arg = seq[s][pos[s]]
                if kind not in ("p2p", "isend", "wait"):
                    t[s] += op_ms(kind, arg)
                    pos[s] += 1
                    moved = True
                    continue
                if kind == "isend":
                    for tag in arg:
                        posted.setdefault((tag, s), t[s])
                    pos[s] += 1
                    moved = True
                    continue
                for tag in arg:
                    if kind == "p2p":
                        posted.setdefault((tag, s), t[s])
                end, ready = t[s], True
                for tag in arg:
                    other = tag[1] if s == tag[0] else tag[0]
                    if (tag, other) not in posted:
                        ready = False
                        break
                    end = max(end, max(posted[(tag, s)], posted[(tag, other)]) + tag_ms(tag))
                if not ready:
                    break
                t[s] = end
                pos[s] += 1
                moved = True
    assert pos == [len(q) for q in seq], "the replay deadlocked"
    return t if per_stage else max(t)


def _replay_with(calls, p: int, d, K, per_stage: bool = False):
    """_replay of every stage's calls(s), with durations d indexed as Kinds K: a forward or
    backward of virtual stage j, an activation ("a") or gradient transfer over its hop."""
    return _replay([calls(s) for s in range(p)],
                   lambda kind, j: d[K.F(j)] if kind == "F" else d[K.B(j)],
                   lambda tag: d[K.xf(tag[0]) if tag[2][0] == "a" else K.xb(tag[1])],
                   per_stage)


def _megatron_1f1b_blocking(p: int, m: int, f: float, b: float, x: float) -> float:
    """Megatron-LM's non-interleaved 1F1B (schedules.py
    forward_backward_pipelining_without_interleaving) as its calls run: each p2p call (a
    batch of sends and receives) returns when every transfer in it has finished, a transfer
    taking x once both ends have posted it; the warm-up's and cool-down's send and the next
    receive are two calls, the steady state's are one."""
    def calls(s):
        first, last = s == 0, s == p - 1
        rf = (lambda i: None) if first else (lambda i: (s - 1, s, i))
        sf = (lambda i: None) if last else (lambda i: (s, s + 1, i))
        rb = (lambda i: None) if last else (lambda i: (s + 1, s, i))
        sb = (lambda i: None) if first else (lambda i: (s, s - 1, i))
        out = []

        def call(*tags):
            out.append(("p2p", [t for t in tags if t]))
        w = min(p - s - 1, m)
        rem = m - w
        for i in range(w):
            call(rf(i))
            out.append(("F", i))
            call(sf(i))
        if rem:
            call(rf(w))
        for i in range(rem):
            out.append(("F", w + i))
            call(sf(w + i), rb(i))
            out.append(("B", i))
            call(sb(i)) if i == rem - 1 else call(sb(i), rf(w + i + 1))
        for i in range(rem, m):
            call(rb(i))
            out.append(("B", i))
            call(sb(i))
        return out
    return _replay([calls(s) for s in range(p)], lambda kind, _i: f if kind == "F" else b,
                   lambda _tag: x)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 2), (4, 8), (8, 16)])
@pytest.mark.parametrize("f,b,x", [(1.0, 2.0, 0.1), (1.0, 1.0, 0.3), (1.0, 2.0, 2.0),
                                   (1.0, 2.0, 3.0)])
def test_blocking_1f1b_is_megatrons_call_sequence(p, m, f, b, x):
    """The blocking 1F1B graph's critical path equals a step-by-step run of Megatron-LM's p2p
    calls, transfers slower than a forward included (the warm-up's and cool-down's separate
    send and receive calls had been let overlap: 3% short at x = 3f)."""
    K = Kinds(p, 1)
    d = np.zeros(K.size)
    for j in range(p):
        d[K.F(j)], d[K.B(j)] = f, b
    for h in range(p):
        d[K.xf(h)] = d[K.xb(h)] = x
    got = compile_schedule("1f1b", p, m, 1, True).longest_path(d)
    assert got == pytest.approx(_megatron_1f1b_blocking(p, m, f, b, x))


def _megatron_interleaved_blocking(p: int, m: int, v: int, n: int, d, K,
                                   per_stage: bool = False):
    """Megatron-LM's interleaved schedule (schedules.py forward_backward_pipelining_with_
    interleaving, --no-overlap-p2p-communication) replayed call by call: warm-up, steady state
    and cool-down steps, each ending in one batched p2p call that returns when its transfers
    have finished; which ranks receive at a step follows recv_tensor_from_previous_stage, and
    each receive is matched to its sender's send in posting order (NCCL's per-peer order), not
    to the operation the graph says consumes it. `d` indexes the durations as Kinds K does."""
    table = interleaved_table(m, v, n)
    total = m * v

    def recv(s, k, forward):  # recv_tensor_from_previous_stage
        leading = s == 0 if forward else s == p - 1
        if not leading:
            return True
        if k < p - 1:
            return False
        c = table[k - (p - 1)][1]
        return c != v - 1 if forward else (v - 1 - c) != 0

    def calls(s):
        w = interleaved_warmup(p, m, v, s, n)
        rem = total - w
        out, sent, got = [], {"a": 0, "g": 0}, {"a": 0, "g": 0}

        def comm(send_a=False, send_g=False, recv_a=False, recv_g=False):
            ops = []  # (src, dst, (kind, n-th on that link)): NCCL's per-peer order
            if send_a:
                ops.append((s, (s + 1) % p, ("a", sent["a"])))
                sent["a"] += 1
            if send_g:
                ops.append((s, (s - 1) % p, ("g", sent["g"])))
                sent["g"] += 1
            if recv_a:
                ops.append(((s - 1) % p, s, ("a", got["a"])))
                got["a"] += 1
            if recv_g:
                ops.append(((s + 1) % p, s, ("g", got["g"])))
                got["g"] += 1
            if ops:
                out.append(("p2p", ops))

        def fwd(k):
            c = table[k][1]
            out.append(("F", c * p + s))
            return not (s == p - 1 and c == v - 1)  # the last virtual stage sends nothing

        def bwd(k):
            c = v - 1 - table[k][1]
            out.append(("B", c * p + s))
            return not (s == 0 and c == 0)

        comm(recv_a=s != 0)
        for k in range(w):
            send = fwd(k)
            rp = recv(s, k, True) and k != total - 1
            if k == w - 1 and rem:
                comm(send_a=send, recv_a=rp, recv_g=s != p - 1)
            else:
                comm(send_a=send, recv_a=rp)
        for k in range(rem):
            sa, sg = fwd(w + k), bwd(k)
            comm(send_a=sa, send_g=sg, recv_a=recv(s, w + k, True) and k != rem - 1,
                 recv_g=recv(s, k, False))
        if not rem:
            comm(recv_g=s != p - 1)
        for k in range(rem, total):
            sg = bwd(k)
            comm(send_g=sg, recv_g=recv(s, k, False) and k != total - 1)
        return out

    return _replay_with(calls, p, d, K, per_stage)


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 5), st.integers(2, 3), st.integers(2, 14), st.integers(0, 6),
       st.integers(0, 10**6))
def test_blocking_interleaved_is_megatrons_call_sequence(p, v, m, extra, seed):
    """The blocking interleaved graph's critical path equals a call-by-call replay of
    Megatron-LM's schedule, for groups of PP micro-batches and for larger ones (--microbatch-
    group-size-per-virtual-pipeline-stage, where the first stage receives a chunk's input some
    steps before it runs it), random durations per virtual stage and hop."""
    n = p + extra
    assume(megatron_group_problem(p, m, n) is None)
    K = Kinds(p, v)
    rng = np.random.default_rng(seed)
    d = rng.choice([0.0, 0.3, 1.0, 1.7, 4.0], size=K.size)
    d[2 * K.V + 2 * p:] = 0.0  # tails
    cs = CompiledSchedule("interleaved", p, m, v, True, n)
    assert cs.longest_path(d) == pytest.approx(_megatron_interleaved_blocking(p, m, v, n, d, K))


def _deepspeed_1f1b(p: int, m: int, d, K, per_stage: bool = False):
    """DeepSpeed's pipeline engine replayed instruction by instruction (runtime/pipe/
    schedule.py TrainSchedule.steps and _step_to_micro_batch, its 2 (m + p - 1) steps a stage,
    forward and backward slots alternating; each SendActivation, RecvActivation, SendGrad and
    RecvGrad a blocking call of its own, p2p.py)."""
    def step_to_mb(step, s):
        fwd = step % 2 == s % 2
        if fwd:
            return (step // 2 if step % 2 == 0 else (step - 1) // 2) - s // 2, True
        if step % 2 == 0:
            return step // 2 - p + (s + 1) // 2, False
        return (step - 1) // 2 - p + 1 + s // 2, False

    def calls(s):
        out, n = [], {"sa": 0, "ra": 0, "sg": 0, "rg": 0}

        def call(src, dst, kind):
            key = {(s, "a"): "sa", (s, "g"): "sg"}.get((src, kind), "r" + kind)
            out.append(("p2p", [(src, dst, (kind, n[key]))]))
            n[key] += 1
        prev = -1
        for step in range(2 * (m + p - 1)):
            mb, fwd = step_to_mb(step, s)
            ok, was = 0 <= mb < m, 0 <= prev < m
            if fwd:
                if was and s > 0:
                    call(s, s - 1, "g")  # SendGrad
                if ok and s > 0:
                    call(s - 1, s, "a")  # RecvActivation
            else:
                if ok and s < p - 1:
                    call(s + 1, s, "g")  # RecvGrad
                if was and s < p - 1:
                    call(s, s + 1, "a")  # SendActivation
            if ok:
                out.append(("F" if fwd else "B", s))
            prev = mb
        return out
    return _replay_with(calls, p, d, K, per_stage)


def _torch_1f1b(p: int, m: int, d, K, per_stage: bool = False):
    """PyTorch's Schedule1F1B (torch.distributed.pipelining schedules.py, torch 2.13
    _step_microbatches) replayed call by call: min(m, p - s) warm-up forwards, each receive
    waited before its forward, each send but the last started without waiting and waited after
    the next forward; the steady state's send and receive batched and waited; the cool-down's
    sends waited after the next backward, the last before the step ends."""
    def calls(s):
        out, n = [], {"sa": 0, "ra": 0, "sg": 0, "rg": 0}

        def tag(src, dst, kind):
            key = {(s, "a"): "sa", (s, "g"): "sg"}.get((src, kind), "r" + kind)
            n[key] += 1
            return (src, dst, (kind, n[key] - 1))
        ra = (lambda: [tag(s - 1, s, "a")]) if s > 0 else list
        sa = (lambda: [tag(s, s + 1, "a")]) if s < p - 1 else list
        rg = (lambda: [tag(s + 1, s, "g")]) if s < p - 1 else list
        sg = (lambda: [tag(s, s - 1, "g")]) if s > 0 else list

        def call(kind, tags):
            if tags:
                out.append((kind, tags))
        w = min(m, p - s)
        fwd = bwd = 0
        pending, fwd_send = [], []
        for _ in range(w):
            call("p2p", ra())
            out.append(("F", s))
            call("wait", pending)
            pending = []
            if fwd != w - 1:
                pending = sa()
                call("isend", pending)
            else:
                fwd_send = sa()
            fwd += 1
        while True:
            call("p2p", fwd_send + rg())
            out.append(("B", s))
            bwd_send = sg()
            bwd += 1
            if fwd == m:
                break
            call("p2p", bwd_send + ra())
            out.append(("F", s))
            fwd_send = sa()
            fwd += 1
        pending = bwd_send
        call("isend", pending)
        while bwd < m:
            call("p2p", rg())
            out.append(("B", s))
            call("wait", pending)
            pending = sg()
            call("isend", pending)
            bwd += 1
        call("wait", pending)
        return out
    return _replay_with(calls, p, d, K, per_stage)


def _torch_gpipe(p: int, m: int, d, K, per_stage: bool = False):
    """PyTorch's ScheduleGPipe (schedules.py, torch 2.13 _step_microbatches) replayed call by
    call: every forward after its receive, its send started without waiting, the sends all
    waited for after the last forward; the backwards likewise, their sends before the end."""
    def calls(s):
        out, n = [], {"sa": 0, "ra": 0, "sg": 0, "rg": 0}

        def tag(src, dst, kind):
            key = {(s, "a"): "sa", (s, "g"): "sg"}.get((src, kind), "r" + kind)
            n[key] += 1
            return [(src, dst, (kind, n[key] - 1))]
        for kind, recv, send in (("F", (s - 1, s, "a"), (s, s + 1, "a")),
                                 ("B", (s + 1, s, "g"), (s, s - 1, "g"))):
            pending = []
            for _i in range(m):
                if 0 <= recv[0] < p:
                    out.append(("p2p", tag(*recv)))
                out.append((kind, s))
                if 0 <= send[1] < p:
                    x = tag(*send)
                    out.append(("isend", x))
                    pending += x
            if pending:
                out.append(("wait", pending))
        return out
    return _replay_with(calls, p, d, K, per_stage)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.integers(0, 10**6))
def test_pytorchs_gpipe_graph_is_its_call_sequence(p, m, seed):
    """torchtitan's GPipe as PyTorch calls it (sends waited at the end of each phase) equals a
    call-by-call replay of ScheduleGPipe, with random durations per stage and hop."""
    K = Kinds(p, 1)
    rng = np.random.default_rng(seed)
    d = rng.choice([0.0, 0.3, 1.0, 1.7, 4.0], size=K.size)
    d[2 * K.V + 2 * p:] = 0.0  # tails
    cs = CompiledSchedule("gpipe", p, m, 1, True, p2p="torch")
    assert cs.p2p == "torch"
    assert cs.longest_path(d) == pytest.approx(_torch_gpipe(p, m, d, K))
    # each stage's step ends, its tail's start, as the replay's: after its last send's wait
    assert cs.tail_starts(d) == pytest.approx(_torch_gpipe(p, m, d, K, per_stage=True))


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["deepspeed", "torch"]), st.integers(1, 6), st.integers(1, 12),
       st.integers(0, 10**6))
def test_each_frameworks_1f1b_graph_is_its_call_sequence(style, p, m, seed):
    """The blocking 1F1B graph of each framework's calls equals a call-by-call replay of its
    own schedule, with random durations per stage and hop: DeepSpeed (every send and receive a
    blocking call of its own, in TrainSchedule's order; never faster than Megatron-LM's
    batched calls) and PyTorch's Schedule1F1B (torchtitan: warm-up and cool-down sends started
    without waiting and waited after the next operation)."""
    K = Kinds(p, 1)
    rng = np.random.default_rng(seed)
    d = rng.choice([0.0, 0.3, 1.0, 1.7, 4.0], size=K.size)
    d[2 * K.V + 2 * p:] = 0.0  # tails
    replay = {"deepspeed": _deepspeed_1f1b, "torch": _torch_1f1b}[style]
    cs = CompiledSchedule("1f1b", p, m, 1, True, p2p=style)
    assert cs.longest_path(d) == pytest.approx(replay(p, m, d, K))
    if style == "torch":  # each stage's step ends after its last send's wait
        assert cs.tail_starts(d) == pytest.approx(replay(p, m, d, K, per_stage=True))
    if style == "deepspeed":
        batched = CompiledSchedule("1f1b", p, m, 1, True)
        assert batched.longest_path(d) <= cs.longest_path(d) + 1e-9
