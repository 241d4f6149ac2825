import json
from pathlib import Path

import pytest

from formats import presets
from model.errors import SpecError


@pytest.mark.parametrize("name,billions", [("gpt3-175b", 174.6), ("llama2-7b", 6.74),
                                           ("llama2-70b", 68.98), ("llama3-8b", 8.03),
                                           ("llama3-70b", 70.55), ("llama3-405b", 405.8),
                                           ("bloom-176b", 176.2), ("gpt-1t", 1008.0)])
def test_model_parameter_counts(name, billions):
    assert presets.model(name).total_params / 1e9 == pytest.approx(billions, rel=0.01)


def test_every_gpu_preset_cites_a_source():
    for n in presets.gpu_names():
        g = presets.gpu(n)
        assert g.source and g.memory_gib > 0 and g.peak_tflops


def test_hf_configs(tmp_path):
    llama = {"model_type": "llama", "num_hidden_layers": 80, "hidden_size": 8192,
             "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672,
             "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(llama))
    m = presets.model(str(p))
    ref = presets.model("llama3-70b")
    assert m.total_params == ref.total_params and m.gated_mlp and m.num_kv_heads == 8
    gpt2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_inner": None,
            "vocab_size": 50257, "n_positions": 1024}
    p.write_text(json.dumps(gpt2))
    m = presets.model(str(tmp_path))
    assert m.ffn_hidden_size == 3072 and m.tied_embeddings and not m.gated_mlp
    neox = {"model_type": "gpt_neox", "num_hidden_layers": 44, "hidden_size": 6144,
            "num_attention_heads": 64, "intermediate_size": 24576, "vocab_size": 50432,
            "max_position_embeddings": 2048, "tie_word_embeddings": False}
    p.write_text(json.dumps(neox))
    assert presets.model(str(p)).num_kv_heads == 64
    p.write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(SpecError, match="unsupported model_type"):
        presets.model(str(p))
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 10}))
    with pytest.raises(SpecError, match="num_layers"):
        presets.model(str(p))


def test_a_hf_config_with_a_byte_order_mark_reads(tmp_path):
    """config.json saved with a UTF-8 byte-order mark reads as without one (it had been
    refused as not JSON)."""
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 1024,
           "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 2816,
           "vocab_size": 8000, "max_position_embeddings": 1024}
    plain, bom = tmp_path / "a" / "config.json", tmp_path / "b" / "config.json"
    for p in (plain, bom):
        p.parent.mkdir()
    plain.write_text(json.dumps(cfg))
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    a, b = presets.model(str(plain)), presets.model(str(bom))
    assert (a.num_layers, a.hidden_size, a.ffn_hidden_size) == (b.num_layers, b.hidden_size,
                                                               b.ffn_hidden_size)


_LLAMA = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 1024,
          "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 2816,
          "vocab_size": 8000, "max_position_embeddings": 1024}
_DEEPSEEK = dict(_LLAMA, model_type="deepseek_v3", n_routed_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=512, kv_lora_rank=64, qk_nope_head_dim=64,
                 qk_rope_head_dim=32, v_head_dim=64, first_k_dense_replace=1)


@pytest.mark.parametrize("cfg,key,says", [
    (dict(_DEEPSEEK, first_k_dense_replace=9), "first_k_dense_replace",
     "first_k_dense_replace 9 needs"),
    (dict(_DEEPSEEK, kv_lora_rank=-1), "kv_lora_rank", "must be an integer, 0 or more"),
    (dict(_DEEPSEEK, num_experts_per_tok=20), "num_experts_per_tok",
     "num_experts_per_tok 20 must be between 1 and n_routed_experts 8"),
    (dict(_LLAMA, model_type="mixtral", num_local_experts=0, num_experts_per_tok=2),
     "num_local_experts", "need num_local_experts > 0"),
    (dict(_LLAMA, max_position_embeddings=0), "max_position_embeddings", "must be a positive"),
    (dict(_LLAMA, num_hidden_layers=0), "num_hidden_layers", "must be a positive"),
    (dict(_LLAMA, rope_scaling="linear"), "rope_scaling", "is the string \"linear\"")])
