"""What a session loop keeps of its run: one line per step, billable tokens and their cost, and the
record the main job's summary reads (``training_sessions.json``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

# Prices per million tokens, an assumption for the estimate only: replace them with your Region's
# figures from the SageMaker pricing page (training sessions bill prefill, sample and training tokens).
PRICE_PER_MILLION = {"prefill": 0.10, "sample": 0.30, "training": 0.60}
RECORDS_FILE = "training_sessions.json"  # in the notebooks' work_dir, beside the workshop's state file


def billable_tokens(training_session_name: str) -> dict[str, int]:
    """The session's BillableTokenUsage from DescribeTrainingSession."""
    import boto3

    detail = boto3.client("sagemaker").describe_training_session(TrainingSessionName=training_session_name)[
        "TrainingSessionDetail"
    ]
    usage = detail.get("BillableTokenUsage", {})
    return {
        "prefill": usage.get("PrefillTokenCount", 0),
        "sample": usage.get("SampleTokenCount", 0),
        "training": usage.get("TrainingTokenCount", 0),
    }


def cost(tokens: dict[str, int]) -> float:
    return sum(tokens[kind] * PRICE_PER_MILLION[kind] / 1e6 for kind in PRICE_PER_MILLION)


def log_step(history: list[dict], record: dict) -> None:
    """Keep the step's metrics and print them as one line (readable in a notebook, a terminal or a log)."""
    record = {"step": len(history) + 1, **record, "time": round(time.time(), 3)}
    history.append(record)
    print(
        "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items() if k != "time"),
        flush=True,
    )


def largest_difference(records: list[dict], others: list[dict]) -> float:
    """The largest absolute difference between two runs' step records, over every number they both hold
    but the clock's (``time``, ``judge_time``): 0.0 when a resumed run repeated the steps exactly."""
    largest = 0.0
    for one, other in zip(records, others, strict=True):
        for key in one.keys() & other.keys() - {"time", "judge_time"}:
            if isinstance(one[key], (int, float)) and isinstance(other[key], (int, float)):
                largest = max(largest, abs(one[key] - other[key]))
    return largest


def record(work_dir: str | os.PathLike, notebook: str, training_client, history: list[dict], **extra) -> None:
    """Append this notebook's session (name, status, steps, final metrics, billable tokens) to
    ``<work_dir>/training_sessions.json``, which the main job's summary reads. ``training_client`` is the
    SDK's, or the session's name where boto3 drives it (notebook 10)."""
    import boto3

    name = training_client if isinstance(training_client, str) else training_client.training_session_name
    detail = boto3.client("sagemaker").describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    entry = {
        "notebook": notebook,
        "session": name,
        "status": detail["TrainingSessionStatus"],
        "steps": len(history),
        "final_metrics": {k: v for k, v in (history[-1] if history else {}).items() if k not in ("step", "time")},
        "billable_tokens": billable_tokens(name),
        **extra,
    }
    path = Path(work_dir) / RECORDS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = [e for e in (json.loads(path.read_text()) if path.exists() else []) if e["notebook"] != notebook]
    path.write_text(json.dumps(entries + [entry], indent=1))
    # Nothing is returned: the notebook's last cell would show the whole record, which its 'What you saw'
    # cell reads back in a few lines.


def read(work_dir: str | os.PathLike) -> list[dict]:
    """Every notebook's record in ``<work_dir>/training_sessions.json`` (none before a session notebook ran)."""
    path = Path(work_dir) / RECORDS_FILE
    return json.loads(path.read_text()) if path.exists() else []


