"""GRPO on a SageMaker training session: sample a group per problem, score it with the environment the
training-job scripts use, and train on group-relative advantages.

    .venv-sessions/bin/python -m session_loops.grpo --run-mode local --steps 12
    .venv-sessions/bin/python -m session_loops.grpo --run-mode sagemaker --base-model Qwen/Qwen3-4B --role arn:...

One step:
  1. ``save_weights_and_get_sampling_client()``: a sampler on the current weights;
  2. ``sample`` a group of ``group_size`` completions per problem (every request in flight at once);
  3. ``env.score``: the environment, passed in: GSM8K's checker from ``scripts/environments/gsm8k.py``
     (the same code the jobs run) here, the sandboxed code judge in ``code_rl.py``;
  4. advantage = reward - group mean; groups whose rewards are all equal are skipped;
  5. ``forward_backward(loss_fn="importance_sampling" | "ppo")`` + ``optim_step``.

How off-policy: the sampler is saved right before sampling and there is one optimizer step per batch,
so with ``overlap=False`` the samples come from the weights being trained (ratio 1 up to numerics).
With ``overlap=True`` step k+1 is sampled while step k is scored and trains (the code judge's workers
run while the service samples), on the weights from before step k's update: one update stale. The
importance ratio exp(logp - logp_sampler) corrects for it (``importance_sampling``) or is clipped to
[0.8, 1.2] (``ppo``); the loop reports the share of tokens outside that range
(``clip_fraction``) and the mean log-ratio (``sampler_kl``) every step.
"""

from __future__ import annotations

import random

from common.advantages import group_advantages, is_flat  # scripts/common: session_loops puts scripts/ on the path

from session_loops import common

PPO_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}


def count_problems(n: int, seed: int = 0, largest: int = 5) -> list[dict]:
    """The easiest GSM8K-format problems: the answer is the number in the question. Small enough for
    the tiny model to learn in a few steps offline; the cloud runs use openai/gsm8k."""
    from helpers.offline_data import ITEMS, NAMES

    rng = random.Random(seed)
    problems = []
    for _ in range(n):
        name, item, count = rng.choice(NAMES), rng.choice(ITEMS), rng.randint(1, largest)
        problems.append(
            {"question": f"{name} has {count} {item}. How many {item} does {name} have?", "answer": f"#### {count}"}
        )
    return problems


def sample_groups(sampling_client, tokenizer, env, problems: list[dict], group_size: int, params) -> list:
    """Send one sample request per problem (all in flight), return futures with their prompts. Each request
    gets its own seed (``params.seed`` + its index): with one seed for all, the i-th sample of every group
    would draw the same random numbers, and groups of similar prompts would repeat one another."""
    requests = []
    for index, problem in enumerate(problems):
        prompt = common.prompt_ids(tokenizer, env.prompt_messages(problem))
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
    the reward the advantages use is the environment's reward plus ``format_reward_weight`` x its format reward."""
    examples = [g["problem"] for g in groups for _ in g["completions"]]
    scores = iter(env.score(examples, [c for g in groups for c in g["completions"]]))
    for group in groups:
        group["scores"] = [next(scores) for _ in group["completions"]]
        for score in group["scores"]:
            score["reward"] += format_reward_weight * score.get("format_reward", 0.0)
    return groups


def train(
    training_client,
    tokenizer,
    env,
    problems: list[dict],
    steps: int,
    problems_per_step: int,
    group_size: int,
    learning_rate: float,
    loss_fn: str = "importance_sampling",
    temperature: float = 1.0,
    format_reward_weight: float = 0.0,
    overlap: bool = False,
    stop: list[str] | None = None,
    seed: int = 0,
    history: list[dict] | None = None,
) -> list[dict]:
    """``steps`` GRPO steps with the environment ``env`` (GSM8K's checker, the code judge...); returns one
    metric record a step, with the environment's own ``step_metrics()`` (verdict shares) when it has them."""
    from sagemaker.train.training_session import SamplingParams

    if loss_fn not in ("importance_sampling", "ppo"):
        raise ValueError(f"loss_fn must be 'importance_sampling' or 'ppo', got {loss_fn!r}.")
    rng = random.Random(seed)
    adam = common.adam_params(learning_rate)
    config = PPO_CLIP if loss_fn == "ppo" else None
    history = [] if history is None else history

    def sample_batch(sampler, step):
        # 512 is the service's smallest maxTokens; an answer ends earlier at its end of turn or a stop sequence.
        params = SamplingParams(
            max_tokens=512, temperature=temperature, seed=seed * 1_000_000 + step * 1_000, stop=stop
        )
        return sample_groups(sampler, tokenizer, env, rng.sample(problems, problems_per_step), group_size, params)

    sampler = training_client.save_weights_and_get_sampling_client()
    pending = sample_batch(sampler, 0)
    for step in range(steps):
        groups = receive_groups(tokenizer, pending)
        if overlap and step + 1 < steps:
            # The service samples step k+1 while this process scores and trains step k, on the same
            # weights as step k's samples: by the time step k+1 trains they are one update stale.
            pending = sample_batch(sampler, step + 1)
        score_groups(env, groups, format_reward_weight)
        completions, skipped = [], 0  # (prompt, sample, advantage) of the groups that teach something
        for group in groups:
            rewards = [s["reward"] for s in group["scores"]]
            if is_flat(rewards):  # every answer scored the same: all advantages are 0, nothing to train on
                skipped += 1
                continue
            # Dr. GRPO: only centred, not divided by the group's std (see scripts/common/advantages.py)
            advantages = group_advantages(rewards, group_size, scale_rewards="none")
            completions += [
                (group["prompt"], sample, advantage)
                for sample, advantage in zip(group["samples"], advantages, strict=True)
            ]
        scores = [s for g in groups for s in g["scores"]]
        sampled_tokens = sum(len(s.tokens) for g in groups for s in g["samples"])
        record = {
            "reward": sum(s["reward"] for s in scores) / len(scores),
            "accuracy": sum(bool(s["correct"]) for s in scores) / len(scores),
            "format_reward": sum(s["format_reward"] for s in scores) / len(scores),
            "skipped_groups": skipped,
            "sampled_tokens": sampled_tokens,
        }
        if hasattr(env, "step_metrics"):
            record.update(env.step_metrics())  # the code judge's verdict shares and judging time
        if completions:
            # The service sums the loss over tokens; dividing every advantage by the step's completion
            # tokens makes the step's loss a mean over tokens (Dr. GRPO's constant normaliser).
            n_tokens = sum(len(sample.tokens) for _, sample, _ in completions)
            datums = [
                common.policy_gradient_datum(prompt, sample, advantage / n_tokens)
                for prompt, sample, advantage in completions
            ]
            forward_backward = training_client.forward_backward(datums, loss_fn=loss_fn, loss_fn_config=config)
            optim_step = training_client.optim_step(adam)
            outputs = forward_backward.result().loss_fn_outputs
            optim_step.result()
            record.update(
                common.ratio_stats(datums, outputs, PPO_CLIP["clip_low_threshold"], PPO_CLIP["clip_high_threshold"])
            )
            record["trained_tokens"] = n_tokens
        common.log_step(history, record)
        next_sampled = step + 2 if overlap else step + 1  # the step the next sampler's samples train
        if next_sampled < steps:
            sampler = training_client.save_weights_and_get_sampling_client()  # after this step's update
            if not overlap:
                pending = sample_batch(sampler, next_sampled)
    return history


