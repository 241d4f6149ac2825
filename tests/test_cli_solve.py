"""`solve` and `compare` end to end on a tiny instance."""

import csv
import json

import pytest
from typer.testing import CliRunner

from cli import app
from formats.clusters import SynthParams, cluster_to_toml, synth_cluster
from model.specs import JobSpec

runner = CliRunner()


def _inputs(tmp_path, cfg: dict, cluster) -> list[str]:
    """A Hugging Face config.json and a cluster TOML in tmp_path, as CLI arguments."""
    m = tmp_path / "config.json"
    m.write_text(json.dumps(cfg))
    t = tmp_path / "c.toml"
    t.write_text(cluster_to_toml(cluster))
    return ["--model", str(m), "--cluster", str(t)]


@pytest.fixture
def tiny(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 1024,
           "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 2816,
           "vocab_size": 8000, "max_position_embeddings": 1024}
    c = synth_cluster(SynthParams(num_nodes=4, gpus_per_node=2, nic_gb_per_s=2.0, leaf_size=2,
                                  oversubscription=3, degraded=1, degraded_factor=0.3,
                                  noise=0.1, seed=0))
    return _inputs(tmp_path, cfg, c) + ["--gbs", "8", "--seq", "1024"]


def test_solve_json_and_plan_file_round_trip(tiny, tmp_path):
    plan = tmp_path / "plan.json"
    r = runner.invoke(app, ["solve", *tiny, "--json", "--time-limit", "60",
                            "--save-plan", str(plan)])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    s = d["solver"]
    assert s["termination"] == "optimal" and s["gap"] <= 1e-4
    assert d["estimate"]["iteration_ms"] == pytest.approx(s["objective_ms"], rel=1e-6)
    assert s["bound_ms"] <= s["objective_ms"]
    assert any(c["status"] == "best" for c in d["candidates"])
    r2 = runner.invoke(app, ["estimate", "--plan", str(plan), "--json"])
    assert r2.exit_code == 0, r2.output
    assert json.loads(r2.output)["estimate"]["iteration_ms"] == pytest.approx(
        s["objective_ms"], rel=1e-9)


