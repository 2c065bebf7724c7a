"""Matplotlib plots of the scripts' metric records (``[{"step": 1, "loss": 0.9}, ...]``).

No series is drawn where it cannot be seen: a series that keeps one value throughout (a test pass fraction that
stays 0) says so in its legend label or panel title, and a series that lies exactly on one drawn before
it is drawn dashed on top of it, its label saying which one it repeats.
"""

from __future__ import annotations

import math


def constant_value(values: list[float]) -> float | None:
    """The value a series keeps at every point, or None when it moves."""
    return values[0] if values and all(v == values[0] for v in values) else None


def describe(label: str, values: list[float]) -> str:
    """``label``, plus ": 0 throughout" when the series never moves."""
    value = constant_value(values)
    return f"{label}: {value:g} throughout" if value is not None and len(values) > 1 else label


def plot_lines(ax, series: dict[str, tuple[list[float], list[float]]], marker_below: int = 30) -> None:
    """Several series on one axes (``series``: label -> (x, y)), each visible and named in the legend.

    A series whose points are those of one drawn before it would hide it (or be hidden): it is drawn
    dashed, with hollow markers, on top, labelled "(same as <label>)"; a constant series says its value
    in its label."""
    drawn: list[tuple[str, list[float], list[float]]] = []
    for label, (x, y) in series.items():
        x, y = list(x), list(y)
        if not y:
            continue
        text = describe(label, y)
        twin = next((name for name, dx, dy in drawn if dx == x and dy == y), None)
        marker = "o" if len(y) < marker_below else None
        if twin is None:
            ax.plot(x, y, marker=marker, label=text)
        else:
            ax.plot(
                x,
                y,
                linestyle="--",
                marker=marker,
                markerfacecolor="none",
                markersize=9,
                label=f"{text} (same as {twin})",
            )
        drawn.append((label, x, y))
    ax.legend(fontsize="small")


def plot_metrics(
    records: list[dict],
    names: list[str] | None = None,
    title: str = "",
    columns: int = 3,
    marks: dict[str, float] | None = None,
):
    """One small panel per metric against step; ``marks`` ({label: step}) draws labelled vertical
    lines (e.g. where a job resumed). A metric that keeps one value says so in its panel's title.
    Returns the figure."""
    import matplotlib.pyplot as plt

    if not records:
        raise ValueError(
            f"No metric records to plot{' for ' + title if title else ''}: did the job print "
            f"'step=<n> name=<value>' lines?"
        )
    names = names or sorted({k for r in records for k in r if k != "step"})
    rows = math.ceil(len(names) / columns)
    figure, axes = plt.subplots(
        rows, min(columns, len(names)), figsize=(4 * min(columns, len(names)), 2.8 * rows), squeeze=False
    )
    for ax, name in zip(axes.flat, names, strict=False):
        points = [(r["step"], r[name]) for r in records if name in r]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o" if len(points) < 30 else None)
        ax.set_title(describe(name, [p[1] for p in points]))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        for label, step in (marks or {}).items():
            ax.axvline(step, color="tab:red", linestyle="--", linewidth=1, label=label)
        if marks:
            ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


def compare_runs(runs: dict[str, list[dict]], name: str, ax=None):
    """One metric of several jobs on the same axes (``runs``: label -> records), none hidden."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    series = {}
    for label, records in runs.items():
        points = [(r["step"], r[name]) for r in records if name in r]
        if points:
            series[label] = ([p[0] for p in points], [p[1] for p in points])
    plot_lines(ax, series)
    ax.set_title(name)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    return ax
