"""A run's figures as every notebook records them, and the held-out ones as rows: what a notebook's "What you
saw" cell, the main job's summary and the README's results table all say, from this one module.

- ``recorded(work_dir)``: what the notebooks wrote in ``<work_dir>``: the workshop's state file (jobs with
  their curves and final metrics, notebook 6's evaluation, notebook 4's, the spot job, notebook 13's
  figures) and the training sessions' records (``helpers.training_sessions.records``);
- ``rows(figures)``: each held-out figure (measured on data the loop never trained on): before and after
  with one standard error each, the paired change, whether it counts as a gain (``verdict``) and how varied
  the answers were;
- ``curve_ends(records, metric)``: a training curve's mean over its first and its last quarter of steps.
"""

from __future__ import annotations

import json
from pathlib import Path

STATE_FILE = "state.json"  # the workshop's state file in a work_dir (helpers.workshop.State)


def recorded(work_dir: str | Path) -> dict:
    """What the notebooks recorded in ``work_dir``, shaped as the main job's summary keeps it."""
    from helpers.training_sessions.records import read

    path = Path(work_dir) / STATE_FILE
    state = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    return {
        "model": state.get("model_id"),  # what notebook 0 staged
        "jobs": state.get("jobs", []),
        "evaluation": state.get("evaluation", {}),
        "code_rl_evaluation": state.get("code_rl_evaluation", {}),
        "spot": state.get("spot", {}),
        "teacher_and_judge": state.get("teacher_and_judge", {}),
        "training_sessions": read(work_dir),
        "staged": {k: state[k] for k in ("model", "model_id", "data_source", "channels") if k in state},  # notebook 0
    }


