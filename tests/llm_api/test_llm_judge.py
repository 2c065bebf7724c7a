"""The rubric judge as an environment: rewards from parsed verdicts, failures excluded and counted,
mixed with the GSM8K checker; the pairwise judge's one-token choices (its protocol: test_judge_protocol.py)."""

from __future__ import annotations

import math

import pytest
from common.advantages import group_advantages, group_advantages_excluding
from common.llm_client import LLMClient, ParseError
from environments import Environment, make_environment
from environments.llm_judge import LLMJudgeEnvironment, PairwiseJudge, parse_choice
from fault_proxy import FaultProxy
from hypothesis import given
from hypothesis import strategies as st

PROBLEM = {"question": "Tom has 3 apples and buys 2 more. How many apples?", "answer": "3 + 2 = 5\n#### 5"}


def client_for(server, base_url=None, **options) -> LLMClient:
    return LLMClient(server.model, base_url=base_url or server.base_url, api_key="k", timeout_s=5, **options)


def test_a_judge_that_cannot_answer_in_form_excludes_every_sample_and_says_so(llm_server):
    """The tiny model writes no JSON: every verdict fails to parse. No sample is scored 0."""
    with client_for(llm_server) as client:
        env = make_environment("llm_judge", client=client)
        assert isinstance(env, Environment)
        completions = ["#### 5", "It is 6.", "5 apples\n#### 5", "no idea"]
        scores = env.score([PROBLEM] * 4, completions)
        metrics = env.step_metrics()
    assert all(s["judge_failed"] and math.isnan(s["reward"]) and s["judge_error"] for s in scores)
    assert metrics["judge_failed"] == 4 and metrics["judge_failure_rate"] == 1.0
    assert metrics["judge_requests"] == 4 and metrics["judge_tokens"] > 0
    assert client.usage.parse_failures == 4
    rewards = [s["reward"] for s in scores]
    assert group_advantages_excluding(rewards, group_size=4) == ([0.0] * 4, 4)
    with pytest.raises(ValueError, match="non-finite"):  # a loop that does not exclude stops loudly
        group_advantages(rewards, group_size=4)


def test_verdicts_become_rewards_mixed_with_the_checker(llm_server):
    replies = [
        '{"score": 10, "reason": "right and in format"}',
        "The answer looks fine, 8/10.",  # not the required JSON: a failure
        '{"score": 11, "reason": "too generous"}',  # outside 0..10: a failure
        '```json\n{"score": 0, "reason": "wrong"}\n```',
    ]
    upstream = llm_server.base_url.removesuffix("/v1")
    with FaultProxy(upstream, [f"reply:{r}" for r in replies]) as proxy:
        with client_for(llm_server, proxy.base_url, max_concurrency=1) as client:
            env = LLMJudgeEnvironment(client, verifiable="gsm8k", judge_weight=0.5)
            completions = ["3 + 2 = 5\n#### 5", "#### 5", "#### 6", "It is 7"]
            scores = env.score([PROBLEM] * 4, completions)
            metrics = env.step_metrics()
            assert env.prompt_messages(PROBLEM)[-1]["content"] == PROBLEM["question"]
    # Each request carried the rubric, the question and the answer it grades.
    for body, completion in zip(proxy.bodies, completions, strict=True):
        assert "Answer to grade:\n" + completion in body["messages"][1]["content"]
        assert body["temperature"] == 0.0
    assert scores[0]["reward"] == pytest.approx(1.0 + 0.5 * 1.0) and scores[0]["correct"]
    assert scores[3]["reward"] == pytest.approx(0.0) and not scores[3]["correct"]
    assert scores[1]["judge_failed"] and "not JSON" in scores[1]["judge_error"] and math.isnan(scores[1]["reward"])
    assert scores[2]["judge_failed"] and "outside 0..10" in scores[2]["judge_error"]
    assert scores[1]["correct"] and scores[1]["format_reward"] == 1.0  # the checker's own fields stay
    assert metrics["judge_failed"] == 2 and metrics["judge_failure_rate"] == 0.5
    assert metrics["judge_score"] == pytest.approx(0.5)  # mean of the verdicts given: 1.0 and 0.0
    advantages, excluded = group_advantages_excluding([s["reward"] for s in scores], 4, "none")
    assert excluded == 2 and advantages == pytest.approx([0.75, 0.0, 0.0, -0.75])
    assert env.step_metrics()["judge_failed"] == 0  # per step: counted once


