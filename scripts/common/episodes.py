"""Episodes of several turns, token in and token out: the model answers, a tool replies, the model goes on.

An episode is one token sequence that only grows:

    prompt | turn 1 (sampled) | tool turn 1 | turn 2 (sampled) | tool turn 2 | ... | last turn (sampled)

Each next prompt is the previous one plus the tokens the sampler returned, as it returned them, plus
the tool turn's tokens. The model's own text is never decoded and encoded again: a round trip can
change tokens (``"1" "2"`` sampled as two tokens comes back as one ``"12"``), and then the sampler's
log-probs would belong to tokens that were never trained. Only the sampled tokens learn: they carry
weight 1 and the episode's advantage; the prompt's and every tool turn's tokens carry 0.

The loop gives a ``sample(tokens, max_tokens) -> (tokens, logprobs, stop_reason)`` function (a
training session's sampler, or ``generate`` in a job) and an environment with a tool
(``environments/python_tool.py``): its ``prompt_messages(example)``, its ``tool_call(text)`` (what a
turn asks the tool to do, or None when the turn is the final answer) and its ``run_tool(call)`` (the
tool's reply, and whether the tool failed). Nothing here knows which tool it is, nor how the final
answer is scored.

Torch-free: the job scripts, the session loops (SDK v3 environment) and the tests import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# Why an episode ended; those but "answered" get reward 0, and the loop counts each.
END_REASONS = ("answered", "turn_cap", "context", "length")
_MARK = "\x00ANSWER\x00"  # stands for an assistant turn's text while the chat template is rendered

Sampler = Callable[[list[int], int], tuple[list[int], list[float], str]]


@dataclass
class Episode:
    tokens: list[int]  # prompt, sampled turns and tool turns, in order
    sampled: list[bool]  # per token: drawn by the sampler (trained) or not (prompt, tool output)
    sampler_logprobs: list[float]  # per token: the sampler's log-prob where sampled, 0.0 elsewhere
    prompt_length: int
    turns: list[str] = field(default_factory=list)  # each sampled turn's text, for the reward and for people
    tool_replies: list[str] = field(default_factory=list)  # one per tool call that ran
    tool_failures: int = 0  # replies that report an error, a limit hit or a refused program
    end_reason: str = "answered"

    @property
    def final_text(self) -> str:
        return self.turns[-1] if self.turns else ""

    @property
    def sampled_tokens(self) -> int:
        return sum(self.sampled)


class ChatTurns:
    """The chat template's tokens for a conversation's start and for each tool turn, computed once per
    tool reply from the template itself (so every model's template is followed, SmolLM2's and
    Qwen's alike) and never from the model's own text."""

    def __init__(self, tokenizer, tool_role: str = "tool"):
        self.tokenizer, self.tool_role = tokenizer, tool_role
        self.end_of_turn = tokenizer.eos_token_id

    def prompt(self, messages: list[dict]) -> list[int]:
        tokens = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(tokens["input_ids"] if hasattr(tokens, "keys") else tokens)

    def tool_turn(self, reply: str, turn_closed: bool) -> list[int]:
        """The tokens after a sampled turn: the turn's end (unless the sampler already drew it), the tool's
        reply as a message of ``tool_role``, and the opening of the model's next turn."""
        conversation = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARK}]
        rendered = self.tokenizer.apply_chat_template(
            [*conversation, {"role": self.tool_role, "content": reply}], tokenize=False, add_generation_prompt=True
        )
        after_turn = rendered[rendered.index(_MARK) + len(_MARK) :]
        tokens = self.tokenizer.encode(after_turn, add_special_tokens=False)
        if turn_closed and tokens[:1] == [self.end_of_turn]:
            tokens = tokens[1:]  # the sampled turn ended with the end-of-turn token: it is not drawn twice
        return tokens


