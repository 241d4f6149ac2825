"""The estimator: memory formulas, link sensitivity, placement on the degraded node, speed."""

import dataclasses

import numpy as np
import pytest

from formats import presets
from formats.clusters import uniform_cluster
from model.cluster import ClusterSpec
from model.errors import SpecError
from model.estimator import Evaluator, estimate, make_plan
from model.memory import layer_activation_bytes
from model.plan import Shape
from model.specs import JobSpec, ModelSpec, Options


def gpt(h=4096, a=32, layers=8):
    return ModelSpec("gpt", layers, h, a, a, 4 * h, 51200, 2048)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
def test_activation_memory_reduces_to_korthikanti(t, sp):
    """Korthikanti et al. 2022 Table 2, GPT block (ffn = 4h, MHA), 16-bit, eager attention
    (the attention their formula describes)."""
    if sp and t == 1:
        return
    m = gpt()
    job = JobSpec(global_batch=8, seq_length=2048, precision="bf16", attention="eager")
    s, b, h, a = 2048, 2, m.hidden_size, m.num_heads
    sbh = s * b * h
    base = Shape(tp=t, pp=1, dp=1, micro_batch=b, layers=(8,), sequence_parallel=sp)
    none = layer_activation_bytes(m, job, base, "none")
    sel = layer_activation_bytes(m, job, base, "selective")
    full = layer_activation_bytes(m, job, base, "full")
    if sp:
        assert none == pytest.approx(sbh / t * (34 + 5 * a * s / h))
        assert sel == pytest.approx(34 * sbh / t)
        assert full == pytest.approx(2 * sbh / t)
    else:
        assert none == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
        assert sel == pytest.approx(sbh * (10 + 24 / t))
        assert full == pytest.approx(2 * sbh)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
def test_flash_attention_memory_is_korthikanti_without_the_scores(t, sp):
    """With FlashAttention the 5as/h term goes (the s x s scores are never stored); what is
    left is 34sbh/t with SP (sbh(10 + 24/t) without), plus the per-row log-sum-exp in fp32
    (4 bytes x heads x s x b / t), a 1e-3 share here."""
    if sp and t == 1:
        return
    m = gpt()
    job = JobSpec(global_batch=8, seq_length=2048, precision="bf16", attention="flash")
    s, b, h, a = 2048, 2, m.hidden_size, m.num_heads
    sbh = s * b * h
    base = Shape(tp=t, pp=1, dp=1, micro_batch=b, layers=(8,), sequence_parallel=sp)
    none = layer_activation_bytes(m, job, base, "none")
    lse = 4 * a * s * b / t
    korthikanti = 34 * sbh / t if sp else sbh * (10 + 24 / t)
    assert none == pytest.approx(korthikanti + lse)
    assert lse / none < 1e-3
    # recomputing the flash attention core frees only that log-sum-exp
    assert layer_activation_bytes(m, job, base, "selective") == pytest.approx(korthikanti)


def test_the_loss_step_peak_sits_on_the_last_stage_only():
    """The last stage keeps what its framework's loss keeps of the logits, and its backward
    transient is the larger of a layer's recompute and the loss step's peak beyond that
    (LOSS_BYTES_PER_LOGIT, one TP rank's vocabulary shard: Megatron-LM, torchtitan eager or
    compiled, with loss_parallel under TP; DeepSpeed's kept bytes only). The other stages
    carry neither."""
    from model.memory import LOSS_BYTES_PER_LOGIT
    m = presets.model("llama3-8b")
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 360.0, 50.0)
    cases = (("megatron", 2, None, "megatron"), ("megatron-fused", 2, None, "megatron-fused"),
             ("deepspeed", 2, None, "deepspeed"),
             ("torchtitan", 2, False, "torchtitan-loss-parallel"),
             ("torchtitan", 1, False, "torchtitan"),
             ("torchtitan", 1, None, "torchtitan-compiled"),
             ("torchtitan", 2, None, "torchtitan-compiled-loss-parallel"))
    for fw, t, compile_loss, path in cases:
        fused = fw == "megatron-fused"  # JobSpec.fused_loss: Megatron-Core's native fused loss
        job = JobSpec(global_batch=32, seq_length=8192, framework=fw.removesuffix("-fused"),
                      compile_loss=compile_loss, fused_loss=fused)
        plan = make_plan(m, job, c, tp=t, pp=2, micro_batch=2, recompute="full",
                         sequence_parallel=t > 1, zero=3 if fw == "torchtitan" else 1)
        mem = Evaluator(m, job, c, plan.shape).mem
        logits = 2 * 8192 * m.vocab_size / t
        kept, peak = LOSS_BYTES_PER_LOGIT[path]
        assert mem.stage_work(1) == pytest.approx(max(mem.work, (peak - kept) * logits))
        assert mem.stage_work(0) == mem.work
        h = m.hidden_size
        assert mem.head_act == pytest.approx(2 * 2 * 2 * 8192 * h / t + kept * logits)


