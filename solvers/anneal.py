"""Simulated annealing over placements and layer splits (Kirkpatrick et al. 1983), as Pipette
does for its node-to-stage assignment, extended to the layer split.

Moves on the permutation of nodes over slots: with clock cooling, the moves of Pipette's SA
(Yim et al. 2024: swap two slots, 2-opt (reverse a segment), insert (move one node elsewhere),
insert-route (move a run of nodes elsewhere), insert-reversed (the same, reversed)); with an
iteration budget (the exact method's warm starts) swap, 2-opt and insert, as before; on the
split: move one layer from one virtual stage to another. Metropolis acceptance, geometric cooling from `t0_frac` to
`t_end_frac` of the starting cost, spread over the iteration budget when one is given (the same
seed then gives the same answer) or over the clock (`iters=None`: the temperature follows the
elapsed share of the time limit, so a short budget cools fast and a long one explores). The
best plan seen is returned whenever the time limit or the iteration budget ends the search.
Unless the caller gives a start, the first chain starts from the better of the identity and
solvers.construct's rings and pipelines of fast links, and, with clock cooling, starts cold.
With clock cooling, a block that is one pipeline of interchangeable nodes (solvers.cutsearch)
gets an iterated local search on its critical-path surrogate instead of the chains: on
bench/anneal_vs_paper.py's 32-node instances it reaches in 0.2-1 s what the chains and Pipette's
SA reach in 10 s or not at all.
"""

from __future__ import annotations

import math

import numpy as np

from model import work

from .construct import constructed_perm
from .cutsearch import PathSurrogate, path_search
from .problem import PlacementProblem
from .result import PlacementResult


