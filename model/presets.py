"""Presets as data: GPUs (data/gpus.json), models (data/models.json), Hugging Face configs.

Files are read on demand, never at import time.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .errors import SpecError
from .specs import GPUSpec, ModelSpec


def data_path(*parts: str) -> Path:
    """Path of a file shipped in the `data` package."""
    return Path(str(resources.files("data").joinpath(*parts)))


@lru_cache(maxsize=None)
def _load(name: str) -> dict:
    with open(data_path(name)) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def gpu_names() -> list[str]:
    return list(_load("gpus.json"))


def model_names() -> list[str]:
    return list(_load("models.json"))


def _unknown(kind: str, name: str, known: list[str], field: str) -> SpecError:
    return SpecError(f"unknown {kind} '{name}'; known: {', '.join(known)}", field=field)


def _canon(name: str, known: list[str]) -> str | None:
    low = {k.lower(): k for k in known}
    return low.get(name.lower())


@lru_cache(maxsize=None)
def gpu(name: str) -> GPUSpec:
    """A GPU preset by name (case-insensitive)."""
    key = _canon(name, gpu_names())
    if key is None:
        raise _unknown("GPU type", name, gpu_names(), "gpu")
    d = _load("gpus.json")[key]
    return GPUSpec(name=key, peak_tflops=dict(d["peak_tflops"]), memory_gib=d["memory_gib"],
                   hbm_gb_per_s=d["hbm_gb_per_s"], nvlink_gb_per_s=d["nvlink_gb_per_s"],
                   efficiency=d["efficiency"], source=d["source"])


def model(name_or_path: str) -> ModelSpec:
    """A model preset by name, or a Hugging Face `config.json` (or a folder holding one)."""
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" and p.exists():
        return load_hf_config(p)
    if p.suffix == ".json":
        raise SpecError(f"file not found: {p}", field="model")
    key = _canon(name_or_path, model_names())
    if key is None:
        raise _unknown("model", name_or_path, model_names(), "model")
    d = dict(_load("models.json")[key])
    return ModelSpec(name=key, **d)


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
_GATED = {"llama": True, "mistral": True, "qwen2": True, "mixtral": True, "gpt2": False,
          "gpt_neox": False}


def load_hf_config(path: Path) -> ModelSpec:
    """Read a Hugging Face `config.json` (llama, mistral, qwen2, gpt2, gpt_neox)."""
    src = str(path)
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError(f"cannot read JSON ({e})", source=src) from None
    mtype = cfg.get("model_type")
    if mtype not in _GATED:
        raise SpecError(f"unsupported model_type {mtype!r}; supported: {', '.join(_GATED)}",
                        source=src, field="model_type")
    vals: dict = {}
    for ours, keys in _HF_KEYS.items():
        for k in keys:
            if cfg.get(k) is not None:
                vals[ours] = cfg[k]
                break
    if "num_kv_heads" not in vals and "num_heads" in vals:
        vals["num_kv_heads"] = vals["num_heads"]  # no GQA key: multi-head attention
    if "ffn_hidden_size" not in vals and "hidden_size" in vals and mtype == "gpt2":
        vals["ffn_hidden_size"] = 4 * vals["hidden_size"]  # GPT-2: n_inner null means 4*n_embd
    for ours, keys in _HF_KEYS.items():
        if ours not in vals:
            raise SpecError(f"missing; expected one of {', '.join(keys)}", source=src, field=ours)
    tied = cfg.get("tie_word_embeddings", mtype == "gpt2")
    name = cfg.get("_name_or_path") or Path(path).parent.name or mtype
    return ModelSpec(name=str(name), gated_mlp=_GATED[mtype], tied_embeddings=bool(tied),
                     source=src, **vals)
