"""torchtitan's training-step lines as its own code prints them, for the log reader's fixture
(run with the Python that has torch, from anywhere; imports nothing of this project).

torchtitan (v0.2.2: torchtitan/components/metrics.py) logs one line per logged step from
MetricsProcessor.log: step, loss, grad norm, the allocator's reserved peak (GiB and % of the
device), tokens per second per device (tps), TFLOP/s and MFU, through torchtitan's logger
(torchtitan/tools/logging.py init_logger: '[titan] time - root - INFO - message'); train.py
logs 'Training starts at step N' first. This script runs that method and that logger from the
torchtitan checkout given, over a loop that stands in for the training steps. Stand-ins, and
nothing else: the clock MetricsProcessor reads (time.perf_counter) and the log records' time
advance by the step times given (1.35 s a step, the first 9.8 s, +- 1% seeded), so the lines
carry training-scale rates from a CPU run; the device memory monitor returns the reserved peak
given (61.27 GiB of an H100's 79.11 GiB, as torch reports its total memory) instead of
torch.cuda.memory_stats; the peak FLOP/s is what torchtitan's get_peak_flops returns for an
H100 SXM (989e12; it would run lspci to find it); the FLOPs per token are Llama 3 8B's at
sequence 8192 as torchtitan counts them (6 x 7.5e9 non-embedding parameters + 12 x 32 layers x
4096 x 8192 attention: about 5.8e10); 8192 tokens a step per device (local batch 1).

Run under torchrun as the emitted launch.sh runs torchtitan, so the lines carry torchrun's
'[rank0]:' prefix:

    TZ=UTC torchrun --nproc_per_node=1 --local-ranks-filter=0 --role=rank --tee=3 \\
        bench/upstream/run_torchtitan_log.py TORCHTITAN_DIR [--validate N] > OUT.log

(TZ: the log's times are local times of the stand-in clock.)

With `--validate N` it also validates every N steps as torchtitan's trainer does with a
validator configured (torchtitan/train.py after the step; torchtitan/components/validate.py
Validator.validate: each of its `validation.steps` batches (10 here) adds its tokens to the
processor's count, then MetricsProcessor.log_validation logs the 'validate step:' line).
Stand-ins as above: a forward pass of 8192 tokens takes 0.45 s +- 1%, and the reserved peak
the monitor reports for the forward-only pass is 48.6 GiB (the peak is reset after each log).
"""

import random
import sys
import types


class Clock:
    def __init__(self):
        self.now = 1.7e9

    def __call__(self):
        return self.now


def main(titan: str, validate_every: int = 0) -> None:
    sys.path.insert(0, titan)
    import logging

    import torchtitan.components.metrics as metrics
    from torchtitan.tools import utils
    from torchtitan.tools.logging import init_logger, logger

    clock = Clock()
    metrics.time = types.SimpleNamespace(perf_counter=clock)
    init_logger()

    class LogTime(logging.Filter):
        """The log record's time from the stand-in clock."""

        def filter(self, record):
            record.created = clock.now
            record.msecs = (clock.now % 1) * 1000
            return True

    for h in logger.handlers:
        h.addFilter(LogTime())

    capacity = 84_942_979_072  # bytes: an H100 80GB HBM3's total_memory as torch reports it
    peak = {"train": 61.27 * 2 ** 30, "validate": 48.6 * 2 ** 30}

    class Monitor:
        """Stand-in for DeviceMemoryMonitor: the reserved peak given."""

        phase = "train"

        def get_peak_stats(self):
            reserved = peak[self.phase]
            return metrics.DeviceMemStats(0.9 * reserved / 2 ** 30, 90 * reserved / capacity,
                                          reserved / 2 ** 30, 100 * reserved / capacity, 0, 0)

        def reset_peak_stats(self):
            pass

    mp = metrics.MetricsProcessor.__new__(metrics.MetricsProcessor)
    mp.logger = metrics.LoggerContainer()
    mp.parallel_dims = types.SimpleNamespace(non_data_parallel_size=1)
    mp.job_config = types.SimpleNamespace(metrics=types.SimpleNamespace(log_freq=1))
    mp.device_memory_monitor = monitor = Monitor()
    mp.color = utils.Color()
    mp.gpu_peak_flops = 989e12
    mp.num_flops_per_token = 6 * 7.5e9 + 12 * 32 * 4096 * 8192
    mp.ntokens_since_last_log = 0
    mp.data_loading_times = []
    mp.time_last_log = clock()
    mp.optimizers = mp.lr_schedulers = mp.model_parts = None

    rng = random.Random(3)
    steps = 12
    logger.info("Training starts at step 1")
    for step in range(1, steps + 1):
        clock.now += 9.8 if step == 1 else 1.35 * (1 + rng.gauss(0, 0.01))
        mp.ntokens_since_last_log += 8192
        mp.data_loading_times.append(0.004)
        loss = 11.0 - 0.1 * step
        mp.log(step, loss, loss + 0.02, 1.2 + 0.01 * step)
        if validate_every and step % validate_every == 0:
            monitor.phase = "validate"
            for _ in range(10):
                mp.ntokens_since_last_log += 8192
                clock.now += 0.45 * (1 + rng.gauss(0, 0.01))
            mp.log_validation(loss - 0.4, step)
            monitor.phase = "train"


if __name__ == "__main__":
    every = int(sys.argv[3]) if sys.argv[2:3] == ["--validate"] else 0
    main(sys.argv[1], every)
