"""GRPO learns, not just runs: a short warm-up SFT on the tiny model, then GRPO on a toy task with a
verifiable reward must raise the mean reward clearly.

The toy tasks are environments defined here, so these tests also show that the loop does not know
GSM8K. Each run is in-process with one CPU thread (the test machine is shared; more threads only
contend), and is deterministic for its seed.
"""

import json
import random

import grpo
import pytest
import torch
from common import data, distributed, generation


class PickSevenEnvironment:
    """'Pick a digit.' Reward 1 for answering exactly 7."""

    def load(self, path):
        return data.read_jsonl(path, ["prompt"])

    def prompt_messages(self, example):
        return [{"role": "user", "content": example["prompt"]}]

    def score(self, examples, completions):
        return [{"reward": float(text.strip() == "7"), "correct": text.strip() == "7"} for text in completions]


class AdditionEnvironment:
    """'What is a+b?' with a, b in 0..2. Reward 1 for the right digit."""

    def load(self, path):
        return data.read_jsonl(path, ["prompt", "answer"])

    def prompt_messages(self, example):
        return [{"role": "user", "content": example["prompt"]}]

    def score(self, examples, completions):
        return [
            {"reward": float(text.strip() == example["answer"]), "correct": text.strip() == example["answer"]}
            for example, text in zip(examples, completions, strict=True)
        ]


def warm_up_sft(model_path, out_dir, examples, env, steps, seed=0):
    """Teach the tiny model the answer format: one random digit, then end of turn. Afterwards it
    answers with a digit but has no preference for the right one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(seed)
    prompts = [generation.prompt_token_ids(tokenizer, env.prompt_messages(example)) for example in examples]
    for _ in range(steps):
        rows, labels = [], []
        for prompt in rng.choices(prompts, k=32):
            answer = tokenizer(str(rng.randrange(10)), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            rows.append(prompt + answer)
            labels.append([-100] * len(prompt) + answer)
        width = max(map(len, rows))
        input_ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        label_ids = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
        attention_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=label_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def run_grpo(tmp_path, monkeypatch, env, rows, model_path, options):
    train_dir = tmp_path / "train"
    train_dir.mkdir()
    (train_dir / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    for name, folder in [
        ("SM_CHANNEL_TRAIN", train_dir),
        ("SM_MODEL_DIR", tmp_path / "model"),
        ("SM_OUTPUT_DATA_DIR", tmp_path / "data"),
        ("SM_OUTPUT_DIR", tmp_path / "output"),
    ]:
        monkeypatch.setenv(name, str(folder))
    monkeypatch.delenv("SM_HPS", raising=False)
    args = grpo.parse_args(
        [
            "--model_name_or_path",
            str(model_path),
            "--checkpoint_dir",
            str(tmp_path / "checkpoints"),
            "--checkpoint_every",
            "0",
            *options,
        ]
    )
    assert grpo.train(args, env, distributed.single_learner("cpu")) is True
    return [json.loads(line) for line in (tmp_path / "data" / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_grpo_learns_to_pick_seven(tiny_model_path, tmp_path, monkeypatch, one_thread):
    env = PickSevenEnvironment()
    rows = [{"prompt": "Pick a digit."}] * 8
    sft_model = warm_up_sft(tiny_model_path, tmp_path / "sft", rows, env, steps=30)
    records = run_grpo(
        tmp_path,
        monkeypatch,
        env,
        rows,
        sft_model,
        [
            "--max_steps",
            "30",
            "--prompts_per_step",
            "2",
            "--group_size",
            "8",
            "--micro_batch_size",
            "16",
            "--max_new_tokens",
            "3",
            "--learning_rate",
            "1e-3",
            "--seed",
            "0",
        ],
    )
    rewards = [record["reward"] for record in records]
    assert len(rewards) == 30
    start, end = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    assert start < 0.35, rewards  # the warm-up left no preference for 7
    assert end > 0.8, rewards
    assert records[-1]["accuracy"] == records[-1]["reward"]


@pytest.mark.slow
def test_grpo_learns_single_digit_addition(tiny_model_path, tmp_path, monkeypatch, one_thread):
    env = AdditionEnvironment()
    rows = [{"prompt": f"What is {a}+{b}?", "answer": str(a + b)} for a in range(3) for b in range(3)]
    sft_model = warm_up_sft(tiny_model_path, tmp_path / "sft", rows, env, steps=40)
    records = run_grpo(
        tmp_path,
        monkeypatch,
        env,
        rows,
        sft_model,
        [
            "--max_steps",
            "100",
            "--prompts_per_step",
            "4",
            "--group_size",
            "8",
            "--micro_batch_size",
            "32",
            "--max_new_tokens",
            "3",
            "--learning_rate",
            "1e-3",
            "--seed",
            "0",
            "--beta",
            "0.01",
            "--num_iterations",
            "2",
            "--loss_type",
            "grpo",
        ],
    )
    rewards = [record["reward"] for record in records]
    # Measured: about 0.17 over the first 10 steps, 0.33 over the last 20 (TRL: 0.19 -> 0.34).
    start, end = sum(rewards[:10]) / 10, sum(rewards[-20:]) / 20
    assert start < 0.25, rewards
    assert end > start + 0.1, rewards
