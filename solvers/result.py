"""Typed solver results: plan, objective, bound, gap, termination, method, wall time."""

from __future__ import annotations

from dataclasses import dataclass, field

from model.estimator import Estimate
from model.plan import Plan, Shape


@dataclass
class PlacementResult:
    """Best placement and layer split for one shape."""

    plan: Plan | None
    objective_ms: float  # cost-model iteration time of `plan` (inf if none)
    bound_ms: float  # proven lower bound for this shape
    termination: str  # "optimal", "time_limit", "infeasible", "heuristic"
    method: str
    wall_s: float  # seconds of the search's clock (work seconds under model.work's)
    iterations: int = 0
    cuts: list = field(default_factory=list)  # critical-path count vectors found (MILP)
    load_vectors: int = 0  # MILP: load vectors (layers per stage) solved one by one
    layers: tuple | None = None  # placement-relaxed MILP: its optimal split, when it converged

    @property
    def gap(self) -> float:
        if self.plan is None or self.objective_ms == float("inf"):
            return float("inf")
        return max(0.0, (self.objective_ms - self.bound_ms) / self.objective_ms)


@dataclass
class Candidate:
    """A shape considered by the search, and what became of it."""

    describe: str
    lower_bound_ms: float
    quick_ms: float | None = None  # Megatron placement, balanced split
    best_ms: float | None = None
    status: str = ""  # "best", "slower", "does not fit: ...", "pruned by bound", ...
    plan: Plan | None = None
    shape: Shape | None = None
    # a closed-form misfit's share of the layers its stages could hold (bounds.layer_room)
    room: float | None = None

    @property
    def timed_ms(self) -> float | None:
        """Its fastest plan timed: the best found or Megatron-LM's placement (None: neither,
        e.g. pruned by its bound)."""
        return min((t for t in (self.best_ms, self.quick_ms) if t is not None), default=None)

    @property
    def needs_gib(self) -> float:
        """A misfit's memory on its fullest stage with the most memory-balanced split (its
        status "... needs X GiB ..."); inf where the status gives none (a closed-form
        misfit, or a shape that fits)."""
        try:
            return float(self.status.split("needs ")[1].split(" ")[0])
        except (IndexError, ValueError):
            return float("inf")


# the status of a shape the time limit left unsearched before its closed-form bound was known
# (its lower bound counts as 0); solvers.search sets it, SolveResult.shapes_unbounded counts it
NOT_BOUNDED = "not searched (time limit; not bounded, lower bound 0)"


@dataclass
class Beyond:
    """Shapes the default search leaves out (Megatron-FSDP's ZeRO-3, context parallelism
    below space.CP_MIN_SEQ tokens, Megatron-LM's communication overlaps), looked at after the
    search with the time left: how many there are, how many have a closed-form bound below
    the plan's time (could beat it), and the fastest of those with Megatron-LM's placement and
    a split that fits, where faster."""

    label: str
    option: str  # what adds them to the search
    shapes: int = 0
    bounded: int = 0  # shapes bounded before the time ran out
    could_beat: int = 0  # of those bounded
    screened: int = 0
    faster_ms: float | None = None
    faster_shape: str | None = None
    checked: bool = False  # every shape bounded and every one that could beat screened

    def as_dict(self) -> dict:
        return {"label": self.label, "option": self.option, "shapes": self.shapes,
                "bounded": self.bounded, "could_beat": self.could_beat, "screened": self.screened,
                "faster_ms": self.faster_ms, "faster_shape": self.faster_shape,
                "checked": self.checked}

    def describe(self, best_ms: float) -> str:
        if not self.bounded and not self.checked:
            return (f"{self.label}: not searched by default ({self.option} adds it), and "
                    "no time was left to look at its shapes")
        head = (f"{self.label}: not searched by default; of its {self.shapes} shapes"
                + ("" if self.bounded == self.shapes else
                   f" ({self.bounded} bounded before the time ran out)") + ", ")
        if self.faster_ms is not None:
            gain = 100 * (1 - self.faster_ms / best_ms)
            return (head + f"{self.faster_shape} runs {self.faster_ms / 1e3:.3f} s with "
                    f"Megatron-LM's placement, {gain:.1f}% faster than this plan: search "
                    f"with {self.option}")
        if self.could_beat == 0 and self.checked:
            return head + "none can beat this plan (closed-form bounds)"
        return (head + f"{self.could_beat} could beat this plan by their bounds; "
                + (f"none of the {self.screened} screened does with Megatron-LM's placement"
                   if self.screened else "none was screened in the time left")
                + ("" if self.checked or self.bounded < self.shapes else " (time ran out)")
                + f": {self.option} searches them")


