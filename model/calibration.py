"""Calibration to the user's own cluster: a few named, physical parameters of the cost model
fitted to measured iteration times and memory, with their uncertainty, and prediction
intervals from the fit.

Parameters (each multiplies a preset figure; bounds keep them physical):
- `gemm_scale`: the GPU's `gemm_efficiency` and `fp8_gemm_efficiency` (large GEMMs' fraction
  of peak; capped at 1.0);
- `attention_scale`: its `attention_efficiency` (FlashAttention's fraction of peak);
- `network_scale`: every inter-node stream of the measured matrix (what NCCL achieves against
  what was measured or assumed);
- `nvlink_scale`: the intra-node links;
- `hbm_scale`: its `hbm_efficiency` (element-wise kernels' fraction of the datasheet HBM
  bandwidth; capped at 1.0);
- `intra_latency_scale`: the cluster's `intra_latency_us`, the per-step latency of a
  collective inside a node (the tensor-parallel rings pay it 2 (TP - 1) times per
  all-reduce: a cost per layer and micro-batch that grows with TP, whatever the bytes);
- `kernel_overhead_us`: the GPU's `kernel_overhead_us` itself, the gap every kernel adds
  (launch, host dispatch), in microseconds: not a multiplier (the presets' is 0); it starts at
  the preset and its prior is on its distance from it;
- `fragmentation`: `Overheads.fragmentation`, fitted apart on memory readings of the
  allocator's reserved peak (reserved = (1 + fragmentation) x the tensors counted).

Time fit: robust (Huber, delta 5%) bounded Levenberg-Marquardt on r_i = log(predicted_i /
measured_i) with a finite-difference Jacobian (the estimator is a black box here, the same one
`estimate` uses). A prior keeps what a few runs cannot pin near the preset: each multiplier's
log (an absolute parameter's distance from its preset) has a normal prior around 0 with sd
`PRIOR_SD` (how far a cluster plausibly sits from its preset), entered as one more residual
(noise / sd) log(theta) (or theta - preset) per parameter, `noise` the
run-to-run noise of one measured time; the fit is the posterior mode (MAP). Without it, three
runs of a group fit two parameters exactly and predict the group's other runs worse than the
presets (bench/calibration_loo.py --no-prior). `noise` is NOISE_SD, or where larger the
residual spread (n - p degrees of freedom) of the best fit to the runs alone: runs that the
parameters cannot reconcile are noisier than assumed, and the prior then weighs more
(empirical Bayes; BLOOM's pre-launch runs, bench/README.md). (Taken from the prior's own fit
and re-fitted, the spread had fed on itself: runs all 2x slower than the presets stayed
uncalibrated.) Uncertainty: the covariance
s^2 (J' W J)^-1 at the solution, J with the prior's rows, s^2 the residual variance of the runs
with n - p degrees of freedom, unweighted (the Huber weights discount large residuals in the
fit, but a new measurement's spread includes them: with 5% noise the weighted spread left
12-run intervals at 91% coverage, the plain one 94%: bench/interval_coverage.py). With no
more runs than parameters the spread cannot be measured: with the prior, s is the assumed
NOISE_SD, worth NOISE_PRIOR_DOF degrees of freedom, and C the posterior covariance
NOISE_SD^2 (J' W J + P)^-1 (P the prior's precision in the same units), both marked assumed;
without it the parameters are not determined and nothing has an interval. Prediction
interval of a plan: var(log t) = g' C g + s^2, g the gradient of log t in the parameters; 95%
interval t exp(+-q sd), q Student's t quantile at the spread's degrees of freedom, n - p
measured or NOISE_PRIOR_DOF assumed (the spread of a few runs is itself uncertain;
bench/interval_coverage.py; `spread_dof`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from .cluster import ClusterSpec
from .errors import SpecError
from .specs import GPUSpec, Options, element_bytes

SCHEMA_VERSION = 1
# A run measured this many times slower or faster than its prediction is not refitted: no
# parameter's bounds (TIME_PARAMETERS) reach so far, so the log is another plan's, or garbled
IMPLAUSIBLE_RATIO = 10.0
KIND = "pipette-calibration"
TIME_PARAMETERS = {  # name -> (lower, upper) bounds of the multiplier
    "gemm_scale": (0.3, 2.0),
    "attention_scale": (0.3, 3.0),
    "network_scale": (0.1, 3.0),
    "nvlink_scale": (0.2, 2.0),
    "hbm_scale": (0.3, 2.0),
    "intra_latency_scale": (0.1, 100.0),
    "kernel_overhead_us": (0.0, 50.0),  # microseconds, not a multiplier (ABSOLUTE)
}
# parameters that replace a preset figure rather than multiply it: they start at the preset
# (the GPU's own figure) and their prior is on the distance from it (sd in the parameter's
# unit), not on a log
ABSOLUTE = frozenset({"kernel_overhead_us"})
# prior sd of log(multiplier): efficiencies of compute kernels within ~15-20% of the preset
# (clocks, power limits: the torchtitan 500 W H100 runs at 0.77 of the SXM curve,
# bench/fit_h100_500w.py), links within ~50% (NCCL over Omni-Path, InfiniBand or RoCE, and
# how many NICs a node really uses)
# the least known: nccl-tests' small-message all-reduce on an NVSwitch node is ~10 us a step,
# what a training step pays per collective (launches, synchronization) can be several times
# that, so a factor e per sd
# a kernel's host-side gap: CUDA's launch latency is a few us, eager PyTorch's dispatch tens
# (bench/fit_compute.py bounds the A100 fit to 0-50 us), so 10 us per sd
PRIOR_SD = {"gemm_scale": 0.15, "attention_scale": 0.2, "network_scale": 0.5,
            "nvlink_scale": 0.3, "hbm_scale": 0.2, "intra_latency_scale": 1.0,
            "kernel_overhead_us": 10.0}
# run-to-run noise of one measured iteration time (log): BLOOM's two identical DP8/TP4/PP12
# rows differ by 2.7% (data/published_runs.json); 5% as the scale the prior is weighed against
NOISE_SD = 0.05
# With no more runs than parameters the intervals' spread is NOISE_SD, assumed, and Student's
# t takes it as worth this many degrees of freedom, as uncertain as a spread measured on one
# run more than parameters (the scaled-inverse-chi-square prior on a normal variance, whose
# predictive is t at its degrees of freedom: Gelman et al., Bayesian Data Analysis, 3rd ed.,
# Sec. 3.3). Taken as exact (1.96 x 5%), 2 runs gave narrower intervals than 3 (12.7 x a
# measured 1-degree spread): an auditor's 24% against 50%, bench/interval_coverage.py's 42%
# against 382%. A measured spread stays the runs' alone: pooled with the 5% (tried
# 2026-12-03, bench/README.md) it covered 69-89% of BLOOM's and torchtitan's held-out runs,
# whose errors are not 5% noise
NOISE_PRIOR_DOF = 1
# weigh the prior against the spread the runs leave where that exceeds NOISE_SD (`fit`)
EMPIRICAL_NOISE = True
FRAGMENTATION_BOUNDS = (0.0, 1.0)
HUBER_DELTA = 0.05
# a fitted parameter whose doubling moves every run's predicted time by less than this share
# (d log t / d multiplier at the preset) cannot be told from the runs: e.g. intra_latency_scale
# on runs without tensor parallelism or collectives inside a node
UNINFORMED_SLOPE = 1e-3
Z95 = 1.959964
# Student's t two-sided 95% quantiles (the 0.975 point) for 1-30 degrees of freedom (NIST/
# SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2, critical values of the t distribution)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(dof: int | None) -> float:
    """The 95% two-sided quantile for a spread measured with `dof` degrees of freedom (None:
    a spread assumed, not measured: the normal's). Beyond the table, the Cornish-Fisher
    expansion of t in 1 / dof (Abramowitz and Stegun 26.7.5), within 0.001 of it at 30."""
    if dof is None:
        return Z95
    if dof < 1:
        raise ValueError("a measured spread needs at least one degree of freedom")
    if dof <= len(T975):
        return T975[dof - 1]
    z = Z95
    return z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)


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
    planning: bool = True  # False: measured in the probe's CPU test mode, refused for planning
    device: str = ""  # what the probe ran on
    kernels: list = field(default_factory=list)  # the probe's timed kernels
    # what the probe's fit should tell its user (fit_kernels; not written to the file)
    fit_notes: list = field(default_factory=list, compare=False)
    prior_sd: dict = field(default_factory=dict)  # the prior the fit used (empty: none)
    # fitted parameters no run's time depends on (UNINFORMED_SLOPE): left to the prior
    uninformed: tuple = ()
    # degrees of freedom of a measured residual_sd (n - p); None where it was assumed (the
    # prior's NOISE_SD, residual_sd_assumed) or there is none
    residual_dof: int | None = None
    residual_sd_assumed: bool = False
    # the degrees of freedom an assumed residual_sd is worth to the intervals
    # (NOISE_PRIOR_DOF; 0: measured, or assumed exact as profiles written before it were)
    noise_prior_dof: int = 0
    # the spread of the memory readings' fragmentation (reading / tensors - 1) over the runs
    # (sample sd; None with fewer than 2 readings) and how many readings it is of
    fragmentation_sd: float | None = None
    fragmentation_readings: int = 0

    def at_bounds(self) -> dict[str, str]:
        """Fitted parameters that ended on an edge of their range: name -> "lower" or
        "upper" (the runs ask for more than the range allows)."""
        out = {}
        for k, v in self.values.items():
            lo, hi = TIME_PARAMETERS.get(k, FRAGMENTATION_BOUNDS)
            if k in ABSOLUTE and v <= lo + 1e-9:  # no overhead at all: a floor, not a limit
                continue
            if v <= lo * (1 + 1e-6):
                out[k] = "lower"
            elif v >= hi * (1 - 1e-6):
                out[k] = "upper"
        return out

    def to_dict(self) -> dict:
        d = {"kind": KIND, "schema_version": SCHEMA_VERSION, "gpu": self.gpu,
             "parameters": {k: {"value": v, "stderr": self.stderr.get(k)}
                            for k, v in self.values.items()},
             "fitted": list(self.names), "covariance": self.covariance,
             "residual_sd_log": self.residual_sd, "residual_dof": self.residual_dof,
             "residual_sd_assumed": self.residual_sd_assumed,
             "noise_prior_dof": self.noise_prior_dof, "prior_sd_log": self.prior_sd,
             "runs": self.runs}
        if self.uninformed:
            d["uninformed"] = list(self.uninformed)
        if self.fragmentation_readings:
            d["fragmentation_spread"] = {"sd": self.fragmentation_sd,
                                         "readings": self.fragmentation_readings}
        if self.kernels or not self.planning:
            d.update(planning=self.planning, device=self.device, kernels=self.kernels)
        return d


def scaled_gpu(gpu: GPUSpec, values: dict) -> GPUSpec:
    """The GPU type with the profile's multipliers on its efficiencies (each a fraction of
    the datasheet figure, so at most 1)."""
    g8 = gpu.fp8_gemm_efficiency
    return dataclasses.replace(
        gpu, gemm_efficiency=min(1.0, gpu.gemm_efficiency * values.get("gemm_scale", 1.0)),
        fp8_gemm_efficiency=None if g8 is None else min(1.0, g8 * values.get("gemm_scale", 1.0)),
        attention_efficiency=min(1.0, gpu.attention_efficiency
                                 * values.get("attention_scale", 1.0)),
        hbm_efficiency=min(1.0, gpu.hbm_efficiency * values.get("hbm_scale", 1.0)),
        kernel_overhead_us=values.get("kernel_overhead_us", gpu.kernel_overhead_us))


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
    nv_s, net_s = vals.get("nvlink_scale", 1.0), vals.get("network_scale", 1.0)
    nodes = []
    for nd in cluster.nodes:
        gpu = nd.gpu
        if gpu_name is None or gpu.name == gpu_name:
            gpu = scaled_gpu(gpu, vals)
        mat = nd.intra_matrix_gb_per_s
        nodes.append(dataclasses.replace(
            nd, gpu=gpu, intra_gb_per_s=nd.intra_gb_per_s * nv_s,
            intra_matrix_gb_per_s=None if mat is None else mat * nv_s))
    out = dataclasses.replace(cluster, nodes=tuple(nodes),
                              inter_gb_per_s=cluster.inter_gb_per_s * net_s,
                              intra_latency_us=cluster.intra_latency_us
                              * vals.get("intra_latency_scale", 1.0))
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
    # the pipeline stage memory_gib is of, or a tuple of stages (the largest of theirs); None:
    # the largest stage's (formats/logs.py, formats/runs.memory_stages)
    memory_stage: int | tuple | None = None


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
    """Finite differences, each parameter stepped up and down within its bounds; the side
    that moves the runs more counts. A parameter at a kink moves them one way only: hbm_scale
    at 1 on a GPU whose hbm_efficiency is already 1 (the efficiency is capped there, so only
    a smaller scale slows anything), where the step up alone had read as 'no run depends on
    it' and the fit could not go below the preset."""
    J = np.zeros((len(runs), len(names)))
    for k, name in enumerate(names):
        lo, hi = TIME_PARAMETERS[name]
        h = 1e-4 * max(1.0, abs(theta[k]))
        best = None
        for step in (h, -h):
            if not lo <= theta[k] + step <= hi:
                continue
            t2 = theta.copy()
            t2[k] += step
            col = (_residuals(runs, names, t2, fixed, gpu) - r0) / step
            if best is None or np.max(np.abs(col)) > np.max(np.abs(best)):
                best = col
        J[:, k] = best
    return J


