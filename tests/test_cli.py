"""The CLI as a user drives it: exit codes, one-line errors, JSON output."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return runner.invoke(app, list(args))


def test_help_lists_commands():
    r = run("--help")
    assert r.exit_code == 0
    for cmd in ("estimate", "validate", "presets"):
        assert cmd in r.output
    # Each command's line in the list reads as one sentence: typer printed the docstring's own
    # line breaks there ("write a profile for" / "--calibration ..." on two lines).
    wide = runner.invoke(app, ["--help"], env={"COLUMNS": "400"}).output
    assert "write a profile for --calibration (fragmentation too" in wide
    sub = runner.invoke(app, ["sweep", "--help"], env={"COLUMNS": "400"}).output
    assert "store holds); or `sweep report RESULTS`" in sub


def test_estimate_json_on_builtin_example():
    r = run("estimate", "--recompute", "full", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    est = d["estimate"]
    assert est["iteration_ms"] > 0 and 0 < est["mfu"] < 1
    assert len(est["stages"]) == 4
    assert est["fits"] is True


def test_fp8_mfu_says_which_peak():
    """FP8 plans' MFU is taken against the 16-bit dense peak (model.estimator) and can pass
    what bf16 could reach: the summary line says so, and only for FP8."""
    common = ("estimate", "-c", "h100-8x8", "--tp", "8", "--pp", "2", "--recompute", "full")
    fp8 = run(*common, "--precision", "fp8")
    bf16 = run(*common)
    assert fp8.exit_code == 0 and bf16.exit_code == 0, fp8.output + bf16.output
    assert "(of the 16-bit peak)" in fp8.output
    assert "(of the 16-bit peak)" not in bf16.output


@pytest.mark.parametrize("args,needle", [
    (["--model", "nope"], "unknown model 'nope'; known:"),
    # a name longer than any path the system can look up (the fuzz's sweep family, seed 14)
    (["--model", "y" * 300], "unknown model 'yyy"),
    (["--model", "y" * 300 + ".json"], "file not found"),
    (["--cluster", "nope"], "unknown cluster 'nope'"),
    (["--tp", "3"], "does not divide"),
    (["--tp", "8", "--pp", "4", "--dp", "3"], "TP x PP x DP"),
    # DP not given and not whole: said, not floored into a DP nobody gave
    (["--cluster", "h100-8x8", "--tp", "1", "--pp", "1", "--cp", "3"],
     "TP x PP x CP = 1x1x3 = 3 does not divide the 64 GPUs"),
    (["--gbs", "100", "--mbs", "3"], "not divisible"),
    (["--layers", "1,2"], "layers"),
    (["--tp", "0"], "tp: must be a positive integer"),
    (["--cp", "0"], "cp: must be a positive integer"),
    (["--tp", "8", "--pp", "1", "--cp", "4", "--seq", "4100", "--sp"], "2 x CP x TP"),
    (["--fp8-param-gather"], "fp8_param_gather: it keeps FP8 linear layers' weights in FP8"),
    (["--cluster", "h100-8x8", "--precision", "fp8", "--fp8-param-gather"],
     "FP8 weights need FP8 linear layers and the distributed optimizer"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    r = run("estimate", *args)
    assert r.exit_code == 2
    assert needle in r.output
    assert "Traceback" not in r.output


def test_bad_cluster_files(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text("name='x'\n[[nodes]]\nname='a'\ngpu='A100-80GB'\ngpus=8\nintra_gb_per_s=200\n"
                   "[[nodes]]\nname='b'\ngpu='A100-80GB'\ngpus=8\nintra_gb_per_s=200\n"
                   "[inter]\ngb_per_s=[[0, -3], [20, 0]]\n")
    r = run("estimate", "--cluster", str(bad), "--tp", "8", "--pp", "2")
    assert r.exit_code == 2 and str(bad) in r.output and "inter.gb_per_s" in r.output
    bad.write_text("name = [broken")
    r = run("estimate", "--cluster", str(bad))
    assert r.exit_code == 2 and "not valid TOML" in r.output
    bad.write_text("name='x'\n[[nodes]]\nname='a'\ngpu='Z100'\ngpus=8\nintra_gb_per_s=200\n"
                   "[inter]\ngb_per_s=[[0]]\n")
    r = run("estimate", "--cluster", str(bad))
    assert r.exit_code == 2 and "nodes[0].gpu" in r.output and "A100-80GB" in r.output


def test_presets_json():
    r = run("presets", "--json")
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert "H100-SXM-80GB" in d["gpus"] and "llama3-405b" in d["models"]
    assert d["models"]["llama3-70b"]["params_billion"] == pytest.approx(70.6, abs=0.5)


def test_cli_as_a_process_exit_code():
    p = subprocess.run([sys.executable, "cli.py", "estimate", "--model", "nope"], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1


def test_cluster_commands_speak_json(tmp_path):
    out = tmp_path / "s.toml"
    r = run("cluster", "synth", "--nodes", "4", "--seed", "1", "-o", str(out), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout if hasattr(r, "stdout") else r.output)
    assert len(d["nodes"]) == 4 and len(d["inter_gb_per_s"]) == 4 and out.exists()
    fixtures = Path(__file__).parent / "fixtures" / "matrix.csv"
    r = run("cluster", "import", str(fixtures), "--gpu", "A100-80GB", "--gpus-per-node", "8",
            "--intra-gb-per-s", "240", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["nodes"]


def test_one_spelling_per_concept_old_ones_hidden_but_accepted(tmp_path):
    """--gbs and --out everywhere; --global-batch and --output (and import's --nodes) still
    work, hidden from --help."""
    a = json.loads(run("estimate", "--gbs", "128", "--json").output)
    for old in (["--global-batch", "128"], ["--global-batch=128"]):
        r = run("estimate", *old, "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["estimate"] == a["estimate"]
    for cmd in (["estimate"], ["solve"], ["compare"]):
        h = run(*cmd, "--help").output
        assert "--gbs" in h and "--global-batch" not in h
    out = tmp_path / "c.toml"
    r = run("cluster", "synth", "--nodes", "2", "--output", str(out))
    assert r.exit_code == 0 and out.exists()
    for cmd in (["cluster", "synth"], ["cluster", "import"], ["emit"]):
        h = run(*cmd, "--help").output
        assert "--out" in h and "--output" not in h
    fixtures = Path(__file__).parent / "fixtures" / "matrix.csv"
    names = "n3,n1,n2"  # not the file's order: the option decides it
    for flag in ("--node-names", "--nodes"):
        r = run("cluster", "import", str(fixtures), "--gpu", "A100-80GB", "--gpus-per-node", "8",
                "--intra-gb-per-s", "240", flag, names, "--json")
        assert r.exit_code == 0, r.output
        assert ",".join(n["name"] for n in json.loads(r.stdout)["nodes"]) == names


def test_solve_names_an_empty_search_space():
    r = run("solve", "--cp", "3", "--time-limit", "5")
    assert r.exit_code == 2 and "no plan in the search space" in r.output
    assert "cp [3]" in r.output and "Traceback" not in r.output
    # FP8 weights that no plan of the space could use
    r = run("solve", "--cluster", "h100-8x8", "--precision", "fp8", "--zero", "0,3",
            "--fp8-param-gather", "--time-limit", "5")
    assert r.exit_code == 2 and "--zero allows 0,3: add 1 or 2" in r.output


def test_estimate_warns_of_unaligned_shapes(tmp_path):
    """A head dimension that is not a multiple of 16 bytes (BLOOM's 14400 / 96 = 150) is priced
    as if aligned; estimate and solve say so in one line, and stay silent on aligned models."""
    cfg = {"model_type": "llama", "num_hidden_layers": 8, "hidden_size": 14400,
           "num_attention_heads": 96, "num_key_value_heads": 96, "intermediate_size": 57600,
           "vocab_size": 32000, "max_position_embeddings": 2048, "tie_word_embeddings": False}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    r = run("estimate", "-m", str(p), "--tp", "8", "--pp", "1", "--recompute", "full", "--json")
    assert r.exit_code == 0, r.output
    warns = json.loads(r.output)["warnings"]
    assert len(warns) == 1 and warns[0].startswith("head dimension 150 is not a multiple of 8")
    r = run("estimate", "-m", str(p), "--tp", "8", "--pp", "1", "--recompute", "full")
    assert "warning: head dimension 150" in r.output
    # the key is always there (empty without warnings), as solve's; the breakdown has one key
    # set whatever the plan (a part the plan has none of is 0.0)
    d = json.loads(run("estimate", "--json").output)
    assert d["warnings"] == []
    from formats.views import BREAKDOWN_KEYS
    assert tuple(d["estimate"]["breakdown_ms"]) == BREAKDOWN_KEYS
    assert d["estimate"]["breakdown_ms"]["ep_alltoall_ms"] == 0.0
    # per-GPU widths follow TP; FP8 asks 16 elements; a head above 256 leaves FlashAttention
    import dataclasses
    from types import SimpleNamespace

    from formats import presets
    from model.compute import shape_warnings
    from model.specs import JobSpec

    m = presets.model(str(p))
    job = JobSpec(global_batch=64, seq_length=2048, precision="bf16")
    text = " ".join(shape_warnings(m, job, SimpleNamespace(tp=32, fp8=False, expert_tp=32)))
    assert "query width per GPU 450 " in text and "MLP width per GPU" not in text
    text = " ".join(shape_warnings(m, job, SimpleNamespace(tp=8, fp8=True, expert_tp=8)))
    assert "query width per GPU 1800 is not a multiple of 16 elements (16 bytes in FP8)" in text
    wide = dataclasses.replace(m, num_heads=32, num_kv_heads=32)
    one = SimpleNamespace(tp=1, fp8=False, expert_tp=1)
    assert any("above 256" in w for w in shape_warnings(wide, job, one))
    for name in ("llama3-8b", "llama3-70b", "gpt3-175b"):
        assert shape_warnings(presets.model(name), job, SimpleNamespace(
            tp=8, fp8=True, expert_tp=8)) == [], name
    # the tied embedding's all-reduce between the first and last stage is priced
    # (Evaluator.tied_ms), not warned about
    gpt3 = presets.model("gpt3-175b")
    assert shape_warnings(gpt3, job, SimpleNamespace(tp=8, pp=8, fp8=False, expert_tp=8)) == []


@pytest.mark.parametrize("key, value", [
    ("tie_word_embeddings", "false"), ("head_dim", 128.0), ("rope_theta", "5e5"),
    ("attention_dropout", "0.1"), ("_name_or_path", "a\nb"), ("num_hidden_layers", "32")])
def test_hf_config_values_of_the_wrong_type_are_refused_not_coerced(tmp_path, key, value):
    """A string "false" is not false, 128.0 is not a head width: one line naming the key."""
    cfg = {"model_type": "llama", "num_hidden_layers": 8, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 128256, "max_position_embeddings": 8192, key: value}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    r = run("estimate", "-m", str(p), "--tp", "8", "--pp", "1")
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    # the file's own key (num_hidden_layers had been named by our field, num_layers)
    assert f"config.json: {key}:" in r.output, r.output


def test_torchtitan_release_decides_how_kv_is_counted(tmp_path):
    """`--framework-version 0.1` estimates torchtitan v0.1, which repeats K and V to every
    query head before attention: its context-parallel K/V exchange (CP 8 across 8 nodes
    here) moves 8x the bytes, and the plan file records it; the current release does not."""
    out = {}
    for version in ("0.1", "0.2"):
        path = tmp_path / f"plan{version}.json"
        r = run("estimate", "-m", "llama3-70b", "-c", "h100-8x8", "--gbs", "8", "--seq",
                "131072", "--framework", "torchtitan", "--tp", "8", "--pp", "1", "--dp", "1",
                "--cp", "8", "--zero", "3", "--recompute", "full", "--framework-version",
                version, "--save-plan", str(path), "--json")
        assert r.exit_code == 0, r.output
        saved = json.loads(path.read_text())
        out[version] = (saved["job"]["repeat_kv"], json.loads(r.output)["estimate"])
    assert out["0.1"][0] is True and out["0.2"][0] is False
    assert out["0.1"][1]["iteration_ms"] > out["0.2"][1]["iteration_ms"]
    # emit follows the release the plan was priced for (it had written v0.2's files for the
    # v0.1 plan, with a warning); a release given wins, and says the difference
    for version, given, warned in (("0.1", [], False), ("0.2", [], False),
                                   ("0.1", ["--framework-version", "0.2"], True)):
        d = tmp_path / f"emit{version}{len(given)}"
        r = run("emit", str(tmp_path / f"plan{version}.json"), "--framework", "torchtitan",
                "--out", str(d), *given, "--json")
        assert r.exit_code == 0, r.output
        written = (d / "torchtitan.toml").read_text()
        release = given[1] if given else version
        assert written.startswith(f"# torchtitan {release}.x job config"), written[:100]
        assert any("[attention]" in w for w in json.loads(r.output)["warnings"]) == warned
    # another framework's estimate does not read it: one line, exit 2
    r = run("estimate", "--framework-version", "0.1")
    assert r.exit_code == 2 and "--framework-version: is for --emit" in r.output
    r = run("estimate", "--framework", "torchtitan", "--framework-version", "0.3", "--zero", "3")
    assert r.exit_code == 2 and "not '0.3'" in r.output


def test_kv_rotate_option(tmp_path):
    """`estimate --kv-rotate alltoall` plans torchtitan's alltoall K/V rotation (the plan file
    keeps it); a Megatron-LM plan refuses it, and `solve` a rotation it does not know, in one
    line each."""
    path = tmp_path / "p.json"
    common = ("-m", "llama3-8b", "-c", "h100-8x8", "--gbs", "8", "--seq", "65536", "--tp", "2",
              "--pp", "1", "--dp", "4", "--cp", "8", "--recompute", "full")
    r = run("estimate", *common, "--framework", "torchtitan", "--zero", "3", "--kv-rotate",
            "alltoall", "--save-plan", str(path), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(path.read_text())["plan"]["shape"]["cp_alltoall"] is True
    r = run("estimate", *common, "--kv-rotate", "alltoall")
    assert r.exit_code == 2 and "--kv-rotate: is torchtitan's K/V rotation" in r.output
    r = run("estimate", *common, "--framework", "torchtitan", "--zero", "3", "--cp", "1",
            "--dp", "32", "--gbs", "32", "--kv-rotate", "alltoall")
    assert r.exit_code == 2 and "cp_alltoall: is torchtitan's choice" in r.output
    r = run("solve", "--kv-rotate", "alltoall")  # the example is a Megatron-LM job
    assert r.exit_code == 2 and "--kv-rotate: is torchtitan's K/V rotation" in r.output
    r = run("solve", "--framework", "torchtitan", "--kv-rotate", "ring")
    assert r.exit_code == 2 and "--kv-rotate" in r.output
    # a long sequence with --cp 1: the line blames --cp 1, not the sequence's length
    r = run("solve", "-m", "llama3-8b", "-c", "h100-8x8", "--framework", "torchtitan",
            "--kv-rotate", "alltoall", "--cp", "1", "--gbs", "64", "--seq", "32768")
    assert r.exit_code == 2 and "(--cp 1)" in r.output and "below" not in r.output, r.output


def test_zero3_overlap_refusal_names_the_overlap_given():
    """ZeRO-3 with a bucket overlap: the line names the overlap the user gave."""
    common = ("-m", "llama3-70b", "-c", "h100-8x8", "--gbs", "128", "--seq", "8192", "--tp",
              "4", "--pp", "2", "--zero", "3", "--sp")
    for flag, field in (("--overlap-param-gather", "overlap_param_gather"),
                        ("--overlap-grad-reduce", "overlap_grad_reduce")):
        r = run("estimate", *common, flag)
        assert r.exit_code == 2 and f"{field}: ZeRO-3 prefetches" in r.output, r.output


def test_help_shows_bracketed_defaults():
    """Help texts end with their default in brackets; rich markup must not swallow them as
    style tags (they are escaped)."""
    r = runner.invoke(app, ["solve", "--help"], env={"COLUMNS": "300"})
    assert r.exit_code == 0
    for text in ("[solver chooses]", "[all cores]", "e.g. 4,8 [all]"):
        assert text in r.output, text


@pytest.mark.parametrize("args, says", [
    (["solve", "--gbs", "abc"], "'--gbs'"), (["estimate", "--kv-rotate", "foo"], "'foo'"),
    (["solve", "--nosuch", "3"], "--nosuch"), (["calibrate"], "Missing argument"),
    (["solve", "--precision", "bf16,,fp8"], "--precision"), (["solve", "--tp", "8,,4"], "--tp"),
    (["solvee"], "Did you mean 'solve'?"), (["cluster", "shw"], "Did you mean 'show'?"),
    (["--version"], "--version"), (["estimate", "--gbs", "0"], "give 1 to 2,147,483,648"),
    (["sweep", "reprot", "x.sqlite"], "did you mean `sweep report x.sqlite`?"),
    (["cluster", "import", "tests/fixtures/nccl_pairs", "--gpu", "A100-80GB",
      "--gpus-per-node", "8", "--intra-gb-per-s", "240", "--format", "ncl"],
     "--format: unknown format 'ncl'"),
    (["cluster", "import", "tests/fixtures/nccl_pairs", "--gpu", "A100-80GB",
      "--gpus-per-node", "8", "--intra-gb-per-s", "240", "--fill", "symetric"], "--fill"),
])
def test_option_errors_are_one_line_with_exit_2(args, says):
    """A value click cannot convert, an unknown option, a missing argument or an empty list
    item, an unknown command (a box of five before), a mistyped subcommand of sweep or a
    format or fill rule of cluster import: one line naming it, exit 2; whole bounds in full."""
    r = run(*args)
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert lines[0].startswith("error: options: ") and says in lines[0], lines[0]


def test_placement_names_context_parallel_ranks():
    from model.plan import slot_label
    assert slot_label(1, 6, 4) == "s1/r1c2" and slot_label(0, 5) == "s0/r5"


def test_moe_options_are_checked_not_ignored(tmp_path):
    """A capacity factor below 1 (dropped tokens: MFU had read 169.7%) or on a dense model is
    one line; --etp reaches estimate, which rebuilds solve's EP=8 ETP=1 plans."""
    r = run("estimate", "-m", "mixtral-8x7b", "-c", "h100-8x8", "--tp", "1", "--pp", "4",
            "--ep", "8", "--moe-capacity-factor", "0.5")
    assert r.exit_code == 2 and "1 or more" in r.output, r.output
    r = run("estimate", "-m", "llama2-70b", "--moe-capacity-factor", "2")
    assert r.exit_code == 2 and "is dense" in r.output, r.output
    r = run("estimate", "-m", "deepseek-v2-lite", "-c", "h100-8x8", "--tp", "8", "--pp", "2",
            "--ep", "8", "--etp", "1", "--sp", "--distopt", "--recompute", "full", "--gbs",
            "64", "--json")
    assert r.exit_code == 0, r.output
    shape = json.loads(r.output)["plan"]["shape"]
    assert (shape["ep"], shape["etp"]) == (8, 1), shape


def test_a_plan_file_given_as_a_log_is_named(tmp_path):
    plan = tmp_path / "p.json"
    assert run("estimate", "--save-plan", str(plan)).exit_code == 0
    r = run("calibrate", str(plan), "--plan", str(plan))
    assert r.exit_code == 2 and "is a plan file, not a training log" in r.output, r.output


def test_estimate_turns_sequence_parallelism_on_where_the_framework_needs_it():
    """Without --sp/--no-sp, TP > 1 runs with sequence parallelism for torchtitan (its TP
    shards the norms; the estimate had priced plain TP, which it cannot run) and for a mixture
    of experts (Megatron-LM refuses MoE with TP but not SP); a dense Megatron-LM job keeps its
    default, off; --no-sp is taken as given."""
    common = ("-c", "h100-8x8", "--gbs", "32", "--seq", "4096", "--tp", "8", "--json")
    for args, want in ((("-m", "llama3-70b", "--framework", "torchtitan", "--zero", "3"), True),
                       (("-m", "mixtral-8x7b", "--pp", "2"), True),
                       (("-m", "llama3-70b", "--pp", "2"), False),
                       (("-m", "llama3-70b", "--pp", "2", "--sp"), True),
                       (("-m", "llama3-70b", "--framework", "torchtitan", "--zero", "3",
                         "--no-sp"), False)):
        r = run("estimate", *common, *args)
        assert r.exit_code == 0, r.output
        d = json.loads(r.output)
        assert d["plan"]["shape"]["sequence_parallel"] is want, args
        # torchtitan without it: priced as asked, and said (torchtitan does not run it)
        assert any("always shards the norms" in w for w in d["warnings"]) == (
            "--no-sp" in args), d["warnings"]


def test_a_tokenizer_path_with_a_space_is_refused(tmp_path):
    """megatron_args.txt holds a flag and its value per line, which launch.sh splits into
    words: a tokenizer path with a space had reached Megatron-LM as two arguments."""
    r = run("estimate", "--emit", "megatron", "--out", str(tmp_path / "e"), "--tokenizer",
            "/models/my tok")
    assert r.exit_code == 2 and "--tokenizer" in r.output and "has a space" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "e").exists()


