"""The model behind one training session: a base model with a LoRA adapter, its optimizer, sampling.

Loss semantics are Tinker's (the API the training-session service mirrors), with SageMaker's rules
where the two differ:
  * model_input position i predicts ``target_tokens[i]`` (the caller shifts), every loss input has
    one value per model_input token, and every loss is a **sum** over tokens and datums: the loop
    owns normalisation.
  * ``weights`` multiplies every per-token loss. SageMaker's SDK requires ``weights`` for all four
    losses (Tinker's RL losses take none), so it is required here too: give 0 on prompt tokens.
  * clip thresholds are bounds on the ratio, ``clip_low_threshold`` in [0, 1] and
    ``clip_high_threshold`` in [1, 10] (SageMaker's ForwardBackwardConfig); defaults are Tinker's
    (ppo 0.8 / 1.2, cispo 0.0 / 4.0).

    cross_entropy        -sum(w * logp)
    importance_sampling  -sum(w * exp(logp - logp_sampler) * A)
    ppo                  -sum(w * min(r * A, clip(r, low, high) * A)),   r = exp(logp - logp_sampler)
    cispo                -sum(w * sg(clip(r, low, high)) * logp * A)
"""

from __future__ import annotations

import abc
import contextlib
import copy
import ctypes
import ctypes.util
import gc
import io
import math
import sys
import threading
import time
from concurrent.futures import Future

import torch
from common.data import pad_rows
from common.generation import SampleRequest, default_stop_ids, sample_requests

from . import PRECISIONS, configured_precision
from .profile import generation_passes, phase

LOSS_INPUTS = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "weights", "logprobs", "advantages"),
    "ppo": ("target_tokens", "weights", "logprobs", "advantages"),
    "cispo": ("target_tokens", "weights", "logprobs", "advantages"),
}
DEFAULT_CLIP = {"ppo": (0.8, 1.2), "cispo": (0.0, 4.0), "importance_sampling": (None, None)}
CLIP_RANGES = {"clip_low_threshold": (0.0, 1.0), "clip_high_threshold": (1.0, 10.0)}
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
}
MICRO_BATCH = 16  # datums per padded forward pass, at most
# ...and padded tokens per pass, at most: a pass holds every layer's activations and its logits over the
# whole vocabulary until its backward (SmolLM2: about 3.5 MB a token). By count alone, 16 answers that ran
# to 512 tokens took a real model's session past 20 GB, and the machine's memory.
MICRO_BATCH_TOKENS = 1024
MAX_SAMPLE_ROWS = 64  # samples per shared generation pass: bounds the KV cache's memory
OWN_ADAPTER = object()  # ``Engine.weights``: the adapter the engine holds, as it is
GATHER_SECONDS = 0.01  # how long a sampling pass waits for more requests after the last one arrived


class InputError(ValueError):
    """A request the engine refuses: answered as ValidationException, the session unchanged."""


# --------------------------------------------------------------------------- loss maths


def token_losses(loss_fn: str, logprobs: torch.Tensor, inputs: dict, config: dict) -> torch.Tensor:
    """Per-token losses (same shape as ``logprobs``); their sum is the datum's loss."""
    weights = inputs["weights"]
    if loss_fn == "cross_entropy":
        return -weights * logprobs
    ratio = torch.exp(logprobs - inputs["logprobs"])
    advantages = inputs["advantages"]
    if loss_fn == "importance_sampling":
        return -weights * ratio * advantages
    low, high = clip_bounds(loss_fn, config)
    clipped = torch.clamp(ratio, low, high)
    if loss_fn == "ppo":
        return -weights * torch.minimum(ratio * advantages, clipped * advantages)
    if loss_fn == "cispo":
        return -weights * clipped.detach() * logprobs * advantages
    raise InputError(f"Unknown lossFnName {loss_fn!r}: use one of {', '.join(LOSS_INPUTS)}.")


def clip_bounds(loss_fn: str, config: dict) -> tuple[float, float]:
    low, high = DEFAULT_CLIP[loss_fn]
    return float(config.get("clip_low_threshold", low)), float(config.get("clip_high_threshold", high))


