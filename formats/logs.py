"""Training logs in their frameworks' own formats: per-iteration time and peak memory.

Each reader mirrors the line its framework prints (file and line cited at each pattern). The
readings of the first WARMUP_READINGS steps of every training process in a log are skipped
(compilation, allocator growth, NCCL setup) and the median of the rest is the log's iteration
time. A log may hold several processes: a job restarted from its checkpoint (a step number
below the one before, or the framework's start-of-training line) warms up again, and each
rank's lines under torchrun's `[rankN]:` prefix are a process of their own; the warm-up of each
is skipped. Slurm's `srun --label` puts the task's number on each line (`N: `), pdsh
(DeepSpeed's multi-node launcher) the host's name (`host: `); each is read as a rank's prefix
where no torchrun prefix follows it. Ranks that print the same step without a prefix
(DeepSpeed's timer logs on every rank) are one process, every rank's line of a warm-up step
skipped. torchtitan's validation lines (`validate step: ..`, forward only) are not training
steps and are left out. A log with no recognized line, or with too few readings after warm-up,
is refused with one line naming the file.

What each framework reports, and how it becomes an iteration time (s) for the job of the plan
the log is paired with (global batch B, sequence S, G GPUs):
- Megatron-LM: `elapsed time per iteration (ms)`, directly; memory: the `[Rank N] (after K
  iterations) memory (MB)` lines, `max reserved` (the allocator's peak, what the cost model's
  tensors plus fragmentation allowance predict), the largest over ranks.
- Megatron-Bridge: the same iteration line; memory: its `[Rank N] (after K iterations) memory
  (GB)` lines of named torch.cuda.memory_stats figures in 10^9 bytes, `mem-max-reserved-
  gigabytes` (reserved, fitted), or where a run logs other keys `mem-max-allocated-gigabytes`
  (allocated: reported, not fitted).
- torchtitan: `tps` (tokens per second per GPU): B S / (tps G); memory: `memory: X GiB`, the
  peak reserved memory it prints. The job config it prints at start-up where asked
  (formats/torchtitan_config.py `PrintedConfigs`) is kept for the plan and its check.
- NeMo (Lightning): `train_step_timing in s`, directly, from NeMo 2's progress printer or
  from the TQDM progress bar NeMo 1.x shows (Lightning's bar in NeMo's CustomProgressBar,
  refreshed twice a step: once with the last step's metrics, once with its own, so the last
  line at each count of the bar is read; NeMo 2's MegatronProgressBar refreshes once, with
  the last step's, a shift of one step that the warm-up absorbs), or from NeMo 1.x's
  DeltaTimingCallback lines (`Step N: train_step_timing in s=..`; its step count starts
  again each epoch, which reads as a restart); memory: the bar's `max_memory_reserved`
  (bytes; NeMo 1.x with NEMO_LOG_MEMORY_USAGE=1), or NeMo 2's printer's, rank 0's only.
  NeMo 1.x's printed
  configuration and padded vocabulary (formats/nemo_config.py) are kept for the plan and its
  check.
- DeepSpeed: its pipeline engine's `iter time (s)` (the train_batch timer over the steps since
  its last print, each step's mean), directly; without the pipeline engine, `CurrSamplesPerSec`
  of the ThroughputTimer (global samples per second): B / it, where both print the same steps
  the pipeline engine's line is read; memory: `MaxMemAllocated` (allocated, not reserved:
  reported, not fitted). Not read: the flops profiler's summary (one step, its profile_step,
  1 by default: a warm-up step) and the wall-clock breakdown (per-phase timers, no step time).
- Megatron-DeepSpeed (a Megatron-LM arguments block with `deepspeed True`) prints Megatron's
  iteration line and DeepSpeed's own for the same steps: Megatron's is read (it times the
  whole train step) and DeepSpeed's left out, counted. In any other log, lines of two
  frameworks are refused.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field

from model.errors import SpecError
from .nemo_config import PADDED_VOCAB as _NEMO_VOCAB
from .nemo_config import NemoConfigBlocks
from .reading import text_lines
from .torchtitan_config import PrintedConfigs

# readings skipped at the start of every log (documented in the README: warm-up iterations)
WARMUP_READINGS = 3
MIN_READINGS = 2

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"([0-9][0-9,]*\.?[0-9]*(?:[eE][-+]?\d+)?)"

# megatron/training/training.py (training_log): ' iteration {:8d}/{:8d} |' ... ' elapsed time
# per iteration (ms): {:.1f} |'
# The time as '{:.1f}' prints any float: a nan or a negative one is read, then refused as a 0
# is (read_log), not passed over as a line that is no reading (they had been, without a word)
_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)/\s*\d+\s*\|.*?elapsed time per iteration "
                            r"\(ms\):\s*(-?(?:nan|inf)|-?[0-9][0-9,]*\.?[0-9]*(?:[eE][-+]?\d+)?)")
# megatron/training/utils/common_utils.py (report_memory): '[Rank {}] {} memory (MB) |
# allocated: .. | max allocated: .. | reserved: .. | max reserved: ..'
_MEGATRON_MEM = re.compile(r"\[Rank (\d+)\].*?memory \(MB\)\s*\|\s*allocated:\s*" + _NUM
                           + r"\s*\|\s*max allocated:\s*" + _NUM + r"\s*\|\s*reserved:\s*"
                           + _NUM + r"\s*\|\s*max reserved:\s*" + _NUM)
# Megatron-Bridge src/megatron/bridge/training/utils/train_utils.py (training_log, 067f987):
# '[Rank {}] (after {iteration} iterations) memory (GB) | {metric}: {value} | ...', the metrics
# named by report_memory's MEMORY_KEYS with 'bytes' replaced by 'gigabytes' (values / 1e9)
_BRIDGE_MEM = re.compile(r"\[Rank (\d+)\].*?memory \(GB\)\s*((?:\|\s*[\w-]+:\s*[^|]*)+)")
_BRIDGE_PAIR = re.compile(r"\|\s*([\w-]+):\s*" + _NUM)
_BRIDGE_KEYS = (("mem-max-reserved-gigabytes", "reserved"),
                ("mem-max-allocated-gigabytes", "allocated"))
# torchtitan/components/metrics.py (MetricsProcessor.log): 'step: {step:2}  loss: ..
# memory: {max_reserved_gib:5.2f}GiB({pct:.2f}%)  tps: {round(tps):,}  tflops: ..'
# ('validate step: ..' from MetricsProcessor.log_validation is a forward-only pass: not a step)
_TITAN = re.compile(r"(?<!validate )step:\s*(\d+)\s+loss:.*?memory:\s*" + _NUM
                    + r"GiB\(.*?\)\s+tps:\s*" + _NUM)
# nemo/lightning/pytorch/callbacks/progress_printer.py (format_string): '<description> epoch
# E, iteration N/M | metric: value | ...' with 'train_step_timing in s' from
# nemo/utils/exp_manager.py (TimingCallback._on_batch_end)
_NEMO = re.compile(r"iteration\s+(\d+)/\d+\s*\|.*?train_step_timing in s:\s*" + _NUM)
# ... and its 'max_memory_reserved' in bytes, which NeMo 2's MegatronStrategy logs to the
# progress bar with NEMO_LOG_MEMORY_USAGE=1 (nemo/lightning/pytorch/strategies/
# megatron_strategy.py, training_step); the printer runs on global rank 0 only
# (strategies/utils.py fix_progress_bar)
_NEMO_MEM = re.compile(r"\|\s*max_memory_reserved:\s*" + _NUM)
# NeMo 1.x's progress bar: nemo/collections/nlp/parts/nlp_overrides.py (CustomProgressBar,
# bar_format '{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}
# {postfix}]') over Lightning's TQDMProgressBar, whose postfix is ', name=value' per metric
# logged with prog_bar=True (numbers through Lightning's Tqdm.format_num: 3 significant
# digits, padded: '44.00', '7.83e+10', so global_step, 1.23e+5 from 123000 on, does not name
# a step: the bar's count does); MegatronGPTModel.training_step logs global_step,
# consumed_samples, reduced_train_loss and, with NEMO_LOG_MEMORY_USAGE=1, max_memory_reserved
# and max_memory_allocated in bytes (megatron_gpt_model.py, rank_zero_only); lines end in '\r'
_NEMO_BAR = re.compile(r"\b(\d+)/\d+ \[[^\]]*?train_step_timing in s=" + _NUM)
# NeMo 1.x with exp_manager.log_delta_step_timing: nemo/utils/exp_manager.py
# (DeltaTimingCallback._on_batch_end) logs f'Step {step}: {name} in s={dt}' through NeMo's
# logger, the seconds since the last step ended, its step counted from 0 each epoch; its name
# already ends in ' in s' at 8cfedd7 ('train_step_timing in s in s=')
_NEMO_DELTA = re.compile(r"\bStep (\d+): train_step_timing in s(?: in s)?=" + _NUM)
_NEMO_BAR_MEM = re.compile(r"[ ,]max_memory_reserved=" + _NUM)
# deepspeed/utils/timer.py (ThroughputTimer.stop): 'epoch={}/micro_step={}/global_step={},
# RunningAvgSamplesPerSec={}, CurrSamplesPerSec={}, MemAllocated={}GB, MaxMemAllocated={}GB'
_DEEPSPEED = re.compile(r"global_step=(\d+),\s*RunningAvgSamplesPerSec=" + _NUM
                        + r",\s*CurrSamplesPerSec=" + _NUM + r",\s*MemAllocated=" + _NUM
                        + r"GB,\s*MaxMemAllocated=" + _NUM + "GB")

# deepspeed/runtime/pipe/engine.py (PipelineEngine.train_batch, every steps_per_print steps, on
# global rank 0): 'steps: {global_steps} loss: {loss:0.4f} [{name}: {loss:0.4f} ]iter time (s):
# {iter_time:0.3f} samples/sec: {tput:0.3f}'
_DS_PIPE = re.compile(r"\bsteps:\s*(\d+)\s+loss:.*?iter time \(s\):\s*" + _NUM
                      + r"\s+samples/sec:\s*" + _NUM)

# the global batch on a timing line: Megatron-LM's ' global batch size: {batch_size:5d} |'
# (training_log), NeMo's '| global_batch_size: N |' (the progress printer's logged metric)
_GBS = re.compile(r"global(?: batch size|_batch_size):\s*(\d+)")
# Megatron-LM's arguments at start-up (megatron/training/arguments.py, _print_args): a
# '---- arguments ----' line, one '  {arg} {dots} {value}' line each (dots: 48 - len(arg)),
# '---- end of arguments ----'
_ARGS_BEGIN = re.compile(r"-{4,} arguments -{4,}")
_ARG = re.compile(r"(?:^|\]:)  (\w+) (?:\.+ | )(.*?)\s*$")
# megatron/core/tokenizers/utils/build_tokenizer.py (vocab_size_with_padding; earlier
# megatron/training/tokenizer): ' > padded vocab (size: {}) with {} dummy tokens (new size: {})'
_PADDED_VOCAB = re.compile(r"> padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: "
                           r"(\d+)\)")
# DeepSpeed's engine configuration print (deepspeed/runtime/config.py, DeepSpeedConfig.print:
# '  {name} {dots} {value}' under '[INFO] [config.py:...:print]'), and its pipeline module's
# partition (deepspeed/runtime/pipe/module.py, _partition_layers: 'stage={stage}
# layers={count}', then '    {index}: {layer name}' per layer)
_DS_CONFIG = re.compile(r"\b(train_batch_size|train_micro_batch_size_per_gpu|"
                        r"gradient_accumulation_steps|zero_optimization_stage) \.* (\d+)\s*$")
# (each with or without torchrun's rank prefix)
_DS_STAGE = re.compile(r"^(?:\[\w+\]:)?stage=(\d+) layers=\d+\s*$")
_DS_LAYER = re.compile(r"^(?:\[\w+\]:)?\s+\d+: (\S+)")
_TITAN_VALIDATION = re.compile(r"validate step:\s*\d+\s.*?tps:\s*" + _NUM)
# what a torchtitan run prints of itself at start-up (v0.1.0 and v0.2.2): torchtitan/train.py
# (Trainer.__init__) 'Model {name} {flavor} size: {count:,} total parameters' and 'Trainer is
# initialized with local batch size {l}, global batch size {g}, gradient accumulation steps
# {a}, sequence length {s}, ...'; torchtitan/distributed/parallel_dims.py (build_mesh) at
# v0.2.2 'Building device mesh with parallelism: pp={}, dp_replicate={}, dp_shard={}, cp={},
# tp={}, ep={}, etp={}', at v0.1.0 'Building {n}-D device mesh with {names}, {degrees}' (the
# dimensions above 1 only)
_TITAN_PARAMS = re.compile(r"Model \S+ \S+ size: ([\d,]+) total parameters")
_TITAN_TRAINER = re.compile(r"Trainer is initialized with local batch size (\d+), global batch "
                            r"size (\d+), gradient accumulation steps (\d+), sequence length "
                            r"(\d+)")
_TITAN_MESH = re.compile(r"Building device mesh with parallelism: ((?:\w+=\d+(?:, )?)+)")
_TITAN_MESH_01 = re.compile(r"Building \d+-D device mesh with \[([^\]]*)\], \[([^\]]*)\]")
# a training process starting: Megatron-LM's print_datetime('before the start of training
# step') (megatron/training/training.py, train loop set-up: '[{string}] datetime: {time}'),
# torchtitan's 'Training starts at step {step + 1}' (torchtitan/trainer.py, Trainer.train)
_START = re.compile(r"\[before the start of training step\] datetime:|Training starts at step "
                    r"\d+")
# Megatron-LM's start line is print_rank_0's (print_datetime) while the last rank prints the
# iterations (print_rank_last): it starts the whole job again, whatever rank prefix it carries;
# torchtitan's logger prints on every rank, so its start line is its own rank's
_START_WHOLE_JOB = "before the start of training step"
# Megatron-Bridge's start-up summary (src/megatron/bridge/training/config.py
# log_non_default_values, called by setup.py, 067f987): a 'Configuration Summary (Non-Default
# Values vs Megatron Core)' title, '[section] Non-default values (vs Mcore ...):' or
# '[section]:' headers, and one '  {name}: {value!r}' line per value (Megatron Core's config
# classes: only where it differs from their default, '  (Mcore default: ..)' after it)
_BRIDGE_SUMMARY = "Configuration Summary (Non-Default Values vs Megatron Core)"
_BRIDGE_SECTION = re.compile(r"^\[(\w+)\](?: Non-default values \(vs Mcore \w+\))?:\s*$")
_BRIDGE_VALUE = re.compile(r"^  (\w+): (.*?)(?:  \(Mcore default: .*\))?\s*$")
# the prefix torchrun puts on each rank's lines ('[rank3]:', torch.distributed.elastic's
# --local-ranks-filter / --tee output), '[default3]:' under NeMo-Run's launcher (NeMo's
# examples/llm/resiliency/resiliency-in-pretraining-demo.ipynb)
_RANK = re.compile(r"\[(?:rank|default)(\d+)\]:")
# Slurm's srun --label: '%0*d: ' before each line, the task number zero-padded to the width of
# the largest (src/common/write_labelled_message.c, _write_label)
_SRUN_LABEL = re.compile(r"(\d+): ")
# pdsh, DeepSpeed's default multi-node launcher (deepspeed/launcher/multinode_runner.py
# PDSHRunner): 'host: ' before each line of each host's output (pdsh(1)); a host name here
# starts with a letter and holds a digit, '.' or '-' (worker-0, node017, gpu3.cluster), which
# no framework's own line-leading word does ('steps: ' is DeepSpeed's pipeline line)
_PDSH_HOST = re.compile(r"([A-Za-z][\w.-]*): ")
_HOST_RANK0 = 1_000_000  # prefix numbers given to hosts, apart from any rank's


def _f(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass
class LogReading:
    """What one log says, before it is paired with its plan."""

    path: str
    framework: str
    # per reading after warm-up: seconds per iteration (megatron, nemo), tokens/s per GPU
    # (torchtitan) or global samples/s (deepspeed)
    values: list[float] = field(default_factory=list)
    unit: str = "s"
    memory_gib: float | None = None
    memory_kind: str = ""  # "reserved" (fitted) or "allocated" (reported only)
    # the pipeline stage the memory reading is of: None, the largest over the ranks that
    # printed (each stage's); 0, rank 0's only (NeMo 1.x's bar), pipeline stage 0
    memory_stage: int | None = None
    # the ranks whose lines gave the memory readings, where the log names them: ('global',
    # ranks) from Megatron-LM's own '[Rank N]' (torch.distributed.get_rank()), ('local', ranks)
    # from torchrun's '[rankN]:' prefix on torchtitan's lines (torchrun's default prefix is
    # '[${role_name}${local_rank}]:', torch/distributed/elastic/agent/server/
    # local_elastic_agent.py); None where a line came without one. formats/runs.py maps them to
    # the plan's pipeline stages
    memory_ranks: tuple | None = None
    skipped: int = 0  # warm-up readings skipped, over every process
    processes: int = 1  # training processes found (restarts and ranks), each warmed up apart
    validation_lines: int = 0  # torchtitan validation lines left out
    cut_short: bool = False  # a gzip log that ends before its end marker, read up to there
    # its last line has no line end (a log still being written): left out, whatever it held
    unfinished_line: bool = False
    # DeepSpeed's timing lines of steps another line of the same run timed (Megatron-DeepSpeed:
    # Megatron's; the pipeline engine: its own over the ThroughputTimer's), left out
    same_steps_lines: int = 0
    # the global batch each reading in `values` printed (Megatron-LM, NeMo), else None
    batches: list = field(default_factory=list)
    # each arguments block a Megatron-LM log printed (a restart prints its own): name -> value
    # as printed (str of the value: '8', 'True', 'None', 'selective')
    megatron_args: list = field(default_factory=list)
    # the vocabulary Megatron-LM built, from its ' > padded vocab ... (new size: N)' line
    padded_vocab: int | None = None
    # Megatron-DeepSpeed: the ZeRO stage DeepSpeed's engine printed with its configuration,
    # and the transformer layers its pipeline engine put on each stage
    deepspeed_zero: int | None = None
    # DeepSpeed's engine configuration print: train_batch_size, train_micro_batch_size_per_gpu,
    # gradient_accumulation_steps, zero_optimization_stage (the last value printed of each)
    deepspeed_config: dict = field(default_factory=dict)
    deepspeed_layers: tuple = ()
    # what a torchtitan run printed of itself, per start (a restart prints again): 'params',
    # 'global_batch', 'local_batch', 'grad_accum', 'seq_len' and the mesh degrees ('pp',
    # 'dp_replicate', 'dp_shard', 'cp', 'tp', 'ep', 'etp'; v0.1.0 prints those above 1 only)
    torchtitan_settings: list = field(default_factory=list)
    # Megatron-Bridge's configuration summaries ('section.name' -> the value's repr), one per
    # start
    bridge_summaries: list = field(default_factory=list)
    # NeMo 1.x's printed configurations (YAML texts, formats/nemo_config.py), one per start
    nemo_configs: list = field(default_factory=list)
    # torchtitan's printed job configs ((format, text): formats/torchtitan_config.py
    # PrintedConfigs), one per start and rank that printed
    torchtitan_configs: list = field(default_factory=list)

    @property
    def prints_settings(self) -> bool:
        """Whether the log printed any of the run's settings (an arguments block, a printed
        configuration, torchtitan's start-up prints) that a plan is checked against
        (formats/runs.py check_logged_args)."""
        return any((self.megatron_args, self.deepspeed_config, self.torchtitan_settings,
                    self.bridge_summaries, self.nemo_configs, self.torchtitan_configs))

    def at_batch(self, global_batch: int) -> list[float]:
        """The readings of a run at this global batch: where the log prints its batch, those
        that printed this one (a batch-size ramp-up's smaller batches are left out); refused
        when none did, since the log is then not the run of the plan it was paired with."""
        if not any(b is not None for b in self.batches):
            return self.values
        vals = [v for v, b in zip(self.values, self.batches) if b in (None, global_batch)]
        if not vals:
            ran = ", ".join(map(str, sorted({b for b in self.batches if b is not None})))
            raise SpecError(f"the log ran global batch {ran} and its plan has {global_batch}; "
                            "pair each log with the plan file of the run it logged",
                            source=self.path, field="global batch size")
        return vals

    def iteration_s(self, global_batch: int, seq_length: int, num_gpus: int) -> float:
        """The median iteration time in seconds for the job of the paired plan (of its
        readings at the plan's global batch, `at_batch`)."""
        v = statistics.median(self.at_batch(global_batch))
        if self.unit == "s":
            return v
        if self.unit == "tokens/s/gpu":
            return global_batch * seq_length / (v * num_gpus)
        return global_batch / v  # samples/s (global)


class _ArgBlocks:
    """Megatron-LM's arguments blocks (_ARGS_BEGIN), fed line by line: name -> the value
    printed; a block ends at its end line or at the first line that is not an argument
    (truncated output)."""

    def __init__(self):
        self.blocks: list[dict[str, str]] = []
        self.inside = False

    def feed(self, line: str) -> None:
        if "arguments" in line and _ARGS_BEGIN.search(line):
            self.inside = True
            self.blocks.append({})
        elif self.inside and (m := _ARG.search(line)):
            self.blocks[-1][m.group(1)] = m.group(2)
        else:
            self.inside = False


class _BridgeSummary:
    """Megatron-Bridge's configuration summaries (_BRIDGE_SUMMARY), fed line by line:
    'section.name' -> the value as printed (its repr), one dict per summary printed."""

    def __init__(self):
        self.summaries: list[dict[str, str]] = []
        self.section: str | None = None
        self.inside = False

    def feed(self, line: str) -> None:
        if _BRIDGE_SUMMARY in line:
            self.inside, self.section = True, None
            self.summaries.append({})
            return
        if not self.inside:
            return
        text = _RANK.sub("", line, count=1) if "]:" in line[:16] else line
        if m := _BRIDGE_SECTION.match(text):
            self.section = m.group(1)
        elif self.section and (m := _BRIDGE_VALUE.match(text)):
            self.summaries[-1][f"{self.section}.{m.group(1)}"] = m.group(2)
        elif text.strip() and set(text.strip()) - set("=-") and \
                text.strip() != "Other Configuration Values:":
            self.inside = False  # the summary is over


class _Partition:
    """DeepSpeed's pipeline partition print (_DS_STAGE), fed line by line: stage -> its
    transformer layers."""

    def __init__(self):
        self.stage: int | None = None  # the stage being listed
        self.layers: dict[int, int] = {}

    def feed(self, line: str) -> None:
        if "stage=" in line and (m := _DS_STAGE.match(line)):
            self.stage = int(m.group(1))
            self.layers[self.stage] = 0
        elif self.stage is not None and (m := _DS_LAYER.match(line)):
            self.layers[self.stage] += "TransformerLayer" in m.group(1)
        else:
            self.stage = None

    def per_stage(self) -> tuple[int, ...]:
        """Layers per stage in stage order; () unless stages 0..n-1 were all printed."""
        if sorted(self.layers) != list(range(len(self.layers))):
            return ()
        return tuple(self.layers[k] for k in range(len(self.layers)))


class _Processes:
    """Which training process each timing reading belongs to, fed line by line: a rank's
    current one, or a new one when a start-of-training line came since it began (one without
    a rank prefix applies to every rank, one with a prefix to that rank) or the step falls
    below its last (an equal step is another rank's line where ranks print without a prefix,
    as DeepSpeed's timer does)."""

    def __init__(self):
        self.starts: dict = {None: 0}  # start lines so far: unprefixed (None), per rank
        self.last: dict = {}  # rank -> (start lines when its process began, restarts, step)

    def start_line(self, rank) -> None:
        self.starts[rank] = self.starts.get(rank, 0) + 1

    def of(self, rank, step: int) -> tuple:
        now = (self.starts[None], self.starts.get(rank, 0))
        began, restarts, prev = self.last.get(rank, (now, 0, None))
        if prev is not None and (began != now or step < prev):
            began, restarts = now, restarts + 1
        self.last[rank] = (began, restarts, step)
        return rank, restarts


def _titan_settings(line: str, starts: list[dict]) -> None:
    """Add what one torchtitan start-up line says (_TITAN_PARAMS, _TITAN_TRAINER, _TITAN_MESH)
    to the current start's settings; a setting printed again begins another start (a restart,
    or another rank's lines)."""
    got: dict = {}
    if m := _TITAN_PARAMS.search(line):
        got["params"] = int(m.group(1).replace(",", ""))
    elif m := _TITAN_TRAINER.search(line):
        got.update(zip(("local_batch", "global_batch", "grad_accum", "seq_len"),
                       map(int, m.groups())))
    elif m := _TITAN_MESH.search(line):
        got.update((k, int(v)) for k, v in (kv.split("=") for kv in m.group(1).split(", ")))
    elif m := _TITAN_MESH_01.search(line):
        names = [x.strip().strip("'\"") for x in m.group(1).split(",") if x.strip()]
        degrees = [x.strip() for x in m.group(2).split(",") if x.strip()]
        if len(names) != len(degrees) or not all(d.isdigit() for d in degrees):
            return
        got.update({k: 1 for k in ("pp", "dp_replicate", "dp_shard", "cp", "tp")})
        got.update(zip(names, map(int, degrees)))
    if not got:
        return
    if not starts or set(got) & set(starts[-1]):
        starts.append({})
    starts[-1].update(got)


def _fed(reader, text: str):
    """A line-fed reader (_ArgBlocks, _BridgeSummary) after every line of `text`."""
    for line in text.splitlines():
        reader.feed(line)
    return reader


def bridge_summaries(text: str) -> list[dict[str, str]]:
    """Each configuration summary Megatron-Bridge printed in `text` (_BridgeSummary)."""
    return [d for d in _fed(_BridgeSummary(), text).summaries if d]


def megatron_arg_blocks(text: str) -> list[dict[str, str]]:
    """Each arguments block Megatron-LM printed in `text` (_ArgBlocks)."""
    return [b for b in _fed(_ArgBlocks(), text).blocks if b]


_CUT = " (its gzip stream ends before the end marker: read up to there)"
# a log whose last line has no line end (text_lines' `unfinished`): said where it matters
_UNFINISHED = (" (its last line has no line end and was left out, as a line still being "
               "written: end the file with a newline if that line is whole)")


def read_log(path) -> LogReading:
    """Read a Megatron-LM, torchtitan, NeMo or DeepSpeed training log."""
    src = str(path)
    args, partition, procs = _ArgBlocks(), _Partition(), _Processes()
    summary = _BridgeSummary()
    nemo_cfg = NemoConfigBlocks()
    titan_cfg: dict = {}  # rank (None: unprefixed) -> PrintedConfigs
    titan_open = False  # a JSON print not yet closed
    vocab = None
    ds_config: dict[str, int] = {}
    found = []  # (framework, process, step, global batch or None, value)
    mem = {}
    mem_ranks: dict = {}  # the rank of each torchtitan or Megatron-LM memory reading, or None
    bridge_mem: dict[str, list[float]] = {}  # Megatron-Bridge's memory lines, by kind
    titan: list[dict] = []  # torchtitan's start-up prints (LogReading.torchtitan_settings)
    validation = 0
    hosts: dict[str, int] = {}  # pdsh's host prefixes -> their prefix numbers
    # each pattern is tried only on lines holding a word it needs (a plain substring test is
    # ~20 times cheaper than a search): a long run's log has millions of lines
    cut_short: list = []
    unfinished: list = []  # a last line without its line end: left out (text_lines)
    for line in text_lines(path, field="log", what="the log", cut_short=cut_short,
                           unfinished=unfinished):
        if "\x1b" in line:
            line = _ANSI.sub("", line)
        # a launcher's prefix (srun's task, pdsh's host) becomes a rank's, unless torchrun's
        # own follows it
        label = None
        if line[:1].isdigit() and (m := _SRUN_LABEL.match(line)):
            label = int(m.group(1))
        elif line[:1].isalpha() and (m := _PDSH_HOST.match(line)) and \
                any(c.isdigit() or c in ".-" for c in m.group(1)):
            label = hosts.setdefault(m.group(1), _HOST_RANK0 + len(hosts))
        if label is not None:
            line = line[m.end():]
            if not ("]:" in line[:16] and _RANK.match(line)):
                line = f"[rank{label}]:{line}"
                label = "launcher"  # the rank prefix is the launcher's, not torchrun's
        args.feed(line)
        if summary.inside or "Configuration Summary" in line:
            summary.feed(line)
        if nemo_cfg.state or "Experiment configuration" in line:
            nemo_cfg.feed(_RANK.sub("", line, count=1) if "]:" in line[:16] else line)
        if titan_open or "Running with" in line:  # torchtitan's job config, per rank
            m = _RANK.match(line) if "]:" in line[:16] else None
            feeder = titan_cfg.setdefault(m.group(1) if m else None, PrintedConfigs())
            feeder.feed(line[m.end():] if m else line)
            titan_open = any(f.block is not None for f in titan_cfg.values())
        if ("total parameters" in line or "Trainer is initialized" in line
                or "device mesh with" in line):
            _titan_settings(line, titan)
        partition.feed(line)
        if "added vocab" in line and (m := _PADDED_VOCAB.search(line) or
                                      _NEMO_VOCAB.search(line)):  # Megatron-LM's, NeMo's
            vocab = int(m.group(1))
        if ("_size" in line or "_stage" in line or "_steps" in line) and \
                (m := _DS_CONFIG.search(line)):
            ds_config[m.group(1)] = int(m.group(2))
        rank = int(m.group(1)) if "]:" in line and (m := _RANK.search(line)) else None
        if "start" in line and _START.search(line):
            procs.start_line(None if _START_WHOLE_JOB in line else rank)
        batch = int(m.group(1)) if "global" in line and (m := _GBS.search(line)) else None
        if "elapsed time per iteration" in line and (m := _MEGATRON_ITER.search(line)):
            step = int(m.group(1))
            found.append(("megatron", procs.of(rank, step), step, batch, _f(m.group(2)) / 1e3))
        elif "tps:" in line and "validate step" not in line and (m := _TITAN.search(line)):
            step = int(m.group(1))
            found.append(("torchtitan", procs.of(rank, step), step, None, _f(m.group(3))))
            mem.setdefault("torchtitan", []).append(_f(m.group(2)))
            mem_ranks.setdefault("torchtitan", []).append(None if label == "launcher" else rank)
        elif "train_step_timing" in line and (m := _NEMO.search(line)):
            step = int(m.group(1))
            found.append(("nemo", procs.of(rank, step), step, batch, _f(m.group(2))))
            if m := _NEMO_MEM.search(line):
                mem.setdefault("nemo", []).append(_f(m.group(1)) / 2 ** 30)
        elif "train_step_timing in s" in line and (m := _NEMO_DELTA.search(line)):
            step = int(m.group(1))
            found.append(("nemo-delta", procs.of(rank, step), step, None, _f(m.group(2))))
        elif "train_step_timing in s=" in line and (m := _NEMO_BAR.search(line)):
            step = int(m.group(1))
            found.append(("nemo-bar", procs.of(rank, step), step, None, _f(m.group(2))))
        elif "CurrSamplesPerSec" in line and (m := _DEEPSPEED.search(line)):
            step = int(m.group(1))
            found.append(("deepspeed", procs.of(rank, step), step, None, _f(m.group(3))))
            mem.setdefault("deepspeed", []).append(_f(m.group(5)))
        elif "iter time (s)" in line and (m := _DS_PIPE.search(line)):
            step = int(m.group(1))
            found.append(("deepspeed-pipe", procs.of(rank, step), step, None, _f(m.group(2))))
        elif "validate step" in line and _TITAN_VALIDATION.search(line):
            validation += 1
        if "=" in line and "max_memory_reserved=" in line and (m := _NEMO_BAR_MEM.search(line)):
            mem.setdefault("nemo-bar", []).append(_f(m.group(1)) / 2 ** 30)
        if "memory (MB)" in line and (m := _MEGATRON_MEM.search(line)):
            mem.setdefault("megatron", []).append(_f(m.group(5)) / 1024)
            mem_ranks.setdefault("megatron", []).append(int(m.group(1)))
        elif "memory (GB)" in line and (m := _BRIDGE_MEM.search(line)):
            pairs = {k: _f(v) for k, v in _BRIDGE_PAIR.findall(m.group(2))}
            for key, kind in _BRIDGE_KEYS:
                if key in pairs:
                    bridge_mem.setdefault(kind, []).append(pairs[key] * 1e9 / 2 ** 30)
                    break
    if not found:
        raise SpecError("no training-step line of Megatron-LM (elapsed time per iteration), "
                        "torchtitan (step: .. tps:), NeMo (train_step_timing in s) or "
                        "DeepSpeed (iter time (s), CurrSamplesPerSec) found; give the log the "
                        f"framework printed{_CUT if cut_short else ''}"
                        f"{_UNFINISHED if unfinished else ''}", source=src, field="log")
    frameworks = {x[0] for x in found}
    # one run's second timer of the same steps (module docstring): left out, counted
    ds = frameworks & {"deepspeed", "deepspeed-pipe"}
    if ("megatron" in frameworks and ds
            and any(b.get("deepspeed") == "True" for b in args.blocks)):
        drop = ds
    elif ds == {"deepspeed", "deepspeed-pipe"}:
        drop = {"deepspeed"}
    else:
        drop = set()
    same_steps = sum(x[0] in drop for x in found)
    found = [x for x in found if x[0] not in drop]
    frameworks -= drop
    if len(frameworks) > 1:
        raise SpecError(f"lines of several frameworks ({', '.join(sorted(frameworks))}) in one "
                        "log; give one run's log per file", source=src, field="log")
    fw = frameworks.pop()
    unit = {"megatron": "s", "nemo": "s", "nemo-bar": "s", "nemo-delta": "s",
            "torchtitan": "tokens/s/gpu", "deepspeed": "samples/s", "deepspeed-pipe": "s"}[fw]
    if fw == "nemo-bar":
        # the bar prints each step twice or more (module docstring): its last line is read
        last = {(x[1], x[2]): k for k, x in enumerate(found)}
        found = [found[k] for k in sorted(last.values())]
    # memory: the bar's own figures; DeepSpeed's pipeline engine prints none, its
    # ThroughputTimer does
    mem_fw = "nemo-bar" if fw in ("nemo-bar", "nemo-delta") else fw.split("-")[0]
    fw = fw.split("-")[0]
    # warm-up: the readings of each process's first WARMUP_READINGS steps (every rank's line
    # of those steps, where ranks print without a prefix)
    seen: dict = {}  # process -> its first steps
    values, batches = [], []
    for _fw, proc, step, batch, v in found:
        first = seen.setdefault(proc, [])
        if step not in first and len(first) < WARMUP_READINGS:
            first.append(step)
        if step not in first:
            if not (math.isfinite(v) and v > 0):  # 0, nan or -5 ms, 0 tokens/s: none
                raise SpecError(f"step {step} reads {v:g} {unit}; a timing reading must be "
                                "positive: give the log as the framework printed it",
                                source=src, field="log")
            values.append(v)
            batches.append(batch)
    if len(values) < MIN_READINGS:
        per = (f" over {len(seen)} training processes (restarts or ranks), each warming up"
               if len(seen) > 1 else "")
        raise SpecError(f"{len(found)} timing readings{per}; at least "
                        f"{WARMUP_READINGS + MIN_READINGS} in one process are needed (the first "
                        f"{WARMUP_READINGS} of each are warm-up); log more iterations"
                        f"{_CUT if cut_short else ''}{_UNFINISHED if unfinished else ''}",
                        source=src, field="log")
    reading = LogReading(src, fw, values, unit, skipped=len(found) - len(values),
                         cut_short=bool(cut_short), unfinished_line=bool(unfinished),
                         processes=len(seen), validation_lines=validation, batches=batches,
                         same_steps_lines=same_steps,
                         megatron_args=[b for b in args.blocks if b] if fw == "megatron" else [],
                         padded_vocab=vocab,
                         deepspeed_zero=ds_config.get("zero_optimization_stage"),
                         deepspeed_config=ds_config,
                         deepspeed_layers=partition.per_stage(),
                         torchtitan_settings=titan if fw == "torchtitan" else [],
                         bridge_summaries=[d for d in summary.summaries if d]
                         if fw == "megatron" else [],
                         nemo_configs=nemo_cfg.done() if fw == "nemo" else [],
                         torchtitan_configs=[x for f in titan_cfg.values() for x in f.done()]
                         if fw == "torchtitan" else [])
    if mem.get(mem_fw):
        reading.memory_gib = max(mem[mem_fw])
        reading.memory_kind = "allocated" if fw == "deepspeed" else "reserved"
        reading.memory_stage = 0 if mem_fw in ("nemo", "nemo-bar") else None
        if mem_fw in ("megatron", "torchtitan") and None not in mem_ranks[mem_fw]:
            reading.memory_ranks = ("global" if mem_fw == "megatron" else "local",
                                    tuple(sorted(set(mem_ranks[mem_fw]))))
    elif fw == "megatron" and bridge_mem:
        kind = "reserved" if "reserved" in bridge_mem else "allocated"
        reading.memory_gib, reading.memory_kind = max(bridge_mem[kind]), kind
    return reading
