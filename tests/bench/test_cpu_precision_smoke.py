"""The precision benchmark runs end to end on the tiny model: jobs and sessions, both precisions."""

from bench import cpu_precision


def test_the_precision_benchmark_measures_jobs_and_sessions_in_both_precisions_on_the_tiny_model():
    rows = cpu_precision.measure(["tiny"], rounds=1, log=lambda line: None)
    assert [row.benchmark.split(":")[0] for row in rows] == ["jobs", "jobs", "sessions", "sessions"]
    assert all(row.ours > 0 and row.baseline > 0 and row.baseline_name == "fp32" for row in rows)
    assert all("this CPU" in row.notes for row in rows)
