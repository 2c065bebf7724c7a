"""Sampling completions with transformers' ``generate``, for GRPO's rollouts, for evaluation and for
the training-session service.

Both ways sample on the model itself (no second copy of the weights to keep in step): every prompt
of a call in one batched ``generate`` with the KV cache, prompts padded on the left so that all
completions start at the same column. The sampling settings are the arguments and nothing else:
the log-probs a loss computes must be those of the distribution sampled from, so nothing comes from
the model card's generation config.

  * ``HFGenerator`` (the job scripts): one group of settings for the whole batch, drawn from
    torch's global generator, which the script seeds once per learner.
  * ``sample_requests`` (the session service): requests with their own settings, token limits,
    stop strings and seeds in one batch. Each request draws from its own ``torch.Generator``, so
    its samples are the same alone, batched with others, or beside another session's sampling.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from common import distributed
from common.data import pad_rows, prompt_token_ids  # noqa: F401 - prompt_token_ids: the scripts' generation.prompt_token_ids


def default_stop_ids(model, tokenizer) -> list[int]:
    """The model's end-of-sequence ids (one or a list in its generation config) and the tokenizer's."""
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
    return sorted(set(eos) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()))


def generation_config(
    *,
    max_new_tokens: int,
    stop_ids: list[int],
    pad_token_id: int | None,
    greedy: bool,
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> GenerationConfig:
    """Exactly these settings: no repetition penalty, no top-k, nothing from the model card."""
    settings = dict(
        max_new_tokens=max_new_tokens,
        eos_token_id=stop_ids,
        pad_token_id=pad_token_id,
        repetition_penalty=1.0,
        do_sample=not greedy,
    )
    if not greedy:
        settings.update(temperature=temperature, top_k=0, top_p=top_p)
    return GenerationConfig(**settings)


@contextlib.contextmanager
def sampling_settings(model, config: GenerationConfig):
    """``generate()`` fills unset options from ``model.generation_config`` (how differs between
    transformers 4.x and 5.x); swapping ours in for the call makes the settings exactly ours in both.
    A peft model generates through its base model, whose config is the one read."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = saved


