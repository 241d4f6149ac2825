"""Intra-node topology presets, cluster files that name them, and TP-group choice."""

import numpy as np
import pytest

from formats import presets
from formats.clusters import cluster_from_dict, cluster_to_toml, load_cluster
from formats.presets import gpu
from formats.topologies import load_topology, node_with_topology, topology_names
from model.cluster import NodeSpec
from model.errors import SpecError
from model.estimator import estimate, make_plan
from model.specs import JobSpec
from model.topology import _partitions, best_tp_groups


def test_presets_present_and_symmetric():
    names = topology_names()
    for n in ("dgx-a100", "dgx-h100", "dgx1-v100", "pcie-2socket"):
        assert n in names
    for n in names:
        t = load_topology(n)
        m = t.matrix_gb_per_s
        assert m.shape == (t.num_gpus, t.num_gpus)
        assert np.allclose(m, m.T) and (np.diag(m) == 0).all()
        assert t.source


def test_uniform_nvswitch_values():
    # 600 GB/s bidirectional = 300 per direction x 0.8 achieved; H100: 450 x 0.8
    assert load_topology("dgx-a100").ring_gb_per_s == pytest.approx(240.0)
    assert load_topology("dgx-h100").ring_gb_per_s == pytest.approx(360.0)


def test_dgx1_hybrid_cube_mesh():
    t = load_topology("dgx1-v100")
    m = t.matrix_gb_per_s
    link = 25.0 * 0.8
    assert m[0, 3] == pytest.approx(2 * link) and m[0, 1] == pytest.approx(link)
    assert m[0, 5] == pytest.approx(10.0)  # no NVLink: PCIe / QPI
    # every GPU has six links: sum of NVLink bandwidth per GPU = 6 links
    nv = np.where(m > 10.0, m, 0.0)
    assert np.allclose(nv.sum(axis=1), 6 * link)
    # the double links form the ring 0-3-2-1-5-6-7-4: a full-node ring at 2 links
    assert t.ring_gb_per_s == pytest.approx(2 * link)


def _node(topo: str) -> NodeSpec:
    return node_with_topology(NodeSpec("n", gpu("V100-32GB") if "v100" in topo
                                       else gpu("A100-80GB"), 8, 1.0), load_topology(topo))


def test_best_tp_groups_dgx1_beats_contiguous():
    node = _node("dgx1-v100")
    contiguous = [(0, 1), (2, 3), (4, 5), (6, 7)]
    best = best_tp_groups(node, 2)
    assert min(node.ring_gb_per_s(g) for g in contiguous) == pytest.approx(20.0)
    assert min(node.ring_gb_per_s(g) for g in best) == pytest.approx(40.0)
    assert sorted(x for g in best for x in g) == list(range(8))
    g4 = best_tp_groups(node, 4)
    assert len(g4) == 2 and min(node.ring_gb_per_s(g) for g in g4) == pytest.approx(20.0)
    assert best_tp_groups(node, 8) == [tuple(range(8))]
    assert best_tp_groups(node, 1) == [(i,) for i in range(8)]


def test_best_tp_groups_pcie_keeps_sockets_together():
    node = _node("pcie-2socket")
    assert best_tp_groups(node, 4) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    # uniform node: contiguous groups
    uni = NodeSpec("u", gpu("A100-80GB"), 8, 240.0)
    assert best_tp_groups(uni, 2) == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_best_tp_groups_is_exhaustive_optimum():
    rng = np.random.default_rng(3)
    m = rng.uniform(5, 50, size=(6, 6))
    m = (m + m.T) / 2
    np.fill_diagonal(m, 0)
    node = NodeSpec("r", gpu("A100-80GB"), 6, 10.0, m)
    for tp in (2, 3):
        best = best_tp_groups(node, tp)
        opt = max(min(node.ring_gb_per_s(g) for g in p) for p in _partitions(tuple(range(6)), tp))
        assert min(node.ring_gb_per_s(g) for g in best) == pytest.approx(opt)
    assert sum(1 for _ in _partitions(tuple(range(8)), 2)) == 105


def test_best_tp_groups_rejects_bad_tp():
    with pytest.raises(SpecError, match="must divide"):
        best_tp_groups(_node("dgx-a100"), 3)


def _raw(**node_extra):
    nd = {"name": "a", "gpu": "V100-32GB", "gpus": 8, **node_extra}
    nd2 = dict(nd, name="b")
    return {"nodes": [nd, nd2], "inter": {"gb_per_s": [[0, 10.0], [10.0, 0]]}}


