"""What the main job needs to run the training-session notebooks (07 onwards): their kernel, their CI
parameters, and the summary's training-sessions section.

They run in the SDK v3 environment's kernel (``sagemaker-sdk-v3``, registered by the
Makefile's ``.venv-sessions`` target); each records its session, steps, final metrics and billable
tokens with ``helpers.training_sessions.records.record`` in ``<work_dir>/training_sessions.json``.
"""

from __future__ import annotations

from pathlib import Path

from helpers.results import change_text, verdict
from helpers.training_sessions.records import held_out_lines, notebook_lines

SDK_V3_KERNEL = "sagemaker-sdk-v3"  # the kernel of .venv-sessions, which the Makefile registers
# The training-session notebooks: each drives a session (14 also an endpoint) and launches no training
# job. They run in this order: 14 serves the model 08 trained, and 16 distils it into a fresh student.
NOTEBOOKS = ("07", "08", "09", "10", "12", "14", "15", "16")

# Local mode, the tiny model, a few steps (the notebooks default to the cloud).
CI_PARAMETERS = {
    "07": {
        "base_model": "local/tiny-qwen2",
        "lora_rank": 16,
        "lora_alpha": 32,
        "max_steps": 8,
        "batch_size": 16,
        "learning_rate": 3e-3,
        "n_conversations": 64,
    },
    "08": {
        "base_model": "local/tiny-qwen2-gsm8k-format",
        "lora_rank": 16,
        "lora_alpha": 32,
        "task": "count",
        "max_steps": 16,
        "prompts_per_step": 16,
        "group_size": 8,
        "learning_rate": 3e-3,
        "format_reward_weight": 0.5,
        "stop": ["\n"],
        "held_out_problems": 64,
        "held_out_samples": 16,
        "resume_from_step": 8,
        "resume_steps": 2,
    },
    "09": {
        "base_model": "local/tiny-qwen2-code-format",
        "lora_rank": 16,
        "lora_alpha": 32,
        "task": "offline",
        "max_steps": 12,
        "prompts_per_step": 8,
        "group_size": 4,
        "learning_rate": 1e-3,
        "format_reward_weight": 0.5,
        "judge_workers": 2,
        "held_out_problems": 32,
        "held_out_samples": 2,
    },
    "10": {"base_model": "local/tiny-qwen2", "lora_rank": 8, "lora_alpha": 16, "max_steps": 2, "learning_rate": 3e-3},
    # DPO with LoRA on the tiny model moves the implicit rewards but not the held-out likelihood accuracy (0.50 ->
    # 0.50): tried at lr 3e-3 and 1e-2, 16 and 40 steps, alpha 32 and 128, beta 0.02; the job's full
    # fine-tuning (notebook 2) turns it round.
    "12": {
        "base_model": "local/tiny-qwen2",
        "lora_rank": 16,
        "lora_alpha": 32,
        "max_steps": 16,
        "batch_size": 16,
        "learning_rate": 3e-3,
        "max_prompt_length": 64,
        "max_length": 128,
        "held_out_pairs": 32,
    },
    "14": {"task": "count", "held_out_problems": 16, "max_tokens": 20, "stop": ["\n"], "judge_max_tokens": 24},
    "15": {
        "base_model": "local/tiny-qwen2-tool-format",
        "lora_rank": 16,
        "lora_alpha": 32,
        "max_steps": 16,
        "prompts_per_step": 16,
        "group_size": 8,
        "max_turns": 3,
        "context": 1024,
        "learning_rate": 1e-3,
        "format_reward_weight": 0.5,
        "held_out_problems": 32,
        "held_out_samples": 16,
    },
    "16": {
        "base_model": "local/tiny-qwen2-gsm8k-format",
        "lora_rank": 16,
        "lora_alpha": 32,
        "task": "count",
        "max_steps": 16,
        "prompts_per_step": 16,
        "group_size": 8,
        "learning_rate": 3e-3,
        "format_reward_weight": 0.5,
        "stop": ["\n"],
        "held_out_problems": 64,
        "held_out_samples": 8,  # the held-out curves of both runs are most of 16's time on 2 loaded cores
        "eval_every": 8,
    },
}


