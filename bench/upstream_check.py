"""Feed emitted launch sets to the frameworks' own code and print what they accept and build.

For each plan of a fixed set (Llama-2 70B and 7B, Mixtral, DeepSeek-V2-Lite, Llama-3 8B with
context parallelism and the fused loss, BLOOM, a Mistral-7B-like sliding window with and
without full layers; even, uneven and interleaved splits; TP=1
DP=64; Megatron-FSDP; FP8; a placement that needs --use-tp-pp-dp-mapping; a 16-node
synthetic cluster placed by the annealer) the Megatron-LM launch set is written and run as a
user would: `launch.sh` is executed once per node (NODE_NAME set) with `torchrun` replaced
by bench/upstream/fake_torchrun, which records the environment and the arguments the script
hands over. Those go to
bench/upstream/run_megatron.py, which runs in a Python that has torch, inside a Megatron-LM
checkout, and calls Megatron's parse_args, validate_args, tokenizer padding,
core_transformer_config_from_args and RankGenerator. This script then compares what Megatron
built with the plan:

- accepted or the error;
- every difference between the model / parallel layout / schedule / split / micro-batches /
  recompute / optimizer / precision Megatron built and the plan, and whether warnings.txt
  announced it (a difference nobody was warned about is a failure);
- every rank on the planned node and GPU under Megatron's own groups (tp, pp, dp, cp, ep).

The same plans go to Megatron-Bridge, NeMo's current API (the emitted bridge_recipe.py, run
by launch.sh with KEY=VALUE overrides, imported, the overrides applied and
runtime_config_update run as its pretrain() does, the vocabulary sized as its setup does:
bench/upstream/run_bridge.py; what it built is compared field by field as Megatron-LM's), to
NeMo 1.x (Hydra composes NeMo's megatron_gpt_config.yaml with the
emitted YAML and the arguments launch.sh hands over, as NeMo's hydra_runner does:
bench/upstream/run_nemo.py; the composed configuration, which NeMo's script prints at start-up,
is read back by `calibrate`'s reader as the plan), and a set of torchtitan plans to torchtitan
v0.2.x and v0.1.0
(their ConfigManager, then the model from their registry built on the meta device:
bench/upstream/run_torchtitan.py; the job config each run prints at start-up is read back by
`calibrate`'s reader as the plan).

Setup (nothing here is a dependency of the project; any subset of the checkouts will do):
    python3 -m venv /tmp/upstream && /tmp/upstream/bin/pip install torch==2.13.0 numpy \
        pyyaml packaging triton hydra-core tyro tokenizers torchdata tensorboard datasets \
        tiktoken blobfile && DS_BUILD_OPS=0 /tmp/upstream/bin/pip install deepspeed
    /tmp/upstream/bin/pip install nvidia-modelopt diffusers megatron-energon omegaconf \
        "transformers==5.12.1" "tokenizers<0.23" einops peft mistral-common qwen-vl-utils \
        timm datasets accelerate pillow  # Bridge (067f987 pins transformers >=5.8,<=5.12.1)
    git clone https://github.com/NVIDIA/Megatron-LM /tmp/megatron-lm   # main; d98e8a6 checked
    git clone https://github.com/NVIDIA-NeMo/Megatron-Bridge /tmp/bridge  # 067f987 checked
    git clone https://github.com/NVIDIA/NeMo /tmp/nemo                  # 8cfedd7 checked
    git clone -b v0.2.2 https://github.com/pytorch/torchtitan /tmp/torchtitan-v0.2.2
    git clone -b v0.1.0 https://github.com/pytorch/torchtitan /tmp/torchtitan-v0.1.0
    python bench/upstream_check.py --python /tmp/upstream/bin/python --megatron /tmp/megatron-lm \
        --bridge /tmp/bridge --nemo /tmp/nemo --torchtitan-0.2 /tmp/torchtitan-v0.2.2 \
        --torchtitan-0.1 /tmp/torchtitan-v0.1.0 --deepspeed

Prints one row per plan and the totals; exits 1 when any plan is rejected, any difference is
unwarned or any rank is misplaced.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from formats import presets  # noqa: E402
from formats.clusters import SynthParams, cluster, synth_cluster, uniform_cluster  # noqa: E402
from formats.clusters import hostfile_order  # noqa: E402
from formats.logs import megatron_arg_blocks  # noqa: E402
from formats.megatron_args import megatron_args_mismatch, megatron_planned_args  # noqa: E402
from launch.emit import emit  # noqa: E402
from model.estimator import estimate, make_plan  # noqa: E402
from model.memory import fp8_params_apply  # noqa: E402
from model.plan import block_placement, ep_groups, model_refusal  # noqa: E402
from model.specs import JobSpec, ModelSpec  # noqa: E402

HERE = Path(__file__).resolve().parent / "upstream"


def _cases():
    """(name, model, job, cluster, plan) for the plans checked."""
    ex = cluster("example")
    l70, l7 = presets.model("llama2-70b"), presets.model("llama2-7b")
    job = JobSpec(global_batch=256, seq_length=4096)
    out = [
        ("70B 1F1B even, selective", l70, job, ex,
         make_plan(l70, job, ex, tp=8, pp=4, recompute="selective", sequence_parallel=True,
                   distributed_optimizer=True, layers=(20,) * 4)),
        ("70B interleaved v=2, balanced split", l70, job, ex,
         make_plan(l70, job, ex, tp=8, pp=4, schedule="interleaved", chunks=2,
                   sequence_parallel=True, distributed_optimizer=True)),
        ("70B interleaved v=2, first/last", l70, job, ex,
         make_plan(l70, job, ex, tp=8, pp=4, schedule="interleaved", chunks=2,
                   sequence_parallel=True, distributed_optimizer=True,
                   layers=(9, 11, 11, 9, 9, 11, 11, 9))),
        ("70B 1F1B uneven middle", l70, job, ex,
         make_plan(l70, job, ex, tp=8, pp=4, sequence_parallel=True,
                   distributed_optimizer=True, layers=(19, 21, 20, 20))),
        # 10 micro-batches over PP 4: Megatron-LM runs interleaving in groups of 5
        ("70B interleaved v=2, micro-batch groups of 5", l70,
         JobSpec(global_batch=20, seq_length=4096), ex,
         make_plan(l70, JobSpec(global_batch=20, seq_length=4096), ex, tp=8, pp=4,
                   schedule="interleaved", chunks=2, mb_group=5, sequence_parallel=True,
                   distributed_optimizer=True, recompute="full")),
        ("70B GPipe", l70, job, ex,
         make_plan(l70, job, ex, tp=8, pp=4, schedule="gpipe", recompute="full",
                   sequence_parallel=True, distributed_optimizer=True)),
        ("70B Megatron-FSDP (ZeRO-3)", l70, job, ex,
         make_plan(l70, job, ex, tp=8, pp=1, recompute="full", sequence_parallel=True,
                   zero=3)),
        ("7B TP=1 DP=64", l7, job, ex,
         make_plan(l7, job, ex, tp=1, pp=1, recompute="full", distributed_optimizer=True,
                   overlap_grad_reduce=True, overlap_param_gather=True)),
    ]
    # two stages of one replica per node: needs the tp-pp-dp rank order
    pl = block_placement(ex, 4, 4, 4, 2)
    out.append(("70B stages paired per node (tp-pp-dp)", l70, job, ex,
                make_plan(l70, job, ex, tp=4, pp=4, dp=4, recompute="full",
                          sequence_parallel=True, distributed_optimizer=True, placement=pl)))
    # a 16-node synthetic cluster, placed by the annealer
    from solvers.search import SearchSpace, solve
    syn = synth_cluster(SynthParams(num_nodes=16, seed=3, degraded=2))
    res = solve(l70, job, syn, method="anneal", time_limit_s=8.0, seed=1,
                space=SearchSpace(schedules=(("interleaved", 2), ("1f1b", 1))))
    out.append(("70B 16-node synthetic, annealed", l70, job, syn, res.plan))
    h100 = uniform_cluster(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    l3 = presets.model("llama3-8b")
    jcp = JobSpec(global_batch=32, seq_length=32768, fused_loss=True)
    out.append(("Llama-3 8B CP=4 32k, fused loss", l3, jcp, h100,
                make_plan(l3, jcp, h100, tp=2, pp=1, cp=4, sequence_parallel=True,
                          distributed_optimizer=True)))
    jf8 = JobSpec(global_batch=256, seq_length=4096, fp8=True, fp8_param_gather=True)
    out.append(("70B FP8 weights, TP overlap, H100", l70, jf8, h100,
                make_plan(l70, jf8, h100, tp=8, pp=4, recompute="selective",
                          sequence_parallel=True, distributed_optimizer=True,
                          tp_comm_overlap=True, overlap_grad_reduce=True)))
    jcs = JobSpec(global_batch=64, seq_length=8192, fp8=True, fp8_recipe="tensorwise",
                  fp8_param_gather=True, grad_reduce_in_bf16=True)
    out.append(("Llama-3 8B FP8 current scaling", l3, jcs, h100,
                make_plan(l3, jcs, h100, tp=2, pp=2, sequence_parallel=True,
                          distributed_optimizer=True, overlap_grad_reduce=True,
                          overlap_param_gather=True)))
    b200 = uniform_cluster(2, 8, "B200", 900.0, 50.0)
    jmx = JobSpec(global_batch=64, seq_length=8192, fp8=True, fp8_recipe="mxfp8",
                  fp8_param_gather=True)
    out.append(("Llama-3 8B MXFP8 weights, B200", l3, jmx, b200,
                make_plan(l3, jmx, b200, tp=2, pp=2, sequence_parallel=True,
                          distributed_optimizer=True, overlap_grad_reduce=True,
                          overlap_param_gather=True)))
    jbw = JobSpec(global_batch=64, seq_length=8192, fp8=True, fp8_recipe="blockwise")
    out.append(("Llama-3 8B FP8 blockwise, H100", l3, jbw, h100,
                make_plan(l3, jbw, h100, tp=2, pp=2, sequence_parallel=True,
                          distributed_optimizer=True)))
    mx = presets.model("mixtral-8x7b")
    out.append(("Mixtral 8x7B EP=8 interleaved", mx, job, ex,
                make_plan(mx, job, ex, tp=2, pp=4, ep=8, etp=1, schedule="interleaved",
                          chunks=2, sequence_parallel=True, distributed_optimizer=True)))
    qw3 = presets.model("qwen3-30b-a3b")
    jdeep = JobSpec(global_batch=64, seq_length=4096, moe_dispatcher="deepep")
    out.append(("Qwen3-30B EP=16 DeepEP, all-to-all overlap, H100", qw3, jdeep, h100,
                make_plan(qw3, jdeep, h100, tp=1, pp=1, ep=16, distributed_optimizer=True,
                          ep_comm_overlap=True)))
    jhyb = JobSpec(global_batch=64, seq_length=4096, moe_dispatcher="hybridep")
    out.append(("Qwen3-30B EP=8 HybridEP, TP 2 SP, PP 2, H100", qw3, jhyb, h100,
                make_plan(qw3, jhyb, h100, tp=2, pp=2, ep=8, etp=1, sequence_parallel=True,
                          distributed_optimizer=True)))
    q15 = presets.model("qwen1.5-moe-a2.7b")  # QKV biases only (add_qkv_bias)
    jq = JobSpec(global_batch=64, seq_length=4096)
    out.append(("Qwen1.5-MoE QKV biases, EP=4", q15, jq, h100,
                make_plan(q15, jq, h100, tp=2, pp=1, ep=4, etp=1, sequence_parallel=True,
                          distributed_optimizer=True)))
    ds = presets.model("deepseek-v2-lite")
    out.append(("DeepSeek-V2-Lite MLA EP=8", ds, job, ex,
                make_plan(ds, job, ex, tp=1, pp=2, ep=8, recompute="selective",
                          distributed_optimizer=True)))
    # a Mistral-7B-like sliding window (4096 keys, its own included) on an 8k sequence: every
    # layer slides, or layers 4, 8, ... attend fully (--window-size 4095,0
    # --window-attn-skip-freq 4; window_size / window_attn_skip_freq in Bridge's provider)
    jw = JobSpec(global_batch=64, seq_length=8192)
    for every in (4, 0):
        mw = ModelSpec(name=f"mistral-7b-swa{every}", num_layers=32, hidden_size=4096,
                       num_heads=32, num_kv_heads=8, ffn_hidden_size=14336, vocab_size=32000,
                       seq_length=32768, gated_mlp=True, position_embedding="rope",
                       norm="rmsnorm", bias=False, dropout=False, rope_base=10000.0,
                       norm_eps=1e-5, sliding_window=4096, window_full_every=every)
        out.append((f"Mistral 7B window 4096, full every {every or 'none'}", mw, jw, h100,
                    make_plan(mw, jw, h100, tp=2, pp=2, sequence_parallel=True,
                              distributed_optimizer=True)))
    bl = presets.model("bloom-176b")
    jb = JobSpec(global_batch=512, seq_length=2048)
    out.append(("BLOOM 176B (ALiBi)", bl, jb, ex,
                make_plan(bl, jb, ex, tp=8, pp=8, recompute="full", sequence_parallel=True,
                          distributed_optimizer=True)))
    return out


def run_launch(folder: Path, cluster, env_extra: dict | None = None,
               extra: list[str] = ()) -> dict[str, dict]:
    """Run launch.sh once per node with the fake torchrun (and `extra` as the user's own
    arguments); node name -> record."""
    shim = Path(tempfile.mkdtemp())
    (shim / "torchrun").symlink_to(HERE / "fake_torchrun")
    recs = {}
    for nd in cluster.nodes:
        rec_path = shim / f"{nd.name}.json"
        env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "NODE_NAME": nd.name,
               "UPSTREAM_RECORD": str(rec_path), **(env_extra or {})}
        env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        subprocess.run(["bash", str(folder / "launch.sh"), *extra], env=env, check=True)
        recs[nd.name] = json.loads(rec_path.read_text())
    return recs


# what Megatron built vs the plan: (field, planned value, warning kind that may excuse it)
def expected(model, job, plan) -> list[tuple[str, object, str]]:
    sh = plan.shape
    rec = {"none": (None, None, None), "selective": ("selective", None, None),
           "full": ("full", "uniform", 1)}[sh.recompute]
    return [
        ("num_layers", model.num_layers, "model"), ("hidden_size", model.hidden_size, "model"),
        ("ffn_hidden_size", model.ffn_hidden_size, "model"),
        ("num_attention_heads", model.num_heads, "model"),
        ("num_query_groups", model.num_kv_heads, "model"),
        ("normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm", "model"),
        ("gated_linear_unit", model.gated_mlp, "model"),
        ("add_bias_linear", model.bias, "model"),
        ("add_qkv_bias", model.bias or model.qkv_bias, "model"),
        ("position_embedding_type", {"rope": "rope", "learned": "learned_absolute"}.get(
            model.position_embedding, model.position_embedding), "model"),
        ("rotary_base", int(model.rope_base) if model.rope_base else 10000, "model"),
        ("layernorm_epsilon", model.norm_eps or 1e-5, "model"),
        ("untie_embeddings", not model.tied_embeddings, "model"),
        ("padded_vocab_size", model.vocab_size, "model"),
        ("hidden_dropout", 0.1 if model.dropout else 0.0, "model"),
        ("seq_length", job.seq_length, "model"),
        ("multi_latent_attention", model.is_mla, "model"),
        ("num_moe_experts", model.num_experts or None, "model"),
        ("tp", sh.tp, "parallelism"), ("pp", sh.pp, "parallelism"),
        ("cp", sh.cp, "parallelism"), ("dp", sh.dp, "parallelism"),
        ("ep", sh.ep, "parallelism"),
        ("vp", sh.chunks, "schedule"),
        ("schedule", sh.schedule if sh.pp > 1 else "none", "schedule"),
        ("layers", list(sh.layers), "split"),
        ("micro_batch", sh.micro_batch, "parallelism"),
        ("global_batch", job.global_batch, "parallelism"),
        ("sequence_parallel", sh.sequence_parallel, "parallelism"),
        ("recompute_granularity", rec[0], "recompute"),
        ("recompute_method", rec[1], "recompute"),
        ("recompute_num_layers", rec[2], "recompute"),
        ("distributed_optimizer", sh.zero >= 1, "parallelism"),
        ("megatron_fsdp", sh.zero >= 2, "parallelism"),
        # its double buffers, which the memory prices (model/memory.py megatron_fsdp_units)
        ("fsdp_double_buffer", sh.zero >= 2, "memory"),
        ("overlap_grad_reduce", sh.overlap_grad_reduce, "overlap"),
        ("overlap_param_gather", sh.overlap_param_gather, "overlap"),
        ("tp_comm_overlap", sh.tp_comm_overlap, "overlap"),
        ("bf16", job.precision == "bf16", "precision"),
        # the FP8 format emitted: E4M3 everywhere for MXFP8, E4M3 / E5M2 (hybrid) otherwise
        ("fp8", ("e4m3" if job.fp8_recipe == "mxfp8" else "hybrid") if sh.fp8 else None,
         "precision"),
        ("fp8_param_gather", fp8_params_apply(job, sh), "precision"),
        # the gradients' dtype the memory and the reduction are priced in (JobSpec.grad_bytes)
        ("main_grads_dtype", "float32" if job.grad_bytes == 4 else
         {"bf16": "bfloat16", "fp16": "float16"}[job.precision], "precision"),
        *([("fp8_recipe", job.fp8_recipe, "precision"),
           ("first_last_layers_bf16", False, "precision")] if sh.fp8 else []),
        # the loss whose peak the memory model counts (model/memory.py LOSS_BYTES_PER_LOGIT)
        ("cross_entropy_loss_fusion", job.fused_loss, "memory"),
        # the sliding window (ModelSpec.sliding_window: W keys, the query's own included;
        # layers N, 2N, ... full for window_full_every N), as the fields set, as the layers
        # that slide, and as a sliding layer's mask on the run's sequence: [keys the last
        # query attends, keys after their query]
        ("window_size", [model.sliding_window - 1, 0] if model.sliding_window else None,
         "model"),
        ("window_attn_skip_freq", model.window_full_every or None, "model"),
        ("windowed_layers", [g for g in range(1, model.num_layers + 1)
                             if model.sliding_window and not (
                                 model.window_full_every and g % model.window_full_every == 0)],
         "model"),
        ("window_keys", [min(model.sliding_window, job.seq_length), 0]
         if model.sliding_window else None, "model"),
    ]


def compare(model, job, plan, got: dict) -> list[tuple]:
    """Differences between what Megatron built and the plan: (field, planned, built, kind)."""
    diffs = []
    for f, want, kind in expected(model, job, plan):
        have = got.get(f)
        if f == "gated_linear_unit" and not model.gated_mlp:
            have = bool(have)
        if have != want:
            diffs.append((f, want, have, kind))
    return diffs


def _table_header(framework: str) -> None:
    print(f"{'plan':40s} {'fits':>4s} {framework:>10s} {'warned diff':>11s} "
          f"{'unwarned':>8s} {'ranks ok':>10s}")


def rejected(name: str, fits: bool, error: str) -> None:
    """Print the row of a plan the framework refused, with its error."""
    print(f"{name:40s} {'yes' if fits else 'NO':>4s} {'REJECTED':>10s}  {error}")


def report(name: str, fits: bool, framework: str, diffs: list[tuple], warns: list[str],
           ranks: str = "") -> int:
    """Print one accepted plan's row and its differences (field, planned, built, kind), each
    marked warned when a warning of its kind was emitted; 1 if any is unwarned."""
    kinds = {w.split("[", 1)[1].split("]", 1)[0] for w in warns if "[" in w}
    warned = [d for d in diffs if d[3] in kinds]
    unwarned = [d for d in diffs if d[3] not in kinds]
    print(f"{name:40s} {'yes' if fits else 'NO':>4s} {'accepted':>10s} {len(warned):>11d} "
          f"{len(unwarned):>8d} {ranks:>10s}")
    for d in warned + unwarned:
        tag = "warned" if d in warned else "UNWARNED"
        print(f"    {tag} [{d[3]}] {d[0]}: planned {d[1]}, {framework} builds {d[2]}")
    return int(bool(unwarned))


def check_ranks(cluster, plan, recs: dict, groups: dict) -> tuple[int, int]:
    """Ranks whose Megatron groups put them on the planned node and GPU: (good, total)."""
    sh, pl = plan.shape, plan.placement
    G = cluster.gpus_per_node
    name_to_idx = {nd.name: i for i, nd in enumerate(cluster.nodes)}
    where = {}
    for name, r in recs.items():
        k = int(r["launcher"]["node_rank"])
        vis = [int(x) for x in r["env"]["CUDA_VISIBLE_DEVICES"].split(",")]
        for local in range(G):
            where[k * G + local] = (name_to_idx[name], vis[local])
    coord = {}
    for g in groups["tp"]:
        for i, q in enumerate(g):
            coord.setdefault(q, {})["t"] = i
    for key, dim in (("pp", "s"), ("dp", "r"), ("cp", "c")):
        for g in groups[key]:
            for i, q in enumerate(g):
                coord[q][dim] = i
    good = 0
    for q, c in coord.items():
        col = c["r"] * sh.cp + c["c"]
        if where[q] == (pl.node[c["s"]][col], pl.gpus[c["s"]][col][c["t"]]):
            good += 1
    # expert-parallel groups: the same GPU sets as the plan's, stage by stage
    if sh.ep > 1:
        planned = {frozenset((pl.node[s][col], pl.gpus[s][col][t]) for col, t in grp)
                   for s in range(sh.pp) for grp in ep_groups(sh)}
        built = {frozenset(where[q] for q in g) for g in groups["ep"]}
        if planned != built:
            good -= len(built - planned)
    return good, len(coord)


def _titan_cases():
    """(name, model, job, cluster, plan) for torchtitan: the Llama-3 and Qwen3 flavors it has,
    FSDP2 and HSDP, interleaved and uneven splits, CP, Float8, a mixture of experts, and a
    Llama-2 plan (no torchtitan flavor: a warned model change)."""
    h100 = uniform_cluster(4, 8, "H100-SXM-80GB", 360.0, 50.0)
    l3, l70 = presets.model("llama3-8b"), presets.model("llama3-70b")
    job = JobSpec(global_batch=128, seq_length=8192, framework="torchtitan")
    out = [
        ("Llama-3 8B FSDP2 (ZeRO-3) DP=32", l3, job, h100,
         make_plan(l3, job, h100, tp=1, pp=1, zero=3, recompute="selective")),
        ("Llama-3 8B HSDP 8x4, TP=1", l3, job, h100,
         make_plan(l3, job, h100, tp=1, pp=1, zero=3, shard_size=8, recompute="full")),
        ("Llama-3 70B TP=8 PP=4 interleaved, FSDP", l70, job, h100,
         make_plan(l70, job, h100, tp=8, pp=4, schedule="interleaved", chunks=2, zero=3,
                   sequence_parallel=True, recompute="full")),
        ("Llama-3 70B TP=8 PP=4 uneven 1F1B", l70, job, h100,
         make_plan(l70, job, h100, tp=8, pp=4, zero=3, sequence_parallel=True,
                   recompute="full", layers=(19, 21, 21, 19))),
        ("Llama-3 8B TP=2 PP=2, nodes shuffled", l3, job, h100,
         make_plan(l3, job, h100, tp=2, pp=2, zero=3, sequence_parallel=True,
                   recompute="full", placement=block_placement(h100, 2, 2, 8, 1,
                                                               node_order=[2, 0, 3, 1]))),
    ]
    jcp = JobSpec(global_batch=32, seq_length=32768, framework="torchtitan")
    out.append(("Llama-3 8B CP=4 TP=2 seq 32k", l3, jcp, h100,
                make_plan(l3, jcp, h100, tp=2, pp=1, cp=4, zero=3, sequence_parallel=True)))
    out.append(("Llama-3 8B CP=8 TP=1, K/V alltoall", l3, jcp, h100,
                make_plan(l3, jcp, h100, tp=1, pp=1, cp=8, cp_alltoall=True, zero=3)))
    jf8 = JobSpec(global_batch=128, seq_length=8192, fp8=True, framework="torchtitan")
    out.append(("Llama-3 70B Float8, async TP", l70, jf8, h100,
                make_plan(l70, jf8, h100, tp=8, pp=1, zero=3, sequence_parallel=True,
                          recompute="full", tp_comm_overlap=True)))
    qw = presets.model("qwen3-30b-a3b")
    out.append(("Qwen3-30B-A3B MoE, FSDP2", qw, job, h100,
                make_plan(qw, job, h100, tp=1, pp=1, zero=3, recompute="full")))
    l2 = presets.model("llama2-7b")
    out.append(("Llama-2 7B (no torchtitan flavor)", l2, job, h100,
                make_plan(l2, job, h100, tp=1, pp=1, zero=3, recompute="full")))
    return out


def titan_expected(model, job, plan, version) -> list[tuple[str, object, str]]:
    from launch.emit import torchtitan_flavor
    sh = plan.shape
    match = torchtitan_flavor(model, version)
    rows = [
        ("flavor", match[1] if match else None, "model"),
        ("n_layers", model.num_layers, "model"), ("dim", model.hidden_size, "model"),
        ("n_heads", model.num_heads, "model"), ("n_kv_heads", model.num_kv_heads, "model"),
        ("ffn", model.ffn_hidden_size if not model.is_moe else None, "model"),
        ("params", model.total_params, "model"),
        ("tp", sh.tp, "parallelism"), ("pp", sh.pp, "parallelism"), ("cp", sh.cp, "parallelism"),
        ("dp", sh.dp, "parallelism"), ("fsdp", sh.zero >= 3 and sh.dp > 1, "parallelism"),
        ("hsdp_replicas", sh.dp // sh.shard_size if sh.zero >= 3 and sh.shard_size else 1,
         "parallelism"),
        ("schedule", {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}[
            sh.schedule] if sh.pp > 1 else None, "schedule"),
        ("layers", list(sh.layers) if sh.pp > 1 else None, "split"),
        ("tokens_per_step", job.global_batch * job.seq_length, "parallelism"),
        ("micro_batch", sh.micro_batch, "parallelism"),
        ("ac_mode", sh.recompute, "recompute"),
        ("float8", sh.fp8, "precision"),
        ("float8_tp", sh.fp8 and sh.tp > 1 and job.fp8_tp_gathers, "precision"),
        ("async_tp", sh.tp_comm_overlap, "overlap"),
        ("cp_rotate", ("alltoall" if sh.cp_alltoall else "allgather") if sh.cp > 1 else None,
         "parallelism"),
    ]
    return rows


def titan_built(v: dict) -> dict:
    m = v.get("model") or {}
    rep, shard = v["dp_replicate"], v["dp_shard"]
    return {"flavor": v["flavor"] if m else None, **{k: m.get(k) for k in (
        "n_layers", "dim", "n_heads", "n_kv_heads", "params")},
        "ffn": m.get("ffn") if not m.get("experts") else None,
        "tp": v["tp"], "pp": v["pp"], "cp": v["cp"], "dp": rep * shard,
        "fsdp": shard > 1, "hsdp_replicas": rep if shard > 1 else 1,
        "schedule": v["schedule"] if v["pp"] > 1 else None,
        "layers": v["layers"] if v["pp"] > 1 else None,
        "tokens_per_step": v["global_batch"] * v["seq_len"],
        "micro_batch": v["microbatch"] if v["pp"] > 1 else v["local_batch"],
        # float8 linears: the release's registered converter name (formats/torchtitan_config
        # FLOAT8_CONVERTER); Float8 TP: what llama3/infra/parallelize.py itself tests
        # ('float8' in the converters, a tensorwise recipe), with TP > 1
        "ac_mode": v["ac_mode"],
        "float8": any(c in ("float8", "quantize.linear.float8") for c in v["converters"]),
        "float8_tp": v["tp"] > 1 and "float8" in v["converters"] and v.get("float8_recipe") in (
            None, "tensorwise"),
        "async_tp": v["async_tp"],
        "cp_rotate": v["cp_rotate"] if v["cp"] > 1 else None}


def check_torchtitan(python: str, version: str, root: str, work: Path) -> int:
    """Emit every torchtitan case for `version`, parse with that release's ConfigManager,
    build the model; print the table; return the number of failures."""
    cases = _titan_cases()
    items, meta = [], []
    for k, (name, m, job, c, plan) in enumerate(cases):
        est = estimate(m, job, c, plan)
        folder = work / f"titan{version}-{k}"
        _f, warns = emit("torchtitan", m, job, c, plan, folder, est=est, force=not est.fits,
                         version=version)
        items.append({"path": str(folder / "torchtitan.toml"), "vocab": m.vocab_size})
        meta.append((name, m, job, c, plan, warns, est.fits, folder))
    (work / f"titan{version}.json").write_text(json.dumps(items))
    out = work / f"titan{version}-views.json"
    run = subprocess.run([python, str(HERE / "run_torchtitan.py"),
                          str(work / f"titan{version}.json"), str(out)],
                         cwd=root, env={**os.environ, "PYTHONPATH": root},
                         capture_output=True, text=True)
    if run.returncode:
        print(run.stderr[-3000:])
        return len(cases)
    views = json.loads(out.read_text())
    print(f"\ntorchtitan {version} at {root}: {len(cases)} plans, ConfigManager + model "
          "built on the meta device\n")
    _table_header("torchtitan")
    bad = 0
    for (name, m, job, c, plan, warns, fits, folder), v in zip(meta, views):
        if not v["accepted"]:
            bad += 1
            rejected(name, fits, v["error"])
            continue
        got = titan_built(v)
        diffs = [(f, want, got.get(f), kind)
                 for f, want, kind in titan_expected(m, job, plan, version)
                 if got.get(f) != want]
        if "coords" in v:
            coords = [[s_, b * plan.shape.cp + cp_, t] for s_, b, cp_, t in v["coords"]]
            ranks = ds_ranks(folder, c, plan, coords)
        else:
            ranks = "mesh: " + v.get("coords_error", "?")[:60]
        bad += ranks.startswith("MISPLACED")
        bad += report(name, fits, "torchtitan", diffs, warns, ranks.replace("ranks ", ""))
        if "model_error" in v:
            print(f"    model lookup: {v['model_error']}")
        bad += check_titan_printed(m, job, c, plan, warns, v.get("printed"), version,
                                   folder / "hostfile")
    return bad


def check_titan_printed(m, job, c, plan, warns: list[str], printed: str | None, version: str,
                        hostfile: Path) -> int:
    """`calibrate --cluster` on a torchtitan log: the plan read from the job config the run
    prints at start-up (bench/upstream/run_torchtitan.py `_printed`: torchtitan's own print of
    the emitted TOML as its ConfigManager parsed it) must be the plan, as in check_run_config,
    and of the release emitted for. Returns 1 on a failure, else 0."""
    from formats.torchtitan_config import plan_from_torchtitan_doc, printed_config_doc
    from model.errors import SpecError

    if printed is None:
        print("    no job config printed at start-up: calibrate needs --run-config")
        return 1
    try:
        doc, read_version = printed_config_doc("json" if version == "0.2" else "repr",
                                               printed, "the printed job config")
        if read_version != version:
            print(f"    the printed job config reads as torchtitan {read_version}")
            return 1
        read = plan_from_torchtitan_doc(doc, c, version, "the printed job config",
                                        node_order=hostfile_order(hostfile, c)
                                        if hostfile.exists() else None)
    except SpecError as e:
        print(f"    plan read from its printed job config: refused ({e.field}: {e}), "
              "calibrate needs --plan")
        return 0
    return read_back_differs(m, job, c, plan, warns, read, "its printed job config")


def _nemo_layers(m: dict, pp: int, vp: int) -> list[int]:
    """Layers per virtual stage Megatron-Core builds from NeMo's keys (first/last stage counts,
    the rest even; each stage even over its chunks: transformer_block.get_num_layers_to_build)."""
    first, last = m.get("num_layers_in_first_pipeline_stage"), m.get(
        "num_layers_in_last_pipeline_stage")
    rest, left = m["num_layers"], pp
    for x in (first, last):
        if x is not None:
            rest, left = rest - x, left - 1
    per = [rest // left if left else 0] * pp
    if first is not None:
        per[0] = first
    if last is not None:
        per[-1] = last
    return [per[s] // vp for c in range(vp) for s in range(pp)]


def nemo_compare(model, job, cluster, plan, cfg: dict, order: str) -> list[tuple]:
    """(field, planned, built, kind) for every difference."""
    sh = plan.shape
    m, t = cfg["model"], cfg["trainer"]
    vp = m.get("virtual_pipeline_model_parallel_size") or 1
    built = {
        "exp_manager": "exp_manager" in cfg, "world": t["num_nodes"] * t["devices"],
        "tp": m["tensor_model_parallel_size"], "pp": m["pipeline_model_parallel_size"],
        "vp": vp, "cp": m.get("context_parallel_size", 1),
        "sequence_parallel": m["sequence_parallel"], "micro_batch": m["micro_batch_size"],
        "global_batch": m["global_batch_size"], "seq_length": m["encoder_seq_length"],
        "num_layers": m["num_layers"], "hidden_size": m["hidden_size"],
        "ffn_hidden_size": m["ffn_hidden_size"], "heads": m["num_attention_heads"],
        "query_groups": m.get("num_query_groups") or m["num_attention_heads"],
        "normalization": m["normalization"], "gated": "glu" in m["activation"],
        "bias": m["bias"], "position": m["position_embedding_type"],
        "rotary_base": m.get("rotary_base", 10000),
        "layernorm_epsilon": m.get("layernorm_epsilon", 1e-5),
        "dropout": m["hidden_dropout"] > 0, "layers": _nemo_layers(m, sh.pp, vp),
        "recompute": m.get("activations_checkpoint_granularity") or "none",
        "optimizer": m["optim"]["name"], "fp8": bool(m.get("fp8", False)),
        "fp8_params": bool(m.get("fp8_params", False)),
        "tokenizer": m["tokenizer"]["library"],
        "rank_order": "tp-cp-ep-pp-dp" if m.get("use_tp_pp_dp_mapping") else "tp-cp-ep-dp-pp",
        "experts": m.get("num_moe_experts") or 0, "ep": m.get("expert_model_parallel_size", 1),
        "schedule": "interleaved" if vp > 1 else "1f1b" if m["pipeline_model_parallel_size"] > 1
        else "none",
        "fsdp": bool(m.get("fsdp", False)),
        # a TransformerConfig field in the model config reaches Megatron-Core
        # (megatron_base_model.py build_transformer_config); False unless set
        "fused_loss": bool(m.get("cross_entropy_loss_fusion", False)),
        # the Megatron-Core model's core attention (megatron_gpt_model.py get_specs): the local
        # spec's DotProductAttention without Transformer Engine, TE's with it, whose unfused
        # and local backends store the scores
        "attention": "eager" if not (m.get("mcore_gpt") and m.get("transformer_engine"))
        or str(m.get("attention_backend", "auto")) in ("unfused", "local") else "flash",
    }
    want = {
        "exp_manager": True, "world": cluster.num_gpus, "tp": sh.tp, "pp": sh.pp,
        "vp": sh.chunks, "cp": sh.cp, "sequence_parallel": sh.sequence_parallel,
        "micro_batch": sh.micro_batch, "global_batch": job.global_batch,
        "seq_length": job.seq_length, "num_layers": model.num_layers,
        "hidden_size": model.hidden_size, "ffn_hidden_size": model.ffn_hidden_size,
        "heads": model.num_heads, "query_groups": model.num_kv_heads,
        "normalization": model.norm, "gated": model.gated_mlp, "bias": model.bias,
        "position": {"learned": "learned_absolute"}.get(model.position_embedding,
                                                        model.position_embedding),
        "rotary_base": model.rope_base or 10000, "dropout": model.dropout,
        "layernorm_epsilon": model.norm_eps or 1e-5,
        "layers": list(sh.layers), "recompute": sh.recompute,
        "optimizer": "distributed_fused_adam" if sh.zero == 1 else "fused_adam",
        "fp8": sh.fp8, "fp8_params": fp8_params_apply(job, sh), "tokenizer": "huggingface",
        "rank_order": order,
        "experts": model.num_experts, "ep": sh.ep,
        "schedule": sh.schedule if sh.pp > 1 else "none", "fsdp": sh.zero >= 2,
        "fused_loss": job.fused_loss, "attention": job.attention,
    }
    kinds = {"layers": "split", "vp": "schedule", "num_layers": "model",
             "hidden_size": "model", "ffn_hidden_size": "model", "heads": "model",
             "query_groups": "model", "normalization": "model", "gated": "model",
             "bias": "model", "position": "model", "rotary_base": "model",
             "layernorm_epsilon": "model",
             "dropout": "model", "tokenizer": "model", "experts": "model",
             "recompute": "recompute", "fp8": "precision", "fp8_params": "precision",
             "rank_order": "placement", "fused_loss": "memory", "attention": "attention",
             "schedule": "schedule"}
    return [(f, want[f], built[f], kinds.get(f, "parallelism")) for f in want
            if want[f] != built[f]]


def check_nemo(python: str, nemo: str, work: Path) -> int:
    """The Megatron-LM cases emitted for NeMo 1.x: launch.sh run per node, the arguments given
    to Hydra as NeMo's script would (bench/upstream/run_nemo.py); print the table."""
    cases = _cases()
    print(f"\nNeMo 1.x at {nemo} (megatron_gpt_config.yaml, Hydra composition as NeMo's "
          f"hydra_runner does); {len(cases)} plans\n")
    print(f"{'plan':40s} {'fits':>4s} {'NeMo':>10s} {'warned diff':>11s} {'unwarned':>8s}")
    bad = 0
    for k, (name, m, job, c, plan) in enumerate(cases):
        est = estimate(m, job, c, plan)
        folder = work / f"nemo{k}"
        _f, warns = emit("nemo", m, job, c, plan, folder, est=est, force=not est.fits,
                         version="1")
        if not (folder / "launch.sh").exists():
            print(f"{name:40s} no launch.sh: {warns[-1]}")
            bad += 1
            continue
        rec = run_launch(folder, c, {"NEMO_DIR": nemo},
                         extra=["model.data.data_prefix=[1.0,/data/corpus_text_document]"])
        first = rec[c.nodes[0].name]
        out = work / f"nemo{k}.json"
        subprocess.run([python, str(HERE / "run_nemo.py"), str(out), *first["args"]],
                       env={**os.environ, "HYDRA_FULL_ERROR": "1"}, capture_output=True,
                       text=True, cwd=work)
        v = json.loads(out.read_text()) if out.exists() else {"accepted": False,
                                                               "error": "no result"}
        if not v["accepted"]:
            bad += 1
            rejected(name, est.fits, v["error"])
            continue
        order = json.loads((folder / "ranks.json").read_text())["framework_order"]
        diffs = nemo_compare(m, job, c, plan, v["config"], order)
        bad += report(name, est.fits, "NeMo", diffs, warns)
        bad += check_nemo_config(m, c, job, plan, warns, v["config"], folder / "hostfile")
    return bad


