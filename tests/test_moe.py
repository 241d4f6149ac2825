"""Mixture of experts, expert parallelism 1: parameter counts, FLOPs, memory, one expert =
dense, the Hugging Face loader and the emitted flags."""

import dataclasses
import json

import pytest

from formats import presets
from formats.clusters import uniform_cluster
from formats.hf_config import load_hf_config
from launch.emit import emit, megatron_args
from model.compute import ComputeModel
from model.errors import SpecError
from model.estimator import estimate, make_plan
from model.specs import JobSpec


@pytest.mark.parametrize("name,total_b,active_b", [
    ("mixtral-8x7b", 46.7, 12.9),   # Jiang et al. 2024, Sec. 2
    ("mixtral-8x22b", 141.0, 39.0),  # Mistral AI's announcement
])
def test_published_total_and_active_parameters(name, total_b, active_b):
    m = presets.model(name)
    assert m.total_params / 1e9 == pytest.approx(total_b, rel=0.01)
    assert m.active_params / 1e9 == pytest.approx(active_b, rel=0.01)


def test_one_expert_is_the_dense_model():
    dense = presets.model("llama3-8b")
    one = dataclasses.replace(dense, num_experts=1, moe_topk=1)
    job = JobSpec(global_batch=32, seq_length=8192)
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 360.0, 45.0)
    for kw in (dict(tp=2, pp=2, sequence_parallel=True), dict(tp=1, pp=1, zero=3)):
        a = estimate(dense, job, c, make_plan(dense, job, c, **kw))
        b = estimate(one, job, c, make_plan(one, job, c, **kw))
        assert a.iteration_ms == b.iteration_ms and a.peak_memory_gib == b.peak_memory_gib


def test_moe_layer_flops_per_gpu():
    """The router (each TP rank routes its sequence-parallel shard; replicated without
    sequence parallelism), each token's top-k experts and the attention, split over TP: the
    per-operation model's FLOPs add up to eq. (3) with active experts."""
    m = presets.model("mixtral-8x7b")
    job = JobSpec(global_batch=8, seq_length=4096)
    gpu = presets.gpu("H100-SXM-80GB")
    t, T = 4, 4096
    cm = ComputeModel(m, job, gpu, tp=t, micro_batch=1, sequence_parallel=True, fp8=False)
    assert cm.layer().fwd.flops == pytest.approx(m.layer_flops_fwd(T, 4096) / t, rel=1e-12)
    router = 2 * T * m.hidden_size * m.num_experts
    whole = ComputeModel(m, job, gpu, tp=t, micro_batch=1, sequence_parallel=False, fp8=False)
    expected = (m.layer_flops_fwd(T, 4096) - router) / t + router
    assert whole.layer().fwd.flops == pytest.approx(expected, rel=1e-12)


def test_moe_memory_holds_every_expert():
    """Weights, gradients and optimizer state of all experts sit on each GPU (EP = 1), so a
    Mixtral stage holds about 3.6x the parameters of its active count."""
    m = presets.model("mixtral-8x7b")
    job = JobSpec(global_batch=64, seq_length=4096)
    c = uniform_cluster(4, 8, "A100-80GB", 240.0, 25.0)
    plan = make_plan(m, job, c, tp=8, pp=4, sequence_parallel=True, zero=1, recompute="full")
    e = estimate(m, job, c, plan)
    # every rank holds the router whole (Megatron-LM's TopKRouter weight is not split)
    router = m.hidden_size * m.num_experts
    assert m.tp_replicated_params_per_layer == router
    per_gpu = sum(s.layers for s in e.stages[1:2]) * ((m.params_per_layer - router) / 8
                                                      + router)
    assert e.stages[1].memory.weights_gib == pytest.approx(per_gpu * 2 / 2**30, rel=1e-9)
    assert m.params_per_layer / (m.params_per_layer - m.linear_params_per_layer
                                 + m.active_linear_params_per_layer) > 3.5


