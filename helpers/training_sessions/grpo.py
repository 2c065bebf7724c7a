"""GRPO's pieces for a session loop (08 on GSM8K, 09 on code): sampling groups, scoring them with an
environment, turning them into datums, the step's metric record and held-out evaluation. The step
itself, and the calls to the service, are in the notebooks' cells.

A step of the loop, as the notebooks write it:
  1. ``save_weights_and_get_sampling_client()``: a sampler on the current weights;
  2. ``sample_groups``: a group of ``group_size`` completions per problem, every request in flight at once;
  3. ``score_groups``: the environment, passed in: GSM8K's checker (``scripts/environments/gsm8k.py``, the
     code the jobs run) or the sandboxed code judge (``scripts/environments/code.py``);
  4-5. ``policy_gradient_datums``: advantages by ``group_advantages`` (``scripts/common/advantages.py``,
     the job scripts' function), and a ``datum_tools.policy_gradient_datum`` per completion;
  6. ``forward_backward(loss_fn="importance_sampling" | "ppo")`` and ``optim_step``.

Everything random in a step is drawn from (seed, step): its problems (``draw_problems``) and its
sampling seeds (``sampling_params``), so a run resumed from a checkpoint repeats the steps of the run
that was not interrupted.
"""

from __future__ import annotations

import itertools
import math
import random

from common import stats
from common.advantages import group_advantages, is_flat
from common.data import prompt_token_ids
from common.rewards import total_rewards

from helpers.training_sessions import datum_tools

PPO_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
LOSS_FNS = ("importance_sampling", "ppo")
MAX_TOKENS = 512  # the service's smallest maxTokens; an answer ends earlier at its end of turn or a stop sequence


def loss_config(loss_fn: str) -> dict | None:
    """forward_backward's ``loss_fn_config``: ppo's clip range, nothing for importance_sampling."""
    if loss_fn not in LOSS_FNS:
        raise ValueError(f"loss_fn must be one of {', '.join(LOSS_FNS)}, got {loss_fn!r}.")
    return PPO_CLIP if loss_fn == "ppo" else None


def draw_problems(problems: list[dict], prompts_per_step: int, seed: int, step: int) -> list[dict]:
    """Step ``step``'s ``prompts_per_step`` problems, a function of (seed, step) alone."""
    return random.Random(seed * 1_000_003 + step).sample(problems, prompts_per_step)


def sampling_params(temperature: float, stop: list[str] | None, seed: int, step: int):
    """Step ``step``'s sampling settings; ``sample_groups`` gives each request its own seed from these."""
    from sagemaker.train.training_session import SamplingParams

    return SamplingParams(
        max_tokens=MAX_TOKENS, temperature=temperature, seed=seed * 1_000_000 + step * 1_000, stop=stop
    )


def sample_groups(sampling_client, tokenizer, env, problems: list[dict], group_size: int, params) -> list:
    """Send one sample request per problem (all in flight), return futures with their prompts. Each request
    gets its own seed (``params.seed`` + its index): with one seed for all, the i-th sample of every group
    would draw the same random numbers, and groups of similar prompts would repeat one another."""
    requests = []
    for index, problem in enumerate(problems):
        prompt = prompt_token_ids(tokenizer, env.prompt_messages(problem))
        seeded = params if params.seed is None else params.model_copy(update={"seed": params.seed + index})
        requests.append(
            (problem, prompt, sampling_client.sample(prompt, num_samples=group_size, sampling_params=seeded))
        )
    return requests


def receive_groups(tokenizer, requests) -> list[dict]:
    """Wait for each group's samples and decode them."""
    groups = []
    for problem, prompt, future in requests:
        samples = future.result().sequences
        groups.append(
            {
                "problem": problem,
                "prompt": prompt,
                "samples": samples,
                "completions": [tokenizer.decode(s.tokens, skip_special_tokens=True) for s in samples],
            }
        )
    return groups


