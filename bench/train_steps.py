"""Training step time: our ``sft.py`` / ``dpo.py`` / ``grpo.py`` loops against TRL's trainers.

Same model, same batch and optimizer settings, CPU. The data set is one row of median length
repeated (``fixtures.uniform_data_dir``), so every step of both sides trains on batches of the
same shape although each samples in its own order. Each run is a fresh process (so
its peak RSS is its own) that loads everything, trains ``warmup + measured`` steps and reports the
wall time between consecutive steps; start-up (imports, loading, tokenising) is outside the
measured window on both sides. Runs alternate ours, TRL, ours, TRL, ... so a change of load on
the machine hits both; the figure is the median over all measured steps of all rounds.

Every run uses one torch thread by default (``--threads``), both sides alike.

Our loops run as they are: ``sft.main(argv)``, ``dpo.main(argv)``, ``grpo.train(args, env,
learners)`` imported from ``scripts/``; a step ends when its metric line (``step=N ...``) is
printed. TRL's step ends at ``on_step_end``. GRPO steps are split into generation, reward and the
rest (log-probs, loss, backward, optimizer): ours from the ``gen_time`` / ``reward_time`` metrics,
TRL's by timing its ``_generate`` and ``_calculate_rewards``.

    python -m bench.train_steps --loops sft dpo grpo --models tiny small --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.fixtures import REPO_ROOT, model_dir, parameter_count, uniform_data_dir
from bench.tables import Row, format_table, machine_description, median, peak_rss_mib

# The settings both sides share. SFT/DPO: 8 examples a step in 2 micro-batches of 4.
# (TRL 1.16 has no max_prompt_length; no prompt of the data comes near it.)
# GRPO: 4 prompts x 4 completions, one micro-batch of 16, 32 new tokens, no KL, DAPO aggregation.
SETTINGS = {
    "sft": dict(batch_size=8, per_device_batch_size=4, max_length=512, learning_rate=2e-5, warmup_steps=2),
    "dpo": dict(
        batch_size=8,
        per_device_batch_size=4,
        max_length=512,
        max_prompt_length=256,
        learning_rate=5e-7,
        warmup_steps=2,
        beta=0.1,
    ),
    "grpo": dict(
        prompts_per_step=4,
        group_size=4,
        micro_batch_size=16,
        max_new_tokens=32,
        temperature=1.0,
        learning_rate=1e-6,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
    ),
}
DATA_SET = {"sft": "chat", "dpo": "preferences", "grpo": "gsm8k"}
SEED = 42


# --------------------------------------------------------------------------- our loops, in this process


class StepClock:
    """Stands in for stdout: passes everything through and notes when each metric line appears."""

    def __init__(self, stream):
        self.stream = stream
        self.times: list[float] = []
        self.lines: list[dict[str, float]] = []

    def write(self, text: str) -> int:
        if text.startswith("step="):
            self.times.append(time.perf_counter())
            self.lines.append({key: float(value) for key, value in (item.split("=", 1) for item in text.split())})
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def run_ours(
    loop: str, model: Path, data: Path, steps: int, work: Path, settings: dict | None = None, device: str = "cpu"
) -> dict:
    """Our loop, ``steps`` steps; ``settings`` replace ``SETTINGS[loop]`` (same keys)."""
    os.environ.update(
        {"SM_CHANNEL_TRAIN": str(data), "SM_OUTPUT_DATA_DIR": str(work / "output"), "SM_MODEL_DIR": str(work / "model")}
    )
    os.environ.pop("SM_HPS", None)
    settings = settings or SETTINGS[loop]
    argv = [
        "--model_name_or_path",
        str(model),
        "--max_steps",
        str(steps),
        "--seed",
        str(SEED),
        "--checkpoint_dir",
        str(work / "checkpoints"),
        "--checkpoint_every",
        "0",
        "--log_every",
        "1",
    ]
    argv += [item for key, value in settings.items() for item in (f"--{key}", str(value))]
    clock = StepClock(sys.stdout)
    sys.stdout = clock
    try:
        if loop == "grpo":
            import grpo
            from common import distributed
            from environments.gsm8k import GSM8KEnvironment

            grpo.train(grpo.parse_args(argv), GSM8KEnvironment(), distributed.single_learner(device))
        else:
            module = __import__(loop)
            module.main(argv)
    finally:
        sys.stdout = clock.stream
    step_ends = clock.times
    result = {"step_times": [b - a for a, b in zip(step_ends, step_ends[1:], strict=False)]}
    if loop == "grpo":  # the first step has no start mark; the split is per step, so drop it too
        result["gen_times"] = [line["gen_time"] for line in clock.lines[1:]]
        result["reward_times"] = [line["reward_time"] for line in clock.lines[1:]]
        result["completion_tokens"] = [
            line["completion_length"] * settings["prompts_per_step"] * settings["group_size"]
            for line in clock.lines[1:]
        ]
    return result


# --------------------------------------------------------------------------- TRL's trainers, in this process


def _trl_common(loop: str, steps: int, work: Path, settings: dict, device: str) -> dict:
    # On GPU bf16 autocast over fp32 weights, as our loops do (common.distributed.autocast).
    on_gpu = device.startswith("cuda")
    common = dict(
        output_dir=str(work / "trl"),
        use_cpu=not on_gpu,
        bf16=on_gpu,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        max_steps=steps,
        seed=SEED,
        learning_rate=settings["learning_rate"],
        weight_decay=0.0,
        max_grad_norm=1.0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    if loop in ("sft", "dpo"):
        common.update(
            per_device_train_batch_size=settings["per_device_batch_size"],
            gradient_accumulation_steps=settings["batch_size"] // settings["per_device_batch_size"],
            lr_scheduler_type="cosine",
            warmup_steps=settings["warmup_steps"],
            max_length=settings["max_length"],
        )
    else:
        completions = settings["prompts_per_step"] * settings["group_size"]
        common.update(
            per_device_train_batch_size=settings["micro_batch_size"],
            gradient_accumulation_steps=completions // settings["micro_batch_size"],
            lr_scheduler_type="constant",
            warmup_steps=0,
        )
    return common


def run_trl(
    loop: str, model: Path, data: Path, steps: int, work: Path, settings: dict | None = None, device: str = "cpu"
) -> dict:
    """TRL's trainer for ``loop`` with the same settings as ``run_ours``."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines() if line.strip()]
    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    settings = settings or SETTINGS[loop]
    step_ends: list[float] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():  # the step's kernels have finished, as after our loops' .item()
                torch.cuda.synchronize()
            step_ends.append(time.perf_counter())

    timers = {"gen": [], "reward": []}
    if loop == "sft":
        from trl import SFTConfig, SFTTrainer

        # Prompt-completion form: the loss is on the assistant turn only, as in sft.py.
        dataset = Dataset.from_list([{"prompt": r["messages"][:-1], "completion": r["messages"][-1:]} for r in rows])
        trainer = SFTTrainer(
            model=policy,
            args=SFTConfig(**_trl_common(loop, steps, work, settings, device)),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepEnds()],
        )
    elif loop == "dpo":
        from trl import DPOConfig, DPOTrainer

        # The conversational form renders exactly what dpo.py renders from the strings.
        dataset = Dataset.from_list(
            [
                {
                    "prompt": [{"role": "user", "content": r["prompt"]}],
                    "chosen": [{"role": "assistant", "content": r["chosen"]}],
                    "rejected": [{"role": "assistant", "content": r["rejected"]}],
                }
                for r in rows
            ]
        )
        reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        trainer = DPOTrainer(
            model=policy,
            ref_model=reference,
            args=DPOConfig(**_trl_common(loop, steps, work, settings, device), beta=settings["beta"]),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepEnds()],
        )
    else:
        from environments.gsm8k import GSM8KEnvironment
        from trl import GRPOConfig, GRPOTrainer

        env = GSM8KEnvironment()
        examples = env.load(data / "train.jsonl")
        dataset = Dataset.from_list(
            [{"prompt": env.prompt_messages(e), "question": e["question"], "answer": e["answer"]} for e in examples]
        )

        def gsm8k_reward(completions, question, answer, **kwargs):
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            scored = env.score([{"question": q, "answer": a} for q, a in zip(question, answer, strict=True)], texts)
            return [s["reward"] for s in scored]

        config = GRPOConfig(
            **_trl_common(loop, steps, work, settings, device),
            num_generations=settings["group_size"],
            max_completion_length=settings["max_new_tokens"],
            temperature=settings["temperature"],
            top_p=1.0,
            top_k=0,
            beta=settings["beta"],
            loss_type=settings["loss_type"],
            scale_rewards=settings["scale_rewards"],
        )
        trainer = GRPOTrainer(
            model=policy,
            reward_funcs=gsm8k_reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepEnds()],
        )

        def timed(function, bucket):
            def wrapper(*args, **kwargs):
                started = time.perf_counter()
                try:
                    return function(*args, **kwargs)
                finally:
                    timers[bucket].append(time.perf_counter() - started)

            return wrapper

        trainer._generate = timed(trainer._generate, "gen")
        trainer._calculate_rewards = timed(trainer._calculate_rewards, "reward")
    trainer.train()
    result = {"step_times": [b - a for a, b in zip(step_ends, step_ends[1:], strict=False)]}
    if loop == "grpo":
        result["gen_times"] = timers["gen"][1:]
        result["reward_times"] = timers["reward"][1:]
    return result


