"""The Python tool's second task: functions to complete (HumanEval's form). The model may try its function
in the tool, then answers with '#### done'; the code judge runs the last function it wrote against the
problem's tests in the same sandbox."""

import json

import pytest
from common import stats
from common.episodes import ChatTurns, replay_episode
from environments import make_environment
from environments.python_tool import demonstration
from transformers import AutoTokenizer

from local_mode.offline_data import function_problem_records
from local_mode.tiny_model import tiny_model_dir


@pytest.fixture(scope="module")
def chat():
    return ChatTurns(AutoTokenizer.from_pretrained(tiny_model_dir()))


@pytest.fixture(scope="module")
def env(code_sandbox):
    return make_environment("python_tool", sandbox=code_sandbox, task="functions")


@pytest.fixture(scope="module")
def problem():
    return next(p for p in function_problem_records(40, seed=3) if p["fn_name"].startswith("add_k"))


def _function(problem: dict, body: str) -> str:
    return f"{problem['starter_code']}    {body}\n"


def _first_call(problem: dict) -> str:
    arguments = ", ".join(repr(a) for a in json.loads(problem["tests"][0]["input"]))
    return f"print({problem['fn_name']}({arguments}))"


def test_the_prompt_poses_the_function_and_says_how_to_use_the_tool_and_answer(env, problem):
    system, user = env.prompt_messages(problem)
    assert "```python" in system["content"] and "#### done" in system["content"]
    assert problem["starter_code"].splitlines()[0] in user["content"]


def test_a_function_tried_in_the_tool_then_done_is_judged_by_every_test(env, chat, problem):
    program = _function(problem, problem["canonical_solution"].strip()) + _first_call(problem)
    episode = replay_episode(problem, env, chat, [f"```python\n{program}\n```", "It works.\n#### done"], 1024)
    assert episode.end_reason == "answered" and episode.tool_failures == 0
    assert episode.tool_replies == [str(json.loads(problem["tests"][0]["output"]))]  # the call the model printed
    (score,) = env.score_episodes([problem], [episode])
    assert score["correct"] and score["reward"] == 1.0 and score["verdict"] == "accepted"
    assert score["format_reward"] == 1.0 and score["tool_calls"] == 1 and score["turns"] == 2
    assert score["passed"] == score["total"] == len(problem["tests"])


def test_the_final_turns_own_function_is_the_answer_over_the_one_it_tried(env, chat, problem):
    wrong = _function(problem, "return 0") + _first_call(problem)
    right = _function(problem, problem["canonical_solution"].strip())
    turns = [f"```python\n{wrong}\n```", f"Fixed:\n```python\n{right}```\n#### done"]
    (fixed,) = env.score_episodes([problem], [replay_episode(problem, env, chat, turns, 1024)])
    assert fixed["correct"] and fixed["tool_calls"] == 1
    # and the other way round: the last function it ran is the answer when the final turn has none
    (kept,) = env.score_episodes([problem], [replay_episode(problem, env, chat, [turns[0], "#### done"], 1024)])
    assert not kept["correct"] and kept["verdict"] == "wrong_answer" and kept["reward"] < 1.0


def test_done_without_any_function_scores_nothing_and_gives_no_answer(env, chat, problem):
    episode = replay_episode(problem, env, chat, ["I am not sure.\n#### done"], 1024)
    (score,) = env.score_episodes([problem], [episode])
    assert score["verdict"] == "no_code" and score["reward"] == 0.0 and not score["correct"]
    assert stats.given_answer(env.answer_text(episode), score) is None


def test_an_episode_cut_by_the_turn_cap_gets_zero_and_no_answer(env, chat, problem):
    program = _function(problem, problem["canonical_solution"].strip()) + _first_call(problem)
    turns = [f"```python\n{program}\n```"] * 2
    episode = replay_episode(problem, env, chat, turns, 1024)
    assert episode.end_reason == "turn_cap"
    (score,) = env.score_episodes([problem], [episode])
    assert score["reward"] == 0.0 and not score["correct"] and score["end_reason"] == "turn_cap"
    assert env.answer_text(episode) == ""


def test_a_hostile_program_in_the_tool_is_contained_and_the_episode_goes_on(env, chat, problem):
    hostile = "import os\nprint(os.listdir('/'))\nopen('/tmp/escaped', 'w').write('x')"
    right = _function(problem, problem["canonical_solution"].strip())
    episode = replay_episode(
        problem, env, chat, [f"```python\n{hostile}\n```", f"```python\n{right}```\n#### done"], 1024
    )
    assert episode.end_reason == "answered" and episode.tool_failures == 1
    assert episode.tool_replies[0].startswith(("Stopped", "Error"))
    (score,) = env.score_episodes([problem], [episode])
    assert score["correct"] and score["tool_failures"] == 1


def test_the_demonstration_replays_to_a_right_answer_through_the_real_tool(env, chat):
    for problem in function_problem_records(12, seed=5):
        episode = replay_episode(problem, env, chat, demonstration(problem), 1024)
        assert episode.end_reason == "answered" and episode.tool_failures == 0, episode.tool_replies
        (score,) = env.score_episodes([problem], [episode])
        assert score["correct"], (problem["fn_name"], score)


def test_without_the_tool_the_task_is_the_code_environment_in_the_same_sandbox(env, problem):
    right = "```python\n" + _function(problem, problem["canonical_solution"].strip()) + "```"
    env.step_metrics()  # the earlier tests' episodes
    scores = env.single_turn.score([problem, problem], [right, "no program"])
    assert [s["verdict"] for s in scores] == ["accepted", "no_code"]
    assert env.step_metrics()["test_pass_fraction"] == pytest.approx(0.5)


def test_an_unknown_task_is_refused_with_the_choices(code_sandbox):
    with pytest.raises(ValueError, match="gsm8k, functions"):
        make_environment("python_tool", sandbox=code_sandbox, task="chess")