def test_hf_config_errors_name_the_files_keys(tmp_path, cfg, key, says):
    """An error in a config.json names the file's key (first_k_dense_replace), never ours
    (first_dense_layers, mla_kv_lora_rank, moe_topk, num_experts, seq_length, num_layers); a
    rope_scaling string (transformers reads an object) is refused, not ignored."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(SpecError) as e:
        presets.model(str(p))
    assert e.value.field == key and says in e.value.problem, str(e.value)
    for ours in ("first_dense_layers", "mla_", "moe_topk", "seq_length", "num_layers"):
        assert ours not in str(e.value)


@pytest.mark.parametrize("cfg,says", [
    (dict(_LLAMA, attention_bias=True), "attention_bias true: biases on the attention"),
    (dict(_LLAMA, mlp_bias=True), "mlp_bias true: biases on the MLP"),
    (dict(_LLAMA, num_local_experts=8, num_experts_per_tok=2),
     "num_local_experts 8: model_type llama builds a dense model"),
    (dict(_LLAMA, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2,
          moe_intermediate_size=512), "moe_intermediate_size 512: Mixtral's experts are "
     "intermediate_size wide")])
def test_hf_config_settings_priced_otherwise_are_said(tmp_path, cfg, says):
    """Settings the model is priced without (a llama's biases, expert keys on a dense family,
    Mixtral's moe_intermediate_size) are model warnings, not dropped without a word; their
    absence (or false) says nothing."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert any(x.startswith(says) for x in presets.model(str(p)).unmodelled)
    p.write_text(json.dumps(dict(_LLAMA, attention_bias=False, mlp_bias=False)))
    assert presets.model(str(p)).unmodelled == ()


def test_qwen3_dense_config_loads_with_its_qk_norm(tmp_path):
    """model_type qwen3 (Qwen3-8B/32B: the MoE family's attention, a dense MLP) loads as a
    gated RoPE model with per-head q/k norms, as its qwen3_moe sibling does (it had been
    refused as an unsupported model_type); its sizes are the llama reading's."""
    cfg = dict(_LLAMA, model_type="qwen3", head_dim=128, tie_word_embeddings=False)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = presets.model(str(p))
    p.write_text(json.dumps(dict(cfg, model_type="llama")))
    ref = presets.model(str(p))
    assert m.qk_norm and not ref.qk_norm and m.gated_mlp
    assert m.total_params == ref.total_params


@pytest.mark.parametrize("cfg,says", [
    (dict(_LLAMA, hidden_act="gelu"), 'hidden_act "gelu": priced and emitted with SiLU'),
    (dict(_LLAMA, model_type="gpt_neox", hidden_act="gelu", vocab_size=50432),
     "use_parallel_residual true: attention and MLP side by side"),
    (dict(_LLAMA, model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2,
          moe_intermediate_size=1376, norm_topk_prob=False),
     "norm_topk_prob false: the routed experts' weights are the full softmax's"),
    (dict(_LLAMA, model_type="qwen2_moe", num_experts=8, num_experts_per_tok=2,
          moe_intermediate_size=1376, shared_expert_intermediate_size=5504),
     "shared expert gate: Qwen2-MoE scales its shared expert by a sigmoid gate")])
def test_architecture_keys_not_priced_or_emitted_are_said(tmp_path, cfg, says):
    """A config's activation other than its family's, GPT-NeoX's parallel residual block (its
    configuration's default), a router that does not renormalize its top-k weights and Qwen2-MoE's
    shared-expert gate change the model the emitted arguments build: each is carried and said
    (all four had been dropped without a word)."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = presets.model(str(p))
    assert any(x.startswith(says) for x in m.unmodelled), m.unmodelled
    p.write_text(json.dumps(dict(cfg, hidden_act="silu" if m.gated_mlp else "gelu",
                                 use_parallel_residual=False, norm_topk_prob=True)))
    assert not any(x.startswith(says) for x in presets.model(str(p)).unmodelled) or (
        "shared expert gate" in says)


def test_qwen2_qkv_biases_are_counted_and_emitted(tmp_path):
    """model_type qwen2 (Qwen2 / Qwen2.5: biases on q, k and v only) loads with qkv_bias: its
    q + 2 kv bias weights a layer are counted, Megatron-LM gets --add-qkv-bias beside
    --disable-bias-linear and the Bridge recipe add_qkv_bias, torchtitan's warning says its
    model lacks them; a plan file keeps it, and a Megatron-LM log's arguments read it back
    (they had been dropped without a word: the emitted model could not load the checkpoint).
    A file not named config.json names the model after itself, not its folder."""
    from formats.clusters import uniform_cluster
    from formats.megatron_args import megatron_args_mismatch, megatron_planned_args
    from formats.planfile import load_plan, save_plan
    from launch.emit import bridge_recipe, megatron_args, torchtitan_config
    from model.estimator import estimate, make_plan
    from model.specs import JobSpec
    cfg = dict(_LLAMA, model_type="qwen2")
    p = tmp_path / "qwen25.json"
    p.write_text(json.dumps(cfg))
    m = presets.model(str(p))
    p.write_text(json.dumps(dict(cfg, model_type="llama")))
    ref = presets.model(str(p))
    assert m.qkv_bias and not m.bias and not ref.qkv_bias and m.name == "qwen25"
    assert m.params_per_layer - ref.params_per_layer == m.q_dim + 2 * m.kv_dim
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 360.0, 40.0)
    job = JobSpec(global_batch=32, seq_length=2048)
    plan = make_plan(m, job, c, tp=2, pp=2)
    args, _ = megatron_args(m, job, plan)
    assert "--disable-bias-linear" in args and "--add-qkv-bias" in args
    assert "--add-qkv-bias" not in megatron_args(ref, job, plan)[0]
    assert bridge_recipe(m, job, c, plan)[0]["model"]["add_qkv_bias"] is True
    assert any("query, key and value" in w for w in torchtitan_config(m, job, c, plan)[1])
    save_plan(tmp_path / "plan.json", m, job, c, plan, estimate(m, job, c, plan))
    assert load_plan(tmp_path / "plan.json")[0].qkv_bias
    printed = {**megatron_planned_args(m, job, plan), "add_bias_linear": "False",
               "add_qkv_bias": "False"}
    assert ("add_qkv_bias", "False", "True") in megatron_args_mismatch(m, job, plan, printed)
    from formats.clusters import cluster as load_cluster
    from formats.logs import megatron_arg_blocks
    from formats.megatron_args import plan_from_megatron_args
    logs = Path(__file__).parent / "fixtures" / "logs"
    base = megatron_arg_blocks((logs / "megatron_args_70b.txt").read_text())[0]
    ex = load_cluster("example")
    assert plan_from_megatron_args({**base, "add_qkv_bias": "True"}, ex,
                                   source="t")[0].qkv_bias
    assert not plan_from_megatron_args(base, ex, source="t")[0].qkv_bias


@pytest.mark.parametrize("family,key", [("qwen2", "rms_norm_eps"),
                                        ("gpt_neox", "layer_norm_eps"),
                                        ("gpt2", "layer_norm_epsilon")])
def test_norm_epsilon_is_read_carried_and_emitted(tmp_path, family, key):
    """A config's norm epsilon (Qwen's and DeepSeek's 1e-6) reaches Megatron-LM
    (--norm-epsilon), NeMo 1.x and Bridge (layernorm_epsilon); the default 1e-5 is not
    written; a plan file keeps it and one written before it existed reads as not given; a
    Megatron-LM log's arguments read it back under either printed name (it had been dropped:
    the emitted model normalised with 1e-5 where the checkpoint was trained with 1e-6)."""
    from formats.clusters import cluster as load_cluster
    from formats.clusters import uniform_cluster
    from formats.logs import megatron_arg_blocks
    from formats.megatron_args import plan_from_megatron_args
    from formats.planfile import load_plan, save_plan
    from launch.emit import bridge_recipe, megatron_args, nemo_config
    from model.estimator import estimate, make_plan
    from model.specs import JobSpec
    cfg = dict(_LLAMA, model_type=family, **{key: 1e-6})
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = presets.model(str(p))
    p.write_text(json.dumps(dict(cfg, **{key: 1e-5})))
    default = presets.model(str(p))
    assert (m.norm_eps, default.norm_eps) == (1e-6, 1e-5)
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 360.0, 40.0)
    job = JobSpec(global_batch=32, seq_length=1024)
    plan = make_plan(m, job, c, tp=2, pp=2)
    args = megatron_args(m, job, plan)[0]
    assert args[args.index("--norm-epsilon") + 1] == "1e-06"
    assert "--norm-epsilon" not in megatron_args(default, job, plan)[0]
    assert nemo_config(m, job, c, plan)[0]["model"]["layernorm_epsilon"] == 1e-6
    assert "layernorm_epsilon" not in nemo_config(default, job, c, plan)[0]["model"]
    assert bridge_recipe(m, job, c, plan)[0]["model"]["layernorm_epsilon"] == 1e-6
    # not priced: the same estimate
    assert estimate(m, job, c, plan).iteration_ms == \
        estimate(default, job, c, plan).iteration_ms
    save_plan(tmp_path / "plan.json", m, job, c, plan, estimate(m, job, c, plan))
    assert load_plan(tmp_path / "plan.json")[0].norm_eps == 1e-6
    d = json.loads((tmp_path / "plan.json").read_text())
    del d["model"]["norm_eps"]
    (tmp_path / "old.json").write_text(json.dumps(d))
    assert load_plan(tmp_path / "old.json")[0].norm_eps == 0.0
    logs = Path(__file__).parent / "fixtures" / "logs"
    base = megatron_arg_blocks((logs / "megatron_args_70b.txt").read_text())[0]
    ex = load_cluster("example")
    base = {k: v for k, v in base.items() if k != "layernorm_epsilon"}  # printed from 0.16
    for name in ("norm_epsilon", "layernorm_epsilon"):  # before core 0.16, and since
        assert plan_from_megatron_args({**base, name: "1e-06"}, ex,
                                       source="t")[0].norm_eps == 1e-6
    p.write_text(json.dumps(dict(cfg, **{key: "1e-6"})))
    with pytest.raises(SpecError, match=key):
        presets.model(str(p))
    p.write_text(json.dumps(dict(cfg, **{key: 0.5})))
    with pytest.raises(SpecError, match="small number"):
        presets.model(str(p))


def test_qwen_and_deepseek_presets_carry_their_norm_epsilon():
    """The presets whose config.json sets rms_norm_eps 1e-6 carry it; the others leave the
    frameworks' 1e-5."""
    for name in ("qwen3-30b-a3b", "qwen3-235b-a22b", "qwen1.5-moe-a2.7b", "deepseek-v2-lite",
                 "deepseek-v3"):
        assert presets.model(name).norm_eps == 1e-6, name
    assert presets.model("llama3-8b").norm_eps == 0.0


