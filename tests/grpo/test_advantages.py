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


def test_excluded_samples_leave_the_group_baseline_and_get_no_advantage():
    from common.advantages import group_advantages_excluding

    nan = float("nan")
    rewards = [1.0, None, 0.0, 0.5, nan, 1.0, None, None, 2.0, 2.0, 2.0, 2.0]
    advantages, excluded = group_advantages_excluding(rewards, group_size=4, scale_rewards="none")
    # Group 1: the mean of the three rewarded samples (0.5) is the baseline, not a 0 for the failure.
    assert advantages[:4] == pytest.approx([0.5, 0.0, -0.5, 0.0])
    # Group 2: one rewarded sample has no baseline: nothing to learn. Group 3: flat.
    assert advantages[4:] == [0.0] * 8
    assert excluded == 4
    # With no exclusions it is group_advantages itself.
    plain = [1.0, 0.0, 0.0, 0.5]
    assert group_advantages_excluding(plain, 4)[0] == pytest.approx(group_advantages(plain, 4))
    assert group_advantages_excluding(plain, 4)[1] == 0
    scaled, _ = group_advantages_excluding([1.0, None, 0.0, 0.5], 4, scale_rewards="group")
    assert scaled[1] == 0.0
    assert [scaled[0], scaled[2], scaled[3]] == pytest.approx(group_advantages([1.0, 0.0, 0.5], 3))
