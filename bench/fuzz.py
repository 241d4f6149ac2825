"""Fuzz every reader and option of the CLI, in process, and classify what happens.

Families of generated inputs (each case: files written to a scratch folder and a command line):
- hf: mutated Hugging Face config.json (wrong types, missing keys, huge or non-finite values,
  non-objects, bytes that are not UTF-8) given to `estimate -m FILE`;
- cluster: mutated cluster TOML (values, shapes of the matrix, names with escapes, truncation)
  given to `cluster show` and `estimate -c`;
- bandwidth: mutated nccl-tests, mpiGraph, CSV and JSON measurements given to `cluster import`,
  whose written TOML must read back;
- plan: mutated plan files given to `estimate --plan` and `emit`;
- profile: mutated calibration profiles given to `estimate --calibration`;
- options: option values from pools of valid and invalid ones (sizes, batch, sequence, time
  limit, seed, precision, layer lists, synth parameters, names);
- logs, sweep, topology: mutated training logs for `calibrate`, sweep specs for `sweep`
  (tiny: a valid one runs one baseline task), intra-node topology files named by a cluster;
- paths: special paths as inputs (FIFO, folder, missing file, empty file, NUL bytes) and as
  outputs (a folder, a file standing where a folder should be, a later invalid option), with a
  pre-existing target that must survive a failing command.

Each case runs through typer's CliRunner with a per-case time limit (SIGALRM) and is classified:
clean one-line error (exit 2: one line on stderr, and on stdout nothing or, with --json, the
same error as {"error": ..., "exit_code": 2}), typer usage error, success, traceback (signature: exception type
and the innermost frame in this project), hang, non-finite output (NaN/Infinity in --json output
or in a written file), unreadable output (a written cluster TOML that does not load), invalid
value accepted (the generator knows the value is invalid and the command succeeded), multi-line
error, and file lost (a pre-existing target changed by a failing command).

    python bench/fuzz.py --cases 10000 --seed 0 [--per-case-s 30] [--show 3]

Prints the table of outcomes and every distinct traceback signature with an example.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import math
import os
import random
import re
import signal
import sys
import tempfile
import time
import tomllib
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")

from typer.testing import CliRunner  # noqa: E402

import cli  # noqa: E402

FIX = ROOT / "tests" / "fixtures"

WEIRD = [None, True, False, "", "x", "NaN", "1e3", -1, 0, 1, -0.0, 0.5, 1e12, 10**12, 2**63,
         1e-300, float("inf"), float("-inf"), float("nan"), [], {}, [1, 2], {"a": 1},
         "\\x00", "a\nb", "a\\b", "é", "x" * 5000, 3.7, 7, 64, 10**9]


@dataclass
class Case:
    family: str
    argv: list[str]
    files: dict[str, bytes | str] = field(default_factory=dict)
    invalid: bool | None = None  # True: the command must fail; None: unknown
    keep: dict[str, bytes] = field(default_factory=dict)  # targets that must survive a failure
    toml_out: str | None = None  # a written cluster TOML that must read back
    special: dict[str, str] = field(default_factory=dict)  # name -> fifo | dir | nul


# ---------------------------------------------------------------------------------------------
# generic mutation of JSON-like documents


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:6]):
            yield from _paths(v, prefix + (i,))


def mutate(doc, rng: random.Random, n: int = 1):
    doc = json.loads(json.dumps(doc))
    for _ in range(n):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            return copy.deepcopy(rng.choice(WEIRD))
        p = rng.choice(paths)
        parent = doc
        for k in p[:-1]:
            parent = parent[k]
        op = rng.random()
        if op < 0.2 and isinstance(parent, dict):
            del parent[p[-1]]
        elif op < 0.3 and isinstance(parent[p[-1]], list) and parent[p[-1]]:
            parent[p[-1]] = parent[p[-1]][:-1] if rng.random() < 0.5 else parent[p[-1]] * 2
        else:
            parent[p[-1]] = copy.deepcopy(rng.choice(WEIRD))  # never one list in two places
    return doc


def _toml_key(k) -> str:
    k = str(k)
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _toml_val(v) -> str:
    if v is None:
        return '"null"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_val(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_val(x)}" for k, x in v.items()) + "}"
    return json.dumps(str(v))


def to_toml(doc: dict) -> str:
    """A TOML writer for the fuzzer's documents (top-level scalars, tables, arrays of tables)."""
    out, tables = [], []
    for k, v in doc.items():
        if isinstance(v, dict):
            tables.append((k, v, False))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            tables.append((k, v, True))
        else:
            out.append(f"{_toml_key(k)} = {_toml_val(v)}")
    for k, v, many in tables:
        for t in (v if many else [v]):
            out.append(f"\n[[{_toml_key(k)}]]" if many else f"\n[{_toml_key(k)}]")
            out += [f"{_toml_key(a)} = {_toml_val(b)}" for a, b in t.items()]
    return "\n".join(out) + "\n"