def test_choices_are_one_token_each_or_refused(tiny_model_path, llm_server):
    from helpers.teacher_judge import choice_token_ids

    ids = choice_token_ids(tiny_model_path)
    assert set(ids) == {"1", "2"} and ids["1"] != ids["2"]
    with pytest.raises(ValueError, match="one token per choice"):
        choice_token_ids(tiny_model_path, ("1", "A long choice"))
    with client_for(llm_server) as client, pytest.raises(ValueError, match='exactly "1" and "2"'):
        PairwiseJudge(client, choice_token_ids={"A": 1, "B": 2})


@given(st.text(max_size=8))
def test_a_constrained_verdict_is_the_choice_alone(text):
    if text.strip() in ("1", "2"):
        assert parse_choice(text)["better"] == int(text.strip())
    else:
        with pytest.raises(ParseError, match="expected the choice 1 or 2"):
            parse_choice(text)


def test_grpo_job_mixes_the_judge_with_the_checker_and_leaves_out_what_it_could_not_judge(
    llm_server, tiny_model_path, offline_data, tmp_path
):
    """grpo.py with --judge_model: the judge's verdicts join the checker's reward; a verdict that does
    not parse leaves its sample out of its group (counted as ``unrewarded``), and the job trains on."""
    import json
    import re

    from container_env import container_env, run_script

    verdicts = [json.dumps({"score": score, "reason": "r"}) for score in (10, 0, 5, 2, 8, 3)]
    replies = [f"reply:{verdicts[i % 6]}" if i % 4 else "reply:The answer looks fine, 8/10." for i in range(16)]
    marker = "marker-key-judge-in-grpo"
    with FaultProxy(llm_server.base_url.removesuffix("/v1"), replies) as proxy:
        env = container_env(tmp_path, {"train": offline_data["gsm8k"]})
        env["OPENAI_API_KEY"] = marker
        options = ["--max_steps", "2", "--prompts_per_step", "2", "--group_size", "4", "--micro_batch_size", "4"]
        options += ["--max_new_tokens", "12", "--learning_rate", "1e-3", "--seed", "3", "--checkpoint_every", "0"]
        done = run_script(
            ["python", "grpo.py", "--model_name_or_path", str(tiny_model_path), *options,
             "--checkpoint_dir", str(tmp_path / "checkpoints"), "--judge_model", llm_server.model,
             "--llm_base_url", proxy.base_url, "--judge_weight", "0.5"],
            env, timeout=240, merge_output=True,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("step=")]
    assert len(lines) == 2, done.stdout[-3000:]

    def metric(name):
        return [float(re.search(rf"\b{name}=(-?[0-9.]+(?:e[-+]?\d+)?)", line).group(1)) for line in lines]

    # Every fourth reply does not parse; a repeated completion is answered by the cache, as it was the first time.
    failed = sum(1 for i in range(len(proxy.bodies)) if i % 4 == 0)
    assert failed > 0 and sum(metric("judge_failed")) >= failed
    assert sum(metric("unrewarded")) == sum(metric("judge_failed"))  # each one left out, none scored 0
    assert sum(metric("unrewarded")) < 16  # the others were judged and trained on
    assert all(math.isfinite(v) for name in ("reward", "loss", "grad_norm") for v in metric(name))
    assert all(h["authorization"] == f"Bearer {marker}" for h in proxy.headers)
    assert marker not in done.stdout and "judge: requests" in done.stdout
