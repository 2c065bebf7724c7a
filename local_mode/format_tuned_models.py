"""Local mode only: tiny base models that already answer in the format an environment reads.

The project's tiny model is random; LoRA on it cannot learn a format in a few steps, and a group
whose rewards are all 0 teaches GRPO nothing. In the cloud the base model (Qwen, Llama) already
follows the system prompt's format. So for local mode this script fine-tunes the tiny model fully
on worked answers and registers the result with the local training-session service as a base model:

- ``--task gsm8k`` (100 steps): the count problems of ``offline_data.count_problem_records``, answered ``#### n``;
- ``--task code`` (20 steps): the project's code problems (``local_mode/offline_data.py``), answered with
  one fenced program; stopped early, so that about half its completions still hold no program and
  code RL has a format to learn;
- ``--task tool`` (200 steps): episodes with the Python tool (notebook 15). Each easy GSM8K-format
  problem's worked answer becomes a demonstration (``environments.python_tool.demonstration``): a
  program that prints the calculation, the tool's real reply from the sandbox, then ``#### n``. Only
  the model's turns are learned. The problems are of the seen templates only
  (``offline_data.gsm8k_easy_records``): the held-out split's unseen templates stay unseen by every model. An instruct model in the cloud already calls a tool it is offered;
  the tiny one has to be shown the shape of a call, and RL then teaches it to use the reply.

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

FORMAT_TUNED_MODELS = {
    "gsm8k": "local/tiny-qwen2-gsm8k-format",
    "code": "local/tiny-qwen2-code-format",
    "tool": "local/tiny-qwen2-tool-format",
}
DEFAULT_STEPS = {"gsm8k": 100, "code": 20, "tool": 200}
TOOL_CONTEXT = 1024  # tokens a demonstration may fill, as notebook 15's episodes


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


def tool_demonstrations(tokenizer, seed: int, n: int = 512) -> list[tuple[list[int], list[int]]]:
    """(tokens, labels) of tool-use episodes replayed through the real tool: the label is the token on
    the model's turns and -100 (not learned) on the prompt and the tool's replies."""
    from common.episodes import ChatTurns, replay_episode
    from environments.python_tool import PythonToolEnvironment, demonstration
    from sandbox import Sandbox

    from local_mode.offline_data import gsm8k_easy_records

    chat = ChatTurns(tokenizer)
    with Sandbox(workers=2) as sandbox:
        env = PythonToolEnvironment(sandbox=sandbox)
        episodes = [
            replay_episode(example, env, chat, demonstration(example), TOOL_CONTEXT)
            for example in gsm8k_easy_records(n, seed=seed + 1)  # other problems than notebook 00 stages
        ]
    return [
        (e.tokens, [t if s else -100 for t, s in zip(e.tokens, e.sampled, strict=True)])
        for e in episodes
        if e.end_reason == "answered"
    ]


def training_sequences(tokenizer, task: str, seed: int) -> list[tuple[list[int], list[int]]]:
    """(tokens, labels) to fine-tune on; labels are -100 where nothing is learned (the prompt)."""
    if task == "tool":
        return tool_demonstrations(tokenizer, seed)
    sequences = []
    for messages, answer in worked_examples(task, seed):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        sequences.append((prompt + answer_ids, [-100] * len(prompt) + answer_ids))  # only the answer is learned
    return sequences


def learned_token_loss(model, input_ids, attention_mask, label_ids):
    """The mean cross-entropy of the tokens whose label is not -100, as ``model(..., labels=).loss``, with
    logits computed only at those positions: the vocabulary is 150 k wide, and most positions are prompt
    or tool reply, so this takes a fraction of the memory and time."""
    import torch

    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    learned = label_ids[:, 1:] != -100  # position i predicts token i + 1
    logits = model.get_output_embeddings()(hidden[:, :-1][learned])
    return torch.nn.functional.cross_entropy(logits.float(), label_ids[:, 1:][learned])


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
    sequences = training_sequences(tokenizer, task, seed)
    for _ in range(steps):
        rows, labels = [], []
        for tokens, token_labels in rng.sample(sequences, 32):
            rows.append(torch.tensor(tokens))
            labels.append(torch.tensor(token_labels))
        input_ids = pad_sequence(rows, batch_first=True, padding_value=tokenizer.pad_token_id)
        attention_mask = pad_sequence([torch.ones_like(r) for r in rows], batch_first=True, padding_value=0)
        label_ids = pad_sequence(labels, batch_first=True, padding_value=-100)
        learned_token_loss(model, input_ids, attention_mask, label_ids).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="gsm8k", choices=sorted(FORMAT_TUNED_MODELS))
    parser.add_argument("--steps", type=int, default=None, help="default: 100 for gsm8k, 20 for code, 200 for tool")
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
