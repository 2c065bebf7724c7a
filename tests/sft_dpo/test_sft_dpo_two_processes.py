"""Two processes (torchrun, gloo) follow the same loss curve as one process with the same global batch."""

from __future__ import annotations

import signal

import pytest
import torch


def _compare(one: list[dict], two: list[dict], steps: int) -> None:
    # dpo.py scores the test pairs before its first step too, logged as step 0
    assert [r["step"] for r in two if r["step"] > 0] == list(range(1, steps + 1))
    assert [r["step"] for r in one] == [r["step"] for r in two]
    for first, second in zip(one, two, strict=True):
        if second["step"] > 0:
            assert second["loss"] == pytest.approx(first["loss"], rel=1e-4), (first, second)
            assert second["grad_norm"] == pytest.approx(first["grad_norm"], rel=1e-3), (first, second)
    assert two[-1]["eval_loss"] == pytest.approx(one[-1]["eval_loss"], rel=1e-4)  # the test set shared out
    for name in ("eval_likelihood_accuracy", "eval_reference_likelihood_accuracy", "eval_likelihood_accuracy_change"):
        if name in one[-1]:  # each learner scores its share of the pairs; every pair is counted once
            assert (two[0][name], two[-1][name]) == (one[0][name], one[-1][name]), name
    if "eval_format_conversations" in one[-1]:  # sft.py: the learners share the prompts out, each answered once
        for record in (two[0], two[-1]):
            assert record["eval_format_conversations"] == one[-1]["eval_format_conversations"], record
            assert 0 <= record["eval_format_share"] <= 1, record


def _compare_weights(one_dir, two_dir) -> None:
    from safetensors.torch import load_file

    weights_one, weights_two = load_file(one_dir / "model.safetensors"), load_file(two_dir / "model.safetensors")
    assert weights_one.keys() == weights_two.keys()
    for name, tensor in weights_one.items():
        torch.testing.assert_close(weights_two[name], tensor, rtol=1e-3, atol=1e-4, msg=name)


@pytest.mark.parametrize(
    "script, dataset",
    [
        ("sft", "chat"),
        # Same batching code as SFT; opt-in to keep the default suite short.
        pytest.param("dpo", "preferences", marks=pytest.mark.slow),
    ],
)
def test_ddp_two_processes_match_one(
    script, dataset, tmp_path, offline_data, tiny_args, run_in_process, run_script, container_env, read_metrics
):
    channels = {"train": offline_data[dataset], "test": offline_data[dataset]}
    # Global batch 8 in micro-batches of 2: one process accumulates 4, each of two processes 2
    # (DDP's all-reduce skipped on the first micro-batch).
    args = [*tiny_args, "--batch_size", "8", "--max_steps", "3", "--checkpoint_every", "0"]
    run_in_process(script, args, tmp_path / "one", channels)

    result = run_script(f"{script}.py", args, container_env(tmp_path / "two", channels), nproc=2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("step=3 ") == 1  # rank 0 alone prints metric lines
    _compare(read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two"), steps=3)
    _compare_weights(tmp_path / "one" / "model", tmp_path / "two" / "model")


def test_fsdp_two_processes_survive_sigterm_and_match_one(
    tmp_path, offline_data, tiny_args, run_in_process, interrupt_script, run_script, container_env, read_metrics
):
    """The spot-interruption path on several GPUs: torchrun passes SIGTERM to its workers, they agree
    on a step, each writes its shards of one checkpoint and exits; the restarted job resumes
    (each rank reads its shards) and ends where one process ends."""
    channels = {"train": offline_data["chat"], "test": offline_data["chat"]}
    args = [*tiny_args, "--max_steps", "6", "--checkpoint_every", "0"]
    run_in_process("sft", args, tmp_path / "one", channels)

    env = container_env(tmp_path / "two", channels)
    fsdp = [*args, "--strategy", "fsdp"]
    _, output = interrupt_script("sft.py", fsdp, env, at_step=2, signum=signal.SIGTERM, nproc=2)
    assert output.count("stopped by SIGTERM after step") == 2, output[-3000:]  # both workers, same step
    saved = sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir())
    assert len(saved) == 1 and 2 <= int(saved[0][5:]) < 6, saved
    assert not (tmp_path / "two" / "model" / "model.safetensors").exists()

    result = run_script("sft.py", fsdp, env, nproc=2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"resumed from {tmp_path / 'two' / 'checkpoints' / saved[0]}" in result.stdout
    _compare(read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two"), steps=6)
    _compare_weights(tmp_path / "one" / "model", tmp_path / "two" / "model")


@pytest.mark.slow
@pytest.mark.parametrize("precompute", ["false", "true"])
def test_dpo_with_a_sharded_reference_matches_one_process(
    precompute, tmp_path, offline_data, tiny_args, run_in_process, run_script, container_env, read_metrics
):
    """Under --strategy fsdp the reference model is sharded like the policy; its forwards are then
    collectives, also where the learners' shares of the pairs differ (5 test pairs on 2 learners: 2 batches of 2 and 1)."""
    preferences = tmp_path / "preferences"
    preferences.mkdir()
    (preferences / "train.jsonl").write_text((offline_data["preferences"] / "train.jsonl").read_text())
    test_rows = (offline_data["preferences"] / "test.jsonl").read_text().splitlines()[:5]
    (preferences / "test.jsonl").write_text("\n".join(test_rows) + "\n")
    channels = {"train": preferences, "test": preferences}
    args = [
        *tiny_args,
        "--batch_size",
        "8",
        "--max_steps",
        "3",
        "--checkpoint_every",
        "0",
        "--precompute_ref_log_probs",
        precompute,
    ]
    run_in_process("dpo", args, tmp_path / "one", channels)

    result = run_script("dpo.py", [*args, "--strategy", "fsdp"], container_env(tmp_path / "two", channels), nproc=2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _compare(read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two"), steps=3)
    _compare_weights(tmp_path / "one" / "model", tmp_path / "two" / "model")
