"""Training sessions: what going through the SDK and the local endpoint costs.

    python -m bench.training_sessions [--models tiny small] [--steps 10]

For each benchmark model (bench.fixtures: tiny 1.3 M, small ~25 M parameters):
  * a cross_entropy step (forward_backward + optim_step, result awaited) through the SDK v3 in its
    own environment, against the same engine calls in-process on the same batch: overhead ratio
    (goals: <= 1.5x tiny, <= 1.1x small);
  * sampling tokens/s through the SDK against the scripts' HFGenerator on the same prompt, samples and
    token limit (goal: >= 0.9x);
  * the time from an operation's completion (the endpoint's clock) to the SDK's ``result()``
    returning (the client's clock, same machine): median (goal: < 50 ms).
One torch thread on both sides, as the other CPU benchmarks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from bench.fixtures import model_dir
from bench.tables import Row, format_table, machine_description
from local_mode import environment_python

SESSIONS_PYTHON = Path(environment_python(".venv-sessions"))  # the SDK v3 environment
CLIENT = Path(__file__).with_name("training_sessions_client.py")
RANK = 8
SAMPLES, MAX_TOKENS = 8, 512  # the API's smallest maxTokens is 512


def batch(tokenizer) -> list[list[int]]:
    texts = [
        "The cat sat on the mat and looked at the door.",
        "Numbers: 1 2 3 4 5 6 7 8 9 10.",
        "Hello there, how are you today? I am fine, thank you.",
        "Pick a digit between zero and nine.",
    ] * 2
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def in_process_steps(path: str, datums: list[list[int]], warmup: int, steps: int) -> list[float]:
    from local_mode.session_service.engine import Engine

    engine = Engine(path, RANK, 2 * RANK)
    wire = [
        {
            "modelInput": {"chunks": [{"tokens": t[:-1], "type": "encoded_text"}]},
            "lossFnInputs": {
                "target_tokens": {"data": t[1:], "dtype": "int64"},
                "weights": {"data": [1.0] * (len(t) - 1), "dtype": "float32"},
            },
        }
        for t in datums
    ]
    times = []
    for index in range(warmup + steps):
        started = time.perf_counter()
        engine.forward_backward("cross_entropy", wire, {}, backward=True)
        engine.optim_step({"learningRate": 1e-3, "weightDecay": 0.0})
        if index >= warmup:
            times.append(time.perf_counter() - started)
    return times


def in_process_sampling(path: str, prompt: list[int]) -> tuple[float, int]:
    from common import distributed
    from common.generation import HFGenerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    generator = HFGenerator(model, tokenizer, distributed.single_learner("cpu"), max_new_tokens=MAX_TOKENS)
    torch.manual_seed(0)
    started = time.perf_counter()
    completions, _ = generator.generate([prompt], SAMPLES)
    return time.perf_counter() - started, sum(len(c) for c in completions)


def measure(models: list[str], steps: int, warmup: int = 2) -> list[Row]:
    from transformers import AutoTokenizer

    from local_mode import session_service

    if not SESSIONS_PYTHON.exists():
        raise SystemExit("The SDK v3 environment is missing: make .venv-sessions/.stamp")
    torch.set_num_threads(1)
    os.environ.setdefault("SAGEMAKER_LOCAL_SESSION_THREADS", "1")  # the endpoint's, likewise
    root = Path(tempfile.mkdtemp(prefix="sessions-bench-"))
    timing_log = root / "timing.log"
    os.environ["SAGEMAKER_LOCAL_SESSION_TIMING_LOG"] = str(timing_log)  # read by the endpoint process
    endpoint = session_service.start_service(root)
    rows = []
    try:
        for name in models:
            path = str(model_dir(name))
            model_id = f"bench/{name}"
            session_service.register_base_model(model_id, path, root)
            tokenizer = AutoTokenizer.from_pretrained(path)
            datums = batch(tokenizer)
            prompt = tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]
            config = {
                "model": model_id,
                "rank": RANK,
                "steps": steps,
                "warmup": warmup,
                "datums": datums,
                "prompt": prompt,
                "samples": SAMPLES,
                "max_tokens": MAX_TOKENS,
            }
            env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON"))}
            env.update(endpoint.client_environment())
            done = subprocess.run(
                [str(SESSIONS_PYTHON), str(CLIENT), json.dumps(config)],
                env=env,
                capture_output=True,
                text=True,
                timeout=1800,
            )
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-3000:])
            sdk = json.loads(done.stdout.strip().splitlines()[-1])
            local = in_process_steps(path, datums, warmup, steps)
            sdk_step, local_step = statistics.median(sdk["steps"]), statistics.median(local)
            goal = "1.5" if name == "tiny" else "1.1"
            rows.append(
                Row(
                    "sessions: cross_entropy step",
                    f"{name}, {len(datums)} datums, LoRA r{RANK}",
                    sdk_step,
                    "s/step",
                    baseline=local_step,
                    baseline_name="engine in-process",
                    notes=f"SDK v3 -> HTTP endpoint vs the same engine calls; median of {steps}; goal ratio <= {goal}",
                )
            )
            local_seconds, local_tokens = in_process_sampling(path, prompt)
            rows.append(
                Row(
                    "sessions: sampling",
                    f"{name}, {SAMPLES} samples x <= {MAX_TOKENS} tokens",
                    sdk["sample_tokens"] / sdk["sample_seconds"],
                    "tokens/s",
                    baseline=local_tokens / local_seconds,
                    baseline_name="grpo.py HFGenerator",
                    notes=f"{sdk['sample_tokens']} vs {local_tokens} tokens; goal ratio >= 0.9",
                )
            )
            finished = dict(line.split() for line in timing_log.read_text().splitlines())
            waits = [returned - float(finished[op]) for op, returned in sdk["returned"] if op in finished]
            rows.append(
                Row(
                    "sessions: completion -> result()",
                    name,
                    statistics.median(waits) * 1000,
                    "ms",
                    notes=f"median of {len(waits)} optim_steps; long-polled result; goal < 50 ms",
                )
            )
    finally:
        session_service.stop_service(root)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    machine = machine_description(os.getloadavg(), threads=1)  # as measure() and the service set them
    print(format_table(measure(args.models, args.steps), "Training sessions", machine))


if __name__ == "__main__":
    main()
