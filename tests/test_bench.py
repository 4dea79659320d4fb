"""The benchmark runs end to end and measures what it names (no timing assertions here:
performance numbers come from the GPU, see docs/benchmarks/)."""

import pytest

pytestmark = pytest.mark.engine


def test_cfg_bench_runs_both_modes_with_fixed_lengths():
    from speechctl.bench.cfg import run_cfg_bench

    lines = []
    result = run_cfg_bench("tiny", concurrencies=(1, 3), frames=12, repeats=1, log=lines.append)
    assert [r["concurrency"] for r in result["results"]] == [1, 3]
    for row in result["results"]:
        assert row["plain_frames_per_s"] > 0 and row["cfg_frames_per_s"] > 0
        assert row["cfg_ratio"] == pytest.approx(row["cfg_frames_per_s"] / row["plain_frames_per_s"], rel=1e-2)
    assert result["pair_violations"] == 0
    assert result["model"]["codebooks"] == 4 and len(lines) == 2
