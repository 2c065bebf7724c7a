"""The pairwise judge's protocol: every pair asked in both orders, a verdict only when it survives the
swap; the judge judged first (position bias, agreement with the checker on pairs where exactly one
answer is right); the win rate from the surviving verdicts, and words that never read a coin toss as a
verdict."""

from __future__ import annotations

import math

import pytest
from common.llm_client import LLMClient
from environments.gsm8k import GSM8KEnvironment
from environments.llm_judge import (
    PairwiseJudge,
    describe_judge,
    describe_win_rate,
    judge_quality,
    judge_too_weak,
    position_bias,
    reference_pairs,
    win_rate,
)
from fault_proxy import FaultProxy
from hypothesis import given
from hypothesis import strategies as st


def verdict(a_first, b_first) -> dict:
    """A pair's verdict as ``PairwiseJudge.compare`` gives it, from the answer chosen in each order."""
    if a_first is None or b_first is None:
        outcome = "failed"
    elif "tie" in (a_first, b_first):
        outcome = "tie"
    else:
        outcome = a_first if a_first == b_first else "position"
    return {"outcome": outcome, "a_first": a_first, "b_first": b_first}


def test_every_pair_is_asked_in_both_orders_and_counts_only_when_it_survives_the_swap(llm_server):
    # JSON verdicts, in the order the requests go out: the five pairs with A read first, then with B first.
    # "better" names the position; pair 0 prefers A both times, pair 1 B, pair 2 the first position both
    # times, pair 3 calls a tie once, pair 4's first reply is not a verdict.
    better = [1, 2, 1, 0, None, 2, 1, 1, 1, 1]
    replies = [f'reply:{{"better": {b}, "reason": "r"}}' if b is not None else "reply:the first one" for b in better]
    upstream = llm_server.base_url.removesuffix("/v1")
    with FaultProxy(upstream, replies) as proxy:
        with LLMClient(
            llm_server.model, base_url=proxy.base_url, api_key="k", timeout_s=5, max_concurrency=1
        ) as client:
            verdicts = PairwiseJudge(client, max_tokens=8).compare(["q"] * 5, [f"A{i}" for i in range(5)], ["B"] * 5)
    assert len(proxy.bodies) == 10
    for index, body in enumerate(proxy.bodies):
        shown = body["messages"][1]["content"]
        assert (shown.index(f"A{index % 5}") < shown.index("\nB")) == (index < 5)  # A first, then B first
    assert [v["outcome"] for v in verdicts] == ["a", "b", "position", "tie", "failed"]
    assert [(v["a_first"], v["b_first"]) for v in verdicts[:4]] == [("a", "a"), ("b", "b"), ("a", "b"), ("tie", "b")]
    assert "not JSON" in verdicts[4]["error"] and "error" not in verdicts[0]


def test_position_bias_counts_orders_and_its_error_counts_pairs():
    verdicts = [
        verdict("a", "a"),  # one order chose first, one second
        verdict("a", "b"),  # first both times: flipped with the order
        verdict("b", "a"),  # second both times: flipped
        verdict("tie", "b"),  # one order chose first, one tie
        verdict(None, "a"),  # failed: left out
    ]
    bias = position_bias(verdicts)
    firsts = [0.5, 1.0, 0.0, 0.5]  # per pair: the share of its two orders that chose the first-read answer
    mean = sum(firsts) / 4
    assert bias["orders"] == 8 and bias["decided_pairs"] == 3
    assert bias["chose_first"] == pytest.approx(mean) == pytest.approx(4 / 8)
    assert bias["chose_first_standard_error"] == pytest.approx(math.sqrt(sum((f - mean) ** 2 for f in firsts) / 3 / 4))
    assert bias["chose_second"] == pytest.approx(3 / 8)  # the tie is neither
    assert bias["flipped"] == pytest.approx(2 / 3)
    assert bias["flipped_standard_error"] == pytest.approx(math.sqrt((2 / 3) * (1 / 3) * 3 / 2 / 3))


def test_agreement_counts_only_surviving_verdicts_on_pairs_with_exactly_one_right_answer():
    verdicts = [verdict("a", "a"), verdict("b", "b"), verdict("a", "a"), verdict("a", "b"), verdict("a", "a")]
    right = ["a", "a", "b", "a", None]  # the last pair: both answers right (or both wrong), not judgeable
    quality = judge_quality(verdicts, right)
    assert quality["judgeable"] == 4 and quality["surviving"] == 3
    assert quality["agreement"] == pytest.approx(1 / 3)
    assert quality["agreement_standard_error"] == pytest.approx(math.sqrt((1 / 3) * (2 / 3) * 3 / 2 / 3))
    assert quality["coin_standard_error"] == pytest.approx(0.5 / math.sqrt(3))
    assert quality["orders"] == 10  # the position bias is over every pair asked
    with pytest.raises(ValueError):
        judge_quality(verdicts, right[:-1])