def check_nemo_config(m, c, job, plan, warns: list[str], cfg: dict, hostfile: Path) -> int:
    """`calibrate --cluster` on a NeMo 1.x log: the plan read from the configuration NeMo
    composed for the launch set emitted from the plan (what megatron_gpt_pretraining.py prints
    at start-up, OmegaConf.to_yaml unresolved) and the vocabulary it pads must be the plan, as
    in check_run_config. Returns 1 on a failure, else 0."""
    import yaml

    from formats.nemo_config import plan_from_nemo_config
    from model.errors import SpecError

    try:
        read = plan_from_nemo_config(yaml.safe_dump(cfg, sort_keys=False), c,
                                     source="NeMo's configuration", vocab=m.vocab_size,
                                     node_order=hostfile_order(hostfile, c))[:3]
    except SpecError as e:
        print(f"    plan read from its printed configuration: refused ({e.field}: {e}), "
              "calibrate needs --plan")
        return 0
    return read_back_differs(m, job, c, plan, warns, read, "its printed configuration")


def ds_ranks(folder: Path, cluster, plan, coords: list) -> str:
    """Ranks that DeepSpeed's topology (stage, replica, tensor rank) puts on the node and GPU
    the plan gives that (stage, replica, tensor rank), the physical place of each rank being
    the one launch.sh realizes (ranks.json): 'k/k', or why not."""
    if not (folder / "ranks.json").exists():
        return "no launch set ([placement] warned)"
    doc = json.loads((folder / "ranks.json").read_text())
    index = {nd.name: i for i, nd in enumerate(cluster.nodes)}
    pl, good, total = plan.placement, 0, 0
    for nd in doc["nodes"]:
        for r in nd["ranks"]:
            s, col, t = coords[r["rank"]]
            total += 1
            good += (index[nd["node"]], r["gpu"]) == (pl.node[s][col], pl.gpus[s][col][t])
    return f"ranks {good}/{total}" if good == total else f"MISPLACED {total - good}/{total}"


