"""A Megatron-LM training log as Megatron-LM's own code prints it, for the log reader's fixture
(run with the Python that has torch, from anywhere; imports nothing of this project).

What a Megatron-LM job prints from the training loop's start to its last logged step comes from
three of its functions (megatron/training/training.py, d98e8a6): `print_datetime('before the
start of training step')`, then after each step `training_log` (the iteration line through
print_rank_last; at the first steps, with report_memory_flag, report_theoretical_memory on rank
0 and report_memory's '[Rank N] (after K iterations) memory (MB) | ...' line; then the timers).
This script runs those functions from the checkout, in the order and with the arguments the
loop `train` gives them (after pretrain's 'training ...'), on what an emitted launch set
starts: launch.sh run with bench/upstream/fake_torchrun in torchrun's place, on its first
node, with the user's own arguments after it, gives the environment it exports, the
arguments it passes pretrain_gpt.py and the world size (--nnodes x --nproc_per_node). Those
arguments go through Megatron's parse_args / validate_args and its set_global_variables
(tokenizer, timers, micro-batch calculator). The learning rate is Megatron's
OptimizerParamScheduler (get_optimizer_param_scheduler from the arguments), stepped by a
global batch a step as train_step steps it; the throughput is Megatron's
num_floating_point_operations.

Stand-ins, and nothing else (no GPU here, CPU torch, one process):
- the clock: time.time in megatron.core.timers and datetime.now in training.py read a clock
  that each step advances by its step time (61.2 s, then 43.5 s +- 1%, seeded);
- CUDA: tensors Megatron asks for on 'cuda' are made on the CPU (a TorchFunctionMode), and
  torch.cuda's synchronize / current_device / memory counters are replaced: the memory
  figures are the numbers given below (a 70B stage's reserved peak, about 73 GiB);
- the loss, grad norm and loss scale a step returns (numbers, seeded);
- the process groups: a one-process gloo group stands for the model-parallel and
  data-parallel groups, so the lines printed are those of rank 0, which is also the last rank;
- Python 3.11: typing.override (3.12) is a no-op decorator (PEP 698);
- DeepSpeed, in the same environment for other checks, is hidden (it is not Megatron's);
- run_megatron.py's (gpu_stand_ins): a Hopper GPU's generation, Transformer Engine's RoPE kernel.

usage: python run_megatron_log.py MEGATRON_DIR EMITTED_DIR STEPS [ARG...] > OUT.log
(ARG: the user's own arguments that launch.sh would pass on)
"""

import json
import os
import random
import re
import subprocess
import sys
import tempfile
import typing
from datetime import datetime as _datetime
from datetime import timezone

if not hasattr(typing, "override"):
    typing.override = lambda f: f
# the upstream environment also holds DeepSpeed, which a library Megatron imports would load,
# and whose accelerator probe prints a time-stamped line: not there on a Megatron-LM machine
sys.modules["deepspeed"] = None

HERE = os.path.dirname(os.path.abspath(__file__))
STEP_S = (61.2, 43.5)  # the first step (start-up), then the others, +- 1%
MIB = 2 ** 20
# (allocated, max allocated, reserved, max reserved) in MiB after the first step and later
MEMORY_MIB = {1: (40211.5, 67340.2, 72104.0, 72104.0), 2: (41867.3, 69218.8, 74650.0, 74650.0)}


class Clock:
    """time.time() for Megatron's timers, advanced by the steps; `datetime` a datetime class
    whose now() reads it (UTC), for the modules that stamp their lines."""

    def __init__(self):
        self.now = 1.7648e9  # 2025-12-03 22:13:20 UTC
        clock = self

        class Now(_datetime):
            @classmethod
            def now(cls, tz=None):
                return _datetime.fromtimestamp(clock.now, timezone.utc).replace(tzinfo=None)

        self.datetime = Now

    def time(self):
        return self.now


