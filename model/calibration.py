"""Calibration to the user's own cluster: a few named, physical parameters of the cost model
fitted to measured iteration times and memory, with their uncertainty, and prediction
intervals from the fit.

Parameters (each multiplies a preset figure; bounds keep them physical):
- `gemm_scale`: the GPU's `gemm_efficiency` (large GEMMs' fraction of peak; capped at 1.0);
- `attention_scale`: its `attention_efficiency` (FlashAttention's fraction of peak);
- `network_scale`: every inter-node stream of the measured matrix (what NCCL achieves against
  what was measured or assumed);
- `nvlink_scale`: the intra-node links;
- `fragmentation`: `Overheads.fragmentation`, fitted apart on memory readings of the
  allocator's reserved peak (reserved = (1 + fragmentation) x the tensors counted).

Time fit: robust (Huber, delta 5%) bounded Levenberg-Marquardt on r_i = log(predicted_i /
measured_i) with a finite-difference Jacobian (the estimator is a black box here, the same one
`estimate` uses). Uncertainty: the covariance s^2 (J' W J)^-1 at the solution, s^2 the weighted
residual variance with n - p degrees of freedom (none when n <= p: the parameters are then
reported without an error bar). Prediction interval of a plan: var(log t) = g' C g + s^2, g the
gradient of log t in the parameters; 95% interval t exp(+-1.96 sd).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from .cluster import ClusterSpec
from .errors import SpecError
from .specs import Options

SCHEMA_VERSION = 1
KIND = "pipette-calibration"
TIME_PARAMETERS = {  # name -> (lower, upper) bounds of the multiplier
    "gemm_scale": (0.3, 2.0),
    "attention_scale": (0.3, 3.0),
    "network_scale": (0.1, 3.0),
    "nvlink_scale": (0.2, 2.0),
}
FRAGMENTATION_BOUNDS = (0.0, 1.0)
HUBER_DELTA = 0.05
Z95 = 1.959964


@dataclass
class Profile:
    """A fitted calibration for one GPU type (`gpu`): parameter values, their standard
    errors, the covariance of the fitted time parameters (in `names` order) and the residual
    standard deviation of log time."""

    gpu: str
    values: dict = field(default_factory=dict)
    stderr: dict = field(default_factory=dict)
    names: tuple = ()
    covariance: list = field(default_factory=list)
    residual_sd: float | None = None
    runs: list = field(default_factory=list)
    source: str = ""

    def to_dict(self) -> dict:
        return {"kind": KIND, "schema_version": SCHEMA_VERSION, "gpu": self.gpu,
                "parameters": {k: {"value": v, "stderr": self.stderr.get(k)}
                               for k, v in self.values.items()},
                "fitted": list(self.names), "covariance": self.covariance,
                "residual_sd_log": self.residual_sd, "runs": self.runs}


def apply_profile(prof: Profile | None, cluster: ClusterSpec, options: Options,
                  values: dict | None = None) -> tuple[ClusterSpec, Options]:
    """The cluster and options with the profile's parameters (or `values`) in place: the
    profile's GPU type on every node that has it, the network and NVLink scales on every
    link, the fragmentation allowance."""
    if prof is None and values is None:
        return cluster, options
    vals = dict(prof.values if prof is not None else {})
    vals.update(values or {})
    gpu_name = prof.gpu if prof is not None else None
    if gpu_name is not None and not any(nd.gpu.name == gpu_name for nd in cluster.nodes):
        raise SpecError(f"the profile is for {gpu_name}, which no node of {cluster.name} has; "
                        "calibrate on logs of this cluster's GPUs", source=prof.source,
                        field="gpu")
    g_s, a_s = vals.get("gemm_scale", 1.0), vals.get("attention_scale", 1.0)
    nv_s, net_s = vals.get("nvlink_scale", 1.0), vals.get("network_scale", 1.0)
    nodes = []
    for nd in cluster.nodes:
        gpu = nd.gpu
        if gpu_name is None or gpu.name == gpu_name:
            gpu = dataclasses.replace(gpu, gemm_efficiency=min(1.0, gpu.gemm_efficiency * g_s),
                                      attention_efficiency=min(
                                          1.0, gpu.attention_efficiency * a_s))
        mat = nd.intra_matrix_gb_per_s
        nodes.append(dataclasses.replace(
            nd, gpu=gpu, intra_gb_per_s=nd.intra_gb_per_s * nv_s,
            intra_matrix_gb_per_s=None if mat is None else mat * nv_s))
    out = dataclasses.replace(cluster, nodes=tuple(nodes),
                              inter_gb_per_s=cluster.inter_gb_per_s * net_s)
    if "fragmentation" in vals:
        options = dataclasses.replace(options, overheads=dataclasses.replace(
            options.overheads, fragmentation=vals["fragmentation"]))
    return out, options


@dataclass
class Run:
    """One measured run: its inputs (the plan it ran) and what its log says."""

    model: object
    job: object
    cluster: ClusterSpec
    plan: object
    options: Options
    measured_s: float
    memory_gib: float | None = None
    memory_kind: str = ""
    label: str = ""


def _predict(run: Run, values: dict, gpu: str) -> float:
    from .estimator import estimate
    prof = Profile(gpu)
    cl, opts = apply_profile(prof, run.cluster, run.options, values)
    return estimate(run.model, run.job, cl, run.plan, opts).iteration_ms / 1e3


def _residuals(runs, names, theta, fixed, gpu) -> np.ndarray:
    vals = dict(fixed)
    vals.update(zip(names, theta))
    return np.array([math.log(_predict(r, vals, gpu) / r.measured_s) for r in runs])


def _jacobian(runs, names, theta, fixed, gpu, r0) -> np.ndarray:
    J = np.zeros((len(runs), len(names)))
    for k, name in enumerate(names):
        lo, hi = TIME_PARAMETERS[name]
        h = 1e-4 * max(1.0, abs(theta[k]))
        step = h if theta[k] + h <= hi else -h
        t2 = theta.copy()
        t2[k] += step
        J[:, k] = (_residuals(runs, names, t2, fixed, gpu) - r0) / step
    return J


def fit(runs: list[Run], names: tuple[str, ...], gpu: str, max_iter: int = 40,
        fit_fragmentation: bool = True) -> tuple[Profile, dict]:
    """Fit the named time parameters (and the fragmentation allowance where memory readings
    of the reserved peak exist). Returns the profile and, per run, (before, after) predicted
    seconds."""
    for n in names:
        if n not in TIME_PARAMETERS:
            raise SpecError(f"unknown parameter {n!r}; fit any of "
                            f"{', '.join(TIME_PARAMETERS)}", source="options", field="--fit")
    if not runs:
        raise SpecError("no run to calibrate on", source="options", field="LOG")
    p = len(names)
    lo = np.array([TIME_PARAMETERS[n][0] for n in names])
    hi = np.array([TIME_PARAMETERS[n][1] for n in names])
    theta = np.ones(p)
    before = [_predict(r, {}, gpu) for r in runs]
    r = _residuals(runs, names, theta, {}, gpu)

    def weights(res):
        a = np.abs(res)
        return np.where(a <= HUBER_DELTA, 1.0, HUBER_DELTA / np.maximum(a, 1e-300))

    def cost(res):
        a = np.abs(res)
        return float(np.sum(np.where(a <= HUBER_DELTA, 0.5 * a ** 2,
                                     HUBER_DELTA * (a - 0.5 * HUBER_DELTA))))
    lam = 1e-3
    J = _jacobian(runs, names, theta, {}, gpu, r) if p else np.zeros((len(runs), 0))
    for _ in range(max_iter if p else 0):
        w = weights(r)
        A = J.T @ (w[:, None] * J)
        g = J.T @ (w * r)
        step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
        cand = np.clip(theta + step, lo, hi)
        r_c = _residuals(runs, names, cand, {}, gpu)
        if cost(r_c) < cost(r):
            done = np.max(np.abs(cand - theta)) < 1e-6
            theta, r = cand, r_c
            lam = max(lam / 10, 1e-9)
            J = _jacobian(runs, names, theta, {}, gpu, r)
            if done:
                break
        else:
            lam *= 10
            if lam > 1e8:
                break
    values = dict(zip(names, map(float, theta)))
    stderr: dict = {n: None for n in names}
    cov: list = []
    n = len(runs)
    sd = None
    if n > p:
        w = weights(r)
        s2 = float(np.sum(w * r ** 2) / (n - p))
        sd = math.sqrt(s2)
        if p:
            A = J.T @ (w[:, None] * J)
            try:
                C = s2 * np.linalg.inv(A)
                cov = C.tolist()
                stderr = {nm: float(math.sqrt(max(C[k, k], 0.0))) for k, nm in enumerate(names)}
            except np.linalg.LinAlgError:
                cov = []
    after = [_predict(rr, values, gpu) for rr in runs]
    # fragmentation: reserved peak = (1 + f) x tensors (robust: the median over the runs)
    mem_runs = [rr for rr in runs if rr.memory_gib and rr.memory_kind == "reserved"]
    if fit_fragmentation and mem_runs:
        from .estimator import estimate
        fs = []
        for rr in mem_runs:
            cl, opts = apply_profile(Profile(gpu), rr.cluster, rr.options, values)
            est = estimate(rr.model, rr.job, cl, rr.plan, opts)
            tensors = max(st.memory.total_gib - st.memory.allowance_gib for st in est.stages)
            fs.append(rr.memory_gib / tensors - 1)
        f = min(max(statistics.median(fs), FRAGMENTATION_BOUNDS[0]), FRAGMENTATION_BOUNDS[1])
        values["fragmentation"] = f
        stderr["fragmentation"] = (1.2533 * statistics.stdev(fs) / math.sqrt(len(fs))
                                   if len(fs) > 1 else None)
    prof = Profile(gpu, values, stderr, tuple(names), cov, sd)
    prof.runs = [{"label": rr.label, "measured_s": rr.measured_s, "before_s": b, "after_s": a,
                  "memory_gib": rr.memory_gib, "memory_kind": rr.memory_kind}
                 for rr, b, a in zip(runs, before, after)]
    return prof, {rr.label: (b, a) for rr, b, a in zip(runs, before, after)}


def interval_s(prof: Profile, model, job, cluster, plan, options) -> tuple[float, float, float]:
    """(prediction, low, high) in seconds, 95%, for a plan under the profile (`cluster` and
    `options` not yet calibrated). Without a residual spread the interval is the point."""
    run = Run(model, job, cluster, plan, options, 1.0)
    t = _predict(run, prof.values, prof.gpu)
    if prof.residual_sd is None:
        return t, t, t
    var = prof.residual_sd ** 2
    if prof.covariance and prof.names:
        C = np.array(prof.covariance)
        g = np.zeros(len(prof.names))
        for k, n in enumerate(prof.names):
            h = 1e-4 * max(1.0, abs(prof.values[n]))
            vals = dict(prof.values)
            vals[n] = prof.values[n] + h
            g[k] = (math.log(_predict(run, vals, prof.gpu)) - math.log(t)) / h
        var += float(g @ C @ g)
    sd = math.sqrt(var)
    return t, t * math.exp(-Z95 * sd), t * math.exp(Z95 * sd)
