"""FP8 recipes by GPU (model/fp8.py): what Transformer Engine casts and keeps under per-tensor,
MXFP8 and blockwise scaling on Hopper and Blackwell, through the estimator, the plan file and
the solver."""

import dataclasses
import json

import pytest

from formats import presets
from formats.clusters import uniform_cluster
from formats.planfile import load_plan, save_plan
from model.compute import ComputeModel, elementwise_ms
from model.errors import SpecError
from model.estimator import estimate, make_plan
from model.fp8 import any_layout, fp8_bytes
from model.specs import JobSpec

H100, B200 = presets.gpu("H100-SXM-80GB"), presets.gpu("B200")
L8 = presets.model("llama3-8b")


def _job(**kw):
    return JobSpec(global_batch=16, seq_length=4096, fp8=True, **kw)


def test_blackwell_reads_one_fp8_copy_either_way_and_hopper_keeps_a_transpose():
    """Per-tensor recipes write the transpose only where FP8 GEMMs are TN-only (Hopper): the
    cast, the cached weight and the once-a-step recast are a byte lighter on Blackwell;
    current scaling reads each tensor once more for its amax on both."""
    assert not any_layout(H100) and any_layout(B200)
    for recipe, amax in (("delayed", 0.0), ("tensorwise", 2.0)):
        h, b = fp8_bytes(_job(fp8_recipe=recipe), H100), fp8_bytes(_job(fp8_recipe=recipe), B200)
        assert h.cast == 2 + 2 + amax and b.cast == 2 + 1 + amax
        assert h.weight_copy == 2 and b.weight_copy == 1
        assert h.weight_cast == h.cast and b.weight_cast == b.cast
        assert h.saved_input == b.saved_input == 1


def test_block_recipes_write_both_directions_with_their_scales():
    """MXFP8: row- and column-wise copies, one E8M0 byte per 32 elements each, the block amax
    inside the cast; blockwise: the copy and its transpose with an fp32 scale per 128
    elements (activations) or 128 x 128 (weights)."""
    mx = fp8_bytes(_job(fp8_recipe="mxfp8"), B200)
    assert mx.cast == pytest.approx(2 + 2 * (1 + 1 / 32))
    assert mx.weight_copy == pytest.approx(2 * (1 + 1 / 32))
    assert mx.saved_input == pytest.approx(1 + 1 / 32)
    bw = fp8_bytes(_job(fp8_recipe="blockwise"), H100)
    assert bw.cast == pytest.approx(2 + 2 * (1 + 4 / 128))
    assert bw.saved_input == pytest.approx(1 + 4 / 128)
    assert bw.weight_copy == pytest.approx(2 * (1 + 4 / 128 ** 2))
    # torchao float8 keeps its fitted cast and caches no weight
    tt = fp8_bytes(JobSpec(global_batch=16, seq_length=4096, fp8=True, framework="torchtitan",
                           zero=3), B200)
    assert (tt.cast, tt.weight_copy) == (3.0, 0.0)


def test_a_recipe_the_gpu_does_not_run_is_one_clear_error():
    c_h = uniform_cluster(1, 8, "H100-SXM-80GB", 360.0, 50.0)
    c_b = uniform_cluster(1, 8, "B200", 900.0, 50.0)
    c_amd = uniform_cluster(1, 8, "MI300X", 448.0, 50.0)
    for cluster, recipe, says in ((c_h, "mxfp8", "B200"), (c_amd, "mxfp8", "no compute_capability listed"),
                                  (c_b, "blockwise", "tensorwise or mxfp8"),
                                  (c_amd, "blockwise", "use delayed or tensorwise$")):
        job = _job(fp8_recipe=recipe)
        with pytest.raises(SpecError, match=says) as e:
            estimate(L8, job, cluster, make_plan(L8, job, cluster, tp=8, pp=1))
        assert e.value.field == "fp8_recipe"
    # where it runs, it prices
    for cluster, recipe in ((c_b, "mxfp8"), (c_h, "blockwise")):
        job = _job(fp8_recipe=recipe)
        assert estimate(L8, job, cluster, make_plan(L8, job, cluster, tp=8, pp=1)).iteration_ms
    with pytest.raises(SpecError, match="not priced") as e:
        _job(fp8_recipe="blockwise", fp8_param_gather=True, zero=1)
    assert e.value.field == "fp8_param_gather"


