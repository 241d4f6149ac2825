"""Exact placement and layer split for one shape: a MILP on HiGHS (through Pyomo), with the
schedule's critical paths added as cuts until the MILP agrees with the estimator.

Formulation (one shape, one block layout of A node-stages x D node-replicas; see space.py):

Sets      N nodes; slots (a, b), a < A, b < D; virtual stages j < V; stages s < p.
Variables x[n,a,b] in {0,1}: node n hosts slot (a, b).
          l[j] integer >= 1: layers of virtual stage j; beta[j,k] its binary digits.
          w[n,m,e,b] >= 0: x[n,a,b] * x[m,a',b] for each node-stage edge e = (a, a') that a
          pipeline hop crosses; y[n,m,a,b] >= 0: x[n,a,b] * x[m,a,b+1 mod D] (data-parallel ring).
          u[a] >= 0: 1 / bandwidth of node-stage a's data-parallel ring; z[j,k] = beta[j,k] u[a].
          tail[s], T >= 0.
Objective min T (ms).
Constraints
  assign:     sum_{a,b} x[n,a,b] = 1;  sum_n x[n,a,b] = 1.
  product:    sum_m w[n,m,e,b] = x[n,a,b];  sum_n w[n,m,e,b] = x[m,a',b]   (tight form; with
              integral x it forces w to the product). Same for y.
  ring:       u[a] >= sum_{n,m} y[n,m,a,b] / (k * bw[n,m]) for every b (the slowest link);
              u[a] >= 1 / intra ring bandwidth when a node holds several replicas.
  split:      sum_j l[j] = L;  l[j] = 1 + sum_k 2^k beta[j,k];  z[j,k] >= u[a] - U (1 - beta).
  memory:     for every moment of the schedule that can be a stage's peak (schedule.
              inflight_profile), bytes of weights + grads + optimizer + stored activations
              (+ recompute working memory) <= (GPU GiB - context) / (1 + fragmentation).
  tail:       tail[s] >= sync_s + optimizer_s (sync exposed minus the last backward with
              --overlap-grad-reduce), sync_s = sigma * params_s * u[a] + lambda, linear through z.
  paths:      T >= counts_pi . durations_b for every generated critical path pi and every b,
              durations linear in l, w and tail (model.schedule: a path's length is linear in the
              durations of the operation kinds it visits).
Symmetry: rotating node-replica labels maps solutions to solutions of equal cost, so the
smallest-index host of node-stage 0 is fixed to b = 0.

Loop: solve, rebuild the plan, score it with the estimator; if the estimator's time exceeds the
MILP objective, add the critical path of every replica as a cut and solve again. The MILP with a
subset of paths is a relaxation, so its bound is a valid lower bound throughout, and at
termination the objective equals the estimator's time of the returned plan.
"""

from __future__ import annotations

import math
import time

import numpy as np

from model.costs import INTRA_LATENCY_US, adam_bytes_per_param
from model.errors import SolverUnavailableError
from model.memory import GIB

from .problem import PlacementProblem
from .result import PlacementResult


def milp_supported(prob: PlacementProblem) -> str | None:
    """None if the MILP applies, else why not (the caller falls back to annealing)."""
    c = prob.cluster
    if not c.homogeneous:
        return "mixed GPU types or GPU counts (the annealer handles them)"
    if any(nd.intra_matrix_gb_per_s is not None for nd in c.nodes):
        return "non-uniform intra-node links (the annealer handles them)"
    return None


