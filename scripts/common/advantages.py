"""GRPO's group-relative advantage: the one definition both halves use.

The job scripts (``scripts/grpo.py``, ``scripts/code_rl.py``) and the training-session loops call this
same function, so "GRPO" means one thing on both sides. It imports nothing but the standard library:
the SDK v3 environment, which has no torch, imports it too.

Rewards come group by group (``group_size`` consecutive completions of one prompt). The advantage of
completion i is its reward minus its group's mean; what happens next is a named choice:

- ``scale_rewards="group"``: divide by the group's reward standard deviation (Bessel's correction,
  plus 1e-4), as in the GRPO paper and TRL's default. Every group then pushes with the same strength,
  whatever the spread of its rewards.
- ``scale_rewards="none"``: only centre (Dr. GRPO). Dividing by the std up-weights groups that are
  almost all right or all wrong (a small std), a bias towards too-easy and too-hard prompts.

A group whose rewards are all equal gets advantages of exactly 0 under either choice: it teaches
nothing, and a loop may skip it (``is_flat``) to save the tokens of training on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

ScaleRewards = Literal["group", "none"]
STD_EPSILON = 1e-4


def group_advantages(rewards: Sequence[float], group_size: int, scale_rewards: ScaleRewards = "group") -> list[float]:
    """Advantages of ``rewards`` (ordered group by group, ``group_size`` each), one per reward."""
    if scale_rewards not in ("group", "none"):
        raise ValueError(f"scale_rewards must be 'group' or 'none', got {scale_rewards!r}.")
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2 (the group is the baseline), got {group_size}.")
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}.")
    advantages: list[float] = []
    for start in range(0, len(rewards), group_size):
        group = [float(r) for r in rewards[start : start + group_size]]
        if not all(math.isfinite(r) for r in group):
            raise ValueError(f"non-finite reward in group {start // group_size}: {group}")
        mean = sum(group) / group_size
        centred = [r - mean for r in group]
        if is_flat(group):
            centred = [0.0] * group_size
        elif scale_rewards == "group":
            std = math.sqrt(sum(c * c for c in centred) / (group_size - 1))
            centred = [c / (std + STD_EPSILON) for c in centred]
        advantages += centred
    return advantages


def is_flat(group_rewards: Sequence[float]) -> bool:
    """True when every reward of one group is the same: its advantages are all 0."""
    return all(r == group_rewards[0] for r in group_rewards)


def group_advantages_excluding(
    rewards: Sequence[float | None], group_size: int, scale_rewards: ScaleRewards = "group"
) -> tuple[list[float], int]:
    """``group_advantages`` where a reward of ``None`` or NaN marks a sample with no reward (an LLM judge
    that failed): it is left out of its group's mean and std and gets an advantage of exactly 0, so it
    pushes the policy neither way. A group with fewer than two rewarded samples has no baseline and is
    all 0. Returns the advantages and how many samples were excluded (for the step's metrics)."""
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}.")
    advantages: list[float] = []
    excluded = 0
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        rewarded = [i for i, r in enumerate(group) if r is not None and not math.isnan(r)]
        excluded += group_size - len(rewarded)
        group_result = [0.0] * group_size
        if len(rewarded) >= 2:
            kept = group_advantages([float(group[i]) for i in rewarded], len(rewarded), scale_rewards)
            for index, advantage in zip(rewarded, kept, strict=True):
                group_result[index] = advantage
        advantages += group_result
    return advantages, excluded