def worker(loop: str, impl: str, model: str, steps: int) -> dict:
    """One run in this process; returns the step times and the process's peak RSS."""
    import torch

    if os.environ.get("BENCH_THREADS"):
        torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    torch.manual_seed(SEED)
    path, data = model_dir(model), uniform_data_dir() / DATA_SET[loop]
    with tempfile.TemporaryDirectory(prefix=f"bench-{loop}-{impl}-") as work:
        runner = run_ours if impl == "ours" else run_trl
        result = runner(loop, path, data, steps, Path(work))
    result["peak_rss_mib"] = peak_rss_mib()
    result["torch_threads"] = torch.get_num_threads()
    return result


# --------------------------------------------------------------------------- alternating runs


RESULT_MARK = "BENCH_RESULT "


def run_in_subprocess(loop: str, impl: str, model: str, steps: int, timeout: float) -> dict:
    command = [sys.executable, "-m", "bench.train_steps", "--worker", loop, impl, model, str(steps)]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=str(REPO_ROOT),
    )
    completed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    for line in completed.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    raise RuntimeError(
        f"{loop}/{impl}/{model} failed (exit {completed.returncode}):\n"
        f"{completed.stdout[-3000:]}\n{completed.stderr[-5000:]}"
    )


def measure(
    loops: list[str],
    models: list[str],
    rounds: int,
    warmup: int,
    measured: int,
    timeout: float = 600.0,
    threads: int = 1,
    log=print,
) -> list[Row]:
    """Alternate ours and TRL ``rounds`` times per (loop, model); one row per (loop, model)
    and, for GRPO, rows for generation, reward and the rest of the step. ``threads``: torch
    threads in every run (0: torch's default, one per core). One by default: on a machine shared
    with other work, a run with a thread per core waits at every parallel region for whichever
    thread was descheduled, and its times swing tenfold."""
    if threads:
        os.environ["BENCH_THREADS"] = str(threads)
    rows = []
    steps = warmup + 1 + measured  # +1: the first step has no start mark
    for model in models:
        params = parameter_count(model_dir(model)) / 1e6
        for loop in loops:
            runs = {"ours": [], "trl": []}
            for round_index in range(rounds):
                for impl in ("ours", "trl") if round_index % 2 == 0 else ("trl", "ours"):
                    result = run_in_subprocess(loop, impl, model, steps, timeout)
                    result["step_times"] = result["step_times"][warmup:]
                    for key in ("gen_times", "reward_times", "completion_tokens"):
                        if key in result:
                            result[key] = result[key][warmup:]
                    runs[impl].append(result)
                    log(
                        f"  {loop} {model} {impl} round {round_index + 1}: median "
                        f"{median(result['step_times']):.4f} s/step, peak RSS {result['peak_rss_mib']:.0f} MiB"
                    )
            rows.extend(_rows(loop, model, params, runs, warmup, measured, rounds))
    return rows