def test_deepspeed_pipe_buffers_hold_outputs_logits_and_without_tp_the_received_input():
    """DeepSpeed's pipeline engine keeps, per micro-batch in flight, each stage's output (the
    last stage's: its logits, in fp32 after Megatron-DeepSpeed's float16_to_fp32) and,
    without TP, the received input beside the clone its forward runs on
    (deepspeed/runtime/pipe/engine.py, _exec_forward_pass); its last stage also keeps the
    previous micro-batch's logits, which its backward never frees (_exec_backward_pass
    returns first there): a constant of that stage, on the MILP's side too
    (const_static_bytes). Megatron-LM keeps none of these."""
    m = presets.model("gpt3-175b")
    c = uniform_cluster(4, 8, "A100-80GB", 240.0, 25.0)
    s, h, V, layers = 2048, m.hidden_size, m.vocab_size, 6
    for fw in ("deepspeed", "megatron"):
        for t, sp in ((1, False), (2, False), (2, True)):
            job = JobSpec(global_batch=64, seq_length=s, precision="fp16", framework=fw)
            plan = make_plan(m, job, c, tp=t, pp=4, micro_batch=1, recompute="full", zero=1,
                             sequence_parallel=sp)
            mem = Evaluator(m, job, c, plan.shape).mem
            body = layers * mem.act_layer
            ds = fw == "deepspeed"
            # with sequence parallelism each tensor rank holds its sequence shard, and the
            # engine does not partition it (so the received shard is kept too)
            out = 2.0 * s * h * ds / (t if sp else 1)
            received = out if ds and (t == 1 or sp) else 0.0
            assert mem.chunk_act_bytes(0, layers) - body - mem.emb_act == pytest.approx(out)
            assert mem.chunk_act_bytes(1, layers) - body == pytest.approx(received + out)
            assert mem.chunk_act_bytes(3, layers) - body - mem.head_act == pytest.approx(
                received + 4.0 * s * V / t * ds)
            stale = 4.0 * s * V / t * ds
            assert mem.const_static_bytes(0.0, 3) - mem.const_static_bytes(0.0, 2) == \
                pytest.approx(stale)
            full = mem.stage(3, 0.0, plan.shape.layers)
            assert full.activations_gib * 2 ** 30 == pytest.approx(
                mem.chunk_act_bytes(3, plan.shape.layers[3]) + stale)


def test_deepspeed_transfers_carry_what_each_tensor_rank_holds():
    """DeepSpeed's pipeline engine sends from every tensor rank what it holds: the whole
    activation, or under sequence parallelism its 1/t sequence shard (it had been charged
    the whole activation there too); Megatron-LM sends 1/t either way."""
    from model.costs import CostModel
    m = presets.model("llama2-70b")
    c = uniform_cluster(4, 8, "A100-80GB", 240.0, 25.0)
    hop = {}
    for fw in ("deepspeed", "megatron"):
        for sp in (False, True):
            job = JobSpec(global_batch=64, seq_length=4096, framework=fw)
            plan = make_plan(m, job, c, tp=8, pp=4, micro_batch=1, zero=1,
                             sequence_parallel=sp)
            costs = CostModel(m, job, c, plan.shape, Options())
            hop[fw, sp] = costs.hop_ms(25.0, False, 240.0) - c.latency_us / 1e3
    assert hop["deepspeed", True] == pytest.approx(hop["deepspeed", False] / 8)
    assert hop["deepspeed", True] == pytest.approx(hop["megatron", True])