def check_deepspeed(python: str, work: Path) -> int:
    """The Megatron-LM cases emitted for DeepSpeed, parsed by DeepSpeedConfig
    (bench/upstream/run_deepspeed.py); print the table."""
    cases = _cases()
    items, meta = [], []
    for k, (name, m, job, c, plan) in enumerate(cases):
        refused = model_refusal(m, "deepspeed", job.seq_length, plan.shape)
        if refused:  # emit refuses it too (a window Megatron-DeepSpeed lacks)
            print(f"{name}: not emitted for DeepSpeed: {refused[1]}")
            continue
        est = estimate(m, job, c, plan)
        folder = work / f"ds{k}"
        emit("deepspeed", m, job, c, plan, folder, est=est, force=not est.fits)
        sh = plan.shape
        # the config's data-parallel size is the plan's DP; DeepSpeed has no context
        # parallelism (warned), so its topology's data axis spans DP x CP columns
        items.append({"path": str(folder / "ds_config.json"), "dp": sh.dp,
                      "topo_dp": sh.dp * sh.cp, "pp": sh.pp, "tp": sh.tp})
        meta.append((name, job, c, plan, folder))
    (work / "ds.json").write_text(json.dumps(items))
    run = subprocess.run([python, str(HERE / "run_deepspeed.py"), str(work / "ds.json"),
                          str(work / "ds-views.json")], capture_output=True, text=True)
    if run.returncode:
        print(run.stderr[-3000:])
        return len(cases)
    views = json.loads((work / "ds-views.json").read_text())
    print(f"\nDeepSpeed (DeepSpeedConfig); {len(cases)} plans\n")
    print(f"{'plan':40s} {'DeepSpeed':>9s}  batch / micro / accumulation / ZeRO; timing "
          "lines every N steps; ranks ok")
    bad = 0
    for (name, job, c, plan, folder), v in zip(meta, views):
        sh = plan.shape
        if not v["accepted"]:
            bad += 1
            print(f"{name:40s} {'REJECTED':>9s}  {v['error']}")
            continue
        want = (job.global_batch, sh.micro_batch, job.global_batch // (sh.micro_batch * sh.dp),
                sh.zero)
        got = (v["train_batch_size"], v["micro_batch"], v["grad_accum"], v["zero_stage"])
        bad += want != got
        # DeepSpeed prints no timing line for calibrate to read without steps_per_print
        every = v.get("steps_per_print")
        bad += not every
        ranks = ds_ranks(folder, c, plan, v["coords"])
        bad += ranks.startswith("MISPLACED")
        print(f"{name:40s} {'accepted':>9s}  {got}; {every or 'NEVER'}; {ranks}"
              + ("" if want == got else f"  planned {want}"))
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=os.environ.get("UPSTREAM_PYTHON"),
                    help="a Python with torch (see the module docstring)")
    ap.add_argument("--megatron", default=os.environ.get("MEGATRON_LM"),
                    help="a Megatron-LM checkout")
    ap.add_argument("--nemo", default=None,
                    help="a NeMo 1.x checkout (examples/nlp/language_modeling is used)")
    ap.add_argument("--bridge", default=None,
                    help="a Megatron-Bridge checkout (its src/ is used, with --megatron's "
                    "Megatron-Core)")
    ap.add_argument("--deepspeed", action="store_true",
                    help="also check ds_config.json with DeepSpeedConfig (deepspeed installed "
                    "in --python)")
    ap.add_argument("--torchtitan-0.1", dest="titan01", default=None,
                    help="a torchtitan v0.1.0 checkout")
    ap.add_argument("--torchtitan-0.2", dest="titan02", default=None,
                    help="a torchtitan v0.2.x checkout (v0.2.2 checked)")
    a = ap.parse_args()
    if a.bridge and not a.megatron:
        print("upstream_check: --bridge needs --megatron (Megatron-Bridge runs on its Core)")
        return 2
    if not a.python or not (a.megatron or a.nemo or a.titan01 or a.titan02 or a.deepspeed):
        print("upstream_check: give --python and at least one checkout (see the docstring)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="upstream-"))
    bad = check_megatron(a.python, a.megatron, work) if a.megatron else 0
    if a.bridge:
        bad += check_bridge(a.python, a.bridge, a.megatron, work)
    if a.nemo:
        bad += check_nemo(a.python, a.nemo, work)
    if a.deepspeed:
        bad += check_deepspeed(a.python, work)
    for ver, root in (("0.2", a.titan02), ("0.1", a.titan01)):
        if root:
            bad += check_torchtitan(a.python, ver, root, work)
    print(f"\n{'all plans accepted, every difference warned' if not bad else f'{bad} failures'}")
    return 1 if bad else 0


def check_megatron(python: str, megatron: str, work: Path) -> int:
    """The Megatron-LM cases: emit, run launch.sh per node, parse with Megatron; print the
    table; return the number of failures."""
    return _check_core(python, ("Megatron-LM", "Megatron"), "megatron", None,
                       "run_megatron.py", megatron, [megatron], work)


def check_bridge(python: str, bridge: str, megatron: str, work: Path) -> int:
    """The same cases emitted as Megatron-Bridge recipes (NeMo's current API): launch.sh run per
    node with a run-length override, the recipe built and validated by Megatron-Bridge
    (bench/upstream/run_bridge.py, Megatron-Core from the Megatron-LM checkout)."""
    return _check_core(python, ("Megatron-Bridge", "Bridge"), "nemo", "bridge",
                       "run_bridge.py", bridge, [str(Path(bridge) / "src"), megatron], work,
                       extra=["train.train_iters=1000",
                              "dataset.blend=[[/data/corpus_text_document],null]"]) + \
        check_bridge_recipes(python, bridge, megatron, work)


# Megatron-Bridge's own recipes (067f987, recipes/llama/h100/llama3.py), each run as it stands
# on WORLD_SIZE 64 (the h100-8x8 preset), its checkpoint's run_config.yaml read back by
# `calibrate --run-config`: (recipe function, the preset model of its Hugging Face id, that id)
BRIDGE_RECIPES = (
    ("llama3_8b_pretrain_2gpu_h100_bf16_config", "llama3-8b", "meta-llama/Meta-Llama-3-8B"),
    ("llama3_8b_pretrain_16gpu_h100_bf16_16k_config", "llama3-8b",
     "meta-llama/Meta-Llama-3-8B"),
    ("llama3_70b_pretrain_32gpu_h100_bf16_config", "llama3-70b", "meta-llama/Meta-Llama-3-70B"),
    ("llama3_8b_pretrain_2gpu_h100_fp8cs_config", "llama3-8b", "meta-llama/Meta-Llama-3-8B"),
)


def _hf_cache(home: Path, repo: str, model) -> None:
    """A Hugging Face cache under `home` holding `repo`'s config.json, written from the preset
    (whose source is that config.json; rms_norm_eps 1e-05 and hidden_act silu as there): the
    recipes read it, and this machine has no network."""
    snap = home / "hub" / f"models--{repo.replace('/', '--')}"
    rev = "0" * 40
    (snap / "refs").mkdir(parents=True, exist_ok=True)
    (snap / "refs" / "main").write_text(rev)
    (snap / "snapshots" / rev).mkdir(parents=True, exist_ok=True)
    (snap / "snapshots" / rev / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": model.hidden_size, "intermediate_size": model.ffn_hidden_size,
        "num_hidden_layers": model.num_layers, "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_kv_heads, "vocab_size": model.vocab_size,
        "max_position_embeddings": model.seq_length, "rope_theta": model.rope_base,
        "rms_norm_eps": 1e-05, "tie_word_embeddings": model.tied_embeddings,
        "attention_bias": model.bias, "torch_dtype": "bfloat16", "bos_token_id": 128000,
        "eos_token_id": 128001}))


