"""The work clock (model/work.py): a search limited in work seconds takes the same decisions
however slow the machine is, so its result (plan, time, bound, termination) is reproducible
even when the budget, not a proof, ends it."""

import time

import pytest

from formats import presets
from formats.clusters import SynthParams, synth_cluster
from model import work
from model.estimator import estimate
from model.specs import JobSpec
from solvers.linear import LinearModel, lsum
from solvers.search import solve


def _instance():
    """Four nodes with a degraded NIC: the exact search does not converge in 3 work-s."""
    cl = synth_cluster(SynthParams(num_nodes=4, seed=0, nic_gb_per_s=12.5,
                                   oversubscription=2.0, degraded=1, degraded_factor=0.4))
    return presets.model("gpt-3.6b"), JobSpec(128, 2048, "bf16"), cl


def _key(r):
    return (r.plan.shape.describe(), r.plan.placement, r.objective_ms, r.bound_ms,
            r.termination, r.shapes_solved, r.work_s)


@pytest.mark.parametrize("method", ["exact", "anneal"])
def test_a_budget_stopped_search_is_the_same_on_a_slow_machine(method, monkeypatch):
    m, job, cl = _instance()
    fast = solve(m, job, cl, method=method, time_limit_s=3.0, clock="work")
    assert fast.termination != "optimal"  # the budget ended it, not a proof
    assert fast.clock == "work" and fast.work_s is not None
    assert estimate(m, job, cl, fast.plan).iteration_ms == pytest.approx(fast.objective_ms)
    # the same search on a machine slowed down everywhere it does counted work
    real_charge = work.charge
    slept = [0.0]

    def slow_charge(kind, n=1.0):
        time.sleep(1e-4)
        slept[0] += 1e-4
        real_charge(kind, n)

    monkeypatch.setattr(work, "charge", slow_charge)
    slow = solve(m, job, cl, method=method, time_limit_s=3.0, clock="work")
    assert _key(slow) == _key(fast)
    # it was slowed down (by at least this much sleep; other noise aside), and nothing changed
    assert slept[0] >= 0.25


def test_meter_counts_only_inside_metered():
    assert not work.metering()
    t = work.now()
    work.charge("mip_node", 1e9)  # outside: nothing counted, the wall clock reads
    assert abs(work.now() - t) < 60
    with work.metered():
        assert work.now() == 0.0
        work.charge("highs_call", 2)
        assert work.now() == pytest.approx(2 * work.PRICE_S["highs_call"])
        with work.metered():  # nested: the same meter
            work.charge("highs_call")
        assert work.counts() == {"highs_call": 3}
    assert not work.metering()


def test_highs_node_limit_is_the_work_clocks_time_limit():
    """Under the work clock HiGHS gets a node limit instead of a time limit, and stopping at
    it is a 'time_limit' status with the incumbent and the dual bound (a knapsack that needs
    branching)."""
    lm = LinearModel("knapsack", "highs")
    w = [31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 101]
    x = [lm.var(0, 1, integer=True) for _ in w]
    z = lm.var(-1e6, 1e6)
    lm.add(lsum(wi * xi for wi, xi in zip(w, x)) <= 500)
    lm.add(z == lsum(-(wi + (i % 3)) * xi for i, (wi, xi) in enumerate(zip(w, x))))
    lm.minimize(z)
    with work.metered():
        res = lm.solve(0.001, 1e-9)  # less than one node's price: one node allowed
        used = work.counts()
    assert used["highs_call"] == 1 and used.get("mip_node", 0) >= 1
    full = LinearModel.__new__(LinearModel)  # the same model solved to optimality
    full.__dict__.update({k: v for k, v in lm.__dict__.items() if k != "_solver"})
    full._solver = None
    opt = full.solve(60.0, 1e-9)
    assert opt.status == "optimal"
    if res.status == "optimal":  # presolve and the root closed it: nothing to check
        assert res.objective == pytest.approx(opt.objective)
    else:
        assert res.status == "time_limit"
        assert res.bound <= opt.objective + 1e-6
        assert res.objective is None or res.objective >= opt.objective - 1e-6
