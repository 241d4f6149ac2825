"""The per-operation roofline (model/compute.py) and the precision rules."""

import dataclasses

import pytest

from formats import presets
from formats.clusters import uniform_cluster
from model.compute import ComputeModel, elementwise_ms, gemm_ms
from model.estimator import Evaluator, estimate, make_plan
from model.specs import JobSpec, ModelSpec


@pytest.fixture
def a100():
    """A100 with round curve parameters, so these tests check the model's shape, not the fit."""
    return dataclasses.replace(presets.gpu("A100-80GB"), gemm_efficiency=0.8,
                               hbm_efficiency=0.8, kernel_overhead_us=5.0)


@pytest.fixture
def h100():
    return presets.gpu("H100-SXM-80GB")


def test_huge_gemm_reaches_the_large_gemm_rate(a100):
    """A GEMM many waves deep runs at gemm_efficiency x peak (within the last wave's share)."""
    m = n = k = 32768
    ms = gemm_ms(a100, m, n, k, a100.peak_flops("bf16"))
    rate = 2.0 * m * n * k / (ms / 1e3)
    assert rate == pytest.approx(a100.gemm_efficiency * a100.peak_flops("bf16"), rel=0.01)
    assert rate <= a100.gemm_efficiency * a100.peak_flops("bf16")


def test_small_gemms_fall_below_the_large_gemm_rate(a100):
    """Tile and wave quantization: a GEMM of fewer tiles than SMs, or one whose last wave is
    nearly empty, runs well below the large-GEMM rate; a thin one is bound by its bytes."""
    peak = a100.peak_flops("bf16") * a100.gemm_efficiency

    def rate(m, n, k):
        return 2.0 * m * n * k / (gemm_ms(a100, m, n, k, a100.peak_flops("bf16")) / 1e3)

    assert rate(256, 256, 4096) < 0.25 * peak  # at most 8 tiles on 108 SMs
    # a TP-split layer narrower than a tile: n = 96 pads to 128, 32 tiles on 108 SMs
    assert rate(2048, 96, 8192) < 0.35 * peak
    # the same GEMM wider and 64 x longer fills the waves again
    assert rate(2048 * 64, 1024, 8192) > 0.9 * peak
    # m = 8: 8 x 8192 x 8192 reads 128 MiB of weights for 1 GFLOP: memory-bound
    ms = gemm_ms(a100, 8, 8192, 8192, a100.peak_flops("bf16"))
    bytes_ = 2.0 * (8 * 8192 + 8192 * 8192 + 8 * 8192)
    assert ms == pytest.approx(bytes_ / a100.hbm_bytes_per_ms + a100.kernel_overhead_us / 1e3)


def test_elementwise_runs_at_the_hbm_limit(a100):
    nbytes = 4e9
    ms = elementwise_ms(a100, nbytes)
    assert nbytes / ((ms - a100.kernel_overhead_us / 1e3) / 1e3) == pytest.approx(
        a100.hbm_gb_per_s * 1e9 * a100.hbm_efficiency)


@pytest.mark.parametrize("name", ["gpt-1.7b", "gpt3-175b", "llama2-70b", "llama3-8b"])
@pytest.mark.parametrize("tp", [1, 8])
@pytest.mark.parametrize("attention", ["flash", "eager"])
def test_flops_of_all_kernels_equal_narayanan_eq3(name, tp, attention, a100):
    """The FLOPs the kernels count (forward + backward of every layer, and the output layer)
    equal Narayanan et al. 2021 eq. (3) without recompute: 3 x (layers x layer forward + logits),
    generalized to GQA and gated MLPs (ModelSpec.layer_flops_fwd)."""
    m = presets.model(name)
    if m.num_heads % tp or m.num_kv_heads % tp:
        pytest.skip("TP does not divide the heads")
    job = JobSpec(global_batch=8, seq_length=2048, attention=attention)
    cm = ComputeModel(m, job, a100, tp=tp, micro_batch=2, sequence_parallel=tp > 1, fp8=False)
    lc = cm.layer()
    hf, hb = cm.head()
    tokens = 2 * 2048
    total = tp * (m.num_layers * (lc.fwd.flops + lc.bwd.flops) + hf.flops + hb.flops)
    eq3 = 3 * (m.num_layers * m.layer_flops_fwd(tokens, 2048) + m.logits_flops_fwd(tokens))
    assert total == pytest.approx(eq3, rel=1e-9)


