"""A DeepSpeed training log as DeepSpeed's own code prints it, for the log reader's fixture (run
with the Python that has deepspeed; imports nothing of this project).

DeepSpeed's engine prints its configuration at start-up (deepspeed/runtime/config.py
DeepSpeedConfig.print, called by the engine on rank 0: '  {name} {dots} {value}', dots 29 -
len(name)) and, every steps_per_print global steps, its ThroughputTimer's line
(deepspeed/utils/timer.py ThroughputTimer.stop: 'epoch=../micro_step=../global_step=..,
RunningAvgSamplesPerSec=.., CurrSamplesPerSec=.., MemAllocated=..GB, MaxMemAllocated=..GB'),
both through DeepSpeed's logger. The engine starts the timer at each micro-batch's forward and
stops it at each step(), a global step at the gradient-accumulation boundary
(deepspeed/runtime/engine.py forward and step).

This script parses an emitted ds_config.json with DeepSpeedConfig (as run_deepspeed.py does:
a stand-in for the model-parallel unit that reports the data-parallel size, and for the
process group of rank 0), prints it with DeepSpeedConfig.print, and drives a ThroughputTimer
built as the engine builds it (the config's timers section, train_batch_size,
steps_per_print) through the engine's start/stop sequence. Stand-ins, and nothing else: the
clock the timer reads (deepspeed.utils.timer.time) advances by the step times given (micro
steps of an even share of 5.5 s, +- 1%, seeded), and the accelerator's memory figures are the
numbers given (no GPU here).

usage: python run_deepspeed_log.py DS_CONFIG.json DP STEPS > OUT.log
"""

import random
import sys

from run_deepspeed import _DataParallelOnly


class Clock:
    """time.time() for deepspeed.utils.timer: advanced by the micro steps."""

    def __init__(self):
        self.now = 1.7e9

    def time(self):
        return self.now


def main(path: str, dp: int, steps: int) -> None:
    import deepspeed.runtime.config as dsc
    import deepspeed.utils.timer as timer
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.utils import set_log_level_from_string

    # what the launch set's warnings ask of train.py: DeepSpeed's logger at INFO (0.17.6 and
    # later create it at WARNING, which hides both prints)
    set_log_level_from_string("info")
    dsc.dist.get_rank = lambda *a, **k: 0
    cfg = DeepSpeedConfig(path, mpu=_DataParallelOnly(dp))
    cfg.print("DeepSpeedEngine configuration")
    clock = Clock()
    timer.time = clock
    acc = get_accelerator()
    acc.memory_allocated = lambda *a, **k: 31.2 * 2 ** 30
    acc.max_memory_allocated = lambda *a, **k: 61.4 * 2 ** 30
    acc.synchronize = lambda *a, **k: None
    # as DeepSpeedEngine.__init__ builds it (engine.py: ThroughputTimer(self._config.
    # timers_config, batch_size=self.train_batch_size(), steps_per_output=
    # self.steps_per_print(), monitor_memory=False))
    tput = timer.ThroughputTimer(cfg.timers_config, batch_size=cfg.train_batch_size,
                                 steps_per_output=cfg.steps_per_print, monitor_memory=False)
    rng = random.Random(14)
    ga = cfg.gradient_accumulation_steps
    for _step in range(steps):
        step_s = 5.5 * (1 + rng.gauss(0, 0.01))
        for k in range(ga):
            tput.start()
            clock.now += step_s / ga
            tput.stop(global_step=k == ga - 1, report_speed=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
