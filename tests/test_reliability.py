"""Whatever the input: one error line and exit 2, no traceback, no hang, no NaN, nothing lost.

Each example of the reliability report is a test here; hypothesis families mutate the readers'
inputs (a few hundred examples in all; bench/fuzz.py runs the long version)."""

import json
import math
import os
import resource
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli import app
from formats.clusters import load_cluster
from model.errors import SpecError

RUN = CliRunner()
SMALL_HF = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376,
            "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
            "vocab_size": 32000, "max_position_embeddings": 2048}


def one_error_line(res) -> str:
    """The command failed cleanly: exit 2 and exactly one line on stderr, 'error: ...'; on
    stdout nothing, or with --json the same error as {"error": ..., "exit_code": 2}."""
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == 2, res.output
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    if res.stdout.strip():
        d = json.loads(res.stdout)
        assert (d["error"], d["exit_code"]) == (lines[0].removeprefix("error: "), 2), res.output
    return lines[0]


def est(*args):
    return RUN.invoke(app, ["estimate", *args])


# ---------------------------------------------------------------------------------------------
# readers


@pytest.mark.parametrize("content", [b"42", b"[1, 2]", b'"x"', b"", b"\xff\xfe{}", b"{",
                                     b"null", b'{"model_type": ["llama"]}'])
def test_hf_config_not_an_object_or_not_utf8(tmp_path, content):
    p = tmp_path / "config.json"
    p.write_bytes(content)
    one_error_line(est("-m", str(p), "--tp", "1", "--pp", "1"))


@pytest.mark.parametrize("key,value", [("num_hidden_layers", 10**9), ("vocab_size", 10**12),
                                       ("num_hidden_layers", "32"), ("hidden_size", 512.5),
                                       ("vocab_size", True), ("num_attention_heads", None),
                                       ("rope_theta", "x"), ("hidden_size", -512)])
def test_hf_config_wrong_types_and_huge_values(tmp_path, key, value):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**SMALL_HF, key: value}))
    line = one_error_line(est("-m", str(p), "--tp", "1", "--pp", "1"))
    assert str(p) in line


@pytest.mark.parametrize("inter", ['"x"', "[[0, 1], [1]]", "[[0, true], [1, 0]]",
                                   "[[0, inf], [1, 0]]", "[[0, nan], [1, 0]]", "5",
                                   "[[0, -1], [1, 0]]", "[[nan, 1], [1, 0]]"])
def test_cluster_matrix_of_wrong_type_or_shape(tmp_path, inter):
    p = tmp_path / "c.toml"
    p.write_text('name = "c"\n[[nodes]]\nname = "a"\ngpu = "A100-80GB"\ngpus = 8\n'
                 'intra_gb_per_s = 240.0\n[[nodes]]\nname = "b"\ngpu = "A100-80GB"\ngpus = 8\n'
                 f"intra_gb_per_s = 240.0\n[inter]\ngb_per_s = {inter}\n")
    one_error_line(RUN.invoke(app, ["cluster", "show", str(p)]))


@pytest.mark.parametrize("node", ["5", '"x"', "[1]"])
def test_cluster_node_that_is_not_a_table(tmp_path, node):
    p = tmp_path / "c.toml"
    p.write_text(f"nodes = [{node}]\n[inter]\ngb_per_s = [[0]]\n")
    one_error_line(RUN.invoke(app, ["cluster", "show", str(p)]))


@pytest.mark.parametrize("field,value", [("latency_us", "inf"), ("intra_gb_per_s", "inf"),
                                         ("gpus", "100000"), ("latency_us", "nan")])
def test_non_finite_or_huge_cluster_values(tmp_path, field, value):
    base = (f'name = "c"\nlatency_us = {value if field == "latency_us" else 5.0}\n'
            '[[nodes]]\nname = "a"\ngpu = "A100-80GB"\n'
            f'gpus = {value if field == "gpus" else 8}\n'
            f'intra_gb_per_s = {value if field == "intra_gb_per_s" else 240.0}\n'
            "[inter]\ngb_per_s = [[0]]\n")
    p = tmp_path / "c.toml"
    p.write_text(base)
    one_error_line(est("-c", str(p), "--tp", "8", "--pp", "1", "-m", "llama2-7b", "--json"))