def test_win_rate_counts_a_pair_without_a_surviving_verdict_as_a_tie_and_failures_apart():
    verdicts = [verdict(*orders) for orders in [("a", "a")] * 3 + [("b", "b"), ("a", "b"), ("tie", "tie"), (None, "a")]]
    rate = win_rate(verdicts)
    assert (rate["judged"], rate["failed"], rate["wins"], rate["losses"]) == (6, 1, 3, 1)
    assert (rate["ties"], rate["no_verdict_position"], rate["no_verdict_tie"]) == (2, 1, 1)
    outcomes = [1, 1, 1, 0, 0.5, 0.5]
    assert rate["win_rate"] == pytest.approx(4 / 6)
    assert rate["standard_error"] == pytest.approx(math.sqrt(sum((o - 4 / 6) ** 2 for o in outcomes) / 5 / 6))
    assert rate["chose_first"] == pytest.approx(position_bias(verdicts)["chose_first"])
    assert math.isnan(win_rate([verdict(None, None)])["win_rate"])


@given(st.lists(st.tuples(*[st.sampled_from(["a", "b", "tie", None])] * 2), min_size=1, max_size=30))
def test_every_pair_is_counted_once(orders):
    verdicts = [verdict(*pair) for pair in orders]
    rate = win_rate(verdicts)
    assert rate["wins"] + rate["losses"] + rate["ties"] + rate["failed"] == len(verdicts)
    if rate["judged"]:
        assert rate["win_rate"] == pytest.approx((rate["wins"] + rate["ties"] / 2) / rate["judged"])
        ties = sum((v["a_first"] == "tie") + (v["b_first"] == "tie") for v in verdicts if v["outcome"] != "failed")
        assert rate["chose_first"] + rate["chose_second"] == pytest.approx(1 - ties / rate["orders"])


# A judge that reads: 24 of the 32 checked pairs chosen right in both orders, 4 wrong, 4 flipped.
READING = [verdict("a", "a")] * 24 + [verdict("b", "b")] * 4 + [verdict("a", "b"), verdict("b", "a")] * 2
# The tiny model's judge: the answer read first, every time.
BY_POSITION = [verdict("a", "b")] * 32


def test_a_judge_that_beats_a_coin_on_the_checkers_pairs_has_its_win_rate_read():
    quality = judge_quality(READING, ["a"] * 32)
    assert quality["agreement"] == pytest.approx(24 / 28) and judge_too_weak(quality) is None
    assert "It judges better than a coin, beyond 2 standard errors." in describe_judge(quality)
    better = win_rate([verdict("a", "a")] * 12 + [verdict("b", "b")] * 2 + [verdict("a", "b")] * 2)
    text = describe_win_rate(better, quality, "trained", "base")
    assert text.startswith("trained vs base, each pair judged in both orders: 12 wins, 2 losses, 2 without a verdict")
    assert f"win rate 0.812 ± {better['standard_error']:.3f}" in text and "trained judged better" in text
    even = win_rate([verdict("a", "a")] * 5 + [verdict("b", "b")] * 4 + [verdict("a", "b")])
    assert "the judge does not tell them apart" in describe_win_rate(even, quality, "trained", "base")
    worse = win_rate([verdict("b", "b")] * 10 + [verdict("a", "a")])
    assert "base judged better" in describe_win_rate(worse, quality, "trained", "base")


