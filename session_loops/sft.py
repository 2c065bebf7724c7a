"""Supervised fine-tuning on a SageMaker training session: the loop in your process, the model on the service.

    .venv-sessions/bin/python -m session_loops.sft --run-mode local --steps 20
    .venv-sessions/bin/python -m session_loops.sft --run-mode sagemaker --base-model Qwen/Qwen3-4B --role arn:...

Each step sends one ``forward_backward(loss_fn="cross_entropy")`` and one ``optim_step``; both return
futures at once, so the next batch is built and sent while the service still computes (pipelining).
The service returns the loss as a sum; the loop divides by the batch's answer tokens.
"""

from __future__ import annotations

import collections
import random

from session_loops import common


def conversation_datum(tokenizer, messages: list[dict]):
    """Everything before the last assistant turn is the prompt (weight 0); that turn and its end of
    turn are the answer (weight 1)."""
    prompt = common.prompt_ids(tokenizer, messages[:-1])
    answer = tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return common.supervised_datum(prompt, answer)


def train(
    training_client,
    datums: list,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int = 0,
    history: list[dict] | None = None,
) -> list[dict]:
    """``steps`` cross-entropy steps on batches drawn from ``datums``; returns one metric record a step."""
    rng = random.Random(seed)
    adam = common.adam_params(learning_rate)
    history = [] if history is None else history
    in_flight = collections.deque()  # steps sent whose results are not read yet

    def read_oldest():
        forward_backward, optim_step, tokens = in_flight.popleft()
        loss_sum = forward_backward.result().metrics["loss:sum"]  # a sum over the batch's answer tokens
        optim_step.result()
        common.log_step(history, {"loss": loss_sum / tokens, "tokens": tokens})

    for _ in range(steps):
        batch = rng.sample(datums, min(batch_size, len(datums)))
        # Both calls return futures at once; the service runs them in sequence-number order, so step
        # k+1 is on its way while step k's result is read.
        in_flight.append(
            (
                training_client.forward_backward(batch, loss_fn="cross_entropy"),
                training_client.optim_step(adam),
                common.target_tokens(batch),
            )
        )
        if len(in_flight) > 1:
            read_oldest()
    while in_flight:
        read_oldest()
    return history


def sample_answers(sampling_client, tokenizer, prompts: list[list[dict]], max_tokens: int = 512) -> list[str]:
    """One greedy answer per prompt (chat messages), decoded."""
    from sagemaker.train.training_session import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    futures = [
        sampling_client.sample(common.prompt_ids(tokenizer, messages), num_samples=1, sampling_params=params)
        for messages in prompts
    ]  # all in flight at once
    return [tokenizer.decode(f.result().sequences[0].tokens, skip_special_tokens=True) for f in futures]


def main() -> None:
    parser = common.session_arguments(__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    args = parser.parse_args()

    from helpers import offline_data

    service, _ = common.connect(args.run_mode, args.region, args.role)
    base_model = common.choose_base_model(service, args.base_model)
    with common.training_session(service, base_model, args.rank, args.alpha) as training_client:
        tokenizer = training_client.get_tokenizer()
        datums = [conversation_datum(tokenizer, r["messages"]) for r in offline_data.chat_records(64)]
        history = train(training_client, datums, args.steps, args.batch_size, args.learning_rate)
        saved = training_client.save_state("sft-final").result()
        print(f"loss {history[0]['loss']:.3f} -> {history[-1]['loss']:.3f}; state saved as {saved.model_package_arn}")
        print("billable tokens:", common.billable_tokens(training_client.training_session_name))


if __name__ == "__main__":
    main()
