"""The one GRPO advantage both halves use (scripts/common/advantages.py), checked against its formulas."""

import math

import pytest
from common.advantages import group_advantages, is_flat


def test_scaled_and_centred_advantages_follow_their_formulas():
    rewards = [1.0, 0.0, 0.0, 0.5, 2.0, 2.0, 2.0, 2.0]  # a mixed group, then a group with no signal
    centred = group_advantages(rewards, group_size=4, scale_rewards="none")
    assert centred == pytest.approx([0.625, -0.375, -0.375, 0.125, 0, 0, 0, 0])
    std = math.sqrt(sum(a * a for a in centred[:4]) / 3)  # Bessel's correction
    scaled = group_advantages(rewards, group_size=4, scale_rewards="group")
    assert scaled[:4] == pytest.approx([a / (std + 1e-4) for a in centred[:4]])
    assert scaled[4:] == [0.0] * 4  # a flat group is exactly 0 under either choice
    assert sum(scaled[:4]) == pytest.approx(0, abs=1e-12)


def test_flat_groups_and_bad_input():
    assert is_flat([1, 1, 1]) and not is_flat([1, 0, 1])
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages([1.0, 0.0, 1.0, 0.0], group_size=3)
    with pytest.raises(ValueError, match="non-finite"):
        group_advantages([1.0, float("nan")], group_size=2)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages([1.0, 0.0], group_size=2, scale_rewards="std")
