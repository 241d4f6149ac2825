"""Solvers: choose the fastest plan that fits. Exact MILP (HiGHS), simulated annealing, and a
brute-force oracle, all scored by the one cost model in model.estimator."""