def _write(tmp_path, cfg):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_hf_loader_reads_moe_configs(tmp_path):
    mixtral = {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
               "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
               "vocab_size": 32000, "max_position_embeddings": 32768, "num_local_experts": 8,
               "num_experts_per_tok": 2, "tie_word_embeddings": False}
    m = load_hf_config(_write(tmp_path, mixtral))
    assert (m.num_experts, m.moe_topk) == (8, 2)
    assert m.total_params == presets.model("mixtral-8x7b").total_params
    qwen = {"model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048,
            "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
            "vocab_size": 151936, "max_position_embeddings": 8192, "num_experts": 60,
            "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1,
            "mlp_only_layers": []}
    q = load_hf_config(_write(tmp_path, qwen))
    assert (q.num_experts, q.moe_topk, q.expert_ffn, q.moe_shared_experts) == (60, 4, 1408, 4)
    with pytest.raises(SpecError) as e:
        load_hf_config(_write(tmp_path, {**qwen, "mlp_only_layers": [0]}))
    assert e.value.field == "mlp_only_layers" and "mlp_only_layers [0]" in str(e.value)
    with pytest.raises(SpecError) as e:  # the key that makes layers dense is the one named
        load_hf_config(_write(tmp_path, {**qwen, "decoder_sparse_step": 2}))
    assert e.value.field == "decoder_sparse_step"
    with pytest.raises(SpecError) as e:  # DeepSeek configs load (test_expert_parallel), but
        load_hf_config(_write(tmp_path, {"model_type": "deepseek_v3", "num_hidden_layers": 4,
                                         "hidden_size": 512, "num_attention_heads": 4,
                                         "intermediate_size": 1024, "vocab_size": 1000,
                                         "max_position_embeddings": 512}))
    assert e.value.field == "n_routed_experts"  # without their MoE fields, one line


def test_unmodelled_config_settings_are_said_not_dropped(tmp_path):
    """Settings of a config.json the cost model does not price and the emitters do not write
    (a used sliding window, multi-token prediction, router details, the load-balancing loss)
    are carried on the model and said by estimate, solve and emit, and by a plan file's
    replay; a window the config does not use, or no-op values, are not."""
    from typer.testing import CliRunner

    from cli import app
    from formats.planfile import load_plan
    mixtral = {"model_type": "mixtral", "num_hidden_layers": 8, "hidden_size": 1024,
               "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 2048,
               "vocab_size": 32000, "max_position_embeddings": 8192, "num_local_experts": 8,
               "num_experts_per_tok": 2, "sliding_window": 4096, "router_aux_loss_coef": 0.02,
               # a window over the upper layers only: neither every layer nor a full layer
               # every N (ModelSpec.window_full_every), so priced as full attention, and said
               "layer_types": ["full_attention"] * 4 + ["sliding_attention"] * 4}
    p = _write(tmp_path, mixtral)
    m = load_hf_config(p)
    assert [x.split(":")[0] for x in m.unmodelled] == ["sliding_window 4096",
                                                       "router_aux_loss_coef 0.02"]
    quiet = {**mixtral, "sliding_window": None, "router_aux_loss_coef": 0.0}
    (tmp_path / "q").mkdir()
    assert load_hf_config(_write(tmp_path / "q", quiet)).unmodelled == ()
    qwen = {"model_type": "qwen2", "num_hidden_layers": 4, "hidden_size": 512,
            "num_attention_heads": 8, "intermediate_size": 1024, "vocab_size": 1000,
            "max_position_embeddings": 4096, "sliding_window": 4096,
            "use_sliding_window": False}
    (tmp_path / "w").mkdir()
    assert load_hf_config(_write(tmp_path / "w", qwen)).unmodelled == ()
    # Qwen2 slides only in the layers from max_window_layers on (transformers' layer_types)
    qwen.update(use_sliding_window=True, max_window_layers=4)
    assert load_hf_config(_write(tmp_path / "w", qwen)).unmodelled == ()
    qwen.update(max_window_layers=2)
    assert load_hf_config(_write(tmp_path / "w", qwen)).unmodelled[0].startswith(
        "sliding_window 4096")
    # from layer 0 on, every layer slides: modelled (ModelSpec.sliding_window), not said
    qwen.update(max_window_layers=0)
    slid = load_hf_config(_write(tmp_path / "w", qwen))
    assert (slid.unmodelled, slid.sliding_window, slid.window_full_every) == ((), 4096, 0)
    runner = CliRunner()
    plan = tmp_path / "plan.json"
    args = ["estimate", "-m", str(p), "-c", "h100-8x8", "--gbs", "64", "--seq", "8192",
            "--tp", "1", "--pp", "1", "--json"]
    d = json.loads(runner.invoke(app, [*args, "--save-plan", str(plan)]).output)
    assert sum("sliding_window 4096" in w for w in d["warnings"]) == 1, d["warnings"]
    # a window no shorter than the sequence is full causal attention: nothing to say
    r = runner.invoke(app, [*args[:8], "4096", *args[9:]])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert not any("sliding_window" in w for w in d.get("warnings", [])), d
    assert m.unmodelled_at(4096) == m.unmodelled[1:]
    assert load_plan(plan)[0].unmodelled == m.unmodelled
    r = runner.invoke(app, ["emit", str(plan), "--out", str(tmp_path / "e"), "--json"])
    w = json.loads(r.output)["warnings"]
    assert any(x.startswith("megatron [model]") and "router_aux_loss_coef" in x for x in w), w