def _huber_weights(res: np.ndarray) -> np.ndarray:
    a = np.abs(res)
    return np.where(a <= HUBER_DELTA, 1.0, HUBER_DELTA / np.maximum(a, 1e-300))


def _huber_cost(res: np.ndarray) -> float:
    a = np.abs(res)
    return float(np.sum(np.where(a <= HUBER_DELTA, 0.5 * a ** 2,
                                 HUBER_DELTA * (a - 0.5 * HUBER_DELTA))))


def fit(runs: list[Run], names: tuple[str, ...], gpu: str, max_iter: int = 40,
        fit_fragmentation: bool = True, prior: bool = True) -> tuple[Profile, dict]:
    """Fit the named time parameters (and the fragmentation allowance where memory readings
    of the reserved peak exist); `prior` False drops the prior (a plain robust least-squares
    fit). Returns the profile and, per run, (before, after) predicted seconds."""
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise SpecError(f"names {', '.join(twice)} more than once; list each parameter once",
                        source="options", field="--fit")
    for n in names:
        if n not in TIME_PARAMETERS:
            raise SpecError(f"unknown parameter {n!r}; fit any of "
                            f"{', '.join(TIME_PARAMETERS)}", source="options", field="--fit")
    if not runs:
        raise SpecError("no run to calibrate on", source="options", field="LOG")
    p = len(names)
    lo = np.array([TIME_PARAMETERS[n][0] for n in names])
    hi = np.array([TIME_PARAMETERS[n][1] for n in names])
    before = [_predict(r, {}, gpu) for r in runs]
    for rr, b in zip(runs, before):
        if not 1 / IMPLAUSIBLE_RATIO <= rr.measured_s / b <= IMPLAUSIBLE_RATIO:
            raise SpecError(f"measured {rr.measured_s:.4g} s per iteration where the cost model "
                            f"predicts {b:.4g} s for its plan (x{rr.measured_s / b:.3g}); no "
                            f"parameter bridges a factor over {IMPLAUSIBLE_RATIO:g}: check that "
                            "the log is this plan's run", source=rr.label or "LOG", field="log")
    weights = _huber_weights
    n = len(runs)

    absolute = np.array([nm in ABSOLUTE for nm in names], dtype=bool)
    # an absolute parameter starts at the runs' own GPU figure (the preset it replaces)
    preset_gpu = next((nd.gpu for rr in runs for nd in rr.cluster.nodes if nd.gpu.name == gpu),
                      None) if absolute.any() else None
    if absolute.any() and preset_gpu is None:
        raise SpecError(f"no run is on {gpu}, whose figures the profile is for",
                        source="options", field="LOG")
    start = np.array([getattr(preset_gpu, nm) if nm in ABSOLUTE else 1.0 for nm in names])

    def phi(th):  # what the prior is on: a multiplier's log, an absolute value's distance
        return np.where(absolute, th - start, np.log(np.where(absolute, 1.0, th)))

    def dphi(th):
        return np.where(absolute, 1.0, 1.0 / np.where(absolute, 1.0, th))

    def map_fit(theta, r, J, noise_sd, use_prior=True, w_runs=None):
        """Levenberg-Marquardt to the posterior mode, the prior's residuals
        (noise_sd / PRIOR_SD) phi(theta) (module docstring; phi = log for multipliers);
        `use_prior` False: the best fit to the runs alone (Huber); `w_runs`: fixed weights of
        the runs (weighted least squares) instead of Huber's at each step."""
        pw = np.array([noise_sd / PRIOR_SD[nm] if prior and use_prior else 0.0
                       for nm in names])

        def total(res, th):
            data = (_huber_cost(res) if w_runs is None else
                    0.5 * float(np.sum(w_runs * res ** 2)))
            return data + 0.5 * float(np.sum((pw * phi(th)) ** 2))

        lam = 1e-3
        for _ in range(max_iter if p else 0):
            w = weights(r) if w_runs is None else w_runs
            Jp = np.diag(pw * dphi(theta))
            A = J.T @ (w[:, None] * J) + Jp.T @ Jp
            g = J.T @ (w * r) + Jp.T @ (pw * phi(theta))
            step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
            cand = np.clip(theta + step, lo, hi)
            r_c = _residuals(runs, names, cand, {}, gpu)
            if total(r_c, cand) < total(r, theta):
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
        return theta, r, J, pw

    theta = start.copy()
    r = _residuals(runs, names, theta, {}, gpu)
    J = _jacobian(runs, names, theta, {}, gpu, r) if p else np.zeros((len(runs), 0))
    uninformed = tuple(nm for k, nm in enumerate(names)
                       if np.max(np.abs(J[:, k])) < UNINFORMED_SLOPE)
    # The noise the prior is weighed against: NOISE_SD, or, where larger, the spread the runs
    # leave that the parameters cannot reconcile: that of the best fit to the runs alone
    # (n - p degrees of freedom, Huber-weighted); runs noisier than assumed make the prior
    # weigh more (empirical Bayes; BLOOM's pre-launch runs, bench/README.md). The spread had
    # been taken from the prior's own fit and fed back: runs all 2x slower than the presets
    # left the prior's fit near the preset, its spread large, the prior heavier, and gemm_scale
    # at 0.96 with every run still -49%.
    def spread_sd(res) -> float:  # the weighted residual spread, n - p degrees of freedom
        return math.sqrt(float(np.sum(weights(res) * res ** 2) / (n - p)))

    # With the prior, the runs' robust weights are those of the best fit to the runs alone:
    # a run is an outlier for disagreeing with the others, not with the preset. (Huber's
    # weights at each step of the prior's fit had capped the pull of runs that all sit far
    # from the preset, so the prior won: 2x slow runs stopped at gemm_scale 0.65, -32%.)
    noise_sd, w_runs = NOISE_SD, None
    if prior and p:
        _th, r_alone, _J, _pw = map_fit(theta, r, J, noise_sd, use_prior=False)
        w_runs = weights(r_alone)
        if n > p and EMPIRICAL_NOISE:
            noise_sd = max(NOISE_SD, spread_sd(r_alone))
    theta, r, J, pw = map_fit(theta, r, J, noise_sd, w_runs=w_runs)
    values = dict(zip(names, map(float, theta)))
    stderr: dict = {n: None for n in names}
    cov: list = []
    sd = dof = None
    assumed = n <= p and prior and p > 0
    prior_dof = NOISE_PRIOR_DOF if assumed else 0
    if n > p or assumed:
        w = weights(r) if w_runs is None else w_runs
        # measured with n - p degrees of freedom, unweighted, or (no more runs than
        # parameters) the noise the prior was weighed against, assumed, worth
        # NOISE_PRIOR_DOF degrees of freedom to the intervals (module docstring)
        sd = noise_sd if assumed else math.sqrt(float(np.sum(r ** 2)) / (n - p))
        dof = None if assumed else n - p
        s2 = sd * sd
        if p:
            # the prior's rows are in units of noise_sd; rescaled to the fitted noise s
            Jp = np.diag(pw * dphi(theta)) * (sd / noise_sd if sd > 0 else 1.0)
            A = J.T @ (w[:, None] * J) + Jp.T @ Jp
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
            at = rr.memory_stage
            stages = (est.stages if at is None else
                      [st for st in est.stages
                       if st.stage in (at if isinstance(at, tuple) else (at,))])
            tensors = max(st.memory.total_gib - st.memory.allowance_gib for st in stages)
            fs.append(rr.memory_gib / tensors - 1)
        f = min(max(statistics.median(fs), FRAGMENTATION_BOUNDS[0]), FRAGMENTATION_BOUNDS[1])
        values["fragmentation"] = f
        stderr["fragmentation"] = (1.2533 * statistics.stdev(fs) / math.sqrt(len(fs))
                                   if len(fs) > 1 else None)
        frag_sd = statistics.stdev(fs) if len(fs) > 1 else None
    else:
        fs, frag_sd = [], None
    prof = Profile(gpu, values, stderr, tuple(names), cov, sd, residual_dof=dof,
                   residual_sd_assumed=assumed, noise_prior_dof=prior_dof,
                   prior_sd={nm: PRIOR_SD[nm] for nm in names} if prior else {},
                   uninformed=uninformed, fragmentation_sd=frag_sd,
                   fragmentation_readings=len(fs))
    prof.runs = [{"label": rr.label, "measured_s": rr.measured_s, "before_s": b, "after_s": a,
                  "memory_gib": rr.memory_gib, "memory_kind": rr.memory_kind,
                  "memory_stage": rr.memory_stage}
                 for rr, b, a in zip(runs, before, after)]
    return prof, {rr.label: (b, a) for rr, b, a in zip(runs, before, after)}


