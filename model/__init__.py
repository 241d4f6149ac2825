"""The cost model for LLM training plans: specs, plan, schedule graph, per-operation costs,
per-stage memory and the critical-path estimator.

Nothing here reads or writes files (formats/ builds the specs) or imports the solvers, the
launch emitters or the CLI; tests/test_layout.py holds that.
"""