def test_solve_names_the_slow_node_and_what_the_plan_gives_it(tiny, tmp_path):
    """The nodes `cluster show` flags (here the synthetic cluster's degraded NIC, and its
    leaf-mate, whose every stream is then slow: leaves of 2, 3x oversubscribed) are named in
    solve's output with the slots the plan gives each, the same in the JSON; a uniform
    cluster has none."""
    from formats.bandwidth import summarize
    from formats.clusters import load_cluster
    from render import slow_nodes

    r = runner.invoke(app, ["solve", *tiny, "--json", "--time-limit", "60"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    slow = d["slow_nodes"]
    flagged = summarize(load_cluster(tiny[tiny.index("--cluster") + 1]))["outliers"]
    assert [o["node"] for o in slow] == [o["node"] for o in flagged] and slow
    for o in slow:
        assert o["link"] == "network" and o["ratio"] < 0.75
        hosted = {f"s{x['stage']}/r{x['replica']}" for x in d["plan"]["placement"]
                  if x["node"] == o["node"]}
        assert set(o["slots"]) == hosted
    r = runner.invoke(app, ["solve", *tiny, "--time-limit", "60"])
    assert f"slow node {slow[0]['node']}: best network stream" in r.output
    from formats.clusters import uniform_cluster
    from model.estimator import make_plan
    from model.specs import JobSpec
    from formats import presets
    c = uniform_cluster(2, 4, "A100-80GB", 240.0, 25.0)
    plan = make_plan(presets.model("gpt-1.7b"), JobSpec(global_batch=8, seq_length=1024), c,
                     tp=1, pp=2, dp=4)
    assert slow_nodes(plan, c) == []
    # a node slow only sending: the line says which way (cluster show's direction), as it
    # had not
    import dataclasses
    import numpy as np
    from render import print_slow_nodes
    c4 = uniform_cluster(4, 4, "A100-80GB", 240.0, 25.0)
    m = np.array(c4.inter_gb_per_s, dtype=float)
    m[2, :] = 5.0
    np.fill_diagonal(m, 0.0)
    c4 = dataclasses.replace(c4, inter_gb_per_s=m)
    p4 = make_plan(presets.model("gpt-1.7b"), JobSpec(global_batch=8, seq_length=1024), c4,
                   tp=1, pp=2, dp=8)
    rows = slow_nodes(p4, c4)
    assert [(o["node"], o["direction"]) for o in rows] == [(c4.nodes[2].name, "out")]
    import io
    from rich.console import Console
    import render
    buf = io.StringIO()
    old = render.console
    render.console = lambda: Console(file=buf, width=200)
    try:
        print_slow_nodes(p4, c4)
    finally:
        render.console = old
    assert "best network stream sending 5.0 GB/s" in buf.getvalue()


def test_solve_tables_name_the_losers(tiny):
    r = runner.invoke(app, ["solve", *tiny, "--time-limit", "60"])
    assert r.exit_code == 0, r.output
    assert "Best plan" in r.output and "Placement" in r.output
    assert "proven optimal" in r.output and "gap" in r.output
    assert "Next best plans and why they lost" in r.output


def test_next_best_lists_bound_pruned_shapes_when_none_was_timed():
    """A solve whose other fitting shapes were all pruned by their lower bounds still names
    its runners-up (lowest bound first), after any shape that was timed; misfits and the best
    plan are not among them."""
    from solvers.result import Candidate, SolveResult

    def C(describe, status, best_ms, quick_ms, lower_bound_ms):
        return Candidate(describe, lower_bound_ms, quick_ms, best_ms, status)

    def next_best(cands, k=8):  # what solve's "Next best plans" table lists
        return SolveResult(None, None, 1.0, 1.0, "optimal", "exact", 0.0, cands).runners_up(k)

    cands = [C(describe="best", status="best", best_ms=1.0, quick_ms=None, lower_bound_ms=1.0),
             C(describe="p3", status="pruned: bound", best_ms=None, quick_ms=None,
               lower_bound_ms=3.0),
             C(describe="oom", status="does not fit: stage 0", best_ms=None, quick_ms=None,
               lower_bound_ms=0.5),
             C(describe="p2", status="pruned: bound", best_ms=None, quick_ms=None,
               lower_bound_ms=2.0)]
    assert [x.describe for x in next_best(cands)] == ["p2", "p3"]
    cands.append(C(describe="t", status="gap", best_ms=5.0, quick_ms=6.0, lower_bound_ms=1.5))
    assert [x.describe for x in next_best(cands)] == ["t", "p2", "p3"]
    assert [x.describe for x in next_best(cands, k=2)] == ["t", "p2"]


def test_solve_nothing_fits_exit_2(tmp_path):
    # its weights, gradients and optimizer state (64 GiB) would fit spread over both GPUs:
    # what is not searched can be named
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 8192,
           "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672,
           "vocab_size": 128256, "max_position_embeddings": 8192}
    c = synth_cluster(SynthParams(num_nodes=1, gpus_per_node=2, gpu="A100-40GB", degraded=0))
    r = runner.invoke(app, ["solve", *_inputs(tmp_path, cfg, c), "--gbs", "8",
                            "--seq", "8192", "--time-limit", "10"])
    assert r.exit_code == 2
    assert "nothing fits" in r.output and "closest" in r.output and "GiB" in r.output
    # what saves memory and was left out of the search is named (Megatron-LM's opt-in ZeRO-3,
    # a --recompute list without full), the lists given too
    assert "Not searched: ZeRO-3 / FSDP (--zero 3" in r.output
    r = runner.invoke(app, ["solve", *_inputs(tmp_path, cfg, c), "--gbs", "8", "--seq", "8192",
                            "--time-limit", "10", "--recompute", "none", "--zero", "0,3",
                            "--tp", "2"])
    assert r.exit_code == 2 and "nothing fits" in r.output, r.output
    assert "full recompute (--recompute was none)" in r.output and "--tp values" in r.output
    assert "ZeRO-3" not in r.output.split("Not searched")[1]


def test_nothing_fits_for_the_model_states_says_how_many_gpus(tmp_path):
    """Where the weights, gradients and optimizer state alone exceed every GPU's room, spread
    with nothing replicated, "nothing fits" says so and how many GPUs would hold them, and
    names no option (it had sent the user from --zero 3 to the distributed optimizer and
    back, and to a shorter sequence); --json puts the error on stdout as an object (it had
    printed nothing there)."""
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 8192,
           "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672,
           "vocab_size": 128256, "max_position_embeddings": 8192}
    c = synth_cluster(SynthParams(num_nodes=1, gpus_per_node=2, gpu="A100-40GB", degraded=0))
    for extra in ([], ["--zero", "3"]):
        r = runner.invoke(app, ["solve", *_inputs(tmp_path, cfg, c), "--gbs", "8", "--seq",
                                "8192", "--time-limit", "10", "--json", *extra])
        assert r.exit_code == 2
        err = json.loads(r.stdout)
        assert err["exit_code"] == 2 and err["error"] in r.output
        msg = err["error"]
        # 5.5B parameters x 18 bytes = 93 GiB; room (40 - 1) / 1.2 = 32.5 GiB a GPU
        assert "optimizer state alone are 93 GiB" in msg and "at least 3 GPUs with 32.5 GiB" \
            in msg and "2 nodes of 2" in msg, msg
        assert "Not searched" not in msg and "shorten the sequence" not in msg
        # the same facts as fields
        assert (err["gpus_needed_at_least"], err["gpus"]) == (3, 2)
        assert err["model_state_gib"] == pytest.approx(93, abs=0.5) and err["closest"]


def test_nothing_fits_with_zero_3_does_not_advise_the_distributed_optimizer():
    """ZeRO-3 shards the optimizer state too: with --zero 3 given, "not searched" does not
    name the distributed optimizer (ZeRO-1), which saves less."""
    from solvers.search import _not_searched
    from solvers.space import SearchSpace as Space
    assert "distributed optimizer" not in _not_searched(JobSpec(global_batch=8, seq_length=4096),
                                                        Space(zero=(3,)))
    assert "distributed optimizer" in _not_searched(JobSpec(global_batch=8, seq_length=4096),
                                                    Space(zero=(0,)))