def _plan_file(tmp_path) -> tuple:
    p = tmp_path / "plan.json"
    r = est("-m", "llama2-7b", "--tp", "8", "--pp", "2", "--gbs", "64", "--seq", "2048",
            "--save-plan", str(p), "--json")
    assert r.exit_code == 0, r.output
    return p, json.loads(p.read_text())


@pytest.mark.parametrize("edit", ["gbs_huge", "gbs_long", "zero_link", "inf_link",
                                  "nan_latency", "neg_layers", "bool_tp"])
def test_plan_file_values(tmp_path, edit):
    p, doc = _plan_file(tmp_path)
    if edit == "gbs_huge":
        doc["job"]["global_batch"] = 10**12
    elif edit == "gbs_long":  # valid, but 250,000,000 micro-batches per replica
        doc["job"]["global_batch"] = 10**9
    elif edit == "zero_link":
        doc["cluster"]["inter"]["gb_per_s"][0][1] = 0
    elif edit == "inf_link":
        doc["cluster"]["inter"]["gb_per_s"][0][1] = float("inf")
    elif edit == "nan_latency":
        doc["cluster"]["latency_us"] = float("nan")
    elif edit == "neg_layers":
        doc["plan"]["shape"]["layers"] = [-1, 33]
    else:
        doc["plan"]["shape"]["tp"] = True
    p.write_text(json.dumps(doc))
    one_error_line(est("--plan", str(p), "--json"))


@pytest.mark.parametrize("args", [["--time-limit", "-1"], ["--time-limit", "nan"],
                                  ["--time-limit", "inf"], ["--seed", str(2**32)],
                                  ["--seed", "-1"], ["--gbs", str(2**40)]])
def test_solve_options_out_of_range(args):
    one_error_line(RUN.invoke(app, ["solve", "-m", "gpt-1.7b", *args]))


@pytest.mark.parametrize("args,says", [(["--gbs", str(10**9)], "slots"),
                                       (["--tp", "16"], "no plan in the search space")])
def test_solve_spaces_nothing_can_run(args, says):
    """A global batch whose every schedule is too long to model, a TP larger than a node:
    one line (these built graphs until memory ran out, and raised an AttributeError)."""
    assert says in one_error_line(RUN.invoke(app, ["solve", "-m", "gpt-1.7b", "--seq", "2048",
                                                   *args]))


@pytest.mark.parametrize("seq", ["0", "-0", "-5", str(2**30)])
def test_sequence_out_of_range(seq):
    one_error_line(est("--seq", seq))


@pytest.mark.parametrize("args", [["--nic-gb-per-s", "inf"], ["--nic-gb-per-s", "nan"],
                                  ["--nodes", "10000000"], ["--gpus-per-node", "-8"],
                                  ["--seed", str(2**64)], ["--intra-gb-per-s", "0"]])
def test_synth_refuses_nonsense(tmp_path, args):
    one_error_line(RUN.invoke(app, ["cluster", "synth", *args, "--out",
                                    str(tmp_path / "s.toml")]))
    assert not (tmp_path / "s.toml").exists()


@pytest.mark.parametrize("name", ["a\\b", 'q"uote', "é-node", "[x]"])
def test_written_cluster_reads_back(tmp_path, name):
    """What cluster synth writes, the tool reads back: names escaped, floats in full."""
    out = tmp_path / "s.toml"
    r = RUN.invoke(app, ["cluster", "synth", "--nodes", "3", "--name", name, "--out", str(out)])
    assert r.exit_code == 0, r.output
    c = load_cluster(out)
    assert c.name == name
    tomllib.loads(out.read_text())


def test_names_with_control_characters_are_refused(tmp_path):
    line = one_error_line(RUN.invoke(app, ["cluster", "synth", "--name", "x\ny", "--out",
                                           str(tmp_path / "s.toml")]))
    assert "\\n" in line


