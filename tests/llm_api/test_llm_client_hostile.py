"""The LLM client against hostile or broken servers (the fault proxy, a real local HTTP server, answers
every request itself): a trickled answer is cut at the attempt's deadline, a malformed ``usage`` is an
estimate and never a lost batch, a damaged cache entry is a miss, the rate limit spreads a burst, and
no message, log record or error the client raises repeats the key, whatever the server echoes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import traceback
import uuid

import pytest
from common.llm_client import (
    REDACTED,
    BudgetExceeded,
    LLMClient,
    LLMRequestFailed,
    TokenBucket,
    api_key_from_secret,
    json_object,
    redact,
    register_secret,
)
from fault_proxy import FaultProxy

NOWHERE = "http://127.0.0.1:9"  # the proxy answers every scripted request itself: nothing passes through
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def make_client(proxy, **options) -> LLMClient:
    options = {"api_key": "test-key", "timeout_s": 1.0, "max_retries": 0, "backoff_s": 0.05, **options}
    return LLMClient("m", base_url=proxy.base_url, **options)


@contextlib.contextmanager
def every_record():
    """Every log record of the process at DEBUG and above, as its handler would write it."""
    texts: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            texts.append(self.format(record) + (record.exc_text or ""))

    root, handler = logging.getLogger(), Keep(logging.DEBUG)
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield texts
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def pieces_of(secret: str, text: str, length: int = 8) -> list[str]:
    """The runs of ``length`` characters of ``secret`` that ``text`` holds."""
    return sorted({secret[i : i + length] for i in range(len(secret) - length + 1) if secret[i : i + length] in text})


# --------------------------------------------------------------------------- the deadline


def test_a_trickled_answer_is_cut_at_the_deadline_and_retried_as_a_timeout():
    """One byte every 0.3 s keeps every read under the 1 s timeout; the deadline is the whole exchange's."""
    with FaultProxy(NOWHERE, ["trickle"], trickle_s=0.3) as proxy:
        with make_client(proxy) as client:
            started = time.monotonic()
            with pytest.raises(LLMRequestFailed, match=r"after 1 attempts: no answer within 1.0 s"):
                client.complete_many([QUESTION])
            took = time.monotonic() - started
    assert 0.95 <= took < 2.0, took  # the answer would take 75 s at this pace
    assert client.usage.failures == 1 and client.usage.api_calls == 1

    with FaultProxy(NOWHERE, ["trickle", "reply:on time"], trickle_s=0.3) as proxy:
        with make_client(proxy, max_retries=1) as client:
            started = time.monotonic()
            [answer] = client.complete_many([QUESTION])
            took = time.monotonic() - started
    assert answer.text == "on time" and proxy.done() == ["trickle", "reply:on time"]
    assert client.usage.retries == 1 and client.usage.failures == 0 and took < 2.5, took


# --------------------------------------------------------------------------- usage the server gets wrong

MALFORMED_USAGE = [
    "usage:absent",
    "usage:null",
    'usage:{"prompt_tokens": null, "completion_tokens": null, "total_tokens": null}',
    'usage:{"prompt_tokens": 7, "completion_tokens": null}',
    'usage:{"prompt_tokens": -3, "completion_tokens": "five"}',
    'usage:{"prompt_tokens": 1.5, "completion_tokens": true}',
    'usage:"lots"',
    "usage:[1, 2]",
]


