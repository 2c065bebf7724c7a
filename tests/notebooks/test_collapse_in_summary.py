"""Where the figures are printed (notebooks 4 and 6 through ``describe_change``, the main job's summary,
the training sessions' lines of notebooks 8 and 9), a rise of a model whose answers collapsed into one is
said to be a collapse and is not called a gain; a diverse model's real gain still is."""

from __future__ import annotations

from common import stats

from helpers import metrics
from helpers.training_sessions import records
from tools import run_notebooks, training_session_notebooks

REFUSED = "collapsed: 32 of 32 answers are '2', not counted as a gain"


def evaluation(accuracies: list[float], answers: list[str | None]) -> dict:
    """An evaluate.py result: one record per problem, greedy, with the answer each one gave."""
    accuracy, error = stats.mean_and_standard_error(accuracies)
    records = [
        {"example": {"question": f"problem {i}"}, "accuracy": a, "answer": answer}
        for i, (a, answer) in enumerate(zip(accuracies, answers, strict=True))
    ]
    return {
        "accuracy": accuracy,
        "standard_error": error,
        "n": len(records),
        "samples_per_example": 1,
        "temperature": 0.0,
        "seed": 42,
        "records": records,
        "answer_diversity": stats.answer_diversity(answers),
    }


BEFORE = evaluation([0.0] * 32, [str(100 + i) for i in range(32)])
# six of the 32 references are 2: the model that answers 2 to all of them gets those six right
COLLAPSED_AFTER = evaluation([1.0] * 6 + [0.0] * 26, ["2"] * 32)
DIVERSE_AFTER = evaluation([1.0] * 6 + [0.0] * 26, [str(i) for i in range(32)])


def test_describe_change_refuses_a_collapsed_models_rise_and_reports_a_diverse_ones_gain():
    collapsed = metrics.describe_change(metrics.held_out_change(BEFORE, COLLAPSED_AFTER))
    assert "0.000 ± 0.000 -> 0.188 ± 0.070" in collapsed
    assert f"change +0.188 ± 0.070 (paired), +2.7 standard errors; {REFUSED}" in collapsed
    assert "a gain" not in collapsed.replace("not counted as a gain", "")
    assert collapsed.endswith(
        "answers before: 32 answers, 32 distinct; the most common, '100', 1 of 32; "
        "after: collapsed: 32 of 32 answers are '2'"
    )
    diverse = metrics.describe_change(metrics.held_out_change(BEFORE, DIVERSE_AFTER))
    assert "change +0.188 ± 0.070 (paired), +2.7 standard errors: a gain" in diverse
    assert "collapsed" not in diverse


def _summary_markdown(after: dict) -> str:
    change = metrics.held_out_change(BEFORE, after)
    summary = {
        "ok": True,
        "notebooks": [],
        "jobs": [],
        "paths": {},
        "evaluation": {
            "base": {"job_name": "eval-base-1", "accuracy": change["before"], "n": 32},
            "trained": {"job_name": "eval-trained-1", "accuracy": change["after"], "n": 32},
            "held_out_change": change,
        },
        "code_rl_evaluation": {**change, "data_set": "code", "jobs": {"before": "code-eval-before-1"}},
    }
    return run_notebooks.render_markdown(summary)


def test_the_summary_says_collapsed_beside_notebook_6s_and_4s_figures_and_claims_no_gain():
    text = _summary_markdown(COLLAPSED_AFTER)
    gsm8k = text.split("## GSM8K accuracy on held-out problems")[1].split("## Code RL")[0]
    code = text.split("## Code RL")[1]
    for section in (gsm8k, code):
        assert f"+2.7 standard errors; {REFUSED}" in section
        assert ": a gain" not in section
    assert "- evaluation jobs: base eval-base-1, trained eval-trained-1" in gsm8k
    assert "+2.7 standard errors: a gain" in _summary_markdown(DIVERSE_AFTER)


def test_a_state_from_before_the_change_was_kept_still_shows_each_models_figure():
    summary = {"ok": True, "notebooks": [], "jobs": [], "paths": {}}
    summary["evaluation"] = {"base": {"job_name": "eval-base-1", "accuracy": 0.25, "standard_error": 0.1, "n": 16}}
    assert "- base: accuracy 0.250 ± 0.100 on 16 problems (eval-base-1)" in run_notebooks.render_markdown(summary)


def _session_lines(after: dict, measure: str) -> str:
    """The summary's lines of a session notebook that recorded ``helpers.training_sessions.grpo.held_out_record``."""
    from helpers.training_sessions import grpo

    def session_evaluation(result: dict) -> dict:  # what grpo.evaluate returns
        per_problem = [r["accuracy"] for r in result["records"]]
        figures = {"accuracy": result["accuracy"], "standard_error": result["standard_error"]}
        return {**figures, "problems": 32, "samples_per_problem": 1, "per_problem": per_problem,
                "answer_diversity": result["answer_diversity"]}  # fmt: skip

    held_out = grpo.held_out_record(session_evaluation(BEFORE), session_evaluation(after), measure)
    base = {"status": "Stopped", "steps": 8, "final_metrics": {}, "billable_tokens": {}, "session": "s"}
    return "\n".join(training_session_notebooks.render([{**base, "notebook": "08_training_session_grpo", "held_out": held_out}]))  # fmt: skip


