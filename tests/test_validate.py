"""The estimator against published runs: the goals of the estimator issue, held by a test."""

from formats.published import validate


def test_published_runs_within_goals():
    s = validate()
    assert s.time_median <= 0.15, f"median iteration-time error {s.time_median:.3f}"
    bloom_mem = [x.mem_err for x in s.rows if x.mem_err is not None]
    assert len(bloom_mem) >= 10
    assert max(bloom_mem) <= 0.15, f"BLOOM memory errors {sorted(bloom_mem)}"
    ok, n = s.oom_correct
    assert n >= 15 and ok == n, f"fits/OOM correct {ok}/{n}"
