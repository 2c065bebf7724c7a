"""helpers/plots.py hides no series: one that keeps a value says so, one that repeats another is drawn
on top of it, dashed, and says which one it repeats."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from helpers.plots import compare_runs, constant_value, describe, plot_lines, plot_metrics


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def _legend(ax) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def test_a_series_that_stays_zero_says_so():
    assert constant_value([0, 0, 0]) == 0 and constant_value([0, 1]) is None
    assert describe("tests passed", [0.0, 0.0, 0.0]) == "tests passed: 0 throughout"
    assert describe("reward", [0.1, 0.3]) == "reward"


def test_notebook_9s_right_hand_plot_shows_both_zero_series():
    """Its case: tests passed and clip fraction, both 0 at every step, beside the reward."""
    _, ax = plt.subplots()
    steps = [1, 2, 3, 4]
    plot_lines(
        ax,
        {
            "reward": (steps, [0.1, 0.2, 0.2, 0.4]),
            "tests passed": (steps, [0, 0, 0, 0]),
            "clip fraction": (steps, [0, 0, 0, 0]),
        },
    )
    assert _legend(ax) == [
        "reward",
        "tests passed: 0 throughout",
        "clip fraction: 0 throughout (same as tests passed)",
    ]
    reward, passed, clip = ax.get_lines()
    # the repeated series is drawn after (on top of) the one it repeats, in a style that leaves it visible
    assert passed.get_linestyle() == "-" and clip.get_linestyle() == "--"
    assert clip.get_markerfacecolor() == "none" and clip.get_markersize() > passed.get_markersize()
    assert clip.get_zorder() >= passed.get_zorder() and clip.get_color() != passed.get_color()


def test_different_series_are_drawn_plainly():
    _, ax = plt.subplots()
    plot_lines(ax, {"a": ([1, 2], [0.0, 1.0]), "b": ([1, 2], [1.0, 0.0])})
    assert _legend(ax) == ["a", "b"] and {line.get_linestyle() for line in ax.get_lines()} == {"-"}


def test_a_metric_that_keeps_one_value_says_so_in_its_panel_title():
    records = [{"step": s, "test_pass_fraction": 0.0, "no_code_rate": 0.5 - 0.1 * s} for s in (1, 2, 3)]
    figure = plot_metrics(records, ["test_pass_fraction", "no_code_rate"])
    assert [ax.get_title() for ax in figure.axes] == ["test_pass_fraction: 0 throughout", "no_code_rate"]


def test_compare_runs_shows_two_jobs_with_the_same_curve():
    same = [{"step": s, "reward": 0.1 * s} for s in (1, 2, 3)]
    ax = compare_runs({"grpo": same, "grpo-spot": same}, "reward")
    assert _legend(ax) == ["grpo", "grpo-spot (same as grpo)"]