def check_bridge_recipes(python: str, bridge: str, megatron: str, work: Path) -> int:
    """Megatron-Bridge's own recipes: built as they stand by Bridge (run_bridge.py), their
    run_config.yaml read back by `calibrate --run-config` on the h100-8x8 cluster and compared
    field by field with what Bridge built, and the configuration summary Bridge printed checked
    against it as calibrate checks a log. Prints each recipe's differences (the reader refusing
    what it cannot price is no failure); returns the number of recipes read back differently
    from what Bridge built or refused by the check."""
    from formats.bridge_config import plan_from_bridge_config
    from formats.megatron_args import loss_unpriced
    from model.errors import SpecError

    c = cluster("h100-8x8")
    home = work / "hf"
    items = []
    for k, (fn, preset, repo) in enumerate(BRIDGE_RECIPES):
        _hf_cache(home, repo, presets.model(preset))
        items.append({"recipe": f"megatron.bridge.recipes.llama.h100.llama3:{fn}",
                      "world_size": c.num_gpus, "gpu_arch": 9,
                      "run_config": str(work / f"recipe{k}.yaml")})
    (work / "recipes.json").write_text(json.dumps(items))
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(bridge) / "src"), megatron])}
    run = subprocess.run([python, str(HERE / "run_bridge.py"), str(work / "recipes.json"),
                          str(work / "recipes-views.json")], cwd=bridge, env=env,
                         capture_output=True, text=True)
    if run.returncode:
        print(run.stderr[-3000:])
        return len(items)
    views = json.loads((work / "recipes-views.json").read_text())
    print(f"\nMegatron-Bridge's own recipes on {c.num_gpus} GPUs (h100-8x8), their "
          "run_config.yaml read back by calibrate --run-config\n")
    bad = 0
    for (fn, _p, _r), v in zip(BRIDGE_RECIPES, views):
        if not v["accepted"]:
            print(f"{fn}: Bridge refused it: {v['error']}")
            bad += 1
            continue
        try:
            m, job, plan, settings = plan_from_bridge_config(Path(v["run_config"]), c)
        except SpecError as e:
            print(f"{fn}: refused ({e.field}): {str(e).split(': ', 1)[-1]}")
            continue
        # Transformer Engine's fused loss, which the cost model does not price: calibrate
        # keeps the run's memory out of its fit (formats/runs.py); every other field must be
        # as built
        te_loss = loss_unpriced(settings)
        diffs = [d for d in compare(m, job, plan, v)
                 if not (d[0] == "cross_entropy_loss_fusion" and te_loss)]
        print(f"{fn}: {plan.shape.describe()}; "
              + ("as Bridge built it" if not diffs else f"{len(diffs)} differences")
              + ("; TE fused loss: its memory reported, not fitted" if te_loss else ""))
        for f, want, have, kind in diffs:
            print(f"    [{kind}] {f}: read {want}, Bridge builds {have}")
        bad += bool(diffs) + check_summary(m, job, plan, v.get("summary"))
    return bad