def test_llama3_8b_seq8192_tp8_fits_with_flash_not_eager():
    """Issue 10: Llama-3 8B at sequence 8192, bf16, no recompute, TP=8 on one H100 node:
    tens of GiB per GPU with FlashAttention; eager attention would store hundreds."""
    from formats.clusters import uniform_cluster
    m = presets.model("llama3-8b")
    c = uniform_cluster(1, 8, "H100-SXM-80GB", 360.0, 50.0)
    out = {}
    for attn in ("flash", "eager"):
        job = JobSpec(global_batch=8, seq_length=8192, precision="bf16", attention=attn)
        plan = make_plan(m, job, c, tp=8, pp=1, micro_batch=1, sequence_parallel=True)
        out[attn] = estimate(m, job, c, plan).peak_memory_gib
    assert 10 < out["flash"] < 80
    # the difference is the stored scores (2 bytes each without dropout) of 32 layers of one
    # micro-batch, minus FlashAttention's log-sum-exp, with the allocator allowance on top
    job = JobSpec(global_batch=8, seq_length=8192, precision="bf16", attention="eager")
    scores = m.num_layers * 2 * m.num_heads * 8192 ** 2 / 8
    lse = m.num_layers * 4 * m.num_heads * 8192 / 8
    frag = 1 + job_overheads_fragmentation()
    assert out["eager"] - out["flash"] == pytest.approx((scores - lse) * frag / 2 ** 30)
    assert out["eager"] > 40


def job_overheads_fragmentation():
    from model.specs import Overheads
    return Overheads().fragmentation


def test_weights_and_optimizer_bytes_follow_megatron_table(small_uniform):
    for prec, plain, dist in (("bf16", 18, (6, 12)), ("fp16", 20, (4, 16)), ("fp32", 16, (8, 8))):
        job = JobSpec(global_batch=32, seq_length=4096, precision=prec)
        assert job.weight_bytes + job.grad_bytes + job.optimizer_bytes == plain
        assert (job.weight_bytes + job.grad_bytes, job.optimizer_bytes) == dist


def test_distributed_optimizer_shards_optimizer_state(small_uniform):
    m = presets.model("llama2-7b")
    job = JobSpec(global_batch=32, seq_length=4096)
    off = estimate(m, job, small_uniform, make_plan(m, job, small_uniform, tp=4, pp=2))
    on = estimate(m, job, small_uniform, make_plan(m, job, small_uniform, tp=4, pp=2,
                                                   distributed_optimizer=True))
    dp = 4
    for a, b in zip(off.stages, on.stages):
        assert b.memory.optimizer_gib == pytest.approx(a.memory.optimizer_gib / dp)
        assert b.memory.total_gib < a.memory.total_gib


def test_recompute_trades_memory_for_time(small_uniform):
    m = presets.model("llama2-13b")
    job = JobSpec(global_batch=64, seq_length=4096)
    res = {rc: estimate(m, job, small_uniform,
                        make_plan(m, job, small_uniform, tp=8, pp=2, recompute=rc))
           for rc in ("none", "selective", "full")}
    assert res["none"].peak_memory_gib > res["selective"].peak_memory_gib > \
        res["full"].peak_memory_gib
    assert res["none"].iteration_ms < res["selective"].iteration_ms < res["full"].iteration_ms