class HFGenerator:
    """Completions of token-id prompts: ``generate(prompts, num_generations, greedy)``.

    ``temperature`` and ``top_p`` shape the sampling (``greedy=True`` ignores them); a completion
    ends at the first of ``stop_ids`` (default: the model's and tokenizer's end-of-sequence ids),
    which it keeps, at the end of the first of ``stop_strings`` (transformers' own stop-string
    criterion; the token that completes it kept), or after ``max_new_tokens``.
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
        stop_strings: list[str] | None = None,
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
        self.stop_strings = [text for text in stop_strings or [] if text]
        # FSDP layers gather their weights in every forward, a collective: learners that finish their
        # completions early must keep stepping until all have finished, or the others wait forever.
        self.synced_gpus = learners.world_size > 1 and distributed.is_fsdp(model)

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
        config = generation_config(
            max_new_tokens=self.max_new_tokens,
            stop_ids=self.stop_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            greedy=greedy,
            temperature=self.temperature,
            top_p=self.top_p,
        )
        try:
            with sampling_settings(model, config), distributed.autocast(self.learners):
                stop_strings = (
                    {"stop_strings": self.stop_strings, "tokenizer": self.tokenizer} if self.stop_strings else {}
                )
                output = model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, synced_gpus=self.synced_gpus, **stop_strings
                )
        finally:
            model.train(was_training)
        completions = []
        for row in output[:, input_ids.size(1) :].tolist():
            end = end_of_sample(row, self.stop_ids, self.stop_strings, self.tokenizer)
            completions.append(row if end is None else row[:end])  # keep the stop token: the model learns to stop
        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        return completions, texts


# --------------------------------------------------------------------------- per-request sampling


@dataclass
class SampleRequest:
    """One caller's prompt and settings. ``temperature`` 0 is greedy; ``top_k`` 0 and ``top_p`` 1
    leave the distribution whole; ``seed`` None draws a fresh seed."""

    prompt: list[int]
    num_samples: int
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)

    def __post_init__(self):
        # Checked here, before a request joins a batch: a bad one must not fail the others' pass.
        problems = []
        if not self.prompt:
            problems.append("the prompt is empty")
        if self.num_samples < 1 or self.max_new_tokens < 1:
            problems.append(f"num_samples {self.num_samples} and max_new_tokens {self.max_new_tokens} must be >= 1")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            problems.append(f"temperature {self.temperature} must be >= 0 (0: greedy)")
        if self.top_k < 0:
            problems.append(f"top_k {self.top_k} must be >= 0 (0: no top-k)")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p {self.top_p} must be in (0, 1]")
        if problems:
            raise ValueError("; ".join(problems) + ".")


@dataclass
class Sample:
    tokens: list[int]  # ending with the stop token when one ended it
    logprobs: list[float]  # of each token under the distribution it was drawn from
    stop_reason: str  # "stop" or "length"


class PerRequestSampling(LogitsProcessor):
    """The sampling step of ``generate``, row by row: each row's logits go through its request's
    temperature, top-k and top-p (transformers' own warpers) and the next token is drawn with
    ``torch.multinomial`` from the request's ``torch.Generator``. The logits handed back put all
    mass on the drawn token, so ``generate`` runs greedy and keeps it.

    Every row draws once at every step, finished or not, in a fixed order within its request: a
    request's k-th token always comes from the same draws of its generator, whatever else is in the
    batch and however long the others run."""

    def __init__(self, requests: list[SampleRequest], generators: list[torch.Generator]):
        self.rows = []  # (warpers or None for greedy, generator), one per sample row
        for request, generator in zip(requests, generators, strict=True):
            warpers = None
            if request.temperature > 0:
                warpers = [TemperatureLogitsWarper(request.temperature)]
                if request.top_k > 0:
                    warpers.append(TopKLogitsWarper(request.top_k))
                if request.top_p < 1.0:
                    warpers.append(TopPLogitsWarper(request.top_p))
            self.rows += [(warpers, generator)] * request.num_samples
        self.logprobs: list[torch.Tensor] = []  # per step, the drawn tokens' log-probs, one per row

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        chosen, logprobs = [], []
        for row, (warpers, generator) in enumerate(self.rows):
            logits = scores[row : row + 1].float()
            if warpers is None:
                token = logits.argmax(-1)
            else:
                for warper in warpers:
                    logits = warper(input_ids[row : row + 1], logits)
                token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)[:, 0]
            chosen.append(token)
            logprobs.append(torch.log_softmax(logits, -1)[0, token])
        chosen = torch.cat(chosen)
        self.logprobs.append(torch.cat(logprobs))
        forced = torch.full_like(scores, -float("inf"))
        forced[torch.arange(len(self.rows)), chosen] = 0.0
        return forced


class PerRequestLimits(StoppingCriteria):
    """A row is done after its request's ``max_new_tokens``, or once its text holds one of the
    request's stop strings (end-of-sequence ids are the generation config's)."""

    def __init__(self, requests: list[SampleRequest], prompt_columns: int, tokenizer):
        self.limits = [(r.max_new_tokens, r.stop) for r in requests for _ in range(r.num_samples)]
        self.prompt_columns, self.tokenizer = prompt_columns, tokenizer
        self.texts = [""] * len(self.limits)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        generated = input_ids.size(1) - self.prompt_columns
        done = []
        for row, (limit, stop) in enumerate(self.limits):
            if stop:
                self.texts[row] += self.tokenizer.decode([int(input_ids[row, -1])])
            done.append(generated >= limit or any(s in self.texts[row] for s in stop))
        return torch.tensor(done, device=input_ids.device)


def request_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()  # nondeterministic, as an unseeded request should be
    else:
        generator.manual_seed(seed)
    return generator


@torch.no_grad()
def sample_requests(model, tokenizer, requests: list[SampleRequest], stop_ids: list[int]) -> list[list[Sample]]:
    """Every sample of every request in one batched ``generate`` (left-padded prompts, KV cache),
    each request with its own settings and generator; a list of samples per request, in order.

    A sample ends at the first of ``stop_ids`` (kept), at the end of the first of its stop strings
    (the token that completes it kept), or after its ``max_new_tokens``."""
    rows = [request.prompt for request in requests for _ in range(request.num_samples)]
    input_ids, attention_mask = pad_rows(rows, tokenizer.pad_token_id or 0, left=True, device=model.device)
    sampling = PerRequestSampling(requests, [request_generator(r.seed) for r in requests])
    config = generation_config(
        max_new_tokens=max(r.max_new_tokens for r in requests),
        stop_ids=stop_ids,
        pad_token_id=tokenizer.pad_token_id,
        greedy=True,  # the choice is PerRequestSampling's: generate keeps the token it forced
    )
    with sampling_settings(model, config):
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            logits_processor=[sampling],
            stopping_criteria=StoppingCriteriaList([PerRequestLimits(requests, input_ids.size(1), tokenizer)]),
        )
    new = output[:, input_ids.size(1) :].tolist()
    logprobs = torch.stack(sampling.logprobs, dim=1).tolist()
    answers, row = [], 0
    for request in requests:
        samples = []
        for _ in range(request.num_samples):
            samples.append(_trimmed(new[row], logprobs[row], request, stop_ids, tokenizer))
            row += 1
        answers.append(samples)
    return answers


def end_of_sample(ids: list[int], stop_ids, stop_strings: list[str], tokenizer) -> int | None:
    """How many of a generated row's tokens are the sample: up to the first of ``stop_ids`` or the token
    that completes the first of ``stop_strings``, whichever comes first, both kept; None if neither."""
    end = next((i + 1 for i, t in enumerate(ids) if t in stop_ids), None)
    if stop_strings:
        # The earlier of the two ends: once a stop string ends a row, generate pads it, and a model whose
        # padding id is its end-of-turn id (SmolLM2) would otherwise seem to end one token later.
        text = ""
        for i, token in enumerate(ids[:end]):
            text += tokenizer.decode([token])
            if any(s in text for s in stop_strings):
                return i + 1
    return end


def _trimmed(ids: list[int], logprobs: list[float], request: SampleRequest, stop_ids, tokenizer) -> Sample:
    """A row of the batch cut where its own request ends it (the rest is padding or other rows' steps)."""
    ids = ids[: request.max_new_tokens]
    end = end_of_sample(ids, stop_ids, request.stop, tokenizer)
    reason = "stop" if end is not None else "length"
    ids = ids if end is None else ids[:end]
    return Sample(ids, logprobs[: len(ids)], reason)