@dataclass
class SolveResult:
    plan: Plan | None
    estimate: Estimate | None
    objective_ms: float
    bound_ms: float
    termination: str
    method: str
    wall_s: float
    candidates: list[Candidate] = field(default_factory=list)
    shapes_total: int = 0
    shapes_solved: int = 0
    errors: list[str] = field(default_factory=list)  # solver failures caught, per shape
    # shapes the exact method could not cover with the MILP: annealed, and bounded by the
    # closed form (solvers.bounds) instead of a MILP bound; reason -> shapes
    not_covered: dict[str, int] = field(default_factory=dict)
    # blocks small enough that the exact method tried every placement and split
    blocks_enumerated: int = 0
    # shapes left out because their schedule is longer than the cost model builds
    # (model.plan.MAX_SCHEDULE_SLOTS): the result and its bound cover the others
    shapes_too_long: int = 0
    # "work": the time limit was in work seconds (model.work); work_s is what the search used
    clock: str = "wall"
    work_s: float | None = None
    # option values the user listed that no valid shape has (space.unused_values)
    notes: list[str] = field(default_factory=list)
    # the plan is not a block layout (space.block_of): the bound does not cover its kind
    outside_blocks: bool = False
    # what the default search leaves out (search.beyond_default_space), checked after it
    beyond: list[Beyond] = field(default_factory=list)

    @property
    def proven_note(self) -> str:
        """How far an optimal result's proof reaches: '' where nothing was left out by
        default, else what the bounds also rule out or that the proof is over the searched
        space."""
        if not self.beyond or self.termination != "optimal":
            return ""
        if all(b.checked and b.could_beat == 0 for b in self.beyond):
            return " (also over " + " and ".join(b.label for b in self.beyond) + \
                ", by their bounds)"
        return " over the searched space"

    @property
    def gap(self) -> float:
        if self.plan is None:
            return float("inf")
        return max(0.0, (self.objective_ms - self.bound_ms) / self.objective_ms)

    def runners_up(self, k: int | None = None) -> list[Candidate]:
        """The other shapes that fit: those timed (`Candidate.timed_ms`) in the solver's
        order, then those pruned by their lower bound alone, lowest bound first; the first k."""
        fitting = [c for c in self.candidates
                   if c.status != "best" and not c.status.startswith("does not fit")]
        timed = [c for c in fitting if c.timed_ms is not None]
        bound_only = sorted((c for c in fitting if c.timed_ms is None),
                            key=lambda c: c.lower_bound_ms)
        return (timed + bound_only)[:k]

    @property
    def shapes_unbounded(self) -> int:
        """Shapes the time limit left without their closed-form bound (each counts 0 in
        `bound_ms`)."""
        return sum(c.status == NOT_BOUNDED for c in self.candidates)

    def toss_up(self, high_ms: float) -> tuple[Candidate | None, Candidate | None]:
        """Runners-up inside an interval around the best plan that ends at `high_ms`:
        (the fastest other shape with a plan timed inside it, or None; failing that, the
        shape with the lowest lower bound inside it, none of whose plans was timed inside
        it: a toss-up the search cannot rule out, or None)."""
        others = self.runners_up()
        inside = [c for c in others if c.timed_ms is not None and c.timed_ms <= high_ms]
        if inside:
            return min(inside, key=lambda c: c.timed_ms), None
        maybe = [c for c in others if c.lower_bound_ms <= high_ms]
        return None, min(maybe, key=lambda c: c.lower_bound_ms, default=None)

    def status_dict(self) -> dict:
        return {"method": self.method, "termination": self.termination,
                "objective_ms": self.objective_ms, "bound_ms": self.bound_ms, "gap": self.gap,
                "wall_s": self.wall_s, "shapes_total": self.shapes_total,
                "shapes_solved": self.shapes_solved, "shapes_unbounded": self.shapes_unbounded,
                "errors": list(self.errors),
                "annealed_with_closed_form_bound": dict(self.not_covered),
                "blocks_enumerated": self.blocks_enumerated,
                "shapes_too_long": self.shapes_too_long,
                "clock": self.clock, "work_s": self.work_s,
                "outside_blocks": self.outside_blocks,
                "beyond_default_space": [b.as_dict() for b in self.beyond]}
