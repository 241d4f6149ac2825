"""`calibrate`'s log reader on real training logs: BigScience's 2021 Megatron-LM and
Megatron-DeepSpeed runs on Jean Zay's V100 nodes (bigscience-workshop/bigscience,
experiments/gpt2-*/*.out), every log there that prints Megatron's arguments block.

    python bench/historical_logs.py [--repo GIT_DIR]

GIT_DIR: a clone or snapshot of bigscience-workshop/bigscience (default: the tool library's
mirror, /work/.mirror/bigscience-workshop+bigscience/repo). For each log it prints what
`formats.logs.read_log` finds (timing readings used and skipped as warm-up, the arguments block,
DeepSpeed's ZeRO stage and pipeline partition) and the plan `calibrate --cluster` reads back
from the arguments (formats/megatron_args.py) on a cluster of the run's size, 4 V100 32 GB per
node (the links are placeholders: the plan read does not depend on them, and nothing is
estimated), then calibrate's check of the log against that plan (formats/runs.py
check_logged_args: every arguments block, DeepSpeed's printed configuration). The logs'
times are not used: they are a published measurement set, kept apart from calibration and
tests; this reads their format only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from formats.clusters import uniform_cluster  # noqa: E402
from formats.logs import read_log  # noqa: E402
from formats.megatron_args import plan_from_megatron_args  # noqa: E402
from formats.runs import check_logged_args  # noqa: E402
from model.errors import SpecError  # noqa: E402

MIRROR = "/work/.mirror/bigscience-workshop+bigscience/repo"
GPUS_PER_NODE = 4  # Jean Zay's V100 nodes (jz/hpc-specs.md: 261 nodes, 1044 V100 32 GB)


def logs_with_arguments(repo: str) -> list[str]:
    """Paths (in the repository) of the experiment logs that print an arguments block."""
    out = subprocess.run(["git", "--git-dir", repo, "grep", "-l", "--",
                          "-------- arguments --------", "HEAD", "--", "experiments"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(line.split(":", 1)[1] for line in out.splitlines() if line.endswith(".out"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", default=MIRROR)
    a = ap.parse_args()
    if not Path(a.repo).exists():
        print(f"{a.repo}: no snapshot of bigscience-workshop/bigscience here; give its git "
              "directory with --repo", file=sys.stderr)
        return 2
    paths = logs_with_arguments(a.repo)
    read = planned = checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            local = Path(tmp) / Path(path).name
            local.write_bytes(subprocess.run(["git", "--git-dir", a.repo, "show",
                                              f"HEAD:{path}"], capture_output=True,
                                             check=True).stdout)
            try:
                r = read_log(local)
            except SpecError as e:
                print(f"{path}\n    refused: {str(e).split(': ', 2)[-1]}")
                continue
            read += 1
            args = r.megatron_args[-1]
            ds = (f"; DeepSpeed ZeRO {r.deepspeed_zero}, partition {list(r.deepspeed_layers)}"
                  if r.deepspeed_zero is not None else "")
            print(f"{path}\n    {r.framework}: {len(r.values)} readings used, {r.skipped} "
                  f"warm-up skipped; {len(args)} arguments; vocabulary {r.padded_vocab}{ds}")
            world = int(args.get("world_size", "0"))
            c = uniform_cluster(max(1, world // GPUS_PER_NODE), GPUS_PER_NODE, "V100-32GB",
                                100.0, 12.5)
            try:
                m, job, plan = plan_from_megatron_args(
                    args, c, source=path, vocab=r.padded_vocab, deepspeed_zero=r.deepspeed_zero,
                    deepspeed_layers=r.deepspeed_layers)
            except SpecError as e:
                print(f"    plan refused: {e.field}: {str(e).split(': ', 3)[-1]}")
                continue
            planned += 1
            print(f"    plan: {m.num_layers} x {m.hidden_size}, {m.num_heads} heads, "
                  f"{job.precision}, {job.attention} attention, {job.framework}; "
                  f"{plan.shape.describe()}; layers {list(plan.shape.layers)}")
            try:  # calibrate's check of the log against the plan (every block, DeepSpeed's)
                check_logged_args(r, m, job, plan, "read from its arguments")
                checked += 1
            except SpecError as e:
                print(f"    check against the plan refused it: {e.field}")
            if r.deepspeed_config:
                print(f"    DeepSpeed's configuration print: {r.deepspeed_config}")
    print(f"\n{len(paths)} logs with an arguments block: {read} read, {planned} plans read back, "
          f"{checked} pass calibrate's check against their plan")
    return 0


if __name__ == "__main__":
    sys.exit(main())