def check_printed_args(m, job, c, plan, warns: list[str], printed: str | None,
                       hostfile: Path | None = None) -> int:
    """`calibrate` on the arguments block Megatron itself printed for the launch set emitted
    from the plan (runners that print none, printed None, skip this): its check of a log
    against its plan must pass, every name it checks must be printed, and the plan it reads
    back from the block (`calibrate --cluster`) must be the plan, costing the same once placed
    in Megatron-LM's order (a log does not record placement), but where warnings.txt announced
    the difference or the reader refuses what it cannot price. Ranks fill the nodes in the
    order of the emitted `hostfile` (calibrate --hostfile). Returns 1 on a failure (printed)
    or 0."""
    from formats.megatron_args import plan_from_megatron_args
    from model.errors import SpecError

    if printed is None:
        return 0
    blocks = megatron_arg_blocks(printed)
    if not blocks:
        print("    calibrate's argument check: no arguments block printed")
        return 1
    printed_args = blocks[-1]
    diff = megatron_args_mismatch(m, job, plan, printed_args)
    for name, logged, planned in diff:
        print(f"    calibrate's argument check refuses the run: {name} printed {logged}, "
              f"planned {planned}")
    names = set(megatron_planned_args(m, job, plan)) | {"fp8"}
    missing = sorted(names - set(printed_args))
    if missing:  # a name Megatron no longer prints is a check calibrate no longer makes
        print(f"    calibrate's argument check: not printed by Megatron: {', '.join(missing)}")
    try:
        m2, j2, p2 = plan_from_megatron_args(
            printed_args, c, source="log",
            node_order=hostfile_order(hostfile, c) if hostfile else None)
    except SpecError as e:
        print(f"    plan read from the arguments: refused ({e.field}), calibrate needs --plan")
        return bool(diff) or bool(missing)
    return bool(diff) or bool(missing) or \
        read_back_differs(m, job, c, plan, warns, (m2, j2, p2), "the arguments")


