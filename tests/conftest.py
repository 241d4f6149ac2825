import pytest

from formats import presets
from formats.clusters import cluster, uniform_cluster
from model.specs import JobSpec


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