def launch_record(folder: str, extra: list[str]) -> dict:
    """What the emitted launch.sh starts on its first node, recorded by fake_torchrun."""
    with open(os.path.join(folder, "launch.sh")) as f:
        node = re.search(r"^  (\S+)\) CUDA_VISIBLE_DEVICES", f.read(), re.M).group(1)
    with tempfile.TemporaryDirectory() as shim:
        os.symlink(os.path.join(HERE, "fake_torchrun"), os.path.join(shim, "torchrun"))
        rec = os.path.join(shim, "record.json")
        env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "NODE_NAME": node,
               "UPSTREAM_RECORD": rec}
        env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        subprocess.run(["bash", os.path.join(folder, "launch.sh"), *extra], env=env, check=True)
        with open(rec) as f:
            return json.load(f)


def cuda_on_cpu():
    """A TorchFunctionMode that makes the tensors Megatron asks for on a CUDA device on the CPU."""
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            dev = kwargs.get("device")
            if isinstance(dev, int) or (dev is not None and torch.device(dev).type == "cuda"):
                kwargs["device"] = "cpu"
            return func(*args, **kwargs)

    return CudaOnCpu()


def main(megatron: str, emitted: str, steps: int, extra: list[str]) -> None:
    rec = launch_record(emitted, extra)
    world = int(rec["launcher"]["nnodes"]) * int(rec["launcher"]["nproc_per_node"])
    sys.path.insert(0, megatron)
    os.environ.update({**rec["env"], "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world)})
    import torch
    import torch.distributed as dist

    clock = Clock()
    memory = {"at": MEMORY_MIB[1]}
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: 0
    torch.cuda.memory_allocated = lambda *a, **k: memory["at"][0] * MIB
    torch.cuda.max_memory_allocated = lambda *a, **k: memory["at"][1] * MIB
    torch.cuda.memory_reserved = lambda *a, **k: memory["at"][2] * MIB
    torch.cuda.max_memory_reserved = lambda *a, **k: memory["at"][3] * MIB
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    import megatron.core.timers as mtimers
    import megatron.training.training as T
    from megatron.training import arguments as A
    from megatron.training.global_vars import get_args, get_timers, set_global_variables

    from run_megatron import gpu_stand_ins

    gpu_stand_ins(9)  # validate_args on a Hopper GPU, as run_megatron.py runs it

    mtimers.time = clock
    T.datetime = clock.datetime
    sys.argv = [rec["script"]] + rec["args"]
    with cuda_on_cpu():
        args = A.parse_args()
        A.validate_args(args, {})
        set_global_variables(args)
        args = get_args()
        timers = get_timers()
        opt = type("Optimizer", (), {})()
        opt.param_groups = [{"lr": 0.0, "weight_decay": args.weight_decay,
                             "default_config": True}]
        scheduler = T.get_optimizer_param_scheduler(opt)
        groups = type("ProcessGroups", (), {"mp": dist.group.WORLD, "dp": dist.group.WORLD})()
        rng = random.Random(20261203)
        print("training ...", flush=True)  # train's caller, pretrain, prints it (print_rank_0)
        timers("interval-time", log_level=0).start(barrier=True)
        T.print_datetime("before the start of training step")
        report_memory_flag, total_loss = True, {}
        for it in range(1, steps + 1):
            clock.now += STEP_S[0] if it == 1 else STEP_S[1] * (1 + rng.uniform(-0.01, 0.01))
            memory["at"] = MEMORY_MIB[min(it, 2)]
            batch = args.micro_batch_size * args.data_parallel_size * T.get_num_microbatches()
            args.consumed_train_samples += batch
            scheduler.step(increment=batch)
            loss = {"lm loss": torch.tensor([10.9 - 0.05 * it + rng.uniform(-0.02, 0.02)])}
            report_memory_flag = T.training_log(
                loss, total_loss, T.get_canonical_lr_for_logging(opt.param_groups), it, 1.0,
                report_memory_flag, 0, 3.2 / it ** 0.5 + rng.uniform(0, 0.1), None, None, None,
                pg_collection=groups, is_first_iteration=it == 1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:])
