"""Hugging Face `config.json` files (llama, mistral, qwen2, qwen3, gpt2, gpt_neox;
mixture-of-experts mixtral, qwen2_moe / qwen3_moe, and deepseek_v2 / deepseek_v3 with latent
attention and leading dense layers) as model specs."""

from __future__ import annotations

import json
import re
from pathlib import Path

from model.cluster import check_name
from model.errors import SpecError
from model.specs import ModelSpec
from .reading import read_text

# Field names per Hugging Face architecture family. Each entry: our field -> candidate keys.
_HF_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_heads": ("num_attention_heads", "n_head"),
    "num_kv_heads": ("num_key_value_heads",),
    "ffn_hidden_size": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab_size": ("vocab_size",),
    "seq_length": ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
}
_GATED = {"llama": True, "mistral": True, "qwen2": True, "qwen3": True, "mixtral": True,
          "gpt2": False, "gpt_neox": False, "qwen2_moe": True, "qwen3_moe": True,
          "deepseek_v2": True, "deepseek_v3": True, "phi3": True}
# mixture-of-experts keys (transformers' MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig):
# routed experts, experts per token, one expert's FFN width (Mixtral's is intermediate_size)
_MOE_KEYS = {"mixtral": ("num_local_experts", "num_experts_per_tok", None),
             "qwen2_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
             "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
             "deepseek_v2": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"),
             "deepseek_v3": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")}
_UNSUPPORTED: dict[str, str] = {}
# transformers' model class of each family: a checkpoint with a model_type of its own whose
# `architectures` names one of these runs that family's code (Kimi K2: model_type kimi_k2,
# DeepseekV3ForCausalLM), and is read as it, with a warning saying so
_CLASSES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
            "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
            "MixtralForCausalLM": "mixtral", "GPT2LMHeadModel": "gpt2",
            "GPTNeoXForCausalLM": "gpt_neox", "Qwen2MoeForCausalLM": "qwen2_moe",
            "Qwen3MoeForCausalLM": "qwen3_moe", "DeepseekV2ForCausalLM": "deepseek_v2",
            "DeepseekV3ForCausalLM": "deepseek_v3", "Phi3ForCausalLM": "phi3"}
# Architecture per family (the transformers modeling file of each): position embedding, norm,
# linear-layer biases (all four; Qwen2's QKV-only biases are _QKV_BIAS).
_ARCH = {"llama": ("rope", "rmsnorm", False), "mistral": ("rope", "rmsnorm", False),
         "qwen2": ("rope", "rmsnorm", False), "qwen3": ("rope", "rmsnorm", False),
         "mixtral": ("rope", "rmsnorm", False),
         "gpt2": ("learned", "layernorm", True), "gpt_neox": ("rope", "layernorm", True),
         "qwen2_moe": ("rope", "rmsnorm", False), "qwen3_moe": ("rope", "rmsnorm", False),
         "deepseek_v2": ("rope", "rmsnorm", False), "deepseek_v3": ("rope", "rmsnorm", False),
         # Phi-3 and Phi-4 (transformers' Phi3DecoderLayer): Llama's block with the query, key
         # and value projections fused in one qkv_proj and gate and up in one gate_up_proj,
         # the same weights and FLOPs
         "phi3": ("rope", "rmsnorm", False)}
# families with biases on the query, key and value projections only (transformers'
# Qwen2Attention and Qwen2MoeAttention: q_proj, k_proj, v_proj with bias=True, o_proj without)
_QKV_BIAS = ("qwen2", "qwen2_moe")


def _typed(cfg: dict, key: str, kind, src: str, default=None, field: str | None = None):
    """cfg[key] if it has the JSON type `kind` (int, float: any number, bool, str), `default`
    where it is absent or null; otherwise one line naming the key (`field`: its path, where
    cfg is a nested object; a string "5632" or "false" is refused, never read as a number or
    as true)."""
    v = cfg.get(key)
    if v is None:
        return default
    if kind is int:
        ok, name = isinstance(v, int) and not isinstance(v, bool), "an integer"
    elif kind is float:
        ok, name = isinstance(v, (int, float)) and not isinstance(v, bool), "a number"
    elif kind is bool:
        ok, name = isinstance(v, bool), "true or false"
    else:
        ok, name = isinstance(v, str), "a string"
    if not ok:
        raise SpecError(f"must be {name} (or null), got {str(json.dumps(v))[:40]}", source=src,
                        field=field or key)
    return v


