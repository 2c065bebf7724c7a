"""One local-mode run of every notebook per test session (CI parameters), shared by the notebook tests."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class NotebookRun:
    out: Path
    summary: dict

    @property
    def state(self) -> dict:
        return json.loads((self.out / "work" / "state.json").read_text())

    @property
    def local_root(self) -> Path:
        return self.out / "sagemaker-local"

    def s3_file(self, uri: str) -> Path:
        """Local mode mirrors every S3 object on disk: <root>/s3/<bucket>/<key>."""
        bucket, _, key = uri[len("s3://") :].partition("/")
        return self.local_root / "s3" / bucket / key

    def jobs(self, notebook_prefix: str) -> list[dict]:
        return [job for job in self.state.get("jobs", []) if job["notebook"].startswith(notebook_prefix)]


# The first test that asks for the run pays for all notebooks in its set-up, which pytest-timeout
# counts against that test: give those tests room for the whole main job on a loaded 2-core machine.
NOTEBOOK_RUN_TIMEOUT_S = 2400


def pytest_collection_modifyitems(items):
    for item in items:
        if "notebook_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(NOTEBOOK_RUN_TIMEOUT_S))


@pytest.fixture(scope="session")
def notebook_run(tmp_path_factory) -> NotebookRun:
    """``tools.run_notebooks`` on every notebook, once (5-10 minutes on 2 cores). With
    ``NOTEBOOK_RUN=<folder>`` the tests read a finished main job there instead (``make main MODEL=tiny``
    writes one in outputs/main-tiny), e.g. to check a run again without repeating it."""
    import os

    from tools import run_notebooks

    if os.environ.get("NOTEBOOK_RUN"):
        out = Path(os.environ["NOTEBOOK_RUN"]).resolve()
        summary = json.loads((out / "summary.json").read_text())
        _NOTEBOOK_SECONDS.extend((r["notebook"], r["status"], r["seconds"]) for r in summary["notebooks"])
        _WALL_SECONDS.append(summary.get("seconds"))
        return NotebookRun(out, summary)

    out = tmp_path_factory.mktemp("main")
    saved = dict(os.environ)
    try:
        suite = [p.name[:2] for p in run_notebooks.notebooks() if p.name[:2] not in run_notebooks.SUITE_LEAVES_OUT]
        summary = run_notebooks.run(out, only=suite)
    finally:  # run() sets the kernels' environment in this process; give the other tests theirs back
        os.environ.clear()
        os.environ.update(saved)
    _NOTEBOOK_SECONDS.extend((r["notebook"], r["status"], r["seconds"]) for r in summary["notebooks"])
    _WALL_SECONDS.append(summary.get("seconds"))
    return NotebookRun(out, summary)


# Each notebook's wall time in the shared run, for the end of the test report: the run is the
# suite's largest single cost, and pytest's durations show it only as one fixture set-up.
_NOTEBOOK_SECONDS: list[tuple[str, str, float]] = []
_WALL_SECONDS: list[float | None] = []  # the run's own wall time: its two lanes overlap


def pytest_terminal_summary(terminalreporter):
    if _NOTEBOOK_SECONDS:
        terminalreporter.section("main job: seconds per notebook")
        for name, status, seconds in _NOTEBOOK_SECONDS:
            terminalreporter.write_line(f"{seconds:7.1f}  {name}  {status}")
        terminalreporter.write_line(f"{sum(s for _, _, s in _NOTEBOOK_SECONDS):7.1f}  added up")
        if _WALL_SECONDS and _WALL_SECONDS[0] is not None:
            terminalreporter.write_line(f"{_WALL_SECONDS[0]:7.1f}  wall time (the lanes side by side)")
