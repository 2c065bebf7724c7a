"""The precision benchmark runs end to end on the tiny model and prints both precisions' figures."""

from bench import session_precision


def test_the_precision_benchmark_measures_both_precisions_on_the_tiny_model():
    rows = session_precision.measure(["tiny"], rounds=1, log=lambda line: None)
    assert [row.unit for row in rows] == ["s", "s"] and "forward_backward" in rows[0].case
    assert all(row.ours > 0 and row.baseline > 0 and row.baseline_name == "fp32" for row in rows)
    assert all("this CPU" in row.notes for row in rows)
