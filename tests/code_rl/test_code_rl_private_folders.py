"""One code-RL job from a checkout in a 0700 folder, and one with Python and its environment in one.

The judge's fork servers drop to other uids; the job must still self-test its sandbox, judge
numpy programs and train (see ``tests/sandbox/private_folders.py`` for the layouts).
"""

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest
from private_folders import SCRIPTS, copy_checkout, make_private, private_environment
from sandbox import confine

HERE = Path(__file__).resolve().parent


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(f"_code_rl_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


script_tests = _sibling("test_code_rl_script")  # the container environment and hyperparameters


@pytest.mark.skipif(
    os.geteuid() != 0 or not confine.landlock_abi(),
    reason="the per-worker uid needs root; views into private folders need Landlock",
)
@pytest.mark.parametrize("layout", ["checkout", "environment"])
def test_code_rl_trains_from_a_private_folder(tmp_path, offline_data, tiny_model_path, layout):
    private = make_private(tmp_path / "private")
    if layout == "checkout":
        checkout = copy_checkout(private)
        python, code = checkout / ".venv" / "bin" / "python", checkout / "scripts"
        hidden = f"{checkout}/.venv/lib/"
    else:
        python, code = private_environment(private), SCRIPTS
        hidden = f"{private}/project/.venv/lib/"
    job = tmp_path / "job"
    env = script_tests.container_env(
        job, {"train": offline_data["code"], "model": tiny_model_path}, {**script_tests.HYPERPARAMETERS, "max_steps": 1}
    )
    done = subprocess.run(
        [str(python), "code_rl.py"],
        cwd=code,
        env=env,
        text=True,
        timeout=240,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    log = done.stdout
    assert "sandbox self-test passed" in log and "legitimate numpy: accepted" in log, log[-4000:]
    assert hidden in log and "read through views" in log  # the workers met the private layout
    assert "step=1 " in log and (job / "model" / "config.json").is_file()
    assert not (job / "output" / "failure").exists()