def anneal(prob: PlacementProblem, *, seed: int = 0, iters: int | None = 6000,
           restarts: int = 4, time_limit_s: float = 10.0, polish: bool = True,
           **kw) -> PlacementResult:
    """Best of `restarts` seeded chains (the first from the given start, or else the better of
    the identity and solvers.construct's rings and pipelines; the others
    from random permutations), then a descent polish, cheapest neighbourhood first: all swaps;
    where there are few, two swaps at once; then single-layer moves and, where that
    neighbourhood is small, a swap and a layer move together; until none improves (stopped by
    the time limit). `iters=None`: each chain cools over its share of the clock
    (POLISH_SHARE of the limit is kept for the polish); where solvers.cutsearch applies, its
    path search takes the chains' share (from the same start)."""
    t_start = work.now()
    rng = np.random.default_rng(seed)
    best: PlacementResult | None = None
    done = 0
    chains_s = time_limit_s * (1 - POLISH_SHARE) if polish else time_limit_s
    if iters is None:  # clock mode: one chain per CLOCK_CHAIN_S of budget, at most `restarts`
        restarts = max(1, min(restarts, int(time_limit_s // CLOCK_CHAIN_S)))
    first_kw = kw
    if kw.get("init_perm") is None and prob.num_slots > 1:
        # the first chain starts from the better of the identity and the constructed rings and
        # pipelines (solvers.construct), which take at most CONSTRUCT_SHARE of the limit
        built = constructed_perm(prob, deadline_s=t_start + CONSTRUCT_SHARE * time_limit_s)
        lay = kw.get("init_layers") or prob.start_layers()
        ident = list(range(prob.num_slots))
        if built is not None and built != ident:
            if prob.cost(built, lay) < prob.cost(ident, lay):
                first_kw = dict(kw, init_perm=built)
                if iters is None:
                    first_kw.setdefault("t0_frac", CONSTRUCTED_T0_FRAC)
        start = first_kw.get("init_perm") or ident
        if prob.mixed_memory and not prob.placed_fits(start, lay):
            # GPUs of several memory sizes and a start that overflows one: start from the
            # placement that gives the largest GPUs to the neediest slots (a chain never
            # leaves a start of infinite cost)
            mp = prob.memory_perm(lay)
            if mp is not None:
                first_kw = dict(kw, init_perm=mp, init_layers=lay)
        if prob.mixed_gpus and prob.split_free and kw.get("init_layers") is None:
            # GPUs of several types or sizes: the start as it stands, or a few placements each
            # with the split balanced for its hosts (largest GPUs first or last in the pipeline,
            # as given, as constructed), whichever is fastest
            cur_perm = first_kw.get("init_perm") or ident
            cur_lay = first_kw.get("init_layers") or lay
            best_start = (prob.cost(cur_perm, cur_lay), cur_perm, cur_lay)
            cands = [best_start]
            mp = prob.memory_perm(lay)
            t_cands = t_start + CONSTRUCT_SHARE * time_limit_s  # with the construction's share
            for perm in (mp, None if mp is None else mp[::-1], ident, ident[::-1], built):
                if perm is None or work.now() > t_cands:
                    continue
                split = prob.placed_split(perm)
                if split is not None:
                    c = prob.cost(list(perm), split)
                    cands.append((c, list(perm), split))
                    if c < best_start[0]:
                        best_start = (c, list(perm), split)
            if prob.block.A > 1:  # and each candidate's mirror: rows reversed, layers carried
                for _c, perm, split in list(cands):
                    if work.now() > t_cands:
                        break
                    mp2, ml2 = list(perm), tuple(split)
                    for a in range(prob.block.A // 2):
                        mp2, ml2 = prob.row_swap(mp2, ml2, a, prob.block.A - 1 - a)
                    c = prob.cost(mp2, ml2)
                    if c < best_start[0]:
                        best_start = (c, mp2, ml2)
            if math.isfinite(best_start[0]):
                first_kw = dict(first_kw, init_perm=best_start[1], init_layers=best_start[2])
    if iters is None and PathSurrogate.applies(prob):
        # one pipeline of interchangeable nodes: iterated local search on the critical-path
        # surrogate (solvers.cutsearch) takes the chains' share of the clock
        lay0, perm0 = first_kw.get("init_layers"), first_kw.get("init_perm")
        lay0 = tuple(prob.start_layers() if lay0 is None else lay0)
        perm0 = list(range(prob.num_slots) if perm0 is None else perm0)
        found = path_search(prob, lay0, perm0, deadline_s=t_start + chains_s, seed=seed,
                            move_layers=first_kw.get("move_layers", True))
        if found is not None:
            best = PlacementResult(prob.plan(found[0], found[1]), found[2], 0.0, "heuristic",
                                   "anneal", work.now() - t_start)
            restarts = 0
    for i in range(restarts):
        left = time_limit_s - (work.now() - t_start)
        if left <= 0 and best is not None:
            break
        if iters is None:  # this chain's share of the clock left for the chains
            left = max(0.0, chains_s - (work.now() - t_start)) / (restarts - i)
            if left <= 0 and best is not None:
                break
        if i > 0:  # later chains start from a random permutation, odd ones also reversed split
            kw = dict(kw, init_perm=list(rng.permutation(prob.num_slots)))
            if i % 2 == 1:
                rev = tuple(reversed(prob.start_layers()))
                kw["init_layers"] = rev if prob.fits(rev) else None
        r = _chain(prob, seed=int(rng.integers(2**31)),
                   iters=None if iters is None else max(1, iters // restarts),
                   time_limit_s=max(left, 0.0), **(first_kw if i == 0 else kw))
        done += r.iterations
        if best is None or r.objective_ms < best.objective_ms:
            best = r
    if best is None or best.plan is None:
        return best
    if polish and prob.mixed_gpus and prob.split_free and \
            math.factorial(prob.num_slots) <= MULTISTART_PERMS:
        best = _placed_descents(prob, best, t_start, time_limit_s)
    if polish:
        best = _polish(prob, best, t_start, time_limit_s)
    best.iterations = done
    best.wall_s = work.now() - t_start
    return best


# on GPUs of several types or sizes, blocks of at most this many node orders get a split
# descent from every order's balanced split (_placed_descents): 4 slots
MULTISTART_PERMS = 24


def _placed_descents(prob: PlacementProblem, res: PlacementResult, t_start: float,
                     time_limit_s: float) -> PlacementResult:
    """Every node order of a small block, from the split balanced for its hosts
    (PlacementProblem.placed_split), descended by single-layer moves and, where none improves
    and the block has few virtual stages, two at once; the best of those and `res`. The optimum can starve slow nodes beyond any time balance (a fuzzer's H200 + 2 L40S
    block: (1, 29, 2), where balance gives (6, 22, 4)), a valley the chains, started from one
    order, could end outside (all seeds 11.4% above the brute-force optimum)."""
    import itertools

    def out_of_time():
        return work.now() - t_start >= time_limit_s
    best_perm, best_lay, cur = _perm_of(prob, res.plan), tuple(res.plan.shape.layers), \
        res.objective_ms
    V = prob.shape.num_virtual
    moves = [(a, b) for a in range(V) for b in range(V) if a != b]
    # where no single move improves, two at once (a few virtual stages: <= 144 pairs); an
    # interleaved H200 + A100 block's optimum lay two moves across a ridge
    pairs = [(x, y) for x in moves for y in moves] if len(moves) <= 12 else []
    for perm in itertools.permutations(range(prob.num_slots)):
        if out_of_time():
            break
        perm = list(perm)
        lay = prob.placed_split(perm)
        if lay is None:
            continue
        c = prob.cost(perm, lay)
        improved = math.isfinite(c)
        while improved and not out_of_time():
            improved = False
            for group in ([(x,) for x in moves], pairs):
                for mv in group:
                    if out_of_time():  # a new split builds its evaluator: tens of ms
                        break
                    nxt = list(lay)
                    for a, b in mv:
                        nxt[a] -= 1
                        nxt[b] += 1
                    if min(nxt) < 1:
                        continue
                    c2 = prob.cost(perm, tuple(nxt))
                    if c2 < c - 1e-12:
                        lay, c, improved = tuple(nxt), c2, True
                if improved:
                    break
        if c < cur - 1e-12:
            best_perm, best_lay, cur = perm, lay, c
    if cur >= res.objective_ms:
        return res
    return PlacementResult(prob.plan(best_perm, best_lay), cur, 0.0, "heuristic", "anneal",
                           work.now() - t_start)


def _polish(prob: PlacementProblem, res: PlacementResult, t_start: float,
            time_limit_s: float) -> PlacementResult:
    pl = res.plan
    perm = _perm_of(prob, pl)
    layers = tuple(pl.shape.layers)
    cur = res.objective_ms
    n, V = prob.num_slots, len(layers)

    def out_of_time():
        return work.now() - t_start >= time_limit_s

    # cheapest neighbourhood first: the split's moves (a new evaluator each) only once no swap
    # improves, as the polish's share of a short limit may not see them through
    while not out_of_time():
        improved = False
        for a in range(n):
            if out_of_time():  # one pass is n^2 / 2 evaluations: stop inside it too
                break
            for b in range(a + 1, n):
                if (b & 15) == 0 and out_of_time():
                    break
                p = list(perm)
                p[a], p[b] = p[b], p[a]
                c = prob.cost(p, layers)
                if c < cur - 1e-12:
                    perm, cur, improved = p, c, True
        if improved:
            continue
        if n * (n - 1) // 2 <= DOUBLE_SWAP_PAIRS:
            perm, cur, improved = _double_swap(prob, perm, layers, cur, out_of_time)
            if improved:
                continue
        swaps = [None]
        if (n * (n - 1) // 2 + 1) * V * V <= 20000:  # compound moves only where the
            swaps += [(a, b) for a in range(n) for b in range(a + 1, n)]  # neighbourhood is small
        for sw in swaps:
            if out_of_time():
                break
            p = list(perm)
            if sw is not None:
                p[sw[0]], p[sw[1]] = p[sw[1]], p[sw[0]]
            if not prob.split_free:  # the framework's other splits
                for lay in prob.other_splits(layers):
                    c = prob.cost(p, lay)
                    if c < cur - 1e-12:
                        perm, layers, cur, improved = p, lay, c, True
                continue
            for s in range(V):
                for d in range(V):
                    if out_of_time():  # a new split builds its evaluator: tens of ms
                        break
                    if s != d and layers[s] > 1:
                        lay = list(layers)
                        lay[s] -= 1
                        lay[d] += 1
                        c = prob.cost(p, tuple(lay))
                        if c < cur - 1e-12:
                            perm, layers, cur, improved = p, tuple(lay), c, True
        if not improved:
            break
    return PlacementResult(prob.plan(perm, layers), cur, 0.0, "heuristic", "anneal",
                           work.now() - t_start)


# the polish tries two swaps at once where there are at most this many single swaps (12 slots:
# 66 swaps, 2145 pairs). The example's 1 s warm start (8 slots; anneal(prob, seed=0..5,
# iters=None, time_limit_s=1.0) on its first block, 2026-12-02): with swaps and split moves
# only, 1 of 6 seeds stopped at a local optimum 0.02% above the optimum (42069.47 ms against
# 42061.23); with two swaps tried after the split's moves, 2 of 6 still did (the polish's time
# ran out first); tried before them, 6 of 6 reach it.
DOUBLE_SWAP_PAIRS = 66


def _double_swap(prob: PlacementProblem, perm, layers, cur: float, out_of_time):
    """First improvement among two swaps of disjoint slot pairs: (perm, cost, improved)."""
    n = len(perm)
    swaps = [(a, b) for a in range(n) for b in range(a + 1, n) if perm[a] != perm[b]]
    for i, (a, b) in enumerate(swaps):
        if out_of_time():
            break
        for c, d in swaps[i + 1:]:
            if len({a, b, c, d}) < 4:
                continue
            p = list(perm)
            p[a], p[b] = p[b], p[a]
            p[c], p[d] = p[d], p[c]
            cost = prob.cost(p, layers)
            if cost < cur - 1e-12:
                return p, cost, True
    return perm, cur, False


def _perm_of(prob: PlacementProblem, plan) -> list[int]:
    """Inverse of decode: the node in each (node-stage, node-replica) slot."""
    blk = prob.block
    perm = []
    for a in range(blk.A):
        for b in range(blk.D):
            perm.append(plan.placement.node[a * blk.j][b * blk.k])
    return perm


# the share of the time limit the constructed start may take at most
CONSTRUCT_SHARE = 0.2
# with clock cooling, the start temperature (share of the cost) of a chain from the constructed
# start: it is already good, and a chain started as hot as from the identity walks away from it
# (bench/anneal_vs_paper.py, 128 random nodes at 10 s, every chain at that temperature: 376.5
# ms at 0.02, 363.8 at 0.005, 362.9 at 0.001)
CONSTRUCTED_T0_FRAC = 0.002
# with clock cooling, the share of the time limit kept for the final descent polish
POLISH_SHARE = 0.1
# on GPUs of several types or sizes, the share of moves that move nodes and re-balance the
# split for the new hosts together (PlacementProblem.placed_split)
REBALANCE_SHARE = 0.15
# with clock cooling, the budget one chain needs to be worth a restart: a chain cooled in less
# ends worse than one chain given the whole budget (bench/anneal_vs_paper.py)
CLOCK_CHAIN_S = 5.0
# moves a chain needs to use the full start temperature (t0_frac of the cost)
CLOCK_FULL_MOVES = 5000


def perm_move(rng, perm: list[int], r: float, moves: int = 5) -> list[int]:
    """One random move on the node permutation, chosen by r in [0, 1). `moves=5`: Pipette's
    SA, a fifth of the range each: swap, 2-opt, insert, insert-route, insert-reversed.
    `moves=3` (the iteration-budget mode, as before): swap below 0.5, 2-opt below 0.75,
    insert above."""
    if moves == 3:
        kind = 0 if r < 0.5 else (1 if r < 0.75 else 2)
    else:
        kind = min(4, int(r * 5))
    n = len(perm)
    a, b = sorted(int(x) for x in rng.choice(n, 2, replace=False))
    p = list(perm)
    if kind == 0:  # swap
        p[a], p[b] = p[b], p[a]
    elif kind == 1:  # 2-opt: reverse the segment a..b
        p[a:b + 1] = p[a:b + 1][::-1]
    elif kind == 2:  # insert: move one node to another position
        x = p.pop(a)
        p.insert(b, x)
    else:  # insert-route / insert-reversed: move the run a..b (reversed) elsewhere
        run = p[a:b + 1]
        rest = p[:a] + p[b + 1:]
        if kind == 4:
            run = run[::-1]
        at = int(rng.integers(len(rest) + 1))
        p = rest[:at] + run + rest[at:]
    return p


def _chain(prob: PlacementProblem, *, seed: int = 0, iters: int | None = 4000,
           time_limit_s: float = 10.0, t0_frac: float = 0.02, t_end_frac: float = 1e-5,
           init_perm=None, init_layers=None, move_layers: bool = True,
           progress=None) -> PlacementResult:
    t_start = work.now()
    rng = np.random.default_rng(seed)
    n = prob.num_slots
    perm = list(init_perm) if init_perm is not None else list(range(n))
    layers = tuple(init_layers) if init_layers is not None else prob.start_layers()
    cur = prob.cost(perm, layers)
    best, best_perm, best_layers = cur, list(perm), layers
    if not math.isfinite(cur):
        return PlacementResult(None, float("inf"), 0.0, "infeasible", "anneal",
                               work.now() - t_start)
    t0 = t0_frac * cur
    clock = iters is None
    if clock:
        # a budget that buys few moves starts colder: scale the start temperature by the moves
        # the budget allows (timed on one evaluation of a neighbour) over CLOCK_FULL_MOVES
        t_eval = work.now()
        prob.cost(perm_move(rng, perm, 0.0) if n > 1 else perm, layers)
        per_move_s = max(work.now() - t_eval, 1e-6)
        t0 *= min(1.0, time_limit_s / per_move_s / CLOCK_FULL_MOVES)
    alpha = 1.0 if clock else (t_end_frac / t0_frac) ** (1.0 / max(1, iters))
    ratio = t_end_frac / t0_frac
    temp = t0
    can_move = prob.can_move_split()
    rebalance = move_layers and n > 1 and prob.mixed_gpus and prob.split_free
    rows = prob.block.A
    done = 0
    it = 0
    while clock or it < iters:
        it += 1
        done = it
        work.charge("move")
        # every move: one evaluation can take tens of ms on large clusters (new split)
        elapsed = work.now() - t_start
        if elapsed > time_limit_s:
            break
        if clock:  # geometric in the elapsed share of the budget
            temp = t0 * ratio ** (elapsed / max(time_limit_s, 1e-9))
        new_perm, new_layers = perm, layers
        r = rng.random()
        if rebalance and r < REBALANCE_SHARE / 2:
            # GPUs of several types or sizes: move nodes and re-balance the split for the new
            # hosts in one step (at a fixed split a swap overflows or idles them)
            new_perm = perm_move(rng, perm, rng.random()) if clock else perm_move(
                rng, perm, rng.random(), moves=3)
            new_layers = prob.placed_split(new_perm) or layers
        elif rebalance and r < REBALANCE_SHARE and rows > 1:
            # ... or exchange two node-stage rows, their nodes carrying their layers along
            a, b = (int(x) for x in rng.choice(rows, 2, replace=False))
            new_perm, new_layers = prob.row_swap(perm, layers, a, b)
        elif move_layers and can_move and (r < 0.35 or n == 1):
            new_layers = prob.random_split_move(rng, layers) or layers
        elif n > 1:
            # clock mode: Pipette's five moves; the iteration-budget mode (warm starts) keeps
            # its three, so that its answers stay as they were
            new_perm = (perm_move(rng, perm, rng.random()) if clock
                        else perm_move(rng, perm, r, moves=3))
        if new_perm is perm and new_layers is layers:
            temp *= alpha
            continue
        c = prob.cost(new_perm, new_layers)
        if c <= cur or (math.isfinite(c) and rng.random() < math.exp(-(c - cur) / max(temp,
                                                                                       1e-12))):
            perm, layers, cur = new_perm, new_layers, c
            if c < best:
                best, best_perm, best_layers = c, list(new_perm), new_layers
                if progress:
                    progress(best)
        temp *= alpha
    return PlacementResult(prob.plan(best_perm, best_layers), best, 0.0, "heuristic", "anneal",
                           work.now() - t_start, iterations=done)