def byte_noise(data: bytes, rng: random.Random) -> bytes:
    op = rng.random()
    if op < 0.3:
        return data[: rng.randrange(len(data) + 1)]
    if op < 0.5:
        b = bytearray(data)
        for _ in range(rng.randint(1, 5)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if op < 0.6:
        return b"\xff\xfe" + data
    if op < 0.8:  # replace a number with a weird token
        toks = [b"nan", b"inf", b"-inf", b"-1", b"0", b"1e400", b"", b"abc", b"1e-400",
                b"99999999999999999999"]
        nums = list(re.finditer(rb"\d+(\.\d+)?", data))
        if nums:
            m = rng.choice(nums)
            return data[: m.start()] + rng.choice(toks) + data[m.end():]
        return data
    lines = data.split(b"\n")
    if lines:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i]) if rng.random() < 0.5 else lines.pop(i)
    return b"\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the families

SMALL_HF = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376,
            "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
            "vocab_size": 32000, "max_position_embeddings": 2048, "tie_word_embeddings": False,
            "rope_theta": 10000.0}
HF_POSITIVE = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "vocab_size", "max_position_embeddings"}
BASE_JOB = ["--gbs", "8", "--seq", "512", "--json"]


def _small_cluster_toml(rng) -> str:
    doc = tomllib.loads((ROOT / "data/clusters/example.toml").read_text())
    doc["nodes"] = doc["nodes"][:2]
    doc["inter"]["gb_per_s"] = [row[:2] for row in doc["inter"]["gb_per_s"][:2]]
    return to_toml(doc)


def fam_hf(rng: random.Random) -> Case:
    r = rng.random()
    files = {"cl.toml": _small_cluster_toml(rng)}
    invalid = None
    if r < 0.1:
        data: bytes | str = rng.choice([b"42", b"[1, 2]", b'"x"', b"", b"\xff\xfe{}", b"{",
                                        b"null", json.dumps(SMALL_HF).encode()[:-3]])
        invalid = True
    else:
        doc = mutate(SMALL_HF, rng, rng.randint(1, 3))
        if isinstance(doc, dict):
            for k in HF_POSITIVE:
                if k == "num_key_value_heads" and doc.get(k, 0) is None:
                    continue  # null means as many as the attention heads (transformers)
                if k in doc:
                    v = doc[k]
                    if (isinstance(v, bool) or not isinstance(v, (int, float))
                            or not (v == v) or v <= 0 or v in (float("inf"),)):
                        invalid = True
                elif k != "num_key_value_heads" and k != "max_position_embeddings":
                    invalid = True
        data = json.dumps(doc, allow_nan=True)
    files["config.json"] = data
    tp = rng.choice(["1", "2"])
    return Case("hf", ["estimate", "-m", "{config.json}", "-c", "{cl.toml}", "--tp", tp,
                       "--pp", "1", *BASE_JOB], files, invalid)


def fam_cluster(rng: random.Random) -> Case:
    doc = tomllib.loads(_small_cluster_toml(rng))
    r = rng.random()
    if r < 0.15:
        text: bytes | str = byte_noise(to_toml(doc).encode(), rng)
    else:
        text = to_toml(mutate(doc, rng, rng.randint(1, 3)))
    files = {"cl.toml": text}
    if rng.random() < 0.5:
        argv = ["cluster", "show", "{cl.toml}", "--json"]
    else:
        argv = ["estimate", "-m", "llama2-7b", "-c", "{cl.toml}", "--tp", "8", "--pp", "1",
                "--recompute", "full", *BASE_JOB]
    return Case("cluster", argv, files)


BW_SEEDS = ["all_reduce_4nodes.txt", "mpigraph_3hosts.txt", "matrix.csv", "matrix.json",
            "matrix_missing.csv"]


def fam_bandwidth(rng: random.Random) -> Case:
    seed = rng.choice(BW_SEEDS + ["nccl_pairs"])
    files: dict = {}
    if seed == "nccl_pairs":
        names = sorted(p.name for p in (FIX / "nccl_pairs").iterdir())
        for n in names:
            data = (FIX / "nccl_pairs" / n).read_bytes()
            files[f"pairs/{n}"] = byte_noise(data, rng) if rng.random() < 0.4 else data
        src = "{pairs}"
    else:
        data = (FIX / seed).read_bytes()
        if seed.endswith(".json") and rng.random() < 0.6:
            data = json.dumps(mutate(json.loads(data), rng), allow_nan=True).encode()
        else:
            data = byte_noise(data, rng)
        files[seed] = data
        src = "{" + seed + "}"
    argv = ["cluster", "import", src, "--gpu", rng.choice(["A100-80GB", "H100-SXM-80GB"]),
            "--gpus-per-node", "8", "--intra-gb-per-s", "240", "--out", "{out.toml}"]
    if rng.random() < 0.3:
        argv += ["--fill", "symmetric"]
    if rng.random() < 0.2:
        argv += ["--name", rng.choice(["a\\b", "x\ny", 'q"q', "ok", "é", "[x]"])]
    return Case("bandwidth", argv, files, toml_out="out.toml")


