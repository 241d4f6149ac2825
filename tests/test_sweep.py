"""Research sweeps: task ids, a store that survives SIGKILL, reruns that skip what is done,
the local pool and (where installed) Ray giving the same results, the report."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from formats.planfile import cost_model_revision
from formats.results import Store, report
from model.errors import SpecError
from formats.sweepspec import build_inputs, load_spec
from solvers.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
# tiny tasks: a 4-layer model on 2-node clusters; every method usually ends by its own
# criterion (exact proves these small instances; the annealer runs a fixed number of moves;
# megatron is the screening's best), and the budgets are in work seconds, so that also a task
# its budget stops (a loaded machine made one differ between Ray and the pool when budgets
# were wall seconds) gives the same result on any executor
SPEC = """
[sweep]
name = "tiny"
methods = ["exact", "anneal", "megatron", "amp-style"]
budgets = [1.0, 2.0]
seeds = [0]
clock = "work"
anneal_moves = 300
[[models]]
name = "{model}"
[[jobs]]
global_batch = 16
seq_length = 1024
[[clusters]]
synth = {{ num_nodes = [2], gpus_per_node = 2, seed = [0, 1, 2], nic_gb_per_s = 5.0 }}
"""


def _spec(tmp_path, model="gpt-1.7b"):
    p = tmp_path / "tiny.toml"
    p.write_text(SPEC.format(model=model))
    return p


def test_task_ids_are_stable_and_distinct(tmp_path):
    name, tasks = load_spec(_spec(tmp_path))
    again = load_spec(_spec(tmp_path))[1]
    # exact and anneal at 2 budgets on 3 clusters, the two baselines once per cluster (they
    # use no budget: one task each had run per budget, the same plan twice)
    assert name == "tiny" and len(tasks) == 2 * 2 * 3 + 2 * 3
    assert [t.id for t in tasks] == [t.id for t in again]
    assert len({t.id for t in tasks}) == 18
    assert {(t.budget_s, t.seed) for t in tasks if t.method in ("megatron", "amp-style")} \
        == {(0.0, 0)}
    # the move count is an input: a spec without it (cooling by the clock) has other ids
    p = tmp_path / "clock.toml"
    p.write_text(SPEC.format(model="gpt-1.7b").replace("anneal_moves = 300\n", ""))
    clock = load_spec(p)[1]
    assert all(t.anneal_moves is None for t in clock)
    assert not {t.id for t in clock} & {t.id for t in tasks}
    # so is the work clock, when given (the wall clock is the default)
    assert all(t.clock == "work" for t in tasks)
    p.write_text(SPEC.format(model="gpt-1.7b").replace('clock = "work"\n', ""))
    wall = load_spec(p)[1]
    assert all(t.clock == "wall" for t in wall)
    assert not {t.id for t in wall} & {t.id for t in tasks}


def test_task_ids_follow_the_files_they_read(tmp_path, monkeypatch):
    """A task reading a cluster file or a model's config.json is identified by the files'
    contents too: an edited file makes new tasks (a rerun had reused the old results), and a
    model path is read relative to the spec, as a cluster file is, from any directory."""
    import json as _json
    import shutil
    root = Path(__file__).resolve().parents[1]
    spec_dir = tmp_path / "study"
    (spec_dir / "hf").mkdir(parents=True)
    shutil.copy(root / "data" / "clusters" / "example.toml", spec_dir / "c.toml")
    cfg = {"model_type": "llama", "num_hidden_layers": 8, "hidden_size": 1024,
           "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 4096,
           "vocab_size": 32000, "max_position_embeddings": 1024}
    (spec_dir / "hf" / "config.json").write_text(_json.dumps(cfg))
    spec = spec_dir / "s.toml"
    spec.write_text(SPEC.format(model="hf/config.json").replace(
        "synth = {{ num_nodes = [2], gpus_per_node = 2, seed = [0, 1, 2], nic_gb_per_s = 5.0 }}"
        .replace("{{", "{").replace("}}", "}"), 'file = "c.toml"'))
    monkeypatch.chdir(tmp_path)  # not the spec's folder
    tasks = load_spec(spec)[1]
    assert {t.model for t in tasks} == {str((spec_dir / "hf" / "config.json").resolve())}
    assert all(dict(t.file_digests).keys() == {"model", "cluster"} for t in tasks)
    ids = {t.id for t in tasks}
    assert ids == {t.id for t in load_spec(spec)[1]}
    cfg["num_hidden_layers"] = 16
    (spec_dir / "hf" / "config.json").write_text(_json.dumps(cfg))
    edited = {t.id for t in load_spec(spec)[1]}
    assert not edited & ids
    (spec_dir / "c.toml").write_text((spec_dir / "c.toml").read_text() + "\n# edited\n")
    assert not {t.id for t in load_spec(spec)[1]} & edited
    # a preset-only spec keeps its ids (no files read)
    assert all(t.file_digests == () for t in load_spec(_spec(tmp_path))[1])
    # a model given as a folder holding its config.json (as presets.model reads it) is
    # followed by that file; an unrelated folder named as a preset leaves the preset
    spec.write_text(spec.read_text().replace('name = "hf/config.json"', 'name = "hf"'))
    folder = {t.id for t in load_spec(spec)[1]}
    cfg["num_hidden_layers"] = 24
    (spec_dir / "hf" / "config.json").write_text(_json.dumps(cfg))
    assert not {t.id for t in load_spec(spec)[1]} & folder
    (tmp_path / "gpt-1.7b").mkdir()
    assert {t.model for t in load_spec(_spec(tmp_path))[1]} == {"gpt-1.7b"}


def test_bad_specs_name_the_field(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text(SPEC.format(model="gpt-1.7b").replace('"megatron"', '"magic"'))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert e.value.field == "sweep.methods"
    p.write_text(SPEC.format(model="gpt-1.7b").replace("anneal_moves = 300", "anneal_moves = 0"))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert e.value.field == "sweep.anneal_moves"
    p.write_text(SPEC.format(model="gpt-1.7b").replace('clock = "work"', 'clock = "cpu"'))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert e.value.field == "sweep.clock"
    p.write_text(SPEC.format(model="no-such-model"))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert e.value.field == "models" and e.value.source == str(p)
    # a true/false job field given as a string: "false" had been read as true (an auditor's
    # sweep priced FP8 where it asked for none), 0 had drawn a contradictory message
    for field, value in (("fp8", '"false"'), ("grad_reduce_in_bf16", '"false"'),
                         ("distributed_optimizer", '"false"'), ("fused_loss", "0")):
        p.write_text(SPEC.format(model="gpt-1.7b").replace(
            "seq_length = 1024", f"seq_length = 1024\n{field} = {value}"))
        with pytest.raises(SpecError) as e:
            load_spec(p)
        assert e.value.field == f"jobs[0].{field}" and "must be true or false" in str(
            e.value), e.value


def _values(store: Store) -> dict:
    return {r["id"]: (r["status"], r.get("plan"), r.get("iteration_ms")) for r in store.rows()}


def _sweep_until_recorded(spec, db, n: int, jobs: str = "1", err=None) -> subprocess.Popen:
    """`cli.py sweep` in a session of its own (SIGINT at its default: a driver started from a
    script or a scheduler), returned once `n` tasks are recorded in `db` (0: once a task is
    dispatched), or after 120 s. `err`: a file for its stderr."""
    cmd = [sys.executable, str(ROOT / "cli.py"), "sweep", str(spec), "--results", str(db),
           "--jobs", jobs]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=err or subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        try:
            s = Store(db, create=False)
            recorded = len({r["id"] for r in s.rows() if r.get("status") == "done"})
            started = len(s.starts())
            s.close()
        except Exception:  # noqa: BLE001  (the file is being created)
            recorded = started = 0
        if (recorded >= n) if n else started:
            break
    return proc


def _interrupt(proc: subprocess.Popen) -> tuple[float, list[str]]:
    """SIGINT to the driver alone (not its process group): seconds until it exited, and the
    processes of its group still there after 10 s (killed, whatever the verdict)."""
    proc.send_signal(signal.SIGINT)
    t0 = time.time()
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.time() - t0
    for _ in range(50):  # the forkserver and resource tracker follow their driver
        left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True,
                              text=True).stdout.split()
        if not left:
            break
        time.sleep(0.2)
    for pid in left:
        os.kill(int(pid), signal.SIGKILL)
    return took, left


def test_sigkill_mid_run_then_rerun_equals_an_uninterrupted_run(tmp_path):
    spec = _spec(tmp_path)
    ref = Store(tmp_path / "ref.sqlite")
    counts = run_sweep(load_spec(spec)[1], ref, build_inputs, jobs=2)
    assert counts["done"] == 18
    killed_db = tmp_path / "killed.sqlite"
    proc = _sweep_until_recorded(spec, killed_db, 3)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its workers, mid-run
    proc.wait()
    s = Store(killed_db)
    before = s.done_ids()
    assert 3 <= len(before) < 18
    kill_t = max(t for _i, t in s.starts())
    counts = run_sweep(load_spec(spec)[1], s, build_inputs, jobs=2)
    assert counts["skipped"] == len(before)
    assert _values(s) == _values(ref)
    # no task recorded before the kill was started again afterwards
    rerun = {i for i, t in s.starts() if t > kill_t}
    assert not (rerun & before)


def test_sigint_to_the_driver_alone_stops_it_soon(tmp_path):
    """SIGINT to the sweep driver alone (`timeout -s INT`, a scheduler): it had run the whole
    queue before exiting and dropped those results; now the queued tasks are cancelled and
    the busy workers stopped at once, what was recorded stays, and a rerun finishes it."""
    spec = _spec(tmp_path)
    db = tmp_path / "int.sqlite"
    with open(tmp_path / "err.txt", "w") as err:
        proc = _sweep_until_recorded(spec, db, 2, err=err)
        took, leftover = _interrupt(proc)
    s = Store(db, create=False)
    recorded = len(s.rows())
    s.close()
    assert took < 10 and not leftover and 2 <= recorded < 18, (took, leftover, recorded)
    # one line says where it stands (it had printed the executor's KeyboardInterrupt
    # traceback at exit, and nothing else), and the exit status is a shell's for SIGINT
    said = " ".join((tmp_path / "err.txt").read_text().split())
    assert proc.returncode == 130 and "Traceback" not in said, said
    assert f"stopped by Ctrl-C: {recorded} of the spec's 18 tasks done" in said, said
    counts = run_sweep(load_spec(spec)[1], Store(db), build_inputs, jobs=1)
    assert counts["skipped"] == recorded and counts["done"] + counts["skipped"] == 18


LONG_SPEC = """
[sweep]
name = "long"
methods = ["anneal"]
budgets = [25.0]
seeds = [0, 1, 2]
[[models]]
name = "gpt-1.7b"
[[jobs]]
global_batch = 64
seq_length = 1024
[[clusters]]
synth = { num_nodes = [4], gpus_per_node = 2, seed = [0], nic_gb_per_s = 5.0 }
"""


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_sigint_stops_tasks_in_flight(tmp_path, jobs):
    """SIGINT to the driver while its workers run 25 s tasks: the busy workers are stopped
    at once (the handler had read the pool's workers after shutdown had forgotten them, and
    waited 40-60 s for the tasks, recording none)."""
    spec = tmp_path / "long.toml"
    spec.write_text(LONG_SPEC)
    proc = _sweep_until_recorded(spec, tmp_path / "long.sqlite", 0, jobs=jobs)
    time.sleep(1.0)  # the tasks are running
    took, left = _interrupt(proc)
    assert took < 5 and not left, (took, left)


@pytest.mark.skipif(__import__("importlib").util.find_spec("ray") is None,
                    reason="ray is not installed (the [sweep] extra)")
def test_ray_local_gives_the_local_pools_results(tmp_path):
    spec = _spec(tmp_path)
    a, b = Store(tmp_path / "a.sqlite"), Store(tmp_path / "b.sqlite")
    run_sweep(load_spec(spec)[1], a, build_inputs, jobs=2)
    run_sweep(load_spec(spec)[1], b, build_inputs, executor="ray")
    assert _values(a) == _values(b)


# tasks that their budget stops (4 nodes with a degraded NIC: neither method converges in one
# work second): with budgets in work seconds they too give the same result on every executor
WORK_SPEC = """
[sweep]
name = "work"
methods = ["exact", "anneal"]
budgets = [1.0]
seeds = [0]
clock = "work"
[[models]]
name = "gpt-1.7b"
[[jobs]]
global_batch = 16
seq_length = 1024
[[clusters]]
synth = { num_nodes = [4], gpus_per_node = 2, seed = [0, 1], nic_gb_per_s = 5.0, degraded_factor = 0.4 }
"""


def _full(store: Store) -> dict:
    return {r["id"]: (r["status"], r.get("plan"), r.get("iteration_ms"), r.get("bound_ms"),
                      r.get("termination")) for r in store.rows()}


def test_work_clock_tasks_stopped_by_their_budget_agree_on_every_executor(tmp_path):
    spec = tmp_path / "work.toml"
    spec.write_text(WORK_SPEC)
    tasks = load_spec(spec)[1]
    one, two = Store(tmp_path / "one.sqlite"), Store(tmp_path / "two.sqlite")
    run_sweep(tasks, one, build_inputs, jobs=1)
    run_sweep(tasks, two, build_inputs, jobs=2)
    a = _full(one)
    assert len(a) == 4 and all(v[0] == "done" and v[4] == "time_limit" for v in a.values())
    assert _full(two) == a
    if __import__("importlib").util.find_spec("ray") is not None:
        ray = Store(tmp_path / "ray.sqlite")
        run_sweep(tasks, ray, build_inputs, executor="ray")
        assert _full(ray) == a


def test_damaged_rows_are_dropped_with_a_warning(tmp_path):
    s = Store(tmp_path / "s.sqlite")
    s.record({"id": "a", "status": "done", "inputs": {}})
    s.record({"id": "b", "status": "done", "inputs": {}})
    with s.conn:
        s.conn.execute("UPDATE tasks SET payload = payload || ' ' WHERE id = 'b'")
    # a report reads the store and changes nothing in it (it had deleted the damaged row)
    s.close()
    r = Store(tmp_path / "s.sqlite", create=False)
    assert [x["id"] for x in r.rows()] == ["a"] and "skipped" in r.warnings[0]
    assert r.conn.execute("SELECT COUNT(*) FROM tasks").fetchone()[0] == 2
    r.close()
    # a sweep run drops it and runs it again
    s = Store(tmp_path / "s.sqlite")
    assert s.done_ids() == {"a"}
    assert s.warnings and "damaged" in s.warnings[0] and "dropped" in s.warnings[0]
    assert s.conn.execute("SELECT COUNT(*) FROM tasks").fetchone()[0] == 1


def test_report_writes_tables_and_three_plots(tmp_path):
    spec = _spec(tmp_path)
    s = Store(tmp_path / "r.sqlite")
    run_sweep(load_spec(spec)[1], s, build_inputs, jobs=2)
    files = report(s.rows(), tmp_path / "rep")
    names = sorted(f.name for f in files)
    assert names == ["gain_vs_spread.png", "gap_vs_nodes.png", "points.csv",
                     "quality_vs_budget.png", "summary.csv", "summary.md"]
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert "| exact | 2 |" in md and "| megatron | 2 |" in md and "| amp-style | 2 |" in md
    # points.csv: one row per task as stored (the summary had been the only table), each
    # finished one with its gap to its instance's best plan, the best at 0
    import csv
    with open(tmp_path / "rep" / "points.csv", newline="") as f:
        pts = list(csv.DictReader(f))
    stored = {r["id"]: r for r in s.rows()}
    assert sorted(p["id"] for p in pts) == sorted(stored)
    for p in pts:
        r = stored[p["id"]]
        assert p["method"] == r["inputs"]["method"] and p["status"] == r["status"]
        if r["status"] == "done":
            assert float(p["iteration_ms"]) == pytest.approx(r["iteration_ms"], rel=1e-12)
            assert float(p["gap_to_best"]) >= -1e-12
            # each row says the plan's peak memory and the cost model that priced it
            assert 0 < float(p["peak_memory_gib"]) < 80
            assert p["cost_model_revision"] == cost_model_revision()
    by_instance = {}
    for p in pts:
        if p["gap_to_best"]:
            key = (p["model"], p["cluster"], p["job"])
            by_instance[key] = min(by_instance.get(key, 1.0), float(p["gap_to_best"]))
    assert by_instance and all(abs(v) < 1e-12 for v in by_instance.values())
    # rows of two cost-model revisions in one store: the report says so
    assert not any("cost-model revisions" in w for w in s.coverage_warnings(s.rows()))
    old = dict(next(r for r in s.rows() if r["status"] == "done"), id="an-older-task")
    old["cost_model_revision"] = "0123456789ab"
    s.conn.execute("INSERT INTO tasks VALUES (?, ?, ?, ?)", (old["id"], json.dumps(
        old, sort_keys=True), hashlib.sha256(json.dumps(old, sort_keys=True).encode())
        .hexdigest(), 0.0))
    assert any("2 cost-model revisions" in w for w in s.coverage_warnings(s.rows()))


def test_report_says_what_is_unfinished_and_what_comes_from_another_spec(tmp_path):
    """A report of a stopped sweep, or of a store two specs wrote, says so (it had reported
    the finished tasks, or both specs together, without a word); a store from before the
    sweeps table tells the tasks started and not finished."""
    import sqlite3

    from typer.testing import CliRunner

    from cli import app
    tasks = load_spec(_spec(tmp_path))[1]
    quick = [t for t in tasks if t.inputs()["method"] in ("megatron", "amp-style")][:3]
    db = tmp_path / "part.sqlite"
    s = Store(db)
    s.note_sweep("tiny", [t.id for t in tasks])
    run_sweep(quick, s, build_inputs, jobs=1)
    assert s.coverage_warnings(s.rows()) == [
        f"15 of the 18 tasks the sweep asked for have no result in {db} (stopped before "
        "they finished): the tables cover the 3 finished; run the sweep again to finish it"]
    s.note_sweep("other", [quick[0].id])
    said = s.coverage_warnings(s.rows())
    assert said[0] == ("the store holds the tasks of 2 sweep specs (other, tiny): the tables "
                       "report them together") and "the sweeps asked for" in said[1]
    s.close()
    r = CliRunner().invoke(app, ["sweep", "report", str(db), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0 and "2 sweep specs" in r.output and "15 of the 18" in r.output
    # a spec edited and run again: its latest run is what it asks for, and the task only an
    # earlier version asked for is said as such, not as unfinished for ever
    s = Store(db)
    s.note_sweep("other", [quick[1].id])
    s.note_sweep("tiny", [quick[0].id, quick[1].id])
    assert s.coverage_warnings(s.rows()) == [
        "the store holds the tasks of 2 sweep specs (other, tiny): the tables report them "
        "together",
        "1 finished task(s) in the store are not in the latest run of any spec (an earlier "
        "version of one): the tables include them"]
    with s.conn:  # a damaged row of the sweeps table: said, not a traceback
        s.conn.execute("INSERT INTO sweeps VALUES ('x', '[\"a\", \"b\"', 1e12)")
    assert any(w.startswith("1 damaged row(s) of the store's sweeps table skipped")
               for w in s.coverage_warnings(s.rows()))
    s.close()
    # an older store: no sweeps table; the dispatches it logged stand in
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE sweeps")
        conn.execute("INSERT INTO starts VALUES (?, ?)", (tasks[-1].id, 0.0))
    old = Store(db, create=False)
    assert old.coverage_warnings(old.rows()) == [
        f"1 of the 4 tasks the sweep asked for have no result in {db} (stopped before they "
        "finished): the tables cover the 3 finished; run the sweep again to finish it"]


def test_failures_are_said_and_counted_not_dropped(tmp_path):
    """Baselines where nothing fits fail with the reason (they had failed with a ValueError and
    an AttributeError); an fp8 job on GPUs without FP8 is refused when the spec loads; the
    report counts failed tasks and tasks without a bound in columns of their own (they had
    been left out of the gaps without a word)."""
    from formats.results import summarize
    from solvers.sweep import run_task
    p = tmp_path / "big.toml"
    p.write_text(SPEC.format(model="llama3-405b").replace(
        '"exact", "anneal", "megatron", "amp-style"', '"megatron", "amp-style"'))
    for t in load_spec(p)[1][:2]:
        r = run_task(t, build_inputs)
        assert r["status"] == "failed" and r["error"].startswith(
            "InfeasibleError: nothing fits in GPU memory"), r["error"]
    p.write_text(SPEC.format(model="gpt-1.7b").replace("seq_length = 1024",
                                                       "seq_length = 1024\nfp8 = true"))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert e.value.field == "jobs" and "FP8 tensor cores" in str(e.value)
    inst = {"model": "m", "cluster": {"preset": "c"}, "job": {}}
    rows = [{"id": "a", "status": "done", "nodes": 2, "iteration_ms": 10.0, "bound_ms": 0.0,
             "wall_s": 1.0, "inputs": {**inst, "method": "exact", "budget_s": 1.0}},
            {"id": "b", "status": "failed", "error": "x", "nodes": 2,
             "inputs": {**inst, "method": "exact", "budget_s": 2.0}},
            # a baseline's gap to the bound is to its instance's: counted out there too (its
            # row had said nothing of the instances left out)
            {"id": "c", "status": "done", "nodes": 2, "iteration_ms": 11.0, "bound_ms": None,
             "wall_s": 0.1, "inputs": {**inst, "method": "megatron", "budget_s": 0.0}}]
    table, _ = summarize(rows)
    assert [(r["method"], r["tasks"], r["failed"], r["no_bound"]) for r in table] == [
        ("exact", 1, 1, 1), ("megatron", 1, 0, 1)]


def test_sweep_specs_refuse_unknown_fields_and_stores_that_are_not_stores(tmp_path):
    """A misspelt key (budget for budgets), two cluster kinds in one entry, an unknown model:
    one line naming the spec and the field; a results path that is not a store, or a folder,
    and a report given two stores or a missing one: one line, never a traceback."""
    from typer.testing import CliRunner
    from cli import app
    base = ('[sweep]\nmethods = ["megatron"]\nbudgets = [1.0]\n[[models]]\nname = "gpt-1.7b"\n'
            '[[clusters]]\npreset = "example"\n[[jobs]]\nglobal_batch = 64\n'
            'seq_length = 2048\n')
    spec = tmp_path / "s.toml"
    for text, field in ((base.replace("budgets", "budget"), "sweep.budget"),
                        (base.replace('preset = "example"\n',
                                      'preset = "example"\nfile = "x.toml"\n'), "clusters[0]"),
                        (base.replace('name = "gpt-1.7b"\n', 'name = "gpt-1.7b"\nlayers = 4\n'),
                         "models[0].layers"),
                        (base + "[extra]\nx = 1\n", "extra"),
                        # a job's or synth's key by its own name, not JobSpec.__init__()'s
                        # TypeError ("got an unexpected keyword argument 'foo'")
                        (base + "foo = 1\n", "jobs[0].foo"),
                        (base.replace("global_batch = 64\n", ""), "jobs[0].global_batch"),
                        (base.replace('preset = "example"', 'synth = { num_nodes = 2, bar = 1 }'),
                         "clusters[0].synth.bar"),
                        (base.replace("gpt-1.7b", "nosuch"), "models")):
        spec.write_text(text)
        r = CliRunner().invoke(app, ["sweep", str(spec), "--results", str(tmp_path / "r.db")])
        line = " ".join(r.output.split())
        assert r.exit_code == 2 and f"{spec}: {field}:" in line, (field, r.output)
        assert "__init__" not in line and "keyword" not in line
    spec.write_text(base)
    notdb = tmp_path / "notdb.txt"
    notdb.write_text("hello\n")
    for args in (["sweep", str(spec), "--results", str(notdb)],
                 ["sweep", str(spec), "--results", str(tmp_path)],
                 ["sweep", "report", str(notdb)],
                 ["sweep", "report", str(tmp_path / "missing.sqlite")],
                 ["sweep", "report", str(notdb), str(notdb)]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and "Traceback" not in r.output, (args, r.output)
        assert len([x for x in r.output.splitlines() if x.strip()]) == 1, r.output
    assert notdb.read_text() == "hello\n"


_ORPHAN_SCRIPT = """
import concurrent.futures as cf, multiprocessing as mp, os, signal, sys, time
sys.path.insert(0, {root!r})
from solvers.workers import die_with_parent


