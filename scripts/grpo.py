"""GRPO (Group Relative Policy Optimization) on GSM8K, one readable loop.

Every step:
  1. take a batch of prompts (``--prompts_per_step``, shared out over the learners);
  2. sample ``--group_size`` completions per prompt (a group) with the current policy;
  3. score them with the environment (reward 1 for the right final number, plus
     ``--format_reward_weight`` x format reward: ``common/rewards.py``);
  4. advantage of a completion = its reward minus its group's mean reward (divided by the group's
     reward std with ``--scale_rewards group``): the group is the baseline, no value model;
  5. ``--num_iterations`` optimizer updates on these rollouts, each over micro-batches of
     ``--micro_batch_size`` completions (gradient accumulation), with the clipped policy-ratio
     objective of PPO (``--epsilon``, ``--epsilon_high``), an optional KL penalty to the frozen
     starting model (``--beta``, k3 estimator) and the chosen loss aggregation (``--loss_type``).

The loop knows nothing about GSM8K: ``train(args, env, learners)`` takes any environment (see
``environments/__init__.py``); ``code_rl.py`` runs the same loop with a code judge.

Run by hand (CPU, tiny model):
    SM_CHANNEL_TRAIN=data/gsm8k python grpo.py --model_name_or_path /path/to/model --max_steps 10
On SageMaker the toolkit passes hyperparameters as ``--key value`` and data as channel ``train``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from common import checkpoints, contract, data, distributed, generation, models
from common.advantages import group_advantages_excluding, is_flat
from common.contract import UserError, option
from common.rewards import total_rewards
from common.training_run import TrainingRun
from environments import Environment
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

log = logging.getLogger("grpo")


# --------------------------------------------------------------------------- options


@dataclass
class GRPOArgs(contract.TrainingArgs):
    """The GRPO options (``code_rl.py``'s extend them)."""

    help_group = "GRPO"  # the heading of these options in --help

    learning_rate: float = 1e-6  # the common options' defaults for GRPO (their help is TrainingArgs')
    max_steps: int = 200
    group_size: int = option(
        8,
        "completions sampled per prompt: the group whose mean reward is the baseline (TRL calls it num_generations)",
        old_names=("num_generations",),
    )
    prompts_per_step: int = option(16, "prompts per step over all learners; must divide by the number of learners")
    micro_batch_size: int = option(
        8,
        "completions per forward/backward pass on one learner; the step's completions "
        "are accumulated in micro-batches of this size",
    )
    max_new_tokens: int = option(256, "longest completion in tokens; also the constant of --loss_type dr_grpo")
    temperature: float = option(1.0, "sampling temperature")
    stop: str = option(
        "",
        "also end a completion at the end of this text (kept), for example a program's closing fence "
        "'\\n```\\n'; '' = only at the end-of-sequence token",
    )
    num_iterations: int = option(
        1,
        "optimizer updates per batch of rollouts (the mu of the GRPO paper); old log-probs are computed once per batch",
    )
    epsilon: float = option(0.2, "clip the policy ratio below at 1 - epsilon")
    epsilon_high: float | None = option(
        None,
        "clip the policy ratio above at 1 + epsilon_high (DAPO's clip-higher "
        "suggests 0.28); default: same as --epsilon",
    )
    beta: float = option(
        0.0, "weight of the KL penalty to the frozen starting model (k3 estimator); 0 = no reference model is loaded"
    )
    loss_type: Literal["grpo", "dr_grpo", "dapo"] = option(
        "dapo",
        "how token losses are averaged: grpo = per sequence, then over sequences; dr_grpo = sum / "
        "(sequences x --max_new_tokens); dapo = over all tokens of the step",
    )
    scale_rewards: Literal["group", "none"] = option(
        "group", "group: divide advantages by the group's reward std; none: only subtract the group mean (Dr. GRPO)"
    )
    format_reward_weight: float = option(0.0, "weight of the environment's format reward added to the reward")
    judge_model: str = option(
        "",
        "an LLM judge's model name at an OpenAI-compatible endpoint: --judge_weight x its rubric score (0-1) "
        "joins the GSM8K checker's reward; a sample it fails to judge is left out of its group. Empty: the checker alone",
    )
    judge_weight: float = option(0.5, "weight of the judge's score (0-1) added to the checker's reward")
    llm_base_url: str = option("", "the judge's OpenAI-compatible endpoint (default: OPENAI_BASE_URL)")
    llm_api_key_secret: str = option(
        "", "name of the AWS Secrets Manager secret holding the judge's API key (default: OPENAI_API_KEY, by hand)"
    )
    lr_scheduler: Literal["cosine", "constant"] = option("constant", "learning-rate schedule after warm-up")
    warmup_steps: int = option(0, "steps of linear warm-up")
    weight_decay: float = option(0.0, "AdamW weight decay on matrices (not on biases and norms)")
    max_grad_norm: float = option(1.0, "clip the gradient norm to this; 0 = no clipping")

    def validate(self, world_size: int) -> None:
        """``world_size``: the learners, among which the prompts of a step are shared out."""
        super().validate(world_size)
        contract.require_at_least_one(self, "prompts_per_step", "max_new_tokens", "num_iterations", "micro_batch_size")
        if self.group_size < 2:
            raise UserError(
                f"--group_size {self.group_size}: GRPO needs at least 2 completions per prompt "
                "(the group is the baseline)."
            )
        if self.prompts_per_step % world_size:
            raise UserError(
                f"--prompts_per_step {self.prompts_per_step} must be a multiple of the number of learners "
                f"({world_size})."
            )
        completions = self.prompts_per_step // world_size * self.group_size
        if completions % self.micro_batch_size:
            raise UserError(
                f"--micro_batch_size {self.micro_batch_size} must divide the completions per learner and "
                f"step (--prompts_per_step / learners x --group_size = {completions})."
            )
        if self.temperature <= 0:
            raise UserError(
                f"--temperature must be positive, got {self.temperature} (sampling is needed for exploration)."
            )


def parse_args(argv: list[str] | None = None) -> GRPOArgs:
    return contract.HyperparameterParser(GRPOArgs, description=__doc__, prog="grpo.py").parse(argv)


def build_scheduler(args: GRPOArgs, optimizer):
    """``--lr_scheduler`` after ``--warmup_steps`` of linear warm-up, counted in optimizer updates
    (``--num_iterations`` a step)."""
    warmup, updates = args.warmup_steps * args.num_iterations, args.max_steps * args.num_iterations
    if args.lr_scheduler == "cosine":
        return get_cosine_schedule_with_warmup(optimizer, warmup, updates)
    return get_constant_schedule_with_warmup(optimizer, warmup)


# --------------------------------------------------------------------------- GRPO maths


def completion_logprobs(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_completion_tokens: int, temperature: float
) -> torch.Tensor:
    """log p(token) of the last ``num_completion_tokens`` tokens of each row, at the sampling temperature.

    Only the logits of the completion positions are computed (``logits_to_keep``); log-softmax goes
    row by row in fp32 so a (tokens x vocabulary) fp32 copy exists for one sequence at a time.
    """
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=num_completion_tokens + 1
    ).logits
    logits = logits[:, :-1]  # the logit at position t predicts token t + 1
    targets = input_ids[:, -num_completion_tokens:]
    rows = []
    for row_logits, row_targets in zip(logits, targets, strict=True):
        row_logits = row_logits.float() / temperature
        picked = row_logits.gather(-1, row_targets.unsqueeze(-1)).squeeze(-1)
        rows.append(picked - torch.logsumexp(row_logits, dim=-1))
    return torch.stack(rows)


