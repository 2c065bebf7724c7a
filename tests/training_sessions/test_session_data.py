"""The training-session notebooks read their data through the environments' own loaders, in the SDK v3
environment, which has no torch: the validation a training job gets, with the same errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SESSIONS_PYTHON = REPO / ".venv-sessions" / "bin" / "python"

READ = """
import json, sys
import helpers.training_sessions  # puts scripts/ on the path, as in the notebooks
from common.contract import UserError
from environments.code import CodeEnvironment
from environments.gsm8k import GSM8KEnvironment
from helpers.training_sessions import data

environment = {"gsm8k": GSM8KEnvironment, "code": CodeEnvironment}[sys.argv[1]]()
try:
    rows = environment.load(sys.argv[2])
    result = {"rows": len(rows)}
except UserError as error:
    result = {"error": str(error)}
result["offline_problems"] = len(data.count_problems(4)) + len(data.offline_code_problems(3))
result["torch"] = "torch" in sys.modules
print(json.dumps(result))
"""


def read(tmp_path, environment: str, rows: list) -> dict:
    if not SESSIONS_PYTHON.exists():
        pytest.fail("The SDK v3 environment is missing: build it with `make .venv-sessions/.stamp`.")
    path = tmp_path / "rows.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    done = subprocess.run(
        [str(SESSIONS_PYTHON), "-c", READ, environment, str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_gsm8k_rows_are_read_and_checked_without_torch(tmp_path):
    good = {"question": "Ann has 3 pens. How many pens?", "answer": "She has 3.\n#### 3"}
    assert read(tmp_path, "gsm8k", [good, good]) == {"rows": 2, "offline_problems": 7, "torch": False}
    out = read(tmp_path, "gsm8k", [good, {"question": "Two?", "answer": "2"}])
    assert "line 2" in out["error"] and "####" in out["error"], out
    assert out["torch"] is False


def test_code_rows_are_normalised_and_checked_without_torch(tmp_path):
    problem = {"id": "p", "statement": "Echo.", "tests": [{"input": "1\n", "output": "1\n"}]}
    assert read(tmp_path, "code", [problem])["rows"] == 1
    out = read(tmp_path, "code", ["{not json"])
    assert "line 1" in out["error"] and "not valid JSON" in out["error"], out
    assert out["torch"] is False


def test_the_session_notebooks_find_the_files_notebook_0_staged(tmp_path):
    """Notebook 0 writes each data set as the jobs' channel folders; the session notebooks read the same
    files, and without them say to run notebook 0 with the same work_dir."""
    from helpers import data_prep
    from helpers.training_sessions import data
    from local_mode.offline_data import DATASETS

    with pytest.raises(FileNotFoundError, match="run notebook 0 first with the same work_dir"):
        data.staged_file(tmp_path, "gsm8k", "train")
    for name in ("gsm8k", "code", "preferences"):
        rows = DATASETS[name](6, seed=0)
        data_prep.write_channels({"train": rows[:4], "test": rows[4:]}, tmp_path / "data" / "channels" / name)
        assert len(data.staged_file(tmp_path, name, "train").read_text().splitlines()) == 4
        assert len(data.staged_file(tmp_path, name, "test").read_text().splitlines()) == 2
