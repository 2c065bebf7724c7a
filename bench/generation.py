"""GRPO rollout throughput: a step's groups in one batched ``generate`` call against one call per
completion, both through ``common.generation.HFGenerator`` (the class GRPO samples with).

Completion tokens per second (the stop token counted, padding not), on CPU, alternating the two
ways ``rounds`` times on the same prompts; the figure is the median over rounds.

    python -m bench.generation --models tiny small
"""

from __future__ import annotations

import argparse
import os
import time

from bench.fixtures import data_dir, model_dir, parameter_count
from bench.tables import Row, format_table, machine_description, median, peak_rss_mib

PROMPTS, GROUP, MAX_NEW_TOKENS = 2, 8, 32


def _generator(model_path):
    from common import distributed, generation, models
    from environments.gsm8k import GSM8KEnvironment

    learners = distributed.single_learner("cpu")
    tokenizer = models.load_tokenizer(str(model_path))
    model = models.load_model(str(model_path), learners.device, trainable=True)
    generator = generation.HFGenerator(model, tokenizer, learners, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0)
    env = GSM8KEnvironment()
    examples = env.load(data_dir() / "gsm8k" / "train.jsonl")[:PROMPTS]
    prompts = [generation.prompt_token_ids(tokenizer, env.prompt_messages(example)) for example in examples]
    return generator, prompts


def batched(generator, prompts) -> int:
    completions, _ = generator.generate(prompts, GROUP)
    return sum(len(c) for c in completions)


def one_by_one(generator, prompts) -> int:
    tokens = 0
    for prompt in prompts:
        for _ in range(GROUP):
            completions, _ = generator.generate([prompt], 1)
            tokens += len(completions[0])
    return tokens


def measure(models: list[str], rounds: int = 3, threads: int = 1, log=print) -> list[Row]:
    """``threads``: torch threads (0: one per core); one by default, as in ``bench.train_steps``."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    rows = []
    for name in models:
        path = model_dir(name)
        generator, prompts = _generator(path)
        torch.manual_seed(0)
        batched(generator, prompts)  # warm-up: first-call allocations and kernel selection
        rates = {"batched": [], "one_by_one": []}
        for round_index in range(rounds):
            for way, run in (("batched", batched), ("one_by_one", one_by_one)):
                started = time.perf_counter()
                tokens = run(generator, prompts)
                rates[way].append(tokens / (time.perf_counter() - started))
            log(
                f"  generation {name} round {round_index + 1}: batched {rates['batched'][-1]:.0f} tokens/s, "
                f"one call per completion {rates['one_by_one'][-1]:.0f} tokens/s"
            )
        ours, baseline = median(rates["batched"]), median(rates["one_by_one"])
        params = parameter_count(path) / 1e6
        rows.append(
            Row(
                "grpo rollout throughput",
                f"{name} ({params:.1f} M params)",
                ours,
                "tokens/s",
                baseline,
                "one call per completion",
                peak_rss_mib(),
                notes=f"{PROMPTS} prompts x {GROUP} completions, {MAX_NEW_TOKENS} new tokens, median of "
                f"{rounds}; ratio > 1 = batched faster; memory: the process running both",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads; 0 = one per core (default: 1)")
    args = parser.parse_args(argv)
    machine = machine_description(os.getloadavg(), threads=args.threads or None)  # 0: torch's default, one per core
    print(format_table(measure(args.models, args.rounds, args.threads), "GRPO rollout throughput (CPU)", machine))


if __name__ == "__main__":
    main()
