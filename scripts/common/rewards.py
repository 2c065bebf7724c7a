"""A completion's reward from the environment's score: the one formula both halves use.

An environment's ``score`` gives each completion a dict with ``reward`` and, where it has one, a
``format_reward``; the reward that GRPO's advantages are taken from is

    reward + format_reward_weight * format_reward        (format_reward 0 where absent)

The job scripts (``grpo.py``, ``code_rl.py``) and the training-session loops call this function, so a
format reward weighs the same on both sides. A NaN ``reward`` (an LLM judge that failed) stays NaN:
``advantages.group_advantages_excluding`` leaves that sample out of its group. It imports nothing but
the standard library: the SDK v3 environment, which has no torch, imports it too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def total_rewards(scores: Iterable[Mapping[str, float]], format_reward_weight: float = 0.0) -> list[float]:
    """Each score's ``reward`` plus ``format_reward_weight`` x its ``format_reward``, one per score."""
    return [score["reward"] + format_reward_weight * score.get("format_reward", 0.0) for score in scores]
