import numpy as np
import pytest

from formats import presets
from formats.clusters import cluster, uniform_cluster
from model.specs import JobSpec, ModelSpec


@pytest.fixture
def milp_path(monkeypatch):
    """The exact method without its enumeration of small blocks (solvers.brute.enumerable):
    tiny test instances then go through the annealing warm start and the MILP, the path that
    larger clusters take. Their annealing warm start is cut to 0.05 s a block (1 s in
    solvers.search): it only seeds the MILP, which proves the block's optimum either way,
    and a full second on each of the 30-odd tiny blocks is most of these tests' time."""
    from solvers import brute, search
    monkeypatch.setattr(brute, "ENUMERATE_MAX_EVALS", 0)
    monkeypatch.setattr(search, "WARM_START_S", 0.05)


@pytest.fixture
def example_cluster():
    return cluster("example")


@pytest.fixture
def gpt175():
    return presets.model("gpt3-175b")


@pytest.fixture
def small_uniform():
    return uniform_cluster(4, 8, "A100-80GB", 240.0, 23.0)


@pytest.fixture
def job175():
    return JobSpec(global_batch=1536, seq_length=2048, precision="fp16")


def _megatron_groups(world: int, sizes: dict, order: str, dim: str) -> list[list[int]]:
    """Megatron-LM's rule (parallel_state.RankGenerator): ranks are laid out over the
    dimensions of `order`, the first fastest; a `dim` group holds the ranks that differ only in
    that dimension's index."""
    names = order.split("-")
    shape = [sizes[n] for n in names]
    assert int(np.prod(shape)) == world
    coords = np.array(np.unravel_index(np.arange(world), shape, order="F")).T
    k = names.index(dim)
    groups: dict[tuple, list[int]] = {}
    for rank, co in enumerate(coords):
        key = tuple(int(x) for i, x in enumerate(co) if i != k)
        groups.setdefault(key, []).append(rank)
    return list(groups.values())


@pytest.fixture
def megatron_groups():
    """Megatron-LM's RankGenerator rule as a function (world, sizes, order, dim) -> groups."""
    return _megatron_groups


@pytest.fixture
def moe_first_dense():
    """A tiny mixture of experts (4 experts top-2, one shared) with a leading dense layer
    cheaper than its MoE layers: brute force over it is milliseconds."""
    return ModelSpec("moe-fd", 6, 1024, 8, 2, 4096, 8000, 2048, gated_mlp=True, norm="rmsnorm",
                     bias=False, dropout=False, position_embedding="rope", num_experts=4,
                     moe_topk=2, moe_ffn_hidden_size=1024, moe_shared_experts=1,
                     first_dense_layers=1)
