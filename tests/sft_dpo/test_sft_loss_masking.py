"""SFT: labels keep exactly the assistant turns, and the loss equals the model's own masked loss."""

from __future__ import annotations

import pytest
import torch

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Ken has 3 apples and buys 4 more. How many?"},
    {"role": "assistant", "content": "3+4 = 7\n#### 7"},
    {"role": "user", "content": "And if he eats 2?"},
    {"role": "assistant", "content": "7-2 = 5\n#### 5"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from common.models import load_tokenizer

    return load_tokenizer(str(tiny_model_path))


def _target_text(tokenizer, example) -> str:
    return tokenizer.decode([t for t in example["labels"] if t != -100])


def test_only_assistant_turns_are_targets(tokenizer):
    import sft

    example = sft.tokenize_conversation(tokenizer, CONVERSATION, max_length=4096)
    assert _target_text(tokenizer, example) == "3+4 = 7\n#### 7<|im_end|>7-2 = 5\n#### 5<|im_end|>"
    assert example["num_targets"] == sum(1 for t in example["labels"][1:] if t != -100) > 0


def test_plain_template_when_the_tokenizer_has_none(tiny_model_path, tmp_path):
    import sft
    from common.models import load_tokenizer
    from transformers import AutoTokenizer

    bare = AutoTokenizer.from_pretrained(tiny_model_path)
    bare.chat_template = None
    bare.save_pretrained(tmp_path)
    tokenizer = load_tokenizer(str(tmp_path))
    example = sft.tokenize_conversation(tokenizer, CONVERSATION[1:3], max_length=4096)
    assert tokenizer.decode(example["input_ids"]).startswith("### User:\nKen has 3 apples")
    assert _target_text(tokenizer, example) == "3+4 = 7\n#### 7<|im_end|>"


def test_truncation_keeps_labels_aligned(tokenizer):
    import sft

    example = sft.tokenize_conversation(tokenizer, CONVERSATION, max_length=40)
    assert len(example["input_ids"]) == len(example["labels"]) == 40
    full = sft.tokenize_conversation(tokenizer, CONVERSATION, max_length=4096)
    assert example["labels"] == full["labels"][:40]


def test_loss_equals_the_models_labels_loss(tokenizer, tiny_model_path):
    import sft
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    short = CONVERSATION[1:3]
    examples = [sft.tokenize_conversation(tokenizer, c, 4096) for c in (CONVERSATION, short)]
    batch = sft.collate(examples, tokenizer.pad_token_id, torch.device("cpu"))
    assert (batch["attention_mask"] == 0).any(), "the batch must contain padding for the check to mean something"
    output = model(**batch)  # Hugging Face's loss: mean over labelled next tokens
    loss_sum, count = sft.token_loss_sum(output.logits, batch["labels"])
    assert count.item() == sum(e["num_targets"] for e in examples)
    torch.testing.assert_close(loss_sum / count, output.loss, rtol=1e-5, atol=0.0)
