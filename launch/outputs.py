"""The files a plan can be turned into, as one call: the plan file, a framework's launch set and
the pictures. Used by `estimate`, `solve` and `emit`."""

from __future__ import annotations

from pathlib import Path

from formats.planfile import save_plan as write_plan
from model.errors import SpecError
from model.estimator import Evaluator

from . import pictures
from .emit import emit as write_launch


def write_outputs(m, job, c, plan, est, opts, *, save_plan: Path | None = None,
                  emit: str | None = None, out: Path | None = None, gantt: Path | None = None,
                  placement_png: Path | None = None, solver: dict | None = None,
                  calibration: dict | None = None) -> tuple[list[Path], list[str]]:
    """Plan file, launch files and pictures, as asked; returns (files written, warnings)."""
    if out is not None and emit is None:
        raise SpecError("is the folder for --emit; add --emit FRAMEWORK",
                        source="options", field="--out")
    files: list[Path] = []
    warnings: list[str] = []
    if save_plan is not None:
        write_plan(save_plan, m, job, c, plan, est, solver, opts, calibration)
        files.append(save_plan)
    if emit is not None:
        f, w = write_launch(emit, m, job, c, plan, out or Path(f"launch-{emit.lower()}"))
        files += f
        warnings += w
    if gantt is not None:
        files.append(pictures.gantt_png(Evaluator(m, job, c, plan.shape, opts), plan.placement,
                                        gantt))
    if placement_png is not None:
        files.append(pictures.placement_png(c, plan, placement_png))
    return files, warnings
