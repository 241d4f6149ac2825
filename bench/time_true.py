"""Does `solve --time-limit T` return within T? Wall time over limit, per call.

    python bench/time_true.py            # built-in example and a 32-node synthetic cluster,
                                         # limits 2, 5, 10 s, methods auto and anneal (~2 min)
    python bench/time_true.py --quick    # built-in example only, limits 2 and 5 s

Calls `solvers.search.solve` as `python cli.py solve` does (inputs built first, not timed; the
solve itself timed from the call to its return, final estimate included) and prints wall / limit
for each, the worst, and how many are within the issue's T + 5%, with the plan's time so that a
fast return that gave up quality shows too.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats import presets  # noqa: E402
from formats.clusters import SynthParams, cluster as load_cluster, synth_cluster  # noqa: E402
from model.specs import JobSpec  # noqa: E402
from solvers.search import solve  # noqa: E402


def instances(quick: bool):
    model = presets.model("llama2-70b")
    job = JobSpec(global_batch=256, seq_length=4096)  # the CLI's built-in example
    yield "built-in example (Llama-2 70B, 8x8 A100)", model, job, load_cluster("example")
    if not quick:
        c = synth_cluster(SynthParams(num_nodes=32, seed=5))
        yield "Llama-2 70B on 32 synthetic nodes", model, job, c


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    limits = (2.0, 5.0) if a.quick else (2.0, 5.0, 10.0)
    ratios = []
    print(f"{'instance':45s} {'method':7s} {'limit s':>7s} {'wall s':>7s} {'wall/limit':>10s} "
          f"{'plan s':>8s} {'gap':>8s} termination")
    for name, model, job, cluster in instances(a.quick):
        for method in ("auto", "anneal"):
            for T in limits:
                t = time.perf_counter()
                r = solve(model, job, cluster, method=method, time_limit_s=T)
                wall = time.perf_counter() - t
                ratios.append(wall / T)
                print(f"{name:45s} {method:7s} {T:7.1f} {wall:7.2f} {wall / T:10.3f} "
                      f"{r.objective_ms / 1e3:8.3f} {r.gap * 100:7.3f}% {r.termination}",
                      flush=True)
    ok = sum(x <= 1.05 for x in ratios)
    print(f"within T + 5%: {ok}/{len(ratios)}; worst wall/limit {max(ratios):.3f}")


if __name__ == "__main__":
    main()