def test_imported_cluster_reads_back_exactly(tmp_path):
    """Small measured rates survive the round trip (no rounding to 0.00)."""
    src = tmp_path / "m.csv"
    src.write_text("from\\to,a,b\na,,0.004\nb,0.0031,\n")
    out = tmp_path / "c.toml"
    r = RUN.invoke(app, ["cluster", "import", str(src), "--gpu", "A100-80GB",
                         "--gpus-per-node", "8", "--intra-gb-per-s", "240", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert load_cluster(out).inter_gb_per_s[0, 1] == pytest.approx(0.004)


# ---------------------------------------------------------------------------------------------
# special paths


@pytest.mark.parametrize("where", ["cluster", "plan", "import", "model", "calibration"])
@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_special_files_are_refused_without_reading(tmp_path, where, kind):
    p = tmp_path / ("in.toml" if where == "cluster" else "in.json")
    if kind == "fifo":
        os.mkfifo(p)
    else:
        p.mkdir()
    argv = {"cluster": ["estimate", "-c", str(p)],
            "plan": ["estimate", "--plan", str(p)],
            "import": ["cluster", "import", str(p), "--gpu", "A100-80GB", "--gpus-per-node",
                       "8", "--intra-gb-per-s", "240", "--format", "csv"],
            "model": ["estimate", "-m", str(p), "--tp", "1", "--pp", "1"],
            "calibration": ["estimate", "--calibration", str(p)]}[where]
    one_error_line(RUN.invoke(app, argv))


def test_missing_and_empty_inputs(tmp_path):
    one_error_line(est("--plan", str(tmp_path / "nope.json")))
    (tmp_path / "e.json").write_text("")
    one_error_line(est("--plan", str(tmp_path / "e.json")))


# ---------------------------------------------------------------------------------------------
# nothing lost


def test_rejected_later_option_leaves_no_output(tmp_path):
    keep = tmp_path / "plan.json"
    keep.write_text("ORIGINAL")
    one_error_line(est("--save-plan", str(keep), "--emit", "nosuchfw"))
    assert keep.read_text() == "ORIGINAL"
    one_error_line(est("--save-plan", str(keep), "--emit", "megatron", "--out",
                       str(tmp_path / "set"), "--gantt", str(keep / "x.png")))
    assert keep.read_text() == "ORIGINAL" and not (tmp_path / "set").exists()


@pytest.mark.parametrize("opt", ["--gantt", "--placement-png", "--save-plan"])
def test_output_at_a_folder_is_one_line(tmp_path, opt):
    one_error_line(est(opt, str(tmp_path)))


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_output_where_no_file_can_be_made_is_refused_before_the_search():
    """A folder that exists but takes no file (/proc passes every path check) is refused
    before the work: solve had run its whole time limit and then failed to write."""
    import time
    t0 = time.perf_counter()
    line = one_error_line(RUN.invoke(app, ["solve", "--time-limit", "60", "--placement-png",
                                           "/proc/pipette-x.png"]))
    assert "--placement-png: cannot be written: no file can be made in /proc" in line, line
    assert time.perf_counter() - t0 < 10
    one_error_line(est("--save-plan", "/proc/pipette-x.json"))


def test_cluster_show_png_and_compare_csv_at_bad_targets(tmp_path):
    (tmp_path / "f").write_text("a file")
    one_error_line(RUN.invoke(app, ["cluster", "show", "--png", str(tmp_path)]))
    one_error_line(RUN.invoke(app, ["cluster", "show", "--png", str(tmp_path / "f" / "x.png")]))
    one_error_line(RUN.invoke(app, ["compare", "-m", "gpt-1.7b", "--gbs", "8", "--seq", "256",
                                    "--time-limit", "1", "--csv", str(tmp_path)]))


def _limit_file_size(nbytes):
    """In a child process: files can grow to `nbytes`, then writes fail (EFBIG, like a full
    disk) instead of killing the process."""
    import signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


@pytest.mark.parametrize("what", ["plan", "launch", "png", "csv", "cluster"])
def test_write_failing_midway_keeps_the_previous_file(tmp_path, what):
    """Disk full after 200 bytes (RLIMIT_FSIZE in a child process): the previous file is
    intact and the error is one line."""
    import subprocess
    import sys
    target = {"plan": tmp_path / "plan.json", "launch": tmp_path / "set" / "megatron_args.txt",
              "png": tmp_path / "g.png", "csv": tmp_path / "c.csv",
              "cluster": tmp_path / "c.toml"}[what]
    args = {"plan": ["estimate", "--save-plan", str(target)],
            "launch": ["estimate", "--emit", "megatron", "--out", str(target.parent)],
            "png": ["estimate", "--gantt", str(target)],
            "csv": ["compare", "-m", "gpt-1.7b", "--gbs", "8", "--seq", "256", "--time-limit",
                    "1", "--csv", str(target)],
            "cluster": ["cluster", "synth", "--nodes", "16", "--out", str(target)]}[what]
    first = RUN.invoke(app, args)
    assert first.exit_code == 0, first.output
    before = target.read_bytes()
    code = ("import sys; sys.argv = ['cli.py'] + sys.argv[1:]; import cli; cli.app()")
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       preexec_fn=lambda: _limit_file_size(200), cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-500:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-500:]
    assert target.read_bytes() == before


# ---------------------------------------------------------------------------------------------
# finite everywhere


def _finite_json(text: str):
    bad = []
    doc = json.loads(text, parse_constant=lambda c: bad.append(c))
    assert not bad, bad
    return doc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(1, 96), hidden_mult=st.integers(1, 64), heads=st.sampled_from(
    [1, 2, 4, 8, 16]), vocab=st.integers(1, 300_000), seq=st.sampled_from([128, 1024, 8192]),
    gbs=st.integers(1, 512), tp=st.sampled_from([1, 2, 8]), pp=st.sampled_from([1, 2]),
    nic=st.floats(0.01, 1000.0), latency=st.floats(0.0, 1e5))
