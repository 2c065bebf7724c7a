"""Serving: output tokens/s and latency with 1, 4 and 16 requests in flight, our servers against ``transformers serve``.

    python -m bench.serving [--models tiny smollm2] [--prompts 32] [--max-tokens 64]
    python -m bench.serving --write docs/BENCHMARKS.md   # the table between its marker comments there

One model folder, the same prompts (GSM8K problems in the chat template, as notebook 8 asks them),
the same ``max_tokens``, greedy (temperature 0), every answer streamed; three ways to the model:
  * **session**: SampleTrainingSessionWithResponseStream (boto3) on a training session of the model:
    the project's own server (``local_mode/session_service``), whose engine serves the requests in
    flight in shared generation passes. The session's LoRA adapter is as created (B = 0): it answers
    as the base model, through peft's LoRA layers.
  * **endpoint**: InvokeEndpointWithResponseStream (boto3) on a local real-time endpoint of the same
    folder: the session service's hosting relays the body to a ``transformers serve`` process and its
    bytes back (``local_mode/endpoints.py``). Against the next, what the relay costs.
  * **transformers serve**: a ``transformers serve`` process of its own (``local_mode.llm_server``),
    reached with the openai client. The baseline.
Every server computes on one torch thread (``SAGEMAKER_LOCAL_SESSION_THREADS=1``; ``llm_server``'s
``OMP_NUM_THREADS=1``), as the other CPU benchmarks do. For each number in flight, every prompt is
sent once, that many at a time (``concurrent.futures``), after one warm-up request per server.
Output tokens are each answer's ``usage.completion_tokens``; tokens/s is all of them over the
level's wall time; latency is from sending a request to its stream's end; time to first token (TTFT)
is to the first event with text. The session's host computes an answer before it streams it
(``local_mode/session_service/chat.py``), so its TTFT is close to its latency. "Same answers" counts
the prompts whose greedy text equals transformers serve's at the same number in flight.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy

from bench.fixtures import data_dir
from bench.tables import Row, machine_description

IN_FLIGHT = (1, 4, 16)
SERVERS = ("session", "endpoint", "transformers serve")
BASELINE = "transformers serve"
# SmolLM2 samples some 25x slower than the tiny model on 2 cores (docs/BENCHMARKS.md, sampling requests in
# flight): fewer, shorter answers for it.
SIZES = {"tiny": (32, 64), "smollm2": (16, 32)}  # (prompts, max_tokens)
# What local mode serves under this image is transformers serve; the URI is the one a real endpoint for
# the Messages API would name (Hugging Face TGI), as tests/training_sessions/test_inference_endpoints_boto3.py.
TGI_IMAGE = (
    "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-tgi-inference:"
    "2.7.0-tgi3.3.6-gpu-py311-cu124-ubuntu22.04"
)
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
BEGIN, END = "<!-- serving:begin -->", "<!-- serving:end -->"


@dataclass
class Served:
    """One streamed answer: its text, output tokens, and times from sending it (s); or why it failed."""

    text: str
    tokens: int
    latency: float
    first_token: float
    error: str = ""


@dataclass
class Level:
    """One server at one number of requests in flight."""

    model: str
    server: str
    in_flight: int
    max_tokens: int
    answers: list[Served]
    wall_s: float
    load: float  # the 1-minute load average as the level started: the machine is shared
    same_answers: int | None = None  # prompts answered as transformers serve answered them

    @property
    def served(self) -> list[Served]:
        return [a for a in self.answers if not a.error]

    @property
    def failed(self) -> int:
        return len(self.answers) - len(self.served)

    @property
    def tokens(self) -> int:
        return sum(a.tokens for a in self.served)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    def latency(self, percentile: float) -> float:
        """Of the answers served (nan where none was)."""
        return float(numpy.percentile([a.latency for a in self.served], percentile)) if self.served else float("nan")

    def first_token(self, percentile: float) -> float:
        served = [a.first_token for a in self.served]
        return float(numpy.percentile(served, percentile)) if served else float("nan")


# --------------------------------------------------------------------------- reading a stream


def sse_events(chunks: Iterable[bytes]) -> Iterator[dict]:
    """The JSON of each ``data:`` server-sent event in a byte stream cut anywhere (``[DONE]`` ends it)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *events, pending = pending.split(b"\n\n")
        for event in events:
            data = event.strip().removeprefix(b"data: ")
            if data == b"[DONE]":
                return
            if data:
                yield json.loads(data)


