"""SampleTrainingSession and SampleTrainingSessionWithResponseStream: a chat with a session's model.

The service passes the request body to the model's inference host as it is, and its answer back. The
host here takes what a vLLM-based host takes: an OpenAI chat-completions request
(``{"messages": [...], "max_tokens": ..., "temperature": ..., "stream": ...}``), and answers a
``chat.completion`` object, or, on the streaming operation, ``chat.completion.chunk`` events as
server-sent events (``data: {...}`` lines, then ``data: [DONE]``), which botocore hands back as the
operation's streaming body.

The prompt is the messages through the base model's chat template, with the generation prompt
added; the answer comes from the session engine's own sampler, so a greedy chat answer is token for
token the answer ``sample`` gives the same prompt at temperature 0. The local endpoint computes the
answer before it streams it: the events and their token deltas are what a host sends, their timing
is not.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterator

from local_mode.validation import ServiceError

DEFAULT_MAX_TOKENS = 256  # when the body names none (vLLM's default is the context's room)
MAX_CHOICES = 16  # ``n``: the engine's passes hold at most this many samples of one request
MAX_STOP_SEQUENCES = 4  # as OpenAI's API takes them
ROLES = ("system", "user", "assistant", "tool")
READS = (
    "Send an OpenAI chat-completions body: "
    '{"messages": [{"role": "user", "content": "..."}], "max_tokens": 64, "temperature": 0}.'
)


def _refuse(problem: str) -> None:
    raise ServiceError("ValidationException", f"The model could not read the request body: {problem}. {READS}")


def _number(body: dict, name: str, default, low: float, high: float, whole: bool = False):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _refuse(f"{name} is {value!r}, not a finite number")
    if whole and value != int(value):
        _refuse(f"{name} is {value!r}, not a whole number")
    if not low <= value <= high:
        _refuse(f"{name} is {value}, outside [{low}, {high}]")
    return int(value) if whole else float(value)


def _content(message: dict, index: int) -> str:
    """A message's text: a string, or a list of text parts (images and audio are not read here)."""
    content = message.get("content")
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    _refuse(f"messages[{index}].content must be a string or a list of text parts, got {content!r:.80}")


def read_chat_request(body: bytes, content_type: str | None) -> dict:
    """The chat-completions request in ``body``, checked: a ValidationException names what is wrong."""
    if content_type and content_type.split(";")[0].strip().lower() != "application/json":
        _refuse(f"its Content-Type is {content_type!r}; send application/json")
    try:
        request = json.loads(body or b"")
    except (ValueError, RecursionError):
        _refuse("it is not JSON")
    if not isinstance(request, dict):
        _refuse("it is JSON but not an object")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        _refuse("messages must be a non-empty list")
    chat = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            _refuse(f"messages[{index}] must be an object whose role is one of {', '.join(ROLES)}")
        chat.append({"role": message["role"], "content": _content(message, index)})
    stop = request.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > MAX_STOP_SEQUENCES or not all(isinstance(s, str) and s for s in stop):
        _refuse(f"stop must be a string or a list of at most {MAX_STOP_SEQUENCES} non-empty strings")
    stream = request.get("stream", False)
    if not isinstance(stream, bool):
        _refuse(f"stream is {stream!r}, not true or false")
    logprobs = request.get("logprobs", False)
    if not isinstance(logprobs, bool):
        _refuse(f"logprobs is {logprobs!r}, not true or false")
    max_tokens_name = "max_completion_tokens" if request.get("max_completion_tokens") is not None else "max_tokens"
    seed = request.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        _refuse(f"seed is {seed!r}, not a whole number")
    return {
        "messages": chat,
        "max_tokens": _number(request, max_tokens_name, DEFAULT_MAX_TOKENS, 1, 2**31 - 1, whole=True),
        "temperature": _number(request, "temperature", 1.0, 0.0, 2.0),
        "top_p": _number(request, "top_p", 1.0, 1e-9, 1.0),
        "n": _number(request, "n", 1, 1, MAX_CHOICES, whole=True),
        "seed": seed,
        "stop": stop,
        "stream": stream,
        "logprobs": logprobs,
        "model": request.get("model") if isinstance(request.get("model"), str) else None,
    }


