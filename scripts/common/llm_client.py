"""One client for teacher and judge models behind any OpenAI-compatible chat-completions endpoint.

Built on the official ``openai`` package (``AsyncOpenAI``). Configured by the standard variables
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (or the same as arguments), so any provider, aggregator or
local server works by changing those two. What it adds around the package, and what each guarantees:

- **a concurrency cap**: at most ``max_concurrency`` requests in flight;
- **rate limits** in requests and tokens per minute, each a token bucket that a request waits on
  before it is sent. A bucket holds one second's worth of its rate (at least one unit) and refills
  continuously, so requests are spread over the minute as providers count them (by the second): in
  any ``t`` seconds at most ``rate * t`` units are sent, plus one second's worth. At 60 requests a
  minute that is one request a second, never the whole minute's 60 at once. A request larger than the
  tokens bucket waits for a full bucket and leaves it in debt, which later requests wait out;
- **retries**: a 429, a 5xx, a timeout, a lost connection, a body that is not JSON and a 200 without
  choices are retried up to ``max_retries`` times with exponential backoff (``backoff_s`` doubling, at
  most ``max_backoff_s``), or after the server's ``Retry-After`` when it sends one. Other 4xx (a bad
  key, an unknown model) are not retried. The package's own retries are off (``max_retries=0``): it
  does not retry a malformed 200, and its attempts could not be counted;
- **a deadline per attempt** (``timeout_s``): one attempt's whole HTTP exchange, from sending the
  request to the last byte of the answer, ends within ``timeout_s`` (plus the event loop's reaction
  time). A server that trickles its answer cannot stretch it: the attempt is cut, counted as a timeout
  and retried like one;
- **a content-addressed cache on disk**: the key is the SHA-256 of the request's body (model,
  messages, every sampling parameter); the answer is written atomically (temporary file, then
  ``os.replace``), so the same request gets the same answer with no second charge across a kernel
  restart or a resumed job. Give distinct ``seed`` values to get distinct samples of one prompt. An
  entry that cannot be read back whole (cut short, not UTF-8, not JSON, JSON of another shape, or the
  record of another request) is a miss: counted in ``usage.damaged_cache_entries``, and replaced by
  the fresh answer;
- **a budget** in tokens and/or dollars: once spent, no further request is sent and ``BudgetExceeded``
  (a ``UserError``: a job's failure file says it) is raised. Requests already in flight still finish,
  so a run can pass its budget by at most ``max_concurrency`` answers;
- **accounting** for the run (``client.usage``): requests, cache hits, API attempts, retries, failures,
  parse failures, prompt and completion tokens and their cost. Where the server sends no usable
  ``usage`` (none, null fields, negative or non-numeric counts) the missing count is estimated as one
  token per 4 characters (rounded up; the prompt's from its messages' text, the completion's from the
  answer's), and the estimate is counted, charged and held against the budget like a reported count,
  and said as an estimate: ``estimated_prompt_tokens`` and ``estimated_completion_tokens`` are the
  estimated parts of ``prompt_tokens`` and ``completion_tokens``, ``answers_without_usage`` the answers
  they came from. A malformed ``usage`` is never an error: no request, and no batch, is lost to it;
- **structured answers** (``complete_structured``): the text goes through a strict parser (a function
  that returns the value or raises ``ParseError`` or another ``ValueError``; ``json_object`` checks a JSON object against a
  field -> type schema). A parse failure is counted and returned as ``ok=False`` with its reason, for
  the caller to exclude: never turned into a score.

The client runs its own event loop in a background thread, so the same object serves async code
(``await client.complete(...)``, in a notebook) and plain code (``client.complete_many([...])``, in a
job script's ``score``).

**The key is never repeated.** It is never logged, cached or shown by ``repr``, and every message this
module raises (``LLMRequestFailed``) or logs is redacted of every secret the process has given it: the
API key of each client and every value read from Secrets Manager (``api_key_from_secret``), whatever
the server echoed. Redacted are the whole secret, any run of 8 or more of its characters (its first
or last 8, say), and a masked echo such as ``sk-abc...wxyz`` or ``sk-proj-****wxyz`` (at least its
first 3 or its last 4 characters around asterisks, dots or an ellipsis); a secret shorter than 8
characters (a local server's placeholder) where it stands as a whole word, and one shorter than 4
characters not at all (no provider issues one; redacting it would blank ordinary words). While the
secret is read, no library's DEBUG record is written at all (botocore logs the response body at DEBUG).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import email.utils
import hashlib
import json
import logging
import math
import os
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common.contract import UserError, default_checkpoint_dir

log = logging.getLogger("common.llm_client")


# --------------------------------------------------------------------------- redaction

SHORTEST_ECHO = 8  # a run of this many of a secret's characters is redacted wherever it appears
SHORTEST_SECRET = 4  # shorter "keys" are a local server's placeholders; redacting them would blank words
REDACTED = "[REDACTED]"
_secrets: set[str] = set()
_secrets_lock = threading.Lock()
# Masks providers put inside an echoed key: "sk-abc...wxyz", "sk-proj-****wxyz", "sk-a…wxyz", "sk-••••wxyz".
_MASK = re.compile(r"\*{2,}|\.{2,}|…|•+")
_TOKEN = re.compile(r"[^\s\"'`,;()\[\]{}<>]+")


def register_secret(secret: str | None) -> None:
    """Redact ``secret`` from every message this module raises or logs from now on, in this process."""
    if secret and len(secret.strip()) >= SHORTEST_SECRET:
        with _secrets_lock:
            _secrets.add(secret.strip())


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by ``[REDACTED]``: the whole secret, any run of
    ``SHORTEST_ECHO`` or more of its characters, and a masked echo (the secret's first 3 or more or its
    last 4 or more characters around a mask of asterisks, dots or an ellipsis); a secret shorter than
    ``SHORTEST_ECHO`` only where it stands as a whole word. A "secret" shorter than ``SHORTEST_SECRET``
    is not registered: no provider issues one, and blanking it would blank ordinary words."""
    with _secrets_lock:
        known = sorted(_secrets)
    if not known or not text:
        return text
    spans: list[tuple[int, int]] = []
    for secret in known:
        if len(secret) < SHORTEST_ECHO:
            word = re.compile(rf"(?<![\w-]){re.escape(secret)}(?![\w-])")
            spans += [m.span() for m in word.finditer(text)]
            continue
        pieces = {secret[i : i + SHORTEST_ECHO] for i in range(len(secret) - SHORTEST_ECHO + 1)}
        spans += [
            (i, i + SHORTEST_ECHO)
            for i in range(len(text) - SHORTEST_ECHO + 1)
            if text[i : i + SHORTEST_ECHO] in pieces
        ]
        spans += _masked_echoes(text, secret)
    if not spans:
        return text
    spans.sort()
    merged = [list(spans[0])]
    for start, end in spans[1:]:
        if start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    out, at = [], 0
    for start, end in merged:
        out += [text[at:start], REDACTED]
        at = end
    return "".join(out) + text[at:]