def read_stream(started: float, chunks: Iterable[dict]) -> Served:
    """A chat.completion.chunk stream, timed from ``started``; the last chunk carries the usage."""
    text, tokens, first = "", None, None
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") or ""
            if piece and first is None:
                first = time.perf_counter() - started
            text += piece
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    if tokens is None:
        raise RuntimeError("the stream ended without its usage chunk")
    latency = time.perf_counter() - started
    return Served(text, tokens, latency, latency if first is None else first)


# --------------------------------------------------------------------------- the three servers


def chat_body(messages: list[dict], max_tokens: int) -> dict:
    return {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def session_sender(runtime, session_name: str) -> Callable[[dict], Served]:
    def send(body: dict) -> Served:
        started = time.perf_counter()
        response = runtime.sample_training_session_with_response_stream(
            trainingSessionName=session_name, contentType="application/json", body=json.dumps(body).encode()
        )
        return read_stream(started, sse_events(response["body"].iter_chunks(1024)))

    return send


def endpoint_sender(runtime, endpoint_name: str) -> Callable[[dict], Served]:
    def send(body: dict) -> Served:
        started = time.perf_counter()
        response = runtime.invoke_endpoint_with_response_stream(
            EndpointName=endpoint_name, ContentType="application/json", Body=json.dumps(body)
        )
        parts = (event["PayloadPart"]["Bytes"] for event in response["Body"] if "PayloadPart" in event)
        return read_stream(started, sse_events(parts))

    return send


def openai_sender(client, model: str) -> Callable[[dict], Served]:
    def send(body: dict) -> Served:
        started = time.perf_counter()
        stream = client.chat.completions.create(model=model, **body)
        return read_stream(started, (chunk.model_dump() for chunk in stream))

    return send


def run_level(send: Callable[[dict], Served], bodies: list[dict], in_flight: int) -> tuple[list[Served], float]:
    """Every body sent once, ``in_flight`` at a time; the answers in the bodies' order and the wall time.
    A request that fails (an endpoint answers within SageMaker's 60 s or not at all) is counted as failed."""

    def attempt(body: dict) -> Served:
        sent = time.perf_counter()
        try:
            return send(body)
        except Exception as error:  # noqa: BLE001 - any failure is a figure of the level, not the run's end
            waited = time.perf_counter() - sent
            return Served("", 0, waited, waited, error=f"{type(error).__name__}: {str(error)[:300]}")

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=in_flight) as pool:
        answers = list(pool.map(attempt, bodies))
    return answers, time.perf_counter() - started


def model_path(name: str) -> Path:
    from local_mode import offline_models
    from local_mode.tiny_model import tiny_model_dir

    if name == "tiny":
        return tiny_model_dir()
    if not offline_models.smollm2_installed():
        raise RuntimeError("SmolLM2 is not installed: make .venv/.smollm2-stamp")
    return offline_models.smollm2_dir()


def prompts(count: int) -> list[list[dict]]:
    from environments.gsm8k import GSM8KEnvironment

    env = GSM8KEnvironment()
    examples = env.load(data_dir() / "gsm8k" / "train.jsonl")[:count]
    if len(examples) < count:
        raise ValueError(f"{count} prompts asked for, the offline GSM8K set has {len(examples)}")
    return [env.prompt_messages(example) for example in examples]


