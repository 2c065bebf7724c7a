"""The notebooks as files: lint, papermill metadata, a parameters cell with cloud defaults, stripped outputs."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tools.notebook_hygiene import CHECK_MARK, is_checked, problems, strip

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(
    (REPO / "notebooks").glob("0[0-6]_*.ipynb")
)  # the job notebooks; 07+: test_training_session_notebooks.py


def test_there_are_seven_numbered_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == ["00", "01", "02", "03", "04", "05", "06"]


def test_ruff_passes_on_the_notebooks():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", *map(str, NOTEBOOKS)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_clean(path):
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    assert problems(nb) == []
    # nbformat 4.5 cells carry ids; reading fills in missing ones (with a warning), so read the file itself
    ids = [cell.get("id") for cell in json.loads(path.read_text())["cells"]]
    assert None not in ids and len(set(ids)) == len(ids), ids


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_parameters_default_to_the_cloud(path):
    nb = nbformat.read(str(path), as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    values = {}
    for node in ast.parse(cell.source).body:  # papermill needs plain assignments of literals
        assert isinstance(node, ast.Assign) and len(node.targets) == 1, ast.unparse(node)
        values[node.targets[0].id] = ast.literal_eval(node.value)
    assert values["run_mode"] == "auto"
    assert {"region", "role", "work_dir"} <= set(values)
    if "instance_type" in values:
        assert values["instance_type"].startswith(("ml.p4de", "ml.p5", "ml.g5"))
    if "model_id" in values:
        assert values["model_id"] == "Qwen/Qwen2.5-0.5B-Instruct" and values["data_source"] == "hub"
    if path.name.startswith(("03", "04", "05")):
        assert values["instance_type"] == "ml.p5.48xlarge"
    if path.name.startswith("05"):
        assert values["use_spot"] is True


def test_every_launching_notebook_checks_its_request_with_nbval():
    for path in NOTEBOOKS[1:]:
        nb = nbformat.read(str(path), as_version=4)
        checked = [c for c in nb.cells if is_checked(c)]
        assert len(checked) == 1, path.name
        assert "InstanceType: ml." in "".join(o.get("text", "") for o in checked[0].outputs), path.name


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_the_ci_parameters_are_parameters_of_the_notebooks(model):
    from tools import run_notebooks

    for path in NOTEBOOKS:
        nb = nbformat.read(str(path), as_version=4)
        source = next(c for c in nb.cells if c.cell_type == "code").source
        names = {node.targets[0].id for node in ast.parse(source).body}
        passed = set(run_notebooks.ci_parameters(path, Path("/tmp/w"), model))
        assert passed <= names, f"{path.name}: papermill would pass unknown {sorted(passed - names)}"


def test_strip_removes_outputs_but_keeps_checked_ones():
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "x = 1", execution_count=3, outputs=[nbformat.v4.new_output("stream", text="noise")]
            ),
            nbformat.v4.new_code_cell(
                f"{CHECK_MARK}\nprint(1)", execution_count=4, outputs=[nbformat.v4.new_output("stream", text="1\n")]
            ),
        ]
    )
    nb.metadata["papermill"] = {"duration": 1}
    strip(nb)
    assert nb.cells[0].outputs == [] and nb.cells[0].execution_count is None
    assert nb.cells[1].outputs[0]["text"] == "1\n" and nb.cells[1].execution_count == 1
    assert "papermill" not in nb.metadata


# A measured-looking figure in prose: a share or rate with two or more decimals (0.43), a value with an
# arrow after it (6.92 -> 6.26), or a "±". Prose states what a run shows in words; the figures come from
# the cells that compute them. (Versions such as Python 3.12 are neither.)
MEASURED_FIGURE = re.compile(r"(?<![\w.])0\.\d{2,}(?![\w.])|\d\.\d+ ?(?:->|→)|±")


def prose_without_code(markdown: str) -> str:
    """The markdown's prose: fenced blocks and inline code spans (log lines, versions) left out."""
    return re.sub(r"`[^`]*`", "", re.sub(r"```.*?```", "", markdown, flags=re.S))


@pytest.mark.parametrize("path", sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.name[:2])
def test_prose_quotes_no_measured_figure(path):
    """Markdown cannot know what the run on its page computed: a figure written there is another run's."""
    notebook = nbformat.read(str(path), as_version=4)
    found = [
        (index, MEASURED_FIGURE.findall(prose_without_code(cell.source)))
        for index, cell in enumerate(notebook.cells)
        if cell.cell_type == "markdown" and MEASURED_FIGURE.search(prose_without_code(cell.source))
    ]
    assert found == [], f"{path.name}: markdown cells quote figures {found}; print them from a code cell instead"


def test_the_prose_check_finds_a_quoted_figure():
    assert MEASURED_FIGURE.search(prose_without_code("held-out accuracy went 0.295 -> 0.328"))
    assert MEASURED_FIGURE.search(prose_without_code("margin 3.58 ± 0.13"))
    assert not MEASURED_FIGURE.search(prose_without_code("Python 3.12, 16 steps, `step=12 loss=0.4312`"))