def test_backward_gemms_have_their_own_shapes(a100):
    """Backward is data- and weight-gradient GEMMs of other shapes, not 2x the forward: at
    micro-batch 1 with TP 8 the weight gradients (k = tokens) are not the forward's time."""
    m = presets.model("llama3-8b")
    job = JobSpec(global_batch=8, seq_length=2048)
    lc = ComputeModel(m, job, a100, tp=8, micro_batch=1, sequence_parallel=True, fp8=False).layer()
    for lin in ("qkv", "proj", "fc1", "fc2"):
        f, d, w = lc.fwd.ms[lin], lc.bwd.ms[f"{lin}.dgrad"], lc.bwd.ms[f"{lin}.wgrad"]
        assert f > 0 and d > 0 and w > 0
    assert any(abs(lc.bwd.ms[f"{x}.dgrad"] + lc.bwd.ms[f"{x}.wgrad"] - 2 * lc.fwd.ms[x])
               > 0.01 * lc.fwd.ms[x] for x in ("qkv", "proj", "fc1", "fc2"))


def test_micro_batch_changes_time_per_sequence():
    """The efficiency follows the GEMM sizes: per-sequence layer time differs across
    micro-batches (a constant efficiency made it identical)."""
    m = presets.model("gpt3-175b")
    c = uniform_cluster(8, 8, "A100-80GB", 240.0, 25.0)
    job = JobSpec(global_batch=1536, seq_length=2048, precision="fp16", attention="eager")
    per_seq = []
    for mbs in (1, 2, 4, 8):
        plan = make_plan(m, job, c, tp=8, pp=8, dp=1, micro_batch=mbs, recompute="full")
        ev = Evaluator(m, job, c, plan.shape)
        lt = ev.costs.layer_times(c.nodes[0].gpu, 240.0)
        per_seq.append(lt.fwd_ms / mbs)
    assert max(per_seq) / min(per_seq) > 1.05
    assert per_seq[0] == max(per_seq)


def _llama70(h100_cluster):
    m = presets.model("llama2-70b")
    return m


def test_fp8_is_faster_for_large_gemms_and_never_slower_than_its_casts(h100):
    """FP8 runs the linear GEMMs at the FP8 peak: faster than bf16 for large GEMMs. For any
    shape, the FP8 layer is never slower than the bf16 layer by more than its cast kernels."""
    for name, mbs, tp in (("llama2-70b", 4, 8), ("llama3-8b", 1, 8), ("gpt-1.7b", 1, 8),
                          ("llama3-8b", 8, 1)):
        m = presets.model(name)
        job = JobSpec(global_batch=64, seq_length=4096, fp8=None)
        kw = dict(tp=tp, micro_batch=mbs, sequence_parallel=tp > 1)
        b16 = ComputeModel(m, job, h100, fp8=False, **kw).layer()
        f8 = ComputeModel(m, job, h100, fp8=True, **kw).layer()
        casts = sum(v for p in (f8.fwd, f8.bwd) for k, v in p.ms.items() if k.endswith(".cast"))
        assert f8.fwd.total_ms + f8.bwd.total_ms <= b16.fwd.total_ms + b16.bwd.total_ms + casts
    m = presets.model("llama2-70b")
    job = JobSpec(global_batch=64, seq_length=4096, fp8=None)
    b16 = ComputeModel(m, job, h100, tp=8, micro_batch=4, sequence_parallel=True, fp8=False)
    f8 = ComputeModel(m, job, h100, tp=8, micro_batch=4, sequence_parallel=True, fp8=True)
    from model.specs import FP8_GEMM_RATIO  # the FP8 peak is twice bf16's, at 0.78 of its rate
    assert f8.layer().fwd.ms["fc1"] < 1.03 / (2 * FP8_GEMM_RATIO) * b16.layer().fwd.ms["fc1"]
    assert f8.layer().fwd.total_ms < b16.layer().fwd.total_ms