def score_groups(env, groups: list[dict], format_reward_weight: float = 0.0) -> list[dict]:
    """Score every completion with the environment in one call (a judge can spread it over its workers);
    each group gets ``scores`` and ``rewards``: the environment's reward plus ``format_reward_weight`` x its
    format reward, by the formula the job scripts use (``common.rewards``)."""
    examples = [g["problem"] for g in groups for _ in g["completions"]]
    scores = iter(env.score(examples, [c for g in groups for c in g["completions"]]))
    for group in groups:
        group["scores"] = [next(scores) for _ in group["completions"]]
        group["rewards"] = total_rewards(group["scores"], format_reward_weight)
    return groups


def policy_gradient_datums(groups: list[dict], group_size: int) -> tuple[list, int]:
    """Steps 4-5: each completion's advantage, its reward minus its group's mean (Dr. GRPO: not divided by
    the group's std), and its datum. Dividing every advantage by the step's completion tokens makes the
    service's summed loss a mean over tokens. Groups whose answers all scored the same teach nothing:
    they are skipped. Returns the datums and the number of groups skipped."""
    completions, skipped = [], 0
    for group in groups:
        if is_flat(group["rewards"]):
            skipped += 1
            continue
        advantages = group_advantages(group["rewards"], group_size, scale_rewards="none")
        completions += [(group["prompt"], sample, a) for sample, a in zip(group["samples"], advantages, strict=True)]
    n_tokens = sum(len(sample.tokens) for _, sample, _ in completions)
    datums = [datum_tools.policy_gradient_datum(prompt, sample, a / n_tokens) for prompt, sample, a in completions]
    return datums, skipped


def step_record(env, groups: list[dict], skipped_groups: int) -> dict:
    """A step's metrics: mean reward, accuracy and format reward of its samples, the groups skipped (all
    rewards equal), sampled tokens, and the environment's own ``step_metrics()`` (the code judge's verdict
    shares and judging time) when it has them."""
    scores = [s for g in groups for s in g["scores"]]
    record = {
        "reward": sum(r for g in groups for r in g["rewards"]) / len(scores),
        "accuracy": sum(bool(s["correct"]) for s in scores) / len(scores),
        "format_reward": sum(s["format_reward"] for s in scores) / len(scores),
        "skipped_groups": skipped_groups,
        "sampled_tokens": sum(len(s.tokens) for g in groups for s in g["samples"]),
    }
    if hasattr(env, "step_metrics"):
        record.update(env.step_metrics())
    return record


def training_record(datums, forward_backward_result) -> dict:
    """What the update saw: the summed loss the service returned, and how off-policy the batch was
    (``datums.ratio_stats`` against ppo's clip range)."""
    return {
        "loss": forward_backward_result.metrics["loss:sum"],
        **ratio_stats(
            datums,
            forward_backward_result.loss_fn_outputs,
            PPO_CLIP["clip_low_threshold"],
            PPO_CLIP["clip_high_threshold"],
        ),
        "trained_tokens": datum_tools.target_tokens(datums),
    }


def evaluate(
    sampling_client,
    tokenizer,
    env,
    problems: list[dict],
    samples_per_problem: int = 4,
    temperature: float = 1.0,
    stop: list[str] | None = None,
    seed: int = 12345,
) -> dict:
    """Held-out accuracy with the environment's checker: ``samples_per_problem`` answers a problem, the
    same sampling seeds every time it is called, so two models are compared on the same random draws.
    The standard error is over problems (a problem's answers are not independent of one another);
    ``per_problem`` keeps each problem's accuracy for a paired comparison (``paired_gain``), and
    ``answer_diversity`` how many distinct answers the model gave (``common.stats``: a model whose answers
    collapsed into one has not learned, whatever its accuracy)."""
    from sagemaker.train.training_session import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=seed, stop=stop)
    groups = score_groups(
        env,
        receive_groups(
            tokenizer, sample_groups(sampling_client, tokenizer, env, problems, samples_per_problem, params)
        ),
    )
    answers = [stats.given_answer(c, s) for g in groups for c, s in zip(g["completions"], g["scores"], strict=True)]
    return held_out_result(groups, answers, samples_per_problem)


