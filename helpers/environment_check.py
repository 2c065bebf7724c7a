"""Which SageMaker Python SDK a notebook needs, checked before anything imports it.

Notebooks 00-06 teach SDK v2 (``sagemaker==2.257.*``: estimators, ``Session.train``, local mode in the
kernel); 07 onwards SDK v3 (``sagemaker-train``: training sessions, ``ModelTrainer``). SageMaker Studio's
current images ship v3, so a notebook of v2 opened in the default kernel would fail at its first SDK
import with an ImportError that says nothing about the cause. ``require_sdk`` says it instead: what
this kernel has, the kernel to pick or the ``%pip install`` line to run, and why one environment cannot
hold both SDKs.

This module uses the standard library only: it runs first, in whichever kernel the notebook was opened.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sdk:
    name: str
    distribution: str  # the distribution whose presence and version say this SDK is installed
    version_prefix: str  # "" when any version will do
    requirements: str  # the environment's file, at the repository root
    kernel: str  # the kernel name the notebooks of this SDK declare in their metadata
    teaches: str


SDKS = {
    "v2": Sdk(
        "SageMaker Python SDK v2",
        "sagemaker",
        "2.257.",
        "requirements.txt",
        "python3",
        "estimators, Session.train and local mode in the kernel, which v3 removed",
    ),
    "v3": Sdk(
        "SageMaker Python SDK v3",
        "sagemaker-train",
        "",
        "requirements-sessions.txt",
        "sagemaker-sdk-v3",
        "training sessions and ModelTrainer, which exist in v3 only",
    ),
}
# The conda environment of environment.yml (SDK v2), as a Studio user registers it as a kernel.
CONDA_ENV = "sagemaker-llm-loops"
WHY_NOT_BOTH = (
    "Why not both in one kernel: SDK v2 (distribution `sagemaker` 2.x) and SDK v3 (`sagemaker-core`, "
    "`sagemaker-train`) both install the Python package `sagemaker/`; installing one over the other "
    "overwrites its files, and `import sagemaker` then finds parts of both. Each SDK needs its own "
    "environment, hence a kernel each."
)


class WrongEnvironment(RuntimeError):
    """This kernel lacks the SDK or the packages the notebook needs (the message says what to do)."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows what this returns instead of a traceback: the message is the whole story
        return [f"{type(self).__name__}: {self}"]


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def installed_sdks() -> dict[str, str]:
    """{"v2": "2.257.7", "v3": "1.27.0"}: the SDKs this environment has (usually one)."""
    found = {}
    sagemaker = installed_version("sagemaker")
    if sagemaker and sagemaker.startswith("2."):
        found["v2"] = sagemaker
    train = installed_version("sagemaker-train")
    if train or (sagemaker and not sagemaker.startswith(("0.", "1.", "2."))):
        found["v3"] = train or sagemaker  # the `sagemaker` 3.x meta-distribution installs sagemaker-train
    return found


def required_distributions(requirements: Path) -> list[str]:
    """The distribution names a requirements file lists (no extras, versions or markers)."""
    names = []
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.append(re.split(r"[\s\[<>=!~;@]", line, maxsplit=1)[0])
    return names


def problems(sdk: str) -> list[str]:
    """What this environment lacks for a notebook of ``sdk`` ("v2" or "v3"), in words; empty when ready."""
    need = SDKS[sdk]
    found = installed_sdks()
    version = found.get(sdk)
    if version is None:
        return [f"{need.name} ({need.distribution}) is not installed"]
    if not version.startswith(need.version_prefix):
        return [f"{need.distribution} {version} is installed, {need.version_prefix}* is needed"]
    missing = [name for name in required_distributions(REPO / need.requirements) if installed_version(name) is None]
    return [f"{need.requirements} lists packages this environment lacks: {', '.join(missing)}"] if missing else []


def advice(sdk: str, notebook: str) -> str:
    """What to do in SageMaker Studio, for a notebook of ``sdk`` opened in this kernel."""
    need, other = SDKS[sdk], SDKS["v3" if sdk == "v2" else "v2"]
    found = installed_sdks()
    requirements = REPO / need.requirements
    head = (
        f"{notebook} needs the {need.name} ({need.distribution}{'==' + need.version_prefix + '*' if need.version_prefix else ''}): "
        f"it teaches {need.teaches}.\nThis kernel ({sys.executable}) has: "
        + (
            ", ".join(f"{SDKS[k].name} ({SDKS[k].distribution} {v})" for k, v in sorted(found.items()))
            or "no SageMaker SDK"
        )
        + "; "
        + "; ".join(problems(sdk))
        + ".\n\nWhat to do in SageMaker Studio:\n"
    )
    if [k for k in found if k != sdk]:  # the other SDK is here: installing ours would break both
        if sdk == "v2":
            steps = (
                "  1. Make an environment with SDK v2 and register it as a kernel, once, in a terminal "
                "(File > New > Terminal):\n"
                f"       cd {REPO}\n"
                "       conda env create -f environment.yml\n"
                f"       conda run -n {CONDA_ENV} python -m ipykernel install --user --name {CONDA_ENV} "
                f'--display-name "SageMaker SDK v2 ({CONDA_ENV})"\n'
                f'  2. Kernel > Change Kernel... > "SageMaker SDK v2 ({CONDA_ENV})", then run the notebook from the top.\n'
            )
        else:
            steps = (
                "  1. Make an environment with SDK v3 and register it as a kernel, once, in a terminal "
                "(File > New > Terminal):\n"
                f"       cd {REPO}\n"
                "       python3 -m venv ~/.venv-sessions\n"
                f"       ~/.venv-sessions/bin/pip install -r {requirements}\n"
                "       ~/.venv-sessions/bin/python -m ipykernel install --user --name sagemaker-sdk-v3 "
                '--display-name "SageMaker SDK v3"\n'
                '  2. Kernel > Change Kernel... > "SageMaker SDK v3", then run the notebook from the top. (The '
                'default kernel of SageMaker Distribution 4.x images, "Python 3 (ipykernel)", has SDK v3 too: '
                f"there, run  %pip install -r {requirements}  once, then restart that kernel.)\n"
            )
        steps += f"Do not %pip install {need.distribution} into this kernel: it has {other.name}.\n"
    else:  # no other SDK in the way: install into this kernel
        steps = (
            f"  1. Run this in a cell:  %pip install -r {requirements}\n"
            "  2. Kernel > Restart Kernel..., then run the notebook from the top.\n"
        )
    return head + steps + "\n" + WHY_NOT_BOTH


def require_sdk(sdk: str, notebook: str = "This notebook") -> None:
    """Raise ``WrongEnvironment`` with what to do when this kernel cannot run a notebook of ``sdk``."""
    if sdk not in SDKS:
        raise ValueError(f"sdk must be one of {sorted(SDKS)}, not {sdk!r}")
    if problems(sdk):
        raise WrongEnvironment(advice(sdk, notebook))


if __name__ == "__main__":  # python -m helpers.environment_check v2|v3: the same check from a terminal
    try:
        require_sdk(sys.argv[1] if len(sys.argv) > 1 else "v2", "The notebook")
    except WrongEnvironment as error:
        sys.exit(str(error))
    print("ready:", ", ".join(f"{k} {v}" for k, v in installed_sdks().items()))