def check_loss_config(loss_fn: str, config) -> dict:
    config = config or {}
    if not isinstance(config, dict):
        raise InputError('lossFnConfig must be a JSON object such as {"clip_low_threshold": 0.8}.')
    for key, value in config.items():
        if key not in CLIP_RANGES:
            raise InputError(
                f"lossFnConfig key {key!r} is not supported: the supported keys are {', '.join(CLIP_RANGES)}."
            )
        low, high = CLIP_RANGES[key]
        if not isinstance(value, (int, float)) or not low <= value <= high:
            raise InputError(f"lossFnConfig {key}={value!r} is out of range: give a number in [{low}, {high}].")
        if loss_fn == "cross_entropy":
            raise InputError(f"lossFnConfig {key} applies to ppo and cispo, not {loss_fn}; leave lossFnConfig out.")
    return config


# --------------------------------------------------------------------------- wire -> tensors


def model_input_tokens(model_input: dict, where: str) -> list[int]:
    tokens = [t for chunk in model_input.get("chunks", []) for t in chunk.get("tokens", [])]
    if not tokens:
        raise InputError(f"{where}: modelInput has no tokens; give at least one chunk with tokens.")
    return tokens


def tensor_from_wire(value: dict, where: str) -> torch.Tensor:
    dtype = value.get("dtype")
    if dtype not in DTYPES:
        raise InputError(f"{where} has dtype {dtype!r}: use one of {', '.join(DTYPES)}.")
    try:
        tensor = torch.tensor(
            value.get("data"), dtype=torch.float64 if dtype.startswith(("float", "bfloat")) else torch.int64
        )
    except (TypeError, ValueError) as error:
        raise InputError(f"{where}: data must be a (nested) list of numbers ({error}).") from None
    shape = value.get("shape")
    if shape is not None:
        if math.prod(shape) != tensor.numel():
            raise InputError(f"{where}: shape {shape} holds {math.prod(shape)} values but data has {tensor.numel()}.")
        tensor = tensor.reshape(shape)
    return tensor.to(DTYPES[dtype]).reshape(-1)


def parse_datums(datums: list, loss_fn: str) -> list[tuple[list[int], dict]]:
    """[(tokens, {input name: 1-D tensor})], checked: every error names the datum and the fix."""
    if not datums:
        raise InputError("datumList is empty: give at least one datum.")
    needed = LOSS_INPUTS.get(loss_fn)
    if needed is None:
        raise InputError(f"Unknown lossFnName {loss_fn!r}: use one of {', '.join(LOSS_INPUTS)}.")
    parsed = []
    for index, datum in enumerate(datums):
        where = f"datumList[{index}]"
        tokens = model_input_tokens(datum.get("modelInput", {}), where)
        given = datum.get("lossFnInputs") or {}
        missing = [name for name in needed if name not in given]
        if missing:
            raise InputError(
                f"{where}: lossFnInputs lacks {', '.join(missing)}, which {loss_fn} needs "
                f"({', '.join(needed)}, one value per modelInput token)."
            )
        inputs = {}
        for name, value in given.items():
            tensor = tensor_from_wire(value, f"{where}.lossFnInputs['{name}']")
            if tensor.numel() != len(tokens):
                raise InputError(
                    f"{where}.lossFnInputs['{name}'] has {tensor.numel()} values but modelInput has "
                    f"{len(tokens)} tokens: give one value per modelInput token (position i predicts "
                    f"target_tokens[i])."
                )
            inputs[name] = tensor if name == "target_tokens" else tensor.float()
        parsed.append((tokens, inputs))
    return parsed


def tensor_to_wire(values: torch.Tensor) -> dict:
    values = values.detach().float().reshape(-1)
    return {"data": values.tolist(), "dtype": "float32", "shape": [values.numel()]}


# --------------------------------------------------------------------------- the engine