def interval_s(prof: Profile, model, job, cluster, plan, options
               ) -> tuple[float, float | None, float | None]:
    """(prediction, low, high) in seconds, 95%, for a plan under the profile (`cluster` and
    `options` not yet calibrated). Without a residual spread (a probe's profile) only the
    parameters' uncertainty counts; without either (parameters fitted to no more runs than
    their number, without the prior) there is no interval: low and high are None
    (`no_interval_reason` says why)."""
    run = Run(model, job, cluster, plan, options, 1.0)
    t = _predict(run, prof.values, prof.gpu)
    if no_interval_reason(prof) is not None:
        return t, None, None
    var = (prof.residual_sd or 0.0) ** 2
    if prof.covariance and prof.names:
        C = np.array(prof.covariance)
        g = np.zeros(len(prof.names))
        for k, n in enumerate(prof.names):
            h = 1e-4 * max(1.0, abs(prof.values[n]))
            vals = dict(prof.values)
            vals[n] = prof.values[n] + h
            g[k] = (math.log(_predict(run, vals, prof.gpu)) - math.log(t)) / h
        var += float(g @ C @ g)
    sd = math.sqrt(max(var, 0.0))
    q = t975(spread_dof(prof))
    # a factor beyond e^50 either way says nothing a wider one would not; kept finite
    half = min(q * sd, 50.0)
    return t, t * math.exp(-half), t * math.exp(half)


