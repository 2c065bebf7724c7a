"""Benchmark tables: number formatting, ratios, memory columns, Markdown layout. Nothing timed."""

import pytest

from bench.tables import COLUMNS, Row, format_number, format_table


@pytest.mark.parametrize(
    "value, text",
    [
        (None, "-"),
        (0, "0"),
        (0.123456, "0.123"),
        (1.0, "1"),
        (12.345, "12.3"),
        (999.4, "999"),
        (1234.5, "1234"),
        (0.000123, "1.23e-04"),
        (123456.0, "1.23e+05"),
        (-0.5, "-0.5"),
    ],
)
def test_format_number(value, text):
    assert format_number(value) == text


def test_ratio_is_ours_over_baseline_and_empty_without_one():
    assert Row("sft step", "tiny", 0.02, "s/step", 0.04).ratio == pytest.approx(0.5)
    assert Row("sandbox", "trivial", 250.0, "tests/s").ratio is None
    assert Row("x", "y", None, "s", 1.0).ratio is None
    assert Row("x", "y", 1.0, "s", 0.0).ratio is None


def test_table_layout():
    rows = [
        Row(
            "sft step",
            "tiny (1.3 M params)",
            0.0213,
            "s/step",
            0.0426,
            "TRL SFTTrainer",
            480.4,
            601.0,
            notes="median of 3x5",
        ),
        Row("sandbox", "trivial | 2 workers", 251.0, "tests/s", memory_mib=95.2),
    ]
    assert format_table(rows, "Combined").splitlines() == [
        "### Combined",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|---|---|---|---|---|---|---|",
        "| sft step | tiny (1.3 M params) | 0.0213 | 0.0426 (TRL SFTTrainer) | 0.50 | s/step | 480 / 601 RSS "
        "| median of 3x5 |",
        "| sandbox | trivial \\| 2 workers | 251 | - | - | tests/s | 95.2 RSS |  |",
    ]


def test_table_without_memory_or_title():
    text = format_table([Row("grpo step: reward", "tiny", 0.0005, "s/step", 0.001, "TRL", memory_kind="max allocated")])
    lines = text.splitlines()
    assert lines[0].startswith("| benchmark |")
    assert lines[2] == "| grpo step: reward | tiny | 5.00e-04 | 0.001 (TRL) | 0.50 | s/step | - |  |"


def test_to_dict_carries_the_ratio():
    record = Row("a", "b", 2.0, "s", 4.0, extra={"cpu_ms_per_test": 3.0}).to_dict()
    assert record["ratio"] == 0.5 and record["extra"] == {"cpu_ms_per_test": 3.0}
