"""Two processes (torchrun, gloo) follow the same loss curve as one process with the same global batch."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("script, dataset, strategy", [
    ("sft", "chat", "ddp"),
    ("sft", "chat", "fsdp"),
    # Same batching code as SFT; opt-in to keep the default suite short.
    pytest.param("dpo", "preferences", "ddp", marks=pytest.mark.slow),
])
def test_two_processes_match_one(script, dataset, strategy, tmp_path, offline_data, tiny_args, run_in_process,
                                 run_script, container_env, read_metrics):
    channels = {"train": offline_data[dataset], "test": offline_data[dataset]}
    # Global batch 4, micro-batches of 2: one process accumulates 2 micro-batches, two processes 1 each.
    args = [*tiny_args, "--max_steps", "4", "--checkpoint_every", "2", "--strategy", strategy]
    run_in_process(script, [*args, "--strategy", "ddp"], tmp_path / "one", channels)

    result = run_script(f"{script}.py", args, container_env(tmp_path / "two", channels), nproc=2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [r["step"] for r in two] == [1, 2, 3, 4]
    for first, second in zip(one, two, strict=True):
        assert second["loss"] == pytest.approx(first["loss"], rel=1e-4), (first, second)
        assert second["grad_norm"] == pytest.approx(first["grad_norm"], rel=1e-3), (first, second)
    assert two[-1]["eval_loss"] == pytest.approx(one[-1]["eval_loss"], rel=1e-4)  # the test set shared out
    assert result.stdout.count("step=4 ") == 1  # rank 0 alone prints metric lines

    from safetensors.torch import load_file

    weights_one = load_file(tmp_path / "one" / "model" / "model.safetensors")
    weights_two = load_file(tmp_path / "two" / "model" / "model.safetensors")
    assert weights_one.keys() == weights_two.keys()
    for name, tensor in weights_one.items():
        torch.testing.assert_close(weights_two[name], tensor, rtol=1e-3, atol=1e-4, msg=name)
