"""Plan files: a round trip gives the same estimate; damaged files give one clear line, exit 2."""

import json

import pytest
from typer.testing import CliRunner

from cli import app
from formats import presets
from formats.clusters import cluster
from model.errors import SpecError
from model.estimator import estimate, make_plan
from model.plan import block_placement
from formats.planfile import SCHEMA_VERSION, load_plan, save_plan
from model.specs import JobSpec, Options, Overheads

runner = CliRunner()


def _close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


@pytest.fixture(scope="module")
def setup():
    m = presets.model("llama2-70b")
    c = cluster("example")
    job = JobSpec(global_batch=64, seq_length=4096, precision="bf16")
    return m, c, job


def _plans(m, c, job):
    yield make_plan(m, job, c, tp=8, pp=4, recompute="full"), None
    yield make_plan(m, job, c, tp=4, pp=4, dp=4, schedule="interleaved", chunks=2,
                    recompute="selective", sequence_parallel=True, distributed_optimizer=True,
                    overlap_grad_reduce=True, overlap_param_gather=True, tp_comm_overlap=True,
                    fp8=False), None
    pl = block_placement(c, 8, 4, 2, 1, node_order=[3, 1, 0, 2, 7, 6, 5, 4])
    yield make_plan(m, job, c, tp=8, pp=4, layers=(19, 21, 21, 19), placement=pl,
                    recompute="full"), Options(blocking_p2p=False,
                                               overheads=Overheads(context_gib=3.0))


def test_round_trip_same_estimate(setup, tmp_path):
    m, c, job = setup
    for k, (plan, opts) in enumerate(_plans(m, c, job)):
        est = estimate(m, job, c, plan, opts)
        path = tmp_path / f"p{k}.json"
        solver = {"method": "milp", "termination": "optimal", "objective_ms": est.iteration_ms,
                  "bound_ms": est.iteration_ms, "gap": 0.0, "wall_s": 1.5}
        save_plan(path, m, job, c, plan, est, solver, opts)
        doc = json.loads(path.read_text())
        assert doc["schema_version"] == SCHEMA_VERSION
        assert {"model", "job", "options", "cluster", "plan", "estimate", "solver"} <= set(doc)
        assert len(doc["cluster"]["inter"]["gb_per_s"]) == c.num_nodes
        m2, j2, c2, p2, o2, meta = load_plan(path)
        assert p2 == plan and m2 == m
        assert o2 == (opts or Options())
        e2 = estimate(m2, j2, c2, p2, o2)
        assert _close(e2.iteration_ms, est.iteration_ms)
        assert _close(e2.peak_memory_gib, est.peak_memory_gib)
        for s1, s2 in zip(est.stages, e2.stages):
            assert _close(s1.memory.total_gib, s2.memory.total_gib)
        assert _close(meta["estimate"]["iteration_ms"], est.iteration_ms)
        assert meta["solver"]["method"] == "milp"


