"""A notebook's "What you saw" cell (``helpers.what_you_saw``) reads back what the notebook recorded and says
the figures of the docs' results tables: here on the records of kept runs (``docs/runs/main-tiny.json``, the
quick run; ``main-smollm2.json``, the default run of the README's table), laid out in a work_dir as the
notebooks write them."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest

from helpers import results
from helpers.live import JobResult
from helpers.what_you_saw import NothingRecorded, report
from helpers.workshop import State

REPO = Path(__file__).resolve().parents[2]
KEPT = json.loads((REPO / "docs" / "runs" / "main-tiny.json").read_text())


def work_dir_of(summary: dict, folder: Path) -> Path:
    """A work_dir holding what the run's notebooks recorded: the state file and the session records."""
    state = {key: summary[key] for key in ("jobs", "evaluation", "code_rl_evaluation", "spot", "teacher_and_judge")}
    (folder / "state.json").write_text(json.dumps(state))
    (folder / "training_sessions.json").write_text(json.dumps(summary["training_sessions"]))
    return folder


def session_record(summary: dict, notebook: str) -> dict:
    return next(s for s in summary["training_sessions"] if s["notebook"] == notebook)


def test_held_out_figures_appear_with_their_standard_errors_and_the_verdict(tmp_path):
    text = report("08_training_session_grpo", work_dir_of(KEPT, tmp_path))
    record = session_record(KEPT, "08_training_session_grpo")
    held, curve = record["held_out"], record["reward"]
    before, after = held["before_answer_diversity"], held["after_answer_diversity"]
    assert "held-out accuracy, 64 problems x 16 answer(s), in share of answers right:" in text
    assert (
        f"before {held['before']:.3f} ± {held['before_standard_error']:.3f} -> "
        f"after {held['after']:.3f} ± {held['after_standard_error']:.3f} (± one standard error)"
    ) in text
    standard_errors = held["change"] / held["change_standard_error"]
    assert (
        f"change {held['change']:+.3f} ± {held['change_standard_error']:.3f}, {standard_errors:+.1f} s.e. (paired"
        in text
    )
    assert f"{standard_errors:+.1f} standard errors: a gain" in text  # common.stats.judge_change
    assert (
        f"distinct answers {before['distinct_answers']} -> {after['distinct_answers']}; the most common answer's "
        f"share {before['most_common_share']:.2f} -> {after['most_common_share']:.2f}"
    ) in text
    assert (
        f"reward: {curve['first_third']:.3f} -> {curve['last_third']:.3f} mean reward per answer "
        "(mean of the first third of the steps -> the last third)"
    ) in text


def test_a_collapsed_models_rise_is_called_collapsed_not_a_gain(tmp_path):
    text = report("06_results", work_dir_of(KEPT, tmp_path))  # the tiny GRPO model answers '2' to most problems
    change = KEPT["evaluation"]["held_out_change"]
    answers = KEPT["evaluation"]["trained"]["answer_diversity"]
    assert answers["most_common_share"] > 0.5  # the kept run's model did collapse
    standard_errors = change["change"] / change["change_standard_error"]
    assert (
        f"change {change['change']:+.3f} ± {change['change_standard_error']:.3f}, {standard_errors:+.1f} s.e." in text
    )
    assert standard_errors > 2  # beyond the noise, and still no gain
    assert (
        f"collapsed: {answers['most_common_count']} of {answers['answers']} answers are "
        f"'{answers['most_common_answer']}', not counted as a gain"
    ) in text
    assert "a gain" not in text.replace("not counted as a gain", "")
    # the gain that counts in notebook 8 does not once its answers collapse into one
    summary = copy.deepcopy(KEPT)
    grpo = session_record(summary, "08_training_session_grpo")
    grpo["held_out"]["after_answer_diversity"].update(most_common_count=1000, most_common_share=1000 / 1024)
    text = report("08_training_session_grpo", work_dir_of(summary, tmp_path))
    standard_errors = grpo["held_out"]["change"] / grpo["held_out"]["change_standard_error"]
    most_common = grpo["held_out"]["after_answer_diversity"]["most_common_answer"]
    assert (
        f"{standard_errors:+.1f} standard errors; collapsed: 1000 of 1024 answers are '{most_common}', "
        "not counted as a gain"
    ) in text
    verdicts = [row["verdict"] for row in results.rows(summary) if row["notebook"] == "08"]
    assert verdicts[0] == "collapsed: not a gain"  # the whole set's row; its halves follow


@pytest.mark.parametrize("run", ["main-smollm2", "main-tiny"])
def test_the_cell_says_what_the_docs_table_says(tmp_path, run):
    """One code path: every row of a kept run's table (the README's, of the default run; docs/LOCAL_MODE.md's,
    of the quick run) appears, figure for figure, in its notebook's cell."""
    kept = json.loads((REPO / "docs" / "runs" / f"{run}.json").read_text())
    work_dir = work_dir_of(kept, tmp_path)
    table = results.rows(kept)
    assert {row["notebook"] for row in table} >= {"04", "06", "07", "08", "09", "12", "13"}
    names = {job["notebook"][:2]: job["notebook"] for job in kept["jobs"]}
    names.update({s["notebook"][:2]: s["notebook"] for s in kept["training_sessions"]})
    for row in table:
        text = report(names[row["notebook"]], work_dir)
        assert row["what"] in text and row["after"] in text
        assert row["before"] == "-" or f"before {row['before']} -> after {row['after']}" in text
        assert row["change"] == "-" or f"change {row['change']}" in text


