"""Episodes with a Python tool: token in, token out; only the model's tokens learn; the sandbox's limits,
the turn cap and the context end an episode with a counted reason, never a crash."""

import pytest
from common.episodes import ChatTurns, policy_gradient_inputs, run_episode
from environments import make_environment
from transformers import AutoTokenizer

from local_mode.tiny_model import tiny_model_dir

PROBLEM = {"question": "What is 6 times 7?", "answer": "6 * 7 = 42\n#### 42"}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(tiny_model_dir())


@pytest.fixture(scope="module")
def tool_env(code_sandbox):
    return make_environment("python_tool", sandbox=code_sandbox)


def split_unusually(tokenizer, text: str) -> list[int]:
    """``text``'s tokens with one multi-character token drawn as two shorter ones, as a sampler may draw
    them: decoding and encoding again would give other tokens than were sampled."""
    tokens = tokenizer.encode(text, add_special_tokens=False)
    for index, token in enumerate(tokens):
        piece = tokenizer.decode([token])
        for cut in range(1, len(piece)):
            left = tokenizer.encode(piece[:cut], add_special_tokens=False)
            right = tokenizer.encode(piece[cut:], add_special_tokens=False)
            if len(left) == len(right) == 1:
                return tokens[:index] + left + right + tokens[index + 1 :]
    raise AssertionError(f"no token of {text!r} splits in two")


class ScriptedSampler:
    """Answers each turn with the next of ``turns`` (token lists), recording the prompts it was given."""

    def __init__(self, turns: list[list[int]]):
        self.turns, self.prompts = list(turns), []

    def __call__(self, tokens: list[int], room: int):
        self.prompts.append(list(tokens))
        drawn = self.turns.pop(0)[:room]
        return drawn, [-0.5 - 0.01 * i for i in range(len(drawn))], "stop" if len(drawn) < room else "length"


def test_the_trained_tokens_are_exactly_the_sampled_ones_and_only_they_learn(tokenizer, tool_env):
    call = split_unusually(tokenizer, "Let me compute.\n```python\nprint(6 * 7)\n```\n")
    assert tokenizer.encode(tokenizer.decode(call), add_special_tokens=False) != call  # a round trip would change them
    answer = tokenizer.encode("So it is 42.\n#### 42", add_special_tokens=False) + [tokenizer.eos_token_id]
    sampler, chat = ScriptedSampler([call, answer]), ChatTurns(tokenizer)
    episode = run_episode(PROBLEM, tool_env, chat, sampler, max_turns=3, context=512)

    assert episode.end_reason == "answered" and episode.tool_replies == ["42"] and episode.tool_failures == 0
    prompt = chat.prompt(tool_env.prompt_messages(PROBLEM))
    tool_turn = chat.tool_turn("42", turn_closed=False)
    assert episode.tokens == prompt + call + tool_turn + answer  # appended, never re-tokenized
    assert sampler.prompts == [prompt, prompt + call + tool_turn]  # each prompt extends the previous one
    assert "42" in tokenizer.decode(tool_turn) and "tool" in tokenizer.decode(tool_turn)
    assert [t for t, s in zip(episode.tokens, episode.sampled, strict=True) if s] == call + answer

    inputs = policy_gradient_inputs(episode, advantage=0.75)
    sampled_targets = [t for t, w in zip(inputs["target_tokens"], inputs["weights"], strict=True) if w]
    assert sampled_targets == call + answer  # weight 1 on every sampled token of every turn, 0 elsewhere
    assert sum(inputs["weights"]) == len(call) + len(answer)
    assert {a for a, w in zip(inputs["advantages"], inputs["weights"], strict=True) if not w} == {0.0}
    assert [lp for lp, w in zip(inputs["logprobs"], inputs["weights"], strict=True) if w] == [
        -0.5 - 0.01 * i for i in range(len(call))
    ] + [-0.5 - 0.01 * i for i in range(len(answer))]

    (score,) = tool_env.score_episodes([PROBLEM], [episode])
    assert score["correct"] and score["reward"] == 1.0 and score["tool_calls"] == 1 and score["turns"] == 2


def test_a_turn_that_ended_with_its_end_of_turn_token_does_not_get_it_twice(tokenizer):
    chat = ChatTurns(tokenizer)
    open_turn, closed_turn = chat.tool_turn("7", turn_closed=False), chat.tool_turn("7", turn_closed=True)
    assert open_turn[0] == tokenizer.eos_token_id and closed_turn == open_turn[1:]


def program_turn(tokenizer, program: str) -> list[int]:
    return tokenizer.encode(f"```python\n{program}\n```\n", add_special_tokens=False)


