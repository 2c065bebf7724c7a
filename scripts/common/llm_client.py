"""One client for teacher and judge models behind any OpenAI-compatible chat-completions endpoint.

Built on the official ``openai`` package (``AsyncOpenAI``). Configured by the standard variables
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (or the same as arguments), so any provider, aggregator or
local server works by changing those two. What it adds around the package:

- **a concurrency cap** (``max_concurrency`` requests in flight) and **rate limits**: requests and
  tokens per minute, each a token bucket that a request waits on before it is sent;
- **retries**: a 429, a 5xx, a timeout, a lost connection, a body that is not JSON and a 200 without
  choices are retried up to ``max_retries`` times with exponential backoff (``backoff_s`` doubling, at
  most ``max_backoff_s``), or after the server's ``Retry-After`` when it sends one. Other 4xx (a bad
  key, an unknown model) are not retried. The package's own retries are off (``max_retries=0``): it
  does not retry a malformed 200, and its attempts could not be counted;
- **a per-call timeout** (``timeout_s``, the whole HTTP exchange of one attempt);
- **a content-addressed cache on disk**: the key is the SHA-256 of the request's body (model,
  messages, every sampling parameter); the answer is written atomically (temporary file, then
  ``os.replace``), so the same request gets the same answer with no second charge across a kernel
  restart or a resumed job. Give distinct ``seed`` values to get distinct samples of one prompt;
- **a budget** in tokens and/or dollars: once spent, no further request is sent and ``BudgetExceeded``
  (a ``UserError``: a job's failure file says it) is raised. Requests already in flight still finish,
  so a run can pass its budget by at most ``max_concurrency`` answers;
- **accounting** for the run (``client.usage``): requests, cache hits, API attempts, retries, failures,
  parse failures, prompt and completion tokens and their cost;
- **structured answers** (``complete_structured``): the text goes through a strict parser (a function
  that returns the value or raises ``ParseError`` or another ``ValueError``; ``json_object`` checks a JSON object against a
  field -> type schema). A parse failure is counted and returned as ``ok=False`` with its reason, for
  the caller to exclude: never turned into a score.

The client runs its own event loop in a background thread, so the same object serves async code
(``await client.complete(...)``, in a notebook) and plain code (``client.complete_many([...])``, in a
job script's ``score``). The API key is never logged, cached or shown by ``repr``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import email.utils
import hashlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

try:
    from common.contract import UserError, default_checkpoint_dir
except ImportError:  # imported as scripts.common.llm_client (notebooks, tests)
    from scripts.common.contract import UserError, default_checkpoint_dir

log = logging.getLogger("common.llm_client")


class BudgetExceeded(UserError):
    """The run has spent its token or dollar budget; no further request is sent."""


class LLMRequestFailed(RuntimeError):
    """A request failed after its retries, or with an error that retrying cannot fix."""


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

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "total_tokens": self.total_tokens}

    def report(self) -> str:
        return (
            f"requests {self.requests} (cached hits {self.cached_hits}), API calls {self.api_calls} "
            f"(retries {self.retries}), failures {self.failures}, parse failures {self.parse_failures}, "
            f"tokens {self.prompt_tokens} in + {self.completion_tokens} out, cost ${self.cost_dollars:.4f}"
        )


@dataclasses.dataclass(frozen=True)
class Completion:
    """One answer: its text, why generation stopped, its tokens, and whether it came from the cache."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached: bool


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
    """``per_minute`` units a minute, in bursts of at most that many. ``take`` waits until the bucket
    holds ``amount`` (an amount larger than the bucket waits for a full one); ``adjust`` corrects an
    estimate once the real amount is known (the level may go below zero: later takers wait longer)."""

    def __init__(self, per_minute: float):
        self.rate = per_minute / 60.0
        self.capacity = float(per_minute)
        self.level = float(per_minute)
        self.updated = time.monotonic()
        self.lock = asyncio.Lock()

    def _refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    async def take(self, amount: float) -> None:
        amount = min(amount, self.capacity)
        async with self.lock:  # first come, first served
            self._refill()
            while self.level < amount:
                await asyncio.sleep((amount - self.level) / self.rate)
                self._refill()
            self.level -= amount

    def adjust(self, extra: float) -> None:
        self._refill()
        self.level -= extra


# --------------------------------------------------------------------------- the client