_PLAN_CACHE: dict = {}


def _valid_plan(tmp: Path) -> dict:
    if "plan" not in _PLAN_CACHE:
        p = tmp / "seed-plan.json"
        r = CliRunner().invoke(cli.app, ["estimate", "-m", "llama2-7b", "-c", "example", "--tp",
                                         "8", "--pp", "2", "--gbs", "64", "--seq", "2048",
                                         "--save-plan", str(p), "--json"])
        assert r.exit_code == 0, r.output
        _PLAN_CACHE["plan"] = json.loads(p.read_text())
    return _PLAN_CACHE["plan"]


def fam_plan(rng: random.Random, tmp: Path) -> Case:
    doc = _valid_plan(tmp)
    if rng.random() < 0.1:
        data: bytes | str = byte_noise(json.dumps(doc).encode(), rng)
    else:
        data = json.dumps(mutate(doc, rng, rng.randint(1, 3)), allow_nan=True)
    files = {"plan.json": data}
    if rng.random() < 0.6:
        argv = ["estimate", "--plan", "{plan.json}", "--json"]
    else:
        argv = ["emit", "{plan.json}", "--framework",
                rng.choice(["megatron", "nemo", "torchtitan", "deepspeed"]), "--out", "{out}",
                "--json"]
    return Case("plan", argv, files)


# a profile `calibrate` could write (two fitted parameters, a measured spread), so that the
# mutations reach past the kind and version checks
_PROFILE: dict = {"kind": "pipette-calibration", "schema_version": 1, "gpu": "A100-80GB",
                  "parameters": {"gemm_scale": {"value": 0.9, "stderr": 0.01},
                                 "network_scale": {"value": 0.8, "stderr": 0.05},
                                 "fragmentation": {"value": 0.1, "stderr": None}},
                  "fitted": ["gemm_scale", "network_scale"],
                  "covariance": [[1e-4, 0.0], [0.0, 2.5e-3]],
                  "residual_sd_log": 0.02, "residual_dof": 3, "residual_sd_assumed": False,
                  "fragmentation_spread": {"sd": 0.02, "readings": 3},
                  "prior_sd_log": {"gemm_scale": 0.15, "network_scale": 0.5},
                  "runs": [{"label": "a.log", "measured_s": 10.0, "before_s": 11.0,
                            "after_s": 10.1, "memory_gib": None, "memory_kind": None,
                            "memory_stage": None}]}


def fam_profile(rng: random.Random) -> Case:
    data = json.dumps(mutate(_PROFILE, rng, rng.randint(1, 2)), allow_nan=True)
    return Case("profile", ["estimate", "-m", "llama2-7b", "--tp", "8", "--pp", "1",
                            "--recompute", "full", "--calibration", "{prof.json}", *BASE_JOB],
                {"prof.json": data})


def _pick(rng, good: list, bad: list):
    if rng.random() < 0.5:
        return str(rng.choice(good)), False
    return str(rng.choice(bad)), True