def _masked_echoes(text: str, secret: str) -> list[tuple[int, int]]:
    """The spans of ``text`` that show ``secret`` masked: a word with a mask inside, whose part before
    the mask ends with the secret's first 3+ characters or whose part after it starts with its last 4+."""
    spans = []
    for word in _TOKEN.finditer(text):
        masks = list(_MASK.finditer(word.group()))
        if not masks:
            continue
        head, tail = word.group()[: masks[0].start()], word.group()[masks[-1].end() :]
        start = end = None
        for i in range(len(head) - 2):  # the longest end of head that the secret starts with
            if secret.startswith(head[i:]):
                start = word.start() + i
                break
        for j in range(len(tail), 3, -1):  # the longest start of tail that the secret ends with
            if secret.endswith(tail[:j]):
                end = word.start() + masks[-1].end() + j
                break
        if start is not None or end is not None:
            first_mask, last_mask = word.start() + masks[0].start(), word.start() + masks[-1].end()
            spans.append((start if start is not None else first_mask, end if end is not None else last_mask))
    return spans


class _Redacting(logging.Filter):
    """Redacts the records of this module's logger (see ``redact``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return True


log.addFilter(_Redacting())


@contextlib.contextmanager
def _no_debug_records():
    """No DEBUG record from any logger of this process while inside: botocore logs a response's body
    (a secret's value) at DEBUG, and so might the libraries under it. Records of INFO and above pass."""
    previous = logging.root.manager.disable
    logging.disable(max(previous, logging.DEBUG))
    try:
        yield
    finally:
        logging.disable(previous)


class BudgetExceeded(UserError):
    """The run has spent its token or dollar budget; no further request is sent."""


class LLMRequestFailed(RuntimeError):
    """A request failed after its retries, or with an error that retrying cannot fix. Its message is
    redacted of every registered secret (``redact``), whatever the server said."""

    def __init__(self, message: str):
        super().__init__(redact(message))


class _MalformedAnswer(ValueError):
    """A 200 whose body is not a usable completion (retried)."""


class ParseError(ValueError):
    """A structured answer does not have the form its parser requires."""


@dataclasses.dataclass
class Usage:
    """What the run has asked and spent. ``requests`` are logical requests (each answered once, from
    the cache or the API); ``api_calls`` are HTTP attempts, ``retries`` the attempts after the first."""

    requests: int = 0
    cached_hits: int = 0
    api_calls: int = 0
    retries: int = 0
    failures: int = 0
    parse_failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_dollars: float = 0.0
    # The estimated parts of prompt_tokens and completion_tokens (the server sent no usable count), and
    # the answers they came from; cache entries that could not be read back and were asked again.
    estimated_prompt_tokens: int = 0
    estimated_completion_tokens: int = 0
    answers_without_usage: int = 0
    damaged_cache_entries: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "total_tokens": self.total_tokens}

    def report(self) -> str:
        text = (
            f"requests {self.requests} (cached hits {self.cached_hits}), API calls {self.api_calls} "
            f"(retries {self.retries}), failures {self.failures}, parse failures {self.parse_failures}, "
            f"tokens {self.prompt_tokens} in + {self.completion_tokens} out, cost ${self.cost_dollars:.4f}"
        )
        if self.answers_without_usage:
            text += (
                f"; of those tokens {self.estimated_prompt_tokens} in + {self.estimated_completion_tokens} out "
                f"are estimates (4 characters a token) for {self.answers_without_usage} answers without usage"
            )
        if self.damaged_cache_entries:
            text += f"; {self.damaged_cache_entries} damaged cache entries asked again"
        return text


