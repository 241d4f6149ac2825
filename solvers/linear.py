"""A small linear-model layer under the placement MILP: affine expressions (`Lin`), a model that
collects columns and rows (`LinearModel`), and two ways to hand it to HiGHS.

- `backend="highs"`: straight into highspy's matrix API. The placement-relaxed bounding models
  are solved hundreds of times per search (a cut loop per shape); through Pyomo's persistent
  interface its bookkeeping took about three times HiGHS's own solve time (cProfile of
  `bench/uniform_clusters.py`, GPT-3 175B on 64 nodes: 10.8 s of 14.3 s in 387 solves, plus
  6.2 s building 32 models), so these go direct.
- `backend="pyomo"`: the same rows as a Pyomo model solved by Pyomo's HiGHS interface. The
  full placement MILP, built a few times per search, is solved this way (offline, its three
  rounds on the built-in example took 3.1 / 6.1 / 5.9 s this way and 2.7 / 5.2 / 4.7 s
  direct; whole solves differed within the machine's noise).

Both give the same numbers (tests/test_solvers.py solves models through both). The
formulation itself (solvers/milp.py) is written once, against `LinearModel`.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass

import numpy as np

from model import work
from model.errors import SolverUnavailableError

# Work clock (model.work): HiGHS's time limit becomes a node limit, at the price of a node
# with its LP iterations (about 20 per node on the relaxed models, 270 on the full ones:
# the runs model.work's prices were fitted to)
ITERS_PER_NODE = {"highs": 20, "pyomo": 270}


class Lin:
    """An affine expression: sum of coef x column, plus a constant."""

    __slots__ = ("terms", "const")
    __hash__ = None  # `==` builds a row

    def __init__(self, terms: dict[int, float] | None = None, const: float = 0.0):
        self.terms = terms if terms is not None else {}
        self.const = float(const)

    @staticmethod
    def of(x) -> "Lin":
        return x if isinstance(x, Lin) else Lin(None, float(x))

    def copy(self) -> "Lin":
        return Lin(dict(self.terms), self.const)

    def iadd(self, other, scale: float = 1.0) -> "Lin":
        """self += scale x other, in place (long sums without copying)."""
        if isinstance(other, Lin):
            t = self.terms
            for c, v in other.terms.items():
                t[c] = t.get(c, 0.0) + scale * v
            self.const += scale * other.const
        else:
            self.const += scale * float(other)
        return self

    def __add__(self, other):
        return self.copy().iadd(other)

    __radd__ = __add__

    def __sub__(self, other):
        return self.copy().iadd(other, -1.0)

    def __rsub__(self, other):
        return Lin.of(other).copy().iadd(self, -1.0)

    def __neg__(self):
        return Lin({c: -v for c, v in self.terms.items()}, -self.const)

    def __mul__(self, k):
        if isinstance(k, Lin):
            if k.terms and self.terms:
                raise TypeError("product of two non-constant expressions is not linear")
            k, other = (k.const, self) if not k.terms else (self.const, k)
            return other * k
        k = float(k)
        return Lin({c: k * v for c, v in self.terms.items()}, k * self.const)

    __rmul__ = __mul__

    def __truediv__(self, k):
        return self * (1.0 / float(k))

    def __ge__(self, other):
        d = self - other
        return Row(d.terms, -d.const, math.inf)

    def __le__(self, other):
        d = self - other
        return Row(d.terms, -math.inf, -d.const)

    def __eq__(self, other):
        d = self - other
        return Row(d.terms, -d.const, -d.const)


def lsum(items) -> Lin:
    """sum() of expressions and numbers, accumulated in place."""
    out = Lin()
    for x in items:
        out.iadd(x)
    return out


@dataclass
class Row:
    """lb <= sum terms <= ub."""

    terms: dict[int, float]
    lb: float
    ub: float


@dataclass
class SolveResult:
    """What one solve reports. status: 'optimal', 'infeasible', 'time_limit', 'other'.
    objective: the incumbent's value (None without one); bound: the dual bound (None without
    one); values: the incumbent's column values."""

    status: str
    objective: float | None
    bound: float | None
    values: np.ndarray | None


