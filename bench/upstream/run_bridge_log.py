"""A Megatron-Bridge training log as Megatron-Bridge's own code prints it, for the log reader's
fixture (run with the Python that has torch, Megatron-Bridge's src/ and a Megatron-LM checkout
on PYTHONPATH, as for run_bridge.py; imports nothing of this project).

What a Bridge job prints of its run: at set-up, on rank 0, the configuration summary
(setup.py maybe_log_and_save_config: ConfigContainer.log_non_default_values); then after each
step `training_log` (src/megatron/bridge/training/utils/train_utils.py, 067f987: its 'Step
Time' line, Megatron's iteration line through print_rank_last, and at the first two steps the
theoretical memory and the '[Rank N] (after K iterations) memory (GB) | ...' line of its
report_memory). This script builds the configuration as run_bridge.py does (build_config: the
emitted recipe and the overrides launch.sh hands it, run with fake_torchrun in torchrun's
place on its first node; runtime_config_update; the vocabulary), sets up what train() reads
(Bridge's GlobalState with that configuration, its timers; the micro-batch calculator as
initialize.py sets it; the learning-rate scheduler as optim.py's _get_scheduler builds it),
prints the summary and runs train()'s sequence for each step: the step count, the consumed
samples, the step's FLOPs by Bridge's flop_utils.num_floating_point_operations into the
running total, the scheduler stepped by a global batch, then training_log with the arguments
train() gives it. Set-up's other lines (model building, its timers) are not printed here.

Stand-ins as run_megatron_log.py's (the clock, 61.2 s then 43.5 s +- 1% seeded; CUDA: tensors
on the CPU, torch.cuda's synchronize and memory_stats, whose figures are the numbers below; the
loss and grad norm; one-process gloo groups, with the job's world size where training_log
divides by it; typing.override; DeepSpeed hidden) and
run_bridge.py's (Transformer Engine as an import-only stand-in, the GPU generation).

usage: python run_bridge_log.py EMITTED_DIR STEPS [OVERRIDE...] > OUT.log
(OVERRIDE: the user's own KEY=VALUE overrides that launch.sh would pass on)
"""

import contextlib
import io
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_megatron_log import STEP_S, Clock, cuda_on_cpu, launch_record  # noqa: E402

sys.modules["deepspeed"] = None  # as in run_megatron_log.py
# torch.cuda.memory_stats() after the first step and later: bytes (Bridge prints GB, 10^9)
MEMORY = {1: {"allocated_bytes.all.current": 41.233e9, "active_bytes.all.current": 41.233e9,
              "inactive_split_bytes.all.current": 1.0214e9, "reserved_bytes.all.current": 78.905e9,
              "allocated_bytes.all.peak": 73.004e9, "active_bytes.all.peak": 73.004e9,
              "inactive_split_bytes.all.peak": 4.1871e9, "reserved_bytes.all.peak": 78.905e9,
              "num_alloc_retries": 0, "allocation.all.current": 3712}}
MEMORY[2] = {**MEMORY[1], "allocated_bytes.all.peak": 75.223e9, "active_bytes.all.peak": 75.223e9,
             "reserved_bytes.all.peak": 80.531e9, "reserved_bytes.all.current": 80.531e9}


RUN_DIR = "/tmp/bridge-run"  # the run's working directory: Bridge's default outputs go there


def main(emitted: str, steps: int, overrides: list[str]) -> None:
    rec = launch_record(os.path.abspath(emitted), overrides)
    os.makedirs(RUN_DIR, exist_ok=True)
    os.chdir(RUN_DIR)  # the summary prints paths under it (nemo_experiments/default/...)
    world = int(rec["launcher"]["nnodes"]) * int(rec["launcher"]["nproc_per_node"])
    import torch
    import torch.distributed as dist
    from run_bridge import _install_stand_ins, build_config

    clock = Clock()
    memory = {"at": MEMORY[1]}
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: 0
    torch.cuda.memory_stats = lambda *a, **k: dict(memory["at"])
    _install_stand_ins()
    with cuda_on_cpu():
        with contextlib.redirect_stdout(io.StringIO()) as built:
            cfg, _ = build_config({"record": rec, "world_size": world, "gpu_arch": 9})
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        import megatron.bridge.training.utils.train_utils as TU
        import megatron.core.timers as mtimers
        from megatron.bridge.training.optim import _get_scheduler
        from megatron.bridge.training.state import GlobalState
        from megatron.bridge.training.utils import flop_utils
        from megatron.core.num_microbatches_calculator import (get_num_microbatches,
                                                               init_num_microbatches_calculator)

        mtimers.time = clock
        TU.datetime = clock.datetime
        TU.get_world_size_safe = lambda: world  # the job's world, not the one-process group
        tr = cfg.train
        init_num_microbatches_calculator(0, tr.rampup_batch_size, tr.global_batch_size,
                                         tr.micro_batch_size, cfg.data_parallel_size,
                                         tr.decrease_batch_size_if_needed)
        state = GlobalState()
        state.cfg = cfg
        timers = state.timers
        opt = type("Optimizer", (), {})()
        opt.param_groups = [{"lr": 0.0, "weight_decay": cfg.optimizer.weight_decay,
                             "is_decoupled_lr": False, "default_config": True}]
        scheduler = _get_scheduler(cfg.optimizer, cfg.scheduler, opt)
        groups = type("ProcessGroups", (), {g: dist.group.WORLD for g in ("mp", "dp", "pp")})()
        cfg.log_non_default_values()  # setup.py, maybe_log_and_save_config, on rank 0
        # what building printed (the tokenizer's padded-vocabulary line), where setup prints
        # it: after the summary
        print(built.getvalue(), end="")
        rng = random.Random(20261203)
        timers("interval-time", log_level=0).start(barrier=True)
        report_memory_flag, total_loss = True, {}
        for it in range(1, steps + 1):
            clock.now += STEP_S[0] if it == 1 else STEP_S[1] * (1 + rng.uniform(-0.01, 0.01))
            memory["at"] = MEMORY[min(it, 2)]
            ts = state.train_state
            ts.step += 1
            batch = cfg.data_parallel_size * tr.micro_batch_size * get_num_microbatches()
            ts.consumed_train_samples += batch
            ts.floating_point_operations_so_far += flop_utils.num_floating_point_operations(
                cfg, batch_size=batch)
            scheduler.step(increment=batch)
            loss = {"lm loss": torch.tensor([10.9 - 0.05 * it + rng.uniform(-0.02, 0.02)])}
            report_memory_flag = TU.training_log(
                loss, total_loss, opt.param_groups[0]["lr"], None, 1.0, report_memory_flag, 0,
                3.2 / it ** 0.5 + rng.uniform(0, 0.1), None, None, cfg, state, None, [],
                pg_collection=groups, loaded_iteration=0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
