"""The format-tuned base models of local mode: what they are trained on, and the loss that trains them."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from local_mode.format_tuned_models import learned_token_loss, tool_demonstrations, training_sequences
from local_mode.tiny_model import tiny_model_dir


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(tiny_model_dir())


def test_tool_demonstrations_learn_the_models_turns_and_read_the_tools_real_reply(tokenizer):
    sequences = tool_demonstrations(tokenizer, seed=0, n=24)
    assert len(sequences) == 24  # every easy problem fits the context
    calls = 0
    for tokens, labels in sequences:
        assert len(tokens) == len(labels)
        learned = [t for t, label in zip(tokens, labels, strict=True) if label != -100]
        assert all(label in (-100, t) for t, label in zip(tokens, labels, strict=True))
        assert labels[0] == -100 and learned  # the prompt is read, the answer learned
        text = tokenizer.decode(learned)
        assert "####" in text
        if "```python" in text:
            calls += 1
            # the printed value arrives in a tool turn the model reads and does not learn
            program = text.split("```python\n")[1].split("```")[0]
            printed = str(eval(program.strip()[len("print(") : -1]))  # noqa: S307 - the demonstration's own sum
            read_only = tokenizer.decode([t for t, label in zip(tokens, labels, strict=True) if label == -100])
            assert printed in read_only.split("```")[-1]
    assert 0 < calls < len(sequences)  # worked answers with a calculation call the tool; stated facts do not


def test_the_learned_token_loss_equals_the_models_own_loss_with_labels(tokenizer):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir())
    rows = training_sequences(tokenizer, "gsm8k", seed=0)[:3]
    width = max(len(tokens) for tokens, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([tokens + [pad] * (width - len(tokens)) for tokens, _ in rows])
    attention_mask = torch.tensor([[1] * len(tokens) + [0] * (width - len(tokens)) for tokens, _ in rows])
    label_ids = torch.tensor([labels + [-100] * (width - len(labels)) for _, labels in rows])
    expected = model(input_ids=input_ids, attention_mask=attention_mask, labels=label_ids).loss
    assert learned_token_loss(model, input_ids, attention_mask, label_ids).item() == pytest.approx(
        expected.item(), rel=1e-5
    )
