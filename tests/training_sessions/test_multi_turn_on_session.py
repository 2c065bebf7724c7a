"""Multi-turn episodes over the real local session service, through SDK v3: the tokens a step trains are
exactly the ones the sampler drew, turn after turn, and the first step's ``sampler_kl`` is numeric noise;
and notebook 15's agent as a rollout handler of ``sagemaker.train.rft``, with that SDK's own types."""

from pathlib import Path

SCENARIOS = Path(__file__).with_name("multi_turn_scenarios.py")


def test_the_trained_tokens_are_the_sampled_ones_and_sampler_kl_is_noise(sdk):
    # The tiny random model's turns end at a newline: short episodes, two turns each, a tool turn between.
    run = sdk("episode_on_session", script=SCENARIOS, model="local/tiny-qwen2", turns=3, stop=["\n"])
    assert run["end_reasons"] == ["answered"] * 4 and run["turns"] == [2] * 4, run
    assert run["trained"] == run["drawn"]  # token for token, in every turn: nothing re-tokenized
    assert all(len(tokens) > 2 for tokens in run["drawn"]) and min(run["tool_tokens"]) > 0
    assert run["trained_tokens"] == sum(map(len, run["drawn"]))  # the tool turns' tokens carry weight 0
    # The sampler and the trainer are one model at one set of weights: their log-probs differ in the last bits.
    assert abs(run["sampler_kl"]) < 1e-5 and run["clip_fraction"] == 0.0, run


def _calls(seen, path_end):
    return [request for request in seen if request["path"].endswith(path_end)]


def test_the_rollout_handler_calls_the_model_with_the_inference_headers_runs_the_tool_and_reports(sdk):
    turns = ["Let me compute.\n```python\nprint(6 * 7)\n```", "The tool says 42.\n#### 42"]
    run = sdk("rft_rollout", script=SCENARIOS, turns=turns, max_turns=3)
    assert run["result"] == {
        "reward": 1.0,
        "correct": True,
        "end_reason": "answered",
        "tool_calls": 1,
        "tool_failures": 0,
        "turns": 2,
    }
    first, second = _calls(run["seen"], "/chat/completions")
    for call in (first, second):
        headers = {k.lower(): v for k, v in call["headers"].items()}
        assert headers["x-amzn-sagemaker-job-arn"].endswith("training-job/rft-local")
        assert headers["x-amzn-sagemaker-trajectory-id"] == "trajectory-1"
        assert call["body"]["model"] == "the-model-being-trained" and call["body"]["temperature"] == 0.7
    assert second["body"]["messages"][-1]["content"] == "The tool printed:\n42"  # the sandbox's real output
    (complete,) = _calls(run["seen"], "/complete-rollout")
    (reward,) = _calls(run["seen"], "/update-reward")
    assert complete["body"] == {"JobArn": complete["body"]["JobArn"], "TrajectoryId": "trajectory-1", "Status": "ready"}
    assert reward["body"]["Rewards"] == [1.0] and reward["headers"]["Authorization"].startswith("Bearer ")


def test_a_rollout_at_the_turn_cap_reports_reward_zero_and_a_looping_program_is_stopped(sdk):
    loop = "```python\nwhile True:\n    pass\n```"
    run = sdk("rft_rollout", script=SCENARIOS, turns=[loop, loop], max_turns=2, program_limits={"time_limit": 0.5})
    assert run["result"]["end_reason"] == "turn_cap" and run["result"]["reward"] == 0.0
    assert run["result"]["tool_calls"] == 1 and run["result"]["tool_failures"] == 1
    second = _calls(run["seen"], "/chat/completions")[1]
    assert "ran past its time limit" in second["body"]["messages"][-1]["content"]
    (reward,) = _calls(run["seen"], "/update-reward")
    assert reward["body"]["Rewards"] == [0.0]