def test_a_judge_no_better_than_a_coin_or_by_position_makes_the_win_rate_say_nothing():
    by_position = judge_quality(BY_POSITION, ["a"] * 32)
    assert by_position["chose_first"] == 1.0 and by_position["flipped"] == 1.0 and by_position["surviving"] == 0
    reason = judge_too_weak(by_position)
    assert "read first in 100% of the 64 orders" in reason and "none of its verdicts" in reason
    assert "Too weak to judge" in describe_judge(by_position)
    # Even a lopsided rate is not presented as a verdict: the judge cannot judge.
    lopsided = win_rate([verdict("a", "a")] * 16)
    text = describe_win_rate(lopsided, by_position, "trained", "base")
    assert "The judge is too weak to judge" in text and "this win rate says nothing about the two models" in text
    assert "judged better" not in text
    # 9 of 14 surviving verdicts right: 0.64, within 2 of a coin's standard errors (0.13) of 0.5.
    coin = judge_quality([verdict("a", "a")] * 9 + [verdict("b", "b")] * 5, ["a"] * 14)
    assert "not beyond 2 standard errors of a coin's 0.5 (± 0.13)" in judge_too_weak(coin)
    assert "says nothing" in describe_win_rate(lopsided, coin)
    # A judge that reads on the checker's pairs but by position on these: too weak here.
    text = describe_win_rate(win_rate(BY_POSITION[:10]), judge_quality(READING, ["a"] * 32))
    assert "read first in 100% of the 20 orders" in text and "says nothing" in text
    unchecked = judge_quality(READING, [None] * 32)
    assert "no pair had exactly one right answer" in judge_too_weak(unchecked)
    assert "no win rate" in describe_win_rate(win_rate([verdict(None, "a")]), by_position)


def test_reference_pairs_set_each_problems_reference_against_a_wrong_answer():
    problems = [
        {"question": "2 + 3?", "answer": "2 + 3 = 5\n#### 5"},
        {"question": "4 + 4?", "answer": "4 + 4 = 8\n#### 8"},
        {"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"},
    ]
    base = ["#### 6", "#### 8", "#### 2"]
    trained = ["#### 5", "#### 7", "#### 2"]
    pairs = reference_pairs(GSM8KEnvironment(), problems, base, trained)
    assert pairs["problems"] == [0, 1]  # every answer to the third problem is right: no pair
    assert pairs["answers_a"] == [problems[0]["answer"], problems[1]["answer"]]
    assert pairs["answers_b"] == ["#### 6", "#### 7"]  # the first model's wrong answer, else the next's
    assert pairs["questions"] == ["2 + 3?", "4 + 4?"] and pairs["right"] == ["a", "a"]


def test_the_tiny_judge_constrained_to_one_token_gives_a_choice_in_every_order(llm_server, tiny_model_path):
    """The tiny model writes no JSON verdict; asked for one token with logit_bias on the ids of "1" and
    "2", it chooses in every order of every pair, through the real server, and is judged by the protocol."""
    from helpers.teacher_judge import choice_token_ids

    ids = choice_token_ids(tiny_model_path)
    problems = [
        {"question": f"Tom has {i} apples and buys 2 more. How many?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"}
        for i in range(6)
    ]
    pairs = reference_pairs(GSM8KEnvironment(), problems, [f"It is {i}." for i in range(6)])
    upstream = llm_server.base_url.removesuffix("/v1")
    with FaultProxy(upstream, []) as proxy:  # no faults: it passes every request on and records it
        with LLMClient(llm_server.model, base_url=proxy.base_url, api_key="k", timeout_s=5) as client:
            verdicts = PairwiseJudge(client, choice_token_ids=ids).compare(
                pairs["questions"], pairs["answers_a"], pairs["answers_b"]
            )
    assert len(verdicts) == 6 and all(v["a_first"] in ("a", "b") and v["b_first"] in ("a", "b") for v in verdicts)
    for body in proxy.bodies:
        assert body["max_tokens"] == 1 and body["temperature"] == 0.0
        assert body["logit_bias"] == {str(ids["1"]): 100, str(ids["2"]): 100}
    quality = judge_quality(verdicts, pairs["right"])
    assert quality["orders"] == 12 and quality["judgeable"] == 6
    assert quality["chose_first"] + quality["chose_second"] == pytest.approx(1.0)  # no ties in one token
    assert describe_judge(quality).startswith("The judge on 6 pairs where exactly one answer is right")


def test_a_judge_that_keeps_to_one_position_on_both_sets_of_pairs_is_told_so_once():
    from environments.llm_judge import judge_too_weak

    checked = {"chose_first": 0.0, "chose_second": 1.0, "orders": 32, "judgeable": 16, "surviving": 0}
    reason = judge_too_weak(checked, {"chose_first": 0.0, "chose_second": 1.0, "orders": 20})
    assert reason.startswith(
        "it chose the answer it read second in 100% of the 32 orders of the checked pairs, "
        "and in 100% of the 20 orders of these pairs; "
    )
    assert reason.count("it chose") == 1
    other_side = judge_too_weak(checked, {"chose_first": 1.0, "chose_second": 0.0, "orders": 20})
    assert "it chose the answer it read first in 100% of the 20 orders of these pairs" in other_side