def spread_dof(prof: Profile) -> int | None:
    """The degrees of freedom of the profile's residual spread for Student's t: the runs'
    (residual_dof), or an assumed spread's (noise_prior_dof); None where the spread is
    assumed exact or there is none (the normal's quantile)."""
    if prof.residual_sd is None:
        return None
    dof = (prof.residual_dof or 0) + prof.noise_prior_dof
    return dof or None


def no_interval_reason(prof: Profile) -> str | None:
    """Why plans under this profile have no prediction interval, or None when they have one."""
    if prof.residual_sd is not None or (prof.covariance and prof.names):
        return None
    bare = [n for n in prof.names if prof.stderr.get(n) is None]
    if prof.kernels and not prof.runs and bare:  # the probe's: its fit has no run spread
        return (f"no prediction interval: {', '.join(bare)} ha{'s' if len(bare) == 1 else 've'}"
                " no standard error (fewer than 2 of the probe's readings measure "
                f"{'it' if len(bare) == 1 else 'each'}, or its readings do not change with "
                "it; the probe said which); run probe/gemm.py again with more shapes (--tp, "
                "--mbs)")
    k, p = len(prof.runs), len(prof.names)
    return (f"no prediction interval: {p} parameter{'s' * (p != 1)} fitted to {k} "
            f"run{'s' * (k != 1)} with no prior leave no spread and no error bars to judge "
            "them by; calibrate on more runs than parameters, or keep the prior")


