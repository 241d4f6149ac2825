"""The interleaved schedule's micro-batch groups (Megatron-LM
--microbatch-group-size-per-virtual-pipeline-stage, PyTorch's rounds) and the pipeline rules of
torchtitan's runtime, through the chain: plan validation, search space, cost model, emitted
arguments, plan files and Megatron-LM logs. The schedule graph itself is checked against a
replay of Megatron-LM's calls in tests/test_schedule.py."""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from formats import presets
from formats.clusters import uniform_cluster
from formats.logs import megatron_arg_blocks
from formats.planfile import load_plan, save_plan
from launch.emit import megatron_args, nemo_config, bridge_recipe
from model.errors import SpecError
from model.estimator import Evaluator, estimate, make_plan
from model.plan import (interleave_group, megatron_group_problem, megatron_least_group,
                        num_microbatches, torch_interleave_group)
from model.schedule import stage_order
from model.specs import JobSpec, Options
from solvers.space import SearchSpace, enumerate_shapes

LOGS = Path(__file__).parent / "fixtures" / "logs"


@pytest.fixture(scope="module")
def llama():
    return presets.model("llama2-70b")


@pytest.fixture(scope="module")
def c64():
    return uniform_cluster(8, 8, "H100-SXM-80GB", 360.0, 50.0)


