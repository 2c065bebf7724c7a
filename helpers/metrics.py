"""Metric lines and metric files: the one format every training script writes.

Rank 0 of every script prints one line per logging step::

    step=12 loss=0.4312 lr=1.2e-05

and appends the same record to ``$SM_OUTPUT_DATA_DIR/metrics.jsonl``, which SageMaker
packs into ``output.tar.gz`` next to the model. This module turns both back into records
(``{"step": 12, "loss": 0.4312, ...}``), writes the ``metric_definitions`` that make
SageMaker chart the same names, and reads a finished job's metrics from S3, the same
way in the cloud and in local mode.
"""

from __future__ import annotations

import io
import json
import math
import re
import tarfile

from helpers.artifacts import split_s3

# A float as the scripts print it (0.4312, -3, 1.2e-05); the same pattern SageMaker's
# metric_definitions use, so the notebook and the console agree.
FLOAT = r"-?[0-9.]+(?:[eE][-+]?[0-9]+)?"
_STEP_LINE = re.compile(r"\bstep=(\d+)((?:\s+[a-z0-9_]+=\S+)+)")
_PAIR = re.compile(r"([a-z0-9_]+)=(\S+)")


def parse_metric_line(line: str) -> dict | None:
    """``{"step": int, name: float, ...}`` for a metric line (anywhere in ``line``), else None."""
    match = _STEP_LINE.search(line)
    if match is None:
        return None
    record: dict = {"step": int(match.group(1))}
    for name, value in _PAIR.findall(match.group(2)):
        try:
            record[name] = float(value)
        except ValueError:
            return None  # not one of our lines: some other tool's "step=3 mode=fast"
    return record


def metric_definitions(*names: str) -> list[dict]:
    """SageMaker ``metric_definitions`` for metric names, e.g. ``metric_definitions("loss", "reward")``."""
    for name in names:
        if not re.fullmatch(r"[a-z0-9_]+", name):
            raise ValueError(f"Metric name {name!r} must match [a-z0-9_]+ (the scripts' metric line format).")
    return [{"Name": name, "Regex": rf"\b{name}=({FLOAT})"} for name in names]


def merge_by_step(records: list[dict]) -> list[dict]:
    """One record per step, in step order: records of the same step are merged, later values
    winning (a job resumed after an interruption logs some steps again)."""
    by_step: dict[int, dict] = {}
    for record in records:
        by_step.setdefault(record["step"], {}).update(record)
    return [by_step[step] for step in sorted(by_step)]


def latest(records: list[dict]) -> dict:
    """The last value of every metric (a metric may be logged on some steps only)."""
    values: dict = {}
    for record in records:
        values.update(record)
    return values


def all_finite(records: list[dict]) -> bool:
    return all(math.isfinite(v) for r in records for k, v in r.items() if k != "step")


# --------------------------------------------------------------------------- from S3


def job_output_uri(description: dict) -> str:
    """S3 URI of a job's ``output.tar.gz`` (it sits next to ``model.tar.gz``)."""
    output_path = description["OutputDataConfig"]["S3OutputPath"].rstrip("/")
    return f"{output_path}/{description['TrainingJobName']}/output/output.tar.gz"


def read_tar_member(session, uri: str, member_name: str) -> bytes | None:
    """One file from a ``.tar.gz`` in S3 (None if the archive has no such file)."""
    bucket, key = split_s3(uri)
    body = (
        session.boto_session.client("s3", region_name=session.boto_region_name)
        .get_object(Bucket=bucket, Key=key)["Body"]
        .read()
    )
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
        for member in archive.getmembers():
            if member.name.lstrip("./") == member_name:
                extracted = archive.extractfile(member)
                return extracted.read() if extracted else None
    return None


def read_job_metrics(session, job_name: str) -> list[dict]:
    """The records of ``metrics.jsonl`` in a finished job's ``output.tar.gz``."""
    description = session.sagemaker_client.describe_training_job(TrainingJobName=job_name)
    uri = job_output_uri(description)
    data = read_tar_member(session, uri, "metrics.jsonl")
    if data is None:
        raise FileNotFoundError(f"{uri} holds no metrics.jsonl: did the script write to $SM_OUTPUT_DATA_DIR?")
    return merge_by_step([json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()])