@dataclasses.dataclass(frozen=True)
class Completion:
    """One answer: its text, why generation stopped, its tokens, and whether it came from the cache.
    A token count the server did not give is an estimate (4 characters a token), and says so."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached: bool
    prompt_tokens_estimated: bool = False
    completion_tokens_estimated: bool = False


@dataclasses.dataclass(frozen=True)
class Structured:
    """A parsed answer: ``value`` when ``ok``, else ``error`` says why the text was refused."""

    ok: bool
    value: Any
    error: str | None
    completion: Completion | None


# --------------------------------------------------------------------------- strict parsers


def json_object(schema: dict[str, type | tuple[type, ...]]) -> Callable[[str], dict]:
    """A strict parser: the whole answer (one fenced ```json block allowed around it) must be one JSON
    object with exactly the fields of ``schema``, each of its type (``bool`` is not an ``int`` here)."""

    def parse(text: str) -> dict:
        body = text.strip()
        if body.startswith("```"):
            lines = body.splitlines()
            if len(lines) < 3 or lines[-1].strip() != "```":
                raise ParseError("an unclosed code fence around the JSON object")
            body = "\n".join(lines[1:-1])
        try:
            value = json.loads(body)
        except json.JSONDecodeError as error:
            raise ParseError(f"not JSON ({error.msg} at character {error.pos})") from None
        if not isinstance(value, dict):
            raise ParseError(f"a JSON {type(value).__name__}, not an object")
        if set(value) != set(schema):
            raise ParseError(f"fields {sorted(value)}, expected exactly {sorted(schema)}")
        for name, kind in schema.items():
            kinds = kind if isinstance(kind, tuple) else (kind,)
            field = value[name]
            if isinstance(field, bool) and bool not in kinds or not isinstance(field, kinds):
                raise ParseError(f"field {name!r} is {type(field).__name__}, expected {kind}")
        return value

    return parse


# --------------------------------------------------------------------------- rate limits


class TokenBucket:
    """``per_minute`` units a minute, spread over the minute: the bucket holds one second's worth (at
    least one unit) and refills continuously, so in any ``t`` seconds at most ``capacity + rate * t``
    units are taken. ``take`` waits until the bucket holds ``amount`` and returns what it took (an
    amount larger than the bucket waits for a full one and takes it all); ``adjust`` corrects what was
    taken once the real amount is known (the level may go below zero: later takers wait longer)."""

    def __init__(self, per_minute: float):
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate)
        self.level = self.capacity
        self.updated = time.monotonic()
        self.lock = asyncio.Lock()

    def _refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    async def take(self, amount: float) -> float:
        amount = min(amount, self.capacity)
        async with self.lock:  # first come, first served
            self._refill()
            while self.level < amount:
                await asyncio.sleep((amount - self.level) / self.rate)
                self._refill()
            self.level -= amount
        return amount

    def adjust(self, extra: float) -> None:
        self._refill()
        self.level -= extra