def grpo_loss(
    logprobs,
    old_logprobs,
    ref_logprobs,
    advantages,
    mask,
    *,
    loss_type: str,
    epsilon: float,
    epsilon_high: float,
    beta: float,
    max_new_tokens: int,
    num_micro_batches: int,
    tokens_per_learner: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one micro-batch, scaled so that summing it over the micro-batches of an update
    gives the update's loss. Shapes: (sequences, tokens) except ``advantages`` (sequences,).

    per token:  -min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A) + beta * ratio * KL_k3
    with ratio = exp(logp - logp_old) and KL_k3 = exp(logp_ref - logp) - (logp_ref - logp) - 1.
    aggregation (``loss_type``):
      grpo     mean over each sequence's tokens, then over sequences (length-biased)
      dr_grpo  sum over tokens / (sequences x max_new_tokens)
      dapo     sum over tokens / tokens of the whole update (``tokens_per_learner``: the update's
               token count over all learners divided by their number, as gradients are averaged)
    """
    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    advantages = advantages.unsqueeze(1)
    per_token_loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
    kl = None
    if beta != 0.0:
        log_ratio_ref = ref_logprobs - logprobs
        # Weighted by the policy ratio, as TRL does by default: the samples come from the old policy, and
        # the weight makes the gradient that of the reverse KL of the current one (DeepSeek-V3.2).
        kl = (torch.exp(log_ratio_ref) - log_ratio_ref - 1) * ratio
        per_token_loss = per_token_loss + beta * kl

    if loss_type == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / num_micro_batches
    elif loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_new_tokens) / num_micro_batches
    elif loss_type == "dapo":
        loss = (per_token_loss * mask).sum() / max(tokens_per_learner, 1.0)
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}")

    with torch.no_grad():  # for the metric lines: token sums, averaged over the step later
        clipped = ((ratio < 1 - epsilon) & (advantages < 0)) | ((ratio > 1 + epsilon_high) & (advantages > 0))
        stats = {
            "clipped_tokens": (clipped.float() * mask).sum(),
            "kl_sum": (kl * mask).sum() if kl is not None else torch.zeros(()),
        }
    return loss, stats


def rewards_of(
    scores: list[dict], completions: list[str], env: Environment, format_reward_weight: float
) -> list[float]:
    """Each completion's reward: the environment's, plus ``format_reward_weight`` x its format reward.
    NaN where the environment could not score a completion (an LLM judge that failed): the advantage
    leaves it out of its group, and the step's metrics count it."""
    if len(scores) != len(completions):
        raise RuntimeError(
            f"{type(env).__name__}.score returned {len(scores)} scores for "
            f"{len(completions)} completions; it must return one per completion."
        )
    return total_rewards(scores, format_reward_weight)