def _dropout(cfg: dict, mtype: str, src: str) -> bool:
    """Whether training uses dropout: GPT-2's resid/attn/embd_pdrop default to 0.1, the other
    families' attention_dropout / hidden_dropout to 0 (transformers' configuration classes)."""
    if mtype == "gpt2":
        keys, default = ("resid_pdrop", "attn_pdrop", "embd_pdrop"), 0.1
    elif mtype == "phi3":  # Phi3Config: resid_pdrop, embd_pdrop, attention_dropout, all 0
        keys, default = ("resid_pdrop", "embd_pdrop", "attention_dropout"), 0.0
    else:
        keys, default = ("attention_dropout", "hidden_dropout"), 0.0
    rates = {k: _typed(cfg, k, float, src, default) for k in keys}
    for k, v in rates.items():
        if not 0.0 <= v <= 1.0:  # NaN fails too (it had been read as no dropout)
            raise SpecError(f"must be a dropout probability from 0 to 1, got {v}", source=src,
                            field=k)
    return any(v > 0 for v in rates.values())


def load_hf_config(path: Path) -> ModelSpec:
    """Read a Hugging Face `config.json` (the families of the module docstring)."""
    src = str(path)
    text = read_text(path, what="the config.json")
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"not valid JSON ({e.msg} at line {e.lineno})", source=src) from None
    except RecursionError:
        raise SpecError("nested too deeply to be a config.json", source=src) from None
    if not isinstance(cfg, dict):
        raise SpecError(f"the top level is {type(cfg).__name__}, not an object; give a "
                        "Hugging Face config.json", source=src)
    mtype = cfg.get("model_type")
    if not isinstance(mtype, str):
        # a model repository's other JSON files have no model_type: say which one it is
        other = ("a tokenizer's configuration" if "tokenizer_class" in cfg or
                 "added_tokens_decoder" in cfg else
                 "a generation configuration" if "transformers_version" in cfg and (
                     "max_new_tokens" in cfg or "do_sample" in cfg or
                     set(cfg) <= {"bos_token_id", "eos_token_id", "pad_token_id",
                                  "transformers_version", "_from_model_config"}) else None)
        raise SpecError(f"must be a string naming the architecture, got {str(mtype)[:40]}"
                        + (f": this looks like {other}; give the model's config.json" if other
                           else ""), source=src, field="model_type")
    if mtype in _UNSUPPORTED:
        raise SpecError(f"model_type {mtype!r}: {_UNSUPPORTED[mtype]}", source=src,
                        field="model_type")
    read_as = ()
    arch = cfg.get("architectures")
    if mtype not in _GATED and isinstance(arch, list) and len(arch) == 1 and \
            arch[0] in _CLASSES:
        read_as = (f"model_type {mtype!r}: read as {_CLASSES[arch[0]]}, the family of its "
                   f"architectures entry {arch[0]}",)
        mtype = _CLASSES[arch[0]]
    if mtype not in _GATED:
        text = cfg.get("text_config")
        inner = text.get("model_type") if isinstance(text, dict) else None
        hint = (f"; its language model is described under text_config (model_type "
                f"{inner!r}): give that object as a config.json of its own"
                if isinstance(text, dict) and inner in _GATED else
                f"; its language model under text_config (model_type {inner!r}) is not "
                "supported either" if isinstance(text, dict) else "")
        raise SpecError(f"unsupported model_type {mtype!r}; supported: {', '.join(_GATED)}"
                        + hint, source=src, field="model_type")
    vals: dict = {}
    key_of = _file_keys(cfg, mtype)  # our field -> the file's key, for the messages
    for ours, keys in _HF_KEYS.items():
        for k in keys:
            if cfg.get(k) is not None:
                vals[ours] = cfg[k]
                key_of[ours] = k
                break
    if "num_kv_heads" not in vals and "num_heads" in vals:
        vals["num_kv_heads"] = vals["num_heads"]  # no GQA key: multi-head attention
    if "ffn_hidden_size" not in vals and "hidden_size" in vals and mtype == "gpt2":
        vals["ffn_hidden_size"] = 4 * vals["hidden_size"]  # GPT-2: n_inner null means 4*n_embd
    for ours, keys in _HF_KEYS.items():
        if ours not in vals:
            nested = (" (this file keeps its language model under text_config: give that "
                      "object as a config.json of its own)"
                      if isinstance(cfg.get("text_config"), dict) else "")
            raise SpecError(f"missing; expected one of {', '.join(keys)}{nested}", source=src,
                            field=keys[0])
    tied = _typed(cfg, "tie_word_embeddings", bool, src, mtype == "gpt2")
    # the checkpoint's name, else the file's (a config.json: its folder's, as a checkpoint's)
    p = Path(path)
    name = (_typed(cfg, "_name_or_path", str, src)
            or (p.parent.name if p.name == "config.json" else p.stem) or mtype)
    check_name(name, "the model name", src, "_name_or_path")
    pos, norm, bias = _ARCH[mtype]
    vals.update(_moe_fields(cfg, mtype, src))
    # an explicit head width (Qwen3: head_dim 128 on hidden 2048 with 32 heads)
    hd = _typed(cfg, "head_dim", int, src)
    if hd is not None and hd <= 0:
        raise SpecError(f"must be a positive integer, got {hd}", source=src, field="head_dim")
    if hd is not None and isinstance(vals["num_heads"], int) and \
            hd * vals["num_heads"] != vals["hidden_size"] and "kv_channels" not in vals:
        vals["kv_channels"] = hd
        key_of["kv_channels"] = "head_dim"
    if pos == "rope":  # rotary base and rotated fraction (GPT-NeoX: rotary_emb_base, rotary_pct)
        rp = rope_parameters(cfg, src)
        for ours, keys in (("rope_base", ("rope_theta", "rotary_emb_base")),
                           ("rotary_percent", ("partial_rotary_factor", "rotary_pct"))):
            k = next((k for k in keys if cfg.get(k) is not None), None)
            if k is not None:
                vals[ours] = _typed(cfg, k, float, src)
                key_of[ours] = k
            if rp.get(keys[0]) is not None:
                v = _typed(rp, keys[0], float, src, field=f"rope_parameters.{keys[0]}")
                if k is not None and v != vals[ours]:
                    raise SpecError(f"{v:g} beside {k} {vals[ours]:g}: make them agree",
                                    source=src, field=f"rope_parameters.{keys[0]}")
                vals[ours] = v
                key_of[ours] = f"rope_parameters.{keys[0]}"
    # the norms' epsilon (transformers: rms_norm_eps; GPT-NeoX layer_norm_eps; GPT-2
    # layer_norm_epsilon)
    k = next((k for k in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")
              if cfg.get(k) is not None), None)
    if k is not None:
        vals["norm_eps"] = _typed(cfg, k, float, src)
        key_of["norm_eps"] = k
    window = _window_fields(cfg, mtype, vals["num_layers"], src)
    vals.update(window)
    extra = unmodelled(cfg, mtype in _MOE_KEYS, src)
    if window:  # priced and emitted: not a setting left out
        extra = tuple(x for x in extra if not x.startswith("sliding_window "))
    # Qwen3's attention normalizes q and k per head (transformers' Qwen3Attention and
    # Qwen3MoeAttention q_norm, k_norm); the other families here do not
    try:
        return ModelSpec(name=str(name), gated_mlp=_GATED[mtype], tied_embeddings=tied,
                         position_embedding=pos, norm=norm, bias=bias,
                         qkv_bias=mtype in _QKV_BIAS,
                         qk_norm=mtype in ("qwen3", "qwen3_moe"),
                         dropout=_dropout(cfg, mtype, src), source=src,
                         unmodelled=read_as + extra + _ignored(cfg, mtype, bias),
                         **vals)
    except SpecError as e:
        # the file's own keys, not our fields ('first_dense_layers' for first_k_dense_replace)
        problem = e.problem
        for ours, theirs in sorted(key_of.items(), key=lambda x: -len(x[0])):
            problem = re.sub(rf"\b{ours}\b", theirs, problem)
        raise SpecError(problem, source=src, field=key_of.get(e.field, e.field)) from None