def solve_milp(prob: PlacementProblem, *, time_limit_s: float = 60.0, max_rounds: int = 200,
               seed_solutions=(), progress=None, mip_rel_gap: float = 1e-4,
               relax_placement: bool = False, initial_cuts=(),
               integral_layers: bool = True, neighbor_cuts: int = 8) -> PlacementResult:
    """Optimal placement and split for `prob`'s shape and block.

    With `relax_placement`, there are no placement variables: every inter-node pipeline transfer
    costs the cheapest inter-node transfer of the cluster and the data-parallel ring runs at the
    best rate this block layout could give. Durations only shrink, and the critical path is
    monotone in them, so the optimum over layer splits is a lower bound for every placement of
    this block; search.py prunes shapes with the smallest over blocks. The plan is then None.
    `integral_layers=False` (relaxation only) lets layer counts be fractional: a weaker bound
    that solves as a linear program."""
    try:
        import pyomo.environ as pyo
        from pyomo.contrib.solver.common.factory import SolverFactory
        from pyomo.contrib.solver.common.results import TerminationCondition as TC
    except ImportError as e:  # pragma: no cover
        raise SolverUnavailableError(f"Pyomo is not installed ({e})") from None
    t_start = time.perf_counter()
    why = milp_supported(prob)
    if why:
        raise SolverUnavailableError(f"MILP does not apply: {why}")
    opt = SolverFactory("highs")
    if not opt.available():
        raise SolverUnavailableError("HiGHS is not available; pip install highspy")

    sh, blk, cl = prob.shape, prob.block, prob.cluster
    p, v, V, L = sh.pp, sh.chunks, sh.num_virtual, prob.model.num_layers
    A, D, j_per, k = blk.A, blk.D, blk.j, blk.k
    N = cl.num_nodes
    start_layers = prob.start_layers()
    ev0 = prob.evaluator(start_layers)
    K = ev0.kinds
    costs, mem = ev0.costs, ev0.mem
    node0 = cl.nodes[0]
    gpu = node0.gpu
    ring_tp = node0.ring_gb_per_s(tuple(range(sh.tp)))
    lt = costs.layer_times(gpu, ring_tp)
    cap_bytes = (gpu.memory_gib - prob.options.overheads.context_gib) / (
        1 + prob.options.overheads.fragmentation) * GIB

    # ---- parameters -----------------------------------------------------------------------
    def stage_of(j):
        return j % p

    def nstage(s):
        return s // j_per

    fF = [lt.fwd_ms] * V
    fB = [lt.bwd_ms] * V
    eF = [costs.virtual_stage_ms(gpu, ring_tp, j, 0)[0] for j in range(V)]
    eB = [costs.virtual_stage_ms(gpu, ring_tp, j, 0)[1] for j in range(V)]
    hop_C = costs.hop_matrix_ms()
    intra_hop = costs.node_hop_ms(0, 0)
    n_hops = p if v > 1 else p - 1
    hop_edge = {}  # physical hop h -> node-stage edge (a, a2) or None if inside a node
    for h in range(n_hops):
        a, a2 = nstage(h), nstage((h + 1) % p)
        hop_edge[h] = None if a == a2 else (a, a2)
    edges = sorted({e for e in hop_edge.values() if e is not None})
    zero = tuple([0] * V)
    P_gpu = prob.model.params_per_layer / sh.tp
    E_s = [costs.stage_params(s, zero) for s in range(p)]
    d = sh.dp
    grad_b, weight_b = prob.job.grad_bytes, prob.job.weight_bytes
    sigma = ((grad_b + weight_b) if sh.distributed_optimizer else 2 * grad_b) * (d - 1) / d / 1e6
    inter_ring = D > 1
    lat_us = cl.latency_us if inter_ring else INTRA_LATENCY_US
    lam = 2 * (d - 1) * lat_us / 1e3 if d > 1 else 0.0
    opt_coef = adam_bytes_per_param(prob.job) / (
        (d if sh.distributed_optimizer else 1) * gpu.hbm_gb_per_s * 1e6)
    ovh = prob.options.overheads.latency_overhead_ms
    inv_intra = 1.0 / node0.ring_gb_per_s(tuple(range(k))) if k > 1 else 0.0
    bw = cl.inter_gb_per_s
    with np.errstate(divide="ignore"):
        inv_ring = np.where(np.eye(N, dtype=bool), 0.0, 1.0 / (k * bw))
    U = max(inv_ring.max(), inv_intra) if inter_ring else inv_intra
    if relax_placement:  # this block, cheapest links: every inter-node hop at the minimum
        off = ~np.eye(N, dtype=bool)
        hop_min_inter = float(hop_C[off].min()) if N > 1 else math.inf
        u_min = max(inv_intra, float(inv_ring[off].min())) if inter_ring else inv_intra
        U = u_min
    # the ring's inverse bandwidth is a constant unless node-replicas form an inter-node ring;
    # only then is l[j] * u[a] a product that needs the binary expansion
    u_const = None
    if relax_placement:
        u_const = u_min
    elif not inter_ring:
        u_const = inv_intra
    nbits = max(1, math.ceil(math.log2(L - V + 2))) if u_const is None else 0

    # ---- model ------------------------------------------------------------------------------
    M = pyo.ConcreteModel("placement")
    M.N = pyo.RangeSet(0, N - 1)
    M.S = pyo.Set(initialize=[(a, b) for a in range(A) for b in range(D)], dimen=2)
    M.J = pyo.RangeSet(0, V - 1)
    M.P = pyo.RangeSet(0, p - 1)
    if not relax_placement:
        M.x = pyo.Var(M.N, M.S, domain=pyo.Binary)
    integral = integral_layers or not relax_placement
    M.l = pyo.Var(M.J, domain=pyo.Integers if integral else pyo.Reals, bounds=(1, L - V + 1))
    M.beta = pyo.Var(M.J, range(nbits), domain=pyo.Binary)
    M.tail = pyo.Var(M.P, domain=pyo.NonNegativeReals)
    M.T = pyo.Var(domain=pyo.NonNegativeReals)

    if not relax_placement:
        M.node_once = pyo.Constraint(M.N, rule=lambda M, n: sum(M.x[n, a, b] for a, b in M.S)
                                     == 1)
        M.slot_once = pyo.Constraint(M.S, rule=lambda M, a, b: sum(M.x[n, a, b] for n in M.N)
                                     == 1)
    M.total_layers = pyo.Constraint(expr=sum(M.l[j] for j in M.J) == L)
    if nbits:
        M.digits = pyo.Constraint(M.J, rule=lambda M, j: M.l[j] == 1 + sum(
            2 ** q * M.beta[j, q] for q in range(nbits)))

    # products for pipeline edges
    W_idx = [] if relax_placement else [
        (n, m, e, b) for e in range(len(edges)) for b in range(D) for n in range(N)
        for m in range(N) if n != m]
    M.w = pyo.Var(W_idx, domain=pyo.NonNegativeReals, bounds=(0, 1))
    M.w_row = pyo.ConstraintList()
    for e, (a, a2) in ([] if relax_placement else enumerate(edges)):
        for b in range(D):
            for n in range(N):
                M.w_row.add(sum(M.w[n, m, e, b] for m in range(N) if m != n) == M.x[n, a, b])
                M.w_row.add(sum(M.w[m, n, e, b] for m in range(N) if m != n) == M.x[n, a2, b])

    def hop_expr(h, b, backward):
        e = hop_edge[h]
        if relax_placement:
            return intra_hop if e is None else hop_min_inter
        if e is None:
            return intra_hop
        ei = edges.index(e)
        if backward:
            return sum(hop_C[m, n] * M.w[n, m, ei, b] for n in range(N) for m in range(N)
                       if n != m)
        return sum(hop_C[n, m] * M.w[n, m, ei, b] for n in range(N) for m in range(N) if n != m)

    # data-parallel ring per node-stage
    M.u = pyo.Var(range(A), domain=pyo.NonNegativeReals)
    M.ring = pyo.ConstraintList()
    if relax_placement:
        for a in range(A):
            M.ring.add(M.u[a] == u_min)
        D = 1  # one representative pipeline: all have the same relaxed durations
    elif inter_ring:
        Y_idx = [(n, m, a, b) for a in range(A) for b in range(D) for n in range(N)
                 for m in range(N) if n != m]
        M.y = pyo.Var(Y_idx, domain=pyo.NonNegativeReals, bounds=(0, 1))
        for a in range(A):
            for b in range(D):
                b2 = (b + 1) % D
                for n in range(N):
                    M.ring.add(sum(M.y[n, m, a, b] for m in range(N) if m != n) == M.x[n, a, b])
                    M.ring.add(sum(M.y[m, n, a, b] for m in range(N) if m != n) ==
                               M.x[n, a, b2])
                M.ring.add(M.u[a] >= sum(inv_ring[n, m] * M.y[n, m, a, b] for n in range(N)
                                         for m in range(N) if n != m))
            if k > 1:
                M.ring.add(M.u[a] >= inv_intra)
    else:
        for a in range(A):
            M.ring.add(M.u[a] == inv_intra)

    M.z = pyo.Var(M.J, range(nbits), domain=pyo.NonNegativeReals)
    M.zdef = pyo.ConstraintList()
    for j in range(V):
        a = nstage(stage_of(j))
        for q in range(nbits):
            M.zdef.add(M.z[j, q] >= M.u[a] - U * (1 - M.beta[j, q]))

    def params_expr(s):
        return E_s[s] + P_gpu * sum(M.l[j] for j in range(V) if stage_of(j) == s)

    def lu_expr(j):  # l[j] * u[a], exact at the optimum (z minimal)
        if u_const is not None:
            return u_const * M.l[j]
        a = nstage(stage_of(j))
        return M.u[a] + sum(2 ** q * M.z[j, q] for q in range(nbits))

    def sync_expr(s):
        if d <= 1:
            return 0.0
        a = nstage(s)
        ua = u_const if u_const is not None else M.u[a]
        return sigma * (E_s[s] * ua + P_gpu * sum(lu_expr(j) for j in range(V)
                                                      if stage_of(j) == s)) + lam

    def F(j):
        return fF[j] * M.l[j] + eF[j]

    def B(j):
        return fB[j] * M.l[j] + eB[j]

    M.tails = pyo.ConstraintList()
    for s in range(p):
        opt_s = opt_coef * params_expr(s) + ovh
        if prob.options.overlap_grad_reduce:
            M.tails.add(M.tail[s] >= sync_expr(s) - B(s) + opt_s)
            M.tails.add(M.tail[s] >= opt_s)
        else:
            M.tails.add(M.tail[s] >= sync_expr(s) + opt_s)

    # memory at every candidate peak
    M.memory = pyo.ConstraintList()
    per_param = sum(mem.bytes_per_param)
    for s in range(p):
        seen = set()
        for kind, _c, counts in ev0.cs.inflight_profile(s):
            key = (kind, tuple(counts))
            if key in seen:
                continue
            seen.add(key)
            act = 0
            for c, cnt in enumerate(counts):
                if cnt:
                    jj = c * p + s
                    act = act + int(cnt) * (mem.act_layer * M.l[jj] + mem.chunk_act_bytes(jj, 0))
            work = mem.work if kind == "B" else 0.0
            # in GiB: bytes would put coefficients near 1e10 and upset HiGHS's tolerances
            M.memory.add((per_param * params_expr(s) + act + work) / GIB <= cap_bytes / GIB)

    # symmetry: rotate node-replicas so the lowest-index host of node-stage 0 is in b = 0
    M.sym = pyo.ConstraintList()
    if D > 1 and not relax_placement:
        for b in range(1, D):
            M.sym.add(sum(n * M.x[n, 0, 0] for n in range(N)) <=
                      sum(n * M.x[n, 0, b] for n in range(N)))

    M.cuts = pyo.ConstraintList()
    seen_cuts: set[bytes] = set()
    cut_list: list[np.ndarray] = []

    def add_cut(counts: np.ndarray):
        key = counts.tobytes()
        if key in seen_cuts:
            return False
        seen_cuts.add(key)
        cut_list.append(counts)
        for b in range(D):
            expr = 0
            for jj in range(V):
                if counts[K.F(jj)]:
                    expr = expr + counts[K.F(jj)] * F(jj)
                if counts[K.B(jj)]:
                    expr = expr + counts[K.B(jj)] * B(jj)
            for h in range(n_hops):
                if counts[K.xf(h)]:
                    expr = expr + counts[K.xf(h)] * hop_expr(h, b, False)
                if counts[K.xb(h)]:
                    expr = expr + counts[K.xb(h)] * hop_expr(h, b, True)
            for s in range(p):
                if counts[K.tail(s)]:
                    expr = expr + counts[K.tail(s)] * M.tail[s]
            M.cuts.add(M.T >= expr)
        return True

    def cuts_from(perm, layers):
        ev = prob.evaluator(tuple(layers))
        pl = prob.placement(perm)
        tails, _ = ev.tails(pl)
        added = 0
        for r in range(sh.dp):
            _, counts, _ = ev.cs.critical_path(ev.replica_durations(pl, r, tails))
            added += add_cut(counts)
        return added

    for counts in initial_cuts:  # paths found on another block or the relaxation stay valid
        if len(counts) == K.size:
            add_cut(np.asarray(counts, dtype=float))
    if relax_placement:
        hop_cost = [intra_hop if hop_edge[h] is None else hop_min_inter for h in range(n_hops)]
        return _relaxed_loop(M, opt, TC, prob, ev0, start_layers, add_cut, fF, fB, eF, eB,
                             hop_cost, n_hops, E_s, P_gpu, sigma, lam, u_min, opt_coef, ovh,
                             time_limit_s, t_start, max_rounds, mip_rel_gap, cut_list)
    best_ms, best_plan = float("inf"), None
    seeds = list(seed_solutions) or [(list(range(N)), start_layers)]
    for perm, lay in seeds:
        cuts_from(perm, lay)
        c = prob.cost(perm, tuple(lay))
        if c < best_ms:
            best_ms, best_plan = c, prob.plan(perm, tuple(lay))
    M.obj = pyo.Objective(expr=M.T, sense=pyo.minimize)

    bound = 0.0
    termination = "time_limit"
    rounds = 0
    while rounds < max_rounds:
        rounds += 1
        left = time_limit_s - (time.perf_counter() - t_start)
        if left <= 0.05:
            break
        res = _highs_solve(opt, M, TC, left, mip_rel_gap)
        tc = res.termination_condition
        if tc in (TC.provenInfeasible, TC.infeasibleOrUnbounded):
            if best_plan is None:
                return PlacementResult(None, float("inf"), float("inf"), "infeasible", "milp",
                                       time.perf_counter() - t_start, rounds)
            break
        if res.objective_bound is not None and math.isfinite(res.objective_bound):
            bound = max(bound, float(res.objective_bound))
        if res.incumbent_objective is None:
            break
        res.solution_loader.load_vars()
        perm = [0] * (A * D)
        for n in range(N):
            for a, b in M.S:
                if pyo.value(M.x[n, a, b]) > 0.5:
                    perm[a * D + b] = n
        lay = tuple(int(round(pyo.value(M.l[j]))) for j in range(V))
        true_ms = prob.cost(perm, lay)
        milp_ms = float(res.incumbent_objective)
        if true_ms < best_ms:
            best_ms, best_plan = true_ms, prob.plan(perm, lay)
            if progress:
                progress(best_ms, bound)
        optimal_here = tc == TC.convergenceCriteriaSatisfied
        # HiGHS solves to its feasibility tolerance (1e-7): agreement is judged at 1e-7 relative
        agrees = true_ms <= milp_ms * (1 + 1e-7) + 1e-9
        if agrees:
            if optimal_here:  # the bound stays HiGHS's dual bound, not the incumbent
                termination = "optimal"
                break
            if best_ms - bound <= 1e-9 * best_ms:
                termination = "optimal"
                break
            continue  # time limit inside HiGHS; loop ends on the next check
        if not cuts_from(perm, lay):  # cannot happen if the cost model is linear as claimed
            raise RuntimeError("critical path already present but MILP underestimates")
        # paths of nearby plans too (one swap, one layer moved): fewer rounds of re-solving
        rng = np.random.default_rng(rounds)
        for _ in range(neighbor_cuts):
            p2, l2 = list(perm), list(lay)
            if len(p2) > 1 and rng.random() < 0.6:
                a_, b_ = rng.choice(len(p2), 2, replace=False)
                p2[a_], p2[b_] = p2[b_], p2[a_]
            else:
                s_, d_ = rng.choice(V, 2, replace=False) if V > 1 else (0, 0)
                if l2[s_] > 1 and s_ != d_:
                    l2[s_] -= 1
                    l2[d_] += 1
            if prob.fits(tuple(l2)):
                cuts_from(p2, tuple(l2))
    if best_plan is not None and best_ms - bound <= mip_rel_gap * best_ms:
        termination = "optimal"
        bound = min(bound, best_ms)
    return PlacementResult(best_plan, best_ms, min(bound, best_ms), termination, "milp",
                           time.perf_counter() - t_start, rounds, cut_list)


