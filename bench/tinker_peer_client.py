"""The client side of ``bench.tinker_peer``: the same calls through SageMaker's SDK v3 (``.venv-sessions``)
or the ``tinker`` SDK (``.venv-bench-peer``), whose training-session APIs have the same shape.

    tinker_peer_client.py sagemaker|tinker '<json: model, rank, steps, warmup, datums, prompt, max_tokens, ...>'

Prints one JSON line: the wall time of each forward_backward + optim_step (both awaited), and for each
number of sample requests in flight, the wall time and the tokens generated.
"""

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def clients(api: str, config: dict):
    """A LoRA training client and the module of the API's types."""
    if api == "sagemaker":
        from sagemaker.train import training_session as types
        from sagemaker.train.training_session import ServiceClient

        service = ServiceClient(region="us-east-1", role_arn="arn:aws:iam::123456789012:role/SageMakerRole")
        return service.create_lora_training_client(config["model"], rank=config["rank"], seed=0), types
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=config["base_url"], api_key=config["api_key"])
    return service.create_lora_training_client(base_model=config["model"], rank=config["rank"], seed=0), types


def main(api: str, config: dict) -> dict:
    training_client, types = clients(api, config)
    datums = [
        types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
        )
        for tokens in config["datums"]
    ]
    adam = types.AdamParams(learning_rate=1e-3, weight_decay=0.0)
    steps = []
    for index in range(config["warmup"] + config["steps"]):
        started = time.perf_counter()
        backward = training_client.forward_backward(datums, "cross_entropy")
        step = training_client.optim_step(adam)
        backward.result()
        step.result()
        if index >= config["warmup"]:
            steps.append(time.perf_counter() - started)

    sampler = training_client.save_weights_and_get_sampling_client(name="bench")
    params = types.SamplingParams(max_tokens=config["max_tokens"], temperature=1.0, seed=0)
    prompt = types.ModelInput.from_ints(config["prompt"])

    def tokens_of(future) -> int:
        return sum(len(sequence.tokens) for sequence in future.result().sequences)

    sampling = {}
    sampler.sample(prompt, num_samples=1, sampling_params=params).result()  # warm-up: compilation, caches
    for in_flight in config["in_flight"]:
        started = time.perf_counter()
        futures = [sampler.sample(prompt, num_samples=1, sampling_params=params) for _ in range(in_flight)]
        with ThreadPoolExecutor(max_workers=in_flight) as pool:  # result() may block: wait on all at once
            tokens = sum(pool.map(tokens_of, futures))
        sampling[str(in_flight)] = {"seconds": time.perf_counter() - started, "tokens": tokens}
    return {"steps": steps, "sampling": sampling}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2]))))