def test_rope_scaling_and_an_unknown_balancing_loss_are_said(tmp_path):
    """A rotary scaling (Llama 3.1's "llama3", YaRN) changes no FLOPs and is not emitted:
    said, from a config.json and from the presets that have one; "default" or null is not.
    A MoE emitted for Megatron-LM without a known load-balancing coefficient is warned
    (--moe-aux-loss-coeff defaults to 0), once; a model that names its coefficient gets
    that line instead."""
    from model.plan import megatron_placement
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 512,
           "num_attention_heads": 8, "intermediate_size": 1024, "vocab_size": 1000,
           "max_position_embeddings": 131072,
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                            "original_max_position_embeddings": 8192}}
    said = load_hf_config(_write(tmp_path, cfg)).unmodelled
    assert len(said) == 1 and said[0].startswith('rope_scaling {"factor": 8.0')
    for quiet in (None, {"rope_type": "default"}):
        (tmp_path / str(quiet)).mkdir()
        assert load_hf_config(_write(tmp_path / str(quiet),
                                     {**cfg, "rope_scaling": quiet})).unmodelled == ()
    assert "(llama3)" in presets.model("llama3-405b").unmodelled[0]
    assert "(yarn)" in presets.model("deepseek-v2-lite").unmodelled[0]
    c = uniform_cluster(4, 8, "H100-SXM-80GB", 400.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096)
    for name, generic in (("mixtral-8x22b", True), ("mixtral-8x7b", False)):
        m = presets.model(name)
        plan = make_plan(m, job, c, tp=8, pp=4, sequence_parallel=True,
                         placement=megatron_placement(c, 8, 4, 1))
        _files, warn = emit("megatron", m, job, c, plan, tmp_path / name, force=True)
        lines = [w for w in warn if "load-balancing loss" in w]
        assert len(lines) == 1 and ("not known here" in lines[0]) == generic, lines


def test_megatron_gets_the_expert_flags():
    m = presets.model("mixtral-8x7b")
    job = JobSpec(global_batch=64, seq_length=4096)
    c = uniform_cluster(4, 8, "A100-80GB", 240.0, 25.0)
    a = megatron_args(m, job, make_plan(m, job, c, tp=8, pp=4, sequence_parallel=True))[0]
    for flag, val in (("--num-experts", "8"), ("--moe-router-topk", "2"),
                      ("--moe-ffn-hidden-size", "14336"), ("--expert-model-parallel-size", "1")):
        assert a[a.index(flag) + 1] == val


