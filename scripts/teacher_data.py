"""Synthetic SFT data from a teacher model, kept only where the GSM8K checker agrees (rejection sampling).

For every training problem the teacher (any model behind an OpenAI-compatible API) writes
``--samples_per_problem`` worked answers; the checker of ``environments/gsm8k.py`` keeps those whose final
number is right, at most ``--keep_per_problem`` a problem. The kept answers are written as SFT
conversations (``{"messages": [system, user, assistant]}``, what ``sft.py`` reads) to
``<output data>/train.jsonl``, with ``teacher_usage.json`` (the client's accounting) beside it.

The endpoint is ``--llm_base_url`` and the model ``--teacher_model``. The API key is never a
hyperparameter: on SageMaker it is read from AWS Secrets Manager (``--llm_api_key_secret``, the secret's
name; the job's role needs ``secretsmanager:GetSecretValue``); by hand, from ``OPENAI_API_KEY``.
The client's answers are cached under the checkpoint folder, which SageMaker syncs with
``checkpoint_s3_uri``: a restarted or repeated job asks the teacher only what it has not answered yet.

    SM_CHANNEL_TRAIN=data/gsm8k OPENAI_API_KEY=... python teacher_data.py --teacher_model m --llm_base_url URL
"""

from __future__ import annotations

import dataclasses
import json
import logging

from common import contract
from common.contract import UserError, option
from common.llm_client import LLMClient, job_client
from environments.gsm8k import GSM8KEnvironment

log = logging.getLogger("teacher_data")


@dataclasses.dataclass
class TeacherDataArgs:
    teacher_model: str = option("", "the teacher's model name at the endpoint")
    llm_base_url: str = option("", "the OpenAI-compatible endpoint (default: OPENAI_BASE_URL)")
    llm_api_key_secret: str = option(
        "", "name of the AWS Secrets Manager secret holding the API key (default: OPENAI_API_KEY, by hand)"
    )
    samples_per_problem: int = option(4, "answers asked of the teacher per problem (distinct seeds)")
    keep_per_problem: int = option(1, "at most this many right answers kept per problem")
    max_problems: int = option(0, "use the first N problems of the channel; 0 = all")
    max_tokens: int = option(256, "longest answer, in tokens")
    temperature: float = option(0.8, "the teacher's sampling temperature")
    max_concurrency: int = option(8, "requests in flight at once")
    requests_per_minute: float = option(0.0, "request rate limit; 0 = none")
    tokens_per_minute: float = option(0.0, "token rate limit; 0 = none")
    timeout_s: float = option(60.0, "seconds one attempt may take")
    max_retries: int = option(4, "retries of a 429, 5xx, timeout or malformed answer")
    budget_tokens: int = option(0, "stop with an error past this many tokens; 0 = no budget")
    checkpoint_dir: str | None = option(None, "where the answer cache lives (default: the checkpoint folder)")
    seed: int = option(42, "first seed of the teacher's samples")

    def validate(self) -> None:
        if not self.teacher_model:
            raise UserError("--teacher_model is required: the teacher's model name at the endpoint.")
        contract.require_at_least_one(self, "samples_per_problem", "keep_per_problem", "max_tokens")


def parse_args(argv: list[str] | None = None) -> TeacherDataArgs:
    return contract.HyperparameterParser(TeacherDataArgs, description=__doc__, prog="teacher_data.py").parse(argv)


def make_client(args: TeacherDataArgs) -> LLMClient:
    return job_client(
        args.teacher_model,
        args.llm_base_url,
        args.llm_api_key_secret,
        args.checkpoint_dir,
        max_concurrency=args.max_concurrency,
        requests_per_minute=args.requests_per_minute or None,
        tokens_per_minute=args.tokens_per_minute or None,
        timeout_s=args.timeout_s,
        max_retries=args.max_retries,
        budget_tokens=args.budget_tokens or None,
    )


def synthesize(args: TeacherDataArgs, env: GSM8KEnvironment, problems: list[dict], client: LLMClient) -> list[dict]:
    """The teacher's right answers as SFT conversations, at most ``keep_per_problem`` per problem."""
    asked = [(problem, sample) for problem in problems for sample in range(args.samples_per_problem)]
    answers = client.complete_many(
        [env.prompt_messages(problem) for problem, _ in asked],
        return_exceptions=True,  # a request that failed after its retries is one answer fewer, counted
        per_request=[{"seed": args.seed + sample} for _, sample in asked],
        max_tokens=args.max_tokens,
        temperature=args.temperature,
    )
    answered = [
        (problem, a.text) for (problem, _), a in zip(asked, answers, strict=True) if not isinstance(a, Exception)
    ]
    verdicts = env.score([p for p, _ in answered], [text for _, text in answered])
    kept, per_problem = [], {}
    for (problem, text), verdict in zip(answered, verdicts, strict=True):
        key = problem["question"]
        if verdict["correct"] and per_problem.get(key, 0) < args.keep_per_problem:
            per_problem[key] = per_problem.get(key, 0) + 1
            kept.append({"messages": [*env.prompt_messages(problem), {"role": "assistant", "content": text}]})
    log.info(
        "teacher: %d problems, %d answers asked, %d received, %d right, %d kept (%d problems covered)",
        len(problems),
        len(asked),
        len(answered),
        sum(v["correct"] for v in verdicts),
        len(kept),
        len(per_problem),
    )
    return kept


def main() -> None:
    args = parse_args()
    args.validate()
    env = GSM8KEnvironment()
    problems = env.load(contract.channel_file("train", "train.jsonl"))
    if args.max_problems:
        problems = problems[: args.max_problems]
    with make_client(args) as client:
        kept = synthesize(args, env, problems, client)
        out = contract.output_data_dir()
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "train.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in kept)
        client.write_usage(out / "teacher_usage.json")
        log.info("teacher usage: %s", client.usage.report())
        print(
            f"kept={len(kept)} requests={client.usage.requests} cached_hits={client.usage.cached_hits} "
            f"retries={client.usage.retries} tokens={client.usage.total_tokens}",
            flush=True,
        )
    model = contract.model_dir()
    model.mkdir(parents=True, exist_ok=True)  # SageMaker uploads it; the data is the output
    if not kept:
        log.warning("The teacher gave no right answer: train.jsonl is empty.")


if __name__ == "__main__":
    contract.run_main(main)
