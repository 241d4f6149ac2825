"""One shape's placement-and-split problem, scored by the estimator (the one cost model)."""

from __future__ import annotations

import itertools

from model.cluster import ClusterSpec
from model.estimator import Evaluator, default_layers
from model.memory import plan_overheads
from model.plan import Placement, Plan, Shape, framework_splits
from model.specs import JobSpec, ModelSpec, Options

from .bounds import shape_bound_ms
from .space import Block, capacity_split, decode, memory_split, with_layers


def row_caps(cluster, sh: Shape, blk):
    """Per-stage memory caps (GiB) for ways of giving a block's node-stages (its A rows of D
    nodes, j stages each) their GPUs: the nodes sorted by memory and grouped D by D (a row's
    cap is its smallest node's; any other grouping leaves no row more), the largest caps given
    to the first k rows and then to the last ones, for k = 0 .. A: where the stage memory of a
    pipeline peaks, at its first stages (the most micro-batches in flight, the embedding) or
    its last (the output layer and logits). At most A + 1 balanced splits (every order of the
    rows had been up to 4096 of them, 9-24 s for one misfit shape at PP 16)."""
    mems = sorted((nd.gpu.memory_gib for nd in cluster.nodes), reverse=True)
    rows = [mems[(a + 1) * blk.D - 1] for a in range(blk.A)]  # largest first
    seen = set()
    for k in range(blk.A + 1):
        order = list(range(k)) + list(range(blk.A - 1, k - 1, -1))
        caps_of_row = [0.0] * blk.A
        for cap, row in zip(rows, order):
            caps_of_row[row] = cap
        key = tuple(caps_of_row)
        if key in seen:
            continue
        seen.add(key)
        yield [caps_of_row[st // blk.j] for st in range(sh.pp)]


class PlacementProblem:
    """Decisions: the permutation of nodes over the block's A x D slots and the layer split."""

    def __init__(self, model: ModelSpec, job: JobSpec, cluster: ClusterSpec, shape: Shape,
                 block: Block, options: Options):
        self.model, self.job, self.cluster, self.options = model, job, cluster, options
        self.shape = with_layers(shape, shape.layers or (1,) * shape.num_virtual)
        self.block = block
        self._ev: dict[tuple[int, ...], Evaluator] = {}
        self._fits: dict[tuple[int, ...], bool] = {}
        self._bound: float | None = None
        # GPU memory per node (GiB): on a cluster of one memory size a split fits or not
        # wherever it is placed; where sizes differ, a stage fits only on nodes with room for it
        self.caps_gib = [nd.gpu.memory_gib for nd in cluster.nodes]
        self.mixed_memory = len(set(self.caps_gib)) > 1
        self._slot_stages: list[list[int]] | None = None
        self._split_in = None  # placed_split's per-node times and memory events
        # the splits the framework can run, where it partitions by its own rule (DeepSpeed's
        # pipeline engine): the only ones searched then (`fits` refuses every other)
        own = framework_splits(model, job, self.shape)
        self.allowed_splits: tuple[tuple[int, ...], ...] | None = (
            None if own is None else tuple(own))

    @property
    def split_free(self) -> bool:
        """Whether any layer split may be chosen (not only the framework's own)."""
        return self.allowed_splits is None

    def can_move_split(self) -> bool:
        """Whether there is another split to move to (random_split_move)."""
        return (self.shape.num_virtual > 1 if self.split_free else
                len(self.allowed_splits) > 1)

    def other_splits(self, layers: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Where the framework has its own splits: those other than `layers`."""
        return [a for a in self.allowed_splits if a != tuple(layers)]

    def random_split_move(self, rng, layers: tuple[int, ...]) -> tuple[int, ...] | None:
        """One layer moved between two random virtual stages, or, where the framework has its
        own splits, another of them at random (None where the draw moves nothing)."""
        if not self.split_free:
            others = self.other_splits(layers)
            return others[int(rng.integers(len(others)))] if others else None
        V = len(layers)
        if V < 2:
            return None
        src, dst = (int(x) for x in rng.choice(V, 2, replace=False))
        if layers[src] <= 1:
            return None
        lay = list(layers)
        lay[src] -= 1
        lay[dst] += 1
        return tuple(lay)

    @property
    def num_slots(self) -> int:
        return self.block.A * self.block.D

    def evaluator(self, layers: tuple[int, ...]) -> Evaluator:
        ev = self._ev.get(layers)
        if ev is None:
            ev = Evaluator(self.model, self.job, self.cluster, with_layers(self.shape, layers),
                           self.options)
            self._ev[layers] = ev
        return ev

    def fits(self, layers: tuple[int, ...]) -> bool:
        """Whether some placement holds this split in memory. A stage's memory does not
        depend on where it runs; on one memory size it fits everywhere or nowhere, and
        where sizes differ, when the nodes with the most memory take the slots that need the
        most (`memory_perm`)."""
        hit = self._fits.get(layers)
        if hit is None and layers[0] < self.model.first_dense_layers:
            hit = self._fits[layers] = False  # the leading dense layers belong to stage 0
        if hit is None and not self.split_free and tuple(layers) not in self.allowed_splits:
            hit = self._fits[layers] = False  # not a split the framework runs
        if hit is None:
            if self.mixed_memory:
                hit = self.memory_perm(layers) is not None
            else:
                cap = self.caps_gib[0]
                hit = all(mm.total_gib <= cap for mm in self.evaluator(layers).memory)
            self._fits[layers] = hit
        return hit

    def slot_stages(self) -> list[list[int]]:
        """Per slot, the pipeline stages its node hosts (they do not depend on which node
        fills it: space.decode)."""
        if self._slot_stages is None:
            pl = self.placement(list(range(self.num_slots)))
            self._slot_stages = [[] for _ in range(self.num_slots)]
            for s in range(self.shape.pp):
                for r in range(self.shape.cols):
                    self._slot_stages[pl.node[s][r]].append(s)
        return self._slot_stages

    def slot_needs_gib(self, layers: tuple[int, ...]) -> list[float]:
        """Per slot: the memory (GiB) of the most demanding stage its node hosts."""
        mem = [mm.total_gib for mm in self.evaluator(layers).memory]
        return [max(mem[s] for s in st) for st in self.slot_stages()]

    @property
    def mixed_gpus(self) -> bool:
        """GPUs of several types or memory sizes: which stage a node hosts changes the split
        that balances (placed_split)."""
        return self.mixed_memory or len({nd.gpu.name for nd in self.cluster.nodes}) > 1

    def row_swap(self, perm, layers: tuple[int, ...], a: int, b: int):
        """(perm, layers) with the block's node-stage rows a and b exchanged, each row's nodes
        carrying their stages' layer counts along (row a hosts stages a j .. a j + j - 1, in
        every chunk): the mirror of a lopsided plan (the large GPU at the other end, the split
        reversed) in one move, where a swap at a fixed split overflows the small GPUs and a
        re-balanced split (placed_split) is not the lopsided optimum (a helper's fuzzer: the
        annealer ended on such mirror images up to 7.5% above the brute-force optimum)."""
        blk, sh = self.block, self.shape
        perm = list(perm)
        for d in range(blk.D):
            perm[a * blk.D + d], perm[b * blk.D + d] = perm[b * blk.D + d], perm[a * blk.D + d]
        lay = list(layers)
        for c in range(sh.chunks):
            for k in range(blk.j):
                x, y = c * sh.pp + a * blk.j + k, c * sh.pp + b * blk.j + k
                lay[x], lay[y] = lay[y], lay[x]
        return perm, tuple(lay)

    def placed_split(self, perm) -> tuple[int, ...] | None:
        """The split balanced for this placement: layers go one at a time to the virtual stage
        that would finish soonest on its slowest host (forward + backward per layer, the
        embedding and output layer on the first and last), each stage within its smallest
        host's memory. default_layers balances on one GPU type, so on nodes of several a swap
        of nodes at a fixed split overflowed or idled the new hosts, and the annealer, which
        moves placement and split apart, never crossed to the layout that gives a fast node
        more layers (a helper's 3-node A100/H100 case ended 8.4% above the optimum). None
        where the framework fixes its splits or no split fits these hosts."""
        import numpy as np

        from .space import events_gib

        if not self.split_free:
            return None
        sh, m = self.shape, self.model
        p, V = sh.pp, sh.num_virtual
        # per node; placement-free memory events; overheads
        times, (const, coef), ovh = self._split_inputs()
        per, emb, head, cap = [0.0] * p, [0.0] * p, [0.0] * p, [float("inf")] * p
        for slot, stages in enumerate(self.slot_stages()):
            n = int(perm[slot])
            t, e, h = times[n]
            for s in stages:
                per[s], emb[s], head[s] = max(per[s], t), max(emb[s], e), max(head[s], h)
                cap[s] = min(cap[s], self.caps_gib[n])
        layers = [1] * V
        layers[0] = max(1, m.first_dense_layers)
        cur = [const[s] + coef[s] @ np.asarray(layers, dtype=float) for s in range(p)]
        load = [layers[j] * per[j % p] for j in range(V)]
        load[0] += emb[0]
        load[-1] += head[(V - 1) % p]

        def fits(s, c) -> bool:
            return events_gib(c, ovh) <= cap[s]
        if not all(fits(s, cur[s]) for s in range(p)):
            return None
        for _ in range(m.num_layers - sum(layers)):
            ok = [j for j in range(V) if fits(j % p, cur[j % p] + coef[j % p][:, j])]
            if not ok:
                # the time balance filled a stage's memory unevenly over its chunks: the split
                # that balances the hosts' memory instead, where it fits (a seeded H200 + A100
                # interleaved block had found no split here, its optimum (1, 6, 8, 17) fits)
                lay, fit, _s, _need = capacity_split(m, self.job, self.cluster, sh,
                                                     self.options, cap)
                return tuple(lay) if fit else None
            j = min(ok, key=lambda j: (load[j] + per[j % p], -j))
            layers[j] += 1
            load[j] += per[j % p]
            cur[j % p] = cur[j % p] + coef[j % p][:, j]
        return tuple(layers)

    def _split_inputs(self):
        """For placed_split, computed once a problem (the annealer asks on many moves): per
        node, one layer's forward + backward, the embedding's and the output layer's (its
        GPU, its TP ring); the stages' memory events (which do not depend on placement); and
        the memory overheads they are judged with."""
        if self._split_in is None:
            from model.costs import CostModel
            from .space import _events_over_virtual_stages

            sh = self.shape
            costs = CostModel(self.model, self.job, self.cluster, sh, self.options)
            by_kind, times = {}, []
            for nd in self.cluster.nodes:
                # keyed by the node's own TP ring (a measured matrix can slow one node of a
                # type: its times had been another node's of that type)
                ring = nd.ring_gb_per_s(tuple(range(min(sh.tp, nd.num_gpus))))
                key = (nd.gpu.name, ring)
                if key not in by_kind:
                    lt = costs.layer_times(nd.gpu, ring)
                    by_kind[key] = (lt.fwd_ms + lt.bwd_ms, lt.emb_fwd_ms + lt.emb_bwd_ms,
                                    lt.head_fwd_ms + lt.head_bwd_ms)
                times.append(by_kind[key])
            self._split_in = (times, _events_over_virtual_stages(
                self.model, self.job, self.cluster, sh, self.options), plan_overheads(
                self.model, self.job, sh, self.options, self.cluster))
        return self._split_in

    def _neediest_first(self, layers: tuple[int, ...]) -> tuple[list[float], list]:
        """(need per slot, [(slot, node)]): the slots by need and the nodes by memory, both
        largest first, paired in that order (a block has as many slots as nodes)."""
        need = self.slot_needs_gib(layers)
        slots = sorted(range(self.num_slots), key=lambda i: -need[i])
        nodes = sorted(range(len(self.caps_gib)), key=lambda n: -self.caps_gib[n])
        return need, list(zip(slots, nodes))

    def memory_perm(self, layers: tuple[int, ...]) -> list[int] | None:
        """A permutation that holds the split in memory, or None when none does: the nodes
        by memory into the slots by need, largest first (a slot fits a node with at least
        its need: if this matching fails, every matching does)."""
        need, pairs = self._neediest_first(layers)
        perm = [0] * self.num_slots
        for i, n in pairs:
            if need[i] > self.caps_gib[n]:
                return None
            perm[i] = n
        return perm

    def placed_fits(self, perm, layers: tuple[int, ...]) -> bool:
        """Whether this placement holds the split: every stage on nodes with room for it (the
        estimator's rule: a stage's limit is its smallest host's memory)."""
        if not self.fits(layers):
            return False
        if not self.mixed_memory:
            return True
        need = self.slot_needs_gib(layers)
        return all(need[i] <= self.caps_gib[int(n)] for i, n in enumerate(perm))

    def placement(self, perm) -> Placement:
        return decode(self.cluster, self.shape, self.block, perm)

    def cost(self, perm, layers: tuple[int, ...]) -> float:
        if not self.placed_fits(perm, layers):
            return float("inf")
        return self.evaluator(layers).iteration_ms(self.placement(perm))

    def critical_paths(self, perm, layers: tuple[int, ...], replicas=None) -> list:
        """Per replica (all, or those listed): (length in ms, counts per duration kind,
        durations) of the longest path of its schedule graph for plan (perm, layers), tails
        included; the critical-path cuts of the MILP (solvers/milp.py) and of the path search
        (solvers/cutsearch.py)."""
        ev = self.evaluator(layers)
        pl = self.placement(perm)
        tails, _ = ev.tails(pl)
        out = []
        for r in range(self.shape.cols) if replicas is None else replicas:
            dur = ev.replica_durations(pl, r, tails)
            length, counts, _ = ev.cs.critical_path(dur)
            out.append((length, counts, dur))
        return out

    def plan(self, perm, layers) -> Plan:
        return Plan(with_layers(self.shape, layers), self.placement(perm))

    def lower_bound_ms(self) -> float:
        """The shape's closed-form lower bound (solvers.bounds), valid for every placement of
        this block and every split."""
        if self._bound is None:
            self._bound = shape_bound_ms(self.model, self.job, self.cluster, self.shape,
                                         self.options)
        return self._bound

    def start_layers(self) -> tuple[int, ...]:
        """Time-balanced split if it fits, else the memory-balanced one (where memory sizes
        differ: balanced against the memory of the nodes `memory_perm` would give)."""
        if not self.split_free:  # the framework's first split that fits, else its first
            fit = [a for a in self.allowed_splits if self.fits(a)]
            return (fit or list(self.allowed_splits) or [(1,) * self.shape.num_virtual])[0]
        lay = default_layers(self.model, self.job, self.cluster, self.shape, self.options)
        if self.fits(lay):
            return lay
        if self.mixed_memory:
            cand = tuple(capacity_split(self.model, self.job, self.cluster, self.shape,
                                        self.options, self.stage_caps_gib(lay))[0])
            if self.fits(cand):
                return cand
            # which stages need the large GPUs depends on the split: the large GPUs at the
            # pipeline's ends, in every proportion (balanced once against the caps of the
            # time-balanced split, a shape that fits, (2, 1, 2, 3) on 80/40/40/80 GiB, had
            # been called a misfit); none where even the largest GPUs everywhere would not
            # hold a split
            top = max(self.caps_gib)
            if not capacity_split(self.model, self.job, self.cluster, self.shape,
                                  self.options, [top] * self.shape.pp)[1]:
                return cand
            for caps in row_caps(self.cluster, self.shape, self.block):
                nxt, ok, _st, _need = capacity_split(self.model, self.job, self.cluster,
                                                     self.shape, self.options, caps)
                if ok and self.fits(tuple(nxt)):
                    return tuple(nxt)
            return cand
        return memory_split(self.model, self.job, self.cluster, self.shape, self.options)[0]

    def stage_caps_gib(self, layers: tuple[int, ...]) -> list[float]:
        """Per pipeline stage, the memory of its smallest host when the nodes with the most
        memory take the slots whose stages need most under `layers`."""
        got = {i: self.caps_gib[n] for i, n in self._neediest_first(layers)[1]}
        caps = [float("inf")] * self.shape.pp
        for i, st in enumerate(self.slot_stages()):
            for s in st:
                caps[s] = min(caps[s], got[i])
        return caps

    def all_splits(self):
        """Every split with at least one layer per virtual stage (for brute force); the
        framework's own where it fixes one."""
        if not self.split_free:
            yield from self.allowed_splits
            return
        L, V = self.model.num_layers, self.shape.num_virtual
        for cuts in itertools.combinations(range(1, L), V - 1):
            b = (0,) + cuts + (L,)
            yield tuple(b[i + 1] - b[i] for i in range(V))