def test_uniform_stages_without_communication_match_1f1b_formula(monkeypatch):
    """One GPU per stage, (nearly) free links, no data parallelism, no embedding or output-layer
    work (a tiny vocabulary, and their kernels set to nothing): the estimator gives
    (m + p - 1)(f + b) plus the optimizer."""
    from model.compute import Pass
    monkeypatch.setattr("model.compute.ComputeModel.embedding", lambda self: (Pass(), Pass()))
    empty_head = Pass(ms={"logits.wgrad": 0.0})
    monkeypatch.setattr("model.compute.ComputeModel.head", lambda self: (Pass(), empty_head))
    m = ModelSpec("uniform", 8, 4096, 32, 32, 16384, 8, 2048)
    c = dataclasses.replace(uniform_cluster(1, 4, "A100-80GB", 1e12, 1e12, latency_us=0.0),
                            intra_latency_us=0.0)
    job = JobSpec(global_batch=16, seq_length=2048)
    plan = make_plan(m, job, c, tp=1, pp=4, micro_batch=1, layers=(2, 2, 2, 2))
    ev = Evaluator(m, job, c, plan.shape)
    e = ev.estimate(plan.placement)
    lt = ev.costs.layer_times(c.nodes[0].gpu, float("inf"))
    f, b = 2 * lt.fwd_ms, 2 * lt.bwd_ms
    expected = (16 + 4 - 1) * (f + b) + e.stages[0].optimizer_ms
    assert e.iteration_ms == pytest.approx(expected, rel=1e-4)  # the 8-word output layer


def _two_node_cluster(bw):
    g = presets.gpu("A100-80GB")
    from model.cluster import NodeSpec
    nodes = tuple(NodeSpec(f"n{i}", g, 8, 240.0) for i in range(2))
    mat = np.array([[0.0, bw], [bw, 0.0]])
    return ClusterSpec("two", nodes, mat, 5.0)


def test_slower_link_raises_time():
    m = presets.model("llama2-13b")
    job = JobSpec(global_batch=64, seq_length=4096)
    times = []
    for bw in (50.0, 20.0, 5.0, 1.0):
        c = _two_node_cluster(bw)
        times.append(estimate(m, job, c, make_plan(m, job, c, tp=8, pp=2,
                                                   recompute="full")).iteration_ms)
    assert times == sorted(times) and times[-1] > times[0]


def test_plan_on_degraded_node_is_slower(example_cluster):
    """node05 of the example has a degraded NIC. The same plan is slower with it than on the
    same cluster with node05's links repaired to its leaf's typical rate, and among placements
    the estimator prefers keeping the degraded node off cross-leaf pipeline hops."""
    c = example_cluster
    m = presets.model("llama2-13b")
    job = JobSpec(global_batch=64, seq_length=4096)
    plan = make_plan(m, job, c, tp=1, pp=8, micro_batch=1)
    bw = c.inter_gb_per_s.copy()
    healthy = np.median(bw[bw > 0])
    bw[5, :] = np.where(bw[5, :] > 0, np.maximum(bw[5, :], healthy), 0)
    bw[:, 5] = np.where(bw[:, 5] > 0, np.maximum(bw[:, 5], healthy), 0)
    repaired = dataclasses.replace(c, inter_gb_per_s=bw)
    slow = estimate(m, job, c, plan).iteration_ms
    fast = estimate(m, job, repaired, plan).iteration_ms
    assert slow > fast + 1.0  # ms: two pipeline hops at half rate


def test_bad_plans_raise_spec_errors(small_uniform):
    m = presets.model("llama2-7b")
    job = JobSpec(global_batch=30, seq_length=4096)
    with pytest.raises(SpecError, match="does not divide"):
        make_plan(m, job, small_uniform, tp=3, pp=1, dp=1)
    with pytest.raises(SpecError, match="TP x PP x DP"):
        make_plan(m, job, small_uniform, tp=8, pp=2, dp=1)
    with pytest.raises(SpecError, match="not divisible"):
        make_plan(m, job, small_uniform, tp=8, pp=1, micro_batch=4)
    with pytest.raises(SpecError, match="layers sum"):
        make_plan(m, JobSpec(global_batch=32, seq_length=4096), small_uniform, tp=8, pp=4,
                  layers=(8, 8, 8, 9))


