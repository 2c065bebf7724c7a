"""On-policy distillation's pieces for a session loop (notebook 16): the teacher, a checkpoint read by
its model package; its log-probs of exactly the tokens the student sampled; per-token advantages as
datums; the step's reverse KL; and when a run first reaches a share of the teacher's accuracy. The step
itself is a cell of the notebook; the maths is ``scripts/common/distillation.py``, which the job side
can import too.

A step, as notebook 16 writes it, is GRPO's (``grpo.py``) with another source of advantages:
  1-2. ``save_weights_and_get_sampling_client()`` and ``grpo.sample_groups``: the student samples a group
       per problem at temperature 1, so that each token's sampler log-prob is log p_student;
  3.   ``score_with_teacher``: the teacher's ``compute_logprobs`` on prompt + completion, every request in
       flight at once; the completion's part is log p_teacher of each sampled token;
  4.   ``distillation_datums``: A_t = -kl_coef * (log p_student - log p_teacher) + task_reward_weight x the
       completion's GRPO advantage, as an importance-sampling datum;
  5.   ``forward_backward(loss_fn="importance_sampling")`` and ``optim_step``.

The teacher is scored in the student's own session: ``create_sampling_client(model_package_arn)`` on a
checkpoint of the same base model (another session's ``save_state``); the service refuses a checkpoint
of another base model (ValidationException). Per-token log-probs compare only over the same tokens, so
``open_teacher`` refuses a teacher whose tokenizer is not the student's before any step.
"""

from __future__ import annotations

import json
from pathlib import Path

from common import stats
from common.advantages import group_advantages
from common.distillation import check_same_tokenizer, distillation_advantages, reverse_kl

from helpers.training_sessions import datum_tools


def trained_model_of(work_dir, notebook: str = "08_training_session_grpo") -> str:
    """The model package of the model ``notebook`` trained, as its record in
    ``<work_dir>/training_sessions.json`` keeps it (``trained_model``)."""
    path = Path(work_dir) / "training_sessions.json"
    entries = json.loads(path.read_text()) if path.exists() else []
    found = [e for e in entries if e.get("notebook") == notebook and e.get("trained_model")]
    if not found:
        raise FileNotFoundError(
            f"No model trained by notebook {notebook[:2]} is recorded in {path}: run notebook {notebook[:2]} first "
            f"with the same work_dir ({str(work_dir)!r}), or set teacher_model_package_arn to a checkpoint's ARN "
            "(save_state's model_package_arn) of the student's base model."
        )
    return found[-1]["trained_model"]


def teacher_tokenizer(model_package_arn: str):
    """The tokenizer of the base model a checkpoint was trained from: DescribeModelPackage names the base
    model (its hub content), and the SDK loads that model's tokenizer as it loads a session's."""
    import boto3
    from sagemaker.train.training_session._utils import load_tokenizer

    sagemaker_client = boto3.client("sagemaker")
    package = sagemaker_client.describe_model_package(ModelPackageName=model_package_arn)
    base_model = package["InferenceSpecification"]["Containers"][0]["BaseModel"]["HubContentName"]
    return load_tokenizer(base_model, sagemaker_client)


def open_teacher(training_client, model_package_arn: str, student_tokenizer):
    """A sampling client on the teacher's checkpoint, in the student's session, once its tokenizer is known
    to be the student's (``check_same_tokenizer`` raises otherwise, before any step)."""
    check_same_tokenizer(student_tokenizer, teacher_tokenizer(model_package_arn))
    return training_client.create_sampling_client(model_package_arn)


def score_with_teacher(teacher, groups: list[dict]) -> list[dict]:
    """The teacher's log-prob of every token each completion sampled: one ``compute_logprobs`` of prompt +
    completion per completion, all in flight before the first is read. Each group gets ``teacher_logprobs``,
    one list per sample, as long as its tokens."""
    requests = [
        [teacher.compute_logprobs(group["prompt"] + list(sample.tokens)) for sample in group["samples"]]
        for group in groups
    ]
    for group, futures in zip(groups, requests, strict=True):
        group["teacher_logprobs"] = [
            future.result()[len(group["prompt"]) :] for future in futures
        ]  # the completion's tokens: the prompt's are not the student's choices
    return groups


