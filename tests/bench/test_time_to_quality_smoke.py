"""bench.time_to_quality runs every side's code on tiny shapes: grpo.py (all weights, LoRA), the training
session through the SDK v3, TRL's GRPOTrainer with LoRA; each evaluates on its cadence and reports."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.tables import machine_facts

REPO = Path(__file__).resolve().parents[2]
SIDES = ("grpo_full", "grpo_lora", "session_lora", "trl_lora")


@pytest.mark.skipif(
    not (REPO / ".venv-sessions" / "bin" / "python").exists(),
    reason="the SDK v3 environment (.venv-sessions) is missing",
)
def test_time_to_quality_every_side_on_tiny_shapes(tmp_path, tiny_model_path):
    out = tmp_path / "ttq.md"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(REPO))
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.time_to_quality",
            "--model",
            "tiny",
            "--max-steps",
            "2",
            "--concurrent",
            "--first-seed",
            "1",
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]

    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [row["case"].rsplit(" (", 1)[0] for row in rows] == [
        "scripts/grpo.py, all weights",
        "scripts/grpo.py, LoRA",
        "training session (local service), LoRA",
        "TRL GRPOTrainer + peft LoRA",
    ]
    for row in rows:
        (run,) = row["extra"]["runs"]
        assert run["seed"] == 1
        # evaluated before step 1 and after each of the 2 steps (the tiny profile evaluates every step)
        assert [point["step"] for point in run["curve"]] == [0, 1, 2]
        assert all(0.0 <= point["accuracy"] <= 1.0 for point in run["curve"])
        assert run["curve"][2]["seconds"] > run["curve"][1]["seconds"] > 0  # training time, evaluations left out
        assert run["reached_at"] is None and row["ours"] is None  # the tiny profile's target is out of reach
        assert run["peak_rss_mib"] > 0 and run["eval_seconds"] > 0
        assert 0 < run["completion_length"] <= 8  # every side's samples are cut at the profile's 8 tokens
        # the lengths of the answers each side trained on: every answer, or TRL's logged step means
        lengths = run["answer_lengths"] or [log["completions/mean_length"] for log in run["length_logs"]]
        assert lengths and all(0 < n <= 8 for n in lengths)
    session = rows[2]["extra"]["runs"][0]["step_profile"]
    assert session["steps"] == 2
    assert {"save", "sample", "forward_backward", "optim_step", "total"} <= session["client"].keys()
    # the service's phases of the training steps: the pass's prefill and decode, the merge, the save, and
    # the update when a step had datums (the tiny model's groups of 2 often score alike: no datum then)
    phases = {"prefill", "decode", "merge", "save_s3"}
    if session["client"]["datums"]:
        phases |= {"fb_forward", "fb_backward", "optim_step"}
    assert phases <= session["service"].keys()
    assert 0 < session["service"]["prefill"]["seconds"] < session["client"]["total"]
    text = out.read_text()
    assert f"Machine: {machine_facts()['model']}" in text and "1 torch thread;" in text and "at the end" in text
    assert "| time to target |" in text and "## The session's step, seed 1" in text


def test_a_worker_result_is_found_after_a_line_left_without_its_newline():
    """A run stopped at its target may leave its last metric line unfinished: the result still counts."""
    from bench.time_to_quality import RESULT_MARK, parse_result

    stdout = f'step=8 reward=0.29 train_time=19.09{RESULT_MARK}{{"reached_at": {{"step": 8}}}}\n\nLoading weights\n'
    assert parse_result(stdout) == {"reached_at": {"step": 8}}
    assert parse_result(f'{RESULT_MARK}{{"a": 1}}\n') == {"a": 1}
    assert parse_result("step=1 loss=0.5\nTraceback (most recent call last):\n") is None
