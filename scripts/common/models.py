"""Loading the starting model and saving the final one.

Weights come from the ``model`` channel (``SM_CHANNEL_MODEL``) when the job has one, otherwise
from ``--model_name_or_path`` (a hub id such as ``Qwen/Qwen2.5-0.5B-Instruct`` or a local folder).

Precision: trained weights stay fp32 (master weights: bf16 cannot hold updates as small as
lr * gradient) and compute in bf16 on GPU through ``distributed.autocast`` / FSDP2's mixed
precision; frozen models (DPO's reference, LoRA's base) are loaded in bf16 on GPU. On CPU
everything is fp32 (``CPU_MIXED_PRECISION=bf16`` computes through bf16 autocast with the weights
still fp32). The final model is saved in bf16 when trained on GPU, fp32 on CPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import torch

from common import distributed
from common.contract import UserError
from common.distributed import Learners, barrier, unwrap

log = logging.getLogger("common")

# For tokenizers without a chat template (base models). Renders:
#   ### System:\n<content>\n\n### User:\n<content>\n\n### Assistant:\n<content><eos>\n\n
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '### ' + message['role'] | capitalize + ':\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\n\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Assistant:\n' }}{% endif %}"
)


def resolve_model_path(name_or_path: str, option: str = "--model_name_or_path", use_channel: bool = True) -> str:
    """``SM_CHANNEL_MODEL`` if set (and ``use_channel``), else ``name_or_path``, checked when it
    looks like a folder; errors name ``option``."""
    channel = os.environ.get("SM_CHANNEL_MODEL") if use_channel else None
    if channel:
        if not (Path(channel) / "config.json").is_file():
            raise UserError(
                f"The 'model' channel ({channel}) has no config.json: give it a folder written by "
                f"save_pretrained (config.json, *.safetensors, tokenizer files) or one training "
                f"job's model.tar.gz."
            )
        log.info("model from the 'model' channel: %s (overrides --model_name_or_path %s)", channel, name_or_path)
        return channel
    looks_local = (
        name_or_path.startswith(("/", "./", "../", "~")) or name_or_path.count("/") > 1 or os.path.exists(name_or_path)
    )
    if looks_local:
        path = Path(name_or_path).expanduser()
        if not path.exists():
            raise UserError(
                f"{option} {name_or_path}: no such folder. Give an existing folder, a hub id "
                f"such as Qwen/Qwen2.5-0.5B-Instruct, or the weights as the 'model' channel."
            )
        if not (path / "config.json").is_file():
            raise UserError(
                f"{option} {name_or_path}: the folder has no config.json "
                f"(expected a folder written by save_pretrained)."
            )
        return str(path)
    return name_or_path


def unpack_model_archive(learners: Learners) -> None:
    """Let channel ``model`` be a training job's ``model.tar.gz``.

    A job's model reaches S3 as ``model.tar.gz`` and SageMaker does not unpack channel files, so
    when the channel holds one archive and no ``config.json``, local rank 0 unpacks it (once per
    host and archive) under the temporary folder and ``SM_CHANNEL_MODEL`` points there. Every
    learner must call it (it waits for the unpacking).
    """
    channel = os.environ.get("SM_CHANNEL_MODEL")
    if not channel or (Path(channel) / "config.json").is_file():
        return
    archives = sorted(Path(channel).glob("*.tar.gz"))
    if len(archives) != 1:
        return  # resolve_model_path says what the channel lacks
    stat = archives[0].stat()  # a folder per archive: another job on this host may bring another model
    key = hashlib.sha256(f"{archives[0].resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"model-channel-{key}"
    if learners.local_rank == 0 and not (target / "config.json").is_file():
        log.info("unpacking %s to %s", archives[0], target)
        staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
        with tarfile.open(archives[0]) as archive:
            archive.extractall(staging, filter="data")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    barrier(learners)
    os.environ["SM_CHANNEL_MODEL"] = str(target)


def starting_model(name_or_path: str, learners: Learners) -> tuple[str, object]:
    """Where the starting model is (``resolve_model_path``: channel ``model``, unpacked when it holds a
    job's ``model.tar.gz``, else ``name_or_path``) and its tokenizer (``load_tokenizer``). Every
    learner must call it."""
    unpack_model_archive(learners)
    path = resolve_model_path(name_or_path)
    return path, load_tokenizer(path)


def compute_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _transformers_version() -> tuple[int, int]:
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return major, minor


def _dtype_kwarg(dtype: torch.dtype) -> dict:
    """transformers >= 4.56 calls it ``dtype``; older versions ``torch_dtype``."""
    return {"dtype": dtype} if _transformers_version() >= (4, 56) else {"torch_dtype": dtype}


# --------------------------------------------------------------------------- transformers 4 and 5
# A model saved by transformers 5 (local mode, the PyTorch image with scripts/requirements.txt)
# may be the input of a job on 4.56 (the Hugging Face image). Three of 5's spellings 4.56 does not
# read: RoPE settings only as ``rope_parameters`` (4.56 reads ``rope_theta`` and ``rope_scaling``,
# and silently falls back to rope_theta 10000 without them: wrong positions for Qwen2.5's 1e6),
# the generic fast tokenizer's class as ``TokenizersBackend`` (4.56: ``PreTrainedTokenizerFast``),
# and ``extra_special_tokens`` as a list (4.56: a dict of named tokens; the list is
# ``additional_special_tokens``). transformers 5 reads the 4.x spellings as well.


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _add_spellings_of_4(config: dict, tokenizer_config: dict) -> list[str]:
    """Add 4.56's spellings to the parsed config.json and tokenizer_config.json (in place); returns
    what was missing, in words (empty for a folder 4.x saved). Only a single RoPE for every layer
    is translated, as Qwen2 has."""
    missing = []
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope and "rope_theta" not in config:
        missing.append(
            f"config.json has rope_parameters but no rope_theta (transformers 4 would use "
            f"rope_theta 10000 instead of {rope['rope_theta']})"
        )
        config["rope_theta"] = rope["rope_theta"]
        if rope.get("rope_type", "default") != "default":
            config["rope_scaling"] = {key: value for key, value in rope.items() if key != "rope_theta"}
    if tokenizer_config.get("tokenizer_class") == "TokenizersBackend":
        missing.append("tokenizer_config.json names the class TokenizersBackend, which transformers 4 lacks")
        tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = tokenizer_config.get("extra_special_tokens")
    if isinstance(extra, list):
        missing.append("tokenizer_config.json lists extra_special_tokens (transformers 4 expects a dict)")
        del tokenizer_config["extra_special_tokens"]
        named = tokenizer_config.get("additional_special_tokens") or []
        tokenizer_config["additional_special_tokens"] = list(dict.fromkeys([*named, *extra]))
    return missing


def add_transformers_4_keys(folder: str | Path) -> None:
    """Make a ``save_pretrained`` folder readable by transformers 4.56 too (5 reads both spellings)."""
    folder = Path(folder)
    config = _read_json(folder / "config.json")
    tokenizer_config = _read_json(folder / "tokenizer_config.json")
    if _add_spellings_of_4(config or {}, tokenizer_config or {}):
        for name, content in (("config.json", config), ("tokenizer_config.json", tokenizer_config)):
            if content is not None:
                (folder / name).write_text(json.dumps(content, indent=2) + "\n")


def _check_readable_here(path: str) -> None:
    """On transformers 4, a folder only 5 reads is a UserError saying what to change, not an
    obscure failure deep in from_pretrained or, for RoPE, a model that silently loads wrong."""
    if _transformers_version() >= (5, 0) or not Path(path).is_dir():
        return
    folder = Path(path)
    problems = _add_spellings_of_4(
        _read_json(folder / "config.json") or {}, _read_json(folder / "tokenizer_config.json") or {}
    )
    if problems:
        import transformers

        raise UserError(
            f"The model folder {path} was saved by transformers 5, and this job runs transformers "
            f"{transformers.__version__}: " + "; ".join(problems) + ". Add the 4.x keys to the folder "
            "before uploading it (5 reads them too): add_transformers_4_keys(folder) in "
            "scripts/common/models.py does, and the scripts' save_final_model calls it. Or run the job "
            "on transformers 5 (the PyTorch image, which installs scripts/requirements.txt)."
        )


def load_tokenizer(path: str):
    """Padding on the right, a pad token always set, and ``PLAIN_CHAT_TEMPLATE`` when the
    tokenizer has no chat template."""
    from transformers import AutoTokenizer

    _check_readable_here(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:  # ValueError: a tokenizer class this transformers lacks
        raise UserError(f"Cannot load the tokenizer of {path}: {error}") from None
    if tokenizer.pad_token is None:  # padding positions are masked anyway; any token id will do
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    if tokenizer.chat_template is None:
        log.info("the tokenizer has no chat template: using the plain '### Role:' template")
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    return tokenizer


def load_model(path: str, device: torch.device, trainable: bool = True, dtype: torch.dtype | None = None):
    """``AutoModelForCausalLM`` on ``device``: fp32 if trained, bf16 on GPU if frozen (or ``dtype``)."""
    from transformers import AutoModelForCausalLM

    if dtype is None:
        dtype = torch.float32 if trainable else compute_dtype(device)
    _check_readable_here(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **_dtype_kwarg(dtype))
    except (OSError, ValueError) as error:  # ValueError: a model type this transformers lacks
        raise UserError(f"Cannot load the model {path}: {error}") from None
    model.to(device)
    if not trainable:
        model.eval()
        model.requires_grad_(False)
    return model


def load_device(learners: Learners, strategy: str) -> torch.device:
    """Where to load a model that ``prepare_for_training`` then wraps: FSDP moves each layer to the
    GPU as it shards it, so loading on the CPU means no GPU ever holds the whole model."""
    return torch.device("cpu") if strategy == "fsdp" else learners.device


def prepare_for_training(
    model, learners: Learners, strategy: str, gradient_checkpointing: bool = False, recompute: str = "full"
):
    """The model in train mode and shared between the learners (``distributed.wrap_model``).

    ``gradient_checkpointing`` recomputes activations in the backward pass with DDP; FSDP always does,
    ``recompute`` saying how (``distributed.enable_activation_checkpointing``: full or selective).
    Build the optimizer from the returned model's parameters.
    """
    if gradient_checkpointing and strategy == "ddp":
        distributed.enable_activation_checkpointing(model, recompute)
    model.train()
    return distributed.wrap_model(model, learners, strategy, activation_checkpointing=recompute)


def load_reference(path: str, learners: Learners, strategy: str):
    """The frozen reference model (DPO's, GRPO's KL penalty): no gradients, no optimizer state, bf16
    on GPU. With ``--strategy fsdp`` it is sharded like the policy, so each GPU holds 1/N of its
    weights (plus its root unit, embeddings and head, which FSDP2 keeps gathered after a forward)
    instead of a whole copy; its forward is then a collective, which every learner must run alike.
    """
    if strategy != "fsdp":
        return load_model(path, learners.device, trainable=False)
    model = load_model(path, torch.device("cpu"), trainable=False, dtype=compute_dtype(learners.device))
    return distributed.wrap_model(model, learners, strategy, activation_checkpointing=False)


def build_optimizer(model, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999)):
    """AdamW over the trainable parameters, with weight decay on matrices only (decaying biases and
    norm gains hurts)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in trainable if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def _tied_weight_names(model) -> list[str]:
    """Weights that are another weight (lm_head tied to the embeddings); a gathered FSDP state
    dict holds them twice. transformers 5 lists them as a dict, 4.x as a list."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if not getattr(config, "tie_word_embeddings", False):
        return []
    tied = getattr(model, "_tied_weights_keys", None) or []
    return list(tied.keys()) if isinstance(tied, dict) else list(tied)


def save_final_model(model, tokenizer, out_dir: str | Path, learners: Learners) -> None:
    """Save for ``AutoModelForCausalLM.from_pretrained(out_dir)`` on transformers 4.56 or 5 (every
    rank must call it). LoRA adapters are merged into the base weights, so the result is a plain model.
    """
    out_dir = Path(out_dir)
    module = unwrap(model)
    state = None
    try:
        from torch.distributed.fsdp import FSDPModule

        if isinstance(module, FSDPModule):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    except ImportError:
        pass
    if learners.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        if hasattr(module, "merge_and_unload"):  # peft
            module = module.merge_and_unload()
        save_dtype = compute_dtype(learners.device)
        if state is None:
            state = module.state_dict()
        for name in _tied_weight_names(module):  # saved once, as the weight it is tied to
            state.pop(name, None)
        state = {
            name: tensor.detach().to("cpu", save_dtype) if tensor.is_floating_point() else tensor.detach().cpu()
            for name, tensor in state.items()
        }
        module.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
        add_transformers_4_keys(out_dir)  # the next job may run on the Hugging Face image's 4.56
        log.info("final model saved to %s", out_dir)
    if learners.distributed:
        import torch.distributed as dist

        dist.barrier()