def test_a_path_given_for_a_cluster_or_model_is_said_to_be_what_it_is(tmp_path):
    """A folder, a .txt or an extension-less file given to --cluster / --model: said what is
    wrong with it (it had been 'unknown cluster ...; known presets: ...')."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "two.txt").write_text("x\n")
    (tmp_path / "noext").write_text("x\n")
    for flag, path, says in (
            ("-c", "adir", "adir is a folder; give a cluster .toml file"),
            ("-c", "two.txt", "two.txt is not a .toml file"),
            ("-c", "noext", "noext is not a .toml file"),
            ("-m", "adir", "adir is a folder without a config.json"),
            ("-m", "two.txt", "two.txt is not a .json file"),
            ("-m", "noext", "noext is not a .json file")):
        r = run("estimate", flag, str(tmp_path / path))
        line = " ".join(r.output.split())
        assert r.exit_code == 2 and says in line and "unknown" not in line, line


@pytest.mark.parametrize("args", [["estimate", "--sp", "--no-sp"],
                                  ["estimate", "--blocking", "--overlapped"],
                                  ["solve", "--overlapped", "--blocking"],
                                  ["calibrate", "x.log", "--prior", "--no-prior"]])
def test_an_on_off_flag_given_both_ways_is_refused(args):
    """--sp --no-sp or --blocking --overlapped: one line, exit 2 (the last had won without a
    word)."""
    r = run(*args)
    assert r.exit_code == 2 and "both given; give one of them" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


def test_json_errors_of_the_options_themselves_are_objects_on_stdout():
    """An option refused while the line is parsed (a callback's range, a type error) under
    --json is also the JSON object on stdout, as errors inside the command are (it had left
    stdout empty); without --json stdout stays empty."""
    for args in (["estimate", "--gbs", "0", "--json"], ["estimate", "--tp", "two", "--json"],
                 ["estimate", "--tp", "3", "--json"]):
        r = run(*args)
        assert r.exit_code == 2
        line = r.stderr.strip()
        assert line.startswith("error: ") and "\n" not in line
        assert json.loads(r.stdout) == {"error": line.removeprefix("error: "), "exit_code": 2}
    r = run("estimate", "--gbs", "0")
    assert r.exit_code == 2 and r.stdout == ""


def test_estimate_says_the_placement_and_slow_nodes_as_solve_does(tmp_path):
    """estimate (and estimate --plan of a solved plan) prints which node hosts which slot and
    the slow nodes' share of the plan, as solve does (it had left both out, so the degraded
    node's explanation appeared in solve only)."""
    r = runner.invoke(app, ["estimate"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "node05 │ s2/r1[0,1,2,3,4,5,6,7]" in text
    assert "slow node node05: best network stream" in text and "hosts s2/r1" in text


def test_deepspeed_cannot_be_priced_with_overlapped_sends():
    """DeepSpeed's pipeline engine blocks on every send and receive: --overlapped is refused
    for it in estimate, solve and compare (it had been priced without a word)."""
    base = ["-m", "gpt-7.5b", "--gbs", "64", "--seq", "2048", "--framework", "deepspeed",
            "--overlapped"]
    for cmd in (["estimate", "--tp", "1", "--pp", "4"], ["solve", "--time-limit", "5"],
                ["compare", "--time-limit", "5"]):
        r = runner.invoke(app, [cmd[0], *base, *cmd[1:]])
        assert r.exit_code == 2 and "--overlapped: DeepSpeed's pipeline engine blocks" in \
            r.output, (cmd, r.output)
