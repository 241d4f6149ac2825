"""Calibration profile files (model/calibration.py fits them): versioned JSON, read with one
clear error per problem. Schema in the README ("Calibration profiles")."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from model.calibration import (FRAGMENTATION_BOUNDS, KIND, SCHEMA_VERSION, TIME_PARAMETERS,
                               Profile)
from model.errors import SpecError
from .reading import finite_number, read_text, unknown_keys

# every field a profile may hold (Profile.to_dict writes them; probe/gemm.py adds the last three)
_KEYS = ("kind", "schema_version", "gpu", "parameters", "fitted", "covariance",
         "residual_sd_log", "residual_dof", "residual_sd_assumed", "noise_prior_dof",
         "prior_sd_log", "runs",
         "uninformed", "fragmentation_spread", "planning", "device", "kernels")


# each run's and each probed kernel's fields (Profile.runs, fit; fit_kernels)
_RUN_KEYS = ("label", "measured_s", "before_s", "after_s", "memory_gib", "memory_kind",
             "memory_stage")
_KERNEL_KEYS = ("kind", "shape", "dtype", "measured_ms", "before_ms", "after_ms")


# a probed kernel's shape (model/calibration.py KernelReading): its kind's dimensions
_KERNEL_SHAPES = {"gemm": "m, n, k", "attention": "batch, heads, seq, head_dim",
                  "elementwise": "bytes", "allreduce": "bytes, GPUs", "allgather": "bytes, GPUs"}
_KERNEL_DTYPES = ("bf16", "fp16", "fp32")  # what probe/gemm.py times (--dtype; fp32 on a CPU)


def _check_kernel(x: dict, src: str, where: str) -> None:
    """One probed kernel's record, as fit_kernels writes it: a profile's kernels travel into
    plan files whole, so a malformed one is refused, not carried (README: nothing in a
    profile is silently dropped)."""
    unknown_keys(x, _KERNEL_KEYS, src, where)
    kind = x.get("kind")
    if kind not in _KERNEL_SHAPES:
        raise SpecError(f"must be one of {', '.join(_KERNEL_SHAPES)}, got "
                        f"{json.dumps(kind)[:40]}", source=src, field=f"{where}.kind")
    dims = _KERNEL_SHAPES[kind].split(", ")
    shape = x.get("shape")
    what = f"[{_KERNEL_SHAPES[kind]}] of a {kind} kernel, each above 0"
    if not isinstance(shape, list) or len(shape) != len(dims):
        raise SpecError(f"must be {what}, got {json.dumps(shape)[:60]}", source=src,
                        field=f"{where}.shape")
    for i, v in enumerate(shape):
        if finite_number(v, src, f"{where}.shape[{i}]", what) <= 0:
            raise SpecError(f"must be {what}, got {v}", source=src, field=f"{where}.shape[{i}]")
    if x.get("dtype") not in _KERNEL_DTYPES:
        raise SpecError(f"must be one of {', '.join(_KERNEL_DTYPES)}, got "
                        f"{json.dumps(x.get('dtype'))[:40]}", source=src, field=f"{where}.dtype")
    for key in ("measured_ms", "before_ms", "after_ms"):
        if finite_number(x.get(key), src, f"{where}.{key}", "a time in ms, above 0") <= 0:
            raise SpecError(f"must be a time in ms, above 0, got {x[key]}", source=src,
                            field=f"{where}.{key}")


def save_profile(path, prof: Profile) -> None:
    """Write the profile (formats.atomic: whole or not at all; non-finite values refused)."""
    from .atomic import write_atomic

    try:
        text = json.dumps(prof.to_dict(), indent=1, allow_nan=False) + "\n"
    except ValueError:
        raise SpecError("the fit gave a non-finite parameter; nothing was written",
                        source=str(path), field="--out") from None
    try:  # what is written is read back by --calibration: nothing it would refuse (the CPU
        # probe's test profile, wide bounds and all, is refused for planning on purpose)
        if prof.planning:
            profile_from_dict(json.loads(text), str(path))
    except SpecError as e:
        raise SpecError(f"the fit gave a profile that cannot be used ({e}); nothing was "
                        "written", source=str(path), field="--out") from None
    write_atomic(Path(path), text, field="--out")


def _optional_at_least_0(v, src: str, fld: str, what: str) -> float | None:
    """None, or a finite number >= 0 (one line naming the field otherwise)."""
    if v is None:
        return None
    x = finite_number(v, src, fld, what)
    if x < 0:
        raise SpecError(f"must be {what}, got {x}", source=src, field=fld)
    return x


def _covariance(cov, p: int, src: str, names=()) -> list:
    """The fitted parameters' covariance: empty, or p x p finite numbers, symmetric and
    positive semi-definite (what a fit can give: model/calibration.py), no parameter's sd
    wider than its whole range (TIME_PARAMETERS' bounds; a wider one says nothing more and
    had given intervals to 1e22 s)."""
    if not cov:
        return []
    if (not isinstance(cov, list) or len(cov) != p
            or any(not isinstance(r, list) or len(r) != p for r in cov)):
        raise SpecError("must be a square matrix of numbers over the fitted parameters",
                        source=src, field="covariance")
    for r in cov:
        for x in r:
            finite_number(x, src, "covariance", "a square matrix of finite numbers")
    C = np.array(cov, dtype=float)
    scale = max(float(np.max(np.abs(C))), 1e-300)
    if (not np.allclose(C, C.T, rtol=1e-6, atol=1e-12 * scale)
            or float(np.min(np.linalg.eigvalsh((C + C.T) / 2))) < -1e-9 * scale):
        raise SpecError("must be symmetric and positive semi-definite (a covariance)",
                        source=src, field="covariance")
    for k, nm in enumerate(names):
        lo, hi = TIME_PARAMETERS.get(nm, (0.0, math.inf))
        if C[k, k] > (hi - lo) ** 2:
            raise SpecError(f"gives {nm} an sd of {math.sqrt(C[k, k]):.3g}, wider than its "
                            f"whole range ({lo:g} to {hi:g}): not a fit's covariance",
                            source=src, field="covariance")
    return cov


def load_profile(path) -> Profile:
    """Read a profile file; every problem is one SpecError naming the file and the field."""
    src = str(path)
    text = read_text(path, field="calibration", what="the calibration profile")
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"not JSON ({e.msg} at line {e.lineno})", source=src,
                        field="calibration") from None
    except RecursionError:
        raise SpecError("nested too deeply to be a calibration profile", source=src,
                        field="calibration") from None
    return profile_from_dict(d, src)


def profile_from_dict(d, src: str) -> Profile:
    """A profile from its parsed document (a file's, or the one a plan file carries);
    every problem is one SpecError naming `src` and the field."""
    if not isinstance(d, dict) or d.get("kind") != KIND:
        raise SpecError(f"not a calibration profile (kind must be {KIND!r}); write one with "
                        "`python cli.py calibrate` (from logs) or probe/gemm.py (by timing "
                        "kernels)", source=src, field="kind")
    if type(d.get("schema_version")) is not int or d["schema_version"] != SCHEMA_VERSION:
        raise SpecError(f"schema_version {d.get('schema_version')!r}; this version reads "
                        f"{SCHEMA_VERSION}: write the profile again with this version "
                        "(`calibrate` on the runs' logs, or probe/gemm.py for a probe's)",
                        source=src, field="schema_version")
    unknown_keys(d, _KEYS, src)
    if not isinstance(d.get("planning", True), bool):
        raise SpecError(f"must be true or false, got {str(json.dumps(d['planning']))[:40]}",
                        source=src, field="planning")
    if d.get("planning", True) is not True:
        raise SpecError("measured by probe/gemm.py in its CPU test mode, not on a GPU: not for "
                        "planning; run the probe on the GPUs you plan for", source=src,
                        field="planning")
    params = d.get("parameters")
    if not isinstance(d.get("gpu"), str):
        raise SpecError("needs gpu, the GPU preset name the profile was fitted for",
                        source=src, field="gpu")
    if not isinstance(params, dict):
        raise SpecError("needs parameters, each fitted value with its standard error",
                        source=src, field="parameters")
    if "fitted" not in d:
        raise SpecError("needs fitted, the list of time parameters the fit fitted ([] for "
                        "none)", source=src, field="fitted")
    known = set(TIME_PARAMETERS) | {"fragmentation"}
    values, stderr = {}, {}
    for k, v in params.items():
        if k not in known:
            raise SpecError(f"unknown parameter {k!r}; known: {', '.join(sorted(known))}",
                            source=src, field=f"parameters.{k}")
        if isinstance(v, dict):
            unknown_keys(v, ("value", "stderr"), src, f"parameters.{k}")
        val = v.get("value") if isinstance(v, dict) else None
        lo, hi = TIME_PARAMETERS.get(k, FRAGMENTATION_BOUNDS)
        if not isinstance(val, (int, float)) or isinstance(val, bool) or not lo <= val <= hi:
            raise SpecError(f"value must be a number in [{lo}, {hi}]", source=src,
                            field=f"parameters.{k}.value")
        values[k] = float(val)
        stderr[k] = _optional_at_least_0(v.get("stderr"), src, f"parameters.{k}.stderr",
                                         "a standard error (a number, 0 or more) or null")
    fitted = d.get("fitted") or []
    if (not isinstance(fitted, list) or not all(isinstance(x, str) for x in fitted)
            or len(set(fitted)) != len(fitted)
            or not all(x in TIME_PARAMETERS and x in values for x in fitted)):
        raise SpecError("must list distinct time parameters, each with its value in "
                        "'parameters'", source=src, field="fitted")
    names = tuple(fitted)
    cov = _covariance(d.get("covariance") or [], len(names), src, names)
    uninformed = d.get("uninformed") or []
    if (not isinstance(uninformed, list) or not all(isinstance(x, str) for x in uninformed)
            or not set(uninformed) <= set(names)):
        raise SpecError("must list fitted parameters (those in 'fitted')", source=src,
                        field="uninformed")
    runs = d.get("runs") or []
    if not isinstance(runs, list) or not all(isinstance(x, dict) for x in runs):
        raise SpecError("must be the list of runs the profile was fitted on (one object per "
                        "run)", source=src, field="runs")
    for k, x in enumerate(runs):
        unknown_keys(x, _RUN_KEYS, src, f"runs[{k}]")
        # seconds the fit measured and predicted (a -1 had been read, and printed as a run)
        for key in ("measured_s", "before_s", "after_s"):
            if finite_number(x.get(key), src, f"runs[{k}].{key}",
                             "an iteration time in seconds, above 0") <= 0:
                raise SpecError(f"must be an iteration time in seconds, above 0, got {x[key]}",
                                source=src, field=f"runs[{k}].{key}")
        if x.get("memory_gib") is not None and finite_number(
                x["memory_gib"], src, f"runs[{k}].memory_gib", "GiB above 0, or null") <= 0:
            raise SpecError(f"must be GiB above 0, or null, got {x['memory_gib']}", source=src,
                            field=f"runs[{k}].memory_gib")
    kernels = d.get("kernels") or []
    if not isinstance(kernels, list) or not all(isinstance(x, dict) for x in kernels):
        raise SpecError("must be the list of kernels the probe timed (one object per kernel)",
                        source=src, field="kernels")
    for k, x in enumerate(kernels):
        _check_kernel(x, src, f"kernels[{k}]")
    if not isinstance(d.get("device", ""), str):
        raise SpecError("must be the probed device's name (a string)", source=src,
                        field="device")
    what = "a standard deviation of log time (a number from 0 to 10) or null"
    sd = _optional_at_least_0(d.get("residual_sd_log"), src, "residual_sd_log", what)
    if sd is not None and sd >= 10:
        raise SpecError(f"must be {what}, got {sd}", source=src, field="residual_sd_log")
    dof = d.get("residual_dof")
    if dof is not None and (not isinstance(dof, int) or isinstance(dof, bool) or dof < 1):
        raise SpecError("must be the residual spread's degrees of freedom (runs less fitted "
                        "parameters, at least 1) or null", source=src, field="residual_dof")
    assumed = d.get("residual_sd_assumed", False)
    if not isinstance(assumed, bool):
        raise SpecError("must be true or false", source=src, field="residual_sd_assumed")
    if assumed and dof is not None:
        raise SpecError("an assumed spread has no degrees of freedom: set residual_dof to null, "
                        "or residual_sd_assumed to false for a measured one", source=src,
                        field="residual_sd_assumed")
    if sd is None and (dof is not None or assumed):
        raise SpecError("degrees of freedom or an assumed spread without a spread: give "
                        "residual_sd_log, or set residual_dof to null and residual_sd_assumed "
                        "to false", source=src, field="residual_sd_log")
    prior_dof = d.get("noise_prior_dof", 0)  # profiles written before it: none pooled
    if not isinstance(prior_dof, int) or isinstance(prior_dof, bool) or prior_dof < 0 or (
            prior_dof and not assumed):
        raise SpecError("must be the degrees of freedom an assumed residual_sd_log is worth "
                        "to the intervals (an integer, 0 or more; 0 where the spread is "
                        "measured or there is none)", source=src, field="noise_prior_dof")
    spread = d.get("fragmentation_spread") or {}
    what = ("{sd: the readings' sample sd (null below 2 readings), readings: how many}")
    if isinstance(spread, dict):
        unknown_keys(spread, ("sd", "readings"), src, "fragmentation_spread")
    f_n = spread.get("readings", 0) if isinstance(spread, dict) else -1
    if not (isinstance(f_n, int) and not isinstance(f_n, bool) and f_n >= 0):
        raise SpecError(f"must be {what}", source=src, field="fragmentation_spread")
    f_sd = _optional_at_least_0(spread.get("sd"), src, "fragmentation_spread", what)
    if f_sd is not None and (f_n < 2 or f_sd > 1.0):  # fragmentation itself spans 0 to 1
        raise SpecError(f"must be {what}", source=src, field="fragmentation_spread")
    if f_n and "fragmentation" not in values:
        raise SpecError("a spread of memory readings without the fragmentation fitted on them: "
                        "give parameters.fragmentation, or drop fragmentation_spread",
                        source=src, field="fragmentation_spread")
    prior = d.get("prior_sd_log") or {}
    if not isinstance(prior, dict) or not set(prior) <= set(TIME_PARAMETERS):
        raise SpecError("must map time parameters to the prior's sd of log (what the fit "
                        "used) or be empty", source=src, field="prior_sd_log")
    prior = {k: _optional_at_least_0(v, src, f"prior_sd_log.{k}", "a number, 0 or more")
             for k, v in prior.items()}
    return Profile(d["gpu"], values, stderr, names, cov, sd,
                   runs, src, residual_dof=dof, residual_sd_assumed=assumed,
                   noise_prior_dof=prior_dof,
                   fragmentation_sd=f_sd, fragmentation_readings=f_n,
                   device=str(d.get("device") or ""),
                   kernels=kernels, uninformed=tuple(uninformed),
                   prior_sd=prior)
