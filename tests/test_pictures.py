"""The Gantt chart and placement pictures are written as non-empty PNGs."""

import pytest

from launch.pictures import gantt_png, placement_png, schedule_timeline, slow_links, slow_nodes
from formats import presets
from formats.clusters import cluster
from model.estimator import Evaluator, make_plan
from model.specs import JobSpec

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def setup():
    m = presets.model("llama2-70b")
    c = cluster("example")
    job = JobSpec(global_batch=16, seq_length=4096)
    return m, c, job


@pytest.mark.parametrize("kw", [dict(tp=8, pp=4, recompute="full"),
                                dict(tp=4, pp=8, dp=2, schedule="interleaved", chunks=2,
                                     recompute="full")])
def test_gantt_png(setup, tmp_path, kw):
    m, c, job = setup
    plan = make_plan(m, job, c, **kw)
    ev = Evaluator(m, job, c, plan.shape)
    t = schedule_timeline(ev, plan.placement)
    assert abs(t["length"] - ev.iteration_ms(plan.placement)) <= 1e-6 * t["length"]
    out = gantt_png(ev, plan.placement, tmp_path / "g.png", replica=0)
    data = out.read_bytes()
    assert data.startswith(PNG) and len(data) > 5000


def test_placement_png(setup, tmp_path):
    m, c, job = setup
    plan = make_plan(m, job, c, tp=8, pp=4)
    out = placement_png(c, plan, tmp_path / "p.png")
    data = out.read_bytes()
    assert data.startswith(PNG) and len(data) > 5000
    # the example cluster's half-rate NIC on node05 makes its links slow
    n5 = c.node_index("node05")
    assert any(n5 in pair for pair in slow_links(c))
    # the frame goes to that node alone, as cluster show and solve name it; every node with
    # a link to it had been framed (all of them on a small cluster)
    assert slow_nodes(c) == {n5}
    assert len({n for pair in slow_links(c) for n in pair}) > 1


@pytest.mark.parametrize("name,head", [("g.pdf", b"%PDF"), ("g.svg", b"<?xml"),
                                       ("g.png", b"\x89PNG"), ("g.txt", None), ("g", b"\x89PNG")])
def test_pictures_are_written_in_the_format_their_name_says(tmp_path, name, head):
    """--gantt g.pdf had been given PNG bytes: .pdf and .svg are written as such; a name with
    another suffix is one line and exit 2 before any work; a name without one is PNG, as
    before suffixes chose the format."""
    from typer.testing import CliRunner
    from cli import app
    path = tmp_path / name
    for args in (["estimate", "-m", "gpt-1.7b", "--gbs", "64", "--seq", "1024", "--tp", "1",
                  "--pp", "1", "--gantt", str(path)], ["cluster", "show", "--png", str(path)]):
        r = CliRunner().invoke(app, args)
        if head is None:
            assert r.exit_code == 2 and "a picture is written as .png, .pdf, .svg" in r.output
            assert not path.exists()
        else:
            assert r.exit_code == 0, r.output
            assert path.read_bytes().startswith(head)
            path.unlink()
