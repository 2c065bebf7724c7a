"""Models and data the CPU benchmarks run on, built offline and cached under ``outputs/bench/``.

- ``tiny``:  ``local_mode.tiny_model.tiny_model_dir()`` (1.3 M parameters).
- ``small``: the same tokenizer with a wider, deeper Qwen2 configuration (about 25 M parameters),
             random weights; what a step costs once the matrices, not Python, dominate.
- data: ``local_mode.offline_data.write_all`` (chat, preferences, gsm8k, code) in channel layout;
  ``uniform_data_dir`` repeats one row of median length so that every batch of both sides of a
  comparison has the same shape whatever order each samples in.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS_DIR = REPO_ROOT / "scripts"
BENCH_OUTPUT = REPO_ROOT / "outputs" / "bench"

SMALL_CONFIG = dict(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    rope_theta=10000.0,
)


def parameter_count(model_dir: str | Path) -> int:
    """Parameters of a saved model, read from its safetensors headers (no weights loaded)."""
    total = 0
    for file in Path(model_dir).glob("*.safetensors"):
        with open(file, "rb") as handle:
            header_size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(header_size))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for size in entry["shape"]:
                    count *= size
                total += count
    return total


def build_small_model(out_dir: str | Path, seed: int = 0) -> Path:
    """A Qwen2 model with ``SMALL_CONFIG`` and the tiny model's tokenizer, random weights."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from local_mode.tiny_model import tiny_model_dir

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **SMALL_CONFIG,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def model_dir(name: str) -> Path:
    """The folder of benchmark model ``name`` (``tiny`` or ``small``), built on first use."""
    from local_mode.tiny_model import tiny_model_dir

    if name == "tiny":
        return tiny_model_dir()
    if name != "small":
        raise ValueError(f"unknown benchmark model {name!r}: use tiny or small")
    target = BENCH_OUTPUT / "models" / "small-qwen2"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="small-qwen2.", dir=target.parent))
    try:
        build_small_model(staging)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def data_dir() -> Path:
    """``outputs/bench/data/<name>/train.jsonl`` for every offline data set, written on first use."""
    from local_mode.offline_data import write_all

    root = BENCH_OUTPUT / "data"
    if not (root / "gsm8k" / "train.jsonl").exists():
        write_all(root, n_train=128, n_test=16, seed=0)
    return root


def uniform_data_dir(copies: int = 64) -> Path:
    """``<name>/train.jsonl`` holding ``copies`` times the median-length row of each data set."""
    root = BENCH_OUTPUT / f"data-uniform-{copies}"
    if (root / "gsm8k" / "train.jsonl").exists():
        return root
    for name in ("chat", "preferences", "gsm8k"):
        rows = [json.loads(line) for line in (data_dir() / name / "train.jsonl").read_text().splitlines() if line]
        rows.sort(key=lambda row: len(json.dumps(row)))
        median_row = rows[len(rows) // 2]
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "train.jsonl").write_text("".join(json.dumps(median_row) + "\n" for _ in range(copies)))
    return root
