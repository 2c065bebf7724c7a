"""Learning checks (opt-in, ``-m slow``): the loops do learn on the tiny model and the project's data."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_sft_loss_falls_on_train_and_test(tmp_path, offline_data, tiny_model_path, run_in_process, read_metrics):
    args = [
        "--model_name_or_path",
        str(tiny_model_path),
        "--max_steps",
        "40",
        "--batch_size",
        "8",
        "--per_device_batch_size",
        "8",
        "--learning_rate",
        "3e-3",
        "--checkpoint_every",
        "0",
    ]
    run_in_process("sft", args, tmp_path, {"train": offline_data["chat"], "test": offline_data["chat"]})
    records = read_metrics(tmp_path)
    assert records[-1]["loss"] < 0.5 * records[0]["loss"], (records[0], records[-1])
    assert records[-1]["eval_loss"] < 0.6 * records[0]["loss"], records[-1]  # held-out conversations too


@pytest.mark.slow
def test_dpo_prefers_chosen_answers(tmp_path, offline_data, tiny_model_path, run_in_process, read_metrics):
    args = [
        "--model_name_or_path",
        str(tiny_model_path),
        "--max_steps",
        "20",
        "--batch_size",
        "8",
        "--per_device_batch_size",
        "8",
        "--learning_rate",
        "1e-3",
        "--checkpoint_every",
        "0",
        "--precompute_ref_log_probs",
        "true",
    ]
    run_in_process("dpo", args, tmp_path, {"train": offline_data["preferences"]})
    records = read_metrics(tmp_path)
    assert records[0]["loss"] == pytest.approx(0.6931, abs=1e-3)  # policy == reference at the start
    last = records[-5:]
    assert sum(r["rewards_accuracies"] for r in last) / 5 >= 0.8, last
    assert min(r["rewards_margins"] for r in last) > 0.2, last
    assert last[-1]["loss"] < 0.55
