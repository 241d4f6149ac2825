"""A NeMo 1.x training log as NeMo's own code prints it, for the log reader's fixture (run with
the Python that has Lightning 2.4 and NeMo's requirements; imports nothing of this project).

NeMo 1.x's Megatron GPT training (examples/nlp/language_modeling/megatron_gpt_pretraining.py)
shows its progress through Lightning's TQDM progress bar: MegatronTrainerBuilder appends
NeMo's CustomProgressBar (nemo/collections/nlp/parts/nlp_overrides.py), exp_manager puts
NeMo's TimingCallback first among the callbacks (nemo/utils/exp_manager.py, log_step_timing
True by default), which logs 'train_step_timing in s' to the bar, and MegatronGPTModel's
training_step logs reduced_train_loss, global_step and consumed_samples to it, and with
NEMO_LOG_MEMORY_USAGE=1 max_memory_reserved and max_memory_allocated (bytes,
torch.cuda.max_memory_*; megatron_gpt_model.py). With exp_manager.log_delta_step_timing
True, NeMo's DeltaTimingCallback takes the timing callback's place: it logs 'Step N:
train_step_timing in s=T' through NeMo's logger instead, and the bar carries no timing.

This script runs Lightning's Trainer (its fit loop, logger connector and TQDM bar) with NeMo's
CustomProgressBar and TimingCallback (or DeltaTimingCallback: `--delta`), taken from the NeMo
checkout given, on a stand-in module
whose training_step logs those metrics as MegatronGPTModel does. The class CustomProgressBar is
executed from its own source in nlp_overrides.py (importing that module pulls NeMo's NLP stack,
which needs an older transformers than this environment has). Stand-ins, and nothing else: the
wall clock NeMo's timers read (nemo.utils.timers.time, exp_manager.time) advances by the step
times given, so the
log carries training-scale times from a CPU run; the memory figures are the numbers given (no
GPU here); the model is one linear layer.

With `--emitted DIR --vocab N` the run is an emitted NeMo 1.x launch set's (DIR holds its
nemo_config.yaml): the configuration is composed by Hydra from the arguments launch.sh hands to
NeMo's script (--config-path, --config-name, the search path of NeMo's conf folder, a data
prefix), as NeMo's hydra_runner does, and logged as the script's main() logs it ('**************
Experiment configuration ***********', then OmegaConf.to_yaml), then the padded vocabulary as
MegatronBaseModel._vocab_size_with_padding logs it (executed from its source in
megatron_base_model.py), for a tokenizer of N entries (the stand-in for the tokenizer NeMo
would load).

With `--nemo2 MEGATRON_LM_DIR` the progress shows as NeMo 2 shows it by default instead: NeMo's
ProgressPrinter (nemo/lightning/pytorch/callbacks/progress_printer.py, run from its file; it
imports Megatron-Core's get_num_microbatches from the checkout given) prints 'Training epoch E,
iteration N/M | metric: value | ...' every step, the timing from NeMo's TimingCallback. The
step count it reads from NeMo's MegatronStrategy (current_epoch_step, the optimizer steps
completed) is set on Lightning's plain strategy by a stand-in callback.

With `--nemo2-bar` the progress shows through NeMo 2's MegatronProgressBar instead
(nemo/lightning/pytorch/callbacks/progress_bar.py, run from its file), the TQDM bar NeMo 2's
trainer shows when the progress printer is not chosen: one refresh per step at the strategy's
step count, with the postfix set after the refresh (refresh=False), so each line carries the
previous step's metrics.

usage: python run_nemo1_log.py NEMO_DIR [--delta | --nemo2 MEGATRON_LM_DIR | --nemo2-bar]
[--emitted DIR --vocab N] > OUT.log (what the bar and NeMo's logger print goes to stdout)
"""

import ast
import random
import sys
from pathlib import Path


class Clock:
    """time.time() for nemo.utils.timers: advanced by the training step."""

    def __init__(self):
        self.now = 1.7e9

    def time(self):
        return self.now


def _from_source(nemo: Path, path: str, names: tuple[str, ...], ns: dict):
    """A definition in one of NeMo's files, executed from its source: names[0] a top-level
    class or function, names[1] (if given) a method of it, run as a plain function."""
    src_path = nemo / path
    body = ast.parse(src_path.read_text()).body
    for name in names:
        node = next(n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef))
                    and n.name == name)
        body = node.body
    exec(compile(ast.Module([node], []), str(src_path), "exec"), ns)
    return ns[names[-1]]


def custom_progress_bar(nemo: Path):
    """NeMo's CustomProgressBar, executed from its source in nlp_overrides.py."""
    from lightning.pytorch.callbacks.progress import TQDMProgressBar
    from lightning.pytorch.callbacks.progress.tqdm_progress import _update_n
    return _from_source(nemo, "nemo/collections/nlp/parts/nlp_overrides.py",
                        ("CustomProgressBar",),
                        {"TQDMProgressBar": TQDMProgressBar, "_update_n": _update_n})