@pytest.mark.parametrize("cfg,key,says", [
    (dict(_DEEPSEEK, num_nextn_predict_layers="1"), "num_nextn_predict_layers",
     "must be a count"),
    (dict(_LLAMA, model_type="mistral", sliding_window=-1), "sliding_window",
     "must be a count"),
    (dict(_LLAMA, model_type="mistral", sliding_window="4096"), "sliding_window",
     "must be a count"),
    (dict(_LLAMA, rope_scaling=[1, 2]), "rope_scaling", "transformers reads an object"),
    (dict(_LLAMA, attention_dropout=float("nan")), "attention_dropout",
     "dropout probability")])
def test_hf_keys_said_only_in_warnings_are_still_checked(tmp_path, cfg, key, says):
    """Keys the cost model only warns of are checked as the others: a window or layer count
    given as a string or negative had been echoed back in a warning as real, a list
    rope_scaling dropped without a word, a NaN dropout read as none."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(SpecError) as e:
        presets.model(str(p))
    assert e.value.field == key and says in e.value.problem, str(e.value)


def test_other_files_of_a_model_repository_say_what_they_are(tmp_path):
    """A tokenizer or generation configuration given as the model, or a multimodal wrapper
    whose language model is under text_config: the one-line refusal says which and what to
    give (it had said only that model_type or num_layers was missing)."""
    p = tmp_path / "config.json"
    for doc, says in (
            ({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>"},
             "a tokenizer's configuration"),
            ({"bos_token_id": 1, "eos_token_id": 2, "transformers_version": "4.46.0"},
             "a generation configuration"),
            ({"model_type": "llava", "text_config": dict(_LLAMA)}, "under text_config"),
            ({"model_type": "llama", "text_config": dict(_LLAMA)}, "under text_config")):
        p.write_text(json.dumps(doc))
        with pytest.raises(SpecError) as e:
            presets.model(str(p))
        assert says in str(e.value), str(e.value)


def test_transformers_v5_rope_parameters_are_read(tmp_path):
    """transformers v5 writes rope_theta, partial_rotary_factor and the scaling in one
    `rope_parameters` object: read as the v4 keys are (its rotary base had been dropped, and
    Megatron-LM's 10000 emitted for Llama 3.1's 500000); one that contradicts a top-level key,
    or settings per layer type, are refused naming the key."""
    from launch.emit import megatron_args
    from model.estimator import make_plan
    from model.specs import JobSpec
    from formats.clusters import uniform_cluster
    v4 = dict(_LLAMA, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    v5 = {k: v for k, v in v4.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = dict(v4["rope_scaling"], rope_theta=500000.0)
    p = tmp_path / "config.json"
    models = []
    for cfg in (v4, v5):
        p.write_text(json.dumps(cfg))
        models.append(presets.model(str(p)))
    a, b = models
    assert a.rope_base == b.rope_base == 500000.0
    assert [x.split(" ", 1)[1] for x in a.unmodelled] == \
        [x.split(" ", 1)[1] for x in b.unmodelled] and len(b.unmodelled) == 1
    assert b.unmodelled[0].startswith("rope_parameters {")
    c = uniform_cluster(1, 8, "H100-SXM-80GB", 360.0, 50.0)
    job = JobSpec(global_batch=8, seq_length=4096)
    args = megatron_args(b, job, make_plan(b, job, c, tp=8, pp=1))[0]
    assert args[args.index("--rotary-base") + 1] == "500000"
    p.write_text(json.dumps(dict(_LLAMA, model_type="gpt_neox", rope_parameters={
        "rope_theta": 10000, "rope_type": "default", "partial_rotary_factor": 0.25})))
    assert presets.model(str(p)).rotary_percent == 0.25
    for cfg, says in ((dict(v5, rope_theta=10000.0), "beside rope_theta"),
                      (dict(v5, rope_parameters={"full_attention": {"rope_theta": 1e6},
                                                 "sliding_attention": {"rope_theta": 1e4}}),
                       "per layer type"),
                      (dict(v5, rope_parameters={"rope_theta": "1e6"}), "must be a number")):
        p.write_text(json.dumps(cfg))
        with pytest.raises(SpecError) as e:
            presets.model(str(p))
        assert e.value.field.startswith("rope_parameters") and says in e.value.problem


def test_a_family_named_only_by_its_architecture_reads_as_it(tmp_path):
    """A model_type of its own whose `architectures` names a supported family's class (Kimi
    K2: kimi_k2, DeepseekV3ForCausalLM) reads as that family, with a warning saying so; a
    multimodal file whose text_config is unsupported too is not sent there."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(dict(_DEEPSEEK, model_type="kimi_k2",
                                 architectures=["DeepseekV3ForCausalLM"])))
    m = presets.model(str(p))
    p.write_text(json.dumps(_DEEPSEEK))
    ref = presets.model(str(p))
    assert m.total_params == ref.total_params
    assert m.unmodelled[0].startswith("model_type 'kimi_k2': read as deepseek_v3")
    for inner, says in (("llama", "give that object"), ("gemma3_text", "not supported either")):
        p.write_text(json.dumps({"model_type": "gemma3", "text_config": {"model_type": inner}}))
        with pytest.raises(SpecError) as e:
            presets.model(str(p))
        assert says in e.value.problem