def _set_peft_state(model, state: dict[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
    if missing:
        raise InputError(
            f"The saved adapter lacks {len(missing)} LoRA tensors (first: {missing[0]}): it was "
            "saved from a session with another base model."
        )


_MODEL_LOADING = threading.Lock()


def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


def return_freed_memory(collect: bool = False) -> None:
    """Give the memory an operation freed back to the system. glibc keeps freed blocks in the arena of
    the thread that used them, for that thread to reuse, and the server answers each request on a
    thread of its own: a SmolLM2 session's activations, KV caches and merged samplers stayed in the
    process after they were freed, and the idle server held 12 GB after the session notebooks ended
    (six engine steps: 4.5-5.2 GB resident without this, 1.55 GB with it). ``collect`` first frees what
    only reference cycles hold (a model and its modules)."""
    if collect:
        gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class Engine:
    """Base model + LoRA adapter on every linear layer, AdamW, sampling. One operation at a time runs
    on the model (``lock``); sample requests wait in ``sampling`` and run in shared passes."""

    def __init__(self, model_dir: str, rank: int, alpha: int, seed: int = 0, precision: str | None = None):
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.lock = threading.RLock()
        self.precision = precision or configured_precision()
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r}: use one of {', '.join(PRECISIONS)}")
        config = LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear", lora_dropout=0.0, bias="none")
        # One model built at a time: transformers loads through process-wide state (meta-device
        # initialisation), and the adapter's initial weights come from the global seed.
        with _MODEL_LOADING:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
            base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            torch.manual_seed(seed)
            self.model = get_peft_model(base, config)
        self.model.eval()  # no dropout anywhere: forward, backward and sampling see the same function
        self.named_trainable = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.optimizer = self._new_optimizer()
        self.step = 0
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.stop_ids = default_stop_ids(self.model, self.tokenizer)
        self.sampling = SamplingQueue(self)
        self.scoring = ScoringQueue(self)
        self.merged_sampler: tuple[dict, torch.nn.Module] | None = None  # (saved adapter, merged copy)
        self.merges = 0

    def _new_optimizer(self):
        a_params = [p for n, p in self.named_trainable if "lora_B" not in n]
        b_params = [p for n, p in self.named_trainable if "lora_B" in n]
        # Two groups so LoRA+ can give B matrices their own learning rate (lr * loraPlusLrRatio).
        return torch.optim.AdamW([{"params": a_params, "lora": "A"}, {"params": b_params, "lora": "B"}], lr=1e-4)

    def computing(self):
        """The context ``forward`` and ``forward_backward`` run the model in: bf16 autocast, or exact
        fp32. Backward runs outside it, as autocast asks, and the fp32 weights receive fp32 gradients
        either way. Sampling and ``compute_logprobs`` stay fp32 in both: in bf16 a row's log-probs
        depend on the rows beside it in the pass (alone and in a batch of 8: up to 0.14 apart; fp32:
        equal), and a seeded request's samples must not depend on the requests it shares a pass with."""
        if self.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ---- forward / backward
    def _logprobs(self, rows: list[list[int]], targets: list[torch.Tensor]) -> list[torch.Tensor]:
        """Per-token log p(target) for right-padded rows, one padded forward pass."""
        ids, mask = pad_rows(rows, self.pad_id, left=False, device="cpu")
        logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        out = []
        for row, (tokens, target) in enumerate(zip(rows, targets, strict=True)):
            row_logits = logits[row, : len(tokens)]
            picked = row_logits.gather(-1, target.long().unsqueeze(-1)).squeeze(-1)
            out.append(picked - torch.logsumexp(row_logits, dim=-1))
        return out

    def forward_backward(self, loss_fn: str, datums: list, config: dict, backward: bool) -> dict:
        parsed = parse_datums(datums, loss_fn)
        config = check_loss_config(loss_fn, config)
        outputs, total = [], 0.0
        order = length_order(parsed)  # the outputs go back in the datums' order below
        with self.lock:
            for batch in micro_batches([parsed[index] for index in order]):
                rows, width = len(batch), max(len(t) for t, _ in batch)
                with phase("fb_forward", rows=rows, padded=rows * width, tokens=sum(len(t) for t, _ in batch)):
                    with torch.set_grad_enabled(backward), self.computing():
                        logprobs = self._logprobs([t for t, _ in batch], [i["target_tokens"] for _, i in batch])
                        losses = [
                            token_losses(loss_fn, lp, inputs, config).sum()
                            for lp, (_, inputs) in zip(logprobs, batch, strict=True)
                        ]
                        loss = torch.stack(losses).sum()
                if backward:
                    with phase("fb_backward", rows=rows, padded=rows * width):
                        loss.backward()  # gradients accumulate in .grad until optim_step
                with phase("fb_outputs", rows=rows):
                    total += loss.item()
                    outputs += [
                        {"logprobs": tensor_to_wire(lp), "loss": tensor_to_wire(datum_loss.reshape(1))}
                        for lp, datum_loss in zip(logprobs, losses, strict=True)
                    ]
                del logprobs, losses, loss  # the pass's activations, before the memory goes back
            return_freed_memory()
        in_order = [None] * len(parsed)
        for index, output in zip(order, outputs, strict=True):
            in_order[index] = output
        tokens = sum(len(t) for t, _ in parsed)
        return {
            "lossFnOutputType": "TensorData",
            "lossFnOutputs": in_order,
            "metrics": {"loss:sum": total, "global_token_num": float(tokens)},
        }, tokens

    def optim_step(self, adam: dict) -> dict:
        with self.lock, phase("optim_step"):
            lr = adam["learningRate"]
            ratio = adam.get("loraPlusLrRatio") or 1.0
            for group in self.optimizer.param_groups:
                group["lr"] = lr * (ratio if group["lora"] == "B" else 1.0)
                group["betas"] = (adam.get("beta1", 0.9), adam.get("beta2", 0.999))
                group["eps"] = adam.get("eps", 1e-8)
                group["weight_decay"] = adam.get("weightDecay", 0.01)
            params = [p for _, p in self.named_trainable]
            clip = adam.get("gradClipNorm")
            grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip else float("inf"))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            return {"metrics": {"grad_norm": float(grad_norm), "learning_rate": lr, "step": float(self.step)}}

    # ---- state
    def adapter_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.named_trainable}

    def load_adapter(self, state: dict[str, torch.Tensor]) -> None:
        with self.lock, torch.no_grad():
            for name, param in self.named_trainable:
                if name not in state:
                    raise InputError(
                        f"The saved state has no tensor {name}: it was saved from a session with "
                        "another base model or LoRA rank."
                    )
                if state[name].shape != param.shape:
                    raise InputError(
                        f"The saved state's {name} has shape {tuple(state[name].shape)}, this session's "
                        f"{tuple(param.shape)}: create the session with the LoRA rank it was saved with."
                    )
                param.copy_(state[name])

    def load_adapter_from_peft(self, state: dict[str, torch.Tensor]) -> None:
        """Weights as ``save_pretrained`` wrote them (adapter_model.safetensors)."""
        with self.lock:
            _set_peft_state(self.model, state)

    def reset_optimizer(self) -> None:
        with self.lock:
            self.optimizer = self._new_optimizer()
            for _, p in self.named_trainable:
                p.grad = None
            self.step = 0

    def state_bytes(self, with_optimizer: bool = True) -> bytes:
        """The optimizer's state and the step count, torch.save'd (the adapter is saved beside it)."""
        with self.lock:
            buffer = io.BytesIO()
            torch.save({"optimizer": self.optimizer.state_dict(), "step": self.step}, buffer)
            return buffer.getvalue()

    def load_optimizer_bytes(self, data: bytes) -> None:
        payload = torch.load(io.BytesIO(data), weights_only=True)
        with self.lock:
            self.optimizer.load_state_dict(payload["optimizer"])
            self.step = payload["step"]

    def merged_model(self) -> torch.nn.Module:
        """The base model with the adapter merged in (peft's ``merge_and_unload``), a plain transformers
        model that ``save_pretrained`` writes as any other."""
        with self.lock:  # merged into a copy: the session keeps training its adapter
            return copy.deepcopy(self.model).merge_and_unload()

    # ---- sampling and scoring
    @contextlib.contextmanager
    def weights(self, adapter):
        """The model, while the context lasts and under the engine's lock, as ``adapter`` says: ``None``
        the base model alone, ``OWN_ADAPTER`` the adapter this engine holds, or a saved adapter's
        tensors (as ``save_pretrained`` wrote them) swapped in, the engine's own put back after."""
        with self.lock:
            if adapter is None:
                with self.model.disable_adapter():
                    yield
            elif adapter is OWN_ADAPTER:
                yield
            else:
                current = self.adapter_state()
                self.load_adapter_from_peft(adapter)
                try:
                    yield
                finally:
                    self.load_adapter(current)

    @contextlib.contextmanager
    def sampling_model(self, adapter):
        """The model a sampling pass runs, under the engine's lock. A saved adapter is merged once, at
        its first pass, into the engine's one sampler model, and kept there until another saved adapter
        is sampled: a loop samples each saved sampler in many passes, and the merged model samples
        faster than the LoRA layers (docs/BENCHMARKS.md). The base model and this engine's own
        adapter (a saved package's own engine) run as they are."""
        with self.lock:
            if adapter is None or adapter is OWN_ADAPTER:
                with self.weights(adapter):
                    yield self.model
            else:
                if self.merged_sampler is None or self.merged_sampler[0] is not adapter:
                    with phase("merge"):
                        sampler = self._merge_for_sampling(adapter)
                    self.merged_sampler = (adapter, sampler)
                    self.merges += 1
                yield self.merged_sampler[1]

    def _merge_for_sampling(self, adapter) -> torch.nn.Module:
        """The sampler model with ``adapter`` merged: each LoRA layer's weight set to its base weight plus
        the saved adapter's delta (peft's ``get_delta_weight``, the sum ``merge_and_unload`` computes).
        The sampler model is built once, a merged copy of this model; each saved adapter after that is
        written into the same tensors, rather than a copy of the model per saved sampler (a step's
        deepcopy and merge took 4.5 s on SmolLM2, and its memory went and came every step)."""
        from peft.tuners.lora import LoraLayer

        sampler = self.merged_sampler[1] if self.merged_sampler is not None else None
        self.merged_sampler = None
        if sampler is None:
            return_freed_memory(collect=True)
            sampler = copy.deepcopy(self.model).merge_and_unload().eval()
        layers = dict(sampler.named_modules())
        with self.weights(adapter), torch.no_grad():  # the saved adapter's tensors in this model's LoRA layers
            for name, module in self.model.get_base_model().named_modules():
                if isinstance(module, LoraLayer):
                    weight = layers[name].weight
                    weight.copy_(module.get_base_layer().weight)
                    for adapter_name in module.active_adapters:
                        weight.add_(module.get_delta_weight(adapter_name))
        return sampler

    def compute_logprobs(self, tokens: list[int], adapter=OWN_ADAPTER) -> list[float | None]:
        """log p(token | the tokens before it) of every token but the first (None: nothing predicts it),
        with the weights ``adapter`` names, in a forward pass shared with the other scoring requests in
        flight on this engine (``ScoringQueue``). Blocks until its pass has run."""
        if len(tokens) == 1:
            return [None]
        return [None] + self.scoring.submit(list(tokens), adapter)

    def sample(self, prompt: list[int], num_samples: int, params: dict, adapter=OWN_ADAPTER) -> list[dict]:
        """``num_samples`` samples of ``prompt`` with the weights ``adapter`` names (see ``weights``),
        in a generation pass shared with the other requests in flight on this engine; per-token
        logprobs of the distribution sampled from (temperature, top-k, top-p applied). Blocks until
        its pass has run."""
        top_k = params.get("topK")
        try:
            request = SampleRequest(
                prompt=list(prompt),
                num_samples=num_samples,
                max_new_tokens=params["maxTokens"],
                temperature=params.get("temperature", 1.0),
                top_k=top_k if top_k and top_k > 0 else 0,  # Tinker's -1: no top-k
                top_p=params.get("topP", 1.0),
                seed=params.get("seed"),
                stop=list(params.get("stop") or []),
            )
        except ValueError as error:
            raise InputError(f"samplingParams: {error}") from None
        return [
            {
                "tokens": s.tokens,
                "logprobs": s.logprobs,
                "stopReason": s.stop_reason,
                "tokenUsage": {"prefill": len(prompt), "decode": len(s.tokens)},
            }
            for s in self.sampling.submit(request, adapter)
        ]