def fam_options(rng: random.Random) -> Case:
    kind = rng.random()
    if kind < 0.6:  # estimate
        opts, invalid = [], False
        for flag, good, bad in [
                ("--gbs", [8, 16, 64], [0, -1, 2**40, "x", "1e3", "nan", 7.5]),
                ("--seq", [512, 1024], [0, "-0", -5, 10**9, "inf", "x"]),
                ("--tp", [1, 2, 8], [0, -2, "two", 10**6]),
                ("--pp", [1, 2], [0, -1, 10**6]),
                ("--mbs", [1, 2], [0, -1, 10**7]),
                ("--precision", ["bf16", "fp16", "fp8"], ["fp4", "", "bf16,fp8", "BF17"]),
                ("--layers", ["16,16", "32"], ["a,b", "-1,33", "0,32", "", "1e9"]),
                ("--cp", [1, 2], [0, -1]),
                ("--ep", [1], [0, -3]),
                ("--zero", [0, 1, 3], [4, -1, "x"]),
                ("--moe-capacity-factor", [1.0], ["nan", "inf", -1, 0]),
                ("--fp8-recipe", ["delayed", "tensorwise"], ["nvfp4", "", "TENSORWISE"]),
                # a dense model: any dispatcher but the default is refused
                ("--moe-dispatcher", ["alltoall"], ["deepep", "hybridep", "nccl", ""])]:
            if rng.random() < 0.35:
                v, bad_v = _pick(rng, good, bad)
                opts += [flag, v]
                invalid |= bad_v
        for flag in ("--fp8-param-gather", "--fused-loss", "--distopt", "--no-distopt",
                     "--ep-comm-overlap"):
            if rng.random() < 0.2:
                opts.append(flag)
        return Case("options", ["estimate", "-m", "llama2-7b", "--recompute", "full", *opts,
                                "--json"], invalid=invalid or None if not invalid else True)
    if kind < 0.8:  # cluster synth
        opts, invalid = [], False
        for flag, good, bad in [
                ("--nodes", [2, 4], [0, -1, 10**7]),
                ("--gpus-per-node", [8, 4], [0, -8, 10**6]),
                ("--nic-gb-per-s", [23.0, 50], ["inf", "nan", -1, 0, "1e400"]),
                ("--intra-gb-per-s", [240.0], ["inf", "nan", 0, -240]),
                ("--seed", [0, 7], [-1, 2**32, 2**64, "x"]),
                ("--name", ["ok", "x y"], []),
                ("--noise", [0.0, 0.03], [-0.1, 2.0, "nan"])]:
            if rng.random() < 0.4:
                if flag == "--name":
                    v, bad_v = rng.choice(["a\\b", "x\ny", 'q"q', "ok", "é", "[x]", ""]), False
                else:
                    v, bad_v = _pick(rng, good, bad)
                opts += [flag, v]
                invalid |= bad_v
        return Case("options", ["cluster", "synth", *opts, "--out", "{syn.toml}"],
                    invalid=True if invalid else None, toml_out="syn.toml")
    # solve: only cheap ones; search-space lists that the cluster or the batch may leave
    # empty (a TP larger than a node, 10^9 sequences): a plan or one clean line, either way
    v, bad = _pick(rng, [0.5, 1], [-1, "nan", "inf", 0, -0.0, "x", 10**12])
    seed, bad2 = _pick(rng, [0, 3], [-1, 2**32, 2**70])
    space = []
    for flag, values in (("--tp", ["1", "2", "1,2", "16", "64"]), ("--mbs", ["1", "1,2", "3"]),
                         ("--pp", ["1", "2", "1,4", "128"])):
        if rng.random() < 0.3:
            space += [flag, rng.choice(values)]
    gbs = rng.choice(["8", "8", "6", "1", str(10**9)])
    return Case("options", ["solve", "-m", "gpt-1.7b", "-c", "{cl.toml}", "--gbs", gbs,
                            "--seq", "256", "--method", "anneal", "--time-limit", v, "--seed",
                            seed, *space, "--json"], {"cl.toml": _small_cluster_toml(rng)},
                invalid=True if (bad or bad2) else None)


def fam_paths(rng: random.Random) -> Case:
    kind = rng.choice(["fifo", "dir", "missing", "empty", "nul"])
    special = {}
    files: dict = {}
    target = "in"
    if kind == "fifo":
        special[target] = "fifo"
    elif kind == "dir":
        special[target] = "dir"
    elif kind == "empty":
        files[target] = b""
    elif kind == "nul":
        files[target] = b"\x00" * 64
    where = rng.choice(["model", "cluster", "plan", "import", "calibration", "show"])
    argv = {"model": ["estimate", "-m", "{in}", "--tp", "1", "--pp", "1", *BASE_JOB],
            "cluster": ["estimate", "-c", "{in}", "--tp", "8", "--pp", "1", *BASE_JOB],
            "plan": ["estimate", "--plan", "{in}", "--json"],
            "import": ["cluster", "import", "{in}", "--gpu", "A100-80GB", "--gpus-per-node",
                       "8", "--intra-gb-per-s", "240", "--format",
                       rng.choice(["auto", "csv", "json", "mpigraph", "nccl"])],
            "calibration": ["estimate", "-m", "llama2-7b", "--tp", "8", "--pp", "1",
                            "--calibration", "{in}", *BASE_JOB],
            "show": ["cluster", "show", "{in}", "--json"]}[where]
    if where == "model" and kind in ("missing",):
        argv[2] = "{in}.json"
    case = Case("paths", argv, files, invalid=True, special=special)
    # outputs: a pre-existing target and an invalid later option, or a bad output path
    if rng.random() < 0.5:
        out_kind = rng.choice(["save-plan-then-bad-emit", "save-plan-dir", "gantt-under-file",
                               "out-is-file", "png-dir", "csv-dir", "emit-bad-gantt"])
        base = ["estimate", "-m", "llama2-7b", "--tp", "8", "--pp", "2", "--recompute", "full",
                "--gbs", "8", "--seq", "512"]
        keep = {"keep.json": b"ORIGINAL"}
        case = Case("paths", base, dict(keep), invalid=True, keep=keep)
        if out_kind == "save-plan-then-bad-emit":
            case.argv += ["--save-plan", "{keep.json}", "--emit", "nosuchfw"]
        elif out_kind == "save-plan-dir":
            case.special["d"] = "dir"
            case.argv += ["--save-plan", "{d}"]
        elif out_kind == "gantt-under-file":
            case.argv += ["--save-plan", "{keep.json}", "--gantt", "{keep.json}/x.png"]
        elif out_kind == "out-is-file":
            case.argv += ["--emit", "megatron", "--out", "{keep.json}"]
        elif out_kind == "png-dir":
            case.special["d"] = "dir"
            case.argv += ["--placement-png", "{d}"]
        elif out_kind == "csv-dir":
            case.special["d"] = "dir"
            case.argv = ["compare", "-m", "gpt-1.7b", "-c", "{cl.toml}", "--gbs", "8", "--seq",
                         "256", "--time-limit", "1", "--csv", "{d}"]
            case.files["cl.toml"] = _small_cluster_toml(rng)
        else:
            case.argv += ["--save-plan", "{keep.json}", "--emit", "megatron", "--out", "{o}",
                          "--gantt", "{keep.json}/g.png"]
    return case