def run_episode(example: dict, environment, chat: ChatTurns, sample: Sampler, max_turns: int, context: int) -> Episode:
    """One episode of at most ``max_turns`` sampled turns within ``context`` tokens (see the module docstring).

    Ends "answered" when a turn is the final answer (the environment's ``tool_call`` is None),
    "turn_cap" when the last allowed turn still calls the tool, "context" when the next tool turn or
    sampled turn would not fit, "length" when a turn stopped at the room it had (an answer cut off)."""
    if max_turns < 1 or context < 2:
        raise ValueError(f"max_turns ({max_turns}) must be >= 1 and context ({context}) >= 2")
    prompt = chat.prompt(environment.prompt_messages(example))
    if len(prompt) >= context:
        raise ValueError(f"the prompt takes {len(prompt)} tokens, the whole context of {context}: shorten it")
    episode = Episode(list(prompt), [False] * len(prompt), [0.0] * len(prompt), len(prompt))
    for turn in range(max_turns):
        room = context - len(episode.tokens)
        tokens, logprobs, stop_reason = sample(list(episode.tokens), room)
        if len(tokens) != len(logprobs):
            raise ValueError(f"the sampler gave {len(tokens)} tokens and {len(logprobs)} log-probs")
        episode.tokens += tokens
        episode.sampled += [True] * len(tokens)
        episode.sampler_logprobs += [float(x) for x in logprobs]
        text = chat.tokenizer.decode(tokens, skip_special_tokens=True)  # read, never encoded again
        episode.turns.append(text)
        if stop_reason == "length" and len(tokens) >= room:
            episode.end_reason = "length"
            return episode
        call = environment.tool_call(text)
        if call is None:
            episode.end_reason = "answered"
            return episode
        if turn == max_turns - 1:
            episode.end_reason = "turn_cap"  # the call is not run: no turn is left to read its reply
            return episode
        reply, failed = environment.run_tool(call)
        episode.tool_replies.append(reply)
        episode.tool_failures += bool(failed)
        tool_tokens = chat.tool_turn(reply, turn_closed=bool(tokens) and tokens[-1] == chat.end_of_turn)
        if len(episode.tokens) + len(tool_tokens) + 1 > context:  # no room for the reply and one answer token
            episode.end_reason = "context"
            return episode
        episode.tokens += tool_tokens
        episode.sampled += [False] * len(tool_tokens)
        episode.sampler_logprobs += [0.0] * len(tool_tokens)
    return episode


def replay_episode(example: dict, environment, chat: ChatTurns, turns: list[str], context: int) -> Episode:
    """``turns`` played through ``run_episode`` as if the model had written them: the tool runs each
    call, and its reply is the real tool turn. For demonstrations (supervised warm-up, a format-tuned
    base model): weight 1 on the given turns, 0 on the prompt and the tool's replies."""
    tokenized = iter(chat.tokenizer.encode(t, add_special_tokens=False) + [chat.end_of_turn] for t in turns)

    def play(tokens: list[int], room: int) -> tuple[list[int], list[float], str]:
        turn = next(tokenized)
        if len(turn) > room:  # it does not fit: cut, as a sampler would, and the episode ends "length"
            return turn[:room], [0.0] * room, "length"
        return turn, [0.0] * len(turn), "stop"

    return run_episode(example, environment, chat, play, max_turns=len(turns), context=context)


def policy_gradient_inputs(episode: Episode, advantage: float) -> dict[str, list]:
    """The loss inputs of one episode for importance_sampling / ppo, shifted by one (position i of the
    model input predicts target i): every sampled token, in every turn, carries weight 1, its sampler
    log-prob and the advantage; prompt and tool tokens carry 0."""
    sampled = episode.sampled[1:]
    return {
        "model_input": episode.tokens[:-1],
        "target_tokens": episode.tokens[1:],
        "weights": [1.0 if s else 0.0 for s in sampled],
        "logprobs": [lp if s else 0.0 for lp, s in zip(episode.sampler_logprobs[1:], sampled, strict=True)],
        "advantages": [advantage if s else 0.0 for s in sampled],
    }
