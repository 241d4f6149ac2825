"""Sweep overhead: tasks per second of the local pool at 1 and 2 workers, and the time per task
beyond the solve itself.

    python bench/sweep_throughput.py [--tasks 40]

The tasks are tiny (the "megatron" baseline of a 24-layer GPT on 2-node synthetic clusters, a
few tens of ms each), so the driver's work shows: dispatch, pickling, one committed SQLite
row per task. Overhead per task = (wall x workers - the tasks' own wall time) / tasks. The
issue's goal: below 50 ms.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats.results import Store  # noqa: E402
from formats.sweepspec import Task, build_inputs  # noqa: E402
from solvers.sweep import run_sweep  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=40)
    args = ap.parse_args()
    tasks = [Task("gpt-1.7b", {"synth": {"num_nodes": 2, "gpus_per_node": 2, "seed": k}},
                  {"global_batch": 16, "seq_length": 1024}, "megatron", 1.0, 0)
             for k in range(args.tasks)]
    print(f"{args.tasks} tasks (megatron baseline, gpt-1.7b, 2 x 2 GPUs)")
    print(f"{'workers':>7} {'wall s':>7} {'tasks/s':>8} {'task s (mean)':>13} "
          f"{'overhead ms/task':>16}")
    for workers in (1, 2):
        with tempfile.TemporaryDirectory() as d:
            store = Store(Path(d) / "s.sqlite")
            t0 = time.perf_counter()
            counts = run_sweep(tasks, store, build_inputs, jobs=workers)
            wall = time.perf_counter() - t0
            own = sum(r["wall_s"] for r in store.rows())
            store.close()
        assert counts["done"] == args.tasks, counts
        over = (wall * workers - own) / args.tasks
        print(f"{workers:7d} {wall:7.2f} {args.tasks / wall:8.2f} {own / args.tasks:13.3f} "
              f"{1e3 * over:16.1f}")


if __name__ == "__main__":
    main()