def pid_then_sleep(s):
    time.sleep(s)
    return os.getpid()


if __name__ == "__main__":
    if sys.argv[1] == "fork-pool":  # solve --jobs's pool (solvers/search.py _workers)
        pool = mp.get_context("fork").Pool(2, initializer=die_with_parent)
        print(sorted(set(pool.map(pid_then_sleep, [0.3, 0.3]))), flush=True)
        pool.apply_async(pid_then_sleep, (1000,))
    else:  # the sweep's pool (solvers/sweep.py run_sweep)
        pool = cf.ProcessPoolExecutor(2, mp_context=mp.get_context(sys.argv[1]),
                                      initializer=die_with_parent)
        print(sorted({{f.result() for f in [pool.submit(pid_then_sleep, 0.3)
                                            for _ in range(2)]}}), flush=True)
        pool.submit(pid_then_sleep, 1000)  # a worker busy when its driver is killed
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)  # kill -9 of the driver alone
"""


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie waits for init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("how", ["forkserver", "spawn", "fork-pool"])
def test_workers_end_when_their_driver_is_killed(tmp_path, how):
    """kill -9 of the sweep driver (or of solve with --jobs) alone: its workers, one of them
    mid-task, end within seconds (they had run on, then waited on their queue forever)."""
    script = tmp_path / "driver.py"
    script.write_text(_ORPHAN_SCRIPT.format(root=str(ROOT)))
    # output to a file: an orphan holding a pipe would keep subprocess.run waiting
    with open(tmp_path / "out.txt", "w") as f:
        rc = subprocess.run([sys.executable, str(script), how], stdout=f,
                            stderr=subprocess.DEVNULL, timeout=60).returncode
    assert rc == -signal.SIGKILL
    pids = [int(x) for x in (tmp_path / "out.txt").read_text().strip().strip("[]").split(",")]
    assert len(pids) == 2
    deadline = time.time() + 20
    while time.time() < deadline and any(map(_running, pids)):
        time.sleep(0.2)
    alive = [p for p in pids if _running(p)]
    for p in alive:  # do not leave them behind, whatever the verdict
        os.kill(p, signal.SIGKILL)
    assert not alive


@pytest.mark.parametrize("jobs", ["-1", "0", "100000"])
def test_sweep_jobs_out_of_range_is_one_line(tmp_path, jobs):
    """--jobs is checked as solve's is: -1 had been a ValueError traceback from the pool, 0 and
    100000 had run silently."""
    from typer.testing import CliRunner
    from cli import app
    r = CliRunner().invoke(app, ["sweep", str(_spec(tmp_path)), "--results",
                                 str(tmp_path / "r.db"), "--jobs", jobs])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"--jobs: {jobs} is out of range; give 1 to 4,096" in r.output
    assert not (tmp_path / "r.db").exists()


def test_sweep_run_refuses_out(tmp_path):
    """--out is the report's folder: given to a run, it had been ignored (nothing written
    there, exit 0)."""
    from typer.testing import CliRunner
    from cli import app
    r = CliRunner().invoke(app, ["sweep", str(_spec(tmp_path)), "--results",
                                 str(tmp_path / "r.db"), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 2 and "options: --out: is the folder of `sweep report`" in r.output
    assert not (tmp_path / "r.db").exists()


def test_settings_some_clusters_have_no_use_for_are_said(tmp_path):
    """The shipped example crosses an oversubscribed spine with 4-node clusters, whose nodes
    share one leaf switch: said for them (as `cluster synth` says it), not for the 8-node ones;
    a degraded factor without degraded nodes too."""
    from formats.sweepspec import spec_notes
    root = Path(__file__).resolve().parents[1]
    _name, tasks = load_spec(root / "data" / "sweeps" / "example.toml")
    notes = spec_notes(tasks)
    assert notes == ["oversubscription 2 has no effect on the 4-node clusters: their nodes "
                     "share one leaf switch (leaf_size 4), so no stream crosses the spine"]
    p = tmp_path / "s.toml"
    p.write_text(SPEC.format(model="gpt-1.7b").replace(
        "[[clusters]]", "[[clusters]]\nsynth = { num_nodes = 8, degraded = 0, "
        "degraded_factor = 0.3 }\n[[clusters]]", 1))
    assert any("degraded_factor 0.3 has no effect" in x for x in spec_notes(load_spec(p)[1]))
