"""Cost model for LLM training plans: specs, per-stage memory and critical-path iteration time.

Data flows one way: specs (model, job, cluster) -> plan -> cost model (memory, schedule,
estimator). Nothing in this package imports the solvers or the CLI.
"""