def test_fp8_casts_per_framework_and_recipe(h100):
    """Transformer Engine's casts on Hopper write the row-wise copy and its transpose (read 2,
    write 2 per element), with current scaling read once more (6), torchao's as fitted (3);
    with sequence parallelism TE casts what it all-gathers on the local 1/t shard, row-wise
    only (3, or 5), and transposes it after the gather over every token (read 1, write 1): the
    QKV and MLP-up inputs (their transpose in the backward, for the weight gradient), the
    row-parallel layers' output gradients."""
    from model.compute import elementwise_ms
    m = presets.model("llama3-8b")
    kw = dict(tp=4, micro_batch=1, sequence_parallel=True, fp8=True)
    T = 4096
    qkv_in = T * m.hidden_size  # elements of the gathered QKV input
    proj_in = T * m.o_dim // 4
    qkv_out = T * (m.q_dim + 2 * m.kv_dim) // 4

    def ew(nbytes):
        return elementwise_ms(h100, nbytes) if nbytes else 0.0

    for job, full, shard_b, transpose, shard in (
            (JobSpec(global_batch=8, seq_length=T, fp8=True), 4.0, 3.0, 2.0, 4),
            (JobSpec(global_batch=8, seq_length=T, fp8=True, fp8_recipe="tensorwise"), 6.0,
             5.0, 2.0, 4),
            (JobSpec(global_batch=8, seq_length=T, fp8=True, framework="torchtitan",
                     zero=3), 3.0, 3.0, 0.0, 1)):
        lay = ComputeModel(m, job, h100, **kw).layer()
        f, b = lay.fwd.ms, lay.bwd.ms
        gathered = shard > 1
        assert f["qkv.cast"] == pytest.approx(
            ew((shard_b if gathered else full) * qkv_in / shard))
        assert f["proj.cast"] == pytest.approx(ew(full * proj_in))
        # the output projection's gradient (T x h) is gathered; QKV's (T x qkv / t) is not,
        # and QKV's input is transposed after its backward re-gather
        assert b["proj.cast"] == pytest.approx(
            ew((shard_b if gathered else full) * qkv_in / shard)
            + (ew(transpose * qkv_in) if gathered else 0.0))
        assert b["qkv.cast"] == pytest.approx(
            ew(full * qkv_out) + (ew(transpose * qkv_in) if gathered else 0.0))
    from model.errors import SpecError
    with pytest.raises(SpecError, match="allow fp8"):
        JobSpec(global_batch=8, seq_length=T, fp8_recipe="tensorwise")
    with pytest.raises(SpecError, match="torchao float8 has its own scaling"):
        JobSpec(global_batch=8, seq_length=T, fp8=True, framework="torchtitan",
                fp8_recipe="tensorwise")
    with pytest.raises(SpecError, match="unknown fp8_recipe"):
        JobSpec(global_batch=8, seq_length=T, fp8=True, fp8_recipe="nvfp4")


def test_fp8_plan_needs_fp8_tensor_cores_and_keeps_weight_copies():
    m = presets.model("llama3-8b")
    a100s = uniform_cluster(1, 8, "A100-80GB", 240.0, 25.0)
    job = JobSpec(global_batch=16, seq_length=4096, fp8=True)
    from model.errors import SpecError
    with pytest.raises(SpecError, match="FP8 needs FP8 tensor cores"):
        make_plan(m, job, a100s, tp=8, pp=1, sequence_parallel=True)
    h = uniform_cluster(1, 8, "H100-SXM-80GB", 360.0, 50.0)
    e8 = estimate(m, job, h, make_plan(m, job, h, tp=8, pp=1, sequence_parallel=True))
    jb = dataclasses.replace(job, fp8=False)
    e16 = estimate(m, jb, h, make_plan(m, jb, h, tp=8, pp=1, sequence_parallel=True))
    # the FP8 weight and its transpose: 2 bytes per linear-layer weight on each GPU
    extra = m.num_layers * m.linear_params_per_layer / 8 * 2 / 2 ** 30
    assert e8.stages[0].memory.weights_gib - e16.stages[0].memory.weights_gib == \
        pytest.approx(extra)
    assert e8.iteration_ms < e16.iteration_ms