def prompt_tokens(tokenizer, messages: list[dict]) -> list[int]:
    """The messages as the model reads them: its chat template, then the assistant's turn opened."""
    try:
        tokens = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except Exception as error:  # noqa: BLE001 - a template that refuses the turns (order, roles) says why
        _refuse(f"the model's chat template refused the messages ({str(error).splitlines()[0][:200]})")
    if isinstance(tokens, dict) or hasattr(tokens, "keys"):  # transformers 5 returns a BatchEncoding
        tokens = tokens["input_ids"]
    return list(tokens)


def sampling_params(request: dict) -> dict:
    """The engine's ``samplingParams`` for the request (Tinker's names, as ExecuteSamplingOperation)."""
    params = {
        "maxTokens": request["max_tokens"],
        "temperature": request["temperature"],
        "topP": request["top_p"],
        "stop": request["stop"],
    }
    if request["seed"] is not None:
        params["seed"] = request["seed"]
    return params


def answer_text(tokens: list[int], tokenizer, stop: list[str]) -> str:
    """A sample's text as the chat shows it: no special tokens, and nothing from a stop string on."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    cuts = [text.find(s) for s in stop if s in text]
    return text[: min(cuts)] if cuts else text


def _token_logprobs(tokens: list[int], logprobs: list[float], tokenizer) -> dict:
    return {
        "content": [
            {"token": tokenizer.decode([token]), "logprob": logprob, "top_logprobs": []}
            for token, logprob in zip(tokens, logprobs, strict=True)
        ]
    }


def completion(request: dict, samples: list[dict], tokenizer, model: str, prompt_length: int) -> dict:
    """The ``chat.completion`` object for the engine's samples of one request."""
    choices = []
    for index, sample in enumerate(samples):
        choice = {
            "index": index,
            "message": {"role": "assistant", "content": answer_text(sample["tokens"], tokenizer, request["stop"])},
            "finish_reason": "stop" if sample["stopReason"] == "stop" else "length",
        }
        if request["logprobs"]:
            choice["logprobs"] = _token_logprobs(sample["tokens"], sample["logprobs"], tokenizer)
        choices.append(choice)
    completion_tokens = sum(len(s["tokens"]) for s in samples)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_length,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_length + completion_tokens,
        },
    }


def stream_events(answer: dict, tokenizer, samples: list[dict]) -> Iterator[bytes]:
    """``answer`` (a ``chat.completion``) as server-sent ``chat.completion.chunk`` events: the role, then
    one event per token of text, then the finish reason, the usage, and ``[DONE]``."""
    head = {
        "id": answer["id"],
        "object": "chat.completion.chunk",
        "created": answer["created"],
        "model": answer["model"],
    }

    def event(choices: list[dict], **extra) -> bytes:
        return b"data: " + json.dumps({**head, "choices": choices, **extra}).encode() + b"\n\n"

    for choice, sample in zip(answer["choices"], samples, strict=True):
        index, text = choice["index"], choice["message"]["content"]
        yield event([{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        for piece in _pieces(sample["tokens"], tokenizer, text):
            yield event([{"index": index, "delta": {"content": piece}, "finish_reason": None}])
        yield event([{"index": index, "delta": {}, "finish_reason": choice["finish_reason"]}])
    yield event([], usage=answer["usage"])
    yield b"data: [DONE]\n\n"


def _pieces(tokens: list[int], tokenizer, text: str) -> Iterator[str]:
    """The text each token adds, decoded as a stream decodes it (a character split across tokens
    comes with the token that completes it), and nothing past ``text`` (a stop string's cut)."""
    sent = ""
    for end in range(1, len(tokens) + 1):
        so_far = tokenizer.decode(tokens[:end], skip_special_tokens=True)
        if so_far.endswith("\ufffd"):
            continue  # an incomplete character: wait for the token that completes it
        so_far = so_far[: len(text)]
        if len(so_far) > len(sent):
            yield so_far[len(sent) :]
            sent = so_far
    if len(text) > len(sent):
        yield text[len(sent) :]
