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

import io
import math
import sys
import threading
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
if str(REPO / "scripts") not in sys.path:
    sys.path.insert(0, str(REPO / "scripts"))  # the scripts' padding helper, imported rather than copied

from common.data import pad_rows  # noqa: E402

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
MICRO_BATCH = 16  # datums per padded forward pass


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


_MODEL_LOADING = threading.Lock()


class Engine:
    """Base model + LoRA adapter on every linear layer, AdamW, sampling. Not thread-safe by itself:
    the service runs one operation at a time on it (``lock``)."""

    def __init__(self, model_dir: str, rank: int, alpha: int, seed: int = 0):
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.lock = threading.RLock()
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

    def _new_optimizer(self):
        a_params = [p for n, p in self.named_trainable if "lora_B" not in n]
        b_params = [p for n, p in self.named_trainable if "lora_B" in n]
        # Two groups so LoRA+ can give B matrices their own learning rate (lr * loraPlusLrRatio).
        return torch.optim.AdamW([{"params": a_params, "lora": "A"}, {"params": b_params, "lora": "B"}], lr=1e-4)

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
        with self.lock:
            for start in range(0, len(parsed), MICRO_BATCH):
                batch = parsed[start : start + MICRO_BATCH]
                with torch.set_grad_enabled(backward):
                    logprobs = self._logprobs([t for t, _ in batch], [i["target_tokens"] for _, i in batch])
                    losses = [
                        token_losses(loss_fn, lp, inputs, config).sum()
                        for lp, (_, inputs) in zip(logprobs, batch, strict=True)
                    ]
                    loss = torch.stack(losses).sum()
                if backward:
                    loss.backward()  # gradients accumulate in .grad until optim_step
                total += loss.item()
                outputs += [
                    {"logprobs": tensor_to_wire(lp), "loss": tensor_to_wire(datum_loss.reshape(1))}
                    for lp, datum_loss in zip(logprobs, losses, strict=True)
                ]
        tokens = sum(len(t) for t, _ in parsed)
        return {
            "lossFnOutputType": "TensorData",
            "lossFnOutputs": outputs,
            "metrics": {"loss:sum": total, "global_token_num": float(tokens)},
        }, tokens

    def optim_step(self, adam: dict) -> dict:
        with self.lock:
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
        from peft import set_peft_model_state_dict

        with self.lock:
            result = set_peft_model_state_dict(self.model, state)
            missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
            if missing:
                raise InputError(
                    f"The saved adapter lacks {len(missing)} LoRA tensors (first: {missing[0]}): it was "
                    "saved from a session with another base model."
                )

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

    def merged_state(self) -> dict[str, torch.Tensor]:
        import copy

        with self.lock:  # merged into a copy: the session keeps training its adapter
            merged = copy.deepcopy(self.model).merge_and_unload()
            return {k: v.detach().contiguous() for k, v in merged.state_dict().items()}

    # ---- sampling and scoring
    def adapter_enabled(self, enabled: bool):
        """A context in which the model is the base model alone (enabled=False) or with the adapter."""
        import contextlib

        return contextlib.nullcontext() if enabled else self.model.disable_adapter()

    def compute_logprobs(self, tokens: list[int]) -> list[float | None]:
        with self.lock, torch.no_grad():
            if len(tokens) == 1:
                return [None]
            (lp,) = self._logprobs([tokens[:-1]], [torch.tensor(tokens[1:])])
            return [None] + lp.tolist()

    def sample(self, prompt: list[int], num_samples: int, params: dict) -> list[dict]:
        """Every sample of the call in one batched generate (KV cache); per-token logprobs of the
        distribution sampled from (temperature, top-k, top-p applied)."""
        with self.lock, torch.no_grad():
            return generate_samples(self.model, self.tokenizer, prompt, num_samples, params)


def generate_samples(model, tokenizer, prompt: list[int], num_samples: int, params: dict) -> list[dict]:
    from transformers import GenerationConfig

    temperature = params.get("temperature", 1.0)
    greedy = temperature == 0
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
    stop_ids = sorted(set(eos) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()))
    settings = dict(
        max_new_tokens=params["maxTokens"],
        eos_token_id=stop_ids,
        do_sample=not greedy,
        pad_token_id=tokenizer.pad_token_id,
        repetition_penalty=1.0,
    )
    if not greedy:
        top_k = params.get("topK")
        settings.update(
            temperature=temperature, top_k=top_k if top_k and top_k > 0 else 0, top_p=params.get("topP", 1.0)
        )
    if params.get("stop"):
        settings["stop_strings"] = params["stop"]
    if params.get("seed") is not None:
        torch.manual_seed(params["seed"])
    input_ids = torch.tensor([prompt] * num_samples)
    # As grpo.py's generator does: our settings replace the model card's for the call (on the base
    # model, whose generate() peft calls), so nothing unset is filled in from it.
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved = base.generation_config
    base.generation_config = GenerationConfig(**settings)
    try:
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            output_scores=True,
            return_dict_in_generate=True,
            tokenizer=tokenizer if params.get("stop") else None,
        )
    finally:
        base.generation_config = saved
    new = out.sequences[:, len(prompt) :]
    logprobs = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in out.scores], dim=1)
    picked = logprobs.gather(-1, new.unsqueeze(-1)).squeeze(-1)
    samples = []
    for row in range(num_samples):
        ids = new[row].tolist()
        end = next((i + 1 for i, t in enumerate(ids) if t in stop_ids), None)
        reason = "stop" if end is not None else "length"
        if end is None and params.get("stop"):
            text = ""
            for i, t in enumerate(ids):
                text += tokenizer.decode([t])
                if any(s in text for s in params["stop"]):
                    end, reason = i + 1, "stop"
                    break
        ids = ids[:end] if end is not None else ids
        samples.append(
            {
                "tokens": ids,
                "logprobs": picked[row, : len(ids)].tolist(),
                "stopReason": reason,
                "tokenUsage": {"prefill": len(prompt), "decode": len(ids)},
            }
        )
    return samples