def test_cluster_file_intra_topology(tmp_path):
    c = cluster_from_dict(_raw(intra_topology="dgx1-v100"), "t.toml")
    nd = c.nodes[0]
    assert nd.intra_matrix_gb_per_s is not None and nd.link_gb_per_s(0, 3) == pytest.approx(40.0)
    assert nd.intra_gb_per_s == pytest.approx(40.0)  # best full-node ring
    # round trip through the writer: the matrix is written out explicitly
    p = tmp_path / "c.toml"
    p.write_text(cluster_to_toml(c))
    back = load_cluster(p)
    assert np.allclose(back.nodes[1].intra_matrix_gb_per_s, nd.intra_matrix_gb_per_s)
    # an explicit intra_gb_per_s (a measured ring, here a degraded NVLink at a tenth) scales
    # the preset's matrix: every link in proportion, and the cost model sees it
    c2 = cluster_from_dict(_raw(intra_topology="dgx1-v100", intra_gb_per_s=4.0), "t.toml")
    assert c2.nodes[0].intra_gb_per_s == 4.0
    assert np.allclose(c2.nodes[0].intra_matrix_gb_per_s, nd.intra_matrix_gb_per_s / 10)
    assert c2.nodes[0].ring_gb_per_s(tuple(range(8))) == pytest.approx(4.0)
    m = presets.model("llama2-7b")
    job = JobSpec(global_batch=32, seq_length=4096, precision="fp16")
    t = [estimate(m, job, cc, make_plan(m, job, cc, tp=8, pp=2, dp=1)).iteration_ms
         for cc in (c, c2)]
    assert t[1] > 1.2 * t[0]
    # a GPU-by-GPU matrix gives the ring itself: intra_gb_per_s may be left out, and one that
    # disagrees with the matrix is refused (it had been ignored)
    mat = nd.intra_matrix_gb_per_s.tolist()
    c3 = cluster_from_dict(_raw(intra_matrix_gb_per_s=mat), "t.toml")
    assert c3.nodes[0].intra_gb_per_s == pytest.approx(40.0)
    with pytest.raises(SpecError, match=r"t.toml: nodes\[0\].intra_gb_per_s: is 4 GB/s, but "
                       r"intra_matrix_gb_per_s's best ring over the node's 8 GPUs is 40 GB/s"):
        cluster_from_dict(_raw(intra_matrix_gb_per_s=mat, intra_gb_per_s=4.0), "t.toml")
    assert cluster_from_dict(_raw(intra_matrix_gb_per_s=mat, intra_gb_per_s=40.2),
                             "t.toml").nodes[0].intra_gb_per_s == pytest.approx(40.0)
    # the matrix is per GPU: a node's changed GPU count names that (it had said "one per node")
    with pytest.raises(SpecError, match=r"must be a 4x4 list of rows, one per GPU of the node "
                       r"\(its 'gpus': 4\)"):
        cluster_from_dict(_raw(intra_matrix_gb_per_s=mat, gpus=4), "t.toml")


@pytest.mark.parametrize("extra,needle", [
    ({"intra_topology": "nope"}, "nodes[0].intra_topology: unknown intra-node topology 'nope'"),
    ({"intra_topology": "dgx1-v100", "intra_matrix_gb_per_s": [[0.0]]}, "not both"),
    ({}, "nodes[0].intra_gb_per_s: missing"),
])
def test_cluster_file_intra_topology_errors(extra, needle):
    with pytest.raises(SpecError) as e:
        cluster_from_dict(_raw(**extra), "t.toml")
    assert needle in str(e.value) and str(e.value).startswith("t.toml")


def test_topology_gpu_count_mismatch():
    raw = _raw(intra_topology="dgx1-v100")
    for nd in raw["nodes"]:
        nd["gpus"] = 4
    with pytest.raises(SpecError, match="has 8 GPUs but this node has gpus = 4"):
        cluster_from_dict(raw, "t.toml")


def test_bad_topology_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("gpus = 2\nlink_gb_per_s = 25.0\nother_gb_per_s = 5.0\n"
                 "nvlinks = [[0, 1], [2, 0]]\n")
    with pytest.raises(SpecError, match=r"nvlinks: links \[0\]\[1\] and \[1\]\[0\] differ"):
        load_topology(str(p))