def test_fp8_param_gather_keeps_only_the_fp8_weights():
    """--fp8-param-gather: the FP8 weight and its transpose are the linear layers' only copy,
    so the weights take what the bf16 plan's take (2 bytes each); it applies with the
    distributed optimizer only (Megatron-LM asserts it), and the job says why otherwise."""
    from model.errors import SpecError
    m = presets.model("llama3-8b")
    h = uniform_cluster(1, 8, "H100-SXM-80GB", 360.0, 50.0)
    job = JobSpec(global_batch=16, seq_length=4096, fp8=True, fp8_param_gather=True)
    kw = dict(tp=4, pp=2, sequence_parallel=True, distributed_optimizer=True, layers=(16, 16))
    ep = estimate(m, job, h, make_plan(m, job, h, **kw))
    plain = dataclasses.replace(job, fp8_param_gather=False)
    e8 = estimate(m, plain, h, make_plan(m, plain, h, **kw))
    b16 = dataclasses.replace(plain, fp8=False)
    e16 = estimate(m, b16, h, make_plan(m, b16, h, **kw))
    for a, b, c in zip(ep.stages, e8.stages, e16.stages):
        assert a.memory.weights_gib == pytest.approx(c.memory.weights_gib)
        assert a.memory.weights_gib < b.memory.weights_gib
        assert a.memory.total_gib < b.memory.total_gib
    # the distributed optimizer all-gathers them at 1 byte (the 16-bit weights at 2)
    from model.costs import CostModel
    from model.specs import Options
    cm = CostModel(m, job, h, make_plan(m, job, h, **kw).shape, Options())
    lin = cm.stage_linear_params(0)
    assert cm.sync_bytes(1e9, lin)[1] == pytest.approx(2e9 - lin)
    assert CostModel(m, plain, h, make_plan(m, plain, h, **kw).shape, Options()).sync_bytes(
        1e9, lin)[1] == pytest.approx(2e9)
    # one plan without the distributed optimizer cannot have them: said, not dropped; a plan
    # a search finds without it keeps the FP8 copies (the flag applies where it can)
    with pytest.raises(SpecError, match="distributed optimizer"):
        make_plan(m, job, h, tp=4, pp=2, sequence_parallel=True, distributed_optimizer=False)
    p8 = make_plan(m, plain, h, tp=4, pp=2, sequence_parallel=True, distributed_optimizer=False,
                   layers=(16, 16))
    e0 = estimate(m, job, h, p8)
    assert e0.stages[0].memory.weights_gib == pytest.approx(
        estimate(m, plain, h, p8).stages[0].memory.weights_gib)
    assert e0.stages[0].memory.weights_gib > ep.stages[0].memory.weights_gib
    for bad, needle in ((dict(fp8=False), "allow fp8"), (dict(zero=0), "ZeRO 1 or 2"),
                        (dict(framework="torchtitan"), "use framework megatron"),
                        (dict(fp8_param_gather="yes"), "true or false")):
        with pytest.raises(SpecError, match=needle):
            dataclasses.replace(job, **bad)


def test_precision_bytes_bf16_keeps_fp32_main_grads():
    """Megatron-LM with --bf16 accumulates and reduces gradients in fp32
    (accumulate_allreduce_grads_in_fp32): 4 bytes of gradient per parameter."""
    assert JobSpec(8, 2048, "bf16").grad_bytes == 4
    assert JobSpec(8, 2048, "fp16").grad_bytes == 2


def test_tp_overlap_and_grad_overlap_only_hide_time():
    """Each overlap hides communication: the same plan with TP overlap, gradient-reduce and
    parameter-gather overlap is no slower here (TE's userbuffers also split the GEMMs and take
    SMs, which on this plan costs less than they hide; `test_te_userbuffers_split_the_gemms`),
    and the schedule graph stays the one definition (the fast path equals the full estimate)."""
    m = presets.model("llama2-13b")
    c = uniform_cluster(4, 8, "H100-SXM-80GB", 360.0, 12.5)
    job = JobSpec(global_batch=64, seq_length=4096)
    base = dict(tp=4, pp=2, micro_batch=1, sequence_parallel=True, distributed_optimizer=True)
    plain = make_plan(m, job, c, **base)
    t0 = estimate(m, job, c, plain).iteration_ms
    times = []
    for kw in (dict(tp_comm_overlap=True), dict(overlap_grad_reduce=True),
               dict(overlap_grad_reduce=True, overlap_param_gather=True),
               dict(tp_comm_overlap=True, overlap_grad_reduce=True, overlap_param_gather=True)):
        p = make_plan(m, job, c, **base, **kw)
        ev = Evaluator(m, job, c, p.shape)
        e = ev.estimate(p.placement)
        assert ev.iteration_ms(p.placement) == pytest.approx(e.iteration_ms, rel=1e-12)
        times.append(e.iteration_ms)
    assert all(t <= t0 + 1e-9 for t in times)
    assert times[0] < t0 and times[2] < times[1] < t0