def _pooled(runs: list[dict], key: str) -> list[float]:
    return [value for run in runs for value in run.get(key, [])]


def _rows(loop, model, params, runs, warmup, measured, rounds) -> list[Row]:
    case = f"{model} ({params:.1f} M params)"
    ours_steps, trl_steps = _pooled(runs["ours"], "step_times"), _pooled(runs["trl"], "step_times")
    peak = max(run["peak_rss_mib"] for run in runs["ours"])
    trl_peak = max(run["peak_rss_mib"] for run in runs["trl"])
    how = f"median of {rounds}x{measured} steps after {warmup} warm-up"
    name = {"sft": "SFTTrainer", "dpo": "DPOTrainer", "grpo": "GRPOTrainer"}[loop]
    rows = [
        Row(
            f"{loop} step",
            case,
            median(ours_steps),
            "s/step",
            median(trl_steps),
            f"TRL {name}",
            peak,
            trl_peak,
            notes=how,
        )
    ]
    if loop == "grpo":
        parts = {}
        for impl in ("ours", "trl"):
            steps_, gen, reward = (_pooled(runs[impl], k) for k in ("step_times", "gen_times", "reward_times"))
            rest = [s - g - r for s, g, r in zip(steps_, gen, reward, strict=False)]
            parts[impl] = (median(gen), median(reward), median(rest))
        tokens = median(_pooled(runs["ours"], "completion_tokens"))
        for index, part in enumerate(("generation", "reward", "optimisation (log-probs, loss, backward, step)")):
            rows.append(
                Row(
                    f"grpo step: {part}",
                    case,
                    parts["ours"][index],
                    "s/step",
                    parts["trl"][index],
                    "TRL",
                    notes=f"{tokens:.0f} completion tokens a step" if index == 0 else "",
                )
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loops", nargs="+", default=["sft", "dpo", "grpo"], choices=["sft", "dpo", "grpo"])
    parser.add_argument("--models", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    parser.add_argument("--rounds", type=int, default=3, help="alternations of ours and TRL (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2, help="steps not measured (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=6, help="steps measured per run (default: %(default)s)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per run; 0 = one per core (default: %(default)s)"
    )
    parser.add_argument("--worker", nargs=4, metavar=("LOOP", "IMPL", "MODEL", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        loop, impl, model, steps = args.worker
        result = worker(loop, impl, model, int(steps))
        print(RESULT_MARK + json.dumps(result), flush=True)
        return
    machine = machine_description(os.getloadavg(), threads=args.threads or None)  # 0: torch's default, one per core
    rows = measure(args.loops, args.models, args.rounds, args.warmup, args.steps, threads=args.threads)
    print(format_table(rows, "Training step time, ours vs TRL 1.16 (CPU)", machine))


if __name__ == "__main__":
    main()