def held_out_lines(held_out: dict) -> list[str]:
    """A session's held-out figures (``grpo.held_out_record``), as the summary and the
    notebooks print them: 'held-out accuracy 0.300 ± 0.040 -> 0.350 ± 0.041 (...; 64 problems x 16
    answers)', then whether the change counts as a gain (``common.stats.judge_change``: beyond two
    standard errors, and the trained model's answers not collapsed into one), each model's answers, and
    the same for each split of the held-out set it has (seen and unseen templates: recall and transfer)."""
    from common import stats

    measure = held_out.get("measure", "accuracy")
    line = f"held-out {measure} {held_out['before']:.3f}"
    if "before_standard_error" not in held_out:
        return [line + f" -> {held_out['after']:.3f}"]
    line += (
        f" ± {held_out['before_standard_error']:.3f} -> {held_out['after']:.3f} ± "
        f"{held_out['after_standard_error']:.3f} (standard errors over problems; the change's, paired: "
        f"± {held_out['change_standard_error']:.3f}; {held_out['problems']} problems x "
        f"{held_out['samples_per_problem']} answers)"
    )
    change = held_out.get("change", held_out["after"] - held_out["before"])  # records before "change" was kept
    after = held_out.get("after_answer_diversity")
    lines = [line, f"change {change:+.3f}, " + stats.judge_change(change, held_out["change_standard_error"], after)]
    answers = stats.describe_answers_before_and_after(held_out.get("before_answer_diversity"), after)
    if answers:
        lines.append(answers)
    lines += [stats.describe_split(name, figures) for name, figures in (held_out.get("splits") or {}).items()]
    return lines


def notebook_lines(s: dict) -> list[str]:
    """The lines of a record's fields that one notebook keeps, as the summary and the notebook's 'What you
    saw' cell print them: 14's served models and judge, 15's tool use, 16's teacher and race."""
    lines = []
    for label, (accuracy, error) in (s.get("held_out_accuracy") or {}).items():  # 14's served models
        lines.append(f"{label} model: held-out accuracy {accuracy:.3f} ± {error:.3f}, greedy")
    if s.get("judge"):
        from environments.llm_judge import describe_judge, describe_win_rate

        lines.append(describe_judge(s["judge"]))
        for label, rate in (s.get("win_rates") or {}).items():
            lines.append(describe_win_rate(rate, s["judge"], f"{label} model", "base model"))
    if s.get("tool_use"):  # 15: how the model used the tool, before and after, and the answers without it
        before, after = s["tool_use"]["before"], s["tool_use"]["after"]
        lines.append(
            f"held out, per episode: tool calls {before['tool_calls_per_answer']:.3f} -> "
            f"{after['tool_calls_per_answer']:.3f}, failed tool calls {before['tool_errors_per_answer']:.3f} -> "
            f"{after['tool_errors_per_answer']:.3f}, a final '#### n' line {before['final_format']:.3f} -> "
            f"{after['final_format']:.3f}"
        )
    if s.get("without_tool"):
        lines.append(
            f"without the tool, before training: held-out accuracy {s['without_tool']['accuracy']:.3f} ± "
            f"{s['without_tool']['standard_error']:.3f}"
        )
    if s.get("teacher"):  # 16: the teacher, and each run's race to a share of its accuracy
        lines += _distillation_lines(s)
    return lines


def _distillation_lines(s: dict) -> list[str]:
    """Notebook 16's record: the teacher's held-out accuracy, the reverse KL's fall, and for each run
    (distillation, GRPO) its held-out curve and the first measure that reached the target."""
    teacher, comparison = s["teacher"], s["comparison"]
    lines = [
        f"teacher {teacher['model_package']}: held-out accuracy {teacher['accuracy']:.3f} ± "
        f"{teacher['standard_error']:.3f}; target {comparison['target_share']:.0%} of it = {comparison['target']:.3f}"
    ]
    if s.get("reverse_kl"):
        lines.append(
            f"reverse KL per token, first quarter of the steps {s['reverse_kl']['first_quarter']:.4f} -> "
            f"last quarter {s['reverse_kl']['last_quarter']:.4f}"
        )
    for name, curve in comparison["curves"].items():
        step = comparison["reached_at_step"].get(name)
        if step is None:
            reached = f"did not reach the target in {curve[-1]['step']} steps"
        elif step == 0:
            reached = "the start is already at the target"
        else:
            point = next(p for p in curve if p["step"] == step)
            reached = f"first at the target at step {step}, after {point['seconds']:.0f} s of training"
        points = ", ".join(f"{p['accuracy']:.3f} ± {p['standard_error']:.3f}" for p in curve)
        steps = ", ".join(str(p["step"]) for p in curve)
        lines.append(f"{name}: {reached}; held-out accuracy after steps {steps}: {points}")
    return lines