def test_compare_writes_csv(tiny, tmp_path):
    out = tmp_path / "cmp.csv"
    r = runner.invoke(app, ["compare", *tiny, "--time-limit", "10", "--csv", str(out)])
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(out.open()))
    methods = [x["method"] for x in rows]
    assert methods[:3] == ["exact", "anneal", "megatron"] and "amp-style" in methods
    exact = float(rows[0]["iteration_ms"])
    for x in rows:
        assert float(x["iteration_ms"]) >= exact * (1 - 1e-4)  # nobody beats the optimum
        # each row says what produced it, and the ratio is against the reference it names
        assert (x["time_limit_s"], x["seed"], x["clock"]) == ("10.0", "0", "wall")
        assert x["reference"] in ("proven optimum", "lower bound")
    if rows[0]["reference"] == "proven optimum":
        for x in rows:
            assert float(x["over_reference"]) == pytest.approx(
                float(x["iteration_ms"]) / exact - 1, abs=1e-9)
    assert "over optimum" in r.output or "over lower bound" in r.output


def test_compare_megatron_row_differs_from_exact_by_placement_alone():
    """The "megatron" baseline is the exact plan (degrees and layer split) with Megatron-LM's
    rank placement. It had taken the balanced split, or where that did not fit a
    memory-balanced one, and charged placement with the split's cost (+33% on a uniform
    H100 cluster). Here, on a uniform cluster whose memory the time-balanced split (5, 6, 7,
    6) does not fit, the exact plan's (5, 7, 7, 5) is kept and placement costs nothing."""
    import dataclasses

    from formats import presets
    from formats.clusters import uniform_cluster
    from model.estimator import Evaluator
    from model.plan import megatron_placement
    from model.specs import JobSpec
    from solvers.compare import compare_instance
    from solvers.space import SearchSpace

    m = presets.model("gpt-1.7b")
    job = JobSpec(global_batch=64, seq_length=2048)
    c = uniform_cluster(2, 4, "A100-80GB", 240.0, 25.0)
    g = dataclasses.replace(c.nodes[0].gpu, memory_gib=11)
    c = dataclasses.replace(c, nodes=tuple(dataclasses.replace(n, gpu=g) for n in c.nodes))
    plans = {}
    rows = compare_instance(m, job, c, time_limit_s=20, plans=plans, space=SearchSpace(
        tp=(1,), pp=(4,), schedules=(("1f1b", 1),), recompute=("none",), micro_batch=(1,)))
    by = {r["method"]: r for r in rows}
    ex, mg = plans["exact"], plans["megatron"]
    assert mg.shape == ex.shape and ex.shape.layers == (5, 7, 7, 5)
    sh = ex.shape
    assert mg.placement == megatron_placement(c, sh.tp, sh.pp, sh.cols)
    assert by["megatron"]["iteration_ms"] == pytest.approx(
        Evaluator(m, job, c, sh).iteration_ms(mg.placement), rel=1e-9)
    assert by["megatron"]["iteration_ms"] == pytest.approx(by["exact"]["iteration_ms"],
                                                           rel=1e-9)


