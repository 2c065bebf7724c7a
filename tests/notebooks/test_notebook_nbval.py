"""nbval: the request each notebook builds for its cloud configuration is the one stored in git.

The cells marked ``# NBVAL_CHECK_OUTPUT`` print the summary of the CreateTrainingJob request
(image, instances, spot, checkpoints, distribution, isolation, channels); their outputs are
kept in the committed notebooks. Each notebook is cut after its checked cell (nothing after
it is launched), given the CI parameters as papermill would, and run by ``pytest
--nbval-lax`` against the data, model and jobs of the session's notebook run;
``nbval_sanitize.cfg`` blanks job-name timestamps and bucket names.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
from papermill.parameterize import parameterize_notebook

from helpers import run_notebooks
from helpers.notebook_hygiene import is_checked

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _prepare(tmp_path: Path, work_dir: Path) -> list[Path]:
    # The notebooks find helpers/ and scripts/ next to their folder, as in the repository.
    for name in ("helpers", "scripts"):
        (tmp_path / name).symlink_to(REPO / name, target_is_directory=True)
    folder = tmp_path / "notebooks"
    folder.mkdir()
    written = []
    for path in run_notebooks.notebooks():
        nb = nbformat.read(str(path), as_version=4)
        checked = [i for i, cell in enumerate(nb.cells) if is_checked(cell)]
        if not checked:
            continue
        nb.cells = nb.cells[:checked[-1] + 1]
        nb = parameterize_notebook(nb, run_notebooks.ci_parameters(path, work_dir))
        target = folder / path.name
        nbformat.write(nb, str(target))
        written.append(target)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return written


def test_request_cells_match_their_stored_outputs(notebook_run, tmp_path):
    notebooks = _prepare(tmp_path, notebook_run.out / "work")
    assert len(notebooks) == 6
    env = dict(os.environ)
    env.update({"SAGEMAKER_LOCAL_ROOT": str(notebook_run.local_root), "NOTEBOOK_PLAIN_OUTPUT": "1",
                "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "SAGEMAKER_SUPPRESS_V2_WARNING": "1", "PYTHONPATH": str(REPO)})
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider",
         "--nbval-sanitize-with", str(HERE / "nbval_sanitize.cfg"), "-c", str(tmp_path / "pytest.ini"),
         "--rootdir", str(tmp_path), "-q", *map(str, notebooks)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=420)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