def _highs_solve(opt, M, TC, time_limit_s: float, mip_rel_gap: float):
    """One HiGHS solve. HiGHS occasionally rejects its own optimum after presolve ("claims
    optimality, but with primal infeasibilities": status error); it is solved again without
    presolve, which has not shown the problem. PIPETTE_TEE=1 in the environment prints HiGHS's
    log."""
    import os

    tee = bool(os.environ.get("PIPETTE_TEE"))
    opts = {"mip_rel_gap": mip_rel_gap, "random_seed": 0}
    res = opt.solve(M, time_limit=time_limit_s, load_solutions=False, tee=tee,
                    raise_exception_on_nonoptimal_result=False, solver_options=opts)
    if res.termination_condition == TC.error:
        res = opt.solve(M, time_limit=time_limit_s, load_solutions=False, tee=tee,
                        raise_exception_on_nonoptimal_result=False,
                        solver_options=dict(opts, presolve="off"))
    if res.termination_condition == TC.error:
        raise SolverUnavailableError("HiGHS reported a solve error on the placement MILP")
    return res


def _relaxed_loop(M, opt, TC, prob, ev0, start_layers, add_cut, fF, fB, eF, eB, hop_cost,
                  n_hops, E_s, P_gpu, sigma, lam, u_min, opt_coef, ovh, time_limit_s, t_start,
                  max_rounds, mip_rel_gap, cut_list) -> PlacementResult:
    """Cut loop for the placement relaxation: durations are known functions of the split."""
    import pyomo.environ as pyo

    sh = prob.shape
    K, p, V, d = ev0.kinds, sh.pp, sh.num_virtual, sh.dp

    def durations(lay):
        dur = np.zeros(K.size)
        for j in range(V):
            dur[K.F(j)] = fF[j] * lay[j] + eF[j]
            dur[K.B(j)] = fB[j] * lay[j] + eB[j]
        for h in range(n_hops):
            dur[K.xf(h)] = dur[K.xb(h)] = hop_cost[h]
        for s in range(p):
            params = E_s[s] + P_gpu * sum(lay[j] for j in range(V) if j % p == s)
            sync = sigma * params * u_min + lam if d > 1 else 0.0
            if prob.options.overlap_grad_reduce:
                sync = max(0.0, sync - dur[K.B(s)])
            dur[K.tail(s)] = sync + opt_coef * params + ovh
        return dur

    if prob.fits(start_layers):
        add_cut(ev0.cs.critical_path(durations(start_layers))[1])
    M.obj = pyo.Objective(expr=M.T, sense=pyo.minimize)
    bound, termination, rounds = 0.0, "time_limit", 0
    while rounds < max_rounds:
        rounds += 1
        left = time_limit_s - (time.perf_counter() - t_start)
        if left <= 0.05:
            break
        res = _highs_solve(opt, M, TC, left, mip_rel_gap)
        tc = res.termination_condition
        if tc in (TC.provenInfeasible, TC.infeasibleOrUnbounded):
            return PlacementResult(None, float("inf"), float("inf"), "infeasible",
                                   "milp-relaxed", time.perf_counter() - t_start, rounds,
                                   cut_list)
        if res.objective_bound is not None and math.isfinite(res.objective_bound):
            bound = max(bound, float(res.objective_bound))
        if res.incumbent_objective is None or tc != TC.convergenceCriteriaSatisfied:
            break
        res.solution_loader.load_vars()
        lay = tuple(float(pyo.value(M.l[j])) for j in range(V))
        if M.l[0].domain is pyo.Integers:
            lay = tuple(int(round(x)) for x in lay)
        length, counts, _ = ev0.cs.critical_path(durations(lay))
        if length <= float(res.incumbent_objective) * (1 + 1e-7) + 1e-9:
            termination = "optimal"
            break  # `bound` already holds HiGHS's dual bound of this relaxation
        add_cut(counts)
    return PlacementResult(None, float("inf"), bound, termination, "milp-relaxed",
                           time.perf_counter() - t_start, rounds, cut_list)