def test_cast_time_and_weight_memory_follow_the_recipe_on_b200():
    c = uniform_cluster(1, 8, "B200", 900.0, 50.0)
    kw = dict(tp=4, micro_batch=1, sequence_parallel=True, fp8=True)
    T = 4096
    fc1_in = T * L8.hidden_size // 4  # the MLP-up input, cast on the local sequence shard
    for recipe, cast_b in (("delayed", 3.0), ("tensorwise", 5.0), ("mxfp8", 4.0625)):
        lay = ComputeModel(L8, _job(fp8_recipe=recipe), B200, **kw).layer()
        assert lay.fwd.ms["fc1.cast"] == pytest.approx(elementwise_ms(B200, cast_b * fc1_in))
    est = {}
    for recipe in ("delayed", "mxfp8"):
        job = _job(fp8_recipe=recipe)
        est[recipe] = estimate(L8, job, c, make_plan(L8, job, c, tp=4, pp=2,
                                                     sequence_parallel=True, layers=(16, 16)))
    b16 = _job(fp8_recipe="delayed")
    b16 = dataclasses.replace(b16, fp8=False)
    e16 = estimate(L8, b16, c, make_plan(L8, b16, c, tp=4, pp=2, sequence_parallel=True,
                                         layers=(16, 16)))
    lin = 16 * L8.linear_params_per_layer / 4 / 2 ** 30  # linear weights on a stage's GPU
    d = est["delayed"].stages[1].memory.weights_gib - e16.stages[1].memory.weights_gib
    mx = est["mxfp8"].stages[1].memory.weights_gib - e16.stages[1].memory.weights_gib
    assert d == pytest.approx(lin * 1.0) and mx == pytest.approx(lin * 2 * (1 + 1 / 32))
    # MXFP8 keeps 1/32 more of each saved linear input
    assert est["mxfp8"].stages[1].memory.activations_gib > \
        est["delayed"].stages[1].memory.activations_gib


def test_tp_gathers_move_the_recipes_copies_and_scales():
    """Under sequence parallelism an input's gather moves one FP8 copy (the block recipes with
    their scales), an output gradient's the per-tensor recipes' one copy or the block
    recipes' two with their scales (TE's _all_gather_mxfp8 / _start_all_gather_fp8_blockwise),
    as fractions of the 16-bit activation."""
    from model.costs import CostModel
    from model.specs import Options
    for gpu, recipe, want in (("B200", "delayed", (0.5, 0.5)),
                              ("B200", "mxfp8", ((1 + 1 / 32) / 2, (2 + 2 / 32) / 2)),
                              ("H100-SXM-80GB", "blockwise",
                               ((1 + 4 / 128) / 2, (2 + 8 / 128) / 2))):
        c = uniform_cluster(1, 8, gpu, 900.0, 50.0)
        job = _job(fp8_recipe=recipe)
        cm = CostModel(L8, job, c, make_plan(L8, job, c, tp=4, pp=1,
                                             sequence_parallel=True).shape, Options())
        assert cm._gather_fractions(c.nodes[0].gpu) == pytest.approx(want)
    # the MXFP8 plan's exposed TP time exceeds the per-tensor one's by the gradients' gathers
    c = uniform_cluster(1, 8, "B200", 900.0, 50.0)
    tp = {}
    for recipe in ("delayed", "mxfp8"):
        job = _job(fp8_recipe=recipe)
        tp[recipe] = estimate(L8, job, c, make_plan(L8, job, c, tp=4, pp=1,
                                                    sequence_parallel=True)
                              ).breakdown_ms["tp_comm_ms"]
    assert tp["mxfp8"] > 1.1 * tp["delayed"]


