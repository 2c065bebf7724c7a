"""A tiny causal LM and its tokenizer, built offline in seconds.

The Hugging Face Hub is out of reach in tests and CI, so local mode, the tests and the
main job use a Qwen2-architecture model of about 1.1 M parameters with a byte-level BPE
tokenizer trained here on the project's own text. It is saved with ``save_pretrained``
and loads with ``AutoModelForCausalLM`` / ``AutoTokenizer`` like any hub model, so the
training scripts cannot tell it from ``Qwen/Qwen2.5-0.5B-Instruct``. Built with transformers 5,
it also loads in the training image's 4.56 (its config files are written in words both read).

The tokenizer is trained with the same pipeline Qwen2's tokenizer rebuilds on load (NFC,
Qwen2's split regex, ``ByteLevel(use_regex=False)``); with plain ByteLevel pre-tokenisation
the reloaded tokenizer would silently give other ids.

    python -m local_mode.tiny_model            # builds (or reuses) and prints the folder
"""

from __future__ import annotations

import json
from pathlib import Path

# Qwen2's pre-tokenisation regex (letters, numbers one by one, punctuation, spaces).
QWEN2_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TINY_CONFIG = dict(
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
    rope_theta=10000.0,
)
# The tokenizer's settings, and its tokenizer_config.json as written: in words both transformers
# 4.56 (the training image) and 5 read. Saved by 5 it would name the class TokenizersBackend,
# unknown to 4.56, and list extra_special_tokens where 4.56 expects additional_special_tokens.
TOKENIZER_CONFIG = {
    "tokenizer_class": "Qwen2Tokenizer",  # as Qwen2.5 names it; both versions load their fast Qwen2 class
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "bos_token": None,
    "unk_token": None,
    "additional_special_tokens": ["<|im_start|>"],
    # What Qwen2's tokenizer gives the model; a plain fast tokenizer in 4.56 would add
    # token_type_ids, which generate() rejects.
    "model_input_names": ["input_ids", "attention_mask"],
    "clean_up_tokenization_spaces": False,
}
VOCAB_SIZE = 2048
BUILDER_VERSION = 2  # bump when anything below changes, so caches are rebuilt


def build_tokenizer(seed: int = 0):
    """Train the byte-level BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from local_mode.offline_data import corpus

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: no <unk> ever
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed), trainer=trainer)
    settings = {key: value for key, value in TOKENIZER_CONFIG.items() if key != "tokenizer_class"}
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **settings)
    wrapped.chat_template = CHATML_TEMPLATE
    return wrapped


def build_tiny_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Build the tiny model and tokenizer into ``out_dir`` (deterministic for ``seed``)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_CONFIG,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _write_json(out_dir / "tokenizer_config.json", TOKENIZER_CONFIG)
    # transformers 5 writes RoPE only as rope_parameters, which 4.56 ignores (it would silently
    # take its own default): rope_theta at the top level too.
    saved = json.loads((out_dir / "config.json").read_text())
    _write_json(out_dir / "config.json", {**saved, "rope_theta": TINY_CONFIG["rope_theta"]})
    return out_dir


def _write_json(path: Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")


def tiny_model_dir(seed: int = 0) -> Path:
    """The cached tiny model folder, built once per machine (safe when several processes ask at once)."""
    import transformers

    from local_mode.offline_models import cached_build

    key = [BUILDER_VERSION, seed, TINY_CONFIG, VOCAB_SIZE, transformers.__version__]
    return cached_build("tiny-qwen2", key, lambda folder: build_tiny_model(folder, seed=seed))


if __name__ == "__main__":
    print(tiny_model_dir())
