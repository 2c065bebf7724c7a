"""The training-session notebooks' problems, read and checked by the environments the job scripts use.

Staged files are read by the environments' own loaders (``GSM8KEnvironment().load(path)``,
``CodeEnvironment.load``): a bad row is an error naming the file, the line and the field, as in a
training job. They import no torch, so they run in the SDK v3 environment; this module adds the
problems the project generates offline.
"""

from __future__ import annotations


def count_problems(n: int, seed: int = 0, largest: int = 5) -> list[dict]:
    """The easiest GSM8K-format problems: the answer is the number in the question. Small enough for
    the tiny model to learn in a few steps offline; the cloud runs use openai/gsm8k."""
    from local_mode import offline_data

    return offline_data.count_problem_records(n, seed=seed, largest=largest)


def count_split(n_train: int, n_test: int, seed: int = 0) -> dict[str, list[dict]]:
    """``count_problems`` to train on, and held-out ones: half of the training template with other names
    and numbers (``"split": "seen"``), half in words no training problem uses (``"unseen"``), so that the
    held-out figures tell recall from transfer (``local_mode.offline_data.count_problem_split``)."""
    from local_mode import offline_data

    return offline_data.count_problem_split(n_train, n_test, seed=seed)


def offline_code_problems(n: int, seed: int = 0) -> list[dict]:
    """The project's easy code problems (sum of two numbers, largest of a list...), normalised as the
    code environment normalises any problem; the cloud runs use the set notebook 0 staged."""
    from environments.code import normalize_problem

    from local_mode import offline_data

    return [normalize_problem(row) for row in offline_data.code_problem_records(n, seed=seed)]


def offline_function_problems(n: int, seed: int = 0) -> list[dict]:
    """Functions to complete, as HumanEval poses them (a signature and a docstring; the tests call the
    function and compare what it returns): twenty kinds of list, string and number functions that a
    small instruct model such as SmolLM2-135M-Instruct sometimes writes right."""
    from environments.code import normalize_problem

    from local_mode import offline_data

    return [normalize_problem(row) for row in offline_data.function_problem_records(n, seed=seed)]


def offline_conversations(n: int, seed: int = 0) -> list[list[dict]]:
    """Chat conversations (``messages``) the project generates, asked as the RL environments ask; the
    cloud runs read the chat set notebook 0 staged."""
    from local_mode import offline_data

    return [row["messages"] for row in offline_data.chat_records(n, seed=seed)]


def staged_file(work_dir, name: str, split: str):
    """The file notebook 0 staged for data set ``name`` (``gsm8k``, ``code``, ``functions``, ``preferences``, ``chat``)
    and ``split`` (``train``, ``test``): ``<work_dir>/data/channels/<name>/<split>/<split>.jsonl``, the
    folder it also uploaded as the training jobs' channel."""
    from pathlib import Path

    path = Path(work_dir) / "data" / "channels" / name / split / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"No {name} {split} split at {path}: run notebook 0 first with the same work_dir ({work_dir!r})."
        )
    return path
