"""Evaluate a model on a test set: the environment's checker, accuracy with its standard error.

The model comes from the ``model`` channel (a model folder, or the ``model.tar.gz`` of a training job)
or ``--model_name_or_path``; the examples from channel ``test`` (``test.jsonl``), read and scored by
the environment named with ``--environment`` (``gsm8k``: the final number; ``code``: the programs
run against the tests in a sandbox, after its self-test). Greedy by default; with ``--temperature``
above 0, ``--samples_per_example`` answers an example, each example drawing from its own seed
(``--seed`` + its index), so two models evaluated with the same options meet the same draws and the
batch size changes nothing. An example's accuracy is the share of its answers that are right, and the
standard error is over examples (one example's answers are not independent). Prints one metric line::

    step=0 accuracy=0.4312 standard_error=0.0136 mean_reward=0.4312 n=1319

and writes ``evaluation.json`` (accuracy, mean reward, n, one record per example with the answer its
completion gives, ``answer_diversity``: how many distinct answers, the most common one's share, from
which ``common.stats.collapsed`` tells a collapse, and ``splits``: where the examples carry a ``split``
field, as the offline GSM8K set's test split does ("seen" and "unseen" templates), each split's accuracy,
standard error, n and answer diversity (``common.stats.by_split``; the metric line adds ``accuracy_seen``...)) to
``SM_OUTPUT_DATA_DIR`` and to ``SM_MODEL_DIR`` (so it is in the job's model.tar.gz as well).

By hand:
    SM_CHANNEL_TEST=data/gsm8k python evaluate.py --model_name_or_path /path/to/model --max_examples 50
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass

import torch
from common import contract, distributed, generation, metrics, models, stats
from common.contract import option
from environments import REGISTRY, make_environment

log = logging.getLogger("evaluate")


@dataclass
class EvaluateArgs:
    model_name_or_path: str = option(
        "Qwen/Qwen2.5-0.5B-Instruct",
        "hub id or local folder of the model; the 'model' channel (SM_CHANNEL_MODEL) wins over it when given",
    )
    environment: str = option("gsm8k", "which data format and checker to use", choices=sorted(REGISTRY))
    max_new_tokens: int = option(512, "longest answer in tokens")
    generate_batch_size: int = option(32, "prompts per generate call", old_names=("batch_size",))
    max_examples: int = option(0, "evaluate only the first N examples; 0 = all")
    temperature: float = option(0.0, "sampling temperature; 0 = greedy (one answer an example)")
    samples_per_example: int = option(1, "answers sampled per example at --temperature above 0")
    stop: str = option(
        "",
        "also end an answer at the end of this text (kept), for example a program's closing fence "
        "'\\n```\\n'; '' = only at the end-of-sequence token",
    )
    seed: int = option(42, "example i's answers draw from seed + i")

    def validate(self, world_size: int) -> None:
        """``world_size`` is 1: evaluation runs in one process."""
        contract.require_at_least_one(self, "generate_batch_size", "max_new_tokens", "samples_per_example")
        if self.max_examples < 0:
            raise contract.UserError(f"--max_examples cannot be negative, got {self.max_examples}; 0 = all.")
        if not self.temperature >= 0:  # also refuses NaN
            raise contract.UserError(f"--temperature must be 0 (greedy) or above, got {self.temperature}.")
        if self.temperature == 0 and self.samples_per_example > 1:
            raise contract.UserError(
                f"--samples_per_example {self.samples_per_example} at --temperature 0: greedy answers are all the "
                "same. Set --temperature above 0 (1.0 samples the model as it is), or --samples_per_example 1."
            )


def parse_args(argv: list[str] | None = None) -> EvaluateArgs:
    return contract.HyperparameterParser(EvaluateArgs, description=__doc__, prog="evaluate.py").parse(argv)


def open_environment(name: str, stack: contextlib.ExitStack):
    """The environment called ``name``; code problems get a started sandbox as their judge (closed by ``stack``)."""
    if name != "code":
        return make_environment(name)
    from environments.code import local_judge
    from sandbox import Sandbox, SandboxEscape, run_selftest

    sandbox = stack.enter_context(Sandbox(workers=os.cpu_count() or 1))
    try:  # programs written by the model are untrusted: judge only in a sandbox that contains attacks
        run_selftest(sandbox, log=log.info)
    except SandboxEscape as escape:
        raise contract.UserError(f"The sandbox is not safe on this machine, so code is not judged.\n{escape}") from None
    return make_environment("code", judge=local_judge(sandbox))


def main() -> None:
    args = parse_args()
    learners = distributed.single_learner()
    args.validate(learners.world_size)  # before the code environment's sandbox starts
    torch.manual_seed(args.seed)
    with contextlib.ExitStack() as stack:
        evaluate(args, learners, open_environment(args.environment, stack))


def evaluate(args: EvaluateArgs, learners, env) -> None:
    models.unpack_model_archive(learners)  # channel 'model' may be a training job's model.tar.gz
    model_path = models.resolve_model_path(args.model_name_or_path)
    tokenizer = models.load_tokenizer(model_path)
    model = models.load_model(model_path, learners.device, trainable=False)
    examples = env.load(contract.channel_file("test", "test.jsonl"))
    if args.max_examples > 0:
        examples = examples[: args.max_examples]
    stop_ids = generation.default_stop_ids(model, tokenizer)
    k = args.samples_per_example

    started = time.perf_counter()
    records = []
    for start in range(0, len(examples), args.generate_batch_size):
        batch = examples[start : start + args.generate_batch_size]
        requests = [
            generation.SampleRequest(
                prompt=generation.prompt_token_ids(tokenizer, env.prompt_messages(example)),
                num_samples=k,
                max_new_tokens=args.max_new_tokens,
                temperature=args.temperature,
                seed=args.seed + start + offset,
                stop=[args.stop] if args.stop else [],
            )
            for offset, example in enumerate(batch)
        ]
        answers = generation.sample_requests(model, tokenizer, requests, stop_ids)
        completions = [tokenizer.decode(s.tokens, skip_special_tokens=True) for samples in answers for s in samples]
        scores = env.score([example for example in batch for _ in range(k)], completions)
        for offset, example in enumerate(batch):
            mine = range(offset * k, (offset + 1) * k)
            right = [_is_right(scores[i]) for i in mine]
            # A code problem's tests can take megabytes: the record keeps the rest of the example.
            shown = {key: value for key, value in example.items() if key != "tests"}
            record = {"index": start + offset, "example": shown, "completion": completions[mine[0]], **scores[mine[0]]}
            record["accuracy"] = sum(right) / k
            record["answer"] = stats.given_answer(completions[mine[0]], scores[mine[0]])
            if k > 1:  # the first answer's fields above, every answer's here
                record["completions"] = [completions[i] for i in mine]
                record["answers"] = [stats.given_answer(completions[i], scores[i]) for i in mine]
                record["rights"] = right
                record["rewards"] = [float(scores[i]["reward"]) for i in mine]
            records.append(record)
        log.info("evaluated %d/%d examples", len(records), len(examples))

    accuracy, standard_error = stats.mean_and_standard_error([r["accuracy"] for r in records])
    mean_reward = sum(sum(r.get("rewards", [float(r["reward"])])) / k for r in records) / len(records)
    figures = {"accuracy": accuracy, "standard_error": standard_error, "mean_reward": mean_reward, "n": len(records)}
    # problems that name their part of the held-out set ("seen" or "unseen" templates): each part's figures
    splits = stats.by_split(
        [r["example"].get("split") for r in records],
        [r["accuracy"] for r in records],
        [r.get("answers", [r["answer"]]) for r in records],
    )
    for name, part in splits.items():
        if metrics.NAME.match(f"n_{name}"):  # a split named otherwise is in evaluation.json only
            figures.update({f"accuracy_{name}": part["accuracy"], f"standard_error_{name}": part["standard_error"]})
            figures[f"n_{name}"] = part["n"]
    print(metrics.format_metric_line(0, figures), flush=True)
    result = {
        "model": model_path,
        "environment": args.environment,
        "accuracy": accuracy,
        "standard_error": standard_error,
        "mean_reward": mean_reward,
        "n": len(records),
        "samples_per_example": k,
        "temperature": args.temperature,
        "seed": args.seed,
        "stop": args.stop,
        "max_new_tokens": args.max_new_tokens,
        "seconds": round(time.perf_counter() - started, 2),
        # a figure that rose because most answers became one answer is a collapse, not learning
        "answer_diversity": stats.answer_diversity([a for r in records for a in r.get("answers", [r["answer"]])]),
        "splits": splits,  # {} when the examples name no split
        "records": records,
    }
    for folder in (contract.output_data_dir(), contract.model_dir()):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "evaluation.json").write_text(json.dumps(result, indent=1, default=str))
    with open(contract.output_data_dir() / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps({"step": 0, **figures}) + "\n")
    log.info(
        "accuracy %.4f +- %.4f on %d examples x %d answers (%s), written to %s",
        accuracy,
        standard_error,
        len(records),
        k,
        stats.describe_answers(result["answer_diversity"]),
        contract.output_data_dir() / "evaluation.json",
    )
    for name, part in splits.items():
        log.info(
            "%s templates: accuracy %.4f +- %.4f on %d examples",
            name,
            part["accuracy"],
            part["standard_error"],
            part["n"],
        )


def _is_right(score: dict) -> bool:
    """The environment's "correct" verdict; without one, a positive reward counts as right."""
    return bool(score["correct"]) if "correct" in score else float(score["reward"]) > 0


if __name__ == "__main__":
    contract.run_main(main)