def test_block_placement_picks_the_best_tensor_groups_on_uneven_nodes(tmp_path):
    """Issue 3: where intra-node links are not uniform, the solver's placements choose which
    GPUs form each tensor-parallel group (here DGX-1 pairs joined by two NVLinks)."""
    from formats.clusters import load_cluster
    from model.plan import block_placement

    p = tmp_path / "dgx1.toml"
    p.write_text('name="dgx1"\n[[nodes]]\nname="a"\ngpu="V100-32GB"\ngpus=8\n'
                 'intra_topology="dgx1-v100"\n[[nodes]]\nname="b"\ngpu="V100-32GB"\ngpus=8\n'
                 'intra_topology="dgx1-v100"\n[inter]\ngb_per_s=[[0, 10], [10, 0]]\n')
    c = load_cluster(p)
    pl = block_placement(c, 2, 2, 4, 1)
    node = c.nodes[0]
    chosen = min(node.ring_gb_per_s(g) for g in pl.gpus[0])
    consecutive = min(node.ring_gb_per_s((x, x + 1)) for x in range(0, 8, 2))
    assert chosen > consecutive


def test_all_node_ring_bound_is_the_best_ring_through_every_node():
    """all_node_ring_max_gb_per_s bounds the slowest stream of every ring through all nodes
    (enumerated), on random asymmetric matrices with a degraded node; no ring avoids every
    slow link of a node."""
    import itertools

    from formats.clusters import SynthParams, synth_cluster
    tighter = 0
    for n in (2, 3, 4, 5, 6):
        for seed in range(6):
            c = synth_cluster(SynthParams(num_nodes=n, gpus_per_node=2, seed=seed, noise=0.3,
                                          degraded=1, degraded_factor=0.5, leaf_size=2))
            bw = c.inter_gb_per_s
            best = max(min(bw[o[i], o[(i + 1) % n]] for i in range(n))
                       for o in ([0, *p] for p in itertools.permutations(range(1, n))))
            bound = c.all_node_ring_max_gb_per_s
            assert best <= bound + 1e-12
            # every node sends and receives on a ring through all: a degraded one too
            for v in range(n):
                off = [m for m in range(n) if m != v]
                assert bound <= min(max(bw[v, m] for m in off), max(bw[m, v] for m in off))
            if n == 2:  # the two links are the ring
                assert best == bound
            tighter += bound > bw[~np.eye(n, dtype=bool)].min()
    assert tighter >= 10  # above the slowest link: the bound says more than it


def test_a_uniform_link_matrix_is_the_nodes_rate():
    """An NVSwitch node's matrix (every GPU pair at the node's rate: dgx-h100) is that rate,
    not GPU-specific links: such a cluster had gone to the annealer, with the exact method's
    proof lost and 'non-uniform intra-node links' given as the reason. A matrix with one
    slower pair stays."""
    import dataclasses

    import numpy as np

    from formats.clusters import uniform_cluster
    from formats.topologies import cluster_with_topology
    c = uniform_cluster(4, 8, "H100-SXM-80GB", 360.0, 40.0)
    t = cluster_with_topology(c, "dgx-h100")
    assert not t.gpu_specific_links and t.uniform()
    assert all(nd.intra_matrix_gb_per_s is None and nd.intra_gb_per_s == 360.0
               for nd in t.nodes)
    m = np.full((8, 8), 360.0)
    np.fill_diagonal(m, 0.0)
    m[0, 1] = 300.0
    odd = dataclasses.replace(c.nodes[0], intra_gb_per_s=300.0, intra_matrix_gb_per_s=m)
    assert odd.intra_matrix_gb_per_s is not None
    assert dataclasses.replace(c, nodes=(odd,) + c.nodes[1:]).gpu_specific_links


def test_two_gpu_specs_under_one_name_are_refused():
    """The cost model keys its per-GPU caches by the GPU's name: two different specs under one
    name in a cluster would share their times (a faster copy of a preset, built in Python
    without a new name, had changed the other nodes' stage times). Refused in one line."""
    import dataclasses

    import numpy as np

    from formats import presets
    from model.cluster import ClusterSpec, NodeSpec
    from model.errors import SpecError
    g = presets.gpu("H100-SXM-80GB")
    inter = np.array([[0.0, 20.0], [20.0, 0.0]])
    same = ClusterSpec("c", (NodeSpec("a", g, 8, 360.0),
                             NodeSpec("b", dataclasses.replace(g), 8, 360.0)), inter, 5.0)
    assert same.homogeneous
    with pytest.raises(SpecError) as e:
        ClusterSpec("c", (NodeSpec("a", g, 8, 360.0),
                          NodeSpec("b", dataclasses.replace(g, hbm_gb_per_s=1000.0), 8, 360.0)),
                    inter, 5.0)
    assert e.value.field == "nodes.gpu" and "give each its own name" in str(e.value)
