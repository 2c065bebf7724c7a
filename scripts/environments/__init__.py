"""Environments: the reward side of reinforcement learning, kept apart from the training loop.

The GRPO loop (``grpo.train``) samples completions and updates the model; it knows nothing about
maths problems or code. An environment is the data and the judge. Any object with these three
methods is one:

    load(path) -> list[dict]
        Read and validate the examples in a JSON Lines file. A bad row raises ``common.contract.UserError``
        naming the file, the line and the field (``common.data.read_jsonl`` does this), so a training
        job fails with a reason that says what to fix.

    prompt_messages(example) -> list[dict]
        The chat messages (``[{"role": ..., "content": ...}, ...]``) that ask the model the example's
        question. The loop renders them with the tokenizer's chat template.

    score(examples, completions) -> list[dict]
        One dict per completion (``examples[i]`` is the example ``completions[i]`` answers) with at
        least ``"reward": float``. Optional keys the loop understands:
        ``"correct": bool`` (averaged into the ``accuracy`` metric) and ``"format_reward": float``
        (added to the reward with weight ``--format_reward_weight``). Anything else (``"verdict"``,
        ``"extracted"``, ...) is kept for evaluation records.

    step_metrics() -> dict[str, float]   (optional)
        The environment's own statistics of the completions scored since the previous call, such as
        the code judge's ``accepted_rate`` and ``judge_time``. The GRPO loop calls it once per step on
        every learner, averages the values over the learners and adds them to the step's metric line
        and ``metrics.jsonl`` record, so a step stays one record. Every learner must return the same
        names, each matching ``[a-z0-9_]+`` and none that the loop logs itself (``reward``, ``loss``, ...).

Environments are found by name through ``make_environment`` so that a script option such as
``--environment gsm8k`` selects one; modules are imported only when asked for, so an environment
with heavy dependencies costs nothing to the others.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

from common.contract import UserError


@runtime_checkable
class Environment(Protocol):
    """What the loop and ``evaluate.py`` need from an environment (see the module docstring)."""

    def load(self, path) -> list[dict]: ...

    def prompt_messages(self, example: dict) -> list[dict]: ...

    def score(self, examples: list[dict], completions: list[str]) -> list[dict]: ...


# name -> (module inside this package, class name). Imported lazily by make_environment.
REGISTRY: dict[str, tuple[str, str]] = {
    "gsm8k": ("gsm8k", "GSM8KEnvironment"),
    "code": ("code", "CodeEnvironment"),
    "llm_judge": ("llm_judge", "LLMJudgeEnvironment"),
    "python_tool": ("python_tool", "PythonToolEnvironment"),
}


def make_environment(name: str, **options: Any) -> Environment:
    """Build the environment registered as ``name``; ``options`` go to its constructor."""
    if name not in REGISTRY:
        raise UserError(f"Unknown environment {name!r}: choose one of {', '.join(sorted(REGISTRY))}.")
    module_name, class_name = REGISTRY[name]
    module = importlib.import_module(f"environments.{module_name}")
    return getattr(module, class_name)(**options)
