"""The end of every notebook: what its own run computed, read back from what it recorded, in a few lines.

    what_you_saw("08_training_session_grpo", work_dir)

A job notebook records its jobs in the workshop's state file (``<work_dir>/state.json``: each job's
final metrics and curve, notebook 6's evaluation, notebook 4's); a session notebook records its
session in ``<work_dir>/training_sessions.json`` (``helpers.training_sessions.records``). The held-out
figures are the rows of the README's results table and of the main job's summary (``helpers.results.rows``):
before -> after with one standard error each, the paired change and its size in standard errors, the
answers' diversity, and whether the change counts as a gain (``common.stats``: beyond two standard
errors, and never when the trained model's answers collapsed into one). It needs no SageMaker SDK, so
both kernels (SDK v2 and SDK v3) import it.
"""

from __future__ import annotations

from pathlib import Path

from common.stats import GAIN_STANDARD_ERRORS

from helpers.results import STATE_FILE, number, recorded, rows
from helpers.training_sessions import records

# The curves of a job's loop, known by a metric only that loop logs (the first found decides), each with
# its unit; then what the loop measured at its last evaluation on its test channel, without a standard error.
JOB_CURVES = (
    (
        "rewards_margins",
        {
            "rewards_accuracies": "share of pairs, chosen ranked above rejected",
            "rewards_margins": "nats, beta x log-ratio",
        },
        {
            "eval_loss": "nats per pair (DPO loss)",
            "eval_rewards_accuracies": "share of held-out pairs, chosen ranked above rejected",
            "eval_rewards_margins": "nats, beta x log-ratio",
        },
    ),
    ("no_code_rate", {"reward": "mean reward per answer", "no_code_rate": "share of answers without a program"}, {}),
    ("reward", {"reward": "mean reward per answer", "format_reward": "mean format reward per answer"}, {}),
    ("loss", {"loss": "nats per target token"}, {"eval_loss": "nats per target token"}),
)
# A session notebook's curves as it records them (``{"first_third": ..., "last_third": ...}`` and the like).
SESSION_UNITS = {
    "reward": "mean reward per answer",
    "no_code_rate": "share of answers without a program",
    "test_pass_fraction": "share of each answer's tests passed",
    "accuracy": "share of pairs, chosen ranked above rejected",
    "margin": "nats, beta x log-ratio",
}
VERDICTS = {  # the words of helpers.results.verdict, for a figure that is not of answers
    "gain": f"counts as a gain: beyond {GAIN_STANDARD_ERRORS:g} of its standard errors",
    "not a gain": f"does not count as a gain: not beyond {GAIN_STANDARD_ERRORS:g} of its standard errors",
    "collapsed: not a gain": "does not count: most answers after training are one answer (collapsed)",
    "-": "not judged: no paired standard error was recorded",
}


class NothingRecorded(LookupError):
    """The work_dir holds no figure of the notebook: it (or one before it) has not run there."""


def what_you_saw(notebook: str, work_dir: str | Path = "outputs") -> None:
    """Print what ``notebook`` (its name without ``.ipynb``) recorded in ``work_dir``: ``report``."""
    print(report(notebook, work_dir))


def report(notebook: str, work_dir: str | Path = "outputs") -> str:
    """The lines ``what_you_saw`` prints; ``NothingRecorded`` when ``work_dir`` holds nothing of ``notebook``."""
    work_dir = Path(work_dir)
    figures = recorded(work_dir)
    lines = _staged(figures["staged"], work_dir) if notebook.startswith("00") else []
    for job in figures["jobs"]:
        if job.get("notebook") == notebook:
            lines += _job(job)
    for session in figures["training_sessions"]:
        if session.get("notebook") == notebook:
            lines += _session(session)
    if notebook.startswith("05") and figures["spot"]:
        lines += _spot(figures["spot"])
    if notebook.startswith("13") and (figures["teacher_and_judge"] or {}).get("win_rate"):
        lines += _win_rate(figures["teacher_and_judge"])
    for row in rows(figures):
        if row["notebook"] == notebook[:2]:
            lines += _held_out(row)
    if not lines:
        first = (
            ""
            if (work_dir / STATE_FILE).exists()
            else " (and 00_setup_and_data.ipynb before it: there is no state file yet)"
        )
        raise NothingRecorded(
            f"{work_dir} holds no figure of {notebook}: run {notebook}.ipynb to its end first{first}, "
            f"with work_dir = {str(work_dir)!r}; its cells record what this one shows."
        )
    return "\n".join(lines)


def _staged(staged: dict, work_dir: Path) -> list[str]:
    """Notebook 0: the model, and the rows of each data set's channels as written to disk and uploaded."""
    if "channels" not in staged:
        return []
    lines = [
        f"model {staged.get('model_id')} staged at {staged.get('model')} (data source: {staged.get('data_source')})"
    ]
    for name, channels in staged["channels"].items():
        counts = []
        for split in channels:
            path = work_dir / "data" / "channels" / name / split / f"{split}.jsonl"
            written = sum(1 for line in path.open(encoding="utf-8") if line.strip()) if path.exists() else "?"
            counts.append(f"{split} {written} rows")
        lines.append(f"  {name}: {', '.join(counts)}")
    return lines