@dataclass
class MemoryInterval:
    """95% prediction interval of a plan's peak memory under a profile (GiB), and the first
    stage whose interval reaches past its limit (None: every stage's stays under it)."""

    peak_gib: float
    low_gib: float | None
    high_gib: float | None
    may_not_fit_stage: int | None = None
    none_because: str | None = None


def memory_interval_gib(prof: Profile, est) -> MemoryInterval:
    """The memory model's spread on the profile's own runs, carried to a plan: a reserved peak
    is (1 + f) x the tensors counted, f fitted as the median of the runs' reading / tensors - 1
    (`fit`), so a new run's f falls within q s sqrt(1 + pi / 2n) of it (s the readings' sample
    sd, pi / 2n the variance of a median of n normal readings in units of s^2, q Student's t at
    n - 1 degrees of freedom); each stage's total moves by that times its tensors. `est` is the
    estimate under the profile (its fragmentation in the options)."""
    peak = max(st.memory.total_gib for st in est.stages)
    n = prof.fragmentation_readings
    if "fragmentation" not in prof.values or not n:
        return MemoryInterval(peak, None, None, none_because=(
            "no memory interval: the profile was fitted on no reading of the allocator's "
            "reserved peak"))
    if prof.fragmentation_sd is None:
        return MemoryInterval(peak, None, None, none_because=(
            "no memory interval: one memory reading leaves no spread to judge the memory model "
            "by; calibrate on two runs or more with memory readings"))
    f = prof.values["fragmentation"]
    up = fragmentation_at_interval_top(prof) - f
    # f stays within FRAGMENTATION_BOUNDS at both ends, as the fit keeps it: below 0 the
    # allocator would reserve less than the tensors it holds (each end held apart: the top's
    # hold must not narrow the bottom)
    down = min(fragmentation_half_width(prof), f - FRAGMENTATION_BOUNDS[0])
    # one f for every stage, so the peak's interval is the largest of the stages' ends
    lows, highs, stage = [], [], None
    for st in est.stages:
        tensors = st.memory.total_gib - st.memory.allowance_gib
        lows.append(max(st.memory.total_gib - down * tensors, 0.0))
        highs.append(st.memory.total_gib + up * tensors)
        if stage is None and highs[-1] > st.limit_gib:
            stage = st.stage
    return MemoryInterval(peak, max(lows), max(highs), stage)