def length_order(parsed: list) -> list[int]:
    """The datums' indices, shortest first: passes of datums of like length pad little (a GRPO step's
    answers run from a few tokens to the cap; in the order sent, a pass padded 11 % of its tokens)."""
    return sorted(range(len(parsed)), key=lambda index: len(parsed[index][0]))


def micro_batches(parsed: list) -> list[list]:
    """Consecutive datums, in order, grouped so that no pass exceeds ``MICRO_BATCH`` datums or
    ``MICRO_BATCH_TOKENS`` padded tokens (a datum longer than that alone is a pass of its own)."""
    batches, batch = [], []
    for item in parsed:
        width = max(len(tokens) for tokens, _ in [*batch, item])  # the pass is padded to its longest datum
        if batch and (len(batch) == MICRO_BATCH or width * (len(batch) + 1) > MICRO_BATCH_TOKENS):
            batches.append(batch)
            batch = []
        batch.append(item)
    return batches + ([batch] if batch else [])


@contextlib.contextmanager
def shared_prompt_prefill(model):
    """While the context lasts, ``generate`` on ``model`` reads each distinct prompt of a pass once. A
    request's ``numSamples`` rows are the same left-padded prompt: the pass's first model call (its cache
    still empty) runs on one row per distinct prompt, and its KV cache and logits are then repeated for
    every row (``Cache.batch_select_indices``, which ``sample_requests`` also prunes with), so a group of
    6 answers reads its prompt once rather than 6 times. A row's keys, values and logits do not depend on
    the rows beside it in fp32 (tests/training_sessions/test_batched_sampling.py holds the samples to those
    of a pass that reads every row), so each seeded sample is the same. Calls on a filled cache (the
    decode steps, and the later ``generate`` calls of a pass) run as they are."""
    import functools

    from transformers import Cache

    target = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: the model generate runs
    original = target.forward

    @functools.wraps(original)  # generate reads the forward's signature
    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids")
        cache = next((v for v in kwargs.values() if isinstance(v, Cache)), None)
        mask = kwargs.get("attention_mask")
        if args or ids is None or cache is None or cache.get_seq_length() > 0 or ids.size(0) < 2 or mask is None:
            return original(*args, **kwargs)
        rows = ids.size(0)
        _, inverse = torch.unique(torch.cat([ids, mask.to(ids.dtype)], 1), dim=0, return_inverse=True)
        distinct = int(inverse.max()) + 1
        if distinct == rows:
            return original(*args, **kwargs)
        # One row of each distinct prompt (its first), and the batched inputs cut to those rows.
        first = torch.full((distinct,), rows).scatter_reduce(0, inverse, torch.arange(rows), "amin")
        read = {
            k: v[first] if isinstance(v, torch.Tensor) and v.dim() > 1 and v.size(0) == rows else v
            for k, v in kwargs.items()
        }
        output = original(**read)
        cache.batch_select_indices(inverse)  # every row gets its prompt's keys and values
        output.logits = output.logits[inverse]
        return output

    target.forward = forward
    try:
        yield
    finally:
        del target.forward  # the class's forward again