def test_a_malformed_usage_is_estimated_and_never_loses_the_batch():
    questions = [
        [{"role": "user", "content": f"Question number {i}: " + "x" * 20}] for i in range(len(MALFORMED_USAGE))
    ]
    faults = [*MALFORMED_USAGE, "usage:{}", 'reply:{"fine": true}']
    questions += [[{"role": "user", "content": "Q9"}], [{"role": "user", "content": "Q10"}]]
    with FaultProxy(NOWHERE, faults) as proxy:
        with make_client(proxy, max_concurrency=1, input_price_per_million=1.0) as client:
            results = client.complete_many(questions, return_exceptions=True)
            usage = client.usage
    assert proxy.done() == faults  # one attempt each: a malformed usage is no reason to ask again
    assert all(not isinstance(r, Exception) for r in results), results
    *estimated, fine = results
    prompt_estimates = [math.ceil(len(q[0]["content"]) / 4) for q in questions[:-1]]
    # Only the count the server gave as a count is taken: the 7 prompt tokens; the rest are estimated.
    assert [a.prompt_tokens for a in estimated] == [*prompt_estimates[:3], 7, *prompt_estimates[4:]]
    assert [a.prompt_tokens_estimated for a in estimated] == [True, True, True, False, True, True, True, True, True]
    assert all(a.completion_tokens == 1 and a.completion_tokens_estimated for a in estimated)  # "ok": 2 characters
    assert (fine.prompt_tokens, fine.completion_tokens) == (10, 5) and not fine.prompt_tokens_estimated
    assert usage.answers_without_usage == 9 and usage.failures == 0 and usage.requests == 10
    assert usage.estimated_prompt_tokens == sum(prompt_estimates) - prompt_estimates[3]
    assert usage.estimated_completion_tokens == 9
    assert usage.prompt_tokens == usage.estimated_prompt_tokens + 7 + 10 and usage.completion_tokens == 9 + 5
    assert usage.cost_dollars == pytest.approx(usage.prompt_tokens * 1e-6)  # estimates are charged too
    assert "are estimates (4 characters a token) for 9 answers without usage" in usage.report()


def test_answers_without_usage_count_against_the_token_budget(tmp_path):
    question = [{"role": "user", "content": "y" * 80}]  # 20 tokens by the estimate
    with FaultProxy(NOWHERE, ["usage:absent"] * 3) as proxy:
        with make_client(proxy, budget_tokens=20, cache_dir=tmp_path) as client:
            [answer] = client.complete_many([question])
            assert answer.prompt_tokens == 20 and client.usage.total_tokens == 21
            with pytest.raises(BudgetExceeded, match="Token budget spent: 21 of 20"):
                client.complete_many([[{"role": "user", "content": "another"}]], return_exceptions=True)
            [again] = client.complete_many([question])  # from the cache, flags and all
    assert proxy.done() == ["usage:absent"]
    assert again.cached and again.prompt_tokens_estimated and again.completion_tokens_estimated


def test_a_malformed_answer_is_retried_and_the_rest_of_the_batch_kept():
    faults = ['usage:{"prompt_tokens": null}', "no_choices", "malformed", "reply:second"]
    with FaultProxy(NOWHERE, faults) as proxy:
        with make_client(proxy, max_concurrency=1, max_retries=0) as client:
            results = client.complete_many([QUESTION, [{"role": "user", "content": "b"}]] * 2, return_exceptions=True)
    assert results[0].text == "ok" and results[3].text == "second"
    assert [type(r).__name__ for r in results[1:3]] == ["LLMRequestFailed"] * 2
    assert "malformed answer" in str(results[2]) and "no choices" in str(results[1])


# --------------------------------------------------------------------------- the cache


