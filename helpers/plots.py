"""Matplotlib plots of the scripts' metric records (``[{"step": 1, "loss": 0.9}, ...]``)."""

from __future__ import annotations

import math


def plot_metrics(
    records: list[dict],
    names: list[str] | None = None,
    title: str = "",
    columns: int = 3,
    marks: dict[str, float] | None = None,
):
    """One small panel per metric against step; ``marks`` ({label: step}) draws labelled vertical
    lines (e.g. where a job resumed). Returns the figure."""
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
        ax.set_title(name)
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
    """One metric of several jobs on the same axes (``runs``: label -> records)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    for label, records in runs.items():
        points = [(r["step"], r[name]) for r in records if name in r]
        if points:
            ax.plot(
                [p[0] for p in points], [p[1] for p in points], label=label, marker="o" if len(points) < 30 else None
            )
    ax.set_title(name)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return ax