RETRYABLE_STATUS = {408, 409, 429}  # and every 5xx


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
            return Structured(False, None, str(error), completion)

    def cache_key(self, messages: list[dict], params: dict) -> str:
        # The request's body, not the endpoint's address: a local server's port changes from run to run.
        # Point providers that give one model name to different models at different cache folders.
        request = {"model": self.model, "messages": messages, "params": params}
        return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def _cache_path(self, key: str) -> Path:
        return self.cache_dir / key[:2] / f"{key}.json"

    def _cache_read(self, key: str) -> Completion | None:
        if self.cache_dir is None:
            return None
        path = self._cache_path(key)
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, OSError):  # cannot happen with atomic writes, unless edited by hand
            log.warning("Ignoring an unreadable cache entry %s", path)
            return None
        return Completion(cached=True, **record["answer"])

    def _cache_write(self, key: str, messages: list[dict], params: dict, completion: Completion) -> None:
        if self.cache_dir is None:
            return
        path = self._cache_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        answer = dataclasses.asdict(completion)
        del answer["cached"]
        record = {"model": self.model, "messages": messages, "params": params, "answer": answer}
        temporary = path.with_name(f".{key}.{os.getpid()}.{threading.get_ident()}.tmp")
        temporary.write_text(json.dumps(record, ensure_ascii=False))
        os.replace(temporary, path)

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
            estimate = sum(len(str(m.get("content", ""))) for m in messages) / 4 + params.get("max_tokens", 256)
            if self._requests_bucket:
                await self._requests_bucket.take(1)
            if self._tokens_bucket:
                await self._tokens_bucket.take(estimate)
            completion = await self._send(messages, params)
            if self._tokens_bucket:
                self._tokens_bucket.adjust(completion.prompt_tokens + completion.completion_tokens - estimate)
        self.usage.requests += 1
        self.usage.prompt_tokens += completion.prompt_tokens
        self.usage.completion_tokens += completion.completion_tokens
        self.usage.cost_dollars += (
            completion.prompt_tokens * self.input_price + completion.completion_tokens * self.output_price
        )
        self._cache_write(key, messages, params, completion)
        return completion

    async def _send(self, messages: list[dict], params: dict) -> Completion:
        """One request with its retries; only a well-formed answer returns."""
        openai = self._openai
        last_error = "no attempt"
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.usage.retries += 1
            self.usage.api_calls += 1
            retry_after = None
            try:
                response = await self._api.chat.completions.create(
                    model=self.model, messages=messages, timeout=self.timeout_s, **params
                )
                if not getattr(response, "choices", None) or response.choices[0].message is None:
                    raise LLMRequestFailed("a 200 answer with no choices")
                choice = response.choices[0]
                usage = response.usage
                return Completion(
                    text=choice.message.content or "",
                    finish_reason=choice.finish_reason,
                    prompt_tokens=int(usage.prompt_tokens) if usage else 0,
                    completion_tokens=int(usage.completion_tokens) if usage else 0,
                    cached=False,
                )
            except openai.APIStatusError as error:
                status = error.status_code
                if status not in RETRYABLE_STATUS and status < 500:
                    self.usage.failures += 1
                    raise LLMRequestFailed(
                        f"The endpoint refused the request with HTTP {status}: {_refusal_reason(error)}. "
                        "Check OPENAI_BASE_URL, the model name, the key and the request's parameters; "
                        "this is not retried."
                    ) from None
                retry_after = _retry_after_seconds(error.response.headers)
                last_error = f"HTTP {status}"
            except openai.APITimeoutError:
                last_error = f"no answer within {self.timeout_s} s"
            except openai.APIConnectionError as error:
                last_error = f"connection failed ({error.__cause__ or error})"
            except (LLMRequestFailed, openai.APIResponseValidationError, json.JSONDecodeError, AttributeError) as error:
                last_error = f"malformed answer ({error})"
            if attempt < self.max_retries:
                delay = self._backoff(attempt, retry_after)
                log.info("LLM request: %s; retry %d/%d in %.1f s", last_error, attempt + 1, self.max_retries, delay)
                await asyncio.sleep(delay)
        self.usage.failures += 1
        raise LLMRequestFailed(f"The LLM request failed after {self.max_retries + 1} attempts: {last_error}.")


# --------------------------------------------------------------------------- the key in a training job


def api_key_from_secret(secret_name: str, region: str | None = None) -> str:
    """The API key stored in AWS Secrets Manager as ``secret_name`` (its name or ARN): the secret's
    text, or its ``OPENAI_API_KEY`` field when the text is a JSON object. A training job gets the key
    this way, so that only the secret's name travels in the CreateTrainingJob request (which
    DescribeTrainingJob shows back); the job's role needs ``secretsmanager:GetSecretValue`` on it."""
    import boto3
    import botocore.exceptions

    try:
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
            return json.loads(text)["OPENAI_API_KEY"]
        except (json.JSONDecodeError, KeyError):
            raise UserError(
                f"The secret {secret_name!r} is a JSON object without an OPENAI_API_KEY field; "
                'store the key as plain text or as {"OPENAI_API_KEY": "..."}.'
            ) from None
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
