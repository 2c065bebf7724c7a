"""Scenarios run with the real sagemaker-train SDK (SDK v3), in its own environment (.venv-sessions).

    .venv-sessions/bin/python sdk_scenarios.py <scenario> '<json arguments>'

The endpoint is reached only through the environment (AWS_ENDPOINT_URL_<SERVICE>, the SDK's
SAGEMAKER_TRAINING_SESSION_*ENDPOINT); the ServiceClient gets a region and a role, nothing else.
Each scenario prints one JSON line last, which the test reads.
"""

from __future__ import annotations

import json
import random
import sys

import boto3
from sagemaker.train.training_session import AdamParams, Datum, ModelInput, SamplingParams, ServiceClient

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
MODEL = "local/tiny-qwen2"
TEXTS = [
    "The cat sat on the mat.",
    "Numbers: 1 2 3 4 5 6 7.",
    "Hello there, how are you today?",
    "Pick a digit.",
]


def service() -> ServiceClient:
    return ServiceClient(region="us-east-1", role_arn=ROLE)


def sft_datum(tokenizer, text: str) -> Datum:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return Datum(
        model_input=ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )


def cross_entropy_steps(tc, datums, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        fb = tc.forward_backward(datums, "cross_entropy")
        step = tc.optim_step(AdamParams(learning_rate=5e-3, weight_decay=0.0, grad_clip_norm=1.0))
        losses.append(fb.result().metrics["loss:sum"])
        step.result()
    return losses


def cross_entropy_resume(steps: int) -> dict:
    """The same cross_entropy run uninterrupted, and cut in two by save_state / load with optimizer."""
    svc = service()
    tc = svc.create_lora_training_client(MODEL, rank=8, alpha=16)
    tokenizer = tc.get_tokenizer()
    datums = [sft_datum(tokenizer, text) for text in TEXTS]
    uninterrupted = cross_entropy_steps(tc, datums, steps)
    tc.stop()

    first = svc.create_lora_training_client(MODEL, rank=8, alpha=16)
    head = cross_entropy_steps(first, datums, steps // 2)
    checkpoint = first.save_state("half-way").result().model_package_arn
    name = first.training_session_name
    first.stop()
    resumed = svc.create_training_client_from_state_with_optimizer(checkpoint, rank=8, alpha=16)
    tail = cross_entropy_steps(resumed, datums, steps - steps // 2)
    weights_only = svc.create_training_client_from_state(checkpoint, rank=8, alpha=16)
    tail_fresh_optimizer = cross_entropy_steps(weights_only, datums, steps - steps // 2)
    detail = boto3.client("sagemaker").describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    resumed.stop()
    weights_only.stop()
    return {
        "uninterrupted": uninterrupted,
        "resumed": head + tail,
        "fresh_optimizer": tail_fresh_optimizer,
        "checkpoint": checkpoint,
        "first_session": name,
        "last_sequence": detail["LastReceivedSequenceNumber"],
        "billed": detail["BillableTokenUsage"],
        "tokens_per_step": sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) - 1 for t in TEXTS),
    }


def pipelining() -> dict:
    """forward_backward and optim_step submitted before either result is read, then a forward."""
    svc = service()
    with svc.create_lora_training_client(MODEL, rank=4, alpha=8) as tc:
        datums = [sft_datum(tc.get_tokenizer(), text) for text in TEXTS]
        fb = tc.forward_backward(datums, "cross_entropy")
        step = tc.optim_step(AdamParams(learning_rate=1e-2, weight_decay=0.0))
        after = tc.forward(datums, "cross_entropy")
        result = {
            "before": fb.result().metrics["loss:sum"],
            "step": step.result().metrics,
            "after": after.result().metrics["loss:sum"],
            "sequence": tc.current_sequence_number,
        }
    return result


def sampling_from_saved() -> dict:
    """A sampling client on saved weights samples what the training client's weights do."""
    svc = service()
    tc = svc.create_lora_training_client(MODEL, rank=8, alpha=16)
    tokenizer = tc.get_tokenizer()
    cross_entropy_steps(tc, [sft_datum(tokenizer, text) for text in TEXTS], 3)
    prompt = tokenizer("Numbers: 1 2", add_special_tokens=False)["input_ids"]
    params = SamplingParams(max_tokens=512, temperature=1.0, seed=7, stop=["."])
    own = tc.save_weights_and_get_sampling_client()
    from_package = svc.create_sampling_client(model_package_arn=own.model_package_arn)
    base = svc.create_sampling_client(base_model=MODEL)
    samples = {}
    for label, client in (("own", own), ("package", from_package), ("base", base)):
        response = client.sample(prompt, num_samples=3, sampling_params=params).result()
        samples[label] = {
            "tokens": [s.tokens for s in response.sequences],
            "logprobs": [s.logprobs for s in response.sequences],
            "stop": [s.stop_reason.value for s in response.sequences],
            "scored": client.compute_logprobs(prompt + response.sequences[0].tokens).result(),
            "texts": [tokenizer.decode(s.tokens) for s in response.sequences],
        }
    for client in (from_package, base, tc):
        client.stop()
    return samples


def save_while_sampling(requests: int) -> dict:
    """An overlapped RL loop's pattern: sample requests on saved weights still in flight while the
    training client steps and saves again. The new package must hold the stepped weights, not those
    the in-flight requests sample (which the service swaps in while it samples them)."""
    svc = service()
    tc = svc.create_lora_training_client(MODEL, rank=8, alpha=16)
    tokenizer = tc.get_tokenizer()
    datums = [sft_datum(tokenizer, text) for text in TEXTS]
    before = tc.save_weights_and_get_sampling_client()
    prompt = tokenizer("Numbers: 1 2", add_special_tokens=False)["input_ids"]
    params = SamplingParams(max_tokens=512, temperature=1.0, seed=3)
    in_flight = [before.sample(prompt, num_samples=1, sampling_params=params) for _ in range(requests)]
    tc.forward_backward(datums, "cross_entropy")
    tc.optim_step(AdamParams(learning_rate=1e-2, weight_decay=0.0)).result()
    after = tc.save_weights_and_get_sampling_client()
    overlapped = sum(not future.done() for future in in_flight)  # still sampling when the save returned
    for future in in_flight:
        future.result()
    trained = [o["logprobs"]["data"] for o in tc.forward(datums, "cross_entropy").result().loss_fn_outputs]
    texts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    scored = [after.compute_logprobs(ids).result()[1:] for ids in texts]  # [None] first: no prediction
    stale = [before.compute_logprobs(ids).result()[1:] for ids in texts]
    tc.stop()
    return {"trained": trained, "after": scored, "before": stale, "overlapped": overlapped}


def grpo_pick_seven(
    model: str,
    grpo_steps: int,
    group: int,
    learning_rate: float,
    seed: int,
    rank: int = 16,
    alpha: int = 32,
    sft_steps: int = 0,
) -> dict:
    """GRPO (importance_sampling) on 'answer 7', from a model that answers one digit at random."""
    rng = random.Random(seed)
    svc = service()
    tc = svc.create_lora_training_client(model, rank=rank, alpha=alpha)
    tokenizer = tc.get_tokenizer()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Pick a digit."}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    adam = AdamParams(learning_rate=learning_rate, weight_decay=0.0, grad_clip_norm=1.0)
    for _ in range(sft_steps):  # one random digit, then end of turn: a format, no preference for 7
        datums = []
        for _ in range(16):
            answer = tokenizer(str(rng.randrange(10)), add_special_tokens=False)["input_ids"] + [eos]
            ids = prompt_ids + answer
            weights = [0.0] * (len(prompt_ids) - 1) + [1.0] * len(answer)
            datums.append(
                Datum(
                    model_input=ModelInput.from_ints(ids[:-1]),
                    loss_fn_inputs={"target_tokens": ids[1:], "weights": weights},
                )
            )
        tc.forward_backward(datums, "cross_entropy")
        tc.optim_step(adam)
    rewards, texts = [], []
    for step in range(grpo_steps):
        # The loop's way to sample its current weights: save them, sample that package, same session.
        sampler = tc.create_sampling_client(tc.save_weights_for_sampler().result().model_package_arn)
        response = sampler.sample(
            prompt_ids,
            num_samples=group,
            sampling_params=SamplingParams(max_tokens=512, temperature=1.0, seed=seed * 1000 + step),
        ).result()
        texts = [tokenizer.decode(s.tokens, skip_special_tokens=True) for s in response.sequences]
        print(step, texts[:6], flush=True)
        reward = [float(t.strip() == "7") for t in texts]
        mean = sum(reward) / len(reward)
        rewards.append(mean)
        total_tokens = sum(len(s.tokens) for s in response.sequences)
        datums = []
        for sample, r in zip(response.sequences, reward, strict=True):
            ids = prompt_ids + list(sample.tokens)
            n_prompt = len(prompt_ids) - 1
            # Dr. GRPO's advantage (reward - group mean); summed loss divided by the step's tokens.
            advantage = (r - mean) / total_tokens
            datums.append(
                Datum(
                    model_input=ModelInput.from_ints(ids[:-1]),
                    loss_fn_inputs={
                        "target_tokens": ids[1:],
                        "weights": [0.0] * n_prompt + [1.0] * len(sample.tokens),
                        "logprobs": [0.0] * n_prompt + list(sample.logprobs),
                        "advantages": [0.0] * n_prompt + [advantage] * len(sample.tokens),
                    },
                )
            )
        if mean not in (0.0, 1.0):
            tc.forward_backward(datums, "importance_sampling")
            tc.optim_step(adam)
    tc.stop()
    return {"rewards": rewards, "last_texts": texts}


def describe(name: str) -> dict:
    """What a later kernel sees: the session by name, the base models, the tokenizer."""
    svc = service()
    detail = boto3.client("sagemaker").describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    sessions = [s.training_session_arn for s in svc.list_sessions()]
    return {
        "status": detail["TrainingSessionStatus"],
        "error": detail.get("ErrorDetails"),
        "models": svc.list_base_models(),
        "listed": any(a.endswith("/" + name) for a in sessions),
    }


if __name__ == "__main__":
    scenario, arguments = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(globals()[scenario](**arguments)))