class LinearModel:
    """Columns (bounds, integrality) and rows, minimizing one column. Rows and bound changes
    made after the first solve go straight to the backend's model (cut loops)."""

    def __init__(self, name: str, backend: str = "highs"):
        if backend not in ("highs", "pyomo"):
            raise ValueError(f"unknown backend {backend!r}")
        self.name, self.backend = name, backend
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.integer: list[bool] = []
        self.rows: list[Row] = []
        self.objective_col: int | None = None
        self._solver = None

    @property
    def num_cols(self) -> int:
        return len(self.lb)

    def var(self, lb: float = 0.0, ub: float = math.inf, integer: bool = False) -> Lin:
        if self._solver is not None:
            raise RuntimeError("a model's columns are fixed once it has been solved")
        c = len(self.lb)
        self.lb.append(float(lb))
        self.ub.append(float(ub))
        self.integer.append(bool(integer))
        return Lin({c: 1.0})

    def vars(self, keys, lb: float = 0.0, ub: float = math.inf,
             integer: bool = False) -> dict:
        return {k: self.var(lb, ub, integer) for k in keys}

    def add(self, row: Row) -> None:
        if not isinstance(row, Row):
            raise TypeError("add() takes a row (expr <= / >= / == expr)")
        self.rows.append(row)
        if self._solver is not None:
            self._solver.add_rows([row])

    def minimize(self, x: Lin) -> None:
        (c,) = x.terms
        self.objective_col = c

    def set_bounds(self, x: Lin, lb: float, ub: float) -> None:
        (c,) = x.terms
        self.lb[c], self.ub[c] = float(lb), float(ub)
        if self._solver is not None:
            self._solver.set_bounds(c, self.lb[c], self.ub[c])

    def _nnz(self) -> int:
        return sum(len(r.terms) for r in self.rows)

    def _node_price_s(self) -> float:
        """Work seconds of one branch-and-bound node with its LP iterations (model.work)."""
        P, n = work.PRICE_S, ITERS_PER_NODE[self.backend]
        if self.backend == "highs":
            return P["mip_node"] + n * P["simplex_iter"]
        return n * (P["pyomo_iter"] + P["pyomo_iter_nnz"] * self._nnz())

    def solve(self, time_limit_s: float, mip_rel_gap: float) -> SolveResult:
        """One solve, clamped to a positive time limit. HiGHS occasionally rejects its own
        optimum after presolve ('claims optimality, but with primal infeasibilities'); such a
        solve is repeated without presolve. PIPETTE_TEE=1 in the environment prints HiGHS's
        log."""
        if self._solver is None:
            self._solver = (_Highs if self.backend == "highs" else _Pyomo)(self)
        opts = {"mip_rel_gap": mip_rel_gap, "random_seed": 0}
        limit = max(0.01, float(time_limit_s))
        opts["mip_max_nodes"] = _MAX_INT
        work_s = None  # the call's share in work seconds, under the work clock
        if work.metering():  # deterministic: no wall-clock limit, a node limit instead
            opts["mip_max_nodes"] = max(1, int(limit / self._node_price_s()))
            work_s, limit = limit, WORK_WALL_LIMIT_S
        res = self._solver.solve(limit, opts, work_s)
        if res is None:
            res = self._solver.solve(limit, dict(opts, presolve="off"), work_s)
        if res is None:
            raise SolverUnavailableError(f"HiGHS reported a solve error on the {self.name} "
                                         "model")
        return res


# the wall-clock limit HiGHS gets under the work clock: none that a search would reach
WORK_WALL_LIMIT_S = 1e7
_MAX_INT = 2**31 - 1  # HiGHS's default node limit (none)


def _charge(info, pyomo_nnz: int = 0) -> None:
    """Count one HiGHS run's work (model.work): a small model's by its calls, iterations and
    nodes; the full model's (through Pyomo, `pyomo_nnz` nonzeros) by its size."""
    iters = max(0, int(info.simplex_iteration_count))
    if pyomo_nnz:
        work.charge("pyomo_nnz", pyomo_nnz)
        work.charge("pyomo_iter", iters)
        work.charge("pyomo_iter_nnz", iters * pyomo_nnz)
        return
    work.charge("highs_call")
    work.charge("simplex_iter", iters)
    work.charge("mip_node", max(0, int(info.mip_node_count)))


class _WorkInterrupt:
    """HiGHS's MIP-interrupt callback under the work clock: counts HiGHS's limit checks and
    interrupts the solve once fixed_s + checks x per_check_s passes limit_s."""

    def __init__(self, limit_s: float, fixed_s: float, per_check_s: float):
        self.limit_s, self.fixed_s, self.per_check_s = limit_s, fixed_s, per_check_s
        self.checks, self.fired = 0, False

    def __call__(self, e) -> None:
        self.checks += 1
        if self.fixed_s + self.checks * self.per_check_s > self.limit_s:
            self.fired = True
            e.interrupt()