def logprobs_by_micro_batch(model, input_ids, attention_mask, micro_batches, num_tokens, temperature) -> torch.Tensor:
    """``completion_logprobs`` of every row, computed one micro-batch at a time (no gradient)."""
    return torch.cat(
        [completion_logprobs(model, input_ids[mb], attention_mask[mb], num_tokens, temperature) for mb in micro_batches]
    )


def policy_update(
    args: GRPOArgs,
    learners: distributed.Learners,
    model,
    reference,
    optimizer,
    scheduler,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
) -> dict[str, float]:
    """``--num_iterations`` optimizer updates on one batch of rollouts (prompt + completion rows;
    ``mask`` marks the completion tokens), each accumulating the gradient over micro-batches of
    ``--micro_batch_size`` rows and averaging it over the learners on the last one. Returns the
    sums over the iterations of ``loss``, ``clipped_tokens``, ``kl`` and ``grad_norm``."""
    epsilon_high = args.epsilon if args.epsilon_high is None else args.epsilon_high
    num_tokens = mask.size(1)
    micro_batches = [slice(i, i + args.micro_batch_size) for i in range(0, len(input_ids), args.micro_batch_size)]
    # dapo divides by the update's token count over all learners (gradients are then averaged over them)
    tokens_per_learner = float(distributed.all_reduce_sum(mask.sum(), learners)) / learners.world_size

    # Log-probs before any update (the "old" policy of the ratio) and of the reference model, computed once.
    model.train()  # the mode the updates run in, so old and new log-probs are computed alike
    batch = (input_ids, attention_mask, micro_batches, num_tokens, args.temperature)
    with torch.no_grad(), distributed.autocast(learners):
        old_logprobs = logprobs_by_micro_batch(model, *batch) if args.num_iterations > 1 else None
        ref_logprobs = logprobs_by_micro_batch(reference, *batch) if reference is not None else None

    update = {"loss": 0.0, "clipped_tokens": 0.0, "kl": 0.0, "grad_norm": 0.0}
    for _ in range(args.num_iterations):
        for index, mb in enumerate(micro_batches):
            last = index == len(micro_batches) - 1
            with distributed.gradient_sync(model, enabled=last):  # gradients are averaged on the last one
                with distributed.autocast(learners):
                    logprobs = completion_logprobs(
                        model, input_ids[mb], attention_mask[mb], num_tokens, args.temperature
                    )
                # With one update per batch the old policy is the current one: ratio = 1, gradient unchanged.
                loss, stats = grpo_loss(
                    logprobs,
                    logprobs.detach() if old_logprobs is None else old_logprobs[mb],
                    None if ref_logprobs is None else ref_logprobs[mb],
                    advantages[mb],
                    mask[mb],
                    loss_type=args.loss_type,
                    epsilon=args.epsilon,
                    epsilon_high=epsilon_high,
                    beta=args.beta,
                    max_new_tokens=args.max_new_tokens,
                    num_micro_batches=len(micro_batches),
                    tokens_per_learner=tokens_per_learner,
                )
                loss.backward()
            update["loss"] += loss.item()
            update["clipped_tokens"] += stats["clipped_tokens"].item()
            update["kl"] += stats["kl_sum"].item()
        update["grad_norm"] += distributed.clip_grad_norm(model, args.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return update


def rollout_rows(prompt_rows, completion_ids, pad_token_id: int, device) -> tuple[torch.Tensor, ...]:
    """The update's prompt + completion rows: prompts padded on the left, completions on the right, so
    every completion starts at the same column. Returns ``input_ids``, ``attention_mask`` and the mask
    of the completion tokens (float)."""
    prompt_ids, prompt_mask = data.pad_rows(prompt_rows, pad_token_id, left=True, device=device)
    completion_tensor, mask = data.pad_rows(completion_ids, pad_token_id, left=False, device=device)
    return torch.cat([prompt_ids, completion_tensor], 1), torch.cat([prompt_mask, mask], 1), mask.float()


# --------------------------------------------------------------------------- metrics


def reward_sums(scores: list[dict], rewards: torch.Tensor, group_size: int) -> dict[str, float]:
    """This learner's sums behind the reward metrics: completions; those with a reward (an LLM judge
    that failed gives NaN), their rewards and squared rewards; the environment's ``correct`` and
    ``format_reward`` where it gives them; groups, and those whose rewards are all equal."""
    correct = [float(s["correct"]) for s in scores if "correct" in s]
    formats = [float(s["format_reward"]) for s in scores if "format_reward" in s]
    rewarded = ~rewards.isnan()
    groups = rewards.view(-1, group_size).tolist()
    return {
        "completions": len(scores),
        "rewarded": rewarded.sum(),
        "reward": rewards[rewarded].sum(),
        "reward_squares": (rewards[rewarded] ** 2).sum(),
        "judged": len(correct),
        "correct": sum(correct),
        "formatted": len(formats),
        "format_reward": sum(formats),
        "groups": len(scores) // group_size,
        "zero_std_groups": sum(is_flat([r for r in group if not math.isnan(r)]) for group in groups),
    }


def reward_metrics(totals: dict[str, float], judged: bool) -> dict[str, float]:
    """From ``reward_sums`` over all learners: ``reward`` and ``reward_std`` (sample std) of the rewarded
    completions, ``unrewarded`` with an LLM judge (left out of their groups' advantages), ``accuracy``
    and ``format_reward`` where the environment gives them."""
    rewarded = max(totals["rewarded"], 1)
    mean = totals["reward"] / rewarded
    variance = max(totals["reward_squares"] / rewarded - mean**2, 0.0) * rewarded / max(rewarded - 1, 1)
    line = {"reward": mean, "reward_std": math.sqrt(variance)}
    if judged:
        line["unrewarded"] = totals["completions"] - totals["rewarded"]
    if totals["judged"]:
        line["accuracy"] = totals["correct"] / totals["judged"]
    if totals["formatted"]:
        line["format_reward"] = totals["format_reward"] / totals["formatted"]
    return line


def update_sums(update: dict[str, float], attention_mask, mask, num_iterations: int) -> dict[str, float]:
    """This learner's sums behind the update's metrics: completion tokens (``mask``), tokens of the
    prompt + completion rows, and ``policy_update``'s sums (loss and grad_norm per iteration)."""
    return {
        "tokens": mask.sum(),
        "sequence_tokens": attention_mask.sum(),
        "loss": update["loss"] / num_iterations,
        "clipped_tokens": update["clipped_tokens"],
        "kl": update["kl"],
        "grad_norm": update["grad_norm"] / num_iterations,
    }


def update_metrics(totals: dict[str, float], args: GRPOArgs, world_size: int) -> dict[str, float]:
    """From ``update_sums`` and ``reward_sums`` over all learners: ``kl`` (with ``--beta``) and
    ``clip_ratio`` per updated token, ``completion_length``, ``frac_reward_zero_std`` (groups the update
    learns nothing from: all their advantages are 0), and ``loss`` and ``grad_norm`` averaged over learners."""
    updated_tokens = totals["tokens"] * args.num_iterations
    line = {"kl": totals["kl"] / updated_tokens} if args.beta != 0.0 else {}
    line["clip_ratio"] = totals["clipped_tokens"] / updated_tokens
    line["completion_length"] = totals["tokens"] / totals["completions"]
    line["frac_reward_zero_std"] = totals["zero_std_groups"] / totals["groups"]
    line["loss"] = totals["loss"] / world_size
    line["grad_norm"] = totals["grad_norm"] / world_size
    return line


def environment_metrics(env: Environment, learners: distributed.Learners, logged: dict) -> dict[str, float]:
    """``env.step_metrics()`` (optional, see ``environments/__init__.py``) averaged over the learners,
    under names of their own (not among ``logged``, the loop's). Called every step on every learner,
    also between logging steps, so each call covers one step."""
    if not hasattr(env, "step_metrics"):
        return {}
    totals = distributed.reduce_sums(env.step_metrics(), learners)
    line = {name: total / learners.world_size for name, total in totals.items()}
    if line.keys() & logged.keys():
        raise RuntimeError(
            f"{type(env).__name__}.step_metrics returned {sorted(line.keys() & logged.keys())}, "
            "names the loop already logs; give them names of their own."
        )
    return line


def step_log_line(
    args: GRPOArgs,
    env: Environment,
    learners: distributed.Learners,
    scores: list[dict],
    rewards: torch.Tensor,
    attention_mask: torch.Tensor,
    mask: torch.Tensor,
    update: dict[str, float],
    times: dict[str, float],
    lr: float,
) -> tuple[dict[str, float], float]:
    """The step's metric record (TRL's names) and the tokens the step processed, over all learners.

    This learner's sums (``reward_sums``, ``update_sums``, ``times``: seconds per phase) are added up
    over the learners in one all-reduce, then turned into means. Called on every learner."""
    sums = {
        **reward_sums(scores, rewards, args.group_size),
        **update_sums(update, attention_mask, mask, args.num_iterations),
        **times,
    }
    totals = distributed.reduce_sums(sums, learners)
    line = reward_metrics(totals, judged=bool(args.judge_model)) | update_metrics(totals, args, learners.world_size)
    line["lr"] = lr
    line.update({name: totals[name] / learners.world_size for name in times})
    line.update(environment_metrics(env, learners, line))  # the code judge's verdict rates, ...
    return line, totals["sequence_tokens"]


# --------------------------------------------------------------------------- the loop


def train(args: GRPOArgs, env: Environment, learners: distributed.Learners) -> bool:
    """Train with GRPO on ``env``'s training data (channel ``train``) and save the model.

    ``learners`` are the processes that train together; every collective goes through it, so a
    caller may run this on one process of a larger job. Returns False if stopped by SIGTERM (a
    checkpoint was saved and the run resumes from it), True when training finished.
    """
    args.validate(learners.world_size)
    checkpoints.seed_everything(args.seed + learners.rank)  # learners sample different completions

    # ---- model, reference model, optimizer, schedule (one optimizer update per iteration)
    model_path, tokenizer = models.starting_model(args.model_name_or_path, learners)
    policy = models.load_model(model_path, models.load_device(learners, args.strategy))
    reference = models.load_reference(model_path, learners, args.strategy) if args.beta != 0.0 else None
    model = models.prepare_for_training(policy, learners, args.strategy)
    optimizer = models.build_optimizer(model, args.learning_rate, args.weight_decay)
    scheduler = build_scheduler(args, optimizer)

    # ---- data, in a reproducible order that survives restarts
    examples = env.load(contract.channel_file("train", "train.jsonl"))
    prompts = [generation.prompt_token_ids(tokenizer, env.prompt_messages(example)) for example in examples]
    batch_order = data.BatchOrder(len(examples), args.prompts_per_step, args.seed)
    prompts_per_learner = args.prompts_per_step // learners.world_size

    # ---- resume after a spot interruption: weights, optimizer, schedule, RNG and data position
    run = TrainingRun(args, learners, model, optimizer, scheduler, batch_order)
    # Sampling runs on the policy itself, so every update is in the next step's rollouts.
    generator = generation.HFGenerator(
        policy,
        tokenizer,
        learners,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        stop_strings=[args.stop],
    )
    logger = run.start()
    log.info(
        "GRPO: %d examples, %d prompts x %d completions per step, %d learner(s), steps %d..%d",
        *(len(examples), args.prompts_per_step, args.group_size, learners.world_size, run.start_step + 1),
        args.max_steps,
    )

    for step in range(run.start_step + 1, args.max_steps + 1):
        # ---- 1. this learner's prompts, and 2. a group of completions per prompt
        indices = batch_order.next()[learners.rank * prompts_per_learner : (learners.rank + 1) * prompts_per_learner]
        started = time.perf_counter()
        completion_ids, completion_texts = generator.generate([prompts[i] for i in indices], args.group_size)
        times = {"gen_time": time.perf_counter() - started}

        # ---- 3. rewards from the environment
        started = time.perf_counter()
        scores = env.score([examples[i] for i in indices for _ in range(args.group_size)], completion_texts)
        rewards = torch.tensor(rewards_of(scores, completion_texts, env, args.format_reward_weight))
        times["reward_time"] = time.perf_counter() - started

        # ---- 4. group-relative advantages (a group never spans learners); an unscored sample gets 0
        advantages, _ = group_advantages_excluding(rewards.tolist(), args.group_size, args.scale_rewards)
        advantages = torch.tensor(advantages, dtype=torch.float32, device=learners.device)

        # ---- 5. the policy update on prompt + completion rows
        started = time.perf_counter()
        prompt_rows = [prompts[i] for i in indices for _ in range(args.group_size)]
        input_ids, attention_mask, mask = rollout_rows(
            prompt_rows, completion_ids, tokenizer.pad_token_id, learners.device
        )
        update = policy_update(
            args, learners, model, reference, optimizer, scheduler, input_ids, attention_mask, mask, advantages
        )
        times["train_time"] = time.perf_counter() - started

        # ---- 6. metrics, over all learners
        lr = scheduler.get_last_lr()[0]
        line, sequence_tokens = step_log_line(
            args, env, learners, scores, rewards, attention_mask, mask, update, times, lr
        )
        logger.add_tokens(sequence_tokens)
        if run.logs_at(step):
            logger.log(step, line)

        # ---- 7. checkpoints by steps/minutes; on SIGTERM save and stop (the restarted job resumes here)
        if run.end_step(step):
            return False

    run.finish(tokenizer)
    return True


@contextlib.contextmanager
def reward_environment(args: GRPOArgs) -> Iterator[Environment]:
    """The GSM8K checker, or, with ``--judge_model``, an LLM judge mixed with it. The judge's answers are
    cached under the checkpoint folder, which SageMaker syncs: a resumed job pays only for new ones."""
    from environments.gsm8k import GSM8KEnvironment

    if not args.judge_model:
        yield GSM8KEnvironment()
        return
    from common.llm_client import job_client
    from environments.llm_judge import LLMJudgeEnvironment

    with job_client(args.judge_model, args.llm_base_url, args.llm_api_key_secret, args.checkpoint_dir) as client:
        yield LLMJudgeEnvironment(client, verifiable="gsm8k", judge_weight=args.judge_weight)
        log.info("judge: %s", client.usage.report())


def main() -> None:
    args = parse_args()
    with distributed.started() as learners, reward_environment(args) as env:
        train(args, env, learners)


if __name__ == "__main__":
    contract.run_main(main)
