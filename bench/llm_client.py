"""Judged answers per second through the LLM client against a real local server, and the cache's hit path.

The server is ``transformers serve`` on the tiny model (``local_mode.llm_server``), one torch thread; the
judge is ``environments.llm_judge`` (one chat completion of ``max_tokens`` per judged answer). The tiny
model writes no JSON, so every verdict is a parse failure: that changes nothing in what is timed (the
request, the retries machinery, the parser), and the table says so. Concurrency 1, 4 and 16 measure
how far requests in flight overlap the server's work; the cache row asks the same answers again from
a warm cache (no request sent).

    python -m bench.llm_client [--answers 32] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench.tables import Row, format_table, machine_description, peak_rss_mib

REPO = Path(__file__).resolve().parents[1]


def _judge_batch(client, answers: int, max_tokens: int, salt: str):
    from environments.llm_judge import LLMJudgeEnvironment

    env = LLMJudgeEnvironment(client, max_tokens=max_tokens)
    problems = [{"question": f"What is {i} + {i}? ({salt})"} for i in range(answers)]
    completions = [f"{i} + {i} = {2 * i}\n#### {2 * i}" for i in range(answers)]
    started = time.perf_counter()
    env.score(problems, completions)
    return time.perf_counter() - started


def measure(answers: int = 32, max_tokens: int = 16, concurrencies=(1, 4, 16)) -> list[Row]:
    from common.llm_client import LLMClient

    from local_mode.llm_server import serve
    from local_mode.tiny_model import tiny_model_dir

    rows = []
    with serve(tiny_model_dir()) as server, tempfile.TemporaryDirectory() as cache:
        options = dict(base_url=server.base_url, api_key="bench", timeout_s=120)
        with LLMClient(server.model, **options) as warm:  # first request loads nothing new, but warms the server
            warm.complete_many([[{"role": "user", "content": "hi"}]], max_tokens=2)
        for concurrency in concurrencies:
            with LLMClient(server.model, max_concurrency=concurrency, **options) as client:
                seconds = _judge_batch(client, answers, max_tokens, salt=f"c{concurrency}")
                usage = client.usage
            rows.append(
                Row(
                    "llm client: judged answers",
                    f"tiny model, {max_tokens} tokens each, concurrency {concurrency}",
                    answers / seconds,
                    "answers/s",
                    memory_mib=peak_rss_mib(),
                    notes=f"{usage.api_calls} API calls, {usage.completion_tokens} tokens out, "
                    f"{usage.parse_failures} parse failures (the tiny model writes no JSON)",
                    extra={"seconds": seconds, **usage.as_dict()},
                )
            )
        with LLMClient(server.model, max_concurrency=16, cache_dir=cache, **options) as client:
            _judge_batch(client, answers, max_tokens, salt="cache")  # fills the cache
            miss_calls = client.usage.api_calls
            repeats = 20
            seconds = sum(_judge_batch(client, answers, max_tokens, salt="cache") for _ in range(repeats))
            usage = client.usage
        rows.append(
            Row(
                "llm client: judged answers",
                "cache hit path (same requests again)",
                answers * repeats / seconds,
                "answers/s",
                memory_mib=peak_rss_mib(),
                notes=f"{usage.api_calls - miss_calls} API calls while answering {answers * repeats} from the cache",
                extra={"seconds": seconds, **usage.as_dict()},
            )
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    machine = machine_description(os.getloadavg(), threads=1)  # the server's
    print(format_table(measure(args.answers, args.max_tokens), "LLM client against transformers serve", machine))


if __name__ == "__main__":
    main()
