"""A multi-turn episode sampled by the session engine and scored again by it: the log-probs the trainer
computes for the episode's sampled tokens, turn after turn, are the sampler's own (``sampler_kl`` at
step 1 is numeric noise), because the episode holds the sampled tokens as drawn, never re-tokenized."""

import pytest
from common.episodes import ChatTurns, policy_gradient_inputs, run_episode

from .conftest import trained_looking_engine


class OneToolCallThenAnswer:
    """A tool environment reduced to its turns: the first turn calls the tool, which replies; the next
    turn is the answer. The episode's bookkeeping is what is tested here, not a tool."""

    def prompt_messages(self, example):
        return [{"role": "user", "content": example["question"]}]

    def tool_call(self, text):
        self.calls = getattr(self, "calls", 0) + 1
        return "run" if self.calls == 1 else None

    def run_tool(self, call):
        return "the tool printed 42", False


@pytest.fixture(scope="module")
def session_engine(tiny_model_path, one_thread):
    return trained_looking_engine(tiny_model_path, seed=3)


def test_the_trainers_logprobs_of_every_turn_are_the_samplers(session_engine):
    def sample(tokens, room):
        (drawn,) = session_engine.sample(
            tokens, 1, {"maxTokens": min(room, 12), "temperature": 1.0, "seed": len(tokens)}
        )
        return drawn["tokens"], drawn["logprobs"], drawn["stopReason"]

    chat = ChatTurns(session_engine.tokenizer)
    episode = run_episode({"question": "What is 6 times 7?"}, OneToolCallThenAnswer(), chat, sample, 3, 256)
    assert episode.end_reason == "answered" and len(episode.turns) == 2 and episode.tool_replies

    scored = session_engine.compute_logprobs(episode.tokens)  # one forward pass over the whole episode
    inputs = policy_gradient_inputs(episode, advantage=1.0)
    pairs = [
        (lp, scored[i + 1]) for i, (lp, w) in enumerate(zip(inputs["logprobs"], inputs["weights"], strict=True)) if w
    ]
    assert len(pairs) == episode.sampled_tokens > 2
    differences = [sampler - trainer for sampler, trainer in pairs]
    sampler_kl = sum(differences) / len(differences)
    # fp32 both: the sampler's incremental passes (KV cache) and one full pass differ in the last bits only
    assert max(map(abs, differences)) < 1e-4 and abs(sampler_kl) < 1e-5, differences
