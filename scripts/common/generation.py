"""Sampling completions with transformers' ``generate``, for GRPO's rollouts and for evaluation.

``HFGenerator`` samples on the training model itself (no second copy of the weights to keep in
step): every prompt of a call in one batched ``generate`` with the KV cache, prompts padded on the
left so that all completions start at the same column. The sampling settings are the arguments
and nothing else: the log-probs GRPO's loss computes must be those of the distribution sampled
from, so nothing comes from the model card's generation config.
"""

from __future__ import annotations

import torch

from common import distributed
from common.data import pad_rows, prompt_token_ids  # noqa: F401 - prompt_token_ids: the scripts' generation.prompt_token_ids


def default_stop_ids(model, tokenizer) -> list[int]:
    """The model's end-of-sequence ids (one or a list in its generation config) and the tokenizer's."""
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
    return sorted(set(eos) | {tokenizer.eos_token_id})


class HFGenerator:
    """Completions of token-id prompts: ``generate(prompts, num_generations, greedy)``.

    ``temperature`` and ``top_p`` shape the sampling (``greedy=True`` ignores them); a completion
    ends at the first of ``stop_ids`` (default: the model's and tokenizer's end-of-sequence ids),
    which it keeps, or after ``max_new_tokens``.
    """

    def __init__(
        self,
        model,
        tokenizer,
        learners: distributed.Learners,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_ids: list[int] | None = None,
    ):
        if max_new_tokens < 1 or temperature <= 0 or not 0 < top_p <= 1:
            raise ValueError(
                f"max_new_tokens {max_new_tokens} must be at least 1, temperature {temperature} "
                f"positive and top_p {top_p} in (0, 1]."
            )
        self.model = model
        self.tokenizer = tokenizer
        self.learners = learners
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.stop_ids = stop_ids if stop_ids is not None else default_stop_ids(model, tokenizer)
        # FSDP layers gather their weights in every forward, a collective: learners that finish their
        # completions early must keep stepping until all have finished, or the others wait forever.
        self.synced_gpus = learners.world_size > 1 and distributed.is_fsdp(model)

    def _generation_config(self, greedy: bool):
        from transformers import GenerationConfig

        settings = dict(
            max_new_tokens=self.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            repetition_penalty=1.0,
            do_sample=not greedy,
        )
        if not greedy:
            settings.update(temperature=self.temperature, top_k=0, top_p=self.top_p)
        return GenerationConfig(**settings)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], num_generations: int = 1, greedy: bool = False
    ) -> tuple[list[list[int]], list[str]]:
        """``num_generations`` completions per prompt, ordered prompt by prompt: token ids (ending with
        the stop token when the model stopped) and decoded text."""
        rows = [ids for ids in prompts for _ in range(num_generations)]
        input_ids, attention_mask = pad_rows(rows, self.tokenizer.pad_token_id, left=True, device=self.learners.device)
        model = distributed.unwrap(self.model)
        was_training = model.training
        model.eval()
        # generate() fills unset options from model.generation_config (how differs between transformers
        # 4.x and 5.x); swapping it in for the call makes the sampling settings exactly ours in both.
        saved_config = model.generation_config
        model.generation_config = self._generation_config(greedy)
        try:
            with distributed.autocast(self.learners):
                output = model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, synced_gpus=self.synced_gpus
                )
        finally:
            model.generation_config = saved_config
            model.train(was_training)
        completions = []
        for row in output[:, input_ids.size(1) :].tolist():
            stop = next((i for i, token in enumerate(row) if token in self.stop_ids), None)
            completions.append(
                row if stop is None else row[: stop + 1]
            )  # keep the stop token: the model learns to stop
        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        return completions, texts
