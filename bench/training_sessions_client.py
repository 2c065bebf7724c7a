"""The SDK side of ``bench.training_sessions``, run with ``.venv-sessions/bin/python`` (SDK v3).

    training_sessions_client.py '<json: model, steps, warmup, datums, prompt, samples>'

Prints one JSON line: per-step wall times of forward_backward + optim_step through the SDK,
sampling wall time and generated tokens, and (operation id, time result() returned) pairs.
"""

import json
import sys
import time

from sagemaker.train.training_session import AdamParams, Datum, ModelInput, SamplingParams, ServiceClient


def main(config: dict) -> dict:
    svc = ServiceClient(region="us-east-1", role_arn="arn:aws:iam::123456789012:role/SageMakerRole")
    tc = svc.create_lora_training_client(config["model"], rank=config["rank"], alpha=2 * config["rank"])
    datums = [
        Datum(
            model_input=ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
        )
        for tokens in config["datums"]
    ]
    adam = AdamParams(learning_rate=1e-3, weight_decay=0.0)
    steps, returned = [], []
    for index in range(config["warmup"] + config["steps"]):
        started = time.perf_counter()
        backward = tc.forward_backward(datums, "cross_entropy")
        step = tc.optim_step(adam)
        backward.result()
        step.result()
        returned.append((step.operation_id, time.time()))  # the step ended last: its result() is the wait
        if index >= config["warmup"]:
            steps.append(time.perf_counter() - started)
    sampler = tc.create_sampling_client()  # the base model, as the in-process generator samples it
    started = time.perf_counter()
    response = sampler.sample(
        config["prompt"],
        num_samples=config["samples"],
        sampling_params=SamplingParams(max_tokens=config["max_tokens"], temperature=1.0, seed=0),
    ).result()
    sample_seconds = time.perf_counter() - started
    tc.stop()
    return {
        "steps": steps,
        "returned": returned,
        "sample_seconds": sample_seconds,
        "sample_tokens": sum(len(s.tokens) for s in response.sequences),
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
