"""Presets as data: GPUs (data/gpus.json), models (data/models.json); a model may also be a
Hugging Face config.json (formats/hf_config.py).

Files are read on demand, never at import time.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path

from model.errors import SpecError
from model.specs import GPUSpec, ModelSpec

from .hf_config import load_hf_config, unmodelled


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
    return GPUSpec(name=key, **{k: (dict(v) if k == "peak_tflops" else v)
                                for k, v in d.items()})


def _is_file(p: Path) -> bool:
    """Whether `p` names an existing file (False for a name no path lookup takes)."""
    try:
        return p.is_file()
    except OSError:
        return False


def model(name_or_path: str) -> ModelSpec:
    """A model preset by name, or a Hugging Face `config.json` (or a folder holding one)."""
    p = Path(name_or_path)
    folder = False
    try:
        if p.is_dir():
            folder, p = True, p / "config.json"
        found = p.suffix == ".json" and p.exists()
    except OSError:  # not a path this system can look up (a name too long, say): a name
        found = False
    if found:
        return load_hf_config(p)
    if folder and _canon(name_or_path, model_names()) is not None:
        p = Path(name_or_path)  # a preset's name wins over a folder without a config.json
    elif folder:
        raise SpecError(f"{p.parent} is a folder without a config.json; give a Hugging Face "
                        "config.json (or its folder) or a preset name", field="model")
    if p.suffix == ".json":
        raise SpecError(f"file not found: {p}", field="model")
    key = _canon(name_or_path, model_names())
    if key is None:
        if _is_file(p):  # a file that is not JSON had been called an unknown model name
            raise SpecError(f"{p} is not a .json file; give a Hugging Face config.json or a "
                            "preset name", field="model")
        raise _unknown("model", name_or_path, model_names(), "model")
    d = dict(_load("models.json")[key])
    # the preset's Hugging Face settings the cost model does not cover (hf_config.unmodelled)
    hf = d.pop("hf_unmodelled", {})
    return ModelSpec(name=key, unmodelled=unmodelled(hf, d.get("num_experts", 0) > 1), **d)