def answers_result(env, problems: list[dict], completions: list[str]) -> dict:
    """``held_out_result`` of one answer a problem given as text (a served model's replies, greedy answers
    generated in the kernel), scored by ``env``'s checker: the figures of a session loop's evaluation, so
    that ``held_out_record`` pairs any two models' answers to the same problems."""
    scores = env.score(problems, completions)
    groups = [{"problem": problem, "scores": [score]} for problem, score in zip(problems, scores, strict=True)]
    answers = [stats.given_answer(c, score) for c, score in zip(completions, scores, strict=True)]
    return held_out_result(groups, answers, samples_per_problem=1)


def held_out_result(groups: list[dict], answers: list[str | None], samples_per_problem: int) -> dict:
    """The held-out figures of scored groups, one group a problem (``score_groups``): accuracy and its
    standard error over problems, ``per_problem`` for the paired change, the format reward,
    ``answer_diversity`` of ``answers`` (each answer's ``stats.given_answer``, group after group), and
    ``splits``: the same per part of the held-out set where the problems name one (their ``"split"``:
    "seen" or "unseen" templates; ``common.stats.by_split``), {} where they do not."""
    per_problem = [sum(bool(s["correct"]) for s in g["scores"]) / len(g["scores"]) for g in groups]
    accuracy, standard_error = stats.mean_and_standard_error(per_problem)
    scores = [s for g in groups for s in g["scores"]]
    ends = list(itertools.accumulate(len(g["scores"]) for g in groups))
    answers_per_problem = [answers[end - len(g["scores"]) : end] for g, end in zip(groups, ends, strict=True)]
    splits = [g.get("problem", {}).get("split") for g in groups]
    return {
        "accuracy": accuracy,
        "standard_error": standard_error,
        "format_reward": sum(s["format_reward"] for s in scores) / len(scores),
        "problems": len(groups),
        "samples_per_problem": samples_per_problem,
        "per_problem": per_problem,
        "answer_diversity": stats.answer_diversity(answers),
        "splits": stats.by_split(splits, per_problem, answers_per_problem),
    }


def paired_gain(before: dict, after: dict) -> tuple[float, float]:
    """After minus before on the same problems, and the standard error of that difference (from the
    per-problem differences: the problems' own difficulty cancels out)."""
    return stats.paired_change(before["per_problem"], after["per_problem"])


def held_out_record(before: dict, after: dict, measure: str = "accuracy") -> dict:
    """Two ``evaluate`` results on the same problems and seeds as the notebooks record them (``records.record``'s
    ``held_out``; the summary's lines are ``tools.training_session_notebooks.held_out_lines``): each figure
    with its standard error, the paired change's, each model's answer diversity, and the same per split
    (``stats.paired_by_split``: seen and unseen templates)."""
    change, change_standard_error = paired_gain(before, after)
    return {
        "before": before["accuracy"],
        "before_standard_error": before["standard_error"],
        "after": after["accuracy"],
        "after_standard_error": after["standard_error"],
        "change": change,
        "change_standard_error": change_standard_error,
        "problems": before["problems"],
        "samples_per_problem": before["samples_per_problem"],
        "measure": measure,
        "before_answer_diversity": before["answer_diversity"],
        "after_answer_diversity": after["answer_diversity"],
        # seen and unseen templates apart, where the problems name them (results from before: none)
        "splits": stats.paired_by_split(
            before.get("splits") or {}, after.get("splits") or {}, after["answer_diversity"]
        ),
    }


def ratio_stats(datums, outputs, low: float, high: float) -> dict[str, float]:
    """How off-policy the batch was: the training model's logprobs (returned by forward_backward, before
    this step's update) against the sampler's, over the completion tokens. ``clip_fraction`` is the share
    of tokens whose ratio lies outside [low, high]."""
    n = outside = 0
    kl = 0.0
    for datum, output in zip(datums, outputs, strict=True):
        inputs = datum.loss_fn_inputs
        for w, old, new in zip(
            datum_tools.values(inputs["weights"]),
            datum_tools.values(inputs["logprobs"]),
            datum_tools.values(output["logprobs"]),
            strict=True,
        ):
            if w:
                ratio = math.exp(new - old)
                outside += not (low <= ratio <= high)
                kl += old - new
                n += 1
    return {"clip_fraction": outside / max(n, 1), "sampler_kl": kl / max(n, 1)}