def test_fp8_param_gather_on_blackwell_keeps_one_byte_per_weight():
    c = uniform_cluster(1, 8, "B200", 900.0, 50.0)
    job = _job(fp8_recipe="tensorwise", fp8_param_gather=True)
    kw = dict(tp=8, pp=1, sequence_parallel=True, distributed_optimizer=True)
    ep = estimate(L8, job, c, make_plan(L8, job, c, **kw))
    b16 = dataclasses.replace(job, fp8=False, fp8_param_gather=False, fp8_recipe="delayed")
    e16 = estimate(L8, b16, c, make_plan(L8, b16, c, **kw))
    lin = L8.num_layers * L8.linear_params_per_layer / 8 / 2 ** 30
    assert ep.stages[0].memory.weights_gib == pytest.approx(
        e16.stages[0].memory.weights_gib - lin)  # 1 byte in place of 2


def test_mxfp8_weights_are_both_copies_and_gather_in_16_bits():
    """MXFP8 weights (fp8_param_gather): the row- and column-wise copies with their scales are
    the only compute copy (2 + 2/32 bytes in place of 2 + 2 + 2/32), and Megatron-Core gathers
    them in 16 bits through the gradient buffer, so the sync moves what a bf16 plan's does."""
    from model.costs import CostModel
    from model.specs import Options
    c = uniform_cluster(1, 8, "B200", 900.0, 50.0)
    kw = dict(tp=4, pp=1, sequence_parallel=True, distributed_optimizer=True)
    job = _job(fp8_recipe="mxfp8", fp8_param_gather=True)
    plain = dataclasses.replace(job, fp8_param_gather=False)
    ep, e8 = (estimate(L8, j, c, make_plan(L8, j, c, **kw)) for j in (job, plain))
    lin = L8.num_layers * L8.linear_params_per_layer / 4 / 2 ** 30
    assert e8.stages[0].memory.weights_gib - ep.stages[0].memory.weights_gib == \
        pytest.approx(2 * lin)
    cm = CostModel(L8, job, c, make_plan(L8, job, c, **kw).shape, Options())
    assert cm.fp8_gather_saving == 0.0
    tw = _job(fp8_recipe="tensorwise", fp8_param_gather=True)
    assert CostModel(L8, tw, c, make_plan(L8, tw, c, **kw).shape, Options()
                     ).fp8_gather_saving == 1.0