def test_estimates_are_finite(tmp_path_factory, layers, hidden_mult, heads, vocab, seq, gbs, tp,
                              pp, nic, latency):
    """Over random valid models, jobs and clusters: the estimate is a clean error or finite
    numbers, never NaN or Infinity."""
    d = tmp_path_factory.mktemp("f")
    hidden = heads * 64 * hidden_mult // heads * heads // heads
    cfg = {**SMALL_HF, "num_hidden_layers": layers, "hidden_size": hidden,
           "num_attention_heads": heads, "num_key_value_heads": heads,
           "intermediate_size": 4 * hidden, "vocab_size": vocab}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "c.toml").write_text(
        f'name = "c"\nlatency_us = {latency!r}\n' + "".join(
            f'[[nodes]]\nname = "n{i}"\ngpu = "A100-80GB"\ngpus = 8\nintra_gb_per_s = 240.0\n'
            for i in range(2)) + f"[inter]\ngb_per_s = [[0, {nic!r}], [{nic!r}, 0]]\n")
    r = est("-m", str(d / "config.json"), "-c", str(d / "c.toml"), "--tp", str(tp), "--pp",
            str(pp), "--gbs", str(gbs), "--seq", str(seq), "--recompute", "full", "--json")
    if r.exit_code == 2:
        one_error_line(r)
        return
    assert r.exit_code == 0, r.output
    doc = _finite_json(r.output)["estimate"]
    assert math.isfinite(doc["iteration_ms"]) and doc["iteration_ms"] > 0


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(
    max_size=8), lambda ch: st.lists(ch, max_size=3) | st.dictionaries(st.text(max_size=6), ch,
                                                                       max_size=3), max_leaves=8)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(SMALL_HF)), value=JSONISH)
def test_hf_config_fields_of_any_type(tmp_path, key, value):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**SMALL_HF, key: value}, allow_nan=True))
    r = est("-m", str(p), "--tp", "1", "--pp", "1", "-c", "example", "--gbs", "8", "--seq",
            "512", "--json")
    if r.exit_code == 0:
        _finite_json(r.output)
    else:
        one_error_line(r)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["name", "latency_us", "nodes.0.name", "nodes.0.gpu", "nodes.0.gpus",
                             "nodes.1.intra_gb_per_s", "inter.gb_per_s", "inter.gb_per_s.0",
                             "inter.gb_per_s.1.0", "nodes", "inter"]), value=JSONISH)
