"""Fixtures for the SFT and DPO script tests: a runner that
starts a script the way the SageMaker toolkit does (``SM_*`` variables, ``--key value``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from container_env import SCRIPTS, script_command
from container_env import container_env as build_container_env
from container_env import run_script as run_in_container


def _read_metrics(root: Path) -> list[dict]:
    path = root / "output" / "data" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def container_env():
    """container_env(root, {"train": folder}) -> env dict with /opt/ml relocated under root."""
    return build_container_env


@pytest.fixture
def read_metrics():
    """read_metrics(root) -> the records of root/output/data/metrics.jsonl."""
    return _read_metrics


@pytest.fixture
def run_script():
    """run_script(script, args, env, nproc=1) -> CompletedProcess, cwd = scripts/ like the toolkit."""

    def run(script: str, args: list[str], env: dict[str, str], nproc: int = 1, timeout: int = 180):
        return run_in_container(script_command(script, args, nproc), env, timeout=timeout)

    return run


@pytest.fixture
def tiny_args(tiny_model_path) -> list[str]:
    """Small, fast settings shared by the script runs."""
    return [
        "--model_name_or_path",
        str(tiny_model_path),
        "--batch_size",
        "4",
        "--per_device_batch_size",
        "2",
        "--warmup_steps",
        "2",
        "--learning_rate",
        "1e-3",
        "--seed",
        "7",
    ]


@pytest.fixture
def enter_container(monkeypatch):
    """enter_container(root, channels): this process's SM_*/SAGEMAKER_* variables become the
    container's (undone after the test)."""

    def enter(root: Path, channels: dict[str, Path]) -> None:
        for key in list(os.environ):
            if key.startswith(("SM_", "SAGEMAKER_")):
                monkeypatch.delenv(key)
        for key, value in build_container_env(root, channels).items():
            if key.startswith(("SM_", "SAGEMAKER_")):
                monkeypatch.setenv(key, value)

    return enter


@pytest.fixture
def run_in_process(enter_container):
    """run_in_process(name, argv, root, channels): ``sft.main``/``dpo.main`` in this process (no
    interpreter start-up), under the container's variables, with one thread like the subprocesses."""
    import signal

    import torch

    def run(name: str, argv: list[str], root: Path, channels: dict[str, Path]) -> None:
        import importlib

        module = importlib.import_module(name)
        enter_container(root, channels)
        threads, handler = torch.get_num_threads(), signal.getsignal(signal.SIGTERM)
        torch.set_num_threads(1)
        try:
            module.main(argv)
        finally:
            torch.set_num_threads(threads)
            signal.signal(signal.SIGTERM, handler)

    return run


@pytest.fixture
def same_weights():
    """same_weights(dir_a, dir_b): the two saved models are bitwise equal."""
    from safetensors.torch import load_file

    def check(a: Path, b: Path) -> None:
        first, second = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
        assert first.keys() == second.keys()
        different = [name for name in first if not torch_equal(first[name], second[name])]
        assert not different, f"weights differ: {different[:5]}"

    return check


def torch_equal(a, b) -> bool:
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.fixture
def interrupt_script():
    """interrupt_script(script, args, env, at_step, signum, nproc=1) -> (returncode, output):
    start the script (under torchrun when nproc > 1), send ``signum`` as soon as it prints the
    metric line of ``at_step`` (torchrun passes SIGTERM on to its workers), wait for it."""

    def run(script: str, args: list[str], env: dict[str, str], at_step: int, signum: int, nproc: int = 1):
        process = subprocess.Popen(
            script_command(script, args, nproc),
            cwd=SCRIPTS,
            env=env,
            text=True,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        output, deadline = [], time.monotonic() + 180
        try:
            for line in process.stdout:
                output.append(line)
                if line.startswith(f"step={at_step} "):
                    process.send_signal(signum)
                    break
                assert time.monotonic() < deadline, "the script did not reach the step in time"
            output += process.stdout.readlines()
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        return process.returncode, "".join(output)

    return run