def log_configuration(nemo: Path, emitted: Path, vocab: int) -> None:
    """What NeMo's megatron_gpt_pretraining.py logs before training for the emitted launch set
    (module docstring)."""
    import hydra
    from omegaconf import OmegaConf
    from nemo.utils import logging

    sys.argv = [sys.argv[0], f"--config-path={emitted}", "--config-name=nemo_config",
                f"hydra.searchpath=[file://{nemo}/examples/nlp/language_modeling/conf]",
                "model.data.data_prefix=[1.0,/data/corpus_text_document]",
                "hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=none",
                "hydra/hydra_logging=none"]

    @hydra.main(version_base=None, config_path=None, config_name=None)
    def script_main(cfg):
        logging.info("\n\n************** Experiment configuration ***********")
        logging.info(f'\n{OmegaConf.to_yaml(cfg)}')
        pad = _from_source(
            nemo, "nemo/collections/nlp/models/language_modeling/megatron_base_model.py",
            ("MegatronBaseModel", "_vocab_size_with_padding"), {"logging": logging})
        m = cfg.model
        pad(None, vocab, m.get("make_vocab_size_divisible_by", 128),
            m.get("tensor_model_parallel_size", 1))

    script_main()


def progress_printer(nemo: Path, megatron: Path):
    """NeMo 2's ProgressPrinter, its module run from its file (importing NeMo's package would
    pull its whole stack)."""
    import runpy

    sys.path.insert(0, str(megatron))
    ns = runpy.run_path(str(nemo / "nemo/lightning/pytorch/callbacks/progress_printer.py"))
    return ns["ProgressPrinter"]


def megatron_progress_bar(nemo: Path):
    """NeMo 2's MegatronProgressBar, its module run from its file (it imports Lightning
    only)."""
    import runpy

    ns = runpy.run_path(str(nemo / "nemo/lightning/pytorch/callbacks/progress_bar.py"))
    return ns["MegatronProgressBar"]


def main(nemo: Path, delta: bool, emitted: Path | None = None, vocab: int = 0,
         nemo2: Path | None = None, nemo2_bar: bool = False) -> None:
    sys.path.insert(0, str(nemo))
    if emitted is not None:
        log_configuration(nemo, emitted, vocab)
    import torch
    import lightning.pytorch as pl
    import nemo.utils.exp_manager as exp_manager
    import nemo.utils.timers as timers

    clock = Clock()
    timers.time = clock  # NamedTimer's start/stop read time.time()
    exp_manager.time = clock  # and so does DeltaTimingCallback
    rng = random.Random(14)
    gbs, steps = 256, 12
    # seconds per step: the first slower (warm-up), then 43.5 s +- 1%
    step_s = [61.2] + [43.5 * (1 + rng.gauss(0, 0.01)) for _ in range(steps - 1)]
    reserved = [7.61e10] + [7.83e10] * (steps - 1)

    class GPT(pl.LightningModule):
        """Logs what MegatronGPTModel.training_step logs to the progress bar."""

        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            k = self.trainer.global_step
            clock.now += step_s[k]
            loss = self.layer(batch).pow(2).mean()
            self.log("max_memory_reserved", reserved[k], prog_bar=True, rank_zero_only=True,
                     batch_size=1)
            self.log("max_memory_allocated", 0.9 * reserved[k], prog_bar=True,
                     rank_zero_only=True, batch_size=1)
            self.log("reduced_train_loss", 11.0 - 0.05 * k, prog_bar=True, rank_zero_only=True,
                     batch_size=1)
            self.log("lr", 1e-4, rank_zero_only=True, batch_size=1)
            self.log("global_step", self.trainer.global_step, prog_bar=True,
                     rank_zero_only=True, batch_size=1)
            self.log("consumed_samples", float((k + 1) * gbs), prog_bar=True,
                     rank_zero_only=True, batch_size=1)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-4)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.randn(steps, 4), batch_size=1)

    # exp_manager inserts the timing callback first (trainer.callbacks.insert(0, ...))
    timing = exp_manager.DeltaTimingCallback() if delta else exp_manager.TimingCallback()
    callbacks = [timing]
    if nemo2 is not None or nemo2_bar:

        class StrategyStep(pl.Callback):
            """Stand-in: MegatronStrategy.current_epoch_step, the optimizer steps completed."""

            def on_train_batch_end(self, trainer, *_a, **_k):
                trainer.strategy.current_epoch_step = trainer.fit_loop.epoch_loop.\
                    automatic_optimization.optim_progress.optimizer.step.current.completed

        callbacks += [StrategyStep(), megatron_progress_bar(nemo)() if nemo2_bar else
                      progress_printer(nemo, nemo2)(log_interval=1)]
    else:
        callbacks.append(custom_progress_bar(nemo)())
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_model_summary=False,
                         callbacks=callbacks, log_every_n_steps=1)
    trainer.fit(GPT())


if __name__ == "__main__":
    args = sys.argv[2:]
    where = Path(args[args.index("--emitted") + 1]) if "--emitted" in args else None
    main(Path(sys.argv[1]), "--delta" in args, where,
         int(args[args.index("--vocab") + 1]) if "--vocab" in args else 0,
         Path(args[args.index("--nemo2") + 1]) if "--nemo2" in args else None,
         "--nemo2-bar" in args)
