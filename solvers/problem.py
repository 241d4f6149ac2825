"""One shape's placement-and-split problem, scored by the estimator (the one cost model)."""

from __future__ import annotations

import itertools

from model.cluster import ClusterSpec
from model.estimator import Evaluator, default_layers
from model.plan import Placement, Plan, Shape
from model.specs import JobSpec, ModelSpec, Options

from .bounds import shape_bound_ms
from .space import Block, decode, memory_split, with_layers


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
        """Memory is placement-independent on a cluster with one GPU type."""
        hit = self._fits.get(layers)
        if hit is None and layers[0] < self.model.first_dense_layers:
            hit = self._fits[layers] = False  # the leading dense layers belong to stage 0
        if hit is None:
            ev = self.evaluator(layers)
            cap = min(nd.gpu.memory_gib for nd in self.cluster.nodes)
            hit = all(mm.total_gib <= cap for mm in ev.memory)
            self._fits[layers] = hit
        return hit

    def placement(self, perm) -> Placement:
        return decode(self.cluster, self.shape, self.block, perm)

    def cost(self, perm, layers: tuple[int, ...]) -> float:
        if not self.fits(layers):
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
        """Time-balanced split if it fits, else the memory-balanced one."""
        lay = default_layers(self.model, self.job, self.cluster, self.shape, self.options)
        if self.fits(lay):
            return lay
        return memory_split(self.model, self.job, self.cluster, self.shape, self.options)[0]

    def all_splits(self):
        """Every split with at least one layer per virtual stage (for brute force)."""
        L, V = self.model.num_layers, self.shape.num_virtual
        for cuts in itertools.combinations(range(1, L), V - 1):
            b = (0,) + cuts + (L,)
            yield tuple(b[i + 1] - b[i] for i in range(V))
