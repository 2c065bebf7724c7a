"""The sandbox where the project, its environment or its Python sit in a folder others cannot enter.

Each test starts the sandbox with the interpreter of that layout in a subprocess, so that the paths
the fork servers import from really are the private ones (``private_folders.py``).
"""

import os
import shlex
import subprocess

import pytest
from private_folders import SCRIPTS, copy_checkout, judge_here, make_private, private_environment
from sandbox import confine

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the per-worker uid needs root")
needs_views = pytest.mark.skipif(
    os.geteuid() != 0 or not confine.landlock_abi(), reason="views into private folders need root and Landlock"
)

# Climbs with ``..`` from every descriptor it holds to the project's credentials beside the .venv.
CLIMB = """
import os
views = [fd for fd in range(4, 64) if os.path.isdir(f'/proc/self/fd/{fd}')]  # (Landlock forbids listing)
print('VIEWS', len(views))
for fd in views:
    for up in range(1, 9):
        try:
            print(open(f'/proc/self/fd/{fd}' + '/..' * up + '/credentials').read())
        except OSError:
            pass
"""


def passed_selftest(report: dict) -> None:
    assert report["selftest"] == "passed", report["selftest"]
    log = "\n".join(report["selftest_log"])
    for legit in ("numpy", "the standard library and numpy.linalg"):
        assert f"legitimate {legit}: accepted" in log, log


def test_worker_uids_can_read_the_runtime(judge_sandbox):
    # Where they cannot, this is the one failure; the other sandbox tests skip with the same line.
    assert judge_sandbox.layout_problem is None, judge_sandbox.layout_problem


@needs_views
@pytest.mark.usefixtures("readable_runtime")  # they copy this runtime
def test_selftest_passes_from_a_checkout_in_a_private_folder(tmp_path):
    checkout = copy_checkout(make_private(tmp_path / "private"))
    report = judge_here(checkout / ".venv" / "bin" / "python", checkout / "scripts", selftest=True)
    passed_selftest(report)
    assert report["layout_problem"] is None
    # The workers could not reach the checkout's site-packages by its path: it was read through a view.
    assert f"{checkout}/.venv/lib/" in report["uid"] and "read through views" in report["uid"], report["uid"]


@needs_views
@pytest.mark.usefixtures("readable_runtime")  # they copy this runtime
def test_selftest_passes_with_python_and_environment_in_a_private_folder(tmp_path):
    private = make_private(tmp_path / "private")
    python = private_environment(private)
    report = judge_here(python, SCRIPTS, selftest=True, programs=[CLIMB])
    passed_selftest(report)
    assert f"{private}/python/lib/" in report["uid"] and f"{private}/project/.venv/lib/" in report["uid"]
    # A view starts a lookup inside the private folder; Landlock still keeps the program to the runtime.
    climb = report["programs"][0]
    assert climb["stdout"].startswith("VIEWS ") and int(climb["stdout"].split()[1]) >= 1, climb
    assert "PROJECT-SECRET" not in climb["stdout"], climb


@needs_views
@pytest.mark.usefixtures("readable_runtime")  # they copy this runtime
def test_an_unreadable_package_is_named_with_the_command_that_fixes_it(tmp_path):
    private = make_private(tmp_path / "private")
    python = private_environment(private, copy_numpy=True)
    numpy_folder = next((private / "project" / ".venv" / "lib").glob("python3*/site-packages/numpy"))
    numpy_folder.chmod(0o700)  # as a pip install under umask 077 leaves it
    report = judge_here(python, SCRIPTS, selftest=True)
    first = report["selftest"].splitlines()[1].strip()  # the line after "sandbox self-test failed, ..."
    assert first == report["layout_problem"], report["selftest"]
    assert first.endswith(f"fix: chmod -R o+rX {numpy_folder}"), first
    subprocess.run(shlex.split(first.split("fix: ", 1)[1]), check=True)  # the command it names fixes it
    fixed = judge_here(python, SCRIPTS, programs=["import numpy\nprint(numpy.arange(4).sum())\n"])
    assert fixed["layout_problem"] is None and fixed["programs"][0]["stdout"] == "6\n", fixed


@needs_root
@pytest.mark.usefixtures("readable_runtime")  # it copies this runtime
def test_without_landlock_a_private_folder_is_named_and_stays_closed(tmp_path):
    private = make_private(tmp_path / "private")
    checkout = copy_checkout(private)
    report = judge_here(checkout / ".venv" / "bin" / "python", checkout / "scripts", landlock=False, programs=[CLIMB])
    problem = report["layout_problem"]
    assert problem and f"{checkout}/.venv/lib/" in problem, problem
    assert "without Landlock" in problem and "fix: chmod o+x " in problem, problem
    assert str(private) in problem.split("fix: chmod o+x ", 1)[1].split(" (")[0].split(), problem
    assert report["programs"][0]["stdout"] == "VIEWS 0\n", report["programs"][0]  # nothing was opened