@contextlib.contextmanager
def local_servers(name: str, folder: Path) -> Iterator[dict[str, Callable[[dict], Served]]]:
    """The three servers of ``folder``, ready; each stopped (the endpoint deleted) at the end."""
    import boto3
    import openai
    from botocore.config import Config

    from helpers.training_sessions.connect import base_model_arn, create_session_request
    from local_mode import llm_server, session_service

    os.environ.setdefault("SAGEMAKER_LOCAL_SESSION_THREADS", "1")  # read by the service process it starts
    root = Path(tempfile.mkdtemp(prefix="serving-bench-"))
    service = session_service.start_service(root)
    env = service.client_environment()
    boto = boto3.Session(
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=service.region,
    )
    # As many connections as requests in flight, answers that may take minutes, and no retries: a failed
    # request fails the benchmark instead of being sent again.
    config = Config(max_pool_connections=64, read_timeout=900, retries={"total_max_attempts": 1})
    clients = {
        n: boto.client(n, endpoint_url=service.url, config=config)
        for n in ("sagemaker", "s3", "sagemaker-runtime", "sagemakertrainingsessionruntime")
    }
    control = clients["sagemaker"]
    tag = f"serving-{name}-{uuid.uuid4().hex[:6]}"
    endpoint_made = session_made = False
    try:
        # The session, on the hub's entry for the same folder.
        model_id = session_service.TINY_MODEL_ID if name == "tiny" else session_service.SMOLLM2_MODEL_ID
        control.create_training_session(
            **create_session_request(tag, base_model_arn(control, model_id), 8, 16, ROLE, "s3://serving-bench")
        )
        session_made = True
        # The endpoint: the folder as an uncompressed model-data prefix in local S3, a model, a config.
        clients["s3"].create_bucket(Bucket="serving-bench")
        for file in sorted(folder.iterdir()):
            if file.is_file():
                clients["s3"].upload_file(str(file), "serving-bench", f"{tag}/model/{file.name}")
        source = {"S3Uri": f"s3://serving-bench/{tag}/model/", "S3DataType": "S3Prefix", "CompressionType": "None"}
        control.create_model(
            ModelName=tag,
            ExecutionRoleArn=ROLE,
            PrimaryContainer={"Image": TGI_IMAGE, "ModelDataSource": {"S3DataSource": source}},
        )
        variant = {
            "VariantName": "AllTraffic",
            "ModelName": tag,
            "InstanceType": "ml.g5.xlarge",
            "InitialInstanceCount": 1,
        }
        control.create_endpoint_config(EndpointConfigName=tag, ProductionVariants=[variant])
        control.create_endpoint(EndpointName=tag, EndpointConfigName=tag)
        endpoint_made = True
        control.get_waiter("endpoint_in_service").wait(EndpointName=tag, WaiterConfig={"Delay": 1, "MaxAttempts": 600})
        with llm_server.serve(folder, threads=1) as direct:
            client = openai.OpenAI(
                base_url=direct.base_url, api_key=llm_server.LOCAL_API_KEY, timeout=900, max_retries=0
            )
            yield {
                "session": session_sender(clients["sagemakertrainingsessionruntime"], tag),
                "endpoint": endpoint_sender(clients["sagemaker-runtime"], tag),
                BASELINE: openai_sender(client, direct.model),
            }
    finally:
        with contextlib.suppress(Exception):
            if session_made:
                control.stop_training_session(TrainingSessionName=tag)
        if endpoint_made:
            with contextlib.suppress(Exception):
                control.delete_endpoint(EndpointName=tag)
                control.get_waiter("endpoint_deleted").wait(
                    EndpointName=tag, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
                )
        session_service.stop_service(root)


def measure_levels(
    models: list[str], prompt_count: int | None = None, max_tokens: int | None = None, in_flight=IN_FLIGHT, log=print
) -> list[Level]:
    """Every (model, server, number in flight); ``prompt_count`` and ``max_tokens`` default to ``SIZES``."""
    levels = []
    for name in models:
        try:
            folder = model_path(name)
        except RuntimeError as missing:
            log(f"  {name}: skipped ({missing})")
            continue
        default_prompts, default_tokens = SIZES[name]
        count, tokens = prompt_count or default_prompts, max_tokens or default_tokens
        if count < max(in_flight):
            raise ValueError(f"{count} prompts cannot keep {max(in_flight)} requests in flight: send more prompts")
        bodies = [chat_body(messages, tokens) for messages in prompts(count)]
        with local_servers(name, folder) as senders:
            for send in senders.values():
                send(chat_body([{"role": "user", "content": "Hello"}], 2))  # warm-up: first-call allocations
            for count_in_flight in in_flight:
                answers = {}
                for server, send in senders.items():
                    load = os.getloadavg()[0]
                    answers[server], wall = run_level(send, bodies, count_in_flight)
                    level = Level(name, server, count_in_flight, tokens, answers[server], wall, load)
                    levels.append(level)
                    log(
                        f"  serving {name}, {server}, {count_in_flight} in flight: {level.tokens_per_s:.1f} tokens/s, "
                        f"p50 {level.latency(50):.2f} s, p99 {level.latency(99):.2f} s, {level.failed} failed"
                        + (f" ({next(a.error for a in level.answers if a.error)})" if level.failed else "")
                        + f" (load {level.load:.1f})"
                    )
                reference = [a.text for a in answers[BASELINE]]
                for level in levels[-len(senders) :]:
                    level.same_answers = sum(a.text == r for a, r in zip(level.answers, reference, strict=True))
    return levels