# families whose every layer slides when the config gives a window (transformers' Mistral,
# Mixtral and Phi-3 attention pass config.sliding_window to every layer); Qwen's slide only
# with use_sliding_window, from layer max_window_layers on (Qwen2Config layer_types)
_WINDOW_ALL = ("mistral", "mixtral", "phi3")
_WINDOW_QWEN = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")


def _qwen_window_start(cfg: dict) -> int:
    """The first layer a Qwen config slides its window in: max_window_layers, transformers'
    default 28 where the file does not say (Qwen2Config, Qwen3Config, Qwen2MoeConfig,
    Qwen3MoeConfig: max_window_layers=28)."""
    first = cfg.get("max_window_layers", 28)
    return first if isinstance(first, int) and not isinstance(first, bool) else 28


def _window_fields(cfg: dict, mtype: str, num_layers, src: str) -> dict:
    """ModelSpec's sliding_window and window_full_every from the config: transformers v5's
    `layer_types` ("sliding_attention" / "full_attention" per layer) where the file has it,
    else the family's rule (_WINDOW_ALL, _WINDOW_QWEN). A pattern other than every layer
    sliding or a full layer every N (Qwen's lower layers full) is left to `unmodelled`'s
    warning: priced and emitted as full attention, and said."""
    w = cfg.get("sliding_window")
    if not isinstance(w, int) or isinstance(w, bool) or w <= 0 or not isinstance(
            num_layers, int):
        return {}  # (a window that is not a count is refused by `unmodelled`)
    if mtype in _WINDOW_QWEN and cfg.get("use_sliding_window") is not True:
        return {}
    types = cfg.get("layer_types")
    if types is not None:
        if not (isinstance(types, list) and len(types) == num_layers and all(
                t in ("sliding_attention", "full_attention") for t in types)):
            raise SpecError(f"must list 'sliding_attention' or 'full_attention' for each of "
                            f"the {num_layers} layers (other attention kinds are not "
                            "modelled)", source=src, field="layer_types")
        slides = [t == "sliding_attention" for t in types]
    elif mtype in _WINDOW_QWEN:
        first = _qwen_window_start(cfg)
        slides = [i >= first for i in range(num_layers)]
    elif mtype in _WINDOW_ALL:
        slides = [True] * num_layers
    else:
        return {}
    if not any(slides):
        return {}
    if all(slides):
        return {"sliding_window": w}
    n = slides.index(False) + 1  # the first full layer, counted from 1
    if n > 1 and slides == [(i + 1) % n != 0 for i in range(num_layers)]:
        return {"sliding_window": w, "window_full_every": n}
    return {}