_ARG_VALUES = ["None", "True", "False", "0", "-3", "1", "7", "abc", "1e9", "2147483648",
               "[0, 1]", "[1, 0]", "Ettt|tt", "nan", "", "selective", "full", "RMSNorm"]


# the settings formats/bridge_config.py reads from a Megatron-Bridge run_config.yaml
_BRIDGE_KEYS = [("model", k) for k in (
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "virtual_pipeline_model_parallel_size", "num_layers", "hidden_size", "ffn_hidden_size",
    "num_attention_heads", "num_query_groups", "kv_channels", "seq_length", "vocab_size",
    "make_vocab_size_divisible_by", "should_pad_vocab", "recompute_granularity",
    "recompute_method", "recompute_num_layers", "recompute_modules", "sequence_parallel",
    "normalization", "position_embedding_type", "pipeline_model_parallel_layout",
    "num_layers_in_first_pipeline_stage", "num_moe_experts", "moe_router_topk",
    "expert_model_parallel_size", "attention_backend", "hidden_dropout", "rotary_base",
    "share_embeddings_and_output_weights", "cross_entropy_loss_fusion", "transformer")] + [
    ("train", "global_batch_size"), ("train", "micro_batch_size"),
    ("ddp", "use_distributed_optimizer"), ("ddp", "use_megatron_fsdp"),
    ("ddp", "data_parallel_sharding_strategy"), ("mixed_precision", "bf16"),
    ("mixed_precision", "fp8"), ("mixed_precision", "fp8_recipe"),
    ("dataset", "seq_length"), ("dist", "use_tp_pp_dp_mapping"), (None, "mixed_precision"),
    (None, "comm_overlap"), (None, "model"), (None, "dist")]


# the keys formats/nemo_config.py reads from a NeMo 1.x log's printed configuration
_NEMO_KEYS = [("model", k) for k in (
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "virtual_pipeline_model_parallel_size", "sequence_parallel", "micro_batch_size",
    "global_batch_size", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
    "num_query_groups", "encoder_seq_length", "max_position_embeddings", "normalization",
    "activation", "position_embedding_type", "bias", "share_embeddings_and_output_weights",
    "activations_checkpoint_granularity", "activations_checkpoint_method",
    "activations_checkpoint_num_layers", "num_layers_in_first_pipeline_stage", "mcore_gpt",
    "transformer_engine", "attention_backend", "megatron_amp_O2", "fp8", "fsdp",
    "fsdp_sharding_strategy", "num_moe_experts", "rampup_batch_size", "optim",
    "make_vocab_size_divisible_by")] + [
    ("trainer", "devices"), ("trainer", "num_nodes"), ("trainer", "precision"),
    (None, "model"), (None, "trainer")]


def _mutate_sections(rng: random.Random, doc: dict, keys: list) -> dict:
    """1-4 of `keys` ((section or None for the top, key)) of a parsed configuration replaced
    by odd values or removed."""
    for _ in range(rng.randint(1, 4)):
        sec, key = rng.choice(keys)
        where = doc if sec is None else doc.get(sec)
        if not isinstance(where, dict):
            continue
        if rng.random() < 0.2:
            where.pop(key, None)
        else:
            where[key] = copy.deepcopy(rng.choice(WEIRD + _ARG_VALUES))
    return doc