def _job(job: dict) -> list[str]:
    final = job.get("final_metrics") or {}
    seconds = job.get("billable_seconds")
    lines = [
        f"training job {job['job_name']}{' (' + job['label'] + ')' if job.get('label') else ''}: {job.get('status')}"
        + (f", {seconds} billable seconds of {job.get('training_seconds')} s training" if seconds is not None else "")
    ]
    curve = job.get("curve") or {}
    metrics, at_end = next(((shown, end) for key, shown, end in JOB_CURVES if key in curve or key in final), ({}, {}))
    for metric, unit in metrics.items():
        if metric in curve:
            c = curve[metric]
            lines.append(
                f"  {metric}: {c['first']:.3f} -> {c['last']:.3f} {unit} "
                f"(mean of the first quarter of {c['steps']} steps -> the last quarter)"
            )
        elif number(final.get(metric)) is not None:
            lines.append(f"  {metric} at the last step: {final[metric]:.3f} {unit} (no curve in this state file)")
    measured = [f"{m} {final[m]:.3f} {unit}" for m, unit in at_end.items() if number(final.get(m)) is not None]
    if measured:
        lines.append(f"  held out, at the last evaluation (no standard error): {'; '.join(measured)}")
    return lines


def _session(session: dict) -> list[str]:
    tokens = session.get("billable_tokens") or {}
    lines = [
        f"training session {session.get('session')}: {session.get('status')}, {session.get('steps')} steps"
        + (f", billable tokens: {', '.join(f'{k} {v}' for k, v in tokens.items())}" if tokens else "")
    ]
    final = session.get("final_metrics") or {}
    if number(session.get("first_loss")) is not None and number(final.get("loss")) is not None:
        lines.append(
            f"  loss: {session['first_loss']:.3f} -> {final['loss']:.3f} nats per answer token (first step -> last step)"
        )
    curves = {k: v for k, v in session.items() if isinstance(v, dict)}
    curves.update({k: v for k, v in (session.get("preference") or {}).items() if isinstance(v, dict)})
    for metric, unit in SESSION_UNITS.items():
        ends = curves.get(metric) or {}
        first = next((k for k in ends if k.startswith("first_")), None)
        last = next((k for k in ends if k.startswith("last_")), None)
        if first and last:
            lines.append(
                f"  {metric}: {ends[first]:.3f} -> {ends[last]:.3f} {unit} "
                f"(mean of the {first.replace('_', ' ')} of the steps -> the {last.replace('_', ' ')})"
            )
    lines += [f"  {line}" for line in records.notebook_lines(session)]
    resume = session.get("resume") or {}
    if resume.get("largest_difference"):
        differences = "; ".join(f"{k} {v:.3g}" for k, v in resume["largest_difference"].items())
        lines.append(
            f"  resumed after step {resume['from_step']} for {resume['steps']} steps: the largest difference from "
            f"the uninterrupted steps' metrics (each in its own unit): {differences}"
        )
    return lines


def _spot(spot: dict) -> list[str]:
    lines = [
        f"managed spot job {spot.get('job_name')}: resumed from the checkpoint of step {spot.get('resumed_from_step')}, "
        f"{spot.get('savings_percent')} % saved against on-demand ({spot.get('note') or 'as billed'})"
    ]
    if "checkpoint_mb" in spot:
        lines.append(spot_checkpoints(spot))
    return lines


def spot_checkpoints(spot: dict) -> str:
    """What became of the spot job's checkpoints (notebook 5's clean-up cell), as the notebook and the
    main job's summary say it."""
    done = "deleted once the job completed" if spot.get("checkpoints_deleted") else "kept"
    return f"its checkpoints in S3: {spot['checkpoint_mb']:.0f} MB, {done}"


def _win_rate(teacher: dict) -> list[str]:
    from environments.llm_judge import describe_judge, describe_win_rate

    rate, judge = teacher["win_rate"], teacher.get("judge")
    if not judge:  # a state file from before the judge was judged: a rate of one order per pair, not read
        return [
            f"judged ({teacher.get('pairwise_verdicts')} verdicts) before the judge itself was judged: no rate shown"
        ]
    said = describe_win_rate(rate, judge, "SFT on the teacher's answers", "the base model")
    return [f"the judge ({teacher.get('pairwise_verdicts')} verdicts): {describe_judge(judge)}", f"judged: {said}"]


def _held_out(row: dict) -> list[str]:
    figures = f"before {row['before']} -> after {row['after']}" if row["before"] != "-" else f"after {row['after']}"
    lines = [f"{row['what']}, in {row['unit']}:", f"  {figures} (± one standard error)"]
    if row["change"] != "-":
        paired = " (paired: the same problems and draws before and after)" if "±" in row["change"] else ""
        lines.append(f"  change {row['change']}{paired}")
        lines.append(f"  {row['judged'] or VERDICTS.get(row['verdict'], row['verdict'])}")
    if row["distinct"] != "-":
        lines.append(f"  distinct answers {row['distinct']}; the most common answer's share {row['share']}")
    if row["answers"]:
        lines.append(f"  {row['answers']}")
    return lines
