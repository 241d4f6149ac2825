"""Calibration profile files (model/calibration.py fits them): versioned JSON, read with one
clear error per problem. Schema in the README ("Calibration profiles")."""

from __future__ import annotations

import json
from pathlib import Path

from model.calibration import (FRAGMENTATION_BOUNDS, KIND, SCHEMA_VERSION, TIME_PARAMETERS,
                               Profile)
from model.errors import SpecError
from .reading import read_text


def save_profile(path, prof: Profile) -> None:
    """Write the profile (formats.atomic: whole or not at all; non-finite values refused)."""
    from .atomic import write_atomic

    try:
        text = json.dumps(prof.to_dict(), indent=1, allow_nan=False) + "\n"
    except ValueError:
        raise SpecError("the fit gave a non-finite parameter; nothing was written",
                        source=str(path), field="--out") from None
    write_atomic(Path(path), text, field="--out")


def load_profile(path) -> Profile:
    """Read a profile file; every problem is one SpecError naming the file and the field."""
    src = str(path)
    text = read_text(path, field="calibration", what="the calibration profile")
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"not JSON ({e.msg} at line {e.lineno})", source=src,
                        field="calibration") from None
    if not isinstance(d, dict) or d.get("kind") != KIND:
        raise SpecError(f"not a calibration profile (kind must be {KIND!r}); write one with "
                        "`python cli.py calibrate`", source=src, field="kind")
    if d.get("schema_version") != SCHEMA_VERSION:
        raise SpecError(f"schema_version {d.get('schema_version')!r}; this version reads "
                        f"{SCHEMA_VERSION}", source=src, field="schema_version")
    if d.get("planning", True) is not True:
        raise SpecError("measured by probe/gemm.py in its CPU test mode, not on a GPU: not for "
                        "planning; run the probe on the GPUs you plan for", source=src,
                        field="planning")
    params = d.get("parameters")
    if not isinstance(d.get("gpu"), str) or not isinstance(params, dict):
        raise SpecError("needs gpu (a GPU preset name) and parameters", source=src,
                        field="parameters")
    known = set(TIME_PARAMETERS) | {"fragmentation"}
    values, stderr = {}, {}
    for k, v in params.items():
        if k not in known:
            raise SpecError(f"unknown parameter {k!r}; known: {', '.join(sorted(known))}",
                            source=src, field=f"parameters.{k}")
        val = v.get("value") if isinstance(v, dict) else None
        lo, hi = TIME_PARAMETERS.get(k, FRAGMENTATION_BOUNDS)
        if not isinstance(val, (int, float)) or isinstance(val, bool) or not lo <= val <= hi:
            raise SpecError(f"value must be a number in [{lo}, {hi}]", source=src,
                            field=f"parameters.{k}.value")
        values[k] = float(val)
        stderr[k] = v.get("stderr")
    names = tuple(d.get("fitted") or ())
    cov = d.get("covariance") or []
    if cov and (len(cov) != len(names) or any(len(r) != len(names) for r in cov)):
        raise SpecError("covariance must be a square matrix over the fitted parameters",
                        source=src, field="covariance")
    uninformed = d.get("uninformed") or []
    if not isinstance(uninformed, list) or not set(uninformed) <= set(names):
        raise SpecError("must list fitted parameters (those in 'fitted')", source=src,
                        field="uninformed")
    return Profile(d["gpu"], values, stderr, names, cov, d.get("residual_sd_log"),
                   d.get("runs") or [], src, device=str(d.get("device") or ""),
                   kernels=d.get("kernels") or [], uninformed=tuple(uninformed))