def test_cli_plan_round_trip(setup, tmp_path):
    path = tmp_path / "p.json"
    r = runner.invoke(app, ["estimate", "--recompute", "full", "--gbs", "64",
                            "--save-plan", str(path), "--json"])
    assert r.exit_code == 0, r.output
    first = json.loads(r.output)
    r = runner.invoke(app, ["estimate", "--plan", str(path), "--json"])
    assert r.exit_code == 0, r.output
    again = json.loads(r.output)
    assert _close(again["estimate"]["iteration_ms"], first["estimate"]["iteration_ms"])
    assert again["plan"] == first["plan"]
    r = runner.invoke(app, ["estimate", "--plan", str(path), "--tp", "4"])
    assert r.exit_code == 2
    assert "--tp cannot be combined with --plan" in r.output
    # job options too (these four were once taken silently and ignored)
    for opt in (["--grad-reduce-in-bf16"], ["--fp8-param-gather"], ["--no-compile"],
                ["--fused-loss"],
                ["--fp8-recipe", "tensorwise"],
                ["--moe-capacity-factor", "1.5"], ["--ep", "2"]):
        r = runner.invoke(app, ["estimate", "--plan", str(path), *opt])
        assert r.exit_code == 2, (opt, r.output)
        assert f"{opt[0]} cannot be combined with --plan" in r.output, r.output
    r = runner.invoke(app, ["emit", str(path), "--framework", "megatron",
                            "--out", str(tmp_path / "mg"), "--json"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "mg" / "megatron_args.txt").exists()


def _corrupt(src, dst, fn):
    d = json.loads(src.read_text())
    fn(d)
    dst.write_text(json.dumps(d))


def _refused_after(setup, tmp_path, mutate):
    """(the file, the SpecError) of a saved plan file changed by `mutate`, which must be
    refused."""
    m, c, job = setup
    plan = make_plan(m, job, c, tp=8, pp=4)
    good = tmp_path / "good.json"
    save_plan(good, m, job, c, plan, estimate(m, job, c, plan))
    bad = tmp_path / "bad.json"
    _corrupt(good, bad, mutate)
    with pytest.raises(SpecError) as e:
        load_plan(bad)
    return bad, e


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.update(schema_version=1), "schema_version: version 1 is not supported"),
    (lambda d: d.pop("schema_version"), "schema_version: missing"),
    (lambda d: d["model"].pop("hidden_size"), "model.hidden_size: missing"),
    (lambda d: d["job"].update(precision="fp8"), "job.precision: unknown precision 'fp8'"),
    # a wrong type names its field once (".json: job.compile", not "job.job.compile")
    (lambda d: d["job"].update(compile="yes"), ".json: job.compile: must be true or false"),
    (lambda d: d["job"].update(compile_loss=True),
     ".json: job.compile_loss: compile_loss is torchtitan's"),
    (lambda d: d["job"].update(repeat_kv=True), ".json: job.repeat_kv: repeat_kv is torchtitan's"),
    (lambda d: d["options"]["overheads"].update(fragmentation="x"),
     ".json: options.overheads.fragmentation: must be a number"),
    (lambda d: d["cluster"]["gpu_types"]["A100-80GB"].update(sm_count=1.5),
     ".json: cluster.gpu_types.A100-80GB.sm_count: must be an integer"),
    (lambda d: d["plan"]["shape"].update(tp="8"), "plan.shape.tp: must be an integer"),
    (lambda d: d["plan"]["shape"].update(tp=3), "plan.shape.tp"),
    (lambda d: d["plan"]["placement"].pop(), "plan.placement: stage"),
    (lambda d: d["plan"]["placement"][0].update(node="nowhere"),
     "plan.placement[0].node: unknown node 'nowhere'"),
    (lambda d: d["cluster"]["inter"]["gb_per_s"].pop(), "cluster.inter.gb_per_s: must be a"),
    (lambda d: d["cluster"]["nodes"][0].update(gpu="B999"), "cluster.nodes[0].gpu"),
    (lambda d: d["cluster"]["gpu_types"]["A100-80GB"].update(gemm_efficiency=2.0),
     "cluster.gpu_types.A100-80GB.gemm_efficiency"),
    # a GPU given to two rows names both rows and the field (it had said "replica" of an
    # internal column, under "plan.placement.placement"); a field schema 3 always writes is
    # refused when left out; the distributed optimizer against the ZeRO stage
    (lambda d: d["plan"]["placement"][1].update(node=d["plan"]["placement"][0]["node"]),
     "plan.placement[1].gpus: GPU 0 on"),
    (lambda d: d["plan"]["placement"][0].update(gpus=[0] * 8),
     "plan.placement[0].gpus: GPU 0 on"),
    (lambda d: d["plan"]["placement"][0]["gpus"].__setitem__(0, 9),
     "plan.placement[0].gpus: GPU 9 is not on"),
    (lambda d: d["plan"]["shape"].pop("cp"), "plan.shape.cp: missing; schema 3 writes every "
     "shape field: add it (1 for a plan without it)"),

    (lambda d: d["plan"]["shape"].update(zero=1, distributed_optimizer=False),
     "plan.shape.distributed_optimizer: False beside zero 1"),
    # what the commands refuse for a dense model (it had been read)
    (lambda d: d["job"].update(moe_capacity_factor=2.0),
     "job.moe_capacity_factor: 2 on llama2-70b, which is dense"),
    (lambda d: d["plan"]["shape"].update(zero=5, distributed_optimizer=False),
     "plan.shape.zero: ZeRO stage must be 0, 1, 2 or 3, got 5"),
])
def test_corrupted_plan_one_line_exit_2(setup, tmp_path, mutate, needle):
    bad, e = _refused_after(setup, tmp_path, mutate)
    assert str(bad) in str(e.value) and needle in str(e.value), str(e.value)
    r = runner.invoke(app, ["estimate", "--plan", str(bad)])
    assert r.exit_code == 2
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]


