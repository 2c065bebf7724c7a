"""The right SDK, or a clear message: each notebook's first cell after its parameters checks the kernel's
SageMaker SDK (``helpers/environment_check.py``) before anything imports it, and in the wrong kernel says
what to do in Studio instead of failing with an ImportError."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers import environment_check

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
KERNEL_SDK = {"python3": "v2", "sagemaker-sdk-v3": "v3"}
PYTHONS = {"v2": REPO / ".venv" / "bin" / "python", "v3": REPO / ".venv-sessions" / "bin" / "python"}


def _top_modules(tree: ast.AST) -> set[str]:
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module.split(".")[0])
    return modules


def test_the_check_imports_only_the_standard_library():
    tree = ast.parse((REPO / "helpers" / "environment_check.py").read_text())
    assert _top_modules(tree) - {"__future__"} <= sys.stdlib_module_names


def _check(python: Path, sdk: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-m", "helpers.environment_check", sdk], capture_output=True, text=True, cwd=REPO, timeout=120
    )


@pytest.mark.parametrize("sdk", ["v2", "v3"])
def test_each_environment_passes_its_own_check(sdk):
    done = _check(PYTHONS[sdk], sdk)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ready: {sdk} ")


def test_a_v2_notebook_in_the_sdk_v3_environment_names_the_kernel_to_pick():
    done = _check(PYTHONS["v3"], "v2")
    assert done.returncode != 0
    message = done.stderr
    assert "needs the SageMaker Python SDK v2 (sagemaker==2.257.*)" in message
    assert "has: SageMaker Python SDK v3 (sagemaker-train 1." in message
    assert "conda env create -f environment.yml" in message and "Kernel > Change Kernel..." in message
    assert "Do not %pip install sagemaker into this kernel" in message
    assert "both install the Python package `sagemaker/`" in message


def test_a_v3_notebook_in_the_sdk_v2_environment_names_the_kernel_to_pick():
    message = _check(PYTHONS["v2"], "v3").stderr
    assert "needs the SageMaker Python SDK v3 (sagemaker-train)" in message
    assert "has: SageMaker Python SDK v2 (sagemaker 2.257." in message
    assert '"SageMaker SDK v3"' in message and f"%pip install -r {REPO / 'requirements-sessions.txt'}" in message
    assert "Do not %pip install sagemaker-train into this kernel" in message


def test_without_any_sdk_the_message_is_the_pip_line(monkeypatch):
    monkeypatch.setattr(environment_check, "installed_version", lambda distribution: None)
    with pytest.raises(environment_check.WrongEnvironment) as raised:
        environment_check.require_sdk("v2", "Notebook 01")
    message = str(raised.value)
    assert f"Run this in a cell:  %pip install -r {REPO / 'requirements.txt'}" in message
    assert "no SageMaker SDK" in message and "Restart Kernel" in message


def test_a_missing_package_of_the_environment_is_named(monkeypatch):
    real = environment_check.installed_version
    monkeypatch.setattr(environment_check, "installed_version", lambda d: None if d == "papermill" else real(d))
    assert environment_check.problems("v2") == ["requirements.txt lists packages this environment lacks: papermill"]


def test_requirement_names_are_read_without_extras_or_versions(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(
        "# c\nsagemaker-train[tokenizer]==1.27.0\nmoto[s3]==5.2.5\nboto3>=1.44,<1.45\n-r x.txt\nruff\n"
    )
    assert environment_check.required_distributions(requirements) == ["sagemaker-train", "moto", "boto3", "ruff"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_first_cell_checks_the_sdk_of_the_notebooks_kernel_before_any_other_import(path):
    nb = nbformat.read(str(path), as_version=4)
    sdk = KERNEL_SDK[nb.metadata["kernelspec"]["name"]]
    cell = [c for c in nb.cells if c.cell_type == "code"][1]  # the first after the parameters
    body = ast.parse(cell.source).body
    calls = [
        i
        for i, node in enumerate(body)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and ast.unparse(node.value.func) == "require_sdk"
    ]
    assert calls, f"{path.name}: its first cell does not call require_sdk"
    call = body[calls[0]].value
    assert [ast.literal_eval(a) for a in call.args] == [sdk, f"Notebook {path.name[:2]}"]
    before = ast.Module(body=body[: calls[0]], type_ignores=[])
    assert _top_modules(before) - {"helpers"} <= sys.stdlib_module_names, ast.unparse(before)
    assert "from helpers.environment_check import require_sdk" in ast.unparse(before)


@pytest.mark.timeout(300)
def test_notebook_01_in_the_sdk_v3_kernel_says_what_to_do(tmp_path):
    """Notebook 01 opened in the SDK v3 kernel, as in Studio's default image: its first cells stop with
    the message, shown whole and without a traceback (what IPython renders for WrongEnvironment)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    nb = nbformat.read(str(REPO / "notebooks" / "01_estimator_sft.ipynb"), as_version=4)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    nb.cells = nb.cells[: code[1] + 1]  # the parameters and the first cell
    source = tmp_path / "01_first_cells.ipynb"
    nbformat.write(nb, str(source))
    with pytest.raises(PapermillExecutionError) as raised:
        papermill.execute_notebook(
            str(source),
            str(tmp_path / "out.ipynb"),
            parameters={"run_mode": "local"},
            kernel_name="sagemaker-sdk-v3",
            cwd=str(REPO / "notebooks"),
            progress_bar=False,
        )
    assert raised.value.ename == "WrongEnvironment"
    assert raised.value.evalue.startswith("Notebook 01 needs the SageMaker Python SDK v2 (sagemaker==2.257.*)")
    assert "SageMaker Python SDK v3 (sagemaker-train" in raised.value.evalue
    executed = nbformat.read(str(tmp_path / "out.ipynb"), as_version=4)
    (error,) = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert error.traceback == [f"WrongEnvironment: {error.evalue}"]  # the message, no frames
    assert 'Kernel > Change Kernel... > "SageMaker SDK v2 (sagemaker-llm-loops)"' in error.evalue
