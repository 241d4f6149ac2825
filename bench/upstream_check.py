"""Feed emitted launch sets to the frameworks' own code and print what they accept and build.

For each plan of a fixed set (Llama-2 70B and 7B, Mixtral, DeepSeek-V2-Lite, Llama-3 8B with
context parallelism, BLOOM; even, uneven and interleaved splits; TP=1 DP=64; Megatron-FSDP;
FP8; a placement that needs --use-tp-pp-dp-mapping; a 16-node synthetic cluster placed by the
annealer) the Megatron-LM launch set is written and run as a user would: `launch.sh` is
executed once per node (NODE_NAME set) with `torchrun` replaced by bench/upstream/fake_torchrun,
which records the environment and the arguments the script hands over. Those go to
bench/upstream/run_megatron.py, which runs in a Python that has torch, inside a Megatron-LM
checkout, and calls Megatron's parse_args, validate_args, tokenizer padding,
core_transformer_config_from_args and RankGenerator. This script then compares what Megatron
built with the plan:

- accepted or the error;
- every difference between the model / parallel layout / schedule / split / micro-batches /
  recompute / optimizer / precision Megatron built and the plan, and whether warnings.txt
  announced it (a difference nobody was warned about is a failure);
- every rank on the planned node and GPU under Megatron's own groups (tp, pp, dp, cp, ep).

Setup (nothing here is a dependency of the project):
    python3 -m venv /tmp/upstream && /tmp/upstream/bin/pip install torch==2.13.0 numpy \
        pyyaml packaging triton
    git clone https://github.com/NVIDIA/Megatron-LM /tmp/megatron-lm   # main; d98e8a6 checked
    python bench/upstream_check.py --python /tmp/upstream/bin/python --megatron /tmp/megatron-lm

Prints one row per plan and the totals; exits 1 when any plan is rejected, any difference is
unwarned or any rank is misplaced.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from formats import presets  # noqa: E402
from formats.clusters import SynthParams, cluster, synth_cluster, uniform_cluster  # noqa: E402
from launch.emit import emit  # noqa: E402
from model.estimator import estimate, make_plan  # noqa: E402
from model.plan import block_placement, ep_groups  # noqa: E402
from model.specs import JobSpec  # noqa: E402

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
    jcp = JobSpec(global_batch=32, seq_length=32768)
    out.append(("Llama-3 8B CP=4 seq 32k", l3, jcp, h100,
                make_plan(l3, jcp, h100, tp=2, pp=1, cp=4, sequence_parallel=True,
                          distributed_optimizer=True)))
    jf8 = JobSpec(global_batch=256, seq_length=4096, fp8=True)
    out.append(("70B FP8, TP overlap, H100", l70, jf8, h100,
                make_plan(l70, jf8, h100, tp=8, pp=4, recompute="selective",
                          sequence_parallel=True, distributed_optimizer=True,
                          tp_comm_overlap=True, overlap_grad_reduce=True)))
    mx = presets.model("mixtral-8x7b")
    out.append(("Mixtral 8x7B EP=8 interleaved", mx, job, ex,
                make_plan(mx, job, ex, tp=2, pp=4, ep=8, etp=1, schedule="interleaved",
                          chunks=2, sequence_parallel=True, distributed_optimizer=True)))
    ds = presets.model("deepseek-v2-lite")
    out.append(("DeepSeek-V2-Lite MLA EP=8", ds, job, ex,
                make_plan(ds, job, ex, tp=1, pp=2, ep=8, recompute="selective",
                          distributed_optimizer=True)))
    bl = presets.model("bloom-176b")
    jb = JobSpec(global_batch=512, seq_length=2048)
    out.append(("BLOOM 176B (ALiBi)", bl, jb, ex,
                make_plan(bl, jb, ex, tp=8, pp=8, recompute="full", sequence_parallel=True,
                          distributed_optimizer=True)))
    return out


def run_launch(folder: Path, cluster) -> dict[str, dict]:
    """Run launch.sh once per node with the fake torchrun; node name -> record."""
    shim = Path(tempfile.mkdtemp())
    (shim / "torchrun").symlink_to(HERE / "fake_torchrun")
    recs = {}
    for nd in cluster.nodes:
        rec_path = shim / f"{nd.name}.json"
        env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "NODE_NAME": nd.name,
               "UPSTREAM_RECORD": str(rec_path)}
        env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        subprocess.run(["bash", str(folder / "launch.sh")], env=env, check=True)
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
        ("position_embedding_type", {"rope": "rope", "learned": "learned_absolute"}.get(
            model.position_embedding, model.position_embedding), "model"),
        ("rotary_base", int(model.rope_base) if model.rope_base else 10000, "model"),
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
        ("overlap_grad_reduce", sh.overlap_grad_reduce, "overlap"),
        ("overlap_param_gather", sh.overlap_param_gather, "overlap"),
        ("tp_comm_overlap", sh.tp_comm_overlap, "overlap"),
        ("bf16", job.precision == "bf16", "precision"),
        ("fp8", "hybrid" if sh.fp8 else None, "precision"),
    ]


def compare(model, job, plan, got: dict, warnings: list[str]) -> tuple[list, list]:
    """(warned differences, unwarned differences) as (field, planned, built, kind)."""
    warned, unwarned = [], []
    kinds = {w.split("[", 1)[1].split("]", 1)[0] for w in warnings if "[" in w}
    for f, want, kind in expected(model, job, plan):
        have = got.get(f)
        if f == "gated_linear_unit" and not model.gated_mlp:
            have = bool(have)
        if have != want:
            (warned if kind in kinds else unwarned).append((f, want, have, kind))
    return warned, unwarned


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", default=os.environ.get("UPSTREAM_PYTHON"),
                    help="a Python with torch (see the module docstring)")
    ap.add_argument("--megatron", default=os.environ.get("MEGATRON_LM"),
                    help="a Megatron-LM checkout")
    a = ap.parse_args()
    if not a.python or not a.megatron:
        print("upstream_check: give --python and --megatron (see the docstring)")
        return 2
    cases = _cases()
    items, meta = [], []
    work = Path(tempfile.mkdtemp(prefix="upstream-"))
    for k, (name, m, job, c, plan) in enumerate(cases):
        est = estimate(m, job, c, plan)
        folder = work / f"case{k}"
        _files, warns = emit("megatron", m, job, c, plan, folder, est=est,
                             force=not est.fits)
        recs = run_launch(folder, c)
        first = recs[c.nodes[0].name]
        assert all(r["args"] == first["args"] for r in recs.values()), "args differ by node"
        arch = 9 if c.nodes[0].gpu.name.startswith("H") else 8
        items.append({"record": first, "world_size": c.num_gpus, "gpu_arch": arch})
        meta.append((name, m, job, c, plan, warns, recs, est.fits))
    (work / "items.json").write_text(json.dumps(items))
    env = {**os.environ, "PYTHONPATH": a.megatron}
    run = subprocess.run([a.python, str(HERE / "run_megatron.py"), str(work / "items.json"),
                          str(work / "views.json")],
                         cwd=a.megatron, env=env, capture_output=True, text=True)
    if run.returncode:
        print(run.stderr[-3000:])
        return 1
    views = json.loads((work / "views.json").read_text())
    print(f"Megatron-LM at {a.megatron}; {len(cases)} plans; launch.sh run per node\n")
    print(f"{'plan':40s} {'fits':>4s} {'Megatron':>9s} {'warned diff':>11s} "
          f"{'unwarned':>8s} {'ranks ok':>10s}")
    bad = 0
    for (name, m, job, c, plan, warns, recs, fits), v in zip(meta, views):
        if not v["accepted"]:
            bad += 1
            print(f"{name:40s} {'yes' if fits else 'NO':>4s} {'REJECTED':>9s}  {v['error']} "
                  f"({v['where']})")
            continue
        warned, unwarned = compare(m, job, plan, v, warns)
        good, total = check_ranks(c, plan, recs, v["groups"])
        bad += bool(unwarned) + (good != total)
        print(f"{name:40s} {'yes' if fits else 'NO':>4s} {'accepted':>9s} {len(warned):>11d} "
              f"{len(unwarned):>8d} {f'{good}/{total}':>10s}")
        for f, want, have, kind in warned + unwarned:
            tag = "warned" if (f, want, have, kind) in warned else "UNWARNED"
            print(f"    {tag} [{kind}] {f}: planned {want}, Megatron builds {have}")
        if v["order"] != "tp-cp-ep-dp-pp":
            print(f"    rank order {v['order']} (--use-tp-pp-dp-mapping)")
    print(f"\n{len(cases) - bad}/{len(cases)} plans accepted with every difference warned "
          "and every rank placed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