# --------------------------------------------------------------------------- the client

RETRYABLE_STATUS = {408, 409, 429}  # and every 5xx


def estimate_tokens(text: str) -> int:
    """A token count without a tokenizer: one token per 4 characters, rounded up."""
    return math.ceil(len(text) / 4)


def _messages_text(messages: Sequence[dict]) -> str:
    """The text of a conversation's messages (a content given as parts counts its text parts)."""
    texts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            texts += [str(part.get("text", "")) for part in content if isinstance(part, dict)]
        elif content is not None:
            texts.append(str(content))
    return "".join(texts)


def _token_count(value) -> int | None:
    """A usage field as a count of tokens, or None where it is not one (null, negative, not a number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, float) and math.isfinite(value) and value >= 0 and value.is_integer():
        return int(value)
    return None


def _refusal_reason(error) -> str:
    """What the endpoint said about a refused request: the openai package's message, and the body's
    ``message`` or ``detail`` when the message lacks it (servers that answer ``{"detail": ...}``)."""
    body = error.body
    said = body.get("message") or body.get("detail") if isinstance(body, dict) else body
    if said and str(said) not in error.message:
        return f"{error.message} ({str(said)[:500]})"
    return error.message


def _retry_after_seconds(headers) -> float | None:
    """The server's ``Retry-After`` (seconds or an HTTP date) or ``retry-after-ms``, if any."""
    if headers is None:
        return None
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return float(milliseconds) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value)
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


