"""The offline tiny model: reloads under HF_HUB_OFFLINE, tokenises identically, generates, trains."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from local_mode import offline_data as data_sets
from local_mode.tiny_model import build_tiny_model, build_tokenizer, tiny_model_dir

SAMPLES = [
    "Natalia sold 48/2 = 24 clips in May.\n#### 72",
    "  leading spaces, tabs\tand unicode: café naïve — ünïcödé 日本語 🙂",
    "def solve(a, b):\n    return a * b + a\n",
    "$1,000.00 or -3 or 3/4 \\boxed{12}",
]


def test_reload_offline_is_a_qwen2_of_the_expected_size(tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert model.config.model_type == "qwen2"
    n_params = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= n_params <= 5_000_000, n_params
    assert (tiny_model_path / "model.safetensors").exists()


def test_reloaded_tokenizer_gives_the_same_ids_as_the_trained_one(tiny_model_path):
    raw = build_tokenizer(seed=0)
    reloaded = AutoTokenizer.from_pretrained(tiny_model_path)
    for text in SAMPLES:
        assert reloaded(text)["input_ids"] == raw(text)["input_ids"], text
        assert reloaded.decode(reloaded(text)["input_ids"]) == text
    assert reloaded.unk_token_id is None  # byte-level: nothing is ever unknown
    assert reloaded.eos_token == "<|im_end|>"
    assert reloaded.pad_token == "<|endoftext|>"


def test_chat_template_is_chatml(tiny_model_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_generate_and_one_training_step(tiny_model_path):
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    batch = tokenizer(["What is 3 + 4?", "Hello"], return_tensors="pt", padding=True, padding_side="left")
    out = model.generate(**batch, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[0] == 2 and out.shape[1] > batch["input_ids"].shape[1]

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = tokenizer(SAMPLES[0], return_tensors="pt")["input_ids"]
    losses = []
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_builder_is_deterministic(tmp_path):
    first = build_tiny_model(tmp_path / "a", seed=3)
    second = build_tiny_model(tmp_path / "b", seed=3)
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    assert json.loads((first / "tokenizer.json").read_text()) == json.loads((second / "tokenizer.json").read_text())


def test_cache_is_reused(tiny_model_path):
    before = (tiny_model_path / "model.safetensors").stat().st_mtime_ns
    assert tiny_model_dir() == tiny_model_path
    assert (tiny_model_path / "model.safetensors").stat().st_mtime_ns == before


def test_offline_data_sets_have_the_real_formats(offline_data):
    gsm = offline_data_rows(offline_data["gsm8k"])
    # openai/gsm8k's fields, and the name of the template the offline problem was drawn from
    assert all(set(r) == {"question", "answer", "template"} and "####" in r["answer"] for r in gsm)
    assert all(data_sets.gsm8k_final_number(r["answer"]).lstrip("-").isdigit() for r in gsm)
    prefs = offline_data_rows(offline_data["preferences"])
    assert all(r["chosen"] != r["rejected"] and r["prompt"] for r in prefs)
    chats = offline_data_rows(offline_data["chat"])
    assert all(r["messages"][-1]["role"] == "assistant" for r in chats)
    code = offline_data_rows(offline_data["code"])
    assert {r["testtype"] for r in code} == {"stdin", "functional"}
    assert all(r["tests"] and all({"input", "output"} <= set(t) for t in r["tests"]) for r in code)
    # Deterministic for a seed, different across seeds.
    assert data_sets.gsm8k_records(5, seed=1) == data_sets.gsm8k_records(5, seed=1)
    assert data_sets.gsm8k_records(5, seed=1) != data_sets.gsm8k_records(5, seed=2)


def offline_data_rows(folder):
    return data_sets.read_jsonl(folder / "train.jsonl")