def fragmentation_at_interval_top(prof: Profile) -> float:
    """The fragmentation at the top of the memory interval (`memory_interval_gib`): a plan
    whose memory fits with it fits at the 95% interval's top. SpecError where the profile has
    no spread of memory readings."""
    n = prof.fragmentation_readings
    if "fragmentation" not in prof.values or not n or prof.fragmentation_sd is None:
        raise SpecError("needs a calibration profile fitted on two or more memory readings of "
                        "the reserved peak (its fragmentation_spread)", source="options",
                        field="--safe-memory")
    return min(prof.values["fragmentation"] + fragmentation_half_width(prof),
               FRAGMENTATION_BOUNDS[1])  # within the fit's bounds


def fragmentation_half_width(prof: Profile) -> float:
    """The 95% half-width of a new run's fragmentation around the fitted one
    (`memory_interval_gib`), before either end is held within FRAGMENTATION_BOUNDS."""
    n = prof.fragmentation_readings
    return t975(n - 1) * prof.fragmentation_sd * math.sqrt(1 + math.pi / (2 * n))


# -- kernel readings (probe/gemm.py) ------------------------------------------------------------

# which multiplier each kind of timed kernel measures (a collective: its links' rate, or where
# the preset puts most of its time in the per-step latency, that latency: `kernel_parameter`)
KERNEL_PARAMETER = {"elementwise": "hbm_scale", "gemm": "gemm_scale",
                    "attention": "attention_scale", "allreduce": "nvlink_scale",
                    "allgather": "nvlink_scale"}
# each parameter is fitted alone on its readings, in this order, with the others in place; the
# rounds repeat until no value moves (a kernel's time mixes several: a collective's bytes / rate
# and steps x latency, every kernel's gap), FIT_ROUNDS at most
KERNEL_FIT_ORDER = ("kernel_overhead_us", "hbm_scale", "gemm_scale", "attention_scale",
                    "nvlink_scale", "intra_latency_scale")
FIT_ROUNDS = 8
# an element-wise reading of at most this many bytes measures the per-kernel gap: at HBM rates
# its bytes take well under a microsecond
TINY_KERNEL_BYTES = 1 << 20


