"""Layouts where the project sits in a folder only its owner can enter (a root home, ``mktemp -d``).

The sandbox's workers run as other uids, so what matters is where the files really are:
- ``copy_checkout``: the project's scripts copied into a 0700 folder, its ``.venv`` a link to this
  environment (as a worktree's is), so the paths Python imports from lie under the folder;
- ``private_environment``: a Python installation and a virtual environment whose stdlib and numpy
  files lie under a 0700 folder (hard links where the file system allows, else copies; every other
  package is a symbolic link, read only by the trainer), beside the project's files as in
  ``/root/project/.venv`` and ``/root/project/credentials``.

``judge_here(python, scripts, options)`` starts a sandbox with that interpreter and reports in JSON.
Files that are hard links into this environment are never chmod-ed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
SKIPPED_STDLIB = {"test", "site-packages", "dist-packages", "idlelib", "tkinter", "turtledemo", "ensurepip"}


def make_private(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or links refused
        shutil.copy2(source, target)


def _tree(source: Path, target: Path, ignore=None, copy: bool = False) -> None:
    shutil.copytree(source, target, symlinks=True, ignore=ignore, copy_function=shutil.copy2 if copy else _link_or_copy)


def copy_checkout(private: Path) -> Path:
    """``private``/checkout with a copy of scripts/ and ``.venv`` linking to this environment."""
    checkout = private / "checkout"
    checkout.mkdir()
    _tree(SCRIPTS, checkout / "scripts", ignore=shutil.ignore_patterns("__pycache__"), copy=True)
    (checkout / ".venv").symlink_to(sys.prefix)
    return checkout


def private_environment(private: Path, copy_numpy: bool = False) -> Path:
    """A Python in ``private``/python and its venv in ``private``/project/.venv; returns the venv's python.

    ``copy_numpy`` copies numpy instead of linking it, so that a test may change its modes.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    python = private / "python"
    (python / "bin").mkdir(parents=True)
    executable = python / "bin" / Path(os.path.realpath(sys.executable)).name
    _link_or_copy(os.path.realpath(sys.executable), str(executable))
    _tree(
        stdlib,
        python / "lib" / stdlib.name,
        ignore=lambda folder, names: SKIPPED_STDLIB & set(names) if folder == str(stdlib) else set(),
    )
    project = private / "project"
    project.mkdir()
    (project / "credentials").write_text("PROJECT-SECRET\n")  # 0644: only the private folder hides it
    venv = project / ".venv"
    subprocess.run([str(executable), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    packages = Path(sysconfig.get_paths()["purelib"])
    target = venv / "lib" / stdlib.name / "site-packages"
    for entry in packages.iterdir():
        if entry.name.startswith("numpy"):  # numpy, numpy.libs, its dist-info: really under the folder
            _tree(entry, target / entry.name, copy=copy_numpy)
        else:
            (target / entry.name).symlink_to(entry)
    return venv / "bin" / "python"


# Run by ``judge_here``: argv = scripts folder, options (JSON). Prints one JSON line after "REPORT ".
_DRIVER = """
import json, sys
from sandbox import Sandbox, SandboxEscape, run_selftest
options = json.loads(sys.argv[2])
report = {}
with Sandbox(workers=1, landlock=options.get("landlock", True)) as box:
    report["layout_problem"] = box.layout_problem
    report["uid"] = box.layers["uid"][1]
    if options.get("selftest"):
        lines = []
        try:
            run_selftest(box, log=lines.append)
            report["selftest"] = "passed"
        except SandboxEscape as escape:
            report["selftest"] = str(escape)
        report["selftest_log"] = lines
    report["programs"] = []
    for program in options.get("programs", []):
        answer, stdout, stderr, _ = box.run_one(program, "")
        report["programs"].append({"exit_code": answer["exit_code"], "signal": answer["signal"],
                                   "stdout": stdout.decode(), "stderr": stderr.decode()[-600:]})
print("REPORT " + json.dumps(report))
"""


def judge_here(python: Path, scripts: Path, **options) -> dict:
    done = subprocess.run(
        [str(python), "-c", _DRIVER, str(scripts), json.dumps(options)],
        cwd=scripts,
        capture_output=True,
        text=True,
        timeout=240,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
    )
    assert "REPORT " in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.split("REPORT ", 1)[1].splitlines()[0])