def test_cluster_fields_of_any_type(tmp_path, path, value):
    doc = {"name": "c", "latency_us": 5.0,
           "nodes": [{"name": f"n{i}", "gpu": "A100-80GB", "gpus": 8, "intra_gb_per_s": 240.0}
                     for i in range(2)],
           "inter": {"gb_per_s": [[0.0, 20.0], [20.0, 0.0]]}}
    cur, keys = doc, path.split(".")
    for k in keys[:-1]:
        cur = cur[int(k)] if isinstance(cur, list) else cur[k]
    last = keys[-1]
    if isinstance(cur, list):
        cur[int(last)] = value
    else:
        cur[last] = value
    from formats.clusters import cluster_from_dict
    try:
        c = cluster_from_dict(doc, "fuzz.toml")
    except SpecError as e:
        assert "\n" not in str(e)
        return
    assert all(math.isfinite(x) for x in c.inter_gb_per_s.flat)


JOB = '[[models]]\nname = "gpt-1.7b"\n[[jobs]]\nglobal_batch = 8\nseq_length = 256\n'


@pytest.mark.parametrize("text", [
    'sweep = 5\n',
    '[sweep]\nmethods = "exact"\n',
    '[sweep]\nbudgets = [inf]\n' + JOB,
    '[sweep]\nseeds = [-1]\n',
    'models = [1, 2]\n',
    JOB + '[[clusters]]\nsynth = 5\n',
    JOB + '[[clusters]]\nsynth = { num_nodes = [], seed = 0 }\n',
    JOB + '[[clusters]]\nsynth = { num_nodes = 2, gpu = 5 }\n',
    JOB + '[[clusters]]\nsynth = { num_nodes = 2, seed = [0, 1], noise = 5.0 }\n',
])
def test_sweep_specs_of_the_wrong_shape(tmp_path, text):
    """Sweep specs whose tables or values have the wrong type: one line, before any task."""
    p = tmp_path / "s.toml"
    p.write_text(text)
    one_error_line(RUN.invoke(app, ["sweep", str(p), "--results", str(tmp_path / "r.sqlite"),
                                    "--jobs", "1"]))


def _disk_full_after(monkeypatch, ok_writes: int):
    """formats.atomic's temporary files fail (ENOSPC) after `ok_writes` succeed."""
    import formats.atomic as atomic
    real, calls = atomic._write_temp, {"n": 0}

    def full(path, data, mode):
        calls["n"] += 1
        if calls["n"] > ok_writes:
            raise OSError(28, os.strerror(28))
        return real(path, data, mode)
    monkeypatch.setattr(atomic, "_write_temp", full)


def test_profile_writer_keeps_the_previous_file(tmp_path, monkeypatch):
    from formats.profile import load_profile, save_profile
    from model.calibration import Profile
    p = tmp_path / "prof.json"
    prof = Profile(gpu="A100-80GB", values={"gemm_scale": 0.9}, stderr={"gemm_scale": 0.01},
                   names=("gemm_scale",), covariance=[[1e-4]], residual_sd=0.02)
    save_profile(p, prof)
    before = p.read_bytes()
    _disk_full_after(monkeypatch, 0)
    with pytest.raises(SpecError, match="previous file"):
        save_profile(p, prof)
    assert p.read_bytes() == before and load_profile(p).gpu == "A100-80GB"


def test_sweep_report_keeps_the_previous_tables(tmp_path, monkeypatch):
    from formats.results import report
    rows = [{"status": "done", "iteration_ms": 100.0 + k, "bound_ms": 90.0, "wall_s": 1.0,
             "nodes": 2, "bw_spread": 1.2,
             "inputs": {"method": m, "budget_s": 1.0, "model": "gpt-1.7b", "seed": 0,
                        "cluster": {"synth": {"num_nodes": 2, "seed": 0}}, "job": {}}}
            for k, m in enumerate(["exact", "anneal", "megatron"])]
    report(rows, tmp_path)
    before = (tmp_path / "summary.csv").read_bytes()
    _disk_full_after(monkeypatch, 0)
    with pytest.raises(SpecError):
        report(rows, tmp_path)
    assert (tmp_path / "summary.csv").read_bytes() == before


