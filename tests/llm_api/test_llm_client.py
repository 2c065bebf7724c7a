"""The LLM client against a real OpenAI-compatible server (``transformers serve`` on the tiny model),
with faults injected by a proxy: every fault is retried as specified, the run completes, and the
accounting counts each request, attempt and token exactly once."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from common.contract import UserError
from common.llm_client import (
    BudgetExceeded,
    LLMClient,
    LLMRequestFailed,
    ParseError,
    TokenBucket,
    json_object,
)
from fault_proxy import FaultProxy

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def upstream(server) -> str:
    return server.base_url.removesuffix("/v1")


def make_client(server, base_url=None, **options) -> LLMClient:
    options = {"api_key": "test-key", "timeout_s": 1.0, "max_retries": 5, "backoff_s": 0.05, **options}
    return LLMClient(server.model, base_url=base_url or server.base_url, **options)


def test_each_fault_is_retried_and_the_answer_is_counted_once(llm_server, tmp_path):
    faults = ["429", "500", "hang", "malformed", "no_choices"]
    with FaultProxy(upstream(llm_server), faults, retry_after=0.6, hang_s=3) as proxy:
        with make_client(llm_server, proxy.base_url, cache_dir=tmp_path) as client:
            [answer] = client.complete_many([QUESTION], max_tokens=8, temperature=0)
            usage = client.usage
    assert proxy.done() == [*faults, "pass"]
    assert usage.requests == 1 and usage.api_calls == 6 and usage.retries == 5 and usage.failures == 0
    # Only the answer that arrived is counted: its own tokens, once.
    assert (usage.prompt_tokens, usage.completion_tokens) == (answer.prompt_tokens, answer.completion_tokens)
    assert answer.completion_tokens == 8 and answer.prompt_tokens > 0 and not answer.cached
    # Retry-After was honoured: the second attempt came no sooner than 0.6 s after the 429.
    (_, first), (_, second) = proxy.log[:2]
    assert second - first >= 0.55
    # The hang was cut at the timeout (1 s), not waited out (3 s).
    (_, hang_started), (_, after_hang) = proxy.log[2:4]
    assert after_hang - hang_started < 2.9


def test_concurrent_requests_with_faults_all_complete_nothing_lost_or_doubled(llm_server):
    questions = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(8)]
    faults = ["429", "500", "malformed", "no_choices", "500", "429"]
    with FaultProxy(upstream(llm_server), faults, retry_after=0.2) as proxy:
        with make_client(llm_server, proxy.base_url, max_concurrency=4) as client:
            answers = client.complete_many(questions, max_tokens=4, temperature=0)
            usage = client.usage
    assert len(answers) == 8 and all(a.completion_tokens == 4 for a in answers)
    assert proxy.done().count("pass") == 8  # every question answered by the server exactly once
    assert usage.requests == 8 and usage.retries == len(faults) and usage.api_calls == 8 + len(faults)
    assert usage.completion_tokens == 32
    assert usage.prompt_tokens == sum(a.prompt_tokens for a in answers)
    # Each question was sent as asked: the proxy saw every one of them.
    assert {b["messages"][0]["content"] for b in proxy.bodies} == {q[0]["content"] for q in questions}


def test_retries_are_capped_and_a_failure_is_not_cached(llm_server, tmp_path):
    with FaultProxy(upstream(llm_server), ["500", "500", "500"]) as proxy:
        with make_client(llm_server, proxy.base_url, max_retries=2, cache_dir=tmp_path) as client:
            with pytest.raises(LLMRequestFailed, match="after 3 attempts: HTTP 500"):
                client.complete_many([QUESTION], max_tokens=4)
            assert (client.usage.failures, client.usage.api_calls, client.usage.requests) == (1, 3, 0)
            [answer] = client.complete_many([QUESTION], max_tokens=4)  # asked again: goes to the server
    assert not answer.cached and proxy.done() == ["500", "500", "500", "pass"]


def test_a_client_error_is_not_retried(llm_server):
    with FaultProxy(upstream(llm_server), ["400"]) as proxy:
        with make_client(llm_server, proxy.base_url) as client:
            with pytest.raises(LLMRequestFailed, match="HTTP 400.*not retried"):
                client.complete_many([QUESTION], max_tokens=4)
            assert client.usage.api_calls == 1 and client.usage.retries == 0
    assert proxy.done() == ["400"]


def test_a_refused_request_says_what_the_server_said(llm_server):
    """transformers serve answers a refusal as ``{"detail": ...}``, not OpenAI's ``{"error": ...}``: the
    reason reaches the error all the same (here: a logit_bias with integer values, which it refuses)."""
    with make_client(llm_server) as client:
        with pytest.raises(LLMRequestFailed, match=r"HTTP 400: .*\(.*sequence_bias.*floats.*\).*not retried"):
            client.complete_many([QUESTION], max_tokens=1, logit_bias={"1": 100})


def test_failures_can_be_returned_in_place(llm_server):
    with FaultProxy(upstream(llm_server), ["400"]) as proxy:
        with make_client(llm_server, proxy.base_url, max_concurrency=1) as client:
            results = client.complete_many(
                [QUESTION, QUESTION[:1] + [{"role": "user", "content": "hi"}]], return_exceptions=True, max_tokens=4
            )
    assert isinstance(results[0], LLMRequestFailed) and results[1].completion_tokens == 4
    assert proxy.done() == ["400", "pass"]


def test_the_cache_answers_again_across_a_restart_without_a_second_charge(llm_server, tmp_path):
    with FaultProxy(upstream(llm_server), []) as proxy:
        with make_client(llm_server, proxy.base_url, cache_dir=tmp_path) as client:
            [first] = client.complete_many([QUESTION], max_tokens=6, temperature=0.7, seed=1)
            [again] = client.complete_many([QUESTION], max_tokens=6, temperature=0.7, seed=1)
            [other] = client.complete_many([QUESTION], max_tokens=6, temperature=0.7, seed=2)
            assert client.usage.cached_hits == 1 and client.usage.api_calls == 2
        # A new process would build a new client on the same folder: the answer comes from disk.
        with make_client(llm_server, proxy.base_url, cache_dir=tmp_path) as restarted:
            [after_restart] = restarted.complete_many([QUESTION], max_tokens=6, temperature=0.7, seed=1)
            assert restarted.usage.api_calls == 0 and restarted.usage.total_tokens == 0
    assert proxy.done() == ["pass", "pass"]  # the first request and seed 2's
    assert again.cached and after_restart.cached and not other.cached
    assert again.text == first.text == after_restart.text
    entries = list(tmp_path.rglob("*"))
    assert not [p for p in entries if p.name.endswith(".tmp")]  # atomic writes leave no temporary
    assert all("test-key" not in p.read_text() for p in entries if p.is_file())


def test_async_calls_share_the_cap(llm_server):
    with make_client(llm_server, max_concurrency=2) as client:

        async def ask():
            return await asyncio.gather(*(client.complete(QUESTION, max_tokens=3, seed=i) for i in range(4)))

        answers = asyncio.run(ask())
    assert len(answers) == 4 and client.usage.requests == 4


def test_the_budget_stops_the_run_with_a_clear_error(llm_server, tmp_path):
    with make_client(llm_server, budget_tokens=10, cache_dir=tmp_path) as client:
        [answer] = client.complete_many([QUESTION], max_tokens=8)
        assert client.usage.total_tokens >= 10
        with pytest.raises(BudgetExceeded, match="Token budget spent") as raised:
            client.complete_many([[{"role": "user", "content": "Another question"}]], max_tokens=8)
        assert isinstance(raised.value, UserError)  # a job's failure file says it
        [cached] = client.complete_many([QUESTION], max_tokens=8)  # what is cached is still free
    assert cached.cached and cached.text == answer.text
    with make_client(llm_server, budget_dollars=1e-9, input_price_per_million=1.0) as client:
        client.complete_many([QUESTION], max_tokens=2)
        assert client.usage.cost_dollars == pytest.approx(client.usage.prompt_tokens * 1e-6)
        with pytest.raises(BudgetExceeded, match="Dollar budget spent"):
            client.complete_many([QUESTION], max_tokens=3)


def test_structured_answers_are_parsed_strictly_and_failures_counted(llm_server):
    with make_client(llm_server) as client:
        results = client.complete_structured_many([QUESTION], json_object({"score": int}), max_tokens=4)
    # The tiny model writes no JSON: the failure is reported with its reason, not turned into a value.
    assert not results[0].ok and results[0].value is None and "not JSON" in results[0].error
    assert client.usage.parse_failures == 1


def test_json_object_parser_refuses_anything_but_the_schema():
    parse = json_object({"score": int, "reason": str})
    assert parse('{"score": 3, "reason": "ok"}') == {"score": 3, "reason": "ok"}
    assert parse('```json\n{"score": 3, "reason": "ok"}\n```') == {"score": 3, "reason": "ok"}
    for bad in [
        '{"score": 3}',
        '{"score": "3", "reason": "ok"}',
        '{"score": true, "reason": "ok"}',
        "[1]",
        "score: 3",
        '{"score": 3, "reason": "ok", "extra": 1}',
        '```json\n{"score": 3}',
    ]:
        with pytest.raises(ParseError):
            parse(bad)


def test_configuration_comes_from_the_standard_variables(monkeypatch, llm_server):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(UserError, match="OPENAI_BASE_URL"):
        LLMClient("m")
    monkeypatch.setenv("OPENAI_BASE_URL", llm_server.base_url)
    with pytest.raises(UserError, match="OPENAI_API_KEY"):
        LLMClient("m")
    monkeypatch.setenv("OPENAI_API_KEY", "marker-key-123")
    with LLMClient(llm_server.model) as client:
        assert "marker-key-123" not in repr(client)
        assert client.complete_many([QUESTION], max_tokens=2)[0].completion_tokens == 2


def test_token_bucket_waits_for_its_rate():
    async def run():
        bucket = TokenBucket(per_minute=120)  # 2 a second, bursts of one second's worth: 2
        await bucket.take(120)  # more than the bucket holds: takes the whole bucket
        started = time.monotonic()
        await bucket.take(1)  # empty: waits ~0.5 s for one unit
        waited = time.monotonic() - started
        bucket.adjust(2)  # an estimate 2 short: the next taker waits for those too
        started = time.monotonic()
        await bucket.take(1)
        return waited, time.monotonic() - started

    first, second = asyncio.run(run())
    assert first >= 0.45 and second >= 1.4


def test_requests_per_minute_spaces_requests(llm_server):
    with make_client(llm_server, requests_per_minute=60) as client:
        client._requests_bucket.level = 0.0  # as after a burst
        started = time.monotonic()
        client.complete_many([QUESTION, [{"role": "user", "content": "x"}]], max_tokens=1)
    assert time.monotonic() - started >= 1.9  # one a second, from empty
    assert json.dumps(client.usage.as_dict())