def _nemo_config_log(rng: random.Random) -> str:
    """The NeMo 1.x fixture log with some keys of its printed configuration replaced or
    removed (re-indented as NeMo's formatter prints it)."""
    import yaml

    from formats.logs import read_log

    path = FIX / "logs" / "nemo1_config_70b.log"
    text = path.read_text()
    printed = read_log(path).nemo_configs[0]
    doc = _mutate_sections(rng, yaml.safe_load(printed), _NEMO_KEYS)
    indent = lambda t: "".join("    " + ln + "\n" for ln in t.splitlines())  # noqa: E731
    return text.replace(indent(printed), indent(yaml.safe_dump(doc, sort_keys=False)), 1)


# the keys formats/torchtitan_config.py reads from a torchtitan job config
_TITAN_KEYS = [("model", k) for k in ("name", "flavor", "converters")] + [
    ("training", k) for k in ("local_batch_size", "global_batch_size", "seq_len",
                              "mixed_precision_param", "compile")] + [
    ("parallelism", k) for k in (
        "tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
        "data_parallel_replicate_degree", "data_parallel_shard_degree",
        "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
        "module_fqns_per_model_part", "pipeline_parallel_split_points",
        "context_parallel_rotate_method", "enable_async_tensor_parallel",
        "expert_parallel_degree")] + [
    ("activation_checkpoint", "mode"), ("activation_checkpoint", "selective_ac_option"),
    ("compile", "enable"), ("compile", "components"), (None, "parallelism"),
    (None, "training"), (None, "model")]


def _titan_printed_log(rng: random.Random) -> str:
    """The torchtitan fixture log with some keys of its printed job config replaced or removed
    (printed again as torchtitan v0.2.2 prints it, under torchrun's rank prefix)."""
    from formats.logs import read_log

    path = FIX / "logs" / "torchtitan_printed_config.log"
    text = path.read_text()
    printed = read_log(path).torchtitan_configs[0][1]
    doc = _mutate_sections(rng, json.loads(printed), _TITAN_KEYS)
    old = "\n".join("[rank0]:" + ln for ln in printed.splitlines()[1:])
    new = "\n".join("[rank0]:" + ln
                    for ln in json.dumps(doc, indent=2, default=str).splitlines()[1:])
    return text.replace(old, new, 1)


def fam_logs(rng: random.Random, tmp: Path) -> Case:
    """A mutated training log (Megatron-LM, torchtitan, NeMo, DeepSpeed) with a valid plan;
    or a Megatron-LM log whose printed arguments have some values replaced, its plan read from
    them on the example cluster (`calibrate --cluster`); or a Megatron-Bridge log with its
    run_config.yaml, settings the reader uses replaced or removed (`--run-config`)."""
    if rng.random() < 0.12:
        import yaml

        doc = _mutate_sections(rng, yaml.safe_load(
            (FIX / "logs" / "bridge_run_config_70b.yaml").read_text()), _BRIDGE_KEYS)
        return Case("logs", ["calibrate", "{run.log}", "--cluster", "example", "--run-config",
                             "{run.yaml}", "--fit", "gemm_scale"],
                    {"run.log": (FIX / "logs" / "megatron_bridge.log").read_text(),
                     "run.yaml": yaml.safe_dump(doc)})
    if rng.random() < 0.1:  # a torchtitan log's printed job config, mutated
        return Case("logs", ["calibrate", "{run.log}", "--cluster", "h100-8x8", "--fit",
                             "gemm_scale"], {"run.log": _titan_printed_log(rng)})
    if rng.random() < 0.1:  # a NeMo 1.x log's printed configuration, mutated
        return Case("logs", ["calibrate", "{run.log}", "--cluster", "example", "--fit",
                             "gemm_scale"], {"run.log": _nemo_config_log(rng)})
    if rng.random() < 0.15:  # a torchtitan run's TOML, mutated, read with its log
        doc = {"model": {"name": "llama3", "flavor": rng.choice(["8B", "70B"])},
               "training": {"local_batch_size": 2, "global_batch_size": 128, "seq_len": 4096},
               "parallelism": {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 2,
                               "pipeline_parallel_schedule": "1F1B",
                               "module_fqns_per_model_part": [
                                   [f"layers.{i}" for i in range(16)],
                                   [f"layers.{i}" for i in range(16, 32)]]},
               "activation_checkpoint": {"mode": "full"}}
        return Case("logs", ["calibrate", "{run.log}", "--cluster", "h100-8x8", "--run-config",
                             "{run.toml}", "--fit", "gemm_scale"],
                    {"run.log": (FIX / "logs" / "torchtitan.log").read_text(),
                     "run.toml": to_toml(mutate(doc, rng, rng.randint(0, 3)))})
    if rng.random() < 0.3:
        text = (FIX / "logs" / rng.choice(["megatron_args_70b.txt",
                                           "megatron_args_mixtral.txt"])).read_text()
        lines = text.splitlines()
        args = [k for k, line in enumerate(lines) if line.startswith("  ") and " .." in line]
        for k in rng.sample(args, rng.randint(1, 4)):
            name = lines[k].split()[0]
            lines[k] = f"  {name} {'.' * max(0, 48 - len(name))} {rng.choice(_ARG_VALUES)}"
        log = "\n".join(lines) + "\n" + (FIX / "logs" / "megatron.log").read_text()
        return Case("logs", ["calibrate", "{run.log}", "--cluster", "example", "--fit",
                             "gemm_scale"], {"run.log": log})
    name = rng.choice(sorted(p.name for p in (FIX / "logs").iterdir()))
    data = (FIX / "logs" / name).read_bytes()
    for _ in range(rng.randint(1, 3)):
        data = byte_noise(data, rng)
    return Case("logs", ["calibrate", "{run.log}", "--plan", "{plan.json}"],
                {"run.log": data, "plan.json": json.dumps(_valid_plan(tmp))})


