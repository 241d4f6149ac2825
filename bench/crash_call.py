"""The call issue 13 reported crashing about half the time, repeated: each run must return a
plan with a status (no traceback).

    python bench/crash_call.py [--runs 20] [--time-limit 60]

GPT 18.4B, global batch 1024, sequence 2048, fp16, no distributed optimizer, on a uniform
cluster of 32 x 8 A100-80GB (150 GB/s NVLink, 12.5 GB/s between nodes), micro-batch 2..32,
1F1B only, full recompute. Prints per run the wall time, termination, objective, bound and any
solver errors the search caught.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from formats.clusters import uniform_cluster  # noqa: E402
from model.specs import JobSpec  # noqa: E402
from solvers.search import solve  # noqa: E402
from solvers.space import SearchSpace  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--time-limit", type=float, default=60.0)
    a = ap.parse_args(argv)
    m = presets.model("gpt-18.4b")
    job = JobSpec(1024, 2048, "fp16", distributed_optimizer=False)
    c = uniform_cluster(32, 8, "A100-80GB", 150.0, 12.5)
    space = SearchSpace(micro_batch=(2, 4, 8, 16, 32), schedules=(("1f1b", 1),),
                        recompute=("full",), distributed_optimizer=(False,))
    ok = 0
    for i in range(a.runs):
        t = time.perf_counter()
        r = solve(m, job, c, time_limit_s=a.time_limit, space=space)
        ok += r.plan is not None
        print(f"run {i + 1:2d}: {time.perf_counter() - t:6.1f} s  {r.termination:10s} "
              f"objective {r.objective_ms:10.1f} ms  bound {r.bound_ms:10.1f} ms  "
              f"errors {len(r.errors)}", flush=True)
    print(f"{ok}/{a.runs} runs returned a plan with a status")


if __name__ == "__main__":
    main()