def test_te_userbuffers_split_the_gemms(h100):
    """Transformer Engine's default userbuffers overlap (--tp-comm-overlap): the QKV forward
    runs as t GEMMs of m/t rows (ring exchange), the output projection's forward as 4 GEMMs on
    the SMs the 16 communication SMs leave (pipeline), its data gradient as t GEMMs, the QKV
    backward GEMMs whole on the 16-SM-short GPU (bulk); torchtitan's async TP splits nothing."""
    from model.compute import UB_COMM_SMS, UB_PIPELINE_SPLITS, gemm_ms, linear_gemms
    m = presets.model("llama3-70b")
    job = JobSpec(global_batch=8, seq_length=8192)
    kw = dict(tp=8, micro_batch=1, sequence_parallel=True, fp8=False)
    plain = ComputeModel(m, job, h100, **kw).layer()
    ub = ComputeModel(m, job, h100, tp_comm_overlap=True, **kw)
    lay = ub.layer()
    (qm, qn, qk), (pm, pn, pk) = ub.dense_linears()["qkv"], ub.dense_linears()["proj"]
    peak = h100.peak_flops("bf16")
    small = dataclasses.replace(h100, sm_count=h100.sm_count - UB_COMM_SMS)
    speak = peak * small.sm_count / h100.sm_count
    assert lay.fwd.ms["qkv"] == pytest.approx(8 * gemm_ms(h100, qm // 8, qn, qk, peak))
    assert lay.fwd.ms["proj"] == pytest.approx(
        UB_PIPELINE_SPLITS * gemm_ms(small, pm // UB_PIPELINE_SPLITS, pn, pk, speak))
    dg = linear_gemms(pm, pn, pk)[1]
    assert lay.bwd.ms["proj.dgrad"] == pytest.approx(8 * gemm_ms(h100, dg[0] // 8, *dg[1:], peak))
    wg = linear_gemms(qm, qn, qk)[2]
    assert lay.bwd.ms["qkv.wgrad"] == pytest.approx(gemm_ms(small, *wg, speak))
    assert lay.fwd.ms["qkv"] > plain.fwd.ms["qkv"] and lay.fwd.ms["proj"] > plain.fwd.ms["proj"]
    tt = dataclasses.replace(job, framework="torchtitan", zero=3)
    assert ComputeModel(m, tt, h100, tp_comm_overlap=True, **kw).layer().fwd.ms == \
        ComputeModel(m, tt, h100, **kw).layer().fwd.ms


def test_torchtitan_float8_tp_gathers_one_byte_per_element():
    """torchtitan's Float8 TP gathers each linear input (forward) and output gradient
    (backward) in float8 and reduce-scatters in bf16: its layer's forward TP time is the two
    reduce-scatters plus the two all-gathers at half the bytes (3/4 of the bf16 plan's).
    Megatron-LM's FP8 plan (Transformer Engine) gathers its inputs and output gradients in FP8
    as well (module/linear.py, module/base.py grad_output_preprocess). torchtitan v0.2.x
    never turns Float8 TP on (its parallelize tests the converter name 'float8', registered
    as 'quantize.linear.float8'): its FP8 plan gathers in bf16, as the bf16 plan does."""
    from model.communication import gather_ms
    from model.costs import CostModel
    from model.specs import Options
    m = presets.model("llama3-8b")
    c = uniform_cluster(1, 8, "H100-SXM-80GB", 360.0, 50.0)
    ring = 360.0
    fwd, bwd = {}, {}
    for fw, fp8, v01 in (("torchtitan", True, True), ("torchtitan", False, True),
                         ("torchtitan", True, False), ("megatron", True, False)):
        job = JobSpec(global_batch=8, seq_length=8192, framework=fw, fp8=fp8,
                      zero=3 if fw == "torchtitan" else None, repeat_kv=v01)
        assert job.fp8_tp_gathers == (fw == "megatron" or v01)
        plan = make_plan(m, job, c, tp=8, pp=1, micro_batch=1, sequence_parallel=True,
                         fp8=fp8, zero=3 if fw == "torchtitan" else 1)
        cm = CostModel(m, job, c, plan.shape, Options())
        lt = cm.layer_times(c.nodes[0].gpu, ring)
        fwd[fw, fp8, v01], bwd[fw, fp8, v01] = lt.tp_comm_fwd_ms, lt.tp_comm_bwd_ms
    full = gather_ms(8192 * m.hidden_size * 2, 8, ring, 10.0)  # one 16-bit gather
    assert fwd["torchtitan", False, True] == pytest.approx(4 * full)
    assert fwd["torchtitan", True, True] == pytest.approx(2 * full + 2 * full / 2)
    assert fwd["megatron", True, False] == pytest.approx(2 * full + 2 * full / 2)
    assert bwd["megatron", True, False] == pytest.approx(bwd["torchtitan", True, True])
    assert fwd["torchtitan", True, False] == pytest.approx(4 * full)
    # (the backward's exposed parts also follow the FP8 GEMMs they hide behind)
    assert bwd["torchtitan", True, False] > bwd["torchtitan", True, True]


def test_dropout_free_models_store_no_masks():
    base = dict(name="x", num_layers=4, hidden_size=4096, num_heads=32, num_kv_heads=32,
                ffn_hidden_size=16384, vocab_size=32000, seq_length=2048)
    from model.memory import layer_activation_bytes
    from model.plan import Shape
    job = JobSpec(global_batch=8, seq_length=2048, attention="flash")
    sh = Shape(tp=1, pp=1, dp=1, micro_batch=1, layers=(4,))
    with_d = layer_activation_bytes(ModelSpec(**base, dropout=True), job, sh)
    without = layer_activation_bytes(ModelSpec(**base, dropout=False), job, sh)
    assert with_d - without == pytest.approx(2 * 2048 * 4096)  # two 1-byte masks


def test_torchtitan_eager_kernels_cost_their_bytes_and_compile_fuses_them(h100):
    """torchtitan without torch.compile runs its RMSNorm, rotary and SwiGLU as eager kernels
    (EAGER_BYTES per element); compiled, the fused counts. Only element-wise kernels differ:
    every GEMM and the attention core are the same, and only torchtitan has the switch."""
    from model.compute import EAGER_BYTES
    from model.errors import SpecError
    m = presets.model("llama3-8b")
    kw = dict(tp=2, micro_batch=2, sequence_parallel=True, fp8=False)
    jobs = {c: JobSpec(global_batch=16, seq_length=8192, framework="torchtitan", compile=c)
            for c in (True, False)}
    fused, eager = (ComputeModel(m, jobs[c], h100, **kw).layer() for c in (True, False))
    T, h = 2 * 8192, m.hidden_size
    hs = T * h / 2  # per TP rank with sequence parallelism
    norm_b = EAGER_BYTES["norm"]
    assert eager.fwd.ms["norm1"] == pytest.approx(elementwise_ms(h100, hs * norm_b[0]))
    assert eager.bwd.ms["norm2"] == pytest.approx(elementwise_ms(h100, hs * norm_b[1]))
    assert fused.fwd.ms["norm1"] == pytest.approx(elementwise_ms(h100, hs * 4))
    for p in ("fwd", "bwd"):
        e, f = getattr(eager, p).ms, getattr(fused, p).ms
        for k in f:
            if not k.startswith(("norm", "rope", "act")):
                assert e[k] == f[k], k  # GEMMs (forward, dgrad, wgrad), attention, residuals
        for k in ("norm1", "norm2", "rope", "act"):
            assert e[k] > 2 * f[k] if k == "norm1" else e[k] > f[k]
        assert "attn_copies" in e and "attn_copies" not in f
    assert eager.fwd.flops == fused.fwd.flops
    with pytest.raises(SpecError, match="fused kernels"):
        JobSpec(global_batch=16, seq_length=8192, compile=False)


def test_fp8_gemm_efficiency_sets_the_fp8_gemm_rate(h100):
    """A GPU's fp8_gemm_efficiency is the FP8 GEMMs' fraction of the FP8 peak (None:
    FP8_GEMM_RATIO x the bf16 fraction); bf16 GEMMs do not see it."""
    from model.specs import FP8_GEMM_RATIO
    m = presets.model("llama3-8b")
    job = JobSpec(global_batch=64, seq_length=8192, fp8=True)
    kw = dict(tp=1, micro_batch=4, sequence_parallel=False)
    assert h100.fp8_gemm_efficiency is None
    default = ComputeModel(m, job, h100, fp8=True, **kw).layer().fwd.ms["fc1"]
    same = dataclasses.replace(h100, fp8_gemm_efficiency=h100.gemm_efficiency)
    full = ComputeModel(m, job, same, fp8=True, **kw).layer().fwd.ms["fc1"]
    assert default == pytest.approx(full / FP8_GEMM_RATIO, rel=0.02)
    half = dataclasses.replace(h100, fp8_gemm_efficiency=h100.gemm_efficiency / 2)
    slow = ComputeModel(m, job, half, fp8=True, **kw).layer().fwd.ms["fc1"]
    assert slow == pytest.approx(2 * full, rel=0.02)
    b16 = [ComputeModel(m, job, g, fp8=False, **kw).layer().fwd.ms["fc1"] for g in (h100, half)]
    assert b16[0] == b16[1]


def test_fp8_ratio_is_the_fitted_one_and_no_fp8_preset_runs_fp8_at_the_bf16_fraction():
    """FP8_GEMM_RATIO is the ratio fitted for the torchtitan H100 (its preset's two
    efficiencies, bench/fit_h100_500w.py), and every preset with an FP8 peak prices its FP8
    GEMMs below the bf16 fraction (a helper had found H100 SXM, H200, B200 and GB200 running
    them at exactly twice the bf16 rate: 1.69x end to end on Llama-3 70B)."""
    from model.specs import FP8_GEMM_RATIO
    fitted = presets.gpu("H100-96GB-500W")
    assert fitted.fp8_gemm_efficiency / fitted.gemm_efficiency == pytest.approx(
        FP8_GEMM_RATIO, abs=0.005)
    for name in presets.gpu_names():
        g = presets.gpu(name)
        if "fp8" in g.peak_tflops:
            assert g.fp8_efficiency == pytest.approx(FP8_GEMM_RATIO * g.gemm_efficiency,
                                                     abs=0.001), name


@pytest.mark.parametrize("framework,recompute", [("megatron", "selective"),
                                                 ("torchtitan", "selective"),
                                                 ("torchtitan", "full"), ("megatron", "none")])
def test_hfu_counts_what_the_recompute_runs_again_and_mfu_causal_halves_the_core(
        framework, recompute):
    """HFU adds the FLOPs the framework's recompute runs again: Megatron-LM's selective the
    attention core, torchtitan's per-op checkpointing the k, o and w3 multiplies (it keeps the
    attention core; counting the core had put HFU at 102% for an 8B FP8 run at 65k tokens);
    full one forward of every layer. MFU causal leaves out half of the core's 3 passes."""
    m = presets.model("llama3-8b")
    c = uniform_cluster(1, 8, "H100-SXM-80GB", 400.0, 50.0)
    job = JobSpec(global_batch=8, seq_length=32768, framework=framework)
    plan = make_plan(m, job, c, tp=1, pp=1, dp=4, cp=2, recompute=recompute,
                     zero=3 if framework == "torchtitan" else 1)
    e = estimate(m, job, c, plan)
    T, s, h, q, kv, L = 8 * 32768, 32768, m.hidden_size, m.q_dim, m.kv_dim, m.num_layers
    core = 4 * T * s * q
    extra = {"none": 0.0, "full": m.model_flops_fwd(T, s),
             "selective": L * (core if framework == "megatron" else
                               2 * T * h * kv + 2 * T * q * h + 2 * T * h * m.ffn_hidden_size)}
    assert e.hfu / e.mfu == pytest.approx(1 + extra[recompute] / (3 * (
        m.model_flops_fwd(T, s) + m.logits_flops_fwd(T))), rel=1e-9)
    assert e.mfu - e.mfu_causal == pytest.approx(
        e.mfu * 1.5 * L * core / (3 * (m.model_flops_fwd(T, s) + m.logits_flops_fwd(T))),
        rel=1e-9)


def test_mla_down_projections_run_on_the_sequence_shard_under_sp():
    """Megatron-LM runs multi-latent attention's down projections (duplicated, not TP-split)
    on the rank's 1/t sequence shard with sequence parallelism; they had been priced on every
    token on every rank (DeepSeek-V3 at TP 4: 3.8% of the iteration). The forward's "qkv"
    FLOPs are the up projections on all T tokens plus the down projections on T/t."""
    m = presets.model("deepseek-v3")
    job = JobSpec(global_batch=8, seq_length=4096)
    gpu = presets.gpu("H100-SXM-80GB")
    T, t = 4096, 4
    h, ql, kvl, rope = m.hidden_size, m.mla_q_lora_rank, m.mla_kv_lora_rank, m.mla_qk_rope_dim
    heads = m.num_heads // t
    up = 2 * T * (heads * m.qk_head_dim * ql + heads * (m.head_dim + m.mla_v_head_dim) * kvl)
    down = 2 * T * h * (ql + kvl + rope)
    for sp, tokens in ((True, T // t), (False, T)):
        cm = ComputeModel(m, job, gpu, tp=t, micro_batch=1, sequence_parallel=sp, fp8=False)
        got = cm.layer().fwd.op_flops["qkv"]
        assert got == pytest.approx(up + down * tokens / T, rel=1e-12), sp


def test_mla_latents_are_stored_on_the_sequence_shard_under_sp():
    """With SP Megatron-LM's latents are [s / TP, b, rank] and the up projections keep their
    local input: each rank stores 1/t of them (they had been counted whole per rank), as the
    layer's other tensors."""
    from model.memory import layer_tensors
    from model.plan import Shape
    m = presets.model("deepseek-v3")
    job = JobSpec(global_batch=8, seq_length=4096)
    sh = Shape(tp=4, pp=1, dp=1, micro_batch=1, sequence_parallel=True)
    got = {n: (b, split) for n, b, split in layer_tensors(m, job, sh)}
    kvl, ql, rope = m.mla_kv_lora_rank, m.mla_q_lora_rank, m.mla_qk_rope_dim
    # not TP-split, so SP divides them by t with the norms' inputs
    assert got["kv latent"] == (2 * (kvl + rope) + 2 * kvl, False)
    assert got["q latent"] == (4 * ql, False)


def test_mla_gathers_its_latents_not_the_hidden_states_under_sp():
    """Under SP multi-latent attention's column-parallel up projections gather the query and
    key/value latents and the rotary key is gathered on its own: the attention's input
    all-gather moves q_lora + kv_lora + rope channels a token, not the hidden size (DeepSeek-V3:
    2,112 against 7,168). The forward's exposed TP communication of a layer with whole experts
    (expert TP 1) is that gather, the projection's reduce-scatter and the shared experts' gather
    and reduce-scatter."""
    m = presets.model("deepseek-v3")
    job = JobSpec(global_batch=64, seq_length=4096)
    c = uniform_cluster(8, 8, "H100-SXM-80GB", 360.0, 50.0)
    plan = make_plan(m, job, c, tp=4, pp=16, ep=4, etp=1, sequence_parallel=True, zero=1)
    ev = Evaluator(m, job, c, plan.shape)
    lt = ev.costs.layer_times(c.nodes[0].gpu, 360.0)
    _ar, rs = ev.costs._tp(360.0)
    latents = m.mla_q_lora_rank + m.mla_kv_lora_rank + m.mla_qk_rope_dim
    assert latents == 2112
    assert lt.tp_comm_fwd_ms == pytest.approx(rs * (latents / m.hidden_size + 3), rel=1e-12)