def test_plan_file_keeps_the_compute_capability_and_older_files_read_as_hopper(tmp_path):
    c = uniform_cluster(1, 8, "B200", 900.0, 50.0)
    job = _job(fp8_recipe="tensorwise")
    plan = make_plan(L8, job, c, tp=8, pp=1, sequence_parallel=True)
    est = estimate(L8, job, c, plan)
    p = tmp_path / "p.json"
    save_plan(p, L8, job, c, plan, est)
    _m, j2, c2, p2, o2, _meta = load_plan(p)
    assert c2.nodes[0].gpu.compute_capability == 10.0
    assert estimate(L8, j2, c2, p2, o2).iteration_ms == pytest.approx(est.iteration_ms)
    doc = json.loads(p.read_text())
    del doc["cluster"]["gpu_types"]["B200"]["compute_capability"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    _m, j3, c3, p3, o3, meta = load_plan(old)
    assert c3.nodes[0].gpu.compute_capability is None
    e3 = estimate(L8, j3, c3, p3, o3)
    assert e3.iteration_ms > est.iteration_ms  # Hopper's transposes: more bytes cast
    # a recipe the file's GPU does not run is the job's field
    doc = json.loads(p.read_text())
    doc["job"]["fp8_recipe"] = "blockwise"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(SpecError) as e:
        load_plan(bad)
    assert e.value.field == "job.fp8_recipe" and "blockwise" in str(e.value)


def test_solve_with_mxfp8_is_what_the_estimator_says(milp_path):
    from solvers.search import solve
    c = uniform_cluster(2, 4, "B200", 900.0, 50.0)
    job = JobSpec(global_batch=16, seq_length=2048, fp8=True, fp8_recipe="mxfp8")
    res = solve(L8, job, c, method="exact", time_limit_s=30, max_shapes=6)
    again = estimate(L8, job, c, res.plan)
    assert again.iteration_ms == pytest.approx(res.objective_ms, rel=1e-9)
    assert res.plan.shape.fp8


def test_refusals_name_the_recipes_the_cluster_runs(tmp_path):
    """A recipe a GPU does not run is refused with the recipes that GPU (or every GPU type of
    a mixed cluster) does run; with bf16,fp8 on GPUs without FP8 an explicit recipe is refused
    rather than dropped; a sweep refuses such a job when it loads."""
    from formats.sweepspec import load_spec
    from model.fp8 import cluster_recipe_problem, recipe_problem
    assert recipe_problem("mxfp8", H100).endswith("use delayed or tensorwise or blockwise")
    assert recipe_problem("blockwise", B200).endswith("use delayed or tensorwise or mxfp8")
    assert recipe_problem("mxfp8", B200) is None and recipe_problem("blockwise", H100) is None
    h, b = uniform_cluster(1, 8, "H100-SXM-80GB", 360.0, 50.0), uniform_cluster(
        1, 8, "B200", 900.0, 50.0)
    mixed = dataclasses.replace(h, nodes=h.nodes + tuple(
        dataclasses.replace(nd, name=f"b{i}") for i, nd in enumerate(b.nodes)),
        inter_gb_per_s=uniform_cluster(2, 8, "B200", 900.0, 50.0).inter_gb_per_s)
    why = cluster_recipe_problem(_job(fp8_recipe="blockwise"), mixed)
    assert why.endswith("use delayed or tensorwise")
    assert cluster_recipe_problem(_job(fp8_recipe="tensorwise"), mixed) is None
    from solvers.search import solve
    a100 = uniform_cluster(1, 8, "A100-80GB", 240.0, 25.0)
    open_fp8 = JobSpec(global_batch=16, seq_length=4096, fp8=None, fp8_recipe="mxfp8")
    with pytest.raises(SpecError, match="no plan here runs the mxfp8 recipe") as e:
        solve(L8, open_fp8, a100, time_limit_s=5)
    assert e.value.field == "--fp8-recipe"
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nname = "r"\nmethods = ["megatron"]\n[[models]]\n'
                    'name = "llama3-8b"\n[[jobs]]\nglobal_batch = 16\nseq_length = 1024\n'
                    'fp8 = true\nfp8_recipe = "mxfp8"\n[[clusters]]\n'
                    'synth = { num_nodes = [2], gpus_per_node = 8, seed = [0], '
                    'gpu = "H100-SXM-80GB" }\n')
    with pytest.raises(SpecError, match="MXFP8 runs on") as e:
        load_spec(spec)
    assert e.value.field == "jobs"