def test_megatrons_group_rules():
    """schedules.py forward_backward_pipelining_with_interleaving: the group lies within
    [PP, M], and the last group (M mod N) is empty or at least PP; its docstring's example
    (PP 2, groups of 3, 5 micro-batches) is valid and ordered as it prints it."""
    assert megatron_group_problem(2, 5, 3) is None
    assert [mb for k, mb, c in stage_order("interleaved", 2, 5, 2, 0, 3) if k == "F"] == \
        [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert "last group of 2" in megatron_group_problem(4, 10, 4)
    assert megatron_group_problem(4, 10, 5) is None
    assert megatron_group_problem(4, 10, 6) is None  # 10 = 6 + 4, the last group PP
    assert "last group of 3" in megatron_group_problem(4, 10, 7)
    assert "within" in megatron_group_problem(4, 10, 11)
    assert "within" in megatron_group_problem(4, 10, 3)
    assert [megatron_least_group(4, m) for m in (8, 10, 9, 3, 13)] == [4, 5, 5, None, 7]


def test_pytorch_rounds():
    """ScheduleInterleaved1F1B: max(1, M // PP) rounds of M / rounds micro-batches, refused
    unless the rounds divide M (its docstring's examples: PP 4 with 10 and with 3)."""
    assert torch_interleave_group(4, 10) == (5, None)
    assert torch_interleave_group(4, 3) == (3, None)
    assert torch_interleave_group(4, 8) == (4, None)
    assert torch_interleave_group(4, 9)[1] is not None


def test_plans_get_the_group_their_framework_runs(llama, c64):
    """Megatron-LM: PP by default, refused where that leaves a short last group, with the
    smallest valid group named; torchtitan: PyTorch's rounds, nothing to set; no group on
    another schedule."""
    job = JobSpec(global_batch=20, seq_length=4096)  # DP 2: 10 micro-batches
    with pytest.raises(SpecError) as e:
        make_plan(llama, job, c64, tp=8, pp=4, dp=2, schedule="interleaved", chunks=2)
    assert e.value.field == "micro_batch" and "give mb_group 5" in e.value.problem
    for n in (5, 6):
        plan = make_plan(llama, job, c64, tp=8, pp=4, dp=2, schedule="interleaved", chunks=2,
                         mb_group=n)
        assert interleave_group(job, plan.shape, 10) == n
    with pytest.raises(SpecError) as e:
        make_plan(llama, job, c64, tp=8, pp=4, dp=2, schedule="interleaved", chunks=2,
                  mb_group=7)
    assert e.value.field == "mb_group"
    with pytest.raises(SpecError) as e:
        make_plan(llama, job, c64, tp=8, pp=4, dp=2, mb_group=5)
    assert e.value.field == "mb_group"
    tt = dataclasses.replace(job, framework="torchtitan")
    plan = make_plan(llama, tt, c64, tp=8, pp=4, dp=2, zero=3, schedule="interleaved",
                     chunks=2, sequence_parallel=True)
    assert interleave_group(tt, plan.shape, 10) == 5
    with pytest.raises(SpecError) as e:
        make_plan(llama, tt, c64, tp=8, pp=4, dp=2, zero=3, schedule="interleaved", chunks=2,
                  sequence_parallel=True, mb_group=6)
    assert e.value.field == "mb_group" and "groups of 5" in e.value.problem
    for gbs, field in ((18, "micro_batch"), (6, "micro_batch")):  # 9 rounds-refused; 3 < PP
        with pytest.raises(SpecError) as e:
            make_plan(llama, dataclasses.replace(tt, global_batch=gbs), c64, tp=8, pp=4, dp=2,
                      zero=3, schedule="interleaved", chunks=2, sequence_parallel=True)
        assert e.value.field == field


def test_torchtitan_pipeline_rules(llama, c64):
    """PyTorch's Schedule1F1B refuses fewer micro-batches than stages; its interleaved runtime
    re-gathers FSDP chunks beyond 3 per rank (not priced: refused) and never blocks on a send
    (priced overlapped whatever the option says)."""
    tt = JobSpec(global_batch=4, seq_length=8192, framework="torchtitan")
    with pytest.raises(SpecError) as e:
        make_plan(llama, tt, c64, tp=8, pp=4, dp=2, zero=3, sequence_parallel=True)
    assert e.value.field == "micro_batch" and "PyTorch's 1F1B" in e.value.problem
    tt = dataclasses.replace(tt, global_batch=64)
    with pytest.raises(SpecError) as e:
        make_plan(llama, tt, c64, tp=8, pp=4, dp=2, zero=3, sequence_parallel=True,
                  schedule="interleaved", chunks=4)
    assert e.value.field == "chunks"
    plan = make_plan(llama, tt, c64, tp=8, pp=4, dp=2, zero=3, sequence_parallel=True,
                     schedule="interleaved", chunks=2)
    blocked = Evaluator(llama, tt, c64, plan.shape, Options(blocking_p2p=True))
    assert not blocked.cs.blocking
    assert estimate(llama, tt, c64, plan, Options(blocking_p2p=True)).iteration_ms == \
        estimate(llama, tt, c64, plan, Options(blocking_p2p=False)).iteration_ms
    mg = dataclasses.replace(tt, framework="megatron")
    mplan = make_plan(llama, mg, c64, tp=8, pp=4, dp=2, schedule="interleaved", chunks=2)
    assert Evaluator(llama, mg, c64, mplan.shape, Options(blocking_p2p=True)).cs.blocking


def test_search_gives_megatron_shapes_the_least_group(llama, c64):
    """Where PP does not divide the micro-batches, the search's interleaved shapes carry the
    smallest group Megatron-LM runs (they had been left out); torchtitan's carry none."""
    job = JobSpec(global_batch=40, seq_length=4096)
    space = SearchSpace(tp=(8,), pp=(3, 4), micro_batch=(1,), recompute=("full",))
    inter = [sh for sh in enumerate_shapes(llama, job, c64, space)
             if sh.schedule == "interleaved"]
    groups = {(sh.pp, sh.dp): sh.mb_group for sh in inter}
    # PP 4, DP 2: 20 micro-batches (groups of PP); PP 3 does not divide 64 GPUs / 8
    assert groups == {(4, 2): 0}
    job = JobSpec(global_batch=30, seq_length=4096)  # DP 2: 15 micro-batches over PP 4
    inter = [sh for sh in enumerate_shapes(llama, job, c64, space)
             if sh.schedule == "interleaved"]
    assert {sh.mb_group for sh in inter if sh.pp == 4} == {megatron_least_group(4, 15)} == {5}
    for sh in inter:
        est = estimate(llama, job, c64, make_plan(
            llama, job, c64, tp=sh.tp, pp=sh.pp, dp=sh.dp, micro_batch=1,
            schedule="interleaved", chunks=sh.chunks, mb_group=sh.mb_group,
            recompute="full", zero=sh.zero))
        assert est.iteration_ms > 0


def test_emitted_group_and_its_read_back(llama, c64, tmp_path):
    """The group reaches Megatron-LM's arguments (Megatron-Core 0.10 on), NeMo's and Bridge's
    model config, and a plan file, only where it is not PP; Megatron-LM's printed arguments
    read back as the plan, and a log of another group is named as a mismatch."""
    from formats.megatron_args import megatron_args_mismatch, plan_from_megatron_args
    job = JobSpec(global_batch=20, seq_length=4096)
    plan = make_plan(llama, job, c64, tp=8, pp=4, dp=2, schedule="interleaved", chunks=2,
                     mb_group=5)
    args = megatron_args(llama, job, plan)[0]
    i = args.index("--microbatch-group-size-per-virtual-pipeline-stage")
    assert args[i + 1] == "5"
    assert nemo_config(llama, job, c64, plan)[0]["model"][
        "microbatch_group_size_per_vp_stage"] == 5
    assert bridge_recipe(llama, job, c64, plan)[0]["model"][
        "microbatch_group_size_per_vp_stage"] == 5
    even = make_plan(llama, dataclasses.replace(job, global_batch=16), c64, tp=8, pp=4, dp=2,
                     schedule="interleaved", chunks=2)
    assert "--microbatch-group-size-per-virtual-pipeline-stage" not in \
        megatron_args(llama, job, even)[0]
    est = estimate(llama, job, c64, plan)
    save_plan(tmp_path / "p.json", llama, job, c64, plan, est)
    _m, _j, _c, back, _o, _meta = load_plan(tmp_path / "p.json")
    assert back.shape == plan.shape
    doc = json.loads((tmp_path / "p.json").read_text())
    del doc["plan"]["shape"]["mb_group"]  # written before the field: Megatron's default
    (tmp_path / "old.json").write_text(json.dumps(doc))
    with pytest.raises(SpecError) as e:  # PP's groups leave a short last group
        load_plan(tmp_path / "old.json")
    assert "mb_group" in e.value.problem
    # Megatron-LM's printed arguments (the fixture of tests/test_calibration.py, 256 sequences
    # over DP 2 -> 128 micro-batches) with 250 sequences, interleaved, groups of 5
    text = (LOGS / "megatron_args_70b.txt").read_text()

    def put(t, name, value):
        out, n = re.subn(rf"(?m)^  {name} \.* ?.*$",
                         f"  {name} {'.' * (48 - len(name))} {value}", t)
        assert n == 1, name
        return out
    text = put(put(put(text, "global_batch_size", 250), "virtual_pipeline_model_parallel_size",
                   2), "microbatch_group_size_per_vp_stage", 5)
    ex = uniform_cluster(8, 8, "A100-80GB", 240.0, 25.0)
    printed = megatron_arg_blocks(text)[0]
    m, j, p = plan_from_megatron_args(printed, ex, source="t")[:3]
    assert (num_microbatches(j, p.shape), p.shape.chunks, p.shape.mb_group) == (125, 2, 5)
    assert megatron_args_mismatch(m, j, p, printed) == []
    other = dataclasses.replace(p, shape=dataclasses.replace(p.shape, mb_group=25))
    assert megatron_args_mismatch(m, j, other, printed) == [
        ("microbatch_group_size_per_vp_stage", "5", "25")]


def test_deepspeed_sends_one_call_at_a_time(llama, c64):
    """Each framework's 1F1B calls are priced: DeepSpeed's pipeline engine one call per
    transfer, PyTorch's (torchtitan) asynchronous warm-up and cool-down sends, Megatron-LM's
    batched steady state (tests/test_schedule.py replays each against its graph); an
    overlapped estimate none of them."""
    for fw, style, zero in (("deepspeed", "deepspeed", 1), ("megatron", "megatron", 1),
                            ("torchtitan", "torch", 3)):
        job = JobSpec(global_batch=64, seq_length=4096, framework=fw, precision="bf16")
        plan = make_plan(llama, job, c64, tp=8, pp=4, dp=2, zero=zero, recompute="full",
                         sequence_parallel=fw == "torchtitan")
        assert Evaluator(llama, job, c64, plan.shape).cs.p2p == style
        assert Evaluator(llama, job, c64, plan.shape,
                         Options(blocking_p2p=False)).cs.p2p == "megatron"
    tt = JobSpec(global_batch=64, seq_length=4096, framework="torchtitan")
    gp = make_plan(llama, tt, c64, tp=8, pp=4, dp=2, zero=3, recompute="full",
                   sequence_parallel=True, schedule="gpipe")
    assert Evaluator(llama, tt, c64, gp.shape).cs.p2p == "torch"  # ScheduleGPipe's calls


def test_other_frameworks_emits_of_a_grouped_plan(llama, c64):
    """A Megatron-LM plan in micro-batch groups emitted for DeepSpeed is judged as its 1F1B
    runs it (it had been refused for its group), and for torchtitan says that PyTorch runs
    its own groups, or refuses them."""
    from launch.emit import launch_set, torchtitan_config
    job = JobSpec(global_batch=20, seq_length=4096)
    plan = make_plan(llama, job, c64, tp=8, pp=4, dp=2, schedule="interleaved", chunks=2,
                     mb_group=5, layers=(11, 9, 10, 10, 10, 10, 10, 10))
    ds = launch_set("deepspeed", llama, job, c64, plan, force=True)
    assert any("[split]" in w or "[memory]" in w for w in ds.warnings), ds.warnings
    warn = torchtitan_config(llama, job, c64, plan)[1]
    assert not any("groups of" in w for w in warn)  # PyTorch's rounds are 2 of 5 here too
    ten = make_plan(llama, job, c64, tp=8, pp=4, dp=2, schedule="interleaved", chunks=2,
                    mb_group=10)
    warn = torchtitan_config(llama, job, c64, ten)[1]
    assert any("[schedule]" in w and "runs groups of 5" in w for w in warn), warn


def test_the_search_can_take_one_group_of_every_micro_batch(llama, c64):
    """SearchSpace.mb_groups: "whole" adds, beside the smallest group, one group of every
    micro-batch on Megatron-LM's stack (not torchtitan's, whose rounds are PyTorch's); the
    default search looks at those shapes beyond its space (solvers.search._beyond_groups)."""
    from solvers.search import _beyond_groups
    space = SearchSpace(tp=(8,), pp=(4,), micro_batch=(1,), recompute=("full",))
    both = dataclasses.replace(space, mb_groups=("smallest", "whole"))
    for gbs, groups in ((30, {5, 15}), (32, {0, 16})):  # 15 and 16 micro-batches over DP 2
        job = JobSpec(global_batch=gbs, seq_length=4096)
        got = {sh.mb_group for sh in enumerate_shapes(llama, job, c64, both)
               if sh.schedule == "interleaved"}
        assert got == groups, (gbs, got)
        assert {sh.mb_group for sh in enumerate_shapes(llama, job, c64, space)
                if sh.schedule == "interleaved"} == groups - {15, 16}
        labels = [b.label for b, *_ in _beyond_groups(job, c64, space)]
        assert any(x.startswith("interleaved in one micro-batch group") for x in labels)
        assert not any(x.startswith("interleaved in one") for x in
                       (b.label for b, *_ in _beyond_groups(job, c64, both)))
    tt = JobSpec(global_batch=30, seq_length=4096, framework="torchtitan")
    assert {sh.mb_group for sh in enumerate_shapes(llama, tt, c64, both)
            if sh.schedule == "interleaved"} <= {0}


def test_what_a_framework_cannot_run_is_refused_everywhere(llama, c64, tmp_path):
    """DeepSpeed's overlapped sends are refused in a plan file as on the command line; the
    micro-batch groups' search option for torchtitan and DeepSpeed, whose schedules have no
    such setting, is refused rather than ignored, and neither is offered it beyond its
    search."""
    from typer.testing import CliRunner

    from cli import app
    from solvers.search import _beyond_groups
    job = JobSpec(global_batch=64, seq_length=4096, framework="deepspeed", precision="bf16")
    plan = make_plan(llama, job, c64, tp=8, pp=4, dp=2, zero=1, recompute="full")
    save_plan(tmp_path / "ds.json", llama, job, c64, plan, estimate(llama, job, c64, plan))
    doc = json.loads((tmp_path / "ds.json").read_text())
    doc["options"]["blocking_p2p"] = False
    (tmp_path / "ds.json").write_text(json.dumps(doc))
    with pytest.raises(SpecError) as e:
        load_plan(tmp_path / "ds.json")
    assert e.value.field == "options.blocking_p2p"
    for fw in ("torchtitan", "deepspeed"):
        r = CliRunner().invoke(app, ["solve", "--framework", fw, "--mb-groups", "whole",
                                     "--time-limit", "2"])
        assert r.exit_code == 2 and "--mb-groups" in r.output, r.output
        labels = [b.label for b, *_ in _beyond_groups(
            dataclasses.replace(job, framework=fw), c64, SearchSpace())]
        assert not any(x.startswith("interleaved in one") for x in labels), labels
