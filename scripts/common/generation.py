"""Sampling completions with transformers' ``generate``, for GRPO's rollouts, for evaluation and for
the training-session service.

Both ways sample on the model itself (no second copy of the weights to keep in step): every prompt
of a call in one batched ``generate`` with the KV cache, prompts padded on the left so that all
completions start at the same column. The sampling settings are the arguments and nothing else:
the log-probs a loss computes must be those of the distribution sampled from, so nothing comes from
the model card's generation config.

  * ``HFGenerator`` (the job scripts): one group of settings for the whole batch, drawn from
    torch's global generator, which the script seeds once per learner.
  * ``sample_requests`` (the session service, and ``evaluate.py``): requests with their own
    settings, token limits, stop strings and seeds in one batch. Each sample draws from its own
    ``torch.Generator``, so it is the same alone, batched with others, or beside another session's
    sampling; finished samples leave the batch every ``PRUNE_EVERY`` tokens.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, fields

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
from transformers.generation.utils import GenerateDecoderOnlyOutput

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
    """Completions of token-id prompts: ``generate(prompts, group_size, greedy)``.

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
        self.stop_ids = stop_ids if stop_ids is not None else default_stop_ids(distributed.unwrap(model), tokenizer)
        self.stop_strings = [text for text in stop_strings or [] if text]
        # FSDP layers gather their weights in every forward, a collective: learners that finish their
        # completions early must keep stepping until all have finished, or the others wait forever.
        self.synced_gpus = learners.world_size > 1 and distributed.is_fsdp(model)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], group_size: int = 1, greedy: bool = False
    ) -> tuple[list[list[int]], list[str]]:
        """``group_size`` completions per prompt, ordered prompt by prompt: token ids (ending with
        the stop token when the model stopped) and decoded text."""
        rows = [ids for ids in prompts for _ in range(group_size)]
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


@dataclass
class SampleRow:
    """One sample being drawn: its request, its own generator, and what it has drawn so far."""

    request: SampleRequest
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""  # decoded as drawn, for the request's stop strings
    finished: bool = False

    @property
    def warpers(self) -> list | None:
        """transformers' warpers for the request's temperature, top-k and top-p; None: greedy."""
        request = self.request
        if request.temperature == 0:
            return None
        warpers = [TemperatureLogitsWarper(request.temperature)]
        if request.top_k > 0:
            warpers.append(TopKLogitsWarper(request.top_k))
        if request.top_p < 1.0:
            warpers.append(TopPLogitsWarper(request.top_p))
        return warpers


def sample_rows(request: SampleRequest) -> list[SampleRow]:
    """A request's rows, each with its own generator: the request's seed seeds a generator that draws
    one seed per row, so a row's tokens never depend on how long its request's other rows run."""
    seeds = torch.randint(0, 2**62, (request.num_samples,), generator=request_generator(request.seed))
    return [SampleRow(request, request_generator(int(seed))) for seed in seeds]


class PerRequestSampling(LogitsProcessor):
    """The sampling step of ``generate``, row by row: each row's logits go through its request's
    temperature, top-k and top-p (transformers' own warpers) and the next token is drawn with
    ``torch.multinomial`` from the row's own ``torch.Generator``. The logits handed back put all
    mass on the drawn token, so ``generate`` runs greedy and keeps it.

    Every row draws from its own generator only, once per token: a sample's k-th token always comes
    from the same draws, whatever else is in the batch and however long the others run."""

    def __init__(self, rows: list[SampleRow]):
        self.rows = [(row.warpers, row.generator) for row in rows]
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
    """A row is done at one of ``stop_ids``, after its request's ``max_new_tokens``, or once its text
    holds one of the request's stop strings. It marks the row ``finished``, which outlives the call:
    a pass runs in several ``generate`` calls."""

    def __init__(self, rows: list[SampleRow], prompt_columns: int, stop_ids: list[int], tokenizer):
        self.rows, self.prompt_columns, self.tokenizer = rows, prompt_columns, tokenizer
        self.stop_ids = set(stop_ids)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        generated = input_ids.size(1) - self.prompt_columns  # by every row in this call
        for index, row in enumerate(self.rows):
            if row.finished:
                continue
            token = int(input_ids[index, -1])
            if row.request.stop:
                row.text += self.tokenizer.decode([token])
            row.finished = (
                token in self.stop_ids
                or len(row.tokens) + generated >= row.request.max_new_tokens
                or any(s in row.text for s in row.request.stop)
            )
        return torch.tensor([row.finished for row in self.rows], device=input_ids.device)