def distillation_datums(groups: list[dict], group_size: int, kl_coef: float, task_reward_weight: float) -> list:
    """Step 4: each sampled token's advantage, -kl_coef x (log p_student - log p_teacher), plus
    ``task_reward_weight`` x its completion's GRPO advantage (the group's rewards, minus their mean, as
    ``grpo.policy_gradient_datums`` takes them), in an importance-sampling datum. Divided by the step's
    completion tokens, the service's summed loss is a mean over tokens. No group is skipped: the teacher
    has something to say about every token, even where all answers scored the same."""
    completions = []
    for group in groups:
        task = (
            group_advantages(group["rewards"], group_size, scale_rewards="none")
            if task_reward_weight
            else [0.0] * len(group["samples"])
        )
        for sample, teacher, advantage in zip(group["samples"], group["teacher_logprobs"], task, strict=True):
            token_advantages = distillation_advantages(
                sample.logprobs, teacher, kl_coef, task_advantage=task_reward_weight * advantage
            )
            completions.append((group["prompt"], sample, token_advantages))
    n_tokens = sum(len(sample.tokens) for _, sample, _ in completions)
    datums = []
    for prompt, sample, token_advantages in completions:
        datum = datum_tools.policy_gradient_datum(prompt, sample, 0.0)  # the shift, weights, sampler log-probs
        datum.loss_fn_inputs["advantages"] = [0.0] * (len(prompt) - 1) + [a / n_tokens for a in token_advantages]
        datums.append(datum)
    return datums


def kl_record(groups: list[dict]) -> dict:
    """How far the student still is from the teacher on its own samples: the per-token reverse KL estimate
    mean(log p_student - log p_teacher) over the step's completion tokens (0 when the two agree), and the
    teacher's mean log-prob of those tokens."""
    student = [lp for g in groups for s in g["samples"] for lp in s.logprobs]
    teacher = [lp for g in groups for lps in g["teacher_logprobs"] for lp in lps]
    return {"reverse_kl": reverse_kl(student, teacher), "teacher_logprob": sum(teacher) / max(len(teacher), 1)}


def first_reaching(curve: list[dict], target: float) -> dict | None:
    """The first point of a held-out curve (``{"step", "seconds", **grpo.evaluate(...)}``, in step order)
    whose accuracy reaches ``target``; None when none does."""
    return next((point for point in curve if point["accuracy"] >= target), None)


def comparison_lines(runs: dict[str, list[dict]], target: float, teacher: dict) -> list[str]:
    """How each run's held-out curve (``runs``: name -> curve, each from the same start) met ``target``: how
    far the target is from the start in the start's standard errors (within 2, reaching it says little), the
    step and training seconds at which each curve first reached it, each run's seconds a step and last
    point, whether a run's last point scores as the teacher does, and the first two runs' paired
    difference at their last point."""
    start = next(iter(runs.values()))[0]
    distance = (target - start["accuracy"]) / start["standard_error"] if start["standard_error"] else float("inf")
    lines = [
        f"target {target:.3f}: {distance:+.1f} standard errors of the start ({start['accuracy']:.3f} ± "
        f"{start['standard_error']:.3f}) above it"
        + (
            "; within the start's noise, so reaching it says little"
            if abs(distance) < stats.GAIN_STANDARD_ERRORS
            else ""
        )
    ]
    for name, curve in runs.items():
        point, last = first_reaching(curve, target), curve[-1]
        if point is None:
            best = max(curve, key=lambda p: p["accuracy"])
            lines.append(
                f"{name}: did not reach it in {last['step']} steps (best {best['accuracy']:.3f} ± "
                f"{best['standard_error']:.3f}, after step {best['step']})"
            )
        elif point["step"] == 0:
            lines.append(f"{name}: the start is already at it")
        else:
            lines.append(
                f"{name}: reached it at step {point['step']}, after {point['seconds']:.0f} s of training "
                f"({point['accuracy']:.3f} ± {point['standard_error']:.3f}; the first measure at or above it)"
            )
        lines.append(
            f"{name}: {last['seconds'] / last['step']:.2f} s a training step; after step {last['step']} "
            f"{last['accuracy']:.3f} ± {last['standard_error']:.3f}; answers {stats.describe_answers(last['answer_diversity'])}"
        )
        if last["per_problem"] == teacher["per_problem"] and last["answer_diversity"] == teacher["answer_diversity"]:
            lines.append(
                f"{name}: its last point scores every problem as the teacher does, with the same answers' counts "
                "(with the teacher's own training parameters, this run repeats its training)"
            )
    if len(runs) > 1:
        (first, one), (second, other) = list(runs.items())[:2]
        change, standard_error = stats.paired_change(other[-1]["per_problem"], one[-1]["per_problem"])
        lines.append(
            f"{first} - {second} after step {one[-1]['step']}: {change:+.3f} ± {standard_error:.3f} (paired), "
            + stats.judge_change(change, standard_error, one[-1]["answer_diversity"])
        )
    return lines