def read_training_metrics(session, jobs: list[dict]) -> dict[str, list[dict]]:
    """``read_job_metrics`` of each job (records of the workshop's state file) that logged metrics. A
    job that writes data rather than training (notebook 13's teacher) has no ``metrics.jsonl``: it is
    left out, and named, rather than stopping the table of the others."""
    found = {}
    for job in jobs:
        try:
            found[job["job_name"]] = read_job_metrics(session, job["job_name"])
        except FileNotFoundError:
            print(f"{job['job_name']} ({job.get('notebook')}): no metrics.jsonl, a job that trains nothing; left out")
    return found


def read_evaluation(session, job_name: str) -> dict:
    """What ``evaluate.py`` wrote for a finished job: ``evaluation.json`` from its output archive."""
    description = session.describe_training_job(job_name)
    text = read_tar_member(session, job_output_uri(description), "evaluation.json")
    if text is None:
        raise FileNotFoundError(f"{job_name}'s output has no evaluation.json: is it an evaluate.py job that finished?")
    return json.loads(text)


def held_out_change(before: dict, after: dict) -> dict:
    """Two ``evaluate.py`` results on the same examples and options: each accuracy with its standard error
    (over examples), and the change after - before with the standard error of the per-example
    differences (paired: each example's difficulty cancels out)."""
    from common.stats import paired_by_split, paired_change

    same = ("n", "samples_per_example", "temperature", "seed", "max_new_tokens", "stop", "environment")
    differing = [key for key in same if before.get(key) != after.get(key)]
    if differing or [r["example"] for r in before["records"]] != [r["example"] for r in after["records"]]:
        raise ValueError(
            "the two evaluations are not of the same examples with the same options "
            f"(they differ in {', '.join(differing) or 'their examples'}): their change would not be paired"
        )
    change, error = paired_change([r["accuracy"] for r in before["records"]], [r["accuracy"] for r in after["records"]])
    return {
        "before": before["accuracy"],
        "before_standard_error": before["standard_error"],
        "after": after["accuracy"],
        "after_standard_error": after["standard_error"],
        "change": change,
        "change_standard_error": error,
        "examples": before["n"],
        "samples_per_example": before["samples_per_example"],
        "temperature": before["temperature"],
        # how many distinct answers each model gave (None: an evaluation.json from before they were counted)
        "before_answer_diversity": before.get("answer_diversity"),
        "after_answer_diversity": after.get("answer_diversity"),
        # each part of the held-out set, where its problems name one ("seen" and "unseen" templates)
        "splits": paired_by_split(before.get("splits") or {}, after.get("splits") or {}, after.get("answer_diversity")),
    }


def describe_change(held_out: dict, what: str = "accuracy") -> str:
    """``held_out_change``'s figures: the two figures, the change in standard errors and whether it counts
    as a gain (``common.stats.judge_change``: beyond two standard errors, and the trained model's
    answers not collapsed into one), then how many distinct answers each model gave, then the same
    per split of the held-out set where it has them (``common.stats.describe_split``)."""
    from common import stats

    after = held_out.get("after_answer_diversity")
    lines = [
        f"held-out {what}, {held_out['examples']} problems x {held_out['samples_per_example']} answer(s) "
        f"at temperature {held_out['temperature']}: {held_out['before']:.3f} ± {held_out['before_standard_error']:.3f}"
        f" -> {held_out['after']:.3f} ± {held_out['after_standard_error']:.3f}",
        f"change {held_out['change']:+.3f} ± {held_out['change_standard_error']:.3f} (paired), "
        + stats.judge_change(held_out["change"], held_out["change_standard_error"], after),
    ]
    answers = stats.describe_answers_before_and_after(held_out.get("before_answer_diversity"), after)
    if answers:
        lines.append(answers)
    lines += [stats.describe_split(name, figures) for name, figures in (held_out.get("splits") or {}).items()]
    return "\n".join(lines)