def test_cp_rank_is_required_under_context_parallelism(setup, tmp_path):
    """A placement row without its CP rank under CP had been read as CP rank 0 (accepted on
    row 0, a puzzling 'listed twice' on row 1)."""
    m, c, job = setup
    plan = make_plan(m, job, c, tp=8, pp=2, cp=2, sequence_parallel=True)
    good = tmp_path / "good.json"
    save_plan(good, m, job, c, plan, estimate(m, job, c, plan))
    for k in (0, 1):
        bad = tmp_path / f"bad{k}.json"
        _corrupt(good, bad, lambda d: d["plan"]["placement"][k].pop("cp_rank"))
        with pytest.raises(SpecError) as e:
            load_plan(bad)
        assert f"plan.placement[{k}].cp_rank: missing" in str(e.value), str(e.value)


def test_truncated_and_missing_files(setup, tmp_path):
    m, c, job = setup
    plan = make_plan(m, job, c, tp=8, pp=4)
    good = tmp_path / "good.json"
    save_plan(good, m, job, c, plan, estimate(m, job, c, plan))
    bad = tmp_path / "trunc.json"
    bad.write_text(good.read_text()[:500])
    for path, needle in ((bad, "not valid JSON"), (tmp_path / "none.json", "file not found")):
        r = runner.invoke(app, ["emit", str(path)])
        assert r.exit_code == 2
        assert r.output.strip().count("\n") == 0 and needle in r.output and str(path) in r.output


def test_plan_file_keeps_fp8_param_gather(tmp_path):
    """The job's FP8 weights and scaling recipe survive a round trip, with the memory and
    time they imply."""
    m = presets.model("llama3-8b")
    from formats.clusters import uniform_cluster
    c = uniform_cluster(1, 8, "H100-SXM-80GB", 360.0, 50.0)
    job = JobSpec(global_batch=16, seq_length=4096, fp8=True, fp8_param_gather=True,
                  fp8_recipe="tensorwise")
    plan = make_plan(m, job, c, tp=8, pp=1, sequence_parallel=True, distributed_optimizer=True)
    est = estimate(m, job, c, plan)
    save_plan(tmp_path / "p.json", m, job, c, plan, est)
    _m, j2, c2, p2, o2, _meta = load_plan(tmp_path / "p.json")
    assert j2.fp8_param_gather is True and j2.fp8_recipe == "tensorwise" and p2 == plan
    e2 = estimate(m, j2, c2, p2, o2)
    assert _close(e2.peak_memory_gib, est.peak_memory_gib)
    assert _close(e2.iteration_ms, est.iteration_ms)


