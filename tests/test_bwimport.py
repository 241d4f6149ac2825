"""Bandwidth import: parsers (nccl-tests, mpiGraph, CSV, JSON), checks, fills, CLI, show."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from formats.bandwidth import (Measured, check_and_fill, load_measurements, nccl_stream_gb_per_s,
                               parse_nccl, read_mpigraph, summarize)
from formats.clusters import SynthParams, load_cluster, synth_cluster
from model.errors import SpecError

DATA = Path(__file__).parent / "fixtures"
runner = CliRunner()
IMPORT = ["cluster", "import", "--gpu", "A100-80GB", "--gpus-per-node", "8",
          "--intra-gb-per-s", "240"]
# the values written into tests/data/nccl_pairs (busbw at 1 GiB, out-of-place)
PAIRS = {("node01", "node02"): 22.76, ("node01", "node03"): 14.17, ("node01", "node04"): 7.17,
         ("node02", "node03"): 14.2, ("node02", "node04"): 7.08, ("node03", "node04"): 11.45}


def cli(*args):
    return runner.invoke(app, list(args))


def test_parse_nccl_takes_largest_size():
    run = parse_nccl((DATA / "nccl_pairs" / "sendrecv_node01_node02.txt").read_text(), "f")
    assert run.size_bytes == 1 << 30 and run.rows == 6
    assert run.hosts == ["node01", "node02"]
    assert run.busbw_gb_per_s == pytest.approx(22.765, abs=0.01)  # mean of oop / in-place


def test_nccl_allreduce_busbw_conversion():
    run = parse_nccl((DATA / "all_reduce_4nodes.txt").read_text(), "f")
    assert len(run.hosts) == 4
    # busbw = algbw x 2(n-1)/n = 1.5 algbw for n = 4
    assert run.busbw_gb_per_s == pytest.approx(1.5 * run.algbw_gb_per_s, rel=0.01)
    bw, note = nccl_stream_gb_per_s(run, "all_reduce")
    assert bw == pytest.approx(18.0, abs=0.02) and "n=4" in note
    # the same table labelled sendrecv: busbw != algbw, caught
    with pytest.raises(SpecError, match="another nccl test"):
        nccl_stream_gb_per_s(run, "sendrecv")


def test_nccl_directory_to_matrix():
    meas = load_measurements([DATA / "nccl_pairs"])
    names, m, warnings = check_and_fill(meas)
    assert names == ["node01", "node02", "node03", "node04"]
    for (a, b), v in PAIRS.items():
        i, j = names.index(a), names.index(b)
        assert m[i, j] == pytest.approx(v, abs=0.02) and m[j, i] == pytest.approx(v, abs=0.02)
    assert not warnings


def test_nccl_allreduce_pair_and_aggregate_rejected():
    meas = load_measurements([DATA / "all_reduce_node01_node02.txt"])
    assert meas.gb_per_s[0, 1] == pytest.approx(21.5, abs=0.02)
    with pytest.raises(SpecError, match="one rank per node"):
        load_measurements([DATA / "all_reduce_node01_node02_2gpu.txt"], nccl_test="all_reduce")
    with pytest.raises(SpecError, match="cannot tell the nccl test"):
        load_measurements([DATA / "all_reduce_node01_node02_2gpu.txt"], fmt="nccl")


def test_nccl_missing_pair_error_and_fill(tmp_path):
    d = tmp_path / "pairs"
    shutil.copytree(DATA / "nccl_pairs", d)
    (d / "sendrecv_node01_node03.txt").unlink()
    meas = load_measurements([d])
    with pytest.raises(SpecError) as e:
        check_and_fill(meas)
    msg = str(e.value)
    assert "2 missing pair(s): node01 -> node03, node03 -> node01" in msg and "--fill" in msg
    with pytest.raises(SpecError, match="no rule given could fill"):
        check_and_fill(meas, fill=["symmetric"])  # neither direction was measured
    names, m, warnings = check_and_fill(meas, fill=["min-row"])
    # node01's slowest measured stream is to node04 (7.17), node03's to node04 (11.45): the
    # slower of the two ends bounds both directions
    assert m[0, 2] == pytest.approx(7.17, abs=0.02) and m[2, 0] == pytest.approx(7.17, abs=0.02)
    assert sum("filled" in w for w in warnings) == 2


def test_nccl_pair_both_directions_and_duplicates(tmp_path):
    d = tmp_path / "pairs"
    shutil.copytree(DATA / "nccl_pairs", d)
    # a file for the reverse direction, without rank lines: names from the file name
    text = (d / "sendrecv_node01_node02.txt").read_text()
    rev = "\n".join(ln for ln in text.splitlines() if "Rank" not in ln).replace("22.7", "11.7")
    (d / "sendrecv_node02_node01.txt").write_text(rev)
    names, m, _ = check_and_fill(load_measurements([d]))
    assert m[0, 1] == pytest.approx(22.76, abs=0.02) and m[1, 0] == pytest.approx(11.76, abs=0.02)
    (d / "sendrecv_node01_node02.log").write_text(text)
    with pytest.raises(SpecError, match="measured twice"):
        load_measurements([d])


def test_nccl_pair_on_one_host_rejected(tmp_path):
    text = (DATA / "nccl_pairs" / "sendrecv_node01_node02.txt").read_text()
    p = tmp_path / "sendrecv_a_b.txt"
    p.write_text(text.replace("node02", "node01"))
    with pytest.raises(SpecError, match="intra-node link"):
        load_measurements([p])


def test_mpigraph_recv_transposed_and_mean_per_host():
    meas = read_mpigraph(DATA / "mpigraph_3hosts.txt", "recv")
    assert meas.names == ["hostA", "hostB", "hostC"]
    mib = 2 ** 20 / 1e9  # MiB/s -> GB/s
    # rank pairs A->B: 10900 and 11100 MiB/s (mean 11000); B->A 10700/10900 (mean 10800)
    assert meas.gb_per_s[0, 1] == pytest.approx(11000 * mib)
    assert meas.gb_per_s[1, 0] == pytest.approx(10800 * mib)
    assert meas.gb_per_s[0, 2] == pytest.approx(6000 * mib)
    send = read_mpigraph(DATA / "mpigraph_3hosts.txt", "send")
    assert send.gb_per_s[0, 1] == pytest.approx(11000 * 1.02 * mib)
    mn = read_mpigraph(DATA / "mpigraph_3hosts.txt", "min")
    assert mn.gb_per_s[0, 1] == pytest.approx(11000 * mib)
    assert load_measurements([DATA / "mpigraph_3hosts.txt"]).names == meas.names  # autodetect


def test_mpigraph_truncated(tmp_path):
    lines = (DATA / "mpigraph_3hosts.txt").read_text().splitlines()
    cut = [ln for ln in lines if not ln.startswith("hostC:5 from")]
    p = tmp_path / "mg.txt"
    p.write_text("\n".join(cut))
    with pytest.raises(SpecError, match=r"Recv table \(line 29\): table has 5 rows but 6 columns"):
        read_mpigraph(p)


def test_csv_and_json_agree():
    a = check_and_fill(load_measurements([DATA / "matrix.csv"]))
    b = check_and_fill(load_measurements([DATA / "matrix.json"]))  # in mb_per_s
    assert a[0] == b[0] == ["n1", "n2", "n3"]
    assert np.allclose(a[1], b[1])
    assert a[1][1, 0] == pytest.approx(23.1)


@pytest.mark.parametrize("text,needle", [
    ("x,n1,n2\nn1,,0\nn2,3,\n", "n1 -> n2: bandwidth n1 -> n2 is 0"),
    ("x,n1,n2\nn1,,nan\nn2,3,\n", "is NaN"),
    ("x,n1,n2\nn1,,-4\nn2,3,\n", "is negative"),
    ("x,n1,n2\nn1,,abc\nn2,3,\n", "row 2 (n1), column n2: 'abc' is not a number"),
    ("x,n1,n1\nn1,,1\nn1,3,\n", "header: duplicated node name(s) n1"),
    ("x,n1,n2\nn1,,1\nn3,3,\n", "row 3: unknown node 'n3'"),
    ("x,n1,n2\nn1,,1\nn1,3,\n", "row 3: duplicated node name 'n1'"),
    ("x,n1,n2,n3\nn1,,1,2\nn2,3,,4\n", "not square: 2 data rows but 3 node columns"),
    ("x,n1,n2\nn1,,1,5\nn2,3,\n", "row 2 (n1): has 3 values"),
])
def test_csv_errors_name_file_and_place(tmp_path, text, needle):
    p = tmp_path / "m.csv"
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        check_and_fill(load_measurements([p]))
    assert str(e.value).startswith(str(p)) and needle in str(e.value)


def test_json_errors(tmp_path):
    p = tmp_path / "m.json"
    p.write_text('{"nodes": ["a", "b"], "gb_per_s": [[null, 1], [2]]}')
    with pytest.raises(SpecError, match="row 1 .b. has 1 values for 2 nodes"):
        load_measurements([p])
    p.write_text('{"nodes": ["a", "b"], "gb_per_s": [[null, "x"], [2, null]]}')
    with pytest.raises(SpecError, match=r"gb_per_s\[0\]\[1\] \(a -> b\)"):
        load_measurements([p])


def test_asymmetry_warns_or_fails_with_strict():
    m = np.array([[0, 20.0, 10.0], [19.0, 0, 10.0], [10.0, 4.0, 0]])
    meas = Measured(["a", "b", "c"], m, "x.csv")
    _, _, warnings = check_and_fill(meas)
    assert len(warnings) == 1 and "b -> c 10.00 GB/s but c -> b 4.00" in warnings[0]
    with pytest.raises(SpecError, match="b -> c: asymmetric"):
        check_and_fill(meas, strict=True)
    assert not check_and_fill(meas, asym_ratio=3.0)[2]


def test_nodes_option_orders_and_catches_unknown():
    meas = load_measurements([DATA / "matrix.csv"])
    names, m, _ = check_and_fill(meas, nodes=["n3", "n1", "n2"])
    assert names == ["n3", "n1", "n2"] and m[1, 2] == pytest.approx(22.9)
    with pytest.raises(SpecError, match="unknown node.s. n3: measured but not in --node-names"):
        check_and_fill(meas, nodes=["n1", "n2"])
    with pytest.raises(SpecError, match="missing pair"):
        check_and_fill(meas, nodes=["n1", "n2", "n3", "n4"])


def test_cli_import_writes_loadable_toml(tmp_path):
    out = tmp_path / "c.toml"
    r = cli(*IMPORT, str(DATA / "nccl_pairs"), "--name", "lab", "-o", str(out))
    assert r.exit_code == 0, r.output
    c = load_cluster(out)
    assert c.name == "lab" and c.num_nodes == 4 and c.num_gpus == 32
    assert c.inter_gb_per_s[0, 1] == pytest.approx(22.76, abs=0.02)
    # intra-node preset instead of a uniform link
    r = cli("cluster", "import", "--gpu", "V100-32GB", "--gpus-per-node", "8",
            "--intra-topology", "dgx1-v100", str(DATA / "matrix.csv"), "-o", str(out))
    assert r.exit_code == 0, r.output
    assert load_cluster(out).nodes[0].link_gb_per_s(0, 3) == pytest.approx(40.0)


@pytest.mark.parametrize("args,needle", [
    (["matrix_missing.csv"], "1 missing pair(s): n1 -> n3"),
    (["matrix_missing.csv", "--fill", "mirror"], "unknown fill rule 'mirror'"),
    (["nope.csv"], "nope.csv: file not found"),
    (["matrix.csv", "--format", "xml"], "unknown format 'xml'"),
])
def test_cli_import_errors_one_line_exit_2(args, needle):
    r = cli(*IMPORT, *[str(DATA / a) if a.endswith(".csv") else a for a in args])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], r.output


def test_cli_import_fill_reports_each_entry():
    r = cli(*IMPORT, str(DATA / "matrix_missing.csv"), "--fill", "symmetric")
    assert r.exit_code == 0
    assert "warning: filled n1 -> n3 = 14.20 GB/s (symmetric)" in r.output


def test_summarize_finds_degraded_node_and_leaves():
    c = synth_cluster(SynthParams(num_nodes=8, leaf_size=4, degraded_nodes=(5,), seed=7))
    s = summarize(c)
    assert [o["node"] for o in s["outliers"]] == ["node05"]
    assert s["groups"] == [["node00", "node01", "node02", "node03"],
                           ["node04", "node05", "node06", "node07"]]
    assert s["attached"] == {"node05": 1}
    assert all("node05" in (x["from"], x["to"]) for x in s["slowest_links"])
    assert s["unattached"] == []
    flat = synth_cluster(SynthParams(num_nodes=6, leaf_size=6, degraded=0, seed=1))
    fs = summarize(flat)
    assert fs["outliers"] == [] and len(fs["groups"]) == 1
    # a node whose every link runs at one degraded rate: its means to both leaves tie, so
    # it is left unattached (it had been put in group 0, across the spine from its own rack)
    import dataclasses
    m = np.array(c.inter_gb_per_s, dtype=float)
    m[5, :] = m[:, 5] = 12.0
    np.fill_diagonal(m, 0.0)
    s = summarize(dataclasses.replace(c, inter_gb_per_s=m))
    assert s["attached"] == {} and s["unattached"] == ["node05"]
    assert ["node04", "node06", "node07"] in s["groups"]
    # with 1% measurement noise on those links too (a reviewer's coin flip at 1e-9), seeded
    rng = np.random.default_rng(3)
    for _ in range(10):
        mn = m.copy()
        mn[5, :] *= 1 + 0.01 * rng.standard_normal(len(mn))
        mn[:, 5] *= 1 + 0.01 * rng.standard_normal(len(mn))
        np.fill_diagonal(mn, 0.0)
        assert summarize(dataclasses.replace(c, inter_gb_per_s=mn))["unattached"] == [
            "node05"]


def test_cli_show_json_and_png(tmp_path):
    png = tmp_path / "h.png"
    r = cli("cluster", "show", "example", "--json", "--png", str(png))
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["nodes"] == 8 and d["outliers"][0]["node"] == "node05"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = cli("cluster", "show")
    assert r.exit_code == 0 and "node05" in r.output and "group 1" in r.output
    r = cli("cluster", "show", "nope")
    assert r.exit_code == 2 and "unknown cluster 'nope'" in r.output
    # a negative count had listed all links but 3 (a Python slice from the end)
    r = cli("cluster", "show", "--slowest", "-3")
    assert r.exit_code == 2 and "--slowest: -3 is out of range; give 0 or more" in r.output


def test_cli_synth_matches_generator(tmp_path):
    out = tmp_path / "s.toml"
    r = cli("cluster", "synth", "--nodes", "6", "--gpus-per-node", "4", "--leaf-size", "3",
            "--oversubscription", "2", "--degraded", "1", "--degraded-factor", "0.25",
            "--noise", "0", "--seed", "5", "-o", str(out))
    assert r.exit_code == 0, r.output
    c = load_cluster(out)
    ref = synth_cluster(SynthParams(num_nodes=6, gpus_per_node=4, leaf_size=3,
                                    oversubscription=2, degraded=1, degraded_factor=0.25,
                                    noise=0, seed=5))
    assert np.allclose(c.inter_gb_per_s, ref.inter_gb_per_s)
    assert c.inter_gb_per_s[0, 1] in (23.0, 5.75) and c.gpus_per_node == 4
    # the range said is the nodes', whichever end is passed; each field named once
    for bad in ("5", "-1"):
        r = cli("cluster", "synth", "--nodes", "3", "--degraded", bad)
        assert r.exit_code == 2 and "synth: degraded: is " in r.output and (
            "from 0 to 3" in r.output), r.output
    r = cli("cluster", "synth", "--degraded-factor", "-1", "--degraded", "1")
    assert r.exit_code == 2 and "degraded_factor: is -1; it must be in (0, 1]" in r.output
    # each link rate names its own field (an intra-node rate of 0 had been blamed on the NIC)
    for f in ("intra", "nic"):
        r = cli("cluster", "synth", f"--{f}-gb-per-s", "0")
        assert r.exit_code == 2 and f"synth: {f}_gb_per_s: link rates must be positive" in (
            r.output), r.output
    r = cli("cluster", "synth", "--nodes", "2", "--intra-topology", "dgx1-v100", "--gpu",
            "V100-32GB")
    assert r.exit_code == 0 and "intra_matrix_gb_per_s" in r.output
    # an NVSwitch node's matrix (every pair at one rate) is that rate: written as
    # intra_gb_per_s and said; kept, it had taken the exact method away from such clusters
    r = cli("cluster", "synth", "--nodes", "2", "--intra-topology", "dgx-h100", "--gpu",
            "H100-SXM-80GB", "--json")
    assert r.exit_code == 0 and "every GPU pair at 360 GB/s" in r.stderr
    assert all(nd["intra_matrix_gb_per_s"] is None and nd["intra_gb_per_s"] == 360.0
               for nd in json.loads(r.stdout)["nodes"])
    # --json carries the same matrix (it had given only intra_gb_per_s)
    r = cli("cluster", "synth", "--nodes", "2", "--intra-topology", "dgx1-v100", "--gpu",
            "V100-32GB", "--json", "-o", str(tmp_path / "t.toml"))
    assert r.exit_code == 0, r.output
    nodes = json.loads(r.stdout)["nodes"]
    written = load_cluster(tmp_path / "t.toml")
    assert all(np.allclose(nd["intra_matrix_gb_per_s"], w.intra_matrix_gb_per_s)
               for nd, w in zip(nodes, written.nodes))
    assert np.ptp(np.array(nodes[0]["intra_matrix_gb_per_s"])) > 0
    r = cli("cluster", "synth", "--nodes", "2", "--json")
    assert all(nd["intra_matrix_gb_per_s"] is None for nd in json.loads(r.output)["nodes"])


def test_intra_node_allreduce_gives_the_latency_and_link_rate(tmp_path):
    """An all_reduce_perf run among 8 GPUs of one node (tests/fixtures/all_reduce_intra_
    node01.txt: nccl-tests' table layout, times made from the cost model's ring with 1.6 us a
    step and 360 GB/s, out-of-place 0.2 us faster than in-place): the latency per step comes
    back from the smallest message, the link rate is busbw at the largest; `cluster import
    --intra-allreduce` writes both, a given --intra-gb-per-s wins over the busbw, and a
    cross-node run or both latency options are one-line errors."""
    from formats.bandwidth import intra_node_allreduce
    f = DATA / "all_reduce_intra_node01.txt"
    lat, bw, note, warns = intra_node_allreduce(f)
    assert lat == pytest.approx(1.6 + 0.1 / 14, abs=0.01) and bw == pytest.approx(348.0)
    assert "14 steps" in note and warns == []
    out = tmp_path / "c.toml"
    r = cli("cluster", "import", str(DATA / "nccl_pairs"), "--gpu", "H100-SXM-80GB",
            "--gpus-per-node", "8", "--intra-allreduce", str(f), "--out", str(out))
    assert r.exit_code == 0, r.output
    c = load_cluster(str(out))
    assert c.intra_latency_us == pytest.approx(lat) and c.nodes[0].intra_gb_per_s == 348.0
    r = cli(*IMPORT, str(DATA / "nccl_pairs"), "--intra-allreduce", str(f), "--out",
            str(tmp_path / "c2.toml"))
    assert r.exit_code == 0 and "not used" in r.output
    assert load_cluster(str(tmp_path / "c2.toml")).nodes[0].intra_gb_per_s == 240.0
    r = cli(*IMPORT, str(DATA / "nccl_pairs"), "--intra-allreduce", str(f),
            "--intra-latency-us", "3")
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    # a run of 8 GPUs for nodes of 4: its rate and 14 steps are an 8-GPU ring's (it had been
    # written to the 4-GPU nodes without a word)
    r = cli("cluster", "import", str(DATA / "nccl_pairs"), "--gpu", "H100-SXM-80GB",
            "--gpus-per-node", "4", "--intra-allreduce", str(f), "--out",
            str(tmp_path / "c4.toml"))
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "over 8 GPUs" in r.output and "-g 4" in r.output and "# Rank lines" in r.output
    assert "node01" in note
    r = cli(*IMPORT, str(DATA / "nccl_pairs"), "--intra-allreduce",
            str(DATA / "all_reduce_4nodes.txt"))
    assert r.exit_code == 2 and "one node" in r.output
    r = cli("cluster", "synth", "--nodes", "2", "--intra-latency-us", "25", "--json")
    assert json.loads(r.output)["intra_latency_us"] == 25.0


@pytest.mark.parametrize("edit, says", [
    (lambda t: t.replace("47176.7   22.76   22.76", "47176.7  -22.76  -22.76"), "not negative"),
    (lambda t: t.replace("22.76   22.76       0", "22.76   22.76       3"), "3 wrong values"),
    (lambda t: t.replace("Out of bounds values : 0 OK", "Out of bounds values : 3 FAILED"),
     "results were wrong"),
    (lambda t: t.replace("47176.7   22.76   22.76", "47176.7     nan     nan"), "not negative"),
])
def test_nccl_runs_that_report_damage_are_refused(edit, says):
    """A negative rate, a non-zero #wrong count or nccl-tests' own FAILED line: the run is not
    a measurement (averaged in, a -22.76 GB/s half once gave 0.005 GB/s)."""
    text = (DATA / "nccl_pairs" / "sendrecv_node01_node02.txt").read_text()
    bad = edit(text)
    assert bad != text
    with pytest.raises(SpecError) as e:
        parse_nccl(bad, "f.txt")
    assert says in e.value.problem and e.value.source == "f.txt"


def test_json_matrix_fields_are_known_and_its_units_text_agrees(tmp_path):
    base = json.loads((DATA / "matrix.json").read_text())
    for extra, says in (({"unit": "gb"}, "unknown field 'unit'"),
                        ({"units": "GB/s"}, "means MB/s")):
        p = tmp_path / "m.json"
        p.write_text(json.dumps({**base, **extra}))
        with pytest.raises(SpecError) as e:
            load_measurements([p])
        assert says in e.value.problem, e.value.problem
    p.write_text(json.dumps({**base, "units": "MB/s of one stream", "format": "x"}))
    assert load_measurements([p])


def test_cluster_files_refuse_unknown_fields_hosts_with_spaces_and_dead_links(tmp_path):
    good = ('name = "c"\n[[nodes]]\nname = "a"\ngpu = "A100-80GB"\ngpus = 8\n'
            'intra_gb_per_s = 240.0\n[[nodes]]\nname = "b"\ngpu = "A100-80GB"\ngpus = 8\n'
            'intra_gb_per_s = 240.0\n[inter]\ngb_per_s = [[0.0, 20.0], [20.0, 0.0]]\n')
    p = tmp_path / "c.toml"
    p.write_text(good)
    assert load_cluster(p).num_nodes == 2
    for bad, field in ((good.replace('name = "c"', 'name = "c"\nlatncy = 3'), "latncy"),
                       (good.replace("gpus = 8\n", "gpus = 8\ngpu_count = 4\n", 1),
                        "nodes[0].gpu_count"),
                       (good.replace("[inter]\n", "[inter]\nmb_per_s = 3\n"),
                        "inter.mb_per_s"),
                       (good.replace('name = "a"', 'name = "b c"'), "nodes[0].name"),
                       (good.replace('name = "a"', 'name = "a$(id>x)"'), "nodes[0].name"),
                       (good.replace('name = "a"', 'name = "b`id`"'), "nodes[0].name"),
                       (good.replace("20.0], [20.0", "1e-300], [20.0"), "inter.gb_per_s")):
        p.write_text(bad)
        with pytest.raises(SpecError) as e:
            load_cluster(p)
        assert e.value.field == field and e.value.source == str(p), (field, e.value)


def test_synth_keeps_a_given_intra_rate_beside_a_topology_and_import_names_its_flag(tmp_path):
    r = cli("cluster", "synth", "--intra-topology", "dgx-a100", "--intra-gb-per-s", "100",
            "--nodes", "2", "--json")
    assert r.exit_code == 0, r.output
    assert {nd["intra_gb_per_s"] for nd in json.loads(r.stdout)["nodes"]} == {100.0}
    r = cli(*IMPORT, str(DATA / "matrix.csv"), "--node-names", "n3,n2,n2", "-o",
            str(tmp_path / "c.toml"))
    line = " ".join(r.output.split())
    assert r.exit_code == 2 and "--node-names: duplicated" in line and "--nodes" not in line


def test_nccl_files_with_two_runs_old_rank_lines_and_subfolders(tmp_path):
    """A rerun appended to a file (two tables, two rank lists) is refused, not half read: the
    hosts had come from the second run and the rate from the first. Rank lines without
    'Group N' (nccl-tests before 2.13, rccl-tests) name the hosts as the new ones do. A
    subfolder of an import folder is named as not read."""
    text = (DATA / "nccl_pairs" / "sendrecv_node01_node02.txt").read_text()
    slow = text.replace("node02", "node03").replace("22.76   22.76", "4.50   4.50")
    with pytest.raises(SpecError) as e:
        parse_nccl(text + slow, "f.txt")
    assert "more than one nccl-tests run" in e.value.problem
    assert e.value.field == f"line {len(text.splitlines()) + 4}"  # the second run's rank 0
    old = "\n".join(ln.replace("Group  0 ", "") for ln in text.splitlines())
    assert old != text and parse_nccl(old, "f").hosts == ["node01", "node02"]
    d = tmp_path / "pairs"
    shutil.copytree(DATA / "nccl_pairs", d)
    (d / "rerun").mkdir()
    shutil.copy(d / "sendrecv_node01_node02.txt", d / "rerun" / "sendrecv_node01_node05.txt")
    meas = load_measurements([d])
    assert any("not read" in w and "rerun/" in w for w in meas.warnings), meas.warnings


def test_csv_header_units_are_read_and_fill_rules_see_both_ends(tmp_path):
    """A unit in the CSV's first header cell is the matrix's (Gbit/s had been read as GB/s,
    8x too fast); --units must agree with it. --fill min-row takes the slowest stream of
    either end (a pair into a degraded node is not filled at a healthy node's rate), and a
    node with no stream measured at all is named."""
    p = tmp_path / "m.csv"
    p.write_text("from\\to (Gbit/s),n1,n2\nn1,,180\nn2,160,\n")
    meas = load_measurements([p])
    assert meas.gb_per_s[0, 1] == pytest.approx(22.5)
    with pytest.raises(SpecError) as e:
        load_measurements([p], units="gb_per_s")
    assert "header says Gbit/s" in e.value.problem
    p.write_text("from\\to (GiB/s),n1,n2\nn1,,18\nn2,16,\n")
    with pytest.raises(SpecError, match="names GiB/s"):
        load_measurements([p])
    p.write_text("from\\to,a,b,c\na,,20,\nb,20,,4\nc,,4,\n")
    names, m, _w = check_and_fill(load_measurements([p]), fill=["min-row"])
    assert m[0, 2] == pytest.approx(4.0)  # a -> c: a's streams are 20, into c only 4
    p.write_text("from\\to,a,b,c\na,,20,\nb,20,,\nc,,,\n")
    with pytest.raises(SpecError) as e:
        check_and_fill(load_measurements([p]), fill=["min-row"])
    assert "c has no measured stream at all" in e.value.problem, e.value.problem


def test_cluster_show_says_what_is_inside_each_node(tmp_path):
    """cluster show names each node's GPUs and its best ring inside (with a matrix, also its
    slowest link), and calls a node whose ring is far below the others an intra-node
    outlier: a degraded NVLink had been invisible there."""
    p = tmp_path / "c.toml"
    nodes = "".join(f'[[nodes]]\nname = "g{i}"\ngpu = "{g}"\ngpus = 8\nintra_gb_per_s = {b}\n'
                    for i, (g, b) in enumerate((("H100-SXM-80GB", 360.0), ("H200-141GB", 360.0),
                                                ("H100-SXM-80GB", 48.0))))
    p.write_text('name = "mix"\n' + nodes + "[inter]\ngb_per_s = [[0, 40, 40], [40, 0, 40], "
                 "[40, 40, 0]]\n")
    d = json.loads(cli("cluster", "show", str(p), "--json").output)
    assert [(k["node"], k["gpu"], k["intra_gb_per_s"]) for k in d["node_detail"]] == [
        ("g0", "H100-SXM-80GB", 360.0), ("g1", "H200-141GB", 360.0), ("g2", "H100-SXM-80GB", 48.0)]
    assert [o["node"] for o in d["intra_outliers"]] == ["g2"]
    text = " ".join(cli("cluster", "show", str(p)).output.split())
    assert "1 node of 8 H100-SXM-80GB, best ring inside 48 GB/s: g2" in text, text
    assert "intra-node outliers" in text and "g2 (48 GB/s, 0.13x)" in text


@pytest.mark.parametrize("label,expect", [
    ("from\\to (GBit/s)", 22.5), ("(Gbits/s)", 22.5), ("gbit_s", 22.5), ("(Gbps)", 22.5),
    ("(GByte/s)", 180.0), ("gbit_per_s", 22.5), ("(Mbit/s)", "names Mbit/s"),
    ("TB_s", "names TB_s"), ("gb_s", "does not say bits or bytes"),
    ("(gbps)", "does not say bits or bytes")])
def test_csv_header_unit_in_any_unambiguous_spelling_or_refused(tmp_path, label, expect):
    """A header unit is read in any case where it says bits or bytes (a case-sensitive list
    had read '(GBit/s)' and '(Mbit/s)' matrices as GB/s, silently); a rate the import does not
    read, or a lower-case 'gb', is refused."""
    p = tmp_path / "m.csv"
    p.write_text(f"{label},n1,n2\nn1,,180\nn2,160,\n")
    if isinstance(expect, float):
        assert load_measurements([p]).gb_per_s[0, 1] == pytest.approx(expect)
    else:
        with pytest.raises(SpecError, match=expect):
            load_measurements([p])


def test_node_names_differing_only_in_case_are_one_machine(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("from\\to,node01,NODE01\nnode01,,20\nNODE01,20,\n")
    with pytest.raises(SpecError, match="differ only in case"):
        check_and_fill(load_measurements([p]))
    p.write_text("from\\to,node01,node02\nnode01,,20\nnode02,20,\n")
    with pytest.raises(SpecError) as e:
        check_and_fill(load_measurements([p]), nodes=["NODE01", "node02"])
    assert "differing only in case: node01 (--node-names has NODE01)" in e.value.problem


def test_directional_nccl_set_says_which_direction_it_filled(tmp_path):
    """Where some pairs were measured both ways, a direction without its file is filled from
    the reverse and said (it had been filled silently); a set of one file per pair covers
    both directions, as documented, without a word."""
    d = tmp_path / "pairs"
    shutil.copytree(DATA / "nccl_pairs", d)
    assert not [w for w in load_measurements([d]).warnings if "filled" in w]
    text = (d / "sendrecv_node01_node02.txt").read_text()
    rev = "\n".join(ln for ln in text.splitlines() if "Rank" not in ln)
    (d / "sendrecv_node02_node01.txt").write_text(rev)
    filled = [w for w in load_measurements([d]).warnings if "filled" in w]
    assert len(filled) == 5 and "filled node02 -> node01" not in " ".join(filled)
    assert any("filled node03 -> node01" in w for w in filled)


def test_outliers_by_their_best_stream_against_the_others_best():
    """One degraded node of three (two thirds of the links its own, so the cluster median
    was its rate) and a node that only sends slowly (its in/out median on the 0.75 line) are
    flagged; a healthy cluster is not, nor the nodes of a small leaf (a rule against the
    links not touching the node had flagged node04 and node05 of 6 nodes in leaves of 4)."""
    from formats.bandwidth import summarize
    from formats.clusters import uniform_cluster

    c = uniform_cluster(3, 8, "A100-80GB", 240.0, 24.0)
    m = c.inter_gb_per_s.copy()
    m[2, :2] = m[:2, 2] = 12.0
    import dataclasses
    c3 = dataclasses.replace(c, inter_gb_per_s=m)
    out = summarize(c3)["outliers"]
    assert [(o["node"], o["direction"]) for o in out] == [(c.nodes[2].name, "both")]
    assert out[0]["ratio"] == pytest.approx(0.5)
    c8 = uniform_cluster(8, 8, "A100-80GB", 240.0, 24.0)
    m = c8.inter_gb_per_s.copy()
    m[4, :] = 12.0
    np.fill_diagonal(m, 0.0)
    out = summarize(dataclasses.replace(c8, inter_gb_per_s=m))["outliers"]
    assert [(o["node"], o["direction"]) for o in out] == [(c8.nodes[4].name, "out")]
    assert summarize(c8)["outliers"] == []
    for nodes, leaf in ((6, 4), (13, 8), (27, 16), (4, 2), (10, 4)):
        c = synth_cluster(SynthParams(num_nodes=nodes, leaf_size=leaf, degraded=0, seed=0))
        assert summarize(c)["outliers"] == [], (nodes, leaf)


def test_import_options_are_blamed_on_the_options_and_rates_faster_than_a_nic_warned(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("from\\to,n1,n2\nn1,,180\nn2,160,\n")
    for args, field in ((["--gpu", "A100"], "--gpu"), (["--gpus-per-node", "0"],
                                                        "--gpus-per-node"),
                        (["--intra-gb-per-s", "-5"], "--intra-gb-per-s"),
                        (["--latency-us", "-1"], "--latency-us"),
                        (["--asym-ratio", "nan"], "--asym-ratio"),
                        (["--asym-ratio", "0.5"], "--asym-ratio")):
        base = ["cluster", "import", str(p), "--gpu", "A100-80GB", "--gpus-per-node", "8",
                "--intra-gb-per-s", "240"]
        r = cli(*base, *args, "-o", str(tmp_path / "c.toml"))
        assert r.exit_code == 2 and f"options: {field}:" in r.output, (args, r.output)
    r = cli(*IMPORT, str(p), "-o", str(tmp_path / "c.toml"))
    assert r.exit_code == 0 and "above any NIC's (100 GB/s" in r.output, r.output


def test_missing_pairs_error_names_a_file_whose_run_was_on_another_host(tmp_path):
    """A pair file named for node01 whose run was on node01.cluster.local leaves pairs
    missing; the error says why (its warning had been printed only on success)."""
    d = tmp_path / "pairs"
    shutil.copytree(DATA / "nccl_pairs", d)
    f = d / "sendrecv_node01_node02.txt"
    f.write_text(f.read_text().replace(" on     node01 ", " on     node01.cluster.local "))
    with pytest.raises(SpecError) as e:
        check_and_fill(load_measurements([d]))
    assert "missing pair" in e.value.problem
    assert "(note: file name says node01/node02 but the run was on node01.cluster.local" \
        in e.value.problem


@pytest.mark.parametrize("src,opts,says", [
    ("matrix.csv", ["--nccl-test", "bogus"], "--nccl-test: unknown value 'bogus'; use sendrecv"),
    ("matrix.csv", ["--mpigraph-table", "bogus"], "--mpigraph-table: unknown value 'bogus'"),
    ("matrix.csv", ["--mpigraph-table", "send"],
     "--mpigraph-table: applies to mpiGraph files; "),
    ("mpigraph_3hosts.txt", ["--nccl-test", "sendrecv"],
     "--nccl-test: applies to nccl-tests files; "),
    ("mpigraph_3hosts.txt", ["--units", "mb_per_s"], "--units: applies to CSV and JSON files"),
    ("nccl_pairs", ["--units", "mb_per_s"], "--units: applies to CSV and JSON files")])
def test_import_options_of_another_format_or_unknown_are_refused(src, opts, says):
    """--nccl-test, --mpigraph-table and --units: an unknown value, or one given for a file of
    another format, is one line and exit 2 (they had been ignored: exit 0)."""
    r = cli(*IMPORT, str(DATA / src), *opts)
    assert r.exit_code == 2 and f"options: {says}" in " ".join(r.output.split()), r.output
    for ok in (["mpigraph_3hosts.txt", "--mpigraph-table", "min"],
               ["nccl_pairs", "--nccl-test", "sendrecv"], ["matrix.json", "--units", "mb_per_s"]):
        r = cli(*IMPORT, str(DATA / ok[0]), *ok[1:])
        assert r.exit_code == 0, r.output


def test_two_matrix_files_are_read_one_at_a_time():
    """matrix.csv matrix.json: said (one matrix per import), not 'cannot tell the nccl test
    from the file name' (several sources had been taken for nccl-tests pair files)."""
    r = cli(*IMPORT, str(DATA / "matrix.csv"), str(DATA / "matrix.json"))
    line = " ".join(r.output.split())
    assert r.exit_code == 2 and "a CSV/JSON matrix is read one file at a time" in line, line
    assert "nccl test" not in line


