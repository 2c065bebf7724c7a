"""The one reward formula both halves use (scripts/common/rewards.py), and grpo.py's use of it."""

import math

import pytest
from common.rewards import total_rewards


def test_the_format_reward_joins_with_its_weight():
    scores = [{"reward": 1.0, "format_reward": 1.0}, {"reward": 0.0, "format_reward": 0.5}, {"reward": 1.0}]
    assert total_rewards(scores, format_reward_weight=0.5) == [1.5, 0.25, 1.0]  # no format reward: 0
    assert total_rewards(scores) == [1.0, 0.0, 1.0]  # weight 0 by default: the environment's reward alone


def test_a_sample_the_environment_could_not_score_stays_unscored():
    (reward,) = total_rewards([{"reward": math.nan, "format_reward": 1.0}], format_reward_weight=0.5)
    assert math.isnan(reward)  # group_advantages_excluding leaves it out of its group


def test_grpo_scores_through_it_and_wants_one_score_per_completion():
    import grpo
    from environments.gsm8k import GSM8KEnvironment

    scores = [{"reward": 1.0, "format_reward": 1.0}, {"reward": 0.0, "format_reward": 0.0}]
    env = GSM8KEnvironment()
    assert grpo.rewards_of(scores, ["a", "b"], env, 0.25) == total_rewards(scores, 0.25) == [1.25, 0.0]
    with pytest.raises(RuntimeError, match="returned 2 scores for 3 completions"):
        grpo.rewards_of(scores, ["a", "b", "c"], env, 0.25)