def _quiet_banner(highspy) -> None:
    """The first Highs object of a process prints HiGHS's banner from C++ on file descriptor 1
    (whatever output_flag says), which corrupted `solve --json` output: that one is created
    with fd 1 pointing at /dev/null (PIPETTE_TEE=1 keeps it)."""
    if _state["banner"] or _tee():
        return
    sys.stdout.flush()
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)
    _state["banner"] = True


_state = {"banner": False}


def _tee() -> bool:
    return bool(os.environ.get("PIPETTE_TEE"))


class _Highs:
    """The model in a highspy.Highs object, passed once as a CSR matrix, then changed
    incrementally."""

    def __init__(self, lm: LinearModel):
        try:
            import highspy
        except ImportError as e:  # pragma: no cover
            raise SolverUnavailableError(f"HiGHS is not installed ({e}); pip install highspy") \
                from None
        self.hs, self.lm = highspy, lm
        _quiet_banner(highspy)
        h = self.h = highspy.Highs()
        h.setOptionValue("output_flag", _tee())
        inf = highspy.kHighsInf
        n = lm.num_cols
        lp = highspy.HighsLp()
        lp.num_col_ = n
        lp.num_row_ = 0
        cost = np.zeros(n)
        cost[lm.objective_col] = 1.0
        lp.col_cost_ = cost
        lp.col_lower_ = np.maximum(np.array(lm.lb), -inf)
        lp.col_upper_ = np.minimum(np.array(lm.ub), inf)
        if any(lm.integer):
            lp.integrality_ = [highspy.HighsVarType.kInteger if i else
                               highspy.HighsVarType.kContinuous for i in lm.integer]
        h.passModel(lp)
        self.mip = any(lm.integer)
        self.add_rows(lm.rows)

    def _b(self, x: float) -> float:
        inf = self.hs.kHighsInf
        return min(max(x, -inf), inf)

    def add_rows(self, rows) -> None:
        if not rows:
            return
        work.charge("row_direct", len(rows))
        starts, idx, val = [], [], []
        for r in rows:
            starts.append(len(idx))
            for c, v in r.terms.items():
                if v != 0.0:
                    idx.append(c)
                    val.append(v)
        self.h.addRows(len(rows), np.array([self._b(r.lb) for r in rows]),
                       np.array([self._b(r.ub) for r in rows]), len(idx),
                       np.array(starts, dtype=np.int32), np.array(idx, dtype=np.int32),
                       np.array(val, dtype=float))

    def set_bounds(self, c: int, lb: float, ub: float) -> None:
        self.h.changeColBounds(c, self._b(lb), self._b(ub))

    def solve(self, limit: float, opts: dict, work_s: float | None = None
              ) -> SolveResult | None:
        h, hs = self.h, self.hs
        h.setOptionValue("time_limit", limit)
        h.setOptionValue("presolve", opts.get("presolve", "choose"))
        h.setOptionValue("mip_rel_gap", float(opts["mip_rel_gap"]))
        h.setOptionValue("random_seed", int(opts["random_seed"]))
        h.setOptionValue("mip_max_nodes", int(opts["mip_max_nodes"]))
        h.run()
        ms = h.getModelStatus()
        S = hs.HighsModelStatus
        info = h.getInfo()
        _charge(info)
        if ms in (S.kSolveError, S.kLoadError, S.kModelError, S.kPresolveError,
                  S.kPostsolveError):
            return None
        # a node limit is the work clock's time limit
        status = ("optimal" if ms == S.kOptimal else
                  "infeasible" if ms in (S.kInfeasible, S.kUnboundedOrInfeasible) else
                  "time_limit" if ms in (S.kTimeLimit, S.kSolutionLimit) else "other")
        has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
        obj = float(info.objective_function_value) if has_sol else None
        if self.mip:
            b = float(info.mip_dual_bound)
            bound = b if math.isfinite(b) and abs(b) < 1e300 else None
        else:
            bound = obj if status == "optimal" else None
        values = np.asarray(h.getSolution().col_value, dtype=float) if has_sol else None
        return SolveResult(status, obj, bound, values)