class PassQueue(abc.ABC):
    """Requests in flight on one engine, served in shared passes of the model.

    A loop sends a step's requests at once (one sample request per problem, one scoring request per
    answer). Each caller waits on its own future; one worker thread at a time takes every request waiting
    for the same weights (up to ``max_rows`` rows), runs them as one pass (``_run``), and answers each.
    Requests that arrive while a pass runs, or while the model runs a training operation, join the next
    pass. Subclasses say what a pass is, which model it runs on and how many rows a request takes."""

    name = "passes"  # the worker thread's name
    max_rows = MAX_SAMPLE_ROWS

    def __init__(self, engine: Engine):
        self.engine = engine
        self.cond = threading.Condition()
        self.pending: list[tuple[object, object, Future]] = []
        self.last_arrival = 0.0
        self.worker: threading.Thread | None = None
        self.passes = 0  # passes run: N requests in flight should take far fewer than N

    def rows(self, request) -> int:
        return 1

    @abc.abstractmethod
    def model_for(self, adapter):
        """The context a pass on ``adapter``'s weights runs in, under the engine's lock: yields the model."""

    @abc.abstractmethod
    def _run(self, model, batch: list[tuple[object, object, Future]]) -> list:
        """One pass of ``batch`` on ``model``: each request's answer, in order."""

    def submit(self, request, adapter):
        future = Future()
        with self.cond:
            self.pending.append((request, adapter, future))
            self.last_arrival = time.monotonic()
            self.cond.notify_all()
            if self.worker is None:
                self.worker = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self.worker.start()
        return future.result()

    def _serve(self) -> None:
        while True:
            with self.engine.lock:  # the model is free: what waits now goes in this pass
                with self.cond:
                    self._wait_for_quiet()
                    if not self.pending:
                        self.worker = None
                        return
                    adapter = self.pending[0][1]
                batch = None
                try:
                    # A new saved adapter is merged before the pass's requests are taken: those that
                    # arrive while it merges join this pass rather than wait for the next one.
                    with self.model_for(adapter) as model:
                        with self.cond:
                            self._wait_for_quiet()
                            batch = self._take()
                        answers = self._run(model, batch)
                except Exception as error:  # noqa: BLE001 - each caller's operation reports it
                    if batch is None:
                        with self.cond:
                            batch = self._take()
                    for _, _, future in batch:
                        future.set_exception(error)
                else:
                    for (_, _, future), samples in zip(batch, answers, strict=True):
                        future.set_result(samples)

    def _wait_for_quiet(self) -> None:
        """A loop's requests reach the service over HTTP a few milliseconds apart: gather them until
        none has arrived for GATHER_SECONDS (called holding ``cond``)."""
        while (quiet := time.monotonic() - self.last_arrival) < GATHER_SECONDS:
            self.cond.wait(GATHER_SECONDS - quiet)

    def _take(self) -> list[tuple[object, object, Future]]:
        """The first waiting request and those after it on the same weights, up to ``max_rows`` rows."""
        adapter = self.pending[0][1]
        batch, rest, rows = [], [], 0
        for entry in self.pending:
            fits = not batch or rows + self.rows(entry[0]) <= self.max_rows
            if entry[1] is adapter and fits:
                batch.append(entry)
                rows += self.rows(entry[0])
            else:
                rest.append(entry)
        self.pending = rest
        return batch