@pytest.mark.parametrize(
    "program, reply_starts",
    [
        ("while True:\n    pass", "Stopped: the program ran past its time limit"),
        ("print(1 / 0)", "Error:\n"),
        ("import socket\nsocket.create_connection(('127.0.0.1', 9))", None),  # refused, by whichever layer
        ("open('/tmp/python-tool-was-here', 'w').write('x')", None),
    ],
)
def test_a_failing_or_hostile_call_gets_a_reply_and_the_episode_goes_on(tokenizer, tool_env, program, reply_starts):
    answer = tokenizer.encode("#### 42", add_special_tokens=False)
    sampler = ScriptedSampler([program_turn(tokenizer, program), answer])
    episode = run_episode(PROBLEM, tool_env, ChatTurns(tokenizer), sampler, max_turns=3, context=1024)
    assert episode.end_reason == "answered" and episode.tool_failures == 1, episode.tool_replies
    (reply,) = episode.tool_replies
    assert reply.startswith(reply_starts or ("Stopped:", "Error:")), reply
    assert tool_env.score_episodes([PROBLEM], [episode])[0]["reward"] == 1.0  # shaping is off by default
    assert tool_env.run_tool("print(2 + 2)") == ("4", False)  # the tool still works after it


def test_an_answer_that_never_ends_its_turns_stops_at_the_cap_with_reward_zero(tokenizer, tool_env):
    sampler = ScriptedSampler([program_turn(tokenizer, "print(42)")] * 3)
    episode = run_episode(PROBLEM, tool_env, ChatTurns(tokenizer), sampler, max_turns=3, context=1024)
    assert episode.end_reason == "turn_cap" and len(episode.turns) == 3 and len(episode.tool_replies) == 2
    (score,) = tool_env.score_episodes([PROBLEM], [episode])
    assert score["reward"] == 0.0 and score["end_reason"] == "turn_cap" and score["tool_calls"] == 2


def test_a_context_overflow_truncates_the_episode_with_a_reason(tokenizer, tool_env):
    call = program_turn(tokenizer, "print('x' * 500)")
    prompt = ChatTurns(tokenizer).prompt(tool_env.prompt_messages(PROBLEM))
    room = len(prompt) + len(call) + 20  # the call fits; its long reply does not
    episode = run_episode(PROBLEM, tool_env, ChatTurns(tokenizer), ScriptedSampler([call]), max_turns=3, context=room)
    assert episode.end_reason == "context" and len(episode.tokens) <= room
    assert tool_env.score_episodes([PROBLEM], [episode])[0]["reward"] == 0.0

    cut = run_episode(PROBLEM, tool_env, ChatTurns(tokenizer), ScriptedSampler([call]), 3, len(prompt) + 5)
    assert cut.end_reason == "length" and len(cut.tokens) == len(prompt) + 5


def test_shaping_is_a_parameter_and_bad_values_are_refused(tokenizer, code_sandbox):
    shaped = make_environment("python_tool", sandbox=code_sandbox, tool_error_penalty=0.25, tool_call_cost=0.1)
    answer = tokenizer.encode("#### 42", add_special_tokens=False)
    sampler = ScriptedSampler([program_turn(tokenizer, "print(1 / 0)"), answer])
    episode = run_episode(PROBLEM, shaped, ChatTurns(tokenizer), sampler, max_turns=3, context=1024)
    assert shaped.score_episodes([PROBLEM], [episode])[0]["reward"] == pytest.approx(1.0 - 0.25 - 0.1)
    assert shaped.step_metrics() == {"tool_calls": 1.0, "tool_failure_rate": 1.0}
    with pytest.raises(ValueError, match="tool_error_penalty"):
        make_environment("python_tool", sandbox=code_sandbox, tool_error_penalty=-1)


def test_a_worked_answers_calculations_become_a_demonstrated_tool_call(tokenizer, tool_env):
    from environments.python_tool import demonstration

    from helpers.training_sessions import tool_rl

    worked = {"question": "Mei has 7 cards and gives 5 away. How many are left?", "answer": "7-5 = <<7-5=2>>2\n#### 2"}
    stated = {"question": "A week has how many days?", "answer": "A week has 7 days.\n#### 7"}
    assert demonstration(worked) == ["```python\nprint(7-5)\n```", "#### 2"]
    assert demonstration(stated) == ["#### 7"]
    shown, direct = tool_rl.warmup_episodes(tool_env, ChatTurns(tokenizer), [worked, stated], context=1024)
    assert shown.tool_replies == ["2"] and shown.end_reason == "answered" and len(shown.turns) == 2
    assert direct.tool_replies == [] and direct.turns == ["#### 7"]
    assert "[tool turn, weight 0]" in tool_rl.show_episode(tokenizer, shown)
    # a demonstration longer than the context is cut where a sampler would stop, and left out
    prompt_length = shown.prompt_length
    assert tool_rl.warmup_episodes(tool_env, ChatTurns(tokenizer), [worked], context=prompt_length + 3) == []