@dataclass(frozen=True)
class KernelReading:
    """One kernel timed by probe/gemm.py (median over its iterations), in the units the cost
    model predicts it in. `shape`: gemm (m, n, k); attention (batch, heads, seq, head_dim),
    forward plus backward of causal attention; elementwise (bytes moved,); allreduce and
    allgather (buffer bytes, GPUs in the ring)."""

    kind: str
    shape: tuple
    dtype: str
    measured_ms: float


def kernel_ms(k: KernelReading, gpu: GPUSpec, intra_gb_per_s: float,
              intra_latency_us: float | None = None) -> float:
    """What the cost model predicts for one probe reading: the same functions the estimator
    calls (model/compute.py, model/communication.py); collectives with `intra_latency_us`
    per ring step (the preset's by default)."""
    from .cluster import INTRA_LATENCY_US
    from .communication import allreduce_ms, gather_ms
    from .compute import elementwise_ms, flash_attention_ms, gemm_ms
    lat_us = INTRA_LATENCY_US if intra_latency_us is None else intra_latency_us
    if k.kind == "gemm":
        b = element_bytes(k.dtype)
        return gemm_ms(gpu, *k.shape, gpu.peak_flops(k.dtype), in_bytes=b, out_bytes=b)
    if k.kind == "attention":
        batch, heads, s, d = k.shape
        f_ms, b_ms = flash_attention_ms(gpu, 4.0 * batch * s * s * heads * d, s,
                                        gpu.peak_flops(k.dtype))
        return f_ms + b_ms
    if k.kind == "elementwise":
        return elementwise_ms(gpu, k.shape[0])
    if k.kind in ("allreduce", "allgather"):
        fn = allreduce_ms if k.kind == "allreduce" else gather_ms
        return fn(k.shape[0], k.shape[1], intra_gb_per_s, lat_us)
    raise ValueError(f"unknown kernel kind {k.kind!r}")


def kernel_parameter(k: KernelReading, intra_gb_per_s: float) -> str:
    """The parameter a reading measures: KERNEL_PARAMETER, except that a collective whose
    preset time is mostly per-step latency (a small buffer) measures intra_latency_scale, and
    a tiny element-wise kernel (TINY_KERNEL_BYTES) the per-kernel gap."""
    name = KERNEL_PARAMETER[k.kind]
    if k.kind == "elementwise" and k.shape[0] <= TINY_KERNEL_BYTES:
        return "kernel_overhead_us"
    if name != "nvlink_scale":
        return name
    gpu = None  # collectives do not read the GPU
    no_lat = kernel_ms(k, gpu, intra_gb_per_s, 0.0)
    return "intra_latency_scale" if kernel_ms(k, gpu, intra_gb_per_s) > 2 * no_lat else name


def _fit_one(residuals, lo: float, hi: float, linear: bool = False
             ) -> tuple[float, float | None]:
    """One parameter x in [lo, hi] minimizing the Huber cost of residuals(x) (log ratios):
    a log-spaced scan (`linear`: an even one, for an absolute parameter whose range starts at
    0), then golden-section search around the best point. Standard error from the weighted
    residual variance over n - 1 degrees of freedom and the derivative of the residuals (the
    one-parameter case of the covariance in the module docstring)."""
    to, back = (float, float) if linear else (math.log, math.exp)
    xs = [back(u) for u in np.linspace(to(lo), to(hi), 161)]
    costs = [_huber_cost(residuals(x)) for x in xs]
    i = int(np.argmin(costs))
    a, b = to(xs[max(i - 1, 0)]), to(xs[min(i + 1, len(xs) - 1)])
    phi = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        c, d = b - phi * (b - a), a + phi * (b - a)
        if _huber_cost(residuals(back(c))) <= _huber_cost(residuals(back(d))):
            b = d
        else:
            a = c
    x = back((a + b) / 2)
    if _huber_cost(residuals(xs[i])) < _huber_cost(residuals(x)):
        x = float(xs[i])
    r = residuals(x)
    n = len(r)
    h = 1e-4 * (max(x, 1.0) if linear else x)
    if x - h < lo:  # one-sided at the range's start (an absolute parameter at 0)
        J = (residuals(x + h) - r) / h
    else:
        J = (residuals(x + h) - residuals(x - h)) / (2 * h)
    w = _huber_weights(r)
    info = float(np.sum(w * J ** 2))
    if n < 2 or info <= 0:
        return x, None
    s2 = float(np.sum(w * r ** 2) / (n - 1))
    return x, math.sqrt(s2 / info)


# the efficiency each multiplier scales (scaled_gpu caps the product at 1: the datasheet)
_CAPPED_EFFICIENCY = {"gemm_scale": "gemm_efficiency", "attention_scale": "attention_efficiency",
                      "hbm_scale": "hbm_efficiency"}