def test_a_jobs_curve_is_kept_when_it_ends_and_shown_with_its_unit(tmp_path):
    state = State(tmp_path / "state.json")
    state.record_job("01_estimator_sft", {"TrainingJobName": "sft-1"})
    losses = [6.0, 5.0, 4.0, 3.5, 3.0, 2.5, 2.2, 2.0]
    records = [{"step": i + 1, "loss": loss} for i, loss in enumerate(losses)] + [{"step": 8, "eval_loss": 2.4}]
    description = {"BillableTimeInSeconds": 21, "TrainingTimeInSeconds": 21}
    state.record_result(JobResult("sft-1", "Completed", "Completed", None, records, description))
    assert state.job("sft-1")["curve"]["loss"] == {"first": 5.5, "last": 2.1, "steps": 8}
    text = report("01_estimator_sft", tmp_path)
    assert "training job sft-1: Completed, 21 billable seconds of 21 s training" in text
    assert (
        "loss: 5.500 -> 2.100 nats per target token (mean of the first quarter of 8 steps -> the last quarter)" in text
    )
    assert "held out, at the last evaluation (no standard error): eval_loss 2.400 nats per target token" in text


def test_notebook_0_shows_the_rows_it_staged(tmp_path):
    channels = {}
    for name, counts in {"chat": (3, 2), "gsm8k": (4, 1)}.items():
        channels[name] = {}
        for split, rows in zip(("train", "test"), counts, strict=True):
            path = tmp_path / "data" / "channels" / name / split / f"{split}.jsonl"
            path.parent.mkdir(parents=True)
            path.write_text("".join(json.dumps({"row": i}) + "\n" for i in range(rows)))
            channels[name][split] = f"s3://bucket/llm-training-loops/data/{name}/{split}"
    State(tmp_path / "state.json").update(
        model="s3://bucket/m", model_id="tiny", data_source="offline", channels=channels
    )
    text = report("00_setup_and_data", tmp_path)
    assert "model tiny staged at s3://bucket/m (data source: offline)" in text
    assert "chat: train 3 rows, test 2 rows" in text and "gsm8k: train 4 rows, test 1 rows" in text


def test_a_missing_record_names_the_notebook_to_run_first(tmp_path):
    with pytest.raises(
        NothingRecorded,
        match=r"run 02_sagemaker_session_dpo\.ipynb to its end first \(and "
        r"00_setup_and_data\.ipynb before it",
    ):
        report("02_sagemaker_session_dpo", tmp_path)
    State(tmp_path / "state.json").update(model="s3://bucket/m", channels={})
    with pytest.raises(NothingRecorded, match=r"holds no figure of 06_results: run 06_results\.ipynb to its end") as e:
        report("06_results", tmp_path)
    assert "00_setup_and_data" not in str(e.value)


def test_the_sdk_v3_kernel_imports_it_too(tmp_path):
    """Notebooks 07-12 and 14-16 run in .venv-sessions (SDK v3): the cell is the same there."""
    python = REPO / ".venv-sessions" / "bin" / "python"
    if not python.exists():
        pytest.skip("no .venv-sessions: make .venv-sessions/.stamp")
    work_dir = work_dir_of(KEPT, tmp_path)
    code = f"from helpers.what_you_saw import what_you_saw; what_you_saw('12_training_session_dpo', {str(work_dir)!r})"
    shown = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    preference = session_record(KEPT, "12_training_session_dpo")["preference"]
    before, after = preference["held_out_before"], preference["held_out_after"]
    assert (
        f"before {before['likelihood_accuracy']:.3f} ± {before['likelihood_accuracy_se']:.3f} -> "
        f"after {after['likelihood_accuracy']:.3f} ± {after['likelihood_accuracy_se']:.3f}"
    ) in shown


def test_notebook_15s_tool_use_and_its_answers_without_the_tool_are_in_its_lines():
    from helpers.training_sessions import records

    use = {"tool_calls_per_answer": 0.275, "tool_errors_per_answer": 0.01, "final_format": 0.965}
    record = {
        "tool_use": {"before": use, "after": {**use, "tool_calls_per_answer": 0.5}},
        "without_tool": {"accuracy": 0.408, "standard_error": 0.065},
    }
    lines = records.notebook_lines(record)
    assert lines[0].startswith("held out, per episode: tool calls 0.275 -> 0.500, failed tool calls 0.010 -> 0.010")
    assert lines[1] == "without the tool, before training: held-out accuracy 0.408 ± 0.065"
    assert records.notebook_lines({}) == []  # a notebook that keeps none of these fields adds no line


def test_notebook_15s_results_row_says_how_often_the_tool_was_called_and_what_it_was_worth():
    # a rise with no tool call is not the tool's doing, and the figure without the tool says what it adds
    held_out = {"before": 0.1, "after": 0.8, "change": 0.7, "change_standard_error": 0.05, "problems": 32,
                "samples_per_problem": 2}  # fmt: skip
    session = {
        "notebook": "15_training_session_tool_rl",
        "held_out": held_out,
        "tool_use": {"before": {"tool_calls_per_answer": 0.25}, "after": {"tool_calls_per_answer": 0.99}},
        "without_tool": {"accuracy": 0.0, "standard_error": 0.0},
    }
    (row,) = results.rows({"training_sessions": [session]})
    assert row["what"].endswith("tool calls per episode 0.25 -> 0.99; without the tool, before: 0.000 ± 0.000")
    (row,) = results.rows({"training_sessions": [{**session, "without_tool": {}}]})
    assert row["what"].endswith("tool calls per episode 0.25 -> 0.99")
