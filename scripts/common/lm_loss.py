"""The LM head's next-token loss without the full logits: the head and its cross-entropy chunk by chunk.

A causal LM's last step turns every position's hidden state (``hidden``) into one logit per vocabulary
entry. For Qwen2.5's 151,936 entries and 4 x 2048 tokens that is 1.2 G numbers, and the loss keeps
several copies of them at once (bf16 logits, fp32 log-softmax, fp32 gradients: 14 bytes a logit at
the peak, measured 17 GiB of an H200's 35 GiB: ``bench/memory_plan.py``). Here the head and the
cross-entropy run ``chunk_tokens`` target positions at a time under activation checkpointing: the
forward keeps only each chunk's loss, the backward recomputes one chunk's logits, takes their
gradient and lets them go before the next. Only target positions (labels other than
``IGNORE_INDEX``) go through the head at all, so prompt and padding tokens cost nothing. The price is
the head's forward run twice (a third more arithmetic in the head; none in the decoder layers).

The same numbers as the full-logits loss (``sft.token_loss_sum(head(hidden), labels)``): each chunk's
logits are computed as the head computes them (bf16 under autocast, then fp32 for the
cross-entropy); only the order in which the per-token losses and the head's gradient are summed
differs (``tests/sft_dpo/test_sft_memory_options.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from common.distributed import unwrap

IGNORE_INDEX = -100  # label of positions that carry no loss (prompt, padding)


def final_hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The decoder's output (after the final norm), what the LM head reads: batch x positions x hidden.

    The model's own forward runs (so DDP's, FSDP2's and peft's hooks and wrappers do what they do for
    any step), asked for the logits of the last position only (``logits_to_keep=1``, a row of logits
    per sequence, unused); the hidden states are taken from the decoder's output on the way.
    """
    captured = []
    decoder = unwrap(model).get_decoder()
    handle = decoder.register_forward_hook(lambda module, args, output: captured.append(output[0]))
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=1)
    finally:
        handle.remove()
    return captured[-1]


def output_head(model) -> torch.nn.Module:
    """The LM head (``lm_head``; a peft layer when LoRA adapts it), called on hidden states."""
    return unwrap(model).get_output_embeddings()


def _chunk_loss_sum(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), targets, reduction="sum")


def chunked_token_loss_sum(
    hidden: torch.Tensor, head: torch.nn.Module, labels: torch.Tensor, chunk_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of next-token cross-entropies over target positions, and how many there are, with at most
    ``chunk_tokens`` positions' logits alive at a time. Position t predicts token t+1, so hidden
    states drop the last position and labels the first."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    targets = labels[:, 1:].reshape(-1)
    keep = targets != IGNORE_INDEX
    hidden = hidden[:, :-1].reshape(-1, hidden.size(-1))[keep]
    targets = targets[keep]
    total = None
    # At least one chunk, empty when nothing is a target: the head's parameters still get a (zero)
    # gradient, as with the full logits, so DDP's all-reduce finds every gradient it waits for.
    for start in range(0, max(targets.numel(), 1), chunk_tokens):
        piece = slice(start, start + chunk_tokens)
        if torch.is_grad_enabled():
            chunk = checkpoint(_chunk_loss_sum, head, hidden[piece], targets[piece], use_reentrant=False)
        else:
            chunk = _chunk_loss_sum(head, hidden[piece], targets[piece])
        total = chunk if total is None else total + chunk
    return total, keep.sum()