def _kernel_fit_notes(gpu: GPUSpec, values: dict, stderr: dict, kinds: dict,
                      planning: bool) -> list[str]:
    """What the probe's user should know of its fit: a parameter with no standard error
    (which leaves plans under the profile without an interval: no_interval_reason), one whose
    efficiency reached the datasheet figure (readings faster than the GPU's peak allows: a
    wrong GPU preset or clock), one on the edge of its range."""
    notes = []
    for name, v in values.items():
        eff = _CAPPED_EFFICIENCY.get(name)
        capped = eff is not None and getattr(gpu, eff) * v >= 1.0 - 1e-9
        lo, hi = TIME_PARAMETERS[name]
        if capped:
            notes.append(f"{name} = {v:.4g} puts {eff} at its cap, 1.0 of the {gpu.name} "
                         "datasheet: its kernels ran faster than that peak allows; check the "
                         "GPU preset (--gpu) and its clocks")
        elif planning and (v <= lo * (1 + 1e-6) or v >= hi * (1 - 1e-6)):
            notes.append(f"{name} = {v:.4g} ended on the edge of its range [{lo:g}, {hi:g}]")
        if stderr.get(name) is None:
            n = len(kinds[name])
            notes.append(f"{name} has no standard error ("
                         + (f"{n} reading measures it; 2 or more give one" if n < 2 else
                            "its readings do not change with it") + "): plans under this "
                         "profile get no prediction interval")
    return notes


def fit_kernels(readings: list[KernelReading], gpu: GPUSpec, intra_gb_per_s: float, *,
                planning: bool = True, device: str = "") -> Profile:
    """A profile from the probe's kernel readings against the GPU preset `gpu` (and the node's
    NVLink rate `intra_gb_per_s` the cluster files state): each parameter fitted alone on
    its kernels (robust, bounded; the bounds of TIME_PARAMETERS, or wide ones when
    `planning` is False, the CPU test mode), in the order tiny element-wise kernels (the
    per-kernel gap), large ones (HBM), GEMM, attention, large collectives (the links), small
    ones (the per-step latency: `kernel_parameter`), each with the others in place, in rounds
    until no value moves (KERNEL_FIT_ORDER, FIT_ROUNDS). The covariance is diagonal (one fit
    per parameter); no iteration-level residual spread: intervals from such a profile carry
    the parameters' uncertainty only."""
    values: dict = {}
    stderr: dict = {}
    from .cluster import INTRA_LATENCY_US
    from .errors import SpecError
    for k in readings:  # a time the log ratios cannot take (a timer's 0, a NaN)
        if not (isinstance(k.measured_ms, (int, float)) and math.isfinite(k.measured_ms)
                and k.measured_ms > 0):
            raise SpecError(f"the {k.kind} kernel {tuple(k.shape)} ({k.dtype}) measured "
                            f"{k.measured_ms} ms: a time must be a positive number; nothing "
                            "was fitted", source="probe", field="kernels")
    kinds = {name: [k for k in readings if kernel_parameter(k, intra_gb_per_s) == name]
             for name in KERNEL_FIT_ORDER}
    for _round in range(FIT_ROUNDS):
        before = dict(values)
        for name in KERNEL_FIT_ORDER:
            mine = kinds[name]
            if not mine:
                continue
            meas = np.array([k.measured_ms for k in mine])

            def residuals(x, mine=mine, meas=meas, name=name):
                vals = dict(values, **{name: x})
                g = scaled_gpu(gpu, vals)
                intra = intra_gb_per_s * vals.get("nvlink_scale", 1.0)
                lat = INTRA_LATENCY_US * vals.get("intra_latency_scale", 1.0)
                return np.log(np.array([kernel_ms(k, g, intra, lat) for k in mine]) / meas)

            lo, hi = TIME_PARAMETERS[name]
            if not planning:  # the CPU test mode: anything the CPU gives
                lo, hi = (0.0 if name in ABSOLUTE else 1e-5), max(10.0, hi)
            values[name], stderr[name] = _fit_one(residuals, lo, hi, linear=name in ABSOLUTE)
        if before and all(abs(values[k] - before[k]) <= 1e-7 * max(1.0, abs(before[k]))
                          for k in values):
            break
    names = tuple(values)
    cov = ([[(stderr[a] ** 2 if a == b else 0.0) for b in names] for a in names]
           if all(stderr[n] is not None for n in names) else [])
    prof = Profile(gpu.name, values, stderr, names, cov, None, planning=planning,
                   device=device)
    prof.fit_notes = _kernel_fit_notes(gpu, values, stderr, kinds, planning)
    g0, g1 = gpu, scaled_gpu(gpu, values)
    intra1 = intra_gb_per_s * values.get("nvlink_scale", 1.0)
    lat1 = INTRA_LATENCY_US * values.get("intra_latency_scale", 1.0)
    prof.kernels = [{"kind": k.kind, "shape": list(k.shape), "dtype": k.dtype,
                     "measured_ms": k.measured_ms,
                     "before_ms": kernel_ms(k, g0, intra_gb_per_s),
                     "after_ms": kernel_ms(k, g1, intra1, lat1)} for k in readings]
    return prof