def test_expert_tp_collectives_are_the_dispatchers_blocking_ones():
    """With expert TP = TP (Megatron-LM's default), the alltoall dispatcher all-gathers the
    routed tokens over the expert-TP ranks after the dispatch and reduce-scatters them before
    the combine, blocking, and autograd runs their mirrors in the backward
    (token_dispatcher.py, tensor_parallel/mappings.py); Transformer Engine's grouped expert
    linears do no communication of their own (explicit_expert_comm). So the routed tokens
    cost four exposed 16-bit collectives of k x the activation a layer, whatever
    --tp-comm-overlap says (it pipelines the attention's); Qwen3-30B-A3B has no shared
    experts, so its MLP adds nothing else."""
    from model.costs import CostModel
    from model.specs import Options
    m = presets.model("qwen3-30b-a3b")
    assert not m.moe_shared_experts
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 360.0, 50.0)
    job = JobSpec(global_batch=64, seq_length=4096)
    ring = 300.0
    got = {}
    for overlap in (False, True):
        plan = make_plan(m, job, c, tp=2, pp=1, ep=8, sequence_parallel=True,
                         tp_comm_overlap=overlap)
        assert plan.shape.expert_tp == 2
        cm = CostModel(m, job, c, plan.shape, Options())
        rs = cm._tp(ring)[1]  # a 16-bit reduce-scatter (and all-gather) of the activation
        gpu = c.nodes[0].gpu
        got[overlap] = cm._layer_tp_comm(cm.compute(gpu).layer(), ring, gpu)
    routed = 2 * m.moe_topk * rs
    (f0, b0), (f1, b1) = got[False], got[True]
    # forward: the attention's gather and reduce-scatter, then the routed tokens'
    assert f0 == pytest.approx(2 * rs + routed)
    # backward: the projection's gradient gather (exposed), QKV's two async ones (hidden in
    # part), the routed tokens' two mirrors (exposed)
    assert rs + routed <= b0 + 1e-12 and b0 <= 3 * rs + routed + 1e-12
    # the overlap hides some of the attention's, none of the routed tokens'
    assert routed <= f1 < f0 and routed <= b1 <= b0


def test_router_runs_on_the_sequence_shard_in_16_bits():
    """Megatron-LM routes each TP rank's sequence-parallel shard of the tokens (router.py:
    the MoE layer's input is the sequence-parallel hidden states) with its own GEMM in the
    base precision (router_gating_linear, not a Transformer Engine layer: no FP8)."""
    from model.compute import gemm_ms
    m = presets.model("qwen3-30b-a3b")
    h100 = presets.gpu("H100-SXM-80GB")
    T = 4096
    for fp8 in (False, True):
        job = JobSpec(global_batch=64, seq_length=T, fp8=fp8)
        lay = ComputeModel(m, job, h100, tp=2, micro_batch=1, sequence_parallel=True,
                           fp8=fp8, ep=8).layer()
        want = gemm_ms(h100, T // 2, m.num_experts, m.hidden_size, h100.peak_flops("bf16"))
        assert lay.fwd.ms["router"] == pytest.approx(want)
        assert "router.cast" not in lay.fwd.ms


def test_fp8_router_keeps_its_16_bit_input():
    """Under FP8 the linear layers keep 1-byte inputs, but the router is no Transformer Engine
    layer and keeps its bf16 input (moe_utils.py RouterGatingLinearFunction); it had been
    counted at 1 byte, 0.25 GiB short on a Mixtral stage."""
    from model.memory import layer_tensors
    mx = presets.model("mixtral-8x7b")
    c = uniform_cluster(8, 8, "H100-SXM-80GB", 360.0, 45.0)
    for fp8 in (False, True):
        job = JobSpec(global_batch=256, seq_length=4096, fp8=fp8)
        plan = make_plan(mx, job, c, tp=2, pp=4, ep=8, sequence_parallel=True,
                         distributed_optimizer=True, fp8=fp8)
        got = dict((n, b) for n, b, _ in layer_tensors(mx, job, plan.shape))
        assert got["router input"] == 2 * mx.hidden_size, fp8
        if fp8:  # the experts' GEMM inputs are FP8
            assert got["expert inputs"] == mx.hidden_size * mx.moe_topk * plan.shape.expert_tp