def check_run_config(m, job, c, plan, warns: list[str], path: str | None,
                     hostfile: Path | None = None) -> int:
    """`calibrate --run-config` on the run_config.yaml Megatron-Bridge itself wrote for the
    launch set emitted from the plan (the file a checkpoint of the run holds): the plan read
    from it must be the plan, as in check_printed_args. Returns 1 on a failure, else 0."""
    from formats.bridge_config import plan_from_bridge_config
    from model.errors import SpecError

    if path is None:
        return 0
    try:
        read = plan_from_bridge_config(
            Path(path), c, node_order=hostfile_order(hostfile, c) if hostfile else None)[:3]
    except SpecError as e:
        print(f"    plan read from its run_config.yaml: refused ({e.field}: {e}), calibrate "
              "needs --plan")
        return 0
    return read_back_differs(m, job, c, plan, warns, read, "its run_config.yaml")


def check_summary(m, job, plan, text: str | None) -> int:
    """`calibrate`'s check of a Megatron-Bridge log against its plan, on the configuration
    summary Bridge itself printed for the launch set emitted from the plan (formats/runs.py
    check_logged_args): it must find the summary and pass. Returns 1 on a failure, else 0."""
    from formats.bridge_config import bridge_summary_args
    from formats.logs import bridge_summaries

    if text is None:
        return 0
    found = bridge_summaries(text)
    if not found:
        print("    calibrate's check: no configuration summary printed")
        return 1
    diff = megatron_args_mismatch(m, job, plan, bridge_summary_args(found[-1]))
    for name, logged, planned in diff:
        print(f"    calibrate's check refuses the run: {name} in the summary {logged}, "
              f"planned {planned}")
    return int(bool(diff))


