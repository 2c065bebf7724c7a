"""An interrupted and resumed run ends with the same weights, bit for bit, as an uninterrupted one."""

from __future__ import annotations

import json
import logging
import shutil
import signal


def test_sft_killed_then_resumed_equals_uninterrupted(
    tmp_path,
    offline_data,
    tiny_args,
    run_in_process,
    interrupt_script,
    container_env,
    read_metrics,
    same_weights,
    caplog,
):
    channels = {"train": offline_data["chat"]}
    args = [*tiny_args, "--max_steps", "10", "--checkpoint_every", "3", "--keep_checkpoints", "2"]
    run_in_process("sft", args, tmp_path / "uninterrupted", channels)

    root = tmp_path / "interrupted"
    returncode, output = interrupt_script("sft.py", args, container_env(root, channels), 7, signal.SIGKILL)
    assert returncode == -signal.SIGKILL, output[-3000:]
    assert not (root / "model" / "model.safetensors").exists()
    checkpoints = root / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_00000003", "step_00000006"]

    # A newer checkpoint torn by the kill (or an S3 sync cut short) must be skipped, not trusted.
    torn = checkpoints / "step_00000009"
    shutil.copytree(checkpoints / "step_00000006", torn)
    (torn / "manifest.json").write_text(json.dumps({**json.loads((torn / "manifest.json").read_text()), "step": 9}))
    with open(torn / "model.pt", "r+b") as handle:
        handle.truncate(100)

    with caplog.at_level(logging.INFO):
        run_in_process("sft", args, root, channels)
    assert any(
        "skipping incomplete checkpoint" in r.getMessage() and "step_00000009" in r.getMessage() for r in caplog.records
    )
    assert any("resumed from" in r.getMessage() and "step_00000006" in r.getMessage() for r in caplog.records)
    same_weights(tmp_path / "uninterrupted" / "model", root / "model")
    assert [r["step"] for r in read_metrics(root)] == list(range(1, 11))  # each step once despite the replay
    assert [r["loss"] for r in read_metrics(root)] == [r["loss"] for r in read_metrics(tmp_path / "uninterrupted")]


def test_dpo_sigterm_saves_exits_cleanly_and_resumes(
    tmp_path, offline_data, tiny_args, run_in_process, interrupt_script, container_env, same_weights
):
    channels = {"train": offline_data["preferences"]}
    # Checkpoints only on SIGTERM; the reference log-probs computed once travel in the checkpoint.
    args = [*tiny_args, "--max_steps", "8", "--checkpoint_every", "0", "--precompute_ref_log_probs", "True"]
    run_in_process("dpo", args, tmp_path / "uninterrupted", channels)

    root = tmp_path / "interrupted"
    returncode, output = interrupt_script("dpo.py", args, container_env(root, channels), 3, signal.SIGTERM)
    assert returncode == 0, output[-3000:]
    assert "stopped by SIGTERM after step" in output
    assert not (root / "model" / "model.safetensors").exists()
    saved = sorted(p.name for p in (root / "checkpoints").iterdir())
    assert len(saved) == 1 and 3 <= int(saved[0][5:]) < 8, saved

    run_in_process("dpo", args, root, channels)
    same_weights(tmp_path / "uninterrupted" / "model", root / "model")