def test_a_training_sessions_collapsed_rise_is_refused_in_its_lines_and_a_diverse_gain_is_kept():
    lines = _session_lines(COLLAPSED_AFTER, "accuracy")
    assert "  - held-out accuracy 0.000 ± 0.000 -> 0.188 ± 0.070" in lines
    assert f"    - change +0.188, +2.7 standard errors; {REFUSED}" in lines
    assert ": a gain" not in lines
    assert "    - change +0.188, +2.7 standard errors: a gain" in _session_lines(DIVERSE_AFTER, "solve rate")


def test_a_session_record_from_before_the_change_and_answers_were_kept_is_not_called_a_gain():
    held_out = {
        "before": 0.3,
        "before_standard_error": 0.04,
        "after": 0.5,
        "after_standard_error": 0.041,
        "change_standard_error": 0.02,
        "problems": 64,
        "samples_per_problem": 16,
    }
    first, verdict = records.held_out_lines(held_out)
    assert first.startswith("held-out accuracy 0.300 ± 0.040 -> 0.500 ± 0.041")
    assert verdict == "change +0.200, +10.0 standard errors; the evaluation did not count its answers (an older one), not counted as a gain"  # fmt: skip


def test_a_sessions_held_out_result_is_per_problem_accuracy_over_problems_with_its_answers_diversity():
    from common import stats

    from helpers.training_sessions import grpo

    rows = ([1, 1], [0, 1], [0, 0], [1, 0])  # two answers a problem, right or not
    groups = [{"scores": [{"correct": bool(c), "format_reward": 0.5 * c} for c in row]} for row in rows]
    result = grpo.held_out_result(groups, ["2"] * 8, samples_per_problem=2)
    assert result["per_problem"] == [1.0, 0.5, 0.0, 0.5]
    assert (result["accuracy"], result["standard_error"]) == stats.mean_and_standard_error([1.0, 0.5, 0.0, 0.5])
    assert result["standard_error"] > 0  # over problems, not over the 8 answers
    assert (result["problems"], result["samples_per_problem"], result["format_reward"]) == (4, 2, 0.25)
    assert stats.collapsed(result["answer_diversity"])  # every answer '2': no gain can be claimed from it


def test_notebook_13s_models_are_paired_on_the_same_problems_and_a_collapsed_sft_is_refused():
    """Notebook 13 scores the base model and both SFT models on the same held-out problems
    (``grpo.answers_result``) and pairs them (``grpo.held_out_record``): the summary's rows
    and lines give each change with its paired error, and refuse a collapsed model's rise."""
    from environments.gsm8k import GSM8KEnvironment

    from helpers import results
    from helpers.training_sessions.grpo import answers_result, held_out_record

    def scored(problems, answers):
        return answers_result(GSM8KEnvironment(), problems, answers)

    problems = [{"question": f"problem {i}", "answer": f"#### {2 if i < 6 else 100 + i}"} for i in range(32)]
    base = scored(problems, [f"#### {50 + i}" for i in range(32)])  # none right, all distinct
    collapsed = scored(problems, ["#### 2"] * 32)  # the six whose answer is 2
    diverse = scored(problems, [f"#### {2 if i < 6 else i}" for i in range(32)])
    assert (base["accuracy"], collapsed["accuracy"], diverse["accuracy"]) == (0.0, 6 / 32, 6 / 32)
    assert collapsed["answer_diversity"]["most_common_share"] == 1.0 and base["per_problem"] == [0.0] * 32
    changes = {
        "the base model -> SFT on the teacher's answers": held_out_record(base, collapsed),
        "the base model -> SFT on the original answers": held_out_record(base, diverse),
    }
    teacher = {"held_out_accuracy": {"base": base}, "held_out_changes": changes}
    rows = [row for row in results.rows({"teacher_and_judge": teacher}) if row["notebook"] == "13"]
    assert [row["verdict"] for row in rows] == ["collapsed: not a gain", "gain"]
    assert "+0.188 ± 0.070" in rows[0]["change"] and "32 problems, greedy: the base model -> SFT" in rows[0]["what"]
    lines = "\n".join(run_notebooks.render_teacher_and_judge(teacher))
    assert "the base model -> SFT on the teacher's answers: held-out accuracy 0.000 ± 0.000 -> 0.188 ± 0.070" in lines
    assert REFUSED in lines and "+2.7 standard errors: a gain" in lines