class LLMClient:
    """A chat-completions client with the limits, retries, cache, budget and accounting of the module
    docstring. ``model`` is the endpoint's model name; ``cache_dir=None`` turns the cache off.
    Prices are dollars per million tokens (0: only tokens are accounted)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        cache_dir: str | Path | None = None,
        max_concurrency: int = 8,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        max_retries: int = 4,
        timeout_s: float = 60.0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        budget_tokens: int | None = None,
        budget_dollars: float | None = None,
        input_price_per_million: float = 0.0,
        output_price_per_million: float = 0.0,
    ):
        import openai  # imported here so that a script that never asks a model does not need it

        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        if not self.base_url:
            raise UserError(
                "No endpoint: set OPENAI_BASE_URL to the OpenAI-compatible API's base URL "
                "(for example http://127.0.0.1:8000/v1), or pass base_url."
            )
        api_key = api_key or os.environ.get("OPENAI_API_KEY")
        if not api_key:
            raise UserError(
                "No API key: set OPENAI_API_KEY (a local server accepts any text), or pass api_key; "
                "a training job reads it from AWS Secrets Manager (--llm_api_key_secret)."
            )
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise UserError("max_concurrency must be >= 1, max_retries >= 0 and timeout_s > 0.")
        self.model = model
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.budget_tokens = budget_tokens
        self.budget_dollars = budget_dollars
        self.input_price = input_price_per_million / 1e6
        self.output_price = output_price_per_million / 1e6
        self.usage = Usage()
        self._openai = openai
        register_secret(api_key)  # whatever a server echoes of it, no message of this module repeats it
        for name in ("httpx", "httpx2"):  # the HTTP client's line per request would drown a notebook's output
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)
        # Everything async lives on one loop in a daemon thread: the HTTP client, the semaphore and
        # the buckets are bound to a loop, and this one serves notebooks and scripts alike.
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="llm-client", daemon=True)
        self._thread.start()

        async def build():  # loop-bound objects, made on their loop
            self._api = openai.AsyncOpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=timeout_s)
            self._slots = asyncio.Semaphore(max_concurrency)
            self._requests_bucket = TokenBucket(requests_per_minute) if requests_per_minute else None
            self._tokens_bucket = TokenBucket(tokens_per_minute) if tokens_per_minute else None

        self._on_loop(build()).result()

    def __repr__(self) -> str:  # never the key
        return f"LLMClient(model={self.model!r}, base_url={self.base_url!r}, cache_dir={str(self.cache_dir)!r})"

    # ---- the loop in the background thread

    def _on_loop(self, coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._on_loop(self._api.close()).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- public calls

    async def complete(self, messages: Sequence[dict], **params) -> Completion:
        """One answer to ``messages``; ``params`` are chat-completion parameters (``max_tokens``,
        ``temperature``, ``seed``, ...). From the cache when this exact request was answered before."""
        return await asyncio.wrap_future(self._on_loop(self._complete(list(messages), params)))

    async def complete_structured(self, messages: Sequence[dict], parse: Callable[[str], Any], **params) -> Structured:
        """``complete`` and then ``parse`` the text; a ``ParseError`` is counted and returned as ``ok=False``."""
        completion = await self.complete(messages, **params)
        return self._parsed(completion, parse)

    def complete_many(
        self,
        requests: Sequence[Sequence[dict]],
        return_exceptions: bool = False,
        per_request: Sequence[dict] | None = None,
        **params,
    ) -> list[Completion | Exception]:
        """Blocking: one answer per message list, sent concurrently (within the cap and the limits).
        ``per_request`` (one dict per request, such as ``{"seed": i}``) adds to ``params``.
        With ``return_exceptions`` a request that failed after its retries gives its ``LLMRequestFailed``
        in its place; ``BudgetExceeded`` is always raised."""
        extra = per_request if per_request is not None else [{}] * len(requests)
        if len(extra) != len(requests):
            raise ValueError(f"{len(extra)} per_request entries for {len(requests)} requests")

        async def gather():
            calls = (self._complete(list(m), {**params, **e}) for m, e in zip(requests, extra, strict=True))
            return await asyncio.gather(*calls, return_exceptions=True)

        results = self._on_loop(gather()).result()
        for result in results:
            if isinstance(result, BudgetExceeded) or (isinstance(result, BaseException) and not return_exceptions):
                raise result
            if isinstance(result, BaseException) and not isinstance(result, LLMRequestFailed):
                raise result
        return results

    def complete_structured_many(
        self, requests: Sequence[Sequence[dict]], parse: Callable[[str], Any], **params
    ) -> list[Structured]:
        """Blocking ``complete_structured`` over many message lists. A request that failed after its
        retries is ``ok=False`` with ``completion=None`` (counted in ``usage.failures``, not as a parse failure)."""
        results = self.complete_many(requests, return_exceptions=True, **params)
        return [
            Structured(False, None, f"request failed: {r}", None)
            if isinstance(r, Exception)
            else self._parsed(r, parse)
            for r in results
        ]

    def write_usage(self, path: str | Path) -> Path:
        """The run's accounting as JSON (for a job's output folder or a notebook's summary)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.usage.as_dict(), indent=2) + "\n")
        return path

    # ---- internals

    def _parsed(self, completion: Completion, parse: Callable[[str], Any]) -> Structured:
        try:
            return Structured(True, parse(completion.text), None, completion)
        except ValueError as error:  # ParseError, or any ValueError a caller's parser raises
            self.usage.parse_failures += 1  # one thread (the caller's) counts these
            return Structured(False, None, redact(str(error)), completion)  # a reason may quote the answer

    def cache_key(self, messages: list[dict], params: dict) -> str:
        # The request's body, not the endpoint's address: a local server's port changes from run to run.
        # Point providers that give one model name to different models at different cache folders.
        request = {"model": self.model, "messages": messages, "params": params}
        return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def _cache_path(self, key: str) -> Path:
        return self.cache_dir / key[:2] / f"{key}.json"

    def _cache_read(self, key: str) -> Completion | None:
        """The cached answer to the request ``key`` names, or None: a miss where there is none, and
        where the entry is damaged (counted, and replaced by the fresh answer)."""
        if self.cache_dir is None:
            return None
        path = self._cache_path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            return self._damaged(path, f"unreadable: {error.strerror or error}")
        try:
            return self._cached_completion(json.loads(data.decode("utf-8")), key)
        except UnicodeDecodeError:
            return self._damaged(path, "not UTF-8 text: cut short or overwritten")
        except json.JSONDecodeError as error:
            return self._damaged(path, f"not JSON: {error.msg} at character {error.pos}")
        except _MalformedAnswer as error:
            return self._damaged(path, str(error))

    def _cached_completion(self, record, key: str) -> Completion:
        """The completion a cache record holds; ``_MalformedAnswer`` where it is not a whole record of
        the request ``key`` names."""
        if not isinstance(record, dict) or not isinstance(record.get("answer"), dict):
            raise _MalformedAnswer("not a cache record (no answer object)")
        try:
            request = {"model": record["model"], "messages": record["messages"], "params": record["params"]}
            recorded = json.dumps(request, sort_keys=True, ensure_ascii=False).encode()
        except (KeyError, TypeError, ValueError):
            raise _MalformedAnswer("the record lacks its request (model, messages, params)") from None
        if hashlib.sha256(recorded).hexdigest() != key:
            raise _MalformedAnswer("the record is of another request")
        answer = record["answer"]
        counts = [_token_count(answer.get(name)) for name in ("prompt_tokens", "completion_tokens")]
        flags = [answer.get(name, False) for name in ("prompt_tokens_estimated", "completion_tokens_estimated")]
        finish = answer.get("finish_reason")
        if not isinstance(answer.get("text"), str) or not (finish is None or isinstance(finish, str)):
            raise _MalformedAnswer("the answer's text or finish_reason is not text")
        if None in counts or any(isinstance(c, float) for c in [answer["prompt_tokens"], answer["completion_tokens"]]):
            raise _MalformedAnswer("the answer's token counts are not counts")
        if not all(isinstance(flag, bool) for flag in flags):
            raise _MalformedAnswer("the answer's estimate flags are not true or false")
        return Completion(
            answer["text"],
            finish,
            *counts,
            cached=True,
            prompt_tokens_estimated=flags[0],
            completion_tokens_estimated=flags[1],
        )

    def _damaged(self, path: Path, reason: str) -> None:
        self.usage.damaged_cache_entries += 1
        log.warning("Ignoring the damaged cache entry %s (%s): asking again, and replacing it.", path, reason)
        return None

    def _cache_write(self, key: str, messages: list[dict], params: dict, completion: Completion) -> None:
        """Write the answer atomically (a reader sees the old entry or the new one, whole). A write that
        fails is a warning, not a lost answer: the answer was paid for, and the caller gets it."""
        if self.cache_dir is None:
            return
        path = self._cache_path(key)
        answer = dataclasses.asdict(completion)
        del answer["cached"]
        record = {"model": self.model, "messages": messages, "params": params, "answer": answer}
        temporary = path.with_name(f".{key}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_bytes(json.dumps(record, ensure_ascii=False).encode("utf-8"))
            os.replace(temporary, path)
        except OSError as error:
            temporary.unlink(missing_ok=True)
            log.warning("Could not cache an answer in %s (%s): it will be asked again next run.", path, error)

    def _check_budget(self) -> None:
        usage = self.usage
        if self.budget_tokens is not None and usage.total_tokens >= self.budget_tokens:
            raise BudgetExceeded(
                f"Token budget spent: {usage.total_tokens} of {self.budget_tokens} tokens used "
                f"({usage.requests} requests). Raise the budget (budget_tokens) or ask fewer questions; "
                "answers already received are in the cache and cost nothing when asked again."
            )
        if self.budget_dollars is not None and usage.cost_dollars >= self.budget_dollars:
            raise BudgetExceeded(
                f"Dollar budget spent: ${usage.cost_dollars:.4f} of ${self.budget_dollars:.4f} "
                f"({usage.total_tokens} tokens). Raise the budget (budget_dollars) or ask fewer questions; "
                "answers already received are in the cache and cost nothing when asked again."
            )

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_backoff_s)
        return min(self.max_backoff_s, self.backoff_s * 2**attempt) * (0.5 + random.random() / 2)

    async def _complete(self, messages: list[dict], params: dict) -> Completion:
        key = self.cache_key(messages, params)
        cached = self._cache_read(key)
        if cached is not None:
            self.usage.requests += 1
            self.usage.cached_hits += 1
            return cached
        async with self._slots:
            self._check_budget()
            prompt_estimate = estimate_tokens(_messages_text(messages))
            if self._requests_bucket:
                await self._requests_bucket.take(1)
            if self._tokens_bucket:
                taken = await self._tokens_bucket.take(prompt_estimate + params.get("max_tokens", 256))
            completion = await self._send(messages, params, prompt_estimate)
            if self._tokens_bucket:
                self._tokens_bucket.adjust(completion.prompt_tokens + completion.completion_tokens - taken)
        usage = self.usage
        usage.requests += 1
        usage.prompt_tokens += completion.prompt_tokens
        usage.completion_tokens += completion.completion_tokens
        usage.cost_dollars += (
            completion.prompt_tokens * self.input_price + completion.completion_tokens * self.output_price
        )
        if completion.prompt_tokens_estimated or completion.completion_tokens_estimated:
            usage.answers_without_usage += 1
            usage.estimated_prompt_tokens += completion.prompt_tokens if completion.prompt_tokens_estimated else 0
            usage.estimated_completion_tokens += (
                completion.completion_tokens if completion.completion_tokens_estimated else 0
            )
        self._cache_write(key, messages, params, completion)
        return completion

    async def _send(self, messages: list[dict], params: dict, prompt_estimate: int) -> Completion:
        """One request with its retries; only a well-formed answer returns. Each attempt ends within
        ``timeout_s``, however slowly the server sends its answer."""
        openai = self._openai
        last_error = "no attempt"
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.usage.retries += 1
            self.usage.api_calls += 1
            retry_after = refused = None
            try:
                # The package's timeout reaches httpx as one per read: a server that sends a byte now
                # and then never trips it. This deadline is the whole exchange's.
                response = await asyncio.wait_for(
                    self._api.chat.completions.create(
                        model=self.model, messages=messages, timeout=self.timeout_s, **params
                    ),
                    self.timeout_s,
                )
                return self._completion_from(response, prompt_estimate)
            except openai.APIStatusError as error:
                status = error.status_code
                if status not in RETRYABLE_STATUS and status < 500:
                    refused = f"HTTP {status}: {_refusal_reason(error).rstrip('. ')}"
                else:
                    retry_after = _retry_after_seconds(error.response.headers)
                    last_error = f"HTTP {status}"
            except (TimeoutError, openai.APITimeoutError):
                last_error = f"no answer within {self.timeout_s} s"
            except openai.APIConnectionError as error:
                last_error = f"connection failed ({error.__cause__ or error})"
            except (_MalformedAnswer, openai.APIResponseValidationError, json.JSONDecodeError) as error:
                last_error = f"malformed answer ({error})"
            if refused is not None:  # raised here, outside the handler: the package's error (which holds
                self.usage.failures += 1  # the server's unredacted words) is not kept as its context
                raise LLMRequestFailed(
                    f"The endpoint refused the request with {refused}. Check OPENAI_BASE_URL, the model name, "
                    "the key and the request's parameters; this is not retried."
                )
            if attempt < self.max_retries:
                delay = self._backoff(attempt, retry_after)
                log.info("LLM request: %s; retry %d/%d in %.1f s", last_error, attempt + 1, self.max_retries, delay)
                await asyncio.sleep(delay)
        self.usage.failures += 1
        raise LLMRequestFailed(f"The LLM request failed after {self.max_retries + 1} attempts: {last_error}.")

    @staticmethod
    def _completion_from(response, prompt_estimate: int) -> Completion:
        """The answer a 200 holds; ``_MalformedAnswer`` where it holds none. A token count the server did
        not give as a count (no usage, a null or negative field, text) is estimated, and flagged so."""
        try:
            choices = getattr(response, "choices", None)
            choice = choices[0] if isinstance(choices, list) and choices else None
            message = getattr(choice, "message", None)
            if message is None:
                raise _MalformedAnswer("a 200 answer with no choices")
            text = getattr(message, "content", None)
            text = "" if text is None else text
            if not isinstance(text, str):
                raise _MalformedAnswer(f"the answer's content is a {type(text).__name__}, not text")
            finish_reason = getattr(choice, "finish_reason", None)
            usage = getattr(response, "usage", None)
            prompt = _token_count(getattr(usage, "prompt_tokens", None))
            completion = _token_count(getattr(usage, "completion_tokens", None))
        except _MalformedAnswer:
            raise
        except Exception as error:  # whatever shape the body took, it is a malformed answer, retried
            raise _MalformedAnswer(f"{type(error).__name__}: {error}") from None
        return Completion(
            text=text,
            finish_reason=finish_reason
            if finish_reason is None or isinstance(finish_reason, str)
            else str(finish_reason),
            prompt_tokens=prompt_estimate if prompt is None else prompt,
            completion_tokens=estimate_tokens(text) if completion is None else completion,
            cached=False,
            prompt_tokens_estimated=prompt is None,
            completion_tokens_estimated=completion is None,
        )