def test_a_quantized_checkpoints_format_is_said(tmp_path):
    """A config.json's quantization_config (DeepSeek-V3's block-scaled FP8 weights) is the
    checkpoint's stored format, not the training's: a warning says so, where it had been
    ignored without a word."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps(dict(_DEEPSEEK, quantization_config={
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]})))
    assert any(x.startswith('quantization_config (quant_method "fp8"): the checkpoint')
               for x in presets.model(str(p)).unmodelled)
    p.write_text(json.dumps(_DEEPSEEK))
    assert not any("quantization" in x for x in presets.model(str(p)).unmodelled)


def test_phi3_configs_load_as_llamas_block(tmp_path):
    """Phi-3 and Phi-4 (model_type phi3: Llama's block with fused qkv and gate_up projections,
    the same weights) load with their published sizes (Phi-3-mini 3.8B, Phi-4 14.7B), their
    sliding window taken (every layer's), and their own dropout keys read (resid_pdrop,
    embd_pdrop)."""
    mini = {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
            "max_position_embeddings": 4096, "vocab_size": 32064, "rope_theta": 10000.0,
            "sliding_window": 2047, "tie_word_embeddings": False, "resid_pdrop": 0.0,
            "embd_pdrop": 0.0, "attention_dropout": 0.0}
    phi4 = dict(mini, hidden_size=5120, intermediate_size=17920, num_attention_heads=40,
                num_hidden_layers=40, num_key_value_heads=10, vocab_size=100352,
                rope_theta=250000, sliding_window=None, max_position_embeddings=16384)
    p = tmp_path / "config.json"
    for cfg, billions in ((mini, 3.821), (phi4, 14.66)):
        p.write_text(json.dumps(cfg))
        m = presets.model(str(p))
        assert m.total_params / 1e9 == pytest.approx(billions, abs=0.001)
        assert m.gated_mlp and m.norm == "rmsnorm" and not m.bias and not m.dropout
    p.write_text(json.dumps(mini))
    m = presets.model(str(p))
    assert (m.sliding_window, m.window_full_every, m.windowed_layers, m.unmodelled) == (
        2047, 0, 32, ())
    p.write_text(json.dumps(dict(mini, resid_pdrop=0.1)))
    assert presets.model(str(p)).dropout