def _file_keys(cfg: dict, mtype: str) -> dict:
    """Our ModelSpec field -> the config.json key it is read from, beyond _HF_KEYS (found as
    they are read): the experts' (_MOE_KEYS), DeepSeek's (_deepseek_fields), the name's."""
    out = {"name": "_name_or_path", "tied_embeddings": "tie_word_embeddings"}
    if mtype in _MOE_KEYS:
        ek, kk, fk = _MOE_KEYS[mtype]
        out.update(num_experts=ek, moe_topk=kk, moe_shared_experts=(
            "n_shared_experts" if mtype.startswith("deepseek")
            else "shared_expert_intermediate_size"))
        if fk:
            out["moe_ffn_hidden_size"] = fk
    if mtype.startswith("deepseek"):
        out.update(first_dense_layers="first_k_dense_replace", kv_channels="qk_nope_head_dim",
                   mla_kv_lora_rank="kv_lora_rank", mla_q_lora_rank="q_lora_rank",
                   mla_qk_rope_dim="qk_rope_head_dim", mla_v_head_dim="v_head_dim")
    return out


# keys a family's transformers configuration ignores, or that change layers priced otherwise:
# said, not dropped. LlamaConfig/MistralConfig build a dense model (LlamaMLP) whatever expert
# keys the file carries; MixtralConfig sizes its experts by intermediate_size (no
# moe_intermediate_size); LlamaConfig's attention_bias / mlp_bias put biases on the attention
# or MLP projections (modeling_llama.py), which a bias-free family is priced without
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
                "moe_intermediate_size")


