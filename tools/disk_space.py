"""Free disk space, checked before the Makefile builds the virtual environments.

Each environment holds its own PyTorch (about 750 MB) beside the rest of its packages; built side by
side on a nearly full disk, pip stops halfway through with "[Errno 28] No space left on device" and
leaves a half-installed environment behind. This check runs first and says, instead, how much the
missing environments take, how much the disk has, and what to do.

    python3 -m tools.disk_space .venv .venv-sessions .venv-image

Only the environments whose stamp file is missing count: a machine that built them once needs no
more room. The standard library only: it runs before any environment exists.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GIB = 1024**3
# What each environment takes once built (du -s on Linux x86_64, Python 3.11), rounded up.
ENVIRONMENT_GIB = {".venv": 2.5, ".venv-sessions": 2.2, ".venv-image": 1.6, ".venv-bench-peer": 2.5}
# Room for what a run writes beside them: the test suite's and the main job's outputs/, and pip's
# temporary files while it unpacks.
RUN_GIB = 1.0
# What a main job on a real model writes to its output folder at its peak, measured and rounded up:
# SmolLM2's run keeps eight jobs' archives, notebook 05's checkpoint with the optimizer's state and three
# models (about 7.6 GB, docs/REAL_MODEL_RUN.md "Where the disk goes"), and notebook 13 holds 2.2 GB of
# downloads for a while.
MAIN_JOB_GIB = {"smollm2": 10.0}


def missing_environments(names: list[str], repo: Path = REPO) -> list[str]:
    """The environments among ``names`` that have not been built (no ``.stamp`` in them)."""
    return [name for name in names if not (repo / name / ".stamp").exists()]


def shortage(names: list[str], free_bytes: int) -> str | None:
    """Why ``free_bytes`` is too little to build the environments ``names``, or None if it is enough."""
    unknown = [name for name in names if name not in ENVIRONMENT_GIB]
    if unknown:
        raise ValueError(f"no size known for {unknown}: add it to ENVIRONMENT_GIB ({sorted(ENVIRONMENT_GIB)})")
    if not names:
        return None
    need = sum(ENVIRONMENT_GIB[name] for name in names) + RUN_GIB
    free = free_bytes / GIB
    if free >= need:
        return None
    sizes = ", ".join(f"{name} {ENVIRONMENT_GIB[name]} GiB" for name in names)
    return (
        f"Not enough disk space to build the environments: {need:.1f} GiB needed ({sizes}, and "
        f"{RUN_GIB} GiB for the run's outputs), {free:.1f} GiB free on the disk that holds {REPO}.\n"
        f"Free {need - free:.1f} GiB or more (for example `python3 -m pip cache purge`, or remove old run "
        "folders under outputs/), or clone the repository onto a larger disk, then run the same command again."
    )


def main_job_shortage(model: str, out: Path, free_bytes: int) -> str | None:
    """Why ``free_bytes`` is too little for ``make main MODEL=<model>`` to write its run into ``out``,
    or None if it is enough (or the model's runs are small: the tiny model's take about 1 GB)."""
    need = MAIN_JOB_GIB.get(model)
    free = free_bytes / GIB
    if need is None or free >= need:
        return None
    return (
        f"Not enough disk space for the {model} run: it writes about {need:.0f} GiB to {out}, and the disk "
        f"that holds it has {free:.1f} GiB free. Free {need - free:.1f} GiB or more (earlier runs' folders, "
        "outputs/main-*, are the largest), or give OUT=<a folder on a larger disk>, then run it again."
    )


def main(argv: list[str]) -> int:
    problem = shortage(missing_environments(argv), shutil.disk_usage(REPO).free)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