@pytest.mark.parametrize("args,says", [
    (["--degraded", "0", "--degraded-factor", "0.1"], "--degraded-factor 0.1 has no effect"),
    (["--oversubscription", "8", "--leaf-size", "100", "--nodes", "4"],
     "--oversubscription 8 has no effect: the 4 nodes share one leaf switch")])
def test_synth_options_with_no_effect_are_warned(tmp_path, args, says):
    """cluster synth: a degraded-NIC factor with no degraded node, or an oversubscription with
    a single leaf, had been kept without a word; a warning says so (terminal and --json)."""
    r = runner.invoke(app, ["cluster", "synth", *args, "-o", str(tmp_path / "s.toml")])
    assert r.exit_code == 0 and f"warning: {says}" in " ".join(r.output.split()), r.output
    r = runner.invoke(app, ["cluster", "synth", *args, "--json"])
    d = json.loads(r.stdout)
    assert any(says in w for w in d["warnings"])
    r = runner.invoke(app, ["cluster", "synth", "-o", str(tmp_path / "t.toml")])
    assert "warning" not in r.output


def test_fill_does_not_make_a_node_of_a_second_host_name(tmp_path):
    """One pair file's run names node03 by its full name (node03.cluster.local) and the pair
    node02-node04 is not measured: --fill min-row had filled every pair of the full name and
    written a fifth node; it is refused naming the file's mismatch, and without the alias the
    same fill writes four nodes."""
    import shutil
    d = tmp_path / "pairs"
    shutil.copytree(DATA / "nccl_pairs", d)
    (d / "sendrecv_node02_node04.txt").unlink()
    f = d / "sendrecv_node01_node03.txt"
    f.write_text(f.read_text().replace(" node03 ", " node03.cluster.local "))
    r = cli(*IMPORT, str(d), "--fill", "min-row", "--out", str(tmp_path / "c.toml"))
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "node03.cluster.local" in r.output and "file name says" in r.output
    assert not (tmp_path / "c.toml").exists()
    f.write_text(f.read_text().replace(" node03.cluster.local ", " node03 "))
    r = cli(*IMPORT, str(d), "--fill", "min-row", "--out", str(tmp_path / "c.toml"))
    assert r.exit_code == 0, r.output
    assert load_cluster(str(tmp_path / "c.toml")).num_nodes == 4


def test_csv_header_without_its_corner_cell_says_so(tmp_path):
    """A CSV matrix whose header starts with the first node's name (no corner cell): it was
    read as the corner label, and the error spoke only of 3 rows against 2 columns; now it
    says what was read as the corner and how to write the header."""
    p = tmp_path / "m.csv"
    p.write_text("a1,a2,a3\na1,,10,12\na2,10,,11\na3,12,11,\n")
    r = cli(*IMPORT, str(p))
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "'a1', is read as the corner label" in r.output
    p.write_text(",a1,a2,a3\na1,,10,12\na2,10,,11\na3,12,11,\n")
    assert cli(*IMPORT, str(p), "--out", str(tmp_path / "c.toml")).exit_code == 0