def test_compare_json_rows_carry_values_and_the_plan(tiny):
    """compare --json: the proof, gap and fit as values (not only the `proven` words), and
    each row's plan as solve --json gives it, whose shape is the row's plan string."""
    r = runner.invoke(app, ["compare", *tiny, "--time-limit", "10", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    by = {x["method"]: x for x in rows}
    ex = by["exact"]
    assert ex["proven_optimal"] == ex["proven"].startswith("yes")
    assert 0 <= ex["solver_gap"] < 1 and by["anneal"]["solver_gap"] is None
    assert not by["anneal"]["proven_optimal"] and by["anneal"]["fits"]
    for x in rows:
        d = x["plan_detail"]
        assert isinstance(x["fits"], bool) and set(d) == {"shape", "placement"}
        assert x["plan"].startswith(f"TP={d['shape']['tp']} PP={d['shape']['pp']}")
        assert sum(d["shape"]["layers"]) == 4 and len(d["placement"]) >= d["shape"]["pp"]


def test_compare_says_when_the_amp_style_baseline_has_no_plan(tiny, tmp_path, monkeypatch):
    """H100 80 GB beside H200 141 GB nodes: Llama-3 70B at TP 8 x PP 2 fits only with the
    larger stage on H200s, and the AMP-style model places ranks in Megatron-LM's order only,
    where none of its shapes fits. Its row says so (it had been left out of the table, the
    CSV and the JSON without a word)."""
    import numpy as np

    from formats import presets
    from model.cluster import ClusterSpec, NodeSpec
    from model.specs import JobSpec
    from solvers import compare as cmp
    from solvers.space import SearchSpace

    h100, h200 = presets.gpu("H100-SXM-80GB"), presets.gpu("H200-141GB")
    nodes = tuple(NodeSpec(f"n{i}", g, 8, 360.0) for i, g in enumerate((h100, h200, h100, h200)))
    i = np.arange(4)
    inter = np.where(i[:, None] == i, 0.0, 45.0 + 0.5 * abs(i[:, None] - i))  # slightly uneven
    c = ClusterSpec("mixed", nodes, inter, 5.0)
    space = SearchSpace(tp=(8,), pp=(2,), schedules=(("1f1b", 1),), recompute=("full",),
                        distributed_optimizer=(False,))
    job = JobSpec(global_batch=32, seq_length=8192)
    assert cmp.amp_style_plan(presets.model("llama3-70b"), job, c, space) is None
    # the same answer through compare on a small instance: the row, its reason, no number
    monkeypatch.setattr(cmp, "amp_style_plan", lambda *a, **k: None)
    csv_path = tmp_path / "rows.csv"
    r = runner.invoke(app, ["compare", *tiny, "--time-limit", "4", "--json", "--csv",
                            str(csv_path)])
    assert r.exit_code == 0, r.output
    amp = {x["method"]: x for x in json.loads(r.output)}["amp-style"]
    assert amp["plan"] == "-" and amp["iteration_ms"] is None and amp["fits"] is None
    assert amp["proven"].startswith("none: no shape fits") and amp["over_reference"] is None
    assert "amp-style" in csv_path.read_text()
    r = runner.invoke(app, ["compare", *tiny, "--time-limit", "4"])
    assert r.exit_code == 0 and "amp-style" in r.output and "Traceback" not in r.output


def test_compare_exact_row_says_when_it_annealed(tmp_path):
    """On nodes of two GPU types the MILP covers no block: the exact search anneals them and
    bounds them in closed form, and its compare row says so (it had read 'exact' beside an
    identical anneal row, with nothing to tell the race was not one)."""
    import numpy as np

    from formats import presets
    from model.cluster import ClusterSpec, NodeSpec
    cfg = {"model_type": "llama", "num_hidden_layers": 16, "hidden_size": 1024,
           "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 2816,
           "vocab_size": 8000, "max_position_embeddings": 1024}
    nodes = tuple(NodeSpec(f"n{i}", presets.gpu(g), 2, 240.0) for i, g in enumerate(
        ("A100-80GB", "H100-SXM-80GB", "A100-80GB", "H100-SXM-80GB", "A100-80GB")))
    inter = 20.0 + np.arange(25, dtype=float).reshape(5, 5) % 7
    np.fill_diagonal(inter, 0.0)
    c = ClusterSpec("two-types", nodes, inter, 5.0)
    r = runner.invoke(app, ["compare", *_inputs(tmp_path, cfg, c), "--gbs", "8", "--seq",
                            "1024", "--time-limit", "3", "--json"])
    assert r.exit_code == 0, r.output
    ex = {x["method"]: x for x in json.loads(r.output)}["exact"]
    assert "placement problem(s) annealed, not by the MILP" in ex["proven"], ex["proven"]


def test_compare_takes_solves_overlaps_and_torchtitan_release(tiny):
    """compare searches what solve would with the same overlap options, and prices a
    torchtitan job's release (it had neither, so a plan solved with them could not be
    compared like for like); a release for another framework is one line."""
    r = runner.invoke(app, ["compare", *tiny, "--time-limit", "5", "--tp", "2",
                            "--tp-comm-overlap", "--overlap-grad-reduce", "--json"])
    assert r.exit_code == 0, r.output
    ex = json.loads(r.output)[0]
    assert "tp-overlap" in ex["plan"] and ex["plan_detail"]["shape"]["tp_comm_overlap"]
    r = runner.invoke(app, ["compare", *tiny, "--framework-version", "0.1"])
    assert r.exit_code == 2 and "--framework-version" in r.output, r.output
    args = ["compare", "-m", "llama3-8b", "-c", "h100-8x8", "--gbs", "64", "--seq", "32768",
            "--framework", "torchtitan", "--cp", "4", "--tp", "2", "--time-limit", "4",
            "--clock", "work", "--json"]
    t = {v: json.loads(runner.invoke(app, [*args, *f]).output)[0]["iteration_ms"]
         for v, f in (("0.2", []), ("0.1", ["--framework-version", "0.1"]))}
    assert t["0.1"] > t["0.2"]  # v0.1 repeats K and V: more to exchange


def test_compare_cluster_seed_fixes_the_generated_clusters():
    """--seed varies the solvers; --cluster-seed keeps the generated clusters (--seed had
    changed both, mixing solver spread with cluster spread)."""
    base = ["compare", "-m", "gpt-1.7b", "--gbs", "8", "--seq", "256", "--generated", "1",
            "--nodes", "2", "--time-limit", "2", "--clock", "work", "--json"]
    names = []
    for seed in ("0", "1"):
        r = runner.invoke(app, [*base, "--seed", seed, "--cluster-seed", "5"])
        assert r.exit_code == 0, r.output
        d = json.loads(r.output)
        names.append({x["cluster"] for x in d})
        assert {x["seed"] for x in d} == {int(seed)}
    assert names[0] == names[1] == {"synth-2x8-A100-80GB-s5"}


def test_search_knobs_restrict_solve(tiny):
    """--tp, --pp, --mbs, --schedule, --recompute, --distopt restrict the search; the JSON
    records the space searched; bad values are one line and exit 2."""
    r = runner.invoke(app, ["solve", *tiny, "--json", "--time-limit", "30", "--tp", "2",
                            "--pp", "2,4", "--mbs", "1", "--schedule", "1f1b",
                            "--recompute", "full", "--no-distopt"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    sh = d["plan"]["shape"]
    assert sh["tp"] == 2 and sh["pp"] in (2, 4) and sh["micro_batch"] == 1
    assert sh["schedule"] == "1f1b" and sh["recompute"] == "full"
    assert sh["distributed_optimizer"] is False
    assert d["space"]["tp"] == [2] and d["space"]["pp"] == [2, 4]
    assert d["space"]["schedules"] == [["1f1b", 1]] and d["space"]["recompute"] == ["full"]
    for c in d["candidates"]:
        assert "TP=2 " in c["shape"] and "1f1b" in c["shape"] and "recompute=full" in c["shape"]
    assert not d["warnings"]
    # a listed value no valid plan has is said, not dropped in silence (8 GPUs: no TP 3, no
    # PP 3); the others are searched
    r = runner.invoke(app, ["solve", *tiny, "--json", "--time-limit", "10", "--tp", "2,3",
                            "--pp", "2,3", "--mbs", "1", "--recompute", "full"])
    assert r.exit_code == 0, r.output
    w = json.loads(r.output)["warnings"]
    assert any(x.startswith("--tp 3: no valid plan has this value") for x in w), w
    assert any(x.startswith("--pp 3: no valid plan") for x in w) and len(w) == 2, w
    # a schedule none of whose shapes is valid (8 chunks of a stage on a 4-layer model) too
    r = runner.invoke(app, ["solve", *tiny, "--json", "--time-limit", "5", "--mbs", "1",
                            "--recompute", "full", "--schedule", "1f1b,interleaved:8"])
    assert r.exit_code == 0, r.output
    w = json.loads(r.output)["warnings"]
    assert any(x.startswith("--schedule interleaved:8: no valid plan") for x in w), w
    # sharding asked for and not searched: ZeRO-1 for torchtitan beside ZeRO-3 had been
    # dropped without a word; now said, and ZeRO-3 searched
    r = runner.invoke(app, ["solve", *tiny, "--json", "--time-limit", "5", "--mbs", "1",
                            "--recompute", "full", "--zero", "1,3", "--framework", "torchtitan"])
    assert r.exit_code == 0, r.output
    assert any(x.startswith("--zero 1: no valid plan has this value here") and
               x.endswith("searched the others") for x in json.loads(r.output)["warnings"])
    # a list none of whose values any plan can have is refused before the search: an HSDP
    # shard group where only ZeRO-0/1 is searched (Megatron-LM's default), ZeRO-1 alone for
    # torchtitan (it had searched the DP 1 shapes alone, saying it searched without --zero)
    for args, says in ((["--shard-size", "2"], "--shard-size 2: no valid plan"),
                       (["--shard-size", "2", "--zero", "1"], "--shard-size 2: no valid plan"),
                       (["--zero", "1", "--framework", "torchtitan"], "--zero 1: no valid")):
        r = runner.invoke(app, ["solve", *tiny, "--time-limit", "5", "--mbs", "1",
                                "--recompute", "full", *args])
        assert r.exit_code == 2 and says in r.output, r.output
        assert "or drop " + args[0] in r.output and len(r.output.strip().splitlines()) == 1
    # --no-distopt had made the job ZeRO-0, which won over --zero 2 without a word
    r = runner.invoke(app, ["solve", *tiny, "--zero", "2", "--no-distopt"])
    assert r.exit_code == 2 and "--zero 2 with --no-distopt" in r.output, r.output
    # an overlap no shape can use (ZeRO-3 overlaps its own collectives) is said
    r = runner.invoke(app, ["solve", *tiny, "--json", "--time-limit", "5", "--mbs", "1",
                            "--recompute", "full", "--zero", "3", "--overlap-param-gather"])
    assert any(x.startswith("--overlap-param-gather: no valid plan here can use it")
               for x in json.loads(r.output)["warnings"]), r.output
    # compare --sharding's rows are the shardings: --zero there is refused, not ignored
    r = runner.invoke(app, ["compare", *tiny, "--sharding", "--zero", "1"])
    assert r.exit_code == 2 and "--zero with --sharding" in r.output, r.output
    for bad, flag in ((["--tp", "x"], "--tp"), (["--schedule", "zigzag"], "--schedule"),
                      (["--recompute", "some"], "--recompute"), (["--mbs", "0"], "--mbs")):
        r = runner.invoke(app, ["solve", *tiny, *bad])
        assert r.exit_code == 2 and flag in r.output
        assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("clock", ["wall", "work"])
def test_solve_json_on_stdout_is_json_alone(tiny, clock):
    """In a fresh process (HiGHS prints a banner on file descriptor 1 when its first solver
    object is made) `solve --json` writes nothing but the JSON document on stdout; with
    `--clock work` the solver status says so and how much work was used."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "cli.py"), "solve", *tiny, "--time-limit",
                        "2", "--clock", clock, "--json"], capture_output=True, text=True,
                       cwd=root)
    assert r.returncode == 0, r.stderr[-500:]
    d = json.loads(r.stdout)
    assert d["solver"]["clock"] == clock
    assert (d["solver"]["work_s"] is not None) == (clock == "work")


@pytest.mark.parametrize("args, field, says", [
    (["-c", "example", "--precision", "fp8"], "--precision", "A100-80GB lack"),
    (["-m", "llama3-8b", "--ep", "4"], "--ep", "is dense"),
    (["-m", "llama3-8b", "--seq", "8192", "--framework", "torchtitan", "--kv-rotate",
      "alltoall"], "--kv-rotate", "no context parallelism is searched"),
])
def test_solve_refuses_what_it_could_only_ignore(args, field, says):
    """Options no plan of the search could use are one line naming the option, not dropped."""
    r = runner.invoke(app, ["solve", *args, "--time-limit", "5"])
    assert r.exit_code == 2, r.output
    line = " ".join(r.output.split())
    assert f"{field}: " in line and says in line, line


def test_an_empty_search_space_says_what_refused_most_shapes():
    """EP 4 under torchtitan: every shape is refused on ep, and the message says why."""
    r = runner.invoke(app, ["solve", "-m", "qwen3-30b-a3b", "-c", "h100-8x8", "--gbs", "64",
                            "--seq", "4096", "--framework", "torchtitan", "--ep", "4",
                            "--time-limit", "5"])
    assert r.exit_code == 2, r.output
    line = " ".join(r.output.split())
    assert "most often on ep" in line and "not torchtitan" in line and "ep [4]" in line, line


def test_deepspeed_jobs_search_only_its_pipeline_schedule():
    """DeepSpeed's pipeline engine runs its own 1F1B only: the search never picks another."""
    from formats import presets
    from formats.clusters import uniform_cluster
    from model.errors import SpecError
    from model.estimator import make_plan
    from model.specs import JobSpec
    from solvers.space import SearchSpace, enumerate_shapes

    m = presets.model("llama3-8b")
    job = JobSpec(global_batch=64, seq_length=4096, framework="deepspeed")
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 360.0, 45.0)
    shapes = list(enumerate_shapes(m, job, c, SearchSpace()))
    assert shapes and all(sh.schedule == "1f1b" for sh in shapes if sh.pp > 1)
    with pytest.raises(SpecError) as e:
        make_plan(m, job, c, tp=8, pp=2, schedule="interleaved", chunks=2)
    assert e.value.field == "schedule"


def test_hsdp_under_context_parallelism_shards_within_a_node():
    """compare --sharding's HSDP row: a shard group is one node's GPUs, CP ranks counted."""
    from formats import presets
    from formats.clusters import uniform_cluster
    from model.specs import JobSpec
    from solvers.compare import compare_sharding
    from solvers.space import SearchSpace

    m = presets.model("llama3-8b")
    job = JobSpec(global_batch=16, seq_length=32768, framework="torchtitan")
    c = uniform_cluster(2, 8, "H100-SXM-80GB", 360.0, 45.0)
    rows = compare_sharding(m, job, c, time_limit_s=20, space=SearchSpace(cp=(4,), tp=(1,)))
    hsdp = next(r for r in rows if r["sharding"].startswith("HSDP"))
    assert "CP=4" in hsdp["plan"] and "hsdp2x2" in hsdp["plan"], rows
    # TP x CP filling a node leaves no HSDP layout: its row says so (it had crashed with an
    # IndexError after the other rows' searches); --shard-size gives the groups
    rows = compare_sharding(m, job, c, time_limit_s=4, space=SearchSpace(cp=(8,), tp=(1,)))
    # torchtitan has no ZeRO-1: its row says so (it had been left out without a word)
    assert "no ZeRO-1" in next(r for r in rows if r["sharding"].startswith("ZeRO-1"))[
        "termination"]
    hsdp = next(r for r in rows if r["sharding"].startswith("HSDP"))
    assert hsdp["iteration_ms"] is None and "TP x CP fills a node" in hsdp["termination"]
    assert any(r["iteration_ms"] for r in rows), rows
    # the proof and fit as values, as compare's rows give them (None where there is no plan)
    for r in rows:
        assert (r["time_limit_s"], r["seed"], r["clock"]) == (4, 0, "wall")
        assert r["proven_optimal"] == r["termination"].startswith("optimal")
        assert (r["solver_gap"] is None) == (r["fits"] is None) == (r["iteration_ms"] is None)
    rows = compare_sharding(m, job, c, time_limit_s=4,
                            space=SearchSpace(cp=(8,), tp=(1,), shard_sizes=(1,)))
    hsdp = next(r for r in rows if r["sharding"].startswith("HSDP"))
    assert "hsdp1x2" in hsdp["plan"] and "groups of 1" in hsdp["sharding"], rows


def test_torchtitan_ddp_only_alone_and_json_is_strict(tmp_path):
    """torchtitan runs DDP only as the one parallel dimension: with TP and PP the search
    shards (FSDP/HSDP); solve --json is strict JSON (an infinite bound is null)."""
    r = runner.invoke(app, ["solve", "-m", "llama3-8b", "-c", "h100-8x8", "--gbs", "128",
                            "--seq", "8192", "--framework", "torchtitan", "--tp", "2", "--pp",
                            "2", "--time-limit", "5", "--json"])
    assert r.exit_code == 0, r.output

    def refuse(c):
        raise ValueError(c)
    d = json.loads(r.output, parse_constant=refuse)
    assert d["plan"]["shape"]["zero"] == 3
    from formats import presets
    from formats.clusters import cluster
    from model.errors import SpecError
    from model.estimator import make_plan
    from model.specs import JobSpec
    job = JobSpec(global_batch=128, seq_length=8192, framework="torchtitan")
    with pytest.raises(SpecError) as e:
        make_plan(presets.model("llama3-8b"), job, cluster("h100-8x8"), tp=2, pp=2, zero=0)
    assert e.value.field == "zero" and "1D" in e.value.problem


def test_emit_for_another_framework_than_priced_and_hostfile_slots(tmp_path):
    plan = tmp_path / "p.json"
    r = runner.invoke(app, ["estimate", "-m", "llama3-8b", "-c", "h100-8x8", "--gbs", "64",
                            "--seq", "8192", "--framework", "torchtitan", "--tp", "1", "--pp",
                            "1", "--zero", "3", "--save-plan", str(plan)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["emit", str(plan), "-f", "megatron", "-o", str(tmp_path / "m"),
                            "--json"])
    assert r.exit_code == 0, r.output
    assert any(w.startswith("megatron [framework]: the plan was priced for torchtitan")
               for w in json.loads(r.output)["warnings"])
    r = runner.invoke(app, ["estimate", "--plan", str(plan), "--framework-version", "0.1"])
    assert r.exit_code == 2 and "beside --plan" in r.output, r.output
    hf = tmp_path / "hosts"
    from formats.clusters import cluster
    names = [nd.name for nd in cluster("example").nodes]
    hf.write_text("".join(f"{n} slots={4 if i == 0 else 8}\n" for i, n in enumerate(names)))
    log = tmp_path / "train.log"
    from pathlib import Path
    log.write_text((Path(__file__).parent / "fixtures" / "logs" /
                    "megatron_train.log").read_text())
    r = runner.invoke(app, ["calibrate", str(log), "--cluster", "example", "--hostfile", str(hf),
                            "--out", str(tmp_path / "c.json")])
    assert r.exit_code == 2 and "slots=4" in r.output, r.output


@pytest.mark.parametrize("n", ["0", "-1"])
def test_compare_generated_needs_one_or_more(n):
    """--generated 0 or -1 had compared on --cluster without a word."""
    r = runner.invoke(app, ["compare", "-m", "gpt-1.7b", "--generated", n])
    assert r.exit_code == 2 and "--generated: " in r.output and "give 1 or more" in r.output


@pytest.mark.parametrize("args,flag", [
    (["--nodes", "4"], "--nodes"), (["--cluster-seed", "5"], "--cluster-seed"),
    (["--cluster", "example", "--generated", "1", "--nodes", "2"], "--cluster"),
    (["-c", "h100-8x8", "--generated", "1"], "--cluster")])
def test_compare_refuses_cluster_options_of_the_other_kind(args, flag):
    """--nodes / --cluster-seed without --generated, or --cluster beside it, had been ignored
    (the comparison ran on the other cluster than the one asked for)."""
    r = runner.invoke(app, ["compare", "-m", "gpt-1.7b", "--time-limit", "0.5", *args])
    assert r.exit_code == 2 and f"options: {flag}: " in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


ONE_GPU = """name = "one"
[[nodes]]
name = "n0"
gpu = "A100-80GB"
gpus = 1
intra_gb_per_s = 240
[inter]
gb_per_s = [[0.0]]
"""


@pytest.mark.parametrize("args,says", [
    (["-m", "gpt-1t", "--gbs", "32", "--seq", "1024", "--cluster", "{one}"],
     "nothing fits in GPU memory: the weights, gradients and optimizer state alone"),
    (["-m", "gpt-1.7b", "--gbs", "16", "--seq", "1024", "--tp", "3"],
     "no plan in the search space is valid"),
    # a plan fits, but no sharding applies on one GPU: said, with the plan found without it
    (["-m", "gpt-1.7b", "--gbs", "16", "--seq", "1024", "--cluster", "{one}"],
     "none of the shardings compared (ZeRO-1, ZeRO-3, HSDP) gives a plan on one")])
def test_compare_sharding_with_no_plan_exits_2_as_without_it(tmp_path, args, says):
    """compare --sharding where no sharding gives a plan: one line and exit 2 with the
    explanation compare and solve give without --sharding (it had exited 0, every row
    'none: ...')."""
    one = tmp_path / "one.toml"
    one.write_text(ONE_GPU)
    args = [a.replace("{one}", str(one)) for a in args]
    r = runner.invoke(app, ["compare", "--sharding", "--time-limit", "2", *args])
    assert r.exit_code == 2 and says in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    if "none of" not in says:  # the same line as compare without --sharding
        plain = runner.invoke(app, ["compare", "--time-limit", "2", *args])
        assert plain.exit_code == 2 and plain.output == r.output


def test_solve_emit_on_nodes_of_different_sizes_is_refused_before_the_search(tmp_path):
    """Nodes of 8, 4 and 4 GPUs: no launch.sh can start them (one --nproc_per_node), so
    solve --emit says so before searching (it had searched, then written nothing, the plan
    file included); with --force the search runs and the configuration is written without
    a launcher."""
    toml = tmp_path / "mixed.toml"
    toml.write_text("".join(
        f'[[nodes]]\nname = "n{k}"\ngpu = "H100-SXM-80GB"\ngpus = {g}\n'
        f'intra_gb_per_s = 400.0\n' for k, g in enumerate((8, 4, 4)))
        + '[inter]\ngb_per_s = [[0.0, 40.0, 40.0], [40.0, 0.0, 40.0], [40.0, 40.0, 0.0]]\n')
    args = ["solve", "-m", "llama3-8b", "-c", str(toml), "--gbs", "64", "--seq", "4096",
            "--emit", "megatron", "--out", str(tmp_path / "e"), "--save-plan",
            str(tmp_path / "p.json"), "--time-limit", "10"]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "--nproc_per_node" in r.output and "4/8 GPUs" in r.output
    assert not (tmp_path / "p.json").exists()
    r = runner.invoke(app, [*args, "--force"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "p.json").exists() and not (tmp_path / "e" / "launch.sh").exists()


def test_solve_time_limit_counts_the_command_not_only_the_search(monkeypatch):
    """On the wall clock the search gets the limit less the process's start-up so far and
    the report's reserve (an auditor's T = 5 solves had taken 5.5-6.3 s as a command); a
    work-clock limit is the search's own; never below a minimal call."""
    import time

    import cli
    monkeypatch.setattr(cli, "_START_S", time.perf_counter() - 0.4)  # a 0.4 s start-up
    before = time.perf_counter() - cli._START_S
    got = cli._search_limit_s(10.0, "wall")
    after = time.perf_counter() - cli._START_S
    assert 10.0 - after - cli.REPORT_RESERVE_S <= got <= 10.0 - before - cli.REPORT_RESERVE_S
    assert cli._search_limit_s(10.0, "work") == 10.0
    assert cli._search_limit_s(0.01, "wall") == 0.05


def test_solve_refuses_what_the_framework_would_not_run():
    """solve and compare say, before searching, that Megatron-FSDP's ZeRO-2 cannot run without
    its gradient overlap (solve had returned an overlapped plan without a word), and a
    DeepSpeed bf16 --zero 0 names DeepSpeed's own rule (it had blamed sharding)."""
    for cmd in ("solve", "compare"):
        r = runner.invoke(app, [cmd, "-m", "llama3-8b", "-c", "h100-8x8", "--time-limit", "5",
                                "--zero", "2", "--no-overlap-grad-reduce"])
        assert r.exit_code == 2 and "Megatron-FSDP's ZeRO-2 always overlaps" in r.output, (
            r.output)
    r = runner.invoke(app, ["solve", "-m", "llama3-8b", "-c", "h100-8x8", "--time-limit", "5",
                            "--framework", "deepspeed", "--zero", "0"])
    assert r.exit_code == 2 and "without fp32 master weights" in r.output, r.output


def test_estimate_says_megatron_runs_no_gpipe():
    """A GPipe plan estimated for Megatron-LM, which has no such schedule, says so (only its
    emitted set had); torchtitan, which runs GPipe, is not warned."""
    base = ["estimate", "-m", "gpt-1.7b", "-c", "example", "--gbs", "64", "--seq", "2048",
            "--tp", "1", "--pp", "4", "--mbs", "1", "--schedule", "gpipe", "--json"]
    r = runner.invoke(app, base)
    assert r.exit_code == 0 and any("Megatron-LM has no GPipe schedule" in w
                                    for w in json.loads(r.output)["warnings"]), r.output
    # (an untied model: torchtitan ties no embeddings under PP)
    r = runner.invoke(app, [*base[:2], "llama2-7b", *base[3:], "--framework", "torchtitan",
                            "--zero", "3"])
    assert r.exit_code == 0, r.output
    assert not any("GPipe" in w for w in json.loads(r.output)["warnings"])


def test_estimate_for_deepspeed_bf16_starts_at_zero1():
    """estimate --framework deepspeed with no ZeRO stage given plans ZeRO-1, DeepSpeed's bf16
    as priced (it had built ZeRO 0, which is refused); fp16 keeps ZeRO 0."""
    base = ["estimate", "-m", "llama2-7b", "-c", "h100-8x8", "--framework", "deepspeed",
            "--tp", "8", "--pp", "1", "--gbs", "64", "--seq", "2048", "--json"]
    for extra, zero in (([], 1), (["--precision", "fp16"], 0)):
        r = runner.invoke(app, base + extra)
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["plan"]["shape"]["zero"] == zero


def test_a_time_limit_the_command_cannot_keep_is_said():
    """A wall-clock limit below what start-up and the search's first pass take is not kept
    silently: the command says how long it took and why; a limit it keeps says nothing."""
    r = runner.invoke(app, ["solve", "--json", "--time-limit", "0.05"])
    assert r.exit_code == 0, r.output
    warn = json.loads(r.output)["warnings"]
    assert any(w.startswith("--time-limit 0.05 s: the command took") for w in warn), warn
    r = runner.invoke(app, ["solve", "--json", "--time-limit", "4"])
    assert not any("--time-limit" in w for w in json.loads(r.output)["warnings"])