def damages(entry: bytes) -> dict[str, bytes]:
    """Ways a cache file can be damaged, by name, made from a whole entry ``entry``."""
    record = json.loads(entry)
    cut = entry.index("é".encode()) + 1  # inside the two bytes of "é"
    with pytest.raises(UnicodeDecodeError):
        entry[:cut].decode("utf-8")

    def changed(change) -> bytes:
        copy = json.loads(entry)
        change(copy)
        return json.dumps(copy).encode()

    return {
        "cut inside a character": entry[:cut],
        "not UTF-8": b"\xff\xfe" + entry[2:],
        "cut short": entry[: len(entry) // 2],
        "empty": b"",
        "an empty object": b"{}",
        "a list": b"[]",
        "null": b"null",
        "no answer": changed(lambda r: r.pop("answer")),
        "an answer without its tokens": changed(lambda r: r["answer"].pop("prompt_tokens")),
        "a number for text": changed(lambda r: r["answer"].update(text=5)),
        "negative tokens": changed(lambda r: r["answer"].update(completion_tokens=-1)),
        "text for an estimate flag": changed(lambda r: r["answer"].update(prompt_tokens_estimated="no")),
        "another request's record": changed(lambda r: r["messages"][0].update(content="something else")),
        "no request": changed(lambda r: r.pop("messages")),
        "an answer list": json.dumps({**record, "answer": []}).encode(),
    }


def test_a_damaged_cache_entry_is_a_miss_counted_and_replaced(tmp_path):
    question = [{"role": "user", "content": "Café?"}]
    with FaultProxy(NOWHERE, ["reply:Un café, s'il vous plaît"]) as proxy:
        with make_client(proxy, cache_dir=tmp_path) as client:
            [first] = client.complete_many([question])
    [path] = tmp_path.rglob("*.json")
    kinds = damages(path.read_bytes())
    with FaultProxy(NOWHERE, [f"reply:fresh {name}" for name in kinds]) as proxy:
        with make_client(proxy, cache_dir=tmp_path) as client:
            for count, (name, damaged) in enumerate(kinds.items(), start=1):
                path.write_bytes(damaged)
                [answer] = client.complete_many([question])
                assert not answer.cached and answer.text == f"fresh {name}", name
                assert client.usage.damaged_cache_entries == count, name
                [again] = client.complete_many([question])  # the fresh answer replaced the entry
                assert again.cached and again.text == f"fresh {name}", name
            assert client.usage.requests == 2 * len(kinds) and client.usage.failures == 0
            assert f"{len(kinds)} damaged cache entries asked again" in client.usage.report()
    assert first.text.startswith("Un café") and len(proxy.done()) == len(kinds)


# --------------------------------------------------------------------------- the rate limit


def test_the_requests_limit_spreads_a_burst_over_the_minute():
    """At 60 a minute, 63 requests at once: about one a second reaches the server, never the minute's burst."""
    with FaultProxy(NOWHERE, ["reply:ok"] * 63) as proxy:
        with make_client(proxy, requests_per_minute=60, max_concurrency=64) as client:

            async def burst():
                asked = [
                    asyncio.ensure_future(client.complete([{"role": "user", "content": f"q{i}"}])) for i in range(63)
                ]
                await asyncio.sleep(3.5)
                for request in asked:
                    request.cancel()
                await asyncio.gather(*asked, return_exceptions=True)

            asyncio.run(burst())
    first = proxy.log[0][1]
    arrived = [when - first for _, when in proxy.log]
    assert sum(t < 0.5 for t in arrived) <= 2, arrived  # one, and one more where the machine stalled
    assert 2 <= len(arrived) <= 5, arrived  # about one a second for 3.5 s (4), at most one second's worth more


def test_a_bucket_holds_one_seconds_worth():
    async def run():
        bucket = TokenBucket(per_minute=600)  # 10 a second
        started = time.monotonic()
        taken = [await bucket.take(1) for _ in range(10)]  # one second's worth: at once
        at_once = time.monotonic() - started
        await bucket.take(1)
        eleventh = time.monotonic() - started
        big = await bucket.take(50)  # more than the bucket holds: waits for a full one, takes all of it
        return taken, at_once, eleventh, big, bucket.level

    taken, at_once, eleventh, big, level = asyncio.run(run())
    assert taken == [1] * 10 and at_once < 0.05 and eleventh >= 0.09
    assert big == 10 and level < 0.5
    assert TokenBucket(per_minute=10).capacity == 1  # less than one a second: still one at a time


# --------------------------------------------------------------------------- the key


@pytest.mark.parametrize("echo", ["full", "masked", "dots", "head", "tail"])
def test_a_key_the_server_echoes_is_repeated_nowhere(echo):
    key = f"sk-proj-{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}Qz9w"
    with every_record() as records, FaultProxy(NOWHERE, [f"401:{echo}"]) as proxy:
        with make_client(proxy, api_key=key, max_retries=3) as client:
            with pytest.raises(LLMRequestFailed) as raised:
                client.complete_many([QUESTION])
    error = raised.value
    shown = "".join(traceback.format_exception(error)) + repr(error) + "\n".join(records)
    assert proxy.headers[0]["authorization"] == f"Bearer {key}"  # the key reached the server, which echoed it
    assert "HTTP 401" in str(error) and "Incorrect API key provided: [REDACTED]" in str(error)
    assert pieces_of(key, shown) == [] and "Qz9w" not in shown and "sk-pro" not in shown
    assert error.__context__ is None and error.__cause__ is None  # the package's error, with the echo, is not kept
    assert records  # the capture saw the request's records (httpx's, openai's, the client's)
    assert proxy.done() == [f"401:{echo}"]  # a refused key is not retried


def test_what_redaction_removes_and_what_it_keeps():
    key = "sk-live-" + uuid.uuid4().hex + "AbCd"
    register_secret(key)
    for echo in [
        key,
        key[:8],
        key[-8:],
        key[10:20],
        f"{key[:6]}...{key[-4:]}",
        f"{key[:8]}{'*' * 30}{key[-4:]}",
        f"{key[:3]}…{key[-5:]}",
        f"***{key[-4:]}",
        f"{key[:12]}****",
    ]:
        said = redact(f'Incorrect API key provided: "{echo}". See your account.')
        assert said == f'Incorrect API key provided: "{REDACTED}". See your account.', (echo, said)
    ordinary = "HTTP 401: Incorrect API key provided... Check OPENAI_API_KEY (a key ending in 1234)."
    assert redact(ordinary) == ordinary
    register_secret("pass1")  # a placeholder shorter than 8 characters: only the whole word
    assert redact("the key pass1 was refused; pass12") == f"the key {REDACTED} was refused; pass12"
    register_secret("k")  # shorter than 4: no key at all, and blanking it would blank words
    assert redact("k = 1 key") == "k = 1 key"


def test_the_client_logger_redacts_its_records():
    key = "sk-" + uuid.uuid4().hex
    register_secret(key)
    with every_record() as records:
        logging.getLogger("common.llm_client").warning("the server said %s and %r", key, {"echo": key[-9:]})
    [record] = [r for r in records if "the server said" in r]
    assert pieces_of(key, record) == [] and record.count(REDACTED) == 2


def test_reading_the_secret_writes_no_debug_record_of_it(monkeypatch):
    moto = pytest.importorskip("moto")
    import boto3

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    marker, other = f"sk-{uuid.uuid4().hex}", f"other-{uuid.uuid4().hex}"
    with moto.mock_aws():
        secrets = boto3.client("secretsmanager", region_name="us-east-1")
        secrets.create_secret(Name="plain", SecretString=marker)
        secrets.create_secret(Name="fields", SecretString=json.dumps({"OPENAI_API_KEY": marker, "org": other}))
        with every_record() as unguarded:  # the capture can fail: botocore logs the body at DEBUG
            secrets.get_secret_value(SecretId="plain")
        with every_record() as records:
            plain = api_key_from_secret("plain", region="us-east-1")
            fields = api_key_from_secret("fields", region="us-east-1")
            logging.getLogger("after.the.read").debug("DEBUG records are written again")
    assert any(marker in r for r in unguarded)
    assert plain == fields == marker
    assert not [r for r in records if marker in r or other in r]
    assert records[-1].endswith("DEBUG records are written again")  # the guard ends with the read
    assert redact(f"org {other}") == f"org {REDACTED}"  # every value of the secret is redacted later on


def test_a_parse_failure_that_quotes_the_key_does_not_repeat_it():
    key = f"sk-{uuid.uuid4().hex}"
    with FaultProxy(NOWHERE, [f'reply:{{"{key}": 1}}']) as proxy:
        with make_client(proxy, api_key=key) as client:
            [result] = client.complete_structured_many([QUESTION], json_object({"score": int}))
    assert not result.ok and result.error.startswith("fields [") and pieces_of(key, result.error) == []
    assert REDACTED in result.error