def test_plan_file_carries_the_fp8_rate_used_and_says_when_its_estimate_moved(tmp_path):
    """A plan file writes the FP8 GEMM fraction its estimate used (the GPU's own, or
    FP8_GEMM_RATIO x its bf16 one: null had changed meaning), so it reads back to the same
    estimate; and where this version's estimate of a file differs from the one recorded (a
    file written before a cost-model change), estimate --plan and emit say so (an older file
    had been re-estimated 18.9% slower without a word)."""
    from formats.clusters import uniform_cluster
    from model.specs import FP8_GEMM_RATIO

    m = presets.model("llama3-8b")
    c = uniform_cluster(1, 8, "H100-SXM-80GB", 360.0, 50.0)
    job = JobSpec(global_batch=16, seq_length=4096, fp8=True)
    plan = make_plan(m, job, c, tp=8, pp=1, sequence_parallel=True, distributed_optimizer=True)
    est = estimate(m, job, c, plan)
    p = tmp_path / "p.json"
    save_plan(p, m, job, c, plan, est)
    doc = json.loads(p.read_text())
    g = doc["cluster"]["gpu_types"]["H100-SXM-80GB"]
    assert g["fp8_gemm_efficiency"] == pytest.approx(FP8_GEMM_RATIO * g["gemm_efficiency"])
    r = runner.invoke(app, ["estimate", "--plan", str(p), "--json"])
    assert r.exit_code == 0 and not [w for w in json.loads(r.output)["warnings"]
                                     if "records" in w], r.output
    doc["estimate"]["iteration_ms"] *= 0.8
    # written by this very version, the cost model has not changed: the numbers were edited
    same = tmp_path / "same.json"
    same.write_text(json.dumps(doc))
    r = runner.invoke(app, ["estimate", "--plan", str(same), "--json"])
    said = [w for w in json.loads(r.output)["warnings"] if "records" in w]
    assert said and "+25.0%" in said[0] and "the recorded estimate was edited" in said[0]
    assert "the cost model has changed" not in said[0]
    # written with another cost model (its revision recorded), or before revisions were
    # recorded: the version string stays 0.1.0 across cost-model changes, so only the
    # revision tells (a file from an earlier build had been called edited)
    doc["cost_model_revision"] = "0123456789ab"
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    r = runner.invoke(app, ["estimate", "--plan", str(old), "--json"])
    said = [w for w in json.loads(r.output)["warnings"] if "records" in w]
    assert said and "+25.0%" in said[0] and "the cost model has changed" in said[0]
    assert "revision 0123456789ab" in said[0]
    del doc["cost_model_revision"]
    (tmp_path / "older.json").write_text(json.dumps(doc))
    r = runner.invoke(app, ["estimate", "--plan", str(tmp_path / "older.json"), "--json"])
    said = [w for w in json.loads(r.output)["warnings"] if "records" in w]
    assert said and "before plan files recorded the cost model's revision" in said[0]
    r = runner.invoke(app, ["emit", str(old), "--out", str(tmp_path / "e"), "--json"])
    assert r.exit_code == 0 and any("+25.0%" in w for w in json.loads(r.output)["warnings"])
    # a recorded number that is not one is said (an edited "abc" or -5 had turned the
    # comparison off without a word); a schema version 3.0 is not the integer 3
    for bad in ("abc", -5, None):
        doc["estimate"]["iteration_ms"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(doc))
        r = runner.invoke(app, ["estimate", "--plan", str(tmp_path / "bad.json"), "--json"])
        said = [w for w in json.loads(r.output)["warnings"] if "records" in w]
        assert said and "estimate.iteration_ms" in said[0] and "cannot be compared" in said[0]
    doc["schema_version"] = 3.0
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    r = runner.invoke(app, ["estimate", "--plan", str(tmp_path / "bad.json")])
    assert r.exit_code == 2 and "schema_version" in r.output


@pytest.mark.parametrize("drop,field", [
    (lambda d: d["options"].pop("overheads"), "options.overheads"),
    (lambda d: d.pop("options"), "options"),
    (lambda d: d["job"].pop("fused_loss"), "job.fused_loss"),
    (lambda d: d["cluster"].pop("intra_latency_us"), "cluster.intra_latency_us"),
    (lambda d: d["options"]["overheads"].pop("fragmentation"), "options.overheads.fragmentation")])
