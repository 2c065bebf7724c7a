"""Local mode only: tiny base models that already answer in the format an environment reads.

The project's tiny model is random; LoRA on it cannot learn a format in a few steps, and a group
whose rewards are all 0 teaches GRPO nothing. In the cloud the base model (Qwen, Llama) already
follows the system prompt's format. So for local mode this script fine-tunes the tiny model fully
on worked answers and registers the result with the local training-session service as a base model:

- ``--task gsm8k`` (100 steps): the count problems of ``offline_data.count_problem_records``, answered ``#### n``;
- ``--task code`` (20 steps): the project's code problems (``local_mode/offline_data.py``), answered with
  one fenced program; stopped early, so that about half its completions still hold no program and
  code RL has a format to learn.

Runs in the main environment (torch):

    .venv/bin/python -m local_mode.format_tuned_models [--task code] [--steps 60]

It prints the base model id to use. The model is cached beside the tiny model (built once per machine).
For gsm8k, 100 steps teach the format and start the model copying the number, so that GRPO's groups
have mixed rewards from the first step.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

FORMAT_TUNED_MODELS = {"gsm8k": "local/tiny-qwen2-gsm8k-format", "code": "local/tiny-qwen2-code-format"}
DEFAULT_STEPS = {"gsm8k": 100, "code": 20}


def worked_examples(task: str, seed: int) -> list[tuple[list[dict], str]]:
    """(prompt messages, answer) pairs, different problems from the notebooks'."""
    if task == "gsm8k":
        from environments.gsm8k import GSM8KEnvironment

        from local_mode.offline_data import count_problem_records

        env = GSM8KEnvironment()
        return [(env.prompt_messages(p), p["answer"]) for p in count_problem_records(512, seed=seed + 1)]
    from environments.code import CodeEnvironment

    from local_mode import offline_data

    env = CodeEnvironment()
    return [
        (env.prompt_messages(p), offline_data.code_solution(p))
        for p in offline_data.code_problem_records(512, seed=seed + 1)
    ]


def build(out_dir: Path, task: str, steps: int, seed: int = 0) -> Path:
    import torch
    from torch.nn.utils.rnn import pad_sequence
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from local_mode.tiny_model import tiny_model_dir

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(seed)
    examples = worked_examples(task, seed)
    for _ in range(steps):
        rows, labels = [], []
        for messages, answer in rng.sample(examples, 32):
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
            answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            rows.append(torch.tensor(prompt + answer_ids))
            labels.append(torch.tensor([-100] * len(prompt) + answer_ids))  # only the answer is learned
        input_ids = pad_sequence(rows, batch_first=True, padding_value=tokenizer.pad_token_id)
        attention_mask = pad_sequence([torch.ones_like(r) for r in rows], batch_first=True, padding_value=0)
        label_ids = pad_sequence(labels, batch_first=True, padding_value=-100)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=label_ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="gsm8k", choices=sorted(FORMAT_TUNED_MODELS))
    parser.add_argument("--steps", type=int, default=None, help="default: 100 for gsm8k, 20 for code")
    args = parser.parse_args()
    import os

    from local_mode import session_service
    from local_mode.tiny_model import tiny_model_dir

    model_id, steps = FORMAT_TUNED_MODELS[args.task], args.steps or DEFAULT_STEPS[args.task]
    out_dir = tiny_model_dir().parent / f"{model_id.split('/')[1]}-{steps}"  # cached beside the tiny model
    if not (out_dir / "config.json").exists():
        building = out_dir.with_name(f".{out_dir.name}.{os.getpid()}")
        build(building, args.task, steps)
        building.rename(out_dir)  # whole or not at all, when two processes build at once
    session_service.register_base_model(model_id, out_dir)
    print(json.dumps({"base_model": model_id, "path": str(out_dir)}))


if __name__ == "__main__":
    main()