# --------------------------------------------------------------------------- tables


def serving_table(levels: list[Level]) -> str:
    """The benchmark's own table: one line per model, server and number of requests in flight."""
    lines = [
        "| model | server | in flight | requests | failed | output tokens | tokens/s | vs transformers serve | p50 latency s | p99 latency s | p50 TTFT s | same answers | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    baselines = {(b.model, b.in_flight): b for b in levels if b.server == BASELINE}
    for level in levels:
        baseline = baselines.get((level.model, level.in_flight))
        ratio = f"{level.tokens_per_s / baseline.tokens_per_s:.2f}" if baseline else "-"
        lines.append(
            f"| {level.model} | {level.server} | {level.in_flight} | {len(level.answers)} | {level.failed} | {level.tokens} | "
            f"{level.tokens_per_s:.1f} | {ratio} | {level.latency(50):.3f} | {level.latency(99):.3f} | "
            f"{level.first_token(50):.3f} | {level.same_answers}/{len(level.answers)} | {level.load:.1f} |"
        )
    return "\n".join(lines) + "\n"


def rows(levels: list[Level]) -> list[Row]:
    """The combined table's rows (``make bench``): each of our servers against transformers serve."""
    baselines = {(b.model, b.in_flight): b for b in levels if b.server == BASELINE}
    out = []
    for level in levels:
        baseline = baselines.get((level.model, level.in_flight))
        if level.server == BASELINE or baseline is None:
            continue
        out.append(
            Row(
                "serving: output tokens/s",
                f"{level.model}, {level.server}, {level.in_flight} in flight, {len(level.answers)} requests",
                level.tokens_per_s,
                "tokens/s",
                baseline.tokens_per_s,
                BASELINE,
                notes=f"latency p50/p99 {level.latency(50):.3f}/{level.latency(99):.3f} s vs "
                f"{baseline.latency(50):.3f}/{baseline.latency(99):.3f} s; TTFT p50 {level.first_token(50):.3f} vs "
                f"{baseline.first_token(50):.3f} s; {level.tokens} vs {baseline.tokens} tokens; same answers "
                f"{level.same_answers}/{len(level.answers)}; failed {level.failed} vs {baseline.failed}; load {level.load:.1f}",
                extra={"p50_s": level.latency(50), "p99_s": level.latency(99), "ttft_p50_s": level.first_token(50)},
            )
        )
    return out


def measure(models: list[str], prompt_count: int | None = None, max_tokens: int | None = None, log=print) -> list[Row]:
    return rows(measure_levels(models, prompt_count, max_tokens, log=log))


def report(levels: list[Level], command: str) -> str:
    """The table with how it was made and on what: what ``--write`` puts between the markers."""
    now = datetime.datetime.now(datetime.UTC).strftime("%d %B %Y, %H:%M UTC")
    sizes = {(level.model, len(level.answers), level.max_tokens): None for level in levels}
    asked = "; ".join(f"{model}: {n} prompts, max_tokens {tokens}" for model, n, tokens in sizes)
    machine = machine_description(threads=1)  # each server computes on one torch thread
    return (
        f"`{command}`, {now}. Machine: {machine}. {asked}, greedy, streamed; load: the 1-minute "
        "load average as each line started.\n\n" + serving_table(levels)
    )


def write_between_markers(path: Path, block: str) -> None:
    """``block`` in place of what lies between ``BEGIN`` and ``END`` in ``path``."""
    from tools.results_table import replace_between_markers

    path.write_text(replace_between_markers(path.read_text(), block, BEGIN, END))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=list(SIZES))
    parser.add_argument("--prompts", type=int, help="prompts per level (default: 32 tiny, 16 SmolLM2)")
    parser.add_argument("--max-tokens", type=int, help="max_tokens of every request (default: 64 tiny, 32 SmolLM2)")
    parser.add_argument("--in-flight", type=int, nargs="+", default=list(IN_FLIGHT))
    parser.add_argument("--write", type=Path, help=f"put the table between {BEGIN} and {END} in this file")
    args = parser.parse_args(argv)
    levels = measure_levels(args.models, args.prompts, args.max_tokens, tuple(args.in_flight))
    command = " ".join(["python -m bench.serving", *(sys.argv[1:] if argv is None else argv)])
    text = report(levels, command)
    print(text)
    if args.write:
        write_between_markers(args.write, text)
        print(f"written to {args.write}")


if __name__ == "__main__":
    main()
