"""The files a plan can be turned into, as one call: the plan file, a framework's launch set and
the pictures. Used by `estimate`, `solve` and `emit`.

Everything is checked and built before the first byte is written (formats.atomic): a bad later
option, a plan that does not fit, or a target that cannot be written leaves no output behind
and no earlier file changed; each file is then written through a temporary file and a rename,
and the launch set as a whole."""

from __future__ import annotations

from pathlib import Path

from formats.atomic import check_set, check_target, write_set
from formats.planfile import save_plan as write_plan
from model.errors import SpecError
from model.estimator import Evaluator

from . import pictures
from .emit import check_framework, launch_set, tagged, warnings_text

# where --tokenizer goes nowhere: the files launch.emit writes for these frameworks have no
# tokenizer key (it writes megatron_args.txt's --tokenizer-model and NeMo's model.tokenizer)
NO_TOKENIZER_KEY = {
    "torchtitan": "torchtitan.toml has no tokenizer key: set the tokenizer assets of its "
                  "[model] section to it yourself",
    "deepspeed": "ds_config.json has no tokenizer key (DeepSpeed's config holds none): give it "
                 "to train.py's own arguments yourself"}


def _tokenizer_unused(framework: str, tokenizer: str | None) -> str | None:
    """The warning for a --tokenizer the framework's emitted files cannot carry, or None."""
    fw = check_framework(framework)
    if tokenizer is None or fw not in NO_TOKENIZER_KEY:
        return None
    return tagged(fw, "model", f"--tokenizer {tokenizer!r} is not written: "
                  + NO_TOKENIZER_KEY[fw])


def check_outputs(*, save_plan: Path | None = None, emit: str | None = None,
                  out: Path | None = None, gantt: Path | None = None,
                  placement_png: Path | None = None, force: bool = False,
                  tokenizer: str | None = None, version: str | None = None,
                  job_framework: str | None = None) -> None:
    """The output options, checked before any work: combinations, the framework name, and
    targets that cannot be written (a folder as a file, a file as a folder, a folder of
    someone else's files without --force). A torchtitan job (`job_framework`) takes
    --framework-version without --emit: its estimate follows the release (JobSpec.repeat_kv)."""
    from formats.atomic import check_set

    from .emit import check_framework

    if out is not None and emit is None:
        raise SpecError("is the folder for --emit; add --emit FRAMEWORK",
                        source="options", field="--out")
    if tokenizer is not None and emit is None:
        raise SpecError("is for --emit; add --emit FRAMEWORK", source="options",
                        field="--tokenizer")
    if tokenizer is not None and any(ch.isspace() for ch in tokenizer):
        # megatron_args.txt holds a flag and its value per line, split into words by
        # launch.sh: a path with a space would reach Megatron-LM as two arguments
        raise SpecError(f"{tokenizer!r} has a space, which the emitted argument files cannot "
                        "carry as one word; give a path without one (a symbolic link to it)",
                        source="options", field="--tokenizer")
    if version is not None and emit is None:
        if job_framework is None:  # estimate --plan: the plan keeps the release it was priced for
            raise SpecError("beside --plan only picks the release of the files --emit writes "
                            "(the plan keeps the release it was priced for); add --emit "
                            "FRAMEWORK, or re-estimate the job with --framework-version",
                            source="options", field="--framework-version")
        if job_framework != "torchtitan":
            raise SpecError("is for --emit, and for the estimate of a torchtitan job; add "
                            "--emit FRAMEWORK", source="options", field="--framework-version")
        check_framework("torchtitan", version)
    if emit is not None:
        check_framework(emit, version)
    for path, field in ((save_plan, "--save-plan"), (gantt, "--gantt"),
                        (placement_png, "--placement-png")):
        if path is not None:
            check_target(Path(path), field)
            if field != "--save-plan":
                pictures.picture_format(path, field)
    if emit is not None:
        check_set(Path(out or f"launch-{emit.lower()}"), (), force=force)


def write_outputs(m, job, c, plan, est, opts, *, save_plan: Path | None = None,
                  emit: str | None = None, out: Path | None = None, gantt: Path | None = None,
                  placement_png: Path | None = None, solver: dict | None = None,
                  calibration: dict | None = None, force: bool = False,
                  tokenizer: str | None = None, version: str | None = None,
                  measured: tuple | None = None) -> tuple[list[Path], list[str]]:
    """Plan file, launch files and pictures, as asked; returns (files written, warnings).
    `c` and `opts` as the estimate used them (calibrated, where `calibration` says so);
    `measured`: the cluster and options before the profile, what the plan file holds."""
    # (without --emit the version was the estimate's, checked with the job's inputs)
    check_outputs(save_plan=save_plan, emit=emit, out=out, gantt=gantt,
                  placement_png=placement_png, force=force, tokenizer=tokenizer,
                  version=version if emit is not None else None)
    ls = None
    if emit is not None:
        ls = launch_set(emit, m, job, c, plan, est=est, options=opts, force=force,
                        tokenizer=tokenizer, version=version)
        unused = _tokenizer_unused(emit, tokenizer)
        if unused:  # said, not dropped (it had been written nowhere without a word)
            ls.warnings.insert(0, unused)
            ls.files["warnings.txt"] = warnings_text(ls.warnings)
        folder = Path(out or f"launch-{emit.lower()}")
        check_set(folder, ls.files, force=force)
    files: list[Path] = []
    warnings: list[str] = []
    if save_plan is not None:
        c0, opts0 = measured if measured is not None else (c, opts)
        write_plan(save_plan, m, job, c0, plan, est, solver, opts0, calibration,
                   {"framework": emit.lower(), "version": version}
                   if emit is not None and version is not None else None)
        files.append(Path(save_plan))
    if ls is not None:
        files += write_set(folder, ls.files, modes={n: 0o755 for n in ls.executable},
                           force=force)
        warnings += ls.warnings
    if gantt is not None:
        files.append(pictures.gantt_png(Evaluator(m, job, c, plan.shape, opts), plan.placement,
                                        gantt))
    if placement_png is not None:
        files.append(pictures.placement_png(c, plan, placement_png))
    return files, warnings