def test_outputs_name_the_recipe_and_what_does_not_apply(tmp_path):
    """estimate and solve name the FP8 recipe they priced (the table beside the shape, JSON
    under job); FP8 weights a plan cannot use are said by estimate --plan and by emit, and a
    Transformer Engine recipe emitted for torchtitan says it becomes torchao's Float8."""
    from typer.testing import CliRunner

    from cli import app
    from launch.emit import launch_set
    from model.plan import Plan
    runner = CliRunner()
    c = tmp_path / "b200.toml"
    r = runner.invoke(app, ["cluster", "synth", "--nodes", "2", "--gpu", "B200", "-o", str(c)])
    assert r.exit_code == 0, r.output
    args = ["estimate", "-m", "llama3-8b", "-c", str(c), "--tp", "2", "--precision", "fp8",
            "--fp8-recipe", "mxfp8", "--seq", "4096", "--gbs", "16"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0 and "fp8 (mxfp8)" in r.output, r.output
    r = runner.invoke(app, [*args, "--json"])
    assert json.loads(r.output)["job"]["fp8_recipe"] == "mxfp8"
    bc = uniform_cluster(2, 8, "B200", 900.0, 50.0)
    job = _job(fp8_recipe="mxfp8", fp8_param_gather=True)
    on = make_plan(L8, job, bc, tp=2, pp=1, sequence_parallel=True, distributed_optimizer=True)
    z3 = Plan(dataclasses.replace(on.shape, zero=3), on.placement)  # as a search may find
    warns = launch_set("megatron", L8, job, bc, z3, force=True).warnings
    assert any("[precision]" in w and "fp8_param_gather" in w for w in warns), warns
    pf = tmp_path / "z3.json"
    save_plan(pf, L8, job, bc, z3, estimate(L8, job, bc, z3))
    r = runner.invoke(app, ["estimate", "--plan", str(pf), "--json"])
    assert any("fp8_param_gather" in w for w in json.loads(r.output)["warnings"]), r.output
    tt = launch_set("torchtitan", L8, job, bc, on, force=True).warnings
    assert any("mxfp8 recipe is Transformer Engine's" in w for w in tt), tt
    assert any("FP8 weights" in w for w in tt), tt


def test_emit_says_when_a_node_may_span_several_hosts():
    """A node of more than 8 GPUs (an NVL72 rack modelled as one NVLink domain) gets a
    [placement] warning from emit: its launch files start one process group per node."""
    from launch.emit import launch_set
    rack = uniform_cluster(1, 72, "GB200", 720.0, 50.0)
    job = JobSpec(global_batch=72, seq_length=4096)
    plan = make_plan(L8, job, rack, tp=2, pp=1)
    warns = launch_set("megatron", L8, job, rack, plan, force=True).warnings
    assert any("[placement]" in w and "nodes of 72 GPUs" in w for w in warns), warns
    eight = uniform_cluster(9, 8, "GB200", 720.0, 50.0)
    plan8 = make_plan(L8, job, eight, tp=2, pp=1)
    assert not any("nodes of" in w for w in launch_set("megatron", L8, job, eight, plan8,
                                                        force=True).warnings)


@pytest.mark.parametrize("gpu,recipe,transpose", [("H100-SXM-80GB", "delayed", 2.0),
                                                  ("H100-SXM-80GB", "tensorwise", 2.0),
                                                  ("B200", "delayed", 0.0)])
def test_fp8_weights_are_cast_from_the_optimizers_shard(gpu, recipe, transpose):
    """With FP8 weights (fp8_param_gather) of a per-tensor recipe the optimizer casts only its
    fp32 shard (Megatron-Core fp8_utils.py _quantize_param_shard_impl: 4 bytes read, 1
    written), and the gathered weight gets the transpose Hopper needs (read 1, write 1); the
    whole weight's recast had been charged every step (2.1 ms of an H100 step). Without the
    flag, and for MXFP8 (gathered in 16 bits), the whole weight is recast as before."""
    from model.estimator import Evaluator
    m = presets.model("llama3-8b")
    c = uniform_cluster(8, 8, gpu, 360.0, 45.0)
    got = {}
    for gather in (False, True):
        job = JobSpec(global_batch=256, seq_length=4096, fp8=True, fp8_recipe=recipe,
                      fp8_param_gather=gather)
        plan = make_plan(m, job, c, tp=2, pp=1, distributed_optimizer=True)
        costs = Evaluator(m, job, c, plan.shape).costs
        got[gather] = costs.fp8_recast_bytes(c.nodes[0].gpu), plan.shape.shard_group
    (whole, _), (shard, d) = got[False], got[True]
    assert whole == fp8_bytes(job, presets.gpu(gpu)).weight_cast
    assert shard == pytest.approx(5.0 / d + transpose)
    mx = presets.gpu("B200")
    cb = uniform_cluster(8, 8, "B200", 360.0, 45.0)
    job = JobSpec(global_batch=256, seq_length=4096, fp8=True, fp8_recipe="mxfp8",
                  fp8_param_gather=True)
    plan = make_plan(m, job, cb, tp=2, pp=1, distributed_optimizer=True)
    assert Evaluator(m, job, cb, plan.shape).costs.fp8_recast_bytes(mx) == \
        fp8_bytes(job, mx).weight_cast
