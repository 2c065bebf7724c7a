"""FSDP2 checkpoints through torch.distributed.checkpoint on CPU (gloo): each rank writes its
shards, a background save lets training go on, a checkpoint counts once its manifest is written,
and a resumed run of another size gets the same state (tests/scripts_common/sharded_checkpoints.py
is what each process runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "sharded_checkpoints.py"


def launch(processes: int, *args, expect_ok: bool = True) -> str:
    """The harness on ``processes`` ranks (torchrun over gloo; one process: plain python, no
    process group, as a single-learner script runs). Returns stdout and stderr together."""
    env = {**os.environ, "PYTHONPATH": f"{HERE.parents[1] / 'scripts'}{os.pathsep}{HERE}", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    if processes == 1:
        command = [sys.executable, str(HARNESS)]
    else:
        command = [
            str(Path(sys.executable).parent / "torchrun"),
            "--standalone",
            "--nproc_per_node",
            str(processes),
            str(HARNESS),
        ]
    result = subprocess.run(command + [str(arg) for arg in args], env=env, capture_output=True, text=True, timeout=180)
    output = result.stdout + result.stderr
    if expect_ok:
        assert result.returncode == 0, output[-4000:]
    # PyTorch keeps gloo's threads after the process group is destroyed (FSDP2's DTensors hold it);
    # a process must not reach the interpreter's teardown with them running, where it may abort.
    assert "exit with gloo threads running" not in output, output[-4000:]
    return output


def manifest(root: Path, step: int) -> dict:
    return json.loads((root / "checkpoints" / f"step_{step:08d}" / "manifest.json").read_text())


def test_saved_by_two_resumed_by_three_and_by_one(tmp_path):
    output = launch(2, "save", tmp_path)
    assert "rank 0: saved step 3 (in flight while training: True)" in output
    written = manifest(tmp_path, 3)
    assert written["format"] == "sharded" and written["world_size"] == 2
    # each rank wrote its own shards; rank 0 the index and the training state
    assert sorted(written["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp", "state.pt"]
    for name, size in written["files"].items():
        assert (tmp_path / "checkpoints" / "step_00000003" / name).stat().st_size == size

    output = launch(3, "resume", tmp_path, 3)
    for rank in range(3):
        assert f"rank {rank} of 3: resumed step 3, state equals the saved one" in output
    assert "random state not restored" in output  # another world size: the ranks' streams differ
    output = launch(1, "resume", tmp_path, 3)
    assert "rank 0 of 1: resumed step 3, state equals the saved one" in output


def test_sigterm_during_a_background_save_waits_for_it_and_saves_once_more(tmp_path):
    output = launch(2, "sigterm", tmp_path)
    assert "rank 0: SIGTERM while step 6 is written: True" in output
    # the save in flight finished, the SIGTERM save after it; keep=2 dropped step 3
    assert "rank 0: stopped by SIGTERM after step 7; whole: ['step_00000006', 'step_00000007']" in output
    # step 7 resumes; without it, the one being written when SIGTERM came, on its own
    output = launch(2, "resume", tmp_path, 7, 6)
    for rank in (0, 1):
        assert f"rank {rank} of 2: resumed step 7, state equals the saved one" in output
        assert f"rank {rank} of 2: resumed step 6, state equals the saved one" in output


def test_sigkill_mid_write_leaves_a_torn_folder_that_resume_skips(tmp_path):
    output = launch(2, "kill", tmp_path, expect_ok=False)
    assert "rank 0: killed while step 4 is written" in output
    torn = tmp_path / "checkpoints" / "step_00000004"
    assert torn.is_dir() and not (torn / "manifest.json").exists()
    output = launch(2, "resume", tmp_path, 3)
    assert f"skipping incomplete checkpoint {torn}" in output
    assert "rank 1 of 2: resumed step 3, state equals the saved one" in output
