"""Preference pairs and DPO's loss, the one definition both halves use: ``dpo.py`` trains with them, and the
training-session loops import them in the SDK v3 environment, so this module needs torch alone (no
transformers, no model).

A pair is ``{"prompt", "chosen", "rejected"}``; the prompt becomes a user turn of the tokenizer's chat
template (with the generation prompt), each answer an assistant turn (with its end-of-turn token); as in
TRL, the completion starts where the tokens of prompt and prompt + answer part.
"""

from __future__ import annotations

import torch.nn.functional as F


def common_prefix_length(a: list[int], b: list[int]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


def tokenize_pair(tokenizer, row: dict, max_prompt_length: int, max_length: int) -> dict:
    """Token ids of the prompt and of both completions (as TRL's conversational format does)."""
    prompt = [{"role": "user", "content": row["prompt"]}]

    def ids(messages, add_generation_prompt=False):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt_ids = ids(prompt, add_generation_prompt=True)
    with_chosen = ids(prompt + [{"role": "assistant", "content": row["chosen"]}])
    with_rejected = ids(prompt + [{"role": "assistant", "content": row["rejected"]}])
    prompt_length = min(common_prefix_length(prompt_ids, with_chosen), common_prefix_length(prompt_ids, with_rejected))
    prompt_ids = prompt_ids[:prompt_length][-max_prompt_length:]  # keep the end: the question is at the end
    room = max_length - len(prompt_ids)
    return {
        "prompt_ids": prompt_ids,
        "chosen_ids": with_chosen[prompt_length:][:room],
        "rejected_ids": with_rejected[prompt_length:][:room],
    }


def dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float):
    """DPO's sigmoid loss per pair, and the implicit rewards beta * (logp - ref_logp). The log-probs are
    sums over each completion's tokens, one value per pair."""
    chosen_rewards = beta * (chosen_logps - ref_chosen_logps)
    rejected_rewards = beta * (rejected_logps - ref_rejected_logps)
    losses = -F.logsigmoid(chosen_rewards - rejected_rewards)
    return losses, chosen_rewards.detach(), rejected_rewards.detach()