def _ignored(cfg: dict, mtype: str, bias: bool) -> tuple[str, ...]:
    out = []
    if mtype not in _MOE_KEYS:
        for k in _EXPERT_KEYS:
            if cfg.get(k) is not None and cfg[k] != 0:
                out.append(f"{k} {json.dumps(cfg[k])}: model_type {mtype} builds a dense model "
                           "(transformers ignores expert keys there); priced and emitted as "
                           "dense: use the mixture-of-experts model_type (mixtral, qwen2_moe, "
                           "...) for experts")
    if mtype == "mixtral" and cfg.get("moe_intermediate_size") is not None:
        out.append(f"moe_intermediate_size {json.dumps(cfg['moe_intermediate_size'])}: "
                   "Mixtral's experts are intermediate_size wide (MixtralConfig has no such "
                   f"key); priced with intermediate_size {cfg.get('intermediate_size')}")
    if not bias:
        for k in ("attention_bias", "mlp_bias"):
            if cfg.get(k) is True:
                what = {"attention_bias": "attention", "mlp_bias": "MLP"}[k]
                out.append(f"{k} true: biases on the {what} projections; priced and emitted "
                           "as bias-free")
    # the activation the family is priced and emitted with (SwiGLU: SiLU; GPT-2 / NeoX: GeLU)
    act_key = "activation_function" if mtype == "gpt2" else "hidden_act"
    act = cfg.get(act_key)
    if act is not None and act not in _ACTIVATIONS[_GATED[mtype]]:
        out.append(f"{act_key} {json.dumps(act)}: priced and emitted with "
                   + ("SiLU (SwiGLU, Megatron-LM --swiglu)" if _GATED[mtype] else "GeLU"))
    # GPTNeoXConfig's default is the parallel block (attention and MLP from one input)
    if mtype == "gpt_neox" and cfg.get("use_parallel_residual", True) is not False:
        out.append("use_parallel_residual true: attention and MLP side by side from one input "
                   "(GPT-NeoX, Pythia); priced as the sequential block (the same FLOPs and "
                   "bytes) and emitted as one: Megatron-LM builds the sequential residual")
    if mtype in _MOE_KEYS and cfg.get("norm_topk_prob") is False:
        out.append("norm_topk_prob false: the routed experts' weights are the full softmax's, "
                   "not renormalized over the top-k; the emitted arguments build renormalized "
                   "ones (Megatron-LM's default; --moe-router-pre-softmax builds these)")
    if mtype == "qwen2_moe" and cfg.get("shared_expert_intermediate_size"):
        out.append("shared expert gate: Qwen2-MoE scales its shared expert by a sigmoid gate (h "
                   "weights a layer, transformers' shared_expert_gate): not priced, and not in "
                   "the emitted arguments (Megatron-LM --moe-shared-expert-gate)")
    return tuple(out)


