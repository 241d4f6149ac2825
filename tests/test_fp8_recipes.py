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
    for cluster, recipe, says in ((c_h, "mxfp8", "B200"), (c_amd, "mxfp8", "none listed"),
                                  (c_b, "blockwise", "use mxfp8"),
                                  (c_amd, "blockwise", "use delayed")):
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


def test_solve_with_mxfp8_is_what_the_estimator_says(milp_path):
    from solvers.search import solve
    c = uniform_cluster(2, 4, "B200", 900.0, 50.0)
    job = JobSpec(global_batch=16, seq_length=2048, fp8=True, fp8_recipe="mxfp8")
    res = solve(L8, job, c, method="exact", time_limit_s=30, max_shapes=6)
    again = estimate(L8, job, c, res.plan)
    assert again.iteration_ms == pytest.approx(res.objective_ms, rel=1e-9)
    assert res.plan.shape.fp8