def evaluate(
    sampling_client,
    tokenizer,
    env,
    problems: list[dict],
    samples_per_problem: int = 4,
    temperature: float = 1.0,
    stop: list[str] | None = None,
    seed: int = 12345,
) -> dict[str, float]:
    """Accuracy and format reward on held-out problems, with the environment's checker."""
    from sagemaker.train.training_session import SamplingParams

    params = SamplingParams(max_tokens=512, temperature=temperature, seed=seed, stop=stop)
    groups = score_groups(
        env,
        receive_groups(
            tokenizer, sample_groups(sampling_client, tokenizer, env, problems, samples_per_problem, params)
        ),
    )
    scores = [s for g in groups for s in g["scores"]]
    return {
        "accuracy": sum(bool(s["correct"]) for s in scores) / len(scores),
        "format_reward": sum(s["format_reward"] for s in scores) / len(scores),
    }


def warm_start(
    training_client, tokenizer, env, problems: list[dict], steps: int, learning_rate: float, seed: int = 0
) -> list[dict]:
    """A few SFT steps in the same session on worked answers that end in '#### n': the model learns the
    format GSM8K's checker reads, so GRPO's groups have rewards to compare."""
    from session_loops import sft

    datums = [
        common.supervised_datum(
            common.prompt_ids(tokenizer, env.prompt_messages(p)),
            tokenizer(p["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id],
        )
        for p in problems
    ]
    return sft.train(training_client, datums, steps, batch_size=16, learning_rate=learning_rate, seed=seed)


def main() -> None:
    parser = common.session_arguments(__doc__.split("\n")[0])
    parser.add_argument("--warm-start-steps", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--problems-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--loss-fn", default="importance_sampling", choices=["importance_sampling", "ppo"])
    parser.add_argument("--overlap", action="store_true", help="sample step k+1 while step k trains")
    parser.add_argument("--stop", nargs="*", default=None, help="stop sequences, e.g. a newline for one-line answers")
    parser.add_argument(
        "--held-out-samples",
        type=int,
        default=4,
        help="answers per held-out problem; 16 makes the tiny model's rise larger than the noise",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from environments.gsm8k import GSM8KEnvironment

    env = GSM8KEnvironment()
    train_problems, held_out = count_problems(256, seed=args.seed), count_problems(64, seed=10_000 + args.seed)
    service, _ = common.connect(args.run_mode, args.region, args.role)
    base_model = common.choose_base_model(service, args.base_model)
    with common.training_session(service, base_model, args.rank, args.alpha) as training_client:
        tokenizer = training_client.get_tokenizer()
        warm_start(
            training_client, tokenizer, env, train_problems, args.warm_start_steps, args.learning_rate, args.seed
        )
        before = evaluate(
            training_client.save_weights_and_get_sampling_client(),
            tokenizer,
            env,
            held_out,
            args.held_out_samples,
            stop=args.stop,
        )
        history = train(
            training_client,
            tokenizer,
            env,
            train_problems,
            args.steps,
            args.problems_per_step,
            args.group_size,
            args.learning_rate,
            args.loss_fn,
            overlap=args.overlap,
            stop=args.stop,
            seed=args.seed,
        )
        after = evaluate(
            training_client.save_weights_and_get_sampling_client(),
            tokenizer,
            env,
            held_out,
            args.held_out_samples,
            stop=args.stop,
        )
        print(
            f"held-out accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}; reward "
            f"{history[0]['reward']:.3f} -> {history[-1]['reward']:.3f}"
        )
        print("billable tokens:", common.billable_tokens(training_client.training_session_name))


if __name__ == "__main__":
    main()
