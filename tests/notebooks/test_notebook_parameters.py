"""Every notebook's parameters, as papermill itself reads them (``papermill --help-notebook``): each
assignment of the parameters cell is listed, with its type and its help, and its default is the cell's.

papermill reads a parameters line with a regular expression, not with Python: ``name = value  # type: T
help``. A line with a second ``=`` (in the help, say ``0 = by time only``) is skipped with a warning, and
the parameter then disappears from ``--help-notebook`` and is "unknown" when passed with ``-p``.
"""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from papermill.inspection import inspect_notebook

from tools import run_notebooks

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TYPES = {
    "str": str,
    "int": int,
    "float": (int, float),
    "bool": bool,
    "None": type(None),
    "list[str]": list,
    "dict": dict,
}


def cell_parameters(path: Path) -> dict:
    """What Python makes of the parameters cell: name -> default."""
    cell = next(c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code")
    assert "parameters" in cell.metadata.get("tags", []), path.name
    return {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(cell.source).body}


def accepts(type_name: str, value) -> bool:
    """Whether ``value`` is of the declared type (``str``, ``int|None``, ``list[str]|None``, ...)."""
    return any(isinstance(value, TYPES[part]) for part in type_name.split("|"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_papermill_lists_every_parameter_with_its_type_and_help(path, caplog):
    with caplog.at_level(logging.WARNING, logger="papermill"):
        listed = inspect_notebook(str(path))
    assert not [r.getMessage() for r in caplog.records if "Unable to parse" in r.getMessage()]
    in_cell = cell_parameters(path)
    assert list(listed) == list(in_cell), "papermill does not list what the cell assigns"
    for name, default in in_cell.items():
        parameter = listed[name]
        type_name = parameter["inferred_type_name"]  # "None" when the line declares no type
        assert all(part in TYPES for part in type_name.split("|")) and type_name != "None", f"{path.name}: {name}"
        assert accepts(parameter["inferred_type_name"], default), f"{path.name}: {name}={default!r}"
        assert parameter["help"], f"{path.name}: {name} has no help"
        assert ast.literal_eval(parameter["default"]) == default, f"{path.name}: {name}"


@pytest.mark.parametrize("model", sorted(run_notebooks.PROFILES))
def test_the_ci_parameters_have_the_declared_types(model):
    for path in NOTEBOOKS:
        if model != "tiny" and path.name[:2] not in run_notebooks.PROFILES[model]:
            continue
        listed = inspect_notebook(str(path))
        for name, value in run_notebooks.ci_parameters(path, Path("/tmp/w"), model).items():
            assert name in listed, f"{path.name}: papermill would pass unknown {name}"
            assert accepts(listed[name]["inferred_type_name"], value), f"{path.name} ({model}): {name}={value!r}"


def test_help_notebook_shows_the_checkpoint_interval():
    # the line papermill used to skip: its help said "0 = by time only"
    shown = subprocess.run(
        [sys.executable, "-m", "papermill", "--help-notebook", "notebooks/05_spot_checkpoints.ipynb"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "checkpoint_every: int (default 0)" in shown.stdout and "0: by time only" in shown.stdout
    assert "Unknown type" not in shown.stdout and "Unable to parse" not in shown.stderr


def test_a_second_equals_sign_hides_a_parameter_from_papermill(tmp_path, caplog):
    """Why the help never holds ``=``: the rule the notebooks above keep."""
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "a = 0  # type: int  0 = off\nb = 1  # type: int  on", metadata={"tags": ["parameters"]}
            )
        ],
        metadata={"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}},
    )
    nbformat.write(nb, str(tmp_path / "nb.ipynb"))
    with caplog.at_level(logging.WARNING, logger="papermill"):
        listed = inspect_notebook(str(tmp_path / "nb.ipynb"))
    assert list(listed) == ["b"] and "Unable to parse line 1" in caplog.text