def kernel_name(notebook: Path) -> str:
    """The kernel a notebook names in its metadata: python3 for 00-06, the SDK v3 kernel after."""
    import nbformat

    return nbformat.read(str(notebook), as_version=4).metadata.get("kernelspec", {}).get("name", "python3")


def render(sessions: list[dict]) -> list[str]:
    """The summary's markdown lines for the training sessions (none when no notebook ran one)."""
    if not sessions:
        return []
    lines = ["", "## Training sessions", ""]
    for s in sessions:
        metrics = ", ".join(
            f"{k}={v:.4g}" for k, v in (s.get("final_metrics") or {}).items() if isinstance(v, (int, float))
        )
        lines.append(
            f"- {s['notebook']}: {s['session']} -- {s['status']}; {s['steps']} steps; {metrics or 'no metrics'}"
        )
        lines.append(f"  - billable tokens: {s.get('billable_tokens')}")
        if s.get("held_out_loss"):
            before, after = s["held_out_loss"]["before"], s["held_out_loss"]["after"]
            lines.append(
                f"  - held-out loss per answer token {before['loss']:.3f} ± {before['standard_error']:.3f} -> "
                f"{after['loss']:.3f} ± {after['standard_error']:.3f} ({after['conversations']} conversations)"
            )
        if s.get("reward"):
            lines.append(
                f"  - reward, first third of the steps {s['reward']['first_third']:.3f}, "
                f"last third {s['reward']['last_third']:.3f}"
            )
        if s.get("no_code_rate"):
            lines.append(
                f"  - completions without a program, first quarter {s['no_code_rate']['first_quarter']:.3f}, "
                f"last quarter {s['no_code_rate']['last_quarter']:.3f}"
            )
        if s.get("preference"):
            p, before, after = s["preference"], s["preference"]["held_out_before"], s["preference"]["held_out_after"]
            lines.append(
                f"  - preference accuracy, first quarter {p['accuracy']['first_quarter']:.3f} -> last quarter "
                f"{p['accuracy']['last_quarter']:.3f}; reward margin {p['margin']['first_quarter']:.4f} -> "
                f"{p['margin']['last_quarter']:.4f}"
            )
            lines.append(
                f"  - held out ({after['pairs']} pairs): likelihood accuracy {before['likelihood_accuracy']:.3f} "
                f"± {before['likelihood_accuracy_se']:.3f} -> {after['likelihood_accuracy']:.3f} "
                f"± {after['likelihood_accuracy_se']:.3f}; reward accuracy after {after['reward_accuracy']:.3f} "
                f"± {after['reward_accuracy_se']:.3f}, margin {after['margin']:.4f} ± {after['margin_se']:.4f}"
            )
            change, error = p.get("held_out_change"), p.get("held_out_change_se")
            lines.append(
                f"  - held-out likelihood accuracy, paired change {change_text(None, None, change, error)}: "
                f"{verdict(change, error, answers=False)}"
            )
        if s.get("test_pass_fraction"):
            lines.append(
                f"  - test pass fraction, first quarter {s['test_pass_fraction']['first_quarter']:.3f}, "
                f"last quarter {s['test_pass_fraction']['last_quarter']:.3f}"
            )
        if s.get("held_out"):
            first, *rest = held_out_lines(s["held_out"])
            lines += [f"  - {first}", *(f"    - {line}" for line in rest)]
        lines += [f"  - {line}" for line in notebook_lines(s)]  # 14's served models, 15's tool, 16's teacher
        if s.get("resume"):
            resume = s["resume"]
            differences = "; ".join(f"{label} {value:.3g}" for label, value in resume["largest_difference"].items())
            lines.append(
                f"  - resumed from the checkpoint after step {resume['from_step']} for {resume['steps']} steps, "
                f"largest difference from the uninterrupted steps: {differences}"
                if differences
                else f"  - no resume in this run (resume_from_step = {resume['from_step']}: the loop saved no checkpoint)"
            )
    return lines
