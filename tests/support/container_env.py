"""The environment the SageMaker toolkit gives a training script, with /opt/ml relocated under a
folder, and the runner that starts a script in it (plain python, or torchrun): one of each for
every test that starts a script through the container contract."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path


def container_env(root: Path, channels: dict[str, Path], hyperparameters: dict | None = None) -> dict[str, str]:
    """This process's environment less its ``SM_*``/``SAGEMAKER_*`` variables, plus the container's:
    model, output and checkpoint folders under ``root``, one host, no GPU, ``SM_CHANNEL_<NAME>`` per
    channel and, when given, the hyperparameters as ``SM_HPS`` (the toolkit also passes them as
    ``--key value``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_"))}
    env.update(
        {
            "SAGEMAKER_BASE_DIR": str(root),
            "SM_MODEL_DIR": str(root / "model"),
            "SM_OUTPUT_DATA_DIR": str(root / "output" / "data"),
            "SM_OUTPUT_DIR": str(root / "output"),
            "SM_HOSTS": json.dumps(["algo-1"]),
            "SM_CURRENT_HOST": "algo-1",
            "SM_NUM_GPUS": "0",
            "SM_CURRENT_INSTANCE_TYPE": "local",
            "OMP_NUM_THREADS": "1",  # the same thread count in every run: identical float sums
            "PYTHONUNBUFFERED": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # torchrun
        }
    )
    if hyperparameters is not None:
        env["SM_HPS"] = json.dumps(hyperparameters)
    for name, folder in channels.items():
        env[f"SM_CHANNEL_{name.upper()}"] = str(folder)
    return env


SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def script_command(script: str, args: list[str] | tuple = (), nproc: int = 1) -> list[str]:
    """``python SCRIPT ARGS``, or under ``torchrun --standalone`` for more than one process."""
    if nproc == 1:
        return [sys.executable, script, *args]
    torchrun = str(Path(sys.executable).parent / "torchrun")
    return [torchrun, "--standalone", "--nproc_per_node", str(nproc), script, *args]


def run_script(command: list[str], env: dict[str, str], timeout: float = 180, merge_output: bool = False):
    """Run ``command`` in scripts/, the code folder the toolkit starts scripts in, and return its
    ``subprocess.CompletedProcess`` (``merge_output``: stderr into stdout, in the order printed).
    A session of its own, so that a timeout ends torchrun's workers as well as torchrun."""
    process = subprocess.Popen(
        command,
        cwd=SCRIPTS,
        env=env,
        text=True,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_output else subprocess.PIPE,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr or "")
