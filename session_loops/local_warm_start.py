"""Local mode only: a tiny base model that already answers in GSM8K's '#### n' format.

The project's tiny model is random; LoRA on it cannot learn a format in a few steps, and a group
whose rewards are all 0 teaches GRPO nothing. In the cloud the base model (Qwen, Llama) already
follows the system prompt's format. So for local mode this script fine-tunes the tiny model fully,
100 steps on the count problems of ``grpo.count_problems``, and registers the result with the
local training-session service as a base model. Runs in the main environment (torch):

    .venv/bin/python -m session_loops.local_warm_start [--steps 60]

It prints the base model id to use. The model is cached beside the tiny model (built once per machine).
Measured: 60 steps learn the format only (held-out accuracy 0.15, chance 0.2); 100 steps also start
to copy the number (about 0.3-0.4); 150 steps reach 0.65. GRPO then has groups with mixed rewards.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

WARM_START_MODEL = "local/tiny-qwen2-gsm8k-format"


def build(out_dir: Path, steps: int, seed: int = 0) -> Path:
    import torch
    from common.data import pad_rows  # the job-side loops' padding
    from environments.gsm8k import GSM8KEnvironment
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers.tiny_model import tiny_model_dir
    from session_loops.grpo import count_problems

    env = GSM8KEnvironment()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(seed)
    problems = count_problems(512, seed=seed + 1)  # different problems from the notebook's
    for _ in range(steps):
        rows, labels = [], []
        for problem in rng.sample(problems, 32):
            text = tokenizer.apply_chat_template(env.prompt_messages(problem), tokenize=False, add_generation_prompt=True)
            prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
            answer = tokenizer(problem["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            rows.append(prompt + answer)
            labels.append([-100] * len(prompt) + answer)
        input_ids, attention_mask = pad_rows(rows, tokenizer.pad_token_id, left=False, device="cpu")
        label_ids, _ = pad_rows(labels, -100, left=False, device="cpu")
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=label_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    import os

    from helpers.local_mode import sessions
    from helpers.tiny_model import tiny_model_dir

    out_dir = tiny_model_dir().parent / f"{WARM_START_MODEL.split('/')[1]}-{args.steps}"  # cached beside the tiny model
    if not (out_dir / "config.json").exists():
        building = out_dir.with_name(f".{out_dir.name}.{os.getpid()}")
        build(building, args.steps)
        building.rename(out_dir)  # whole or not at all, when two processes build at once
    sessions.register_base_model(WARM_START_MODEL, out_dir)
    print(json.dumps({"base_model": WARM_START_MODEL, "path": str(out_dir)}))


if __name__ == "__main__":
    main()