def read_back_differs(m, job, c, plan, warns: list[str], read: tuple, what: str) -> bool:
    """Whether the plan `calibrate` read back (model, job, plan) differs from the plan beyond
    what warnings.txt announced (printed either way): its shape, its placement, its cost."""
    import dataclasses

    m2, j2, p2 = read
    moved = [f.name for f in dataclasses.fields(plan.shape)
             if getattr(plan.shape, f.name) != getattr(p2.shape, f.name)]
    kinds = {k.group(1) for w in warns if (k := re.search(r"\[(\w+)\]", w))}
    unwarned = [f for f in moved if not (f == "schedule" and "schedule" in kinds
                                         or f == "layers" and "split" in kinds
                                         or f in ("zero", "distributed_optimizer")
                                         and "sharding" in kinds)]
    if plan.placement != p2.placement:
        moved.append("placement")
    t_plan = estimate(m, job, c, plan)
    t_read = estimate(m2, j2, c, p2)
    same = t_plan.iteration_ms == t_read.iteration_ms and \
        t_plan.peak_memory_gib == t_read.peak_memory_gib
    if moved or not same:
        print(f"    plan read from {what}: {', '.join(moved) or 'same shape'}; "
              f"{t_read.iteration_ms / t_plan.iteration_ms - 1:+.2%} time, "
              f"{t_read.peak_memory_gib - t_plan.peak_memory_gib:+.2f} GiB"
              + ("" if unwarned or same and not moved else " (as warned)"))
    # a cost moved with the shape unchanged: the model, or (torchtitan's repeated K/V) the
    # attention, each as warned
    return bool(unwarned) or (not same and not moved and not {"model", "attention"} & kinds)