# activations each kind of family is priced and emitted with (transformers' ACT2FN names): a
# gated MLP as SwiGLU (SiLU), a plain one as GeLU (its tanh and fast forms alike)
_ACTIVATIONS = {True: ("silu", "swish"),
                False: ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh")}


# Settings that change the model or its training but neither the cost model nor the emitters
# cover: key -> (value that is the default / changes nothing, what differs). transformers'
# configuration classes (MistralConfig, Qwen2Config: sliding_window with use_sliding_window;
# DeepseekV3Config: num_nextn_predict_layers, scoring_func, topk_method, n_group, topk_group,
# routed_scaling_factor, norm_topk_prob; MixtralConfig/Qwen*MoeConfig: router_aux_loss_coef)
_UNMODELLED = {
    "sliding_window": (None, "attention over a sliding window; priced and emitted as full "
                       "causal attention"),
    "num_nextn_predict_layers": (0, "multi-token prediction modules: not priced, and not in "
                                 "the emitted arguments (Megatron-LM --mtp-num-layers)"),
    "scoring_func": ("softmax", "the router's score function: not in the emitted arguments "
                     "(Megatron-LM --moe-router-score-function)"),
    "topk_method": ("greedy", "the router's top-k method: not in the emitted arguments "
                    "(Megatron-LM --moe-router-enable-expert-bias for noaux_tc)"),
    "n_group": (1, "grouped routing: not in the emitted arguments (Megatron-LM "
                "--moe-router-num-groups)"),
    "topk_group": (1, "grouped routing: not in the emitted arguments (Megatron-LM "
                   "--moe-router-group-topk)"),
    "routed_scaling_factor": (1.0, "the routed experts' scale: not in the emitted arguments "
                              "(Megatron-LM --moe-router-topk-scaling-factor)"),
    "router_aux_loss_coef": (0.0, "the load-balancing loss: not in the emitted arguments "
                             "(Megatron-LM --moe-aux-loss-coeff, default 0)"),
    "aux_loss_alpha": (0.0, "the load-balancing loss: not in the emitted arguments "
                       "(Megatron-LM --moe-aux-loss-coeff, default 0)"),
}


# the keys of _UNMODELLED that are counts (layers, experts' groups) or a window in tokens
_UNMODELLED_COUNTS = ("sliding_window", "num_nextn_predict_layers", "n_group", "topk_group")


def rope_parameters(cfg: dict, src: str = "config.json") -> dict:
    """transformers v5's `rope_parameters` (rope_theta, rope_type, partial_rotary_factor and
    the scaling's own keys in one object, where v4 wrote rope_theta, partial_rotary_factor
    and rope_scaling at the top level), or {} where the file has none. One object per layer
    type (sliding and full attention with their own rotary settings) is refused: the cost
    model and the emitted arguments have one rotary setting."""
    rp = cfg.get("rope_parameters")
    if rp is None:
        return {}
    if not isinstance(rp, dict):
        raise SpecError(f"is {json.dumps(rp)[:40]}; transformers writes an object such as "
                        "{\"rope_theta\": 500000.0, \"rope_type\": \"default\"}",
                        source=src, field="rope_parameters")
    if rp and all(isinstance(v, dict) for v in rp.values()):
        raise SpecError(f"gives rotary settings per layer type ({', '.join(sorted(rp))}), "
                        "which are not modelled: one rotary setting for every layer is",
                        source=src, field="rope_parameters")
    return rp


def unmodelled(cfg: dict, moe: bool, src: str = "config.json") -> tuple[str, ...]:
    """The config's settings of _UNMODELLED that are not their no-op value, as
    'key value: what differs' lines (a sliding window only where the config uses it; router
    settings only for a mixture of experts), and a rotary scaling (transformers'
    `rope_scaling`: Llama 3.1's "llama3", YaRN, linear, dynamic), which changes no FLOPs or
    bytes and is not emitted."""
    out = []
    rs, label = cfg.get("rope_scaling"), "rope_scaling"
    if rs is None and rope_parameters(cfg, src):
        rs, label = rope_parameters(cfg, src), "rope_parameters"  # v5: beside rope_theta
        rs = {k: v for k, v in rs.items() if k not in ("rope_theta", "partial_rotary_factor")}
    if rs is not None and not isinstance(rs, dict):  # transformers' form is an object
        raise SpecError(f"is {'the string ' if isinstance(rs, str) else ''}"
                        f"{json.dumps(rs)[:40]}; transformers reads an object such as "
                        "{\"rope_type\": \"linear\", \"factor\": 2.0}, or null: write it so",
                        source=src, field="rope_scaling")
    kind = (rs.get("rope_type") or rs.get("type")) if isinstance(rs, dict) else None
    if kind not in (None, "default"):
        out.append(f"{label} {json.dumps(rs, sort_keys=True)}: rotary position scaling "
                   f"({kind}): priced as plain RoPE (the same FLOPs and bytes); the emitted "
                   "arguments do not set it: check that the framework's rotary scaling "
                   "matches")
    q = cfg.get("quantization_config")
    if isinstance(q, dict) and q:
        # the checkpoint's stored format (DeepSeek-V3's block-scaled FP8 weights), not the
        # training's: said, as the job's --precision and --fp8-recipe price it
        out.append(f"quantization_config (quant_method {json.dumps(q.get('quant_method'))}): "
                   "the "
                   "checkpoint's weights are stored quantized; training is priced in the job's "
                   "precision (--precision, --fp8-recipe), not in this format")
    for key, (noop, what) in _UNMODELLED.items():
        v = cfg.get(key)
        if key in _UNMODELLED_COUNTS and v is not None:
            # a count or window said only in a warning is still a count: "4096" or -1 had been
            # echoed back as a real window
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                raise SpecError(f"must be a count, 0 or more (or null), got "
                                f"{json.dumps(v)[:40]}", source=src, field=key)
        if v is None or v == noop or isinstance(v, (dict, list)):
            continue
        if key == "sliding_window" and (v == 0 or cfg.get("use_sliding_window") is False or (
                "use_sliding_window" in cfg or "max_window_layers" in cfg) and isinstance(
                cfg.get("num_hidden_layers"), int) and
                _qwen_window_start(cfg) >= cfg["num_hidden_layers"]):
            # Qwen2 carries a window it does not use, or slides only in the layers from
            # max_window_layers on (transformers' Qwen2Config layer_types)
            continue
        if key == "sliding_window" and isinstance(cfg.get("layer_types"), list) and \
                "sliding_attention" not in cfg["layer_types"]:
            continue  # v5's per-layer kinds: no layer slides
        if key in ("scoring_func", "topk_method", "n_group", "topk_group",
                   "routed_scaling_factor", "router_aux_loss_coef",
                   "aux_loss_alpha") and not moe:
            continue
        out.append(f"{key} {json.dumps(v)}: {what}")
    return tuple(out)


def _moe_fields(cfg: dict, mtype: str, src: str) -> dict:
    """num_experts, moe_topk, moe_ffn_hidden_size, moe_shared_experts of a MoE config; {} for
    dense ones. Every layer must be a MoE layer (the cost model has one layer type)."""
    if mtype not in _MOE_KEYS:
        return {}
    ek, kk, fk = _MOE_KEYS[mtype]
    for key in (ek, kk) + ((fk,) if fk else ()):
        if not isinstance(cfg.get(key), int):
            raise SpecError(f"missing or not an integer; a {mtype} config has it", source=src,
                            field=key)
    if mtype.startswith("deepseek"):
        return _deepseek_fields(cfg, src)
    if cfg.get("decoder_sparse_step", 1) != 1 or cfg.get("mlp_only_layers"):
        key = "decoder_sparse_step" if cfg.get("decoder_sparse_step", 1) != 1 else \
            "mlp_only_layers"
        raise SpecError(f"some layers are dense ({key} {json.dumps(cfg[key])[:40]}); the cost "
                        "model needs every layer to be a MoE layer", source=src, field=key)
    out = {"num_experts": cfg[ek], "moe_topk": cfg[kk]}
    if fk:
        out["moe_ffn_hidden_size"] = cfg[fk]
    shared = _typed(cfg, "shared_expert_intermediate_size", int, src, 0)
    if shared:
        fe = cfg[fk]
        if shared % fe:
            raise SpecError(f"shared_expert_intermediate_size {shared} is not a multiple of "
                            f"moe_intermediate_size {fe}; shared experts are counted in "
                            "experts' widths", source=src,
                            field="shared_expert_intermediate_size")
        out["moe_shared_experts"] = shared // fe
    return out


def _deepseek_fields(cfg: dict, src: str) -> dict:
    """DeepSeek-V2 / V3 (transformers' DeepseekV3Config): routed and shared experts of
    moe_intermediate_size, first_k_dense_replace leading dense layers of intermediate_size,
    multi-head latent attention (kv_lora_rank, q_lora_rank or null, qk_nope_head_dim,
    qk_rope_head_dim, v_head_dim). Every layer after the dense ones must be a MoE layer."""
    keys = ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
            "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    for key in keys:
        if not isinstance(cfg.get(key), int) or isinstance(cfg.get(key), bool):
            raise SpecError("missing or not an integer; a DeepSeek-V2/V3 config has it",
                            source=src, field=key)
    if cfg.get("moe_layer_freq", 1) != 1:
        raise SpecError("MoE layers every moe_layer_freq > 1 layers are not modelled (only "
                        "leading dense layers, first_k_dense_replace)", source=src,
                        field="moe_layer_freq")
    q_lora = _typed(cfg, "q_lora_rank", int, src, 0)
    return {"num_experts": cfg["n_routed_experts"], "moe_topk": cfg["num_experts_per_tok"],
            "moe_ffn_hidden_size": cfg["moe_intermediate_size"],
            "moe_shared_experts": _typed(cfg, "n_shared_experts", int, src, 0),
            "first_dense_layers": _typed(cfg, "first_k_dense_replace", int, src, 0),
            "kv_channels": cfg["qk_nope_head_dim"], "mla_kv_lora_rank": cfg["kv_lora_rank"],
            "mla_q_lora_rank": q_lora, "mla_qk_rope_dim": cfg["qk_rope_head_dim"],
            "mla_v_head_dim": cfg["v_head_dim"]}