def test_estimate_is_fast_enough_for_solvers(gpt175, job175):
    """The solver hot path: a 12-stage, 64-micro-batch GPT-3 plan (speed figure: bench/)."""
    c = uniform_cluster(12, 8, "A100-80GB", 240, 23)
    job = dataclasses.replace(job175, global_batch=64)
    plan = make_plan(gpt175, job, c, tp=8, pp=12, micro_batch=1, recompute="full")
    ev = Evaluator(gpt175, job, c, plan.shape)
    assert ev.m == 64
    full = ev.estimate(plan.placement)
    assert ev.iteration_ms(plan.placement) == pytest.approx(full.iteration_ms, rel=1e-12)


@pytest.mark.parametrize("framework,recompute,again", [
    ("megatron", "none", 0.0), ("megatron", "full", 1.0), ("megatron", "selective", 0.0),
    ("torchtitan", "selective", 0.5)])
def test_breakdown_shows_exposed_tp_collectives(framework, recompute, again):
    """One stage: the critical path runs every micro-batch's F and B of every layer, so the
    breakdown's tp_comm_ms is layers x micro-batches x (the exposed forward collectives, the
    backward's, and the forward's again as far as the recompute reruns them: all of them
    under full recompute, half under torchtitan's per-op selective one); it is taken out of
    the compute, and the parts still add up to the iteration."""
    m = presets.model("llama3-8b")
    c = uniform_cluster(1, 8, "H100-SXM-80GB", 100.0, 50.0)
    job = JobSpec(global_batch=4, seq_length=8192, framework=framework,
                  zero=3 if framework == "torchtitan" else None)
    plan = make_plan(m, job, c, tp=8, pp=1, dp=1, sequence_parallel=True, recompute=recompute)
    ev = Evaluator(m, job, c, plan.shape)
    e = ev.estimate(plan.placement)
    node = c.nodes[0]
    lt = ev.costs.layer_times(node.gpu, node.ring_gb_per_s(plan.placement.gpus[0][0]),
                              ev.shard_ring(plan.placement, 0))
    assert lt.tp_comm_fwd_ms > 0
    want = m.num_layers * 4 * ((1 + again) * lt.tp_comm_fwd_ms + lt.tp_comm_bwd_ms)
    assert e.breakdown_ms["tp_comm_ms"] == pytest.approx(want)
    assert sum(e.breakdown_ms.values()) == pytest.approx(e.iteration_ms)