# --------------------------------------------------------------------------- the key in a training job


def api_key_from_secret(secret_name: str, region: str | None = None) -> str:
    """The API key stored in AWS Secrets Manager as ``secret_name`` (its name or ARN): the secret's
    text, or its ``OPENAI_API_KEY`` field when the text is a JSON object. A training job gets the key
    this way, so that only the secret's name travels in the CreateTrainingJob request (which
    DescribeTrainingJob shows back); the job's role needs ``secretsmanager:GetSecretValue`` on it."""
    import boto3
    import botocore.exceptions

    try:
        with _no_debug_records():  # botocore would log the response, the key in it, at DEBUG
            client = boto3.client("secretsmanager", region_name=region or os.environ.get("AWS_REGION"))
            text = client.get_secret_value(SecretId=secret_name)["SecretString"]
    except botocore.exceptions.ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        raise UserError(
            f"Cannot read the API key from the secret {secret_name!r} ({code}). Create it with "
            f"`aws secretsmanager create-secret --name {secret_name} --secret-string <key>` and give the "
            "job's role secretsmanager:GetSecretValue on it."
        ) from None
    except KeyError:
        raise UserError(f"The secret {secret_name!r} has no text (SecretString); store the key as text.") from None
    if text.lstrip().startswith("{"):
        try:
            fields = json.loads(text)
            for value in fields.values():  # every value of the secret is redacted, not the key alone
                register_secret(value if isinstance(value, str) else None)
            return fields["OPENAI_API_KEY"]
        except (json.JSONDecodeError, KeyError, AttributeError):
            raise UserError(
                f"The secret {secret_name!r} is a JSON object without an OPENAI_API_KEY field; "
                'store the key as plain text or as {"OPENAI_API_KEY": "..."}.'
            ) from None
    register_secret(text.strip())
    return text.strip()


def job_client(
    model: str, base_url: str = "", api_key_secret: str = "", checkpoint_dir: str | None = None, **options
) -> LLMClient:
    """A training job's client: the API key from the Secrets Manager secret ``api_key_secret`` names (by
    hand, without one, ``OPENAI_API_KEY``), and the answers cached in ``<checkpoint folder>/llm_cache``,
    which SageMaker syncs with ``checkpoint_s3_uri``: a restarted or repeated job asks only what is new."""
    api_key = api_key_from_secret(api_key_secret) if api_key_secret else None
    cache = Path(checkpoint_dir or default_checkpoint_dir()) / "llm_cache"
    return LLMClient(model, base_url=base_url or None, api_key=api_key, cache_dir=cache, **options)