def test_path_that_cannot_be_stated_and_unknown_gpu(tmp_path):
    (tmp_path / "f").write_text("a file")
    one_error_line(est("-c", str(tmp_path / "f" / "c.toml")))
    one_error_line(est("--plan", str(tmp_path / "f" / "p.json")))
    p = tmp_path / "c.toml"
    p.write_text('name = "c"\n[[nodes]]\nname = "a"\ngpu = "Z100"\ngpus = 8\n'
                 "intra_gb_per_s = 240.0\n[inter]\ngb_per_s = [[0]]\n")
    assert "Z100" in one_error_line(est("-c", str(p)))


@pytest.mark.parametrize("args", [["--dp", "0"], ["--chunks", "0"], ["--cp", "0"],
                                  ["--mbs", "0"], ["--dp", "1000000"], ["--tp", "3"],
                                  ["--layers", "0,80"], ["--ep", "0"]])
def test_plan_option_combinations(args):
    one_error_line(est(*args))


@pytest.mark.parametrize("gpus", ["1000000000000", "true", "0"])
def test_topology_file_sizes(tmp_path, gpus):
    topo = tmp_path / "t.toml"
    topo.write_text(f"gpus = {gpus}\nuniform_gb_per_s = 100.0\n")
    p = tmp_path / "c.toml"
    p.write_text(f'name = "c"\n[[nodes]]\nname = "a"\ngpu = "A100-80GB"\ngpus = 8\n'
                 f'intra_topology = "{topo}"\n[inter]\ngb_per_s = [[0]]\n')
    one_error_line(RUN.invoke(app, ["cluster", "show", str(p)]))


def test_csv_the_csv_module_cannot_parse(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text('from\\to,a,b\na,,"1.0\nb,2.0,\n' + "x" * 200_000 + '"\n')
    one_error_line(RUN.invoke(app, ["cluster", "import", str(p), "--gpu", "A100-80GB",
                                    "--gpus-per-node", "8", "--intra-gb-per-s", "240"]))


def test_ctrl_c_returns_the_best_plan_so_far_with_a_valid_bound():
    """The first Ctrl-C inside stop_on_sigint (solve and compare's CLI) winds the search down
    as at its time limit: a plan, a bound at or below it, a note, well before the limit, with
    worker processes (a Ctrl-C early in the bounding had left the pool waiting for ever on
    workers killed mid-task). A second search begun after the stop (compare's anneal row) is
    past its deadlines at once; the stop is cleared when the block ends."""
    import signal
    import threading
    import time

    from formats.clusters import SynthParams, synth_cluster
    from formats import presets
    from model import work
    from model.specs import JobSpec
    from solvers.search import solve
    from solvers.workers import stop_on_sigint

    c = synth_cluster(SynthParams(num_nodes=16, degraded=2, degraded_factor=0.3, noise=0.2,
                                  oversubscription=3, seed=16))
    m, job = presets.model("llama2-70b"), JobSpec(global_batch=256, seq_length=4096)
    said, before = [], signal.getsignal(signal.SIGINT)
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    t0 = time.perf_counter()
    with stop_on_sigint(said.append):
        timer.start()
        res = solve(m, job, c, method="exact", time_limit_s=60, jobs=2)
        again = solve(m, job, c, method="anneal", time_limit_s=60, jobs=1)
    took = time.perf_counter() - t0
    timer.cancel()
    assert said and "Ctrl-C again" in said[0]
    assert took < 30 and work.stop_offset() == 0.0
    for r in (res, again):
        assert r.plan is not None and r.bound_ms <= r.objective_ms
        assert r.termination != "optimal" and any("stopped by Ctrl-C" in n for n in r.notes)
    assert signal.getsignal(signal.SIGINT) is before
