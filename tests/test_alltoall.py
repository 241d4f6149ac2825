"""The all-to-all of expert parallelism on a measured matrix (model/communication.py)."""

import numpy as np
import pytest

from formats.clusters import SynthParams, synth_cluster, uniform_cluster
from model.communication import alltoall_ms


@pytest.mark.parametrize("n", [2, 4, 8])
def test_uniform_matrix_matches_the_closed_form(n):
    """One member per node, every stream 25 GB/s: (n - 1) / n x bytes / bandwidth."""
    c = uniform_cluster(n, 8, "A100-80GB", 240.0, 25.0)
    nbytes = 64e6
    got = alltoall_ms(c, [(k, 0) for k in range(n)], nbytes, latency_us=0.0)
    assert got == pytest.approx((n - 1) / n * nbytes / (25.0 * 1e6), rel=1e-12)
    # inside one node the same over NVLink
    got = alltoall_ms(c, [(0, g) for g in range(n)], nbytes, latency_us=0.0)
    assert got == pytest.approx((n - 1) / n * nbytes / (240.0 * 1e6), rel=1e-12)


def test_a_slow_node_slows_everyone_and_placement_matters():
    """A degraded NIC bounds the whole exchange; a group kept off it is faster."""
    c = synth_cluster(SynthParams(num_nodes=8, degraded=1, degraded_factor=0.25, noise=0.0,
                                  oversubscription=1.0, seed=1))
    rates = np.array([np.mean([c.inter_gb_per_s[a, b] for b in range(8) if b != a])
                      for a in range(8)])
    slow = int(np.argmin(rates))  # the node with the degraded NIC
    fast = [k for k in range(8) if k != slow][:4]
    with_slow = [slow] + fast[:3]
    t_fast = alltoall_ms(c, [(k, 0) for k in fast], 64e6, 5.0)
    t_slow = alltoall_ms(c, [(k, 0) for k in with_slow], 64e6, 5.0)
    assert t_slow > 2 * t_fast
