import json

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
