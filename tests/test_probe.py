"""The bandwidth probe: its round-robin schedule, and a real run over gloo on local processes."""

import itertools
import json
import multiprocessing
import os
import socket
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from formats.clusters import load_cluster
from probe.p2p_bandwidth import round_robin

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("n", range(2, 11))
def test_round_robin_covers_every_pair_once(n):
    rounds = round_robin(n)
    # n even: n-1 rounds of n/2 pairs; n odd: n rounds of (n-1)/2 pairs (one node rests)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    for r in rounds:
        assert len(r) == n // 2
        flat = [x for p in r for x in p]
        assert len(flat) == len(set(flat))  # pairs of a round are disjoint
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(rank: int, port: str, out: str) -> None:
    """One emulated node: the probe's own entry point, with torchrun's environment."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=port)
    from probe.p2p_bandwidth import main
    sys.exit(main(["-o", out, "--backend", "gloo", "--name-by", "rank", "--size-mb", "0.5",
                   "--iters", "2", "--warmup", "1"]))


def test_probe_gloo_four_local_nodes_round_trips(tmp_path):
    pytest.importorskip("torch")
    import torch.distributed  # noqa: F401  (imported once here, inherited by the forked nodes)

    out = tmp_path / "bw.json"
    port = str(_free_port())
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_node, args=(rank, port, str(out))) for rank in range(4)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    d = json.loads(out.read_text())
    assert d["nodes"] == ["rank0", "rank1", "rank2", "rank3"]
    assert len(d["rounds"]) == 3 and all(len(r) == 2 for r in d["rounds"])
    m = d["gb_per_s"]
    assert all(m[i][i] is None for i in range(4))
    assert all(m[i][j] > 0 for i in range(4) for j in range(4) if i != j)
    toml = tmp_path / "c.toml"
    r = CliRunner().invoke(app, ["cluster", "import", str(out), "--gpu", "A100-80GB",
                                 "--gpus-per-node", "8", "--intra-gb-per-s", "240",
                                 "-o", str(toml)])
    assert r.exit_code == 0, r.output
    c = load_cluster(toml)
    assert [nd.name for nd in c.nodes] == d["nodes"]
    assert c.inter_gb_per_s[1, 2] == pytest.approx(m[1][2], abs=0.006)
