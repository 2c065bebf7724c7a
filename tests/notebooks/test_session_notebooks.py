"""The training-session notebooks (07 onwards): hygiene, and what their local-mode run shows.

They run once, in the shared main-job run (fixture ``notebook_run``: papermill, CI parameters from
``helpers/session_notebooks.py``, the SDK v3 kernel ``sagemaker-sdk-v3``); these tests read
the records each notebook left in ``<work_dir>/training_sessions.json``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers import run_notebooks, session_notebooks
from helpers.notebook_hygiene import problems

REPO = Path(__file__).resolve().parents[2]
SESSION_NOTEBOOKS = sorted(p for p in (REPO / "notebooks").glob("[0-9][0-9]_session_*.ipynb") if p.name >= "07")


def test_the_session_notebooks_are_there():
    assert [p.name for p in SESSION_NOTEBOOKS] == ["07_session_sft.ipynb", "08_session_grpo.ipynb",
                                                   "10_session_raw_api.ipynb"]


@pytest.mark.parametrize("path", SESSION_NOTEBOOKS, ids=lambda p: p.name)
def test_session_notebook_is_clean_and_runs_in_the_sdk_v3_kernel(path):
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "sagemaker-sdk-v3"
    assert session_notebooks.kernel_name(path) == "sagemaker-sdk-v3"
    # The job notebooks' rules, but for the kernel, which is the SDK v3 environment's.
    assert [p for p in problems(nb) if not p.startswith("metadata.kernelspec")] == []
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", str(path)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert lint.returncode == 0, lint.stdout


@pytest.mark.parametrize("path", SESSION_NOTEBOOKS, ids=lambda p: p.name)
def test_session_parameters_default_to_the_cloud(path):
    cell = next(c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code")
    assert "parameters" in cell.metadata.get("tags", [])
    values = {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(cell.source).body}
    assert values["run_mode"] == "auto" and {"region", "role", "work_dir"} <= set(values)
    assert values["base_model"] == "openai/gpt-oss-20b"  # served by training sessions (SDK's Region table)
    passed = set(run_notebooks.ci_parameters(path, Path("/tmp/w")))
    assert passed <= set(values), f"papermill would pass unknown {sorted(passed - set(values))}"


def _record(notebook_run, prefix: str) -> dict:
    ran = {r["notebook"]: r for r in notebook_run.summary["notebooks"]}
    name = next(n for n in ran if n.startswith(prefix))
    assert ran[name]["status"] == "ok", ran[name]
    return next(s for s in notebook_run.summary["training_sessions"] if s["notebook"].startswith(prefix))


def test_session_sft_lowers_the_loss_and_is_billed(notebook_run):
    record = _record(notebook_run, "07")
    assert record["status"] == "Stopped"  # stopped at the end
    assert record["steps"] == session_notebooks.CI_PARAMETERS["07"]["steps"]
    first, last = record["first_loss"], record["final_metrics"]["loss"]
    assert last < first - 0.3, (first, last)  # measured: 6.87 -> 6.11 per answer token in 8 steps
    billed = record["billable_tokens"]
    # Every training token of every step is billed; the estimate before launch is within 20 %.
    assert billed["training"] > 0 and abs(billed["training"] - record["estimated_training_tokens"]) \
        < 0.2 * record["estimated_training_tokens"]


def test_session_grpo_raises_the_reward(notebook_run):
    record = _record(notebook_run, "08")
    assert record["status"] == "Stopped"
    # Measured with the CI parameters (seeds 0, 1; lr 1e-3 to 2e-3): first third 0.26-0.32 -> last 0.34-0.41.
    assert record["reward"]["last_third"] > record["reward"]["first_third"] + 0.04, record["reward"]
    # Held-out accuracy before and after is recorded (and shown in the summary) but not asserted: with
    # the tiny model it does not reliably rise yet (measured 0.289 -> 0.258 / 0.281, 0.352 -> 0.391).
    assert 0 <= record["held_out"]["before"] <= 1 and 0 <= record["held_out"]["after"] <= 1
    assert record["final_metrics"]["clip_fraction"] == 0  # on-policy (overlap=False): every ratio is 1
    assert record["billable_tokens"]["sample"] > 0 and record["billable_tokens"]["training"] > 0
    assert "## Training sessions" in (notebook_run.out / "summary.md").read_text()


def test_raw_api_notebook_steps_with_sequence_numbers_and_deletes_its_session(notebook_run):
    ran = {r["notebook"]: r for r in notebook_run.summary["notebooks"]}
    assert ran["10_session_raw_api.ipynb"]["status"] == "ok", ran["10_session_raw_api.ipynb"]
    executed = nbformat.read(notebook_run.out / "notebooks" / "10_session_raw_api.ipynb", as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    steps = session_notebooks.CI_PARAMETERS["10"]["steps"]
    losses = [float(line.split("loss per answer token ")[1]) for line in text.splitlines() if "loss per answer" in line]
    assert len(losses) == steps and losses[-1] < losses[0], losses
    assert f"LastReceivedSequenceNumber {2 * steps}" in text  # the retried client token ran nothing new
    assert "\nTrue\n" in text and "deleted raw-api-sft-" in text