def request_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()  # nondeterministic, as an unseeded request should be
    else:
        generator.manual_seed(seed)
    return generator


# A pass drops its finished rows every this many tokens. One ``generate`` runs every row until the
# longest ends: a sample that rambles to its limit (512 tokens at the service's minimum) kept 63
# finished rows in every step. Between calls, finished rows leave the batch and the KV cache
# (``Cache.batch_select_indices``); the rest go on from the cache. 16 rather than 32: a pass of notebook
# 8's one-line answers (36) took 4% less time on a quiet machine (the longest 231 tokens) and 14% less
# beside a running job (the longest 89), 8 hardly less again (docs/BENCHMARKS.md).
PRUNE_EVERY = 16
# The cache's name in generate's arguments and output: `cache` in transformers 5 (`past_key_values`,
# deprecated there), `past_key_values` in 4.x (the training image's 4.56.2).
CACHE_NAME = next(f.name for f in fields(GenerateDecoderOnlyOutput) if f.name in ("cache", "past_key_values"))


@torch.no_grad()
def sample_requests(model, tokenizer, requests: list[SampleRequest], stop_ids: list[int]) -> list[list[Sample]]:
    """Every sample of every request in one batched pass (left-padded prompts, KV cache), each
    request with its own settings and each sample with its own generator; a list of samples per
    request, in order. The pass is ``generate`` called every ``PRUNE_EVERY`` tokens on the rows not
    finished yet, from the cache the previous call left.

    A sample ends at the first of ``stop_ids`` (kept), at the end of the first of its stop strings
    (the token that completes it kept), or after its ``max_new_tokens``."""
    rows = [row for request in requests for row in sample_rows(request)]
    input_ids, attention_mask = pad_rows(
        [row.request.prompt for row in rows], tokenizer.pad_token_id or 0, left=True, device=model.device
    )
    alive, cache = rows, None
    while alive:
        sampling = PerRequestSampling(alive)
        limits = PerRequestLimits(alive, input_ids.size(1), stop_ids, tokenizer)
        longest = max(row.request.max_new_tokens - len(row.tokens) for row in alive)
        config = generation_config(
            max_new_tokens=min(PRUNE_EVERY, longest),
            stop_ids=stop_ids,
            pad_token_id=tokenizer.pad_token_id,
            greedy=True,  # the choice is PerRequestSampling's: generate keeps the token it forced
        )
        with sampling_settings(model, config):
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                logits_processor=[sampling],
                stopping_criteria=StoppingCriteriaList([limits]),
                return_dict_in_generate=True,
                **{CACHE_NAME: cache},
            )
        new = output.sequences[:, input_ids.size(1) :]
        for row, tokens, logprobs in zip(alive, new.tolist(), torch.stack(sampling.logprobs, 1).tolist(), strict=True):
            row.tokens += tokens
            row.logprobs += logprobs
        keep = [index for index, row in enumerate(alive) if not row.finished]
        if not keep:
            break
        # The rows going on: their sequences, their attention mask grown by the tokens just drawn
        # (all real: a row still going drew no padding), and their rows of the cache.
        cache = getattr(output, CACHE_NAME)
        cache.batch_select_indices(torch.tensor(keep, device=new.device))
        attention_mask = torch.cat([attention_mask, torch.ones_like(new)], 1)[keep]
        input_ids = output.sequences[keep]
        alive = [alive[index] for index in keep]
    samples = iter(_trimmed(row, stop_ids, tokenizer) for row in rows)
    return [[next(samples) for _ in range(request.num_samples)] for request in requests]


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


def _trimmed(row: SampleRow, stop_ids, tokenizer) -> Sample:
    """A row cut where its own request ends it (what follows is padding drawn in the row's last call)."""
    ids = row.tokens[: row.request.max_new_tokens]
    end = end_of_sample(ids, stop_ids, row.request.stop, tokenizer)
    reason = "stop" if end is not None else "length"
    ids = ids if end is None else ids[:end]
    return Sample(ids, row.logprobs[: len(ids)], reason)