_SWEEP = {"sweep": {"name": "f", "methods": ["megatron"], "budgets": [1.0], "seeds": [0]},
          "models": [{"name": "gpt-1.7b"}],
          "jobs": [{"global_batch": 8, "seq_length": 256, "precision": "bf16"}],
          "clusters": [{"synth": {"num_nodes": 2, "seed": 0, "gpus_per_node": 2}}]}


def fam_sweep(rng: random.Random) -> Case:
    """A mutated sweep spec (tiny: when it stays valid it runs one Megatron-baseline task)."""
    if rng.random() < 0.1:
        text: bytes | str = byte_noise(to_toml(_SWEEP).encode(), rng)
    else:
        doc = mutate(_SWEEP, rng, rng.randint(1, 2))
        text = to_toml(doc) if isinstance(doc, dict) else _toml_val(doc)
    return Case("sweep", ["sweep", "{spec.toml}", "--results", "{out}/s.sqlite", "--jobs", "1"],
                {"spec.toml": text})


def fam_topology(rng: random.Random) -> Case:
    """A mutated intra-node topology file named by a cluster's node."""
    name = rng.choice(sorted(p.name for p in (ROOT / "data/topologies").iterdir()))
    doc = tomllib.loads((ROOT / "data/topologies" / name).read_text())
    text = (byte_noise(to_toml(doc).encode(), rng) if rng.random() < 0.2
            else to_toml(mutate(doc, rng, rng.randint(1, 2))))
    gpus = doc.get("gpus", 8)
    cl = ('name = "t"\n[[nodes]]\nname = "a"\ngpu = "A100-80GB"\n'
          f'gpus = {gpus}\nintra_topology = "{{topo.toml}}"\n[inter]\ngb_per_s = [[0]]\n')
    return Case("topology", ["cluster", "show", "{cl.toml}", "--json"],
                {"topo.toml": text, "cl.toml": cl})


FAMILIES = {"hf": 0.2, "cluster": 0.16, "bandwidth": 0.14, "plan": 0.12, "profile": 0.05,
            "options": 0.14, "paths": 0.07, "logs": 0.05, "sweep": 0.03, "topology": 0.04}


# ---------------------------------------------------------------------------------------------
# running and classifying


class Hang(Exception):
    pass


def _alarm(_sig, _frm):
    raise Hang()


def materialize(case: Case, d: Path) -> list[str]:
    for name, data in case.files.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):  # a file may name another of the case's files
            data = data.replace("{topo.toml}", str(d / "topo.toml"))
        p.write_bytes(data.encode() if isinstance(data, str) else data)
    for name, kind in case.special.items():
        p = d / name
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "dir":
            p.mkdir(exist_ok=True)
    names = set(case.files) | set(case.special) | {"out.toml", "syn.toml", "out", "o", "in"}
    names |= {n.split("/")[0] for n in case.files}

    def sub(a: str) -> str:
        for n in sorted(names, key=len, reverse=True):
            a = a.replace("{" + n + "}", str(d / n))
        return a
    return [sub(a) for a in case.argv]


def _has_nonfinite(text: str) -> bool:
    bad = []
    try:
        json.loads(text, parse_constant=lambda c: bad.append(c))
    except ValueError:  # a table or text: a non-finite value where a number is printed
        return bool(re.search(r"(?i)(?:[:=|(]\s*(?:nan|-?inf(?:inity)?)(?![a-z]))|"
                              r"(?:(?<![a-z])(?:nan|-?inf(?:inity)?)\s*(?:ms|s|gib|gb/s|%)\b)",
                              text))
    return bool(bad)