class _Pyomo:
    """The model as a Pyomo ConcreteModel, solved through Pyomo's persistent HiGHS interface."""

    def __init__(self, lm: LinearModel):
        try:
            import pyomo.environ as pyo
            from pyomo.contrib.solver.common.factory import SolverFactory
            from pyomo.contrib.solver.common.results import TerminationCondition
        except ImportError as e:  # pragma: no cover
            raise SolverUnavailableError(f"Pyomo is not installed ({e})") from None
        self.pyo, self.TC, self.lm = pyo, TerminationCondition, lm
        import highspy
        _quiet_banner(highspy)
        self.opt = SolverFactory("highs")
        if not self.opt.available():
            raise SolverUnavailableError("HiGHS is not available; pip install highspy")
        M = self.M = pyo.ConcreteModel(lm.name)
        M.x = pyo.VarList()
        for c in range(lm.num_cols):
            self.add_col(c)
        M.rows = pyo.ConstraintList()
        self.add_rows(lm.rows)
        M.obj = pyo.Objective(expr=M.x[lm.objective_col + 1], sense=pyo.minimize)

    def add_col(self, c: int) -> None:
        pyo, lm = self.pyo, self.lm
        v = self.M.x.add()  # VarList indices start at 1
        v.domain = pyo.Integers if lm.integer[c] else pyo.Reals
        self.set_bounds(c, lm.lb[c], lm.ub[c])

    def add_rows(self, rows) -> None:
        from pyomo.core.expr.numeric_expr import LinearExpression

        work.charge("row_pyomo", len(rows))
        x = self.M.x
        for r in rows:
            items = [(c, v) for c, v in r.terms.items() if v != 0.0]
            e = LinearExpression([v * x[c + 1] for c, v in items]) if items else 0.0
            lb = None if math.isinf(r.lb) else r.lb
            ub = None if math.isinf(r.ub) else r.ub
            if lb is not None and lb == ub:
                self.M.rows.add(e == lb)
            else:
                self.M.rows.add((lb, e, ub))

    def set_bounds(self, c: int, lb: float, ub: float) -> None:
        v = self.M.x[c + 1]
        v.setlb(None if math.isinf(lb) else lb)
        v.setub(None if math.isinf(ub) else ub)

    def solve(self, limit: float, opts: dict, work_s: float | None = None
              ) -> SolveResult | None:
        """`work_s`: the call's share under the work clock (None: the wall clock's `limit`)."""
        TC = self.TC
        stop = None
        nnz = self.lm._nnz() if work_s is not None else 0
        if work_s is not None:
            # the work clock: besides the node limit, HiGHS's limit checks (deterministic
            # points of its root and tree search) are counted and the solve interrupted once
            # they, priced by the model's size, pass its share: the root of a large model
            # can otherwise take many times the share (model.work)
            if self.opt._solver_model is None:
                self.opt.set_instance(self.M)
            stop = _WorkInterrupt(limit_s=work_s,
                                  fixed_s=work.PRICE_S["pyomo_nnz"] * nnz,
                                  per_check_s=work.PRICE_S["pyomo_check_nnz15"] * nnz ** 1.5)
            self.opt._solver_model.cbMipInterrupt.subscribe(stop)
        # Pyomo warns of HiGHS's interrupt status, which is ours (above)
        pyomo_log = logging.getLogger("pyomo.contrib.solver.solvers.highs")
        level = pyomo_log.level
        if stop is not None:
            pyomo_log.setLevel(logging.ERROR)
        try:
            res = self.opt.solve(
                self.M, time_limit=limit, load_solutions=False, tee=_tee(),
                raise_exception_on_nonoptimal_result=False,
                solver_options=opts)
        finally:
            if stop is not None:
                self.opt._solver_model.cbMipInterrupt.unsubscribe(stop)
                pyomo_log.setLevel(level)
        _charge(self.opt._solver_model.getInfo(), pyomo_nnz=nnz)
        tc = res.termination_condition
        if tc == TC.error:
            return None
        # a node limit (Pyomo: iterationLimit) or an interrupt is the work clock's time limit
        status = ("optimal" if tc == TC.convergenceCriteriaSatisfied else
                  "infeasible" if tc in (TC.provenInfeasible, TC.infeasibleOrUnbounded) else
                  "time_limit" if tc in (TC.maxTimeLimit, TC.iterationLimit) or (
                      stop is not None and stop.fired) else "other")
        obj = None if res.incumbent_objective is None else float(res.incumbent_objective)
        b = res.objective_bound
        bound = float(b) if b is not None and math.isfinite(b) else None
        values = None
        if obj is not None:
            res.solution_loader.load_vars()
            x = self.M.x
            values = np.array([x[c + 1].value if x[c + 1].value is not None else 0.0
                               for c in range(self.lm.num_cols)])
        return SolveResult(status, obj, bound, values)