def _check_core(python: str, names: tuple[str, str], fw: str, version: str | None,
                runner: str, root: str, path: list[str], work: Path,
                extra: list[str] = ()) -> int:
    """Megatron-Core frameworks: emit each case, run launch.sh per node, hand what torchrun
    would start to the framework's own code (runner, in the checkout `root`), compare what it
    built with the plan and check every rank; print the table, return the failures. names:
    (the framework, its short name for the table)."""
    label, short = names
    cases = _cases()
    items, meta = [], []
    for k, (name, m, job, c, plan) in enumerate(cases):
        est = estimate(m, job, c, plan)
        folder = work / f"{label}{k}"
        _files, warns = emit(fw, m, job, c, plan, folder, est=est, force=not est.fits,
                             version=version)
        recs = run_launch(folder, c, extra=extra)
        first = recs[c.nodes[0].name]
        assert all(r["args"] == first["args"] for r in recs.values()), "args differ by node"
        # the GPU's major compute capability (validate_args asks CUDA_DEVICE_MAX_CONNECTIONS=1
        # with TP or CP below 10); a GPU without one listed as Ampere
        cc = c.nodes[0].gpu.compute_capability
        arch = int(cc) if cc is not None else 8
        items.append({"record": first, "world_size": c.num_gpus, "gpu_arch": arch,
                      "run_config": str(folder / "run_config.yaml") if version else None})
        meta.append((name, m, job, c, plan, warns, recs, est.fits))
    (work / f"{label}-items.json").write_text(json.dumps(items))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    run = subprocess.run([python, str(HERE / runner), str(work / f"{label}-items.json"),
                          str(work / f"{label}-views.json")],
                         cwd=root, env=env, capture_output=True, text=True)
    if run.returncode:
        print(run.stderr[-3000:])
        return len(cases)
    views = json.loads((work / f"{label}-views.json").read_text())
    print(f"\n{label} at {root}; {len(cases)} plans; launch.sh run per node\n")
    _table_header(short)
    bad = 0
    for k, ((name, m, job, c, plan, warns, recs, fits), v) in enumerate(zip(meta, views)):
        if not v["accepted"]:
            bad += 1
            rejected(name, fits, f"{v['error']} ({v['where']})")
            continue
        good, total = check_ranks(c, plan, recs, v["groups"])
        bad += report(name, fits, short, compare(m, job, plan, v), warns, f"{good}/{total}")
        bad += good != total
        bad += check_printed_args(m, job, c, plan, warns, v.get("printed"),
                                  work / f"{label}{k}" / "hostfile")
        bad += check_run_config(m, job, c, plan, warns, v.get("run_config"),
                                work / f"{label}{k}" / "hostfile")
        bad += check_summary(m, job, plan, v.get("summary"))
        if v["order"] != "tp-cp-ep-dp-pp":
            print(f"    rank order {v['order']} (use_tp_pp_dp_mapping)")
    print(f"\n{len(cases) - bad}/{len(cases)} plans accepted with every difference warned "
          "and every rank placed")
    return bad

if __name__ == "__main__":
    sys.exit(main())
