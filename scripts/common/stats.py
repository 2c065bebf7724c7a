"""Held-out figures with their noise: a mean with its standard error, and a paired change.

Torch-free, so the job scripts (``common.stats``), the session loops and the notebook helpers
(``scripts.common.stats``) share one definition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean_and_standard_error(values: Sequence[float]) -> tuple[float, float]:
    """The mean of independent values and its standard error (sample std / sqrt(n); 0 for one value)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_and_standard_error needs at least one value")
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def paired_change(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """After minus before on the same items (problems), and the standard error of that change, from the
    per-item differences: each item's own difficulty cancels out, so it is smaller than the two
    figures' errors combined."""
    if len(before) != len(after):
        raise ValueError(f"a paired change needs the same items before and after, got {len(before)} and {len(after)}")
    return mean_and_standard_error([a - b for a, b in zip(after, before, strict=True)])