def test_torchtitan_fsdp_under_pp_gathers_and_reduces_once_a_step():
    """torchtitan's FSDP2 with PP keeps the weights and gradients unsharded across the
    micro-batches (reshard_after_forward off, and PyTorch's pipeline stage defers the gradient
    reduce-scatter to the last backward): its gathers and reduce-scatters run once a step, in
    the stage's tail, not per micro-batch (1.4 s of a 19.3 s Llama-3 70B step had been charged
    per micro-batch, where memory.keeps_unsharded already held the weights). Twice the
    micro-batches add no shard communication; the tail's part is the stage's reduce-scatter
    (fp32 gradients over the shard group's ring) and its first gathers."""
    m = presets.model("llama3-8b")
    c = uniform_cluster(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    ests = []
    for gbs in (32, 64):
        job = JobSpec(global_batch=gbs, seq_length=4096, framework="torchtitan", zero=3)
        plan = make_plan(m, job, c, tp=2, pp=4, zero=3)
        ev = Evaluator(m, job, c, plan.shape)
        est = ev.estimate(plan.placement)
        assert est.breakdown_ms["shard_comm_ms"] == 0.0
        # stage 0: per layer its reduce-scatter plus the gather the prefetch leaves, a chunk's
        # first gather, the embedding's gather and reduce-scatter
        node = c.nodes[plan.placement.node[0][0]]
        shard = ev.shard_ring(plan.placement, 0)
        lt = ev.costs.layer_times(node.gpu, node.ring_gb_per_s(plan.placement.gpus[0][0]),
                                  shard)
        ag, rs = ev.costs._shard_collectives(m.layer_params_per_gpu(2), shard)
        e_ag, e_rs = ev.costs._shard_collectives(m.vocab_size * m.hidden_size / 2, shard)
        want = plan.shape.layers[0] * (max(0.0, ag - lt.fwd_ms) + rs) + ag + e_ag + e_rs
        assert ev.unsharded_step_ms(plan.placement, 0) == pytest.approx(want, rel=1e-12)
        d = plan.shape.shard_group  # fp32 gradients, (d - 1) / d of them over the ring
        assert d == 4 and rs == pytest.approx(
            m.layer_params_per_gpu(2) * 4 * (d - 1) / d / (shard * 1e6), rel=0.05)
        ests.append(est)
    assert ests[1].breakdown_ms["dp_sync_exposed_ms"] == pytest.approx(
        ests[0].breakdown_ms["dp_sync_exposed_ms"], rel=1e-12)
    # ZeRO-3 without PP still gathers and reduces per micro-batch
    job = JobSpec(global_batch=32, seq_length=4096, framework="torchtitan", zero=3)
    flat = make_plan(m, job, c, tp=2, pp=1, zero=3)
    assert estimate(m, job, c, flat).breakdown_ms["shard_comm_ms"] > 0


def test_megatron_core_pipeline_transfers_send_the_whole_tensor_without_sp():
    """Megatron-Core sends the whole [s/cp, b, h] activation from every tensor rank unless
    sequence parallelism slices it (its get_tensor_shapes); legacy Megatron-LM's scatter/gather
    (the 2021 runs: JobSpec.p2p_scatter_gather) sends 1/t and gathers over NVLink. With SP both
    send the 1/t shard."""
    m = presets.model("llama3-8b")
    c = uniform_cluster(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    for sp in (False, True):
        costs = {}
        for legacy in (False, True):
            job = JobSpec(global_batch=32, seq_length=8192, p2p_scatter_gather=legacy)
            plan = make_plan(m, job, c, tp=4, pp=4, sequence_parallel=sp)
            costs[legacy] = Evaluator(m, job, c, plan.shape).costs
        core, legacy = costs[False], costs[True]
        msg = 8192 * m.hidden_size * 2  # bytes of one micro-batch's activation
        lat = c.latency_us / 1e3
        want = lat + (msg / 4 if sp else msg) / (50.0 * 1e6)
        assert core.hop_ms(50.0, False, 360.0) == pytest.approx(want, rel=1e-12)
        assert float(core._inter_hops_ms(np.array([[50.0]]))[0, 0]) == pytest.approx(want)
        if sp:
            assert legacy.hop_ms(50.0, False, 360.0) == pytest.approx(want, rel=1e-12)
        else:
            assert legacy.hop_ms(50.0, False, 360.0) < want / 2


def test_torchtitan_refuses_tied_embeddings_under_pipeline_parallelism():
    """torchtitan raises 'Weight tying is not supported with Pipeline Parallel'
    (torchtitan/models/common/decoder.py); its stages of v0.2 are deep copies whose two
    weights would train apart. PP 1 and untied models are taken."""
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 360.0, 50.0)
    tied = dataclasses.replace(gpt(), tied_embeddings=True)
    job = JobSpec(global_batch=32, seq_length=2048, framework="torchtitan")
    kw = dict(tp=2, sequence_parallel=True, zero=3)
    with pytest.raises(SpecError, match="Weight tying is not supported") as e:
        estimate(tied, job, c, make_plan(tied, job, c, pp=2, **kw))
    assert e.value.field == "pp"
    for model, pp in ((gpt(), 2), (tied, 1)):
        assert estimate(model, job, c, make_plan(model, job, c, pp=pp, **kw)).iteration_ms > 0
