"""One source of truth for versions, and a container requirements file that leaves torch alone."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

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