class SamplingQueue(PassQueue):
    """Sample requests in flight on one engine, served in shared generation passes of at most
    ``MAX_SAMPLE_ROWS`` samples (``common.generation.sample_requests``: each request keeps its own settings
    and seed, and finished samples leave the batch as the others go on)."""

    name = "sampling-passes"

    def rows(self, request: SampleRequest) -> int:
        return request.num_samples

    def model_for(self, adapter):
        return self.engine.sampling_model(adapter)

    def _run(self, model, batch: list[tuple[SampleRequest, object, Future]]) -> list[list]:
        """One generation pass of ``batch`` on ``model``: each request's samples, in order."""
        requests = [r for r, _, _ in batch]
        rows = sum(r.num_samples for r in requests)
        with phase("sample_pass", requests=len(requests), rows=rows), generation_passes(model):
            with shared_prompt_prefill(model):
                answers = sample_requests(model, self.engine.tokenizer, requests, self.engine.stop_ids)
        self.passes += 1
        return_freed_memory()  # the pass's KV cache
        return answers


class ScoringQueue(PassQueue):
    """``compute_logprobs`` requests in flight on one engine, scored together: a distillation step scores
    each of its answers with the teacher in a request of its own, and one padded forward pass over many
    of them costs a fraction of as many passes of one. The pass runs in fp32 with the LoRA layers, as a
    request alone does (a row's log-probs do not depend on the rows beside it in fp32), split into
    ``micro_batches`` of like length so that its activations stay bounded."""

    name = "scoring-passes"

    @contextlib.contextmanager
    def model_for(self, adapter):
        with self.engine.weights(adapter), torch.no_grad():
            yield self.engine.model

    def _run(self, model, batch: list[tuple[list[int], object, Future]]) -> list[list[float]]:
        sequences = [tokens for tokens, _, _ in batch]
        answers: list[list[float]] = [[] for _ in sequences]
        order = sorted(range(len(sequences)), key=lambda index: len(sequences[index]))
        with phase("score_pass", requests=len(batch), tokens=sum(map(len, sequences))):
            parsed = [(sequences[index][:-1], index) for index in order]
            for part in micro_batches(parsed):
                rows = [tokens for tokens, _ in part]
                targets = [torch.tensor(sequences[index][1:]) for _, index in part]
                for (_, index), logprobs in zip(part, self.engine._logprobs(rows, targets), strict=True):
                    answers[index] = logprobs.tolist()
        self.passes += 1
        return answers