def curve_ends(records: list[dict], metric: str) -> tuple[float, float] | None:
    """Mean of ``metric`` over the first and over the last quarter of the steps (at least one step each)."""
    values = [r[metric] for r in records if metric in r]
    if not values:
        return None
    k = max(1, len(values) // 4)
    return sum(values[:k]) / k, sum(values[-k:]) / k


# ---------------------------------------------------------------- rows


def number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def with_error(value, error) -> str:
    value, error = number(value), number(error)
    if value is None:
        return "-"
    return f"{value:.3f} ± {error:.3f}" if error is not None else f"{value:.3f}"


def change_text(before, after, change=None, error=None) -> str:
    change = number(change)
    if change is None and number(before) is not None and number(after) is not None:
        change = number(after) - number(before)
    if change is None:
        return "-"
    error = number(error)
    if error is None:
        return f"{change:+.3f}"
    size = f", {change / error:+.1f} s.e." if error else ""
    return f"{change:+.3f} ± {error:.3f}{size}"


def diversity(record: dict, key: str, share: bool) -> str:
    """'before -> after' of one figure of the answers' diversity (``common.stats.answer_diversity``,
    kept by a paired change as ``before_answer_diversity`` and ``after_answer_diversity``); '-' where the
    record has none (a figure that is not of answers, or a run from before answers were counted)."""

    def show(diversity) -> str:
        value = number(diversity.get(key)) if isinstance(diversity, dict) else None
        if value is None:
            return "-"
        return f"{value:.2f}" if share else f"{value:g}"

    before, after = record.get("before_answer_diversity"), record.get("after_answer_diversity")
    if before is None and after is None:
        return "-"
    return f"{show(before)} -> {show(after)}"


def verdict(
    change, error, after_answers: dict | None = None, answers: bool = True, lower_is_better: bool = False
) -> str:
    """Whether the run's change counts, by the rule every notebook applies (``common.stats``): beyond
    two paired standard errors, and, where the figure is of answers, the trained model's answers not
    collapsed into one. "-" where the record has no paired standard error to judge the change by."""
    from common import stats

    change, error = number(change), number(error)
    if change is None or error is None:
        return "-"
    if answers:
        if isinstance(after_answers, dict) and stats.collapsed(after_answers):
            return "collapsed: not a gain"
        return "gain" if stats.counts_as_gain(change, error, after_answers) else "not a gain"
    gained = -change if lower_is_better else change
    return "gain" if error > 0 and gained > stats.GAIN_STANDARD_ERRORS * error else "not a gain"


def _row(
    notebook: str, what: str, unit: str, before: str, after: str, change: str, record: dict, judged: str = "-"
) -> dict:
    from common import stats

    before_answers, after_answers = record.get("before_answer_diversity"), record.get("after_answer_diversity")
    paired, error = number(record.get("change")), number(record.get("change_standard_error"))
    try:
        answers = stats.describe_answers_before_and_after(before_answers, after_answers)
        in_words = stats.judge_change(paired, error, after_answers) if None not in (paired, error) else None
    except KeyError:  # a record with some of answer_diversity's figures only: the cells below say those
        answers = in_words = None
    return {
        "notebook": notebook,
        "what": what,
        "unit": unit,  # of before, after and change
        "before": before,
        "after": after,
        "change": change,
        "verdict": judged,
        "distinct": diversity(record, "distinct_answers", share=False),
        "share": diversity(record, "most_common_share", share=True),
        "answers": answers,  # the same in words, with the most common answer (None: not a figure of answers)
        # the verdict in words, for a paired change of answers (None otherwise: the "verdict" cell says it)
        "judged": in_words if "after_answer_diversity" in record else None,
        "split": None,  # the whole held-out set; a part of it (seen or unseen templates) names itself here
    }


def _notebook(name: str | None, fallback: str) -> str:
    return (name or fallback)[:2]


def _paired_row(notebook: str, what: str, unit: str, record: dict, **judged) -> dict:
    """The row of a change as ``common.stats``' users keep it: ``before``, ``after`` and ``change``, each with
    its ``*_standard_error``, and each model's ``*_answer_diversity`` where the figure is of answers;
    ``judged``: ``verdict``'s options for a figure that is not."""
    before, after, change = record.get("before"), record.get("after"), record.get("change")
    error = record.get("change_standard_error")
    return _row(
        notebook,
        what,
        unit,
        with_error(before, record.get("before_standard_error")),
        with_error(after, record.get("after_standard_error")),
        change_text(before, after, change, error),
        record,
        verdict(change, error, record.get("after_answer_diversity"), **judged),
    )


def _split_rows(notebook: str, what: str, unit: str, record: dict) -> list[dict]:
    """A row per split of a held-out set whose problems name one (``common.stats.paired_by_split``): seen
    templates, where a gain is recall, and unseen ones, where it is transfer."""
    from common.stats import SPLIT_GAIN

    # the row's first words name the set it is a part of; the table's row above gives the whole set
    return [
        {
            **_paired_row(
                notebook,
                f"of which {part.get('n', '?')} of {name} templates (a rise there is {SPLIT_GAIN.get(name, 'of a part of the set')})",
                unit,
                part,
            ),
            "split": name,
        }
        for name, part in (record.get("splits") or {}).items()
    ]


def _figures(before: dict, after: dict, value: str, error: str, change=None, change_error=None) -> dict:
    """A record with its figures under other names, as ``_paired_row`` reads it."""
    return {
        "before": before.get(value),
        "before_standard_error": before.get(error),
        "after": after.get(value),
        "after_standard_error": after.get(error),
        "change": change,
        "change_standard_error": change_error,
    }


def rows(figures: dict) -> list[dict]:
    """The held-out figures of a summary (or of ``recorded``), in notebook order."""
    found = []
    code = figures.get("code_rl_evaluation") or {}
    if number(code.get("before")) is not None:
        what = (
            f"code RL (training job): held-out solve rate, {code.get('examples', '?')} problems x "
            f"{code.get('samples_per_example', '?')} answer(s) at temperature {code.get('temperature', '?')}"
        )
        found.append(_paired_row("04", what, "share of answers that pass every test", code))
    for job in figures.get("jobs") or []:
        final = job.get("final_metrics") or {}
        if number(final.get("eval_likelihood_accuracy_change")) is not None:  # dpo.py's last held-out evaluation
            what = (
                f"DPO (training job): held-out likelihood accuracy, {int(final.get('eval_pairs', 0)) or '?'} pairs "
                "(chosen more likely than rejected): the starting model -> the DPO model"
            )
            record = {  # before: the reference's figure on the same pairs, the starting model's
                "before": final.get("eval_reference_likelihood_accuracy"),
                "before_standard_error": final.get("eval_reference_likelihood_accuracy_se"),
                "after": final.get("eval_likelihood_accuracy"),
                "after_standard_error": final.get("eval_likelihood_accuracy_se"),
                "change": final.get("eval_likelihood_accuracy_change"),
                "change_standard_error": final.get("eval_likelihood_accuracy_change_se"),
            }
            found.append(
                _paired_row(_notebook(job.get("notebook"), "02"), what, "share of pairs", record, answers=False)
            )
        if number(final.get("eval_conversation_loss_change")) is not None:  # sft.py's last held-out evaluation
            what = (
                f"SFT (training job): held-out loss per answer token, {int(final.get('eval_conversations', 0)) or '?'} "
                "conversations (lower is better): the starting model -> the SFT model"
            )
            record = {
                "before": final.get("eval_conversation_loss_before"),
                "before_standard_error": final.get("eval_conversation_loss_before_se"),
                "after": final.get("eval_conversation_loss"),
                "after_standard_error": final.get("eval_conversation_loss_se"),
                "change": final.get("eval_conversation_loss_change"),
                "change_standard_error": final.get("eval_conversation_loss_change_se"),
            }
            found.append(
                _paired_row(
                    _notebook(job.get("notebook"), "01"),
                    what,
                    "nats per answer token",
                    record,
                    answers=False,
                    lower_is_better=True,
                )
            )
        if number(final.get("eval_format_share_change")) is not None:  # sft.py's answers at its last step
            what = (
                f"SFT (training job): held-out answers in the taught format, "
                f"{int(final.get('eval_format_conversations', 0)) or '?'} prompts, greedy: the starting model -> "
                "the SFT model"
            )
            record = {
                "before": final.get("eval_format_share_before"),
                "before_standard_error": final.get("eval_format_share_before_se"),
                "after": final.get("eval_format_share"),
                "after_standard_error": final.get("eval_format_share_se"),
                "change": final.get("eval_format_share_change"),
                "change_standard_error": final.get("eval_format_share_change_se"),
                # the figures of common.stats.answer_diversity a metric line carries (not the answers' text)
                **{
                    f"{when}_answer_diversity": {
                        "distinct_answers": final.get(f"eval_distinct_answers{suffix}"),
                        "most_common_share": final.get(f"eval_most_common_share{suffix}"),
                    }
                    for when, suffix in (("before", "_before"), ("after", ""))
                },
            }
            found.append(
                _paired_row(_notebook(job.get("notebook"), "01"), what, "share of answers in the format", record)
            )
    evaluation = figures.get("evaluation") or {}
    base, trained = evaluation.get("base") or {}, evaluation.get("trained") or {}
    paired = evaluation.get("held_out_change") or {}  # notebook 6's paired change, where the run kept one
    if number(base.get("accuracy")) is not None or number(trained.get("accuracy")) is not None:
        n = base.get("n", trained.get("n"))
        what = (
            f"GSM8K held-out accuracy, {int(n) if number(n) is not None else '?'} problems, greedy: "
            "the staged model -> the GRPO model"
        )
        record = {
            **paired,
            **_figures(
                base, trained, "accuracy", "standard_error", paired.get("change"), paired.get("change_standard_error")
            ),
        }
        found.append(_paired_row("06", what, "share of problems answered right", record))
        found += _split_rows("06", what, "share of problems answered right", record)
    for s in figures.get("training_sessions") or []:
        notebook = _notebook(s.get("notebook"), "??")
        loss = s.get("held_out_loss")
        if loss:
            before, after = loss.get("before") or {}, loss.get("after") or {}
            what = (
                f"SFT (training session): held-out loss per answer token, {after.get('conversations', '?')} "
                "conversations (lower is better)"
            )
            record = _figures(
                before, after, "loss", "standard_error", loss.get("change"), loss.get("change_standard_error")
            )
            found.append(
                _paired_row(notebook, what, "nats per answer token", record, answers=False, lower_is_better=True)
            )
        held_out = s.get("held_out")
        if held_out:
            kind = {
                "07": "SFT",
                "08": "GRPO",
                "09": "code RL",
                "14": "08's model served",
                "15": "tool RL",
                "16": "distillation",
            }
            kind = kind.get(notebook, "RL")
            measure = held_out.get("measure") or ("solve rate" if notebook == "09" else "accuracy")
            what = (
                f"{kind} (training session): held-out {measure}, {held_out.get('problems', '?')} problems x "
                f"{held_out.get('samples_per_problem', '?')} answer(s)"
            )
            tool_use = s.get("tool_use") or {}
            if tool_use.get("before") and tool_use.get("after"):  # 15: whether a gain could come from the tool
                calls = [tool_use[when].get("tool_calls_per_answer", 0.0) for when in ("before", "after")]
                what += f"; tool calls per episode {calls[0]:.2f} -> {calls[1]:.2f}"
                without = s.get("without_tool") or {}
                if "accuracy" in without:  # what the tool is worth: the same problems, before training, no tool
                    what += f"; without the tool, before: {without['accuracy']:.3f} ± {without['standard_error']:.3f}"
            unit = {
                "solve rate": "share of answers that pass every test",
                "share of answers in the taught format": "share of answers in the format",
            }.get(measure, "share of answers right")
            found.append(_paired_row(notebook, what, unit, held_out))
            found += _split_rows(notebook, what, unit, held_out)
        preference = s.get("preference") or {}
        before, after = preference.get("held_out_before"), preference.get("held_out_after")
        if before and after:
            what = (
                f"DPO (training session): held-out likelihood accuracy, {after.get('pairs', '?')} pairs "
                "(chosen more likely than rejected)"
            )
            record = _figures(
                before,
                after,
                "likelihood_accuracy",
                "likelihood_accuracy_se",
                preference.get("held_out_change"),
                preference.get("held_out_change_se"),
            )
            found.append(_paired_row(notebook, what, "share of pairs", record, answers=False))
    teacher = figures.get("teacher_and_judge") or {}
    # paired on the same problems; their seen and unseen templates apart are in the notebook's and the summary's lines
    for label, record in (teacher.get("held_out_changes") or {}).items():
        what = f"GSM8K held-out accuracy, {record.get('problems', '?')} problems, greedy: {label}"
        found.append(_paired_row("13", what, "share of problems answered right", record))
    for name, accuracy in ({} if teacher.get("held_out_changes") else teacher.get("held_out_accuracy") or {}).items():
        found.append(  # a run from before the models were paired kept each model's accuracy alone
            _row(
                "13",
                f"GSM8K held-out accuracy, {accuracy.get('n', '?')} problems, greedy, after SFT on the {name} answers",
                "share of problems answered right",
                "-",
                with_error(accuracy.get("accuracy"), accuracy.get("standard_error")),
                "-",
                accuracy,
            )
        )
    return sorted(found, key=lambda row: row["notebook"])  # stable: a notebook's rows keep their order
