"""The main job's summary claims no direction its own figures contradict: each curve with a stated
direction says whether it held; a curve the model cannot promise a direction for (sampled accuracy, a
test pass fraction that stays 0) is shown with the reason and no claim. Synthetic curves here; the real run's
are checked in test_notebooks_run.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import run_notebooks


def _summary(tmp_path: Path, program: str, notebook: str, curves: dict[str, list[float]], model: str = "tiny"):
    """build_summary over one completed job whose log holds ``curves`` (metric -> value per step)."""
    steps = len(next(iter(curves.values())))
    lines = [
        f"step={step} " + " ".join(f"{name}={values[step - 1]}" for name, values in curves.items())
        for step in range(1, steps + 1)
    ]
    stream = tmp_path / "sagemaker-local" / "logs" / "job-1" / "algo-1-1.jsonl"
    stream.parent.mkdir(parents=True)
    stream.write_text("".join(json.dumps({"t": t, "m": m}) + "\n" for t, m in enumerate(lines)))
    state = tmp_path / "state.json"
    job = {
        "notebook": notebook,
        "job_name": "job-1",
        "status": "Completed",
        "request": {"HyperParameters": {"sagemaker_program": json.dumps(program)}},
    }
    state.write_text(json.dumps({"model_id": model, "jobs": [job]}))
    summary = run_notebooks.build_summary(
        [{"notebook": notebook + ".ipynb", "status": "ok", "seconds": 1}], state, tmp_path
    )
    return summary, run_notebooks.render_markdown(summary)


def test_a_stated_direction_that_does_not_hold_is_said_and_never_claimed(tmp_path):
    summary, text = _summary(
        tmp_path,
        "grpo.py",
        "03_boto3_grpo",
        {
            "reward": [0.5, 0.4, 0.3, 0.2],  # falls, though GRPO's reward must rise
            "format_reward": [0.2, 0.4, 0.6, 0.8],
            "accuracy": [0.09, 0.08, 0.07, 0.07],  # falls: sampled accuracy promises nothing
            "frac_reward_zero_std": [0.2, 1.0, 0.4, 0.1],  # one step without a gradient
        },
    )
    curves = {c["metric"]: c for c in summary["curves"]}
    assert [curves[m]["holds"] for m in ("reward", "format_reward", "frac_reward_zero_std")] == [False, True, False]
    assert curves["accuracy"]["should"] is None and curves["accuracy"]["holds"] is None
    assert "- 03_boto3_grpo: reward 0.5 -> 0.2 over 4 steps: expected to rise, and it did not" in text
    assert "- 03_boto3_grpo: format_reward 0.2 -> 0.8 over 4 steps: rises, as expected" in text
    assert "frac_reward_zero_std 0.2 -> 0.1 over 4 steps, at most 1: expected to stay below 1, and it did not" in text
    assert "- 03_boto3_grpo: accuracy 0.09 -> 0.07 over 4 steps (no direction expected: sampled answers" in text
    assert "should" not in text


def test_a_test_pass_fraction_that_stays_zero_is_shown_without_a_claim(tmp_path):
    summary, text = _summary(
        tmp_path,
        "code_rl.py",
        "04_code_rl",
        {"no_code_rate": [0.6, 0.5, 0.4, 0.3], "reward": [0.2, 0.25, 0.3, 0.35], "test_pass_fraction": [0, 0, 0, 0]},
    )
    assert (
        "- 04_code_rl: test_pass_fraction 0 -> 0 over 4 steps (no direction expected: the tiny model's programs" in text
    )
    assert all(c["holds"] for c in summary["curves"] if c["should"])


def test_the_real_model_profile_claims_nothing_of_its_short_code_rl_run(tmp_path):
    summary, _ = _summary(
        tmp_path,
        "code_rl.py",
        "04_code_rl",
        {"no_code_rate": [0.2, 0.3, 0.4], "test_pass_fraction": [0.25, 0.3, 0.38]},
        "smollm2",
    )
    assert [c["should"] for c in summary["curves"]] == [None, None]


@pytest.mark.parametrize(
    ("direction", "values", "holds"),
    [
        ("rises", [0.1, 0.1, 0.2, 0.3], True),
        ("rises", [0.3, 0.3, 0.3, 0.3], False),  # flat is not a rise
        ("falls", [5.0, 3.0, 2.0, 1.0], True),
        ("falls", [0.0, 0.0, 0.0, 0.0], False),
        ("stays below 1", [0.0, 0.9, 0.2], True),
        ("stays below 1", [0.0, 1.0, 0.2], False),
    ],
)
def test_direction_holds(direction, values, holds):
    assert run_notebooks.direction_holds(direction, values) is holds


def test_every_curve_states_a_direction_or_says_why_not():
    for profile, scripts in run_notebooks.CURVES.items():
        for script, curves in scripts.items():
            for metric, direction, why_not in curves:
                assert (direction is None) != (why_not is None), (profile, script, metric)
                if direction:
                    run_notebooks.direction_holds(direction, [0.0, 0.5])  # a direction it knows how to check