def test_a_field_schema_3_writes_is_refused_when_missing_and_said_in_schema_2(setup, tmp_path,
                                                                             drop, field):
    """A field that changes the estimate, missing from a schema 3 file (which writes it), is
    refused as plan.shape.etp is; missing from a schema 2 file, which may predate it, it is
    read as its default and the commands say so (both had been read as defaults without a
    word)."""
    bad, e = _refused_after(setup, tmp_path, drop)
    assert e.value.field == field and "missing; schema 3 writes it" in e.value.problem
    old = tmp_path / "old.json"
    _corrupt(bad, old, lambda d: d.update(schema_version=2))
    assert load_plan(old)[5]["read_notes"]
    for args in (["estimate", "--plan", str(old), "--json"],
                 ["emit", str(old), "--out", str(tmp_path / "e"), "--json", "--force"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        said = [w for w in json.loads(r.output)["warnings"] if " lacks " in w]
        assert said and field in said[0] and "read as these defaults" in said[0], said
    assert not load_plan(tmp_path / "good.json")[5]["read_notes"]


def test_a_plan_with_a_byte_order_mark_reads_and_a_toml_is_named(setup, tmp_path):
    """A plan file saved with a UTF-8 byte-order mark reads as without one; a TOML file given
    for a plan is said to be one (both had been 'not valid JSON ...; the file is damaged')."""
    m, c, job = setup
    plan = make_plan(m, job, c, tp=8, pp=4)
    good = tmp_path / "good.json"
    save_plan(good, m, job, c, plan, estimate(m, job, c, plan))
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + good.read_bytes())
    assert load_plan(bom)[3] == plan
    toml = tmp_path / "cluster.toml"
    toml.write_text('name = "x"\n[[nodes]]\nname = "a"\n')
    r = runner.invoke(app, ["emit", str(toml)])
    assert r.exit_code == 2 and "is a TOML file, not a plan file" in r.output, r.output


def test_a_schema_3_file_from_before_the_newer_fields_reads_with_their_defaults(setup,
                                                                              tmp_path):
    """A schema 3 file written before job.p2p_scatter_gather and the `emitted` record existed
    reads, the missing field as its default and said so (it had been refused: 'missing;
    schema 3 writes it', every earlier plan file with it)."""
    m, c, job = setup
    plan = make_plan(m, job, c, tp=8, pp=4)
    good = tmp_path / "good.json"
    save_plan(good, m, job, c, plan, estimate(m, job, c, plan))
    old = tmp_path / "old.json"
    _corrupt(good, old, lambda d: (d["job"].pop("p2p_scatter_gather"), d.pop("emitted")))
    _m, got_job, _c, got, _o, meta = load_plan(old)
    assert got == plan and not got_job.p2p_scatter_gather and meta["emitted"] is None
    assert "job.p2p_scatter_gather false" in meta["read_notes"][0]


def test_an_older_megatron_fsdp_zero2_plan_reads_with_the_overlap_it_runs(setup, tmp_path):
    """A Megatron-FSDP ZeRO-2 plan saved before 2026-12-07 says overlap_grad_reduce false,
    which Megatron-FSDP never runs: it reads with the overlap, and says so (it had been
    refused with advice about command-line flags)."""
    m, c, job = setup
    plan = make_plan(m, job, c, tp=8, pp=1, zero=2)
    assert plan.shape.overlap_grad_reduce
    good = tmp_path / "good.json"
    save_plan(good, m, job, c, plan, estimate(m, job, c, plan))
    old = tmp_path / "old.json"
    _corrupt(good, old, lambda d: d["plan"]["shape"].update(overlap_grad_reduce=False))
    _m, _job, _c, got, _o, meta = load_plan(old)
    assert got == plan
    assert any("overlap_grad_reduce true (Megatron-FSDP" in n for n in meta["read_notes"])