def _signature(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in tb if str(ROOT) in f.filename and "/.venv/" not in f.filename
            and "bench/fuzz.py" not in f.filename]
    where = f"{Path(ours[-1].filename).relative_to(ROOT)}:{ours[-1].lineno}" if ours else "?"
    return f"{type(exc).__name__} at {where}"


def _error_stdout(stdout: str, line: str) -> bool:
    """What an error leaves on stdout: nothing, or (a command given --json) the same line as
    the object {"error": ..., "exit_code": 2}."""
    if not stdout.strip():
        return True
    try:
        d = json.loads(stdout)
    except ValueError:
        return False
    return isinstance(d, dict) and (d.get("error"), d.get("exit_code")) == (
        line.removeprefix("error: "), 2)


def run_case(case: Case, d: Path, per_case_s: float) -> tuple[str, str]:
    argv = materialize(case, d)
    runner = CliRunner()
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, per_case_s)
    try:
        res = runner.invoke(cli.app, argv, catch_exceptions=True)
    except Hang:
        return "hang", " ".join(argv)[:200]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    exc = res.exception
    if isinstance(exc, Hang):
        return "hang", " ".join(argv)[:200]
    if exc is not None and not isinstance(exc, SystemExit):
        return "traceback", _signature(exc)
    out = res.output
    for name, data in case.keep.items():
        if res.exit_code != 0 and (d / name).read_bytes() != data:
            return "file lost", " ".join(argv)[:200]
    if res.exit_code == 2:
        lines = [x for x in res.stderr.splitlines() if x.strip()]
        if "Usage:" in out:
            return "usage error", ""
        if len(lines) == 1 and lines[0].startswith("error:") and _error_stdout(
                res.stdout, lines[0]):
            return "clean error", ""
        return "multi-line error", out[:300]
    if res.exit_code != 0:
        return "other exit", f"{res.exit_code}: {out[:200]}"
    if _has_nonfinite(out):
        return "non-finite output", " ".join(argv)[:200]
    if case.toml_out and (d / case.toml_out).exists():
        from formats.clusters import load_cluster
        from model.errors import SpecError
        try:
            load_cluster(d / case.toml_out)
        except SpecError as e:
            return "unreadable output", str(e)[:200]
        except Exception as e:  # noqa: BLE001 - that is the finding
            return "unreadable output", f"{type(e).__name__}: {e}"[:200]
    if case.invalid:
        return "invalid value accepted", " ".join(argv)[:200]
    return "success", ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-case-s", type=float, default=30.0)
    ap.add_argument("--show", type=int, default=3, help="examples printed per finding")
    ap.add_argument("--family", default=None, choices=sorted(FAMILIES),
                    help="only this family")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    tmp = Path(tempfile.mkdtemp(prefix="fuzz-"))
    fams = [a.family] if a.family else list(FAMILIES)
    weights = [FAMILIES[f] for f in fams]
    counts: collections.Counter = collections.Counter()
    by_family: dict = collections.defaultdict(collections.Counter)
    findings: dict = collections.defaultdict(list)
    t0 = time.time()
    for k in range(a.cases):
        fam = rng.choices(fams, weights)[0]
        gen = globals()[f"fam_{fam}"]
        case = gen(rng, tmp) if fam in ("plan", "logs") else gen(rng)
        d = tmp / f"c{k}"
        d.mkdir()
        cwd = os.getcwd()
        os.chdir(d)  # default output folders land in the case's folder
        try:
            outcome, detail = run_case(case, d, a.per_case_s)
        finally:
            os.chdir(cwd)
        counts[outcome] += 1
        by_family[fam][outcome] += 1
        if outcome not in ("clean error", "usage error", "success"):
            key = (outcome, detail if outcome == "traceback" else fam)
            findings[key].append(" ".join(case.argv)[:160] if outcome == "traceback" else detail)
        if (k + 1) % 500 == 0:
            print(f"  {k + 1} cases, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"{a.cases} cases, seed {a.seed}, {time.time() - t0:.0f} s\n")
    print("| outcome | cases |\n|---|---|")
    order = ["clean error", "usage error", "success", "traceback", "hang", "non-finite output",
             "unreadable output", "invalid value accepted", "multi-line error", "file lost",
             "other exit"]
    for o in order:
        print(f"| {o} | {counts.get(o, 0)} |")
    print("\nby family:")
    for fam, c in sorted(by_family.items()):
        print(f"  {fam:10s} " + ", ".join(f"{o} {n}" for o, n in c.most_common()))
    if findings:
        print("\nfindings:")
        for (outcome, key), ex in sorted(findings.items(), key=lambda kv: -len(kv[1])):
            print(f"- {outcome} [{key}] x{len(ex)}")
            for e in ex[: a.show]:
                print(f"    {e!r}")
    bad = sum(counts[o] for o in order[3:])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
