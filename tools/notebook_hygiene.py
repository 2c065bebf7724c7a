"""Clean notebook diffs: outputs are stripped in git, except the cells whose output is checked.

Rules (enforced by tests/notebooks/test_notebook_hygiene.py):
- the first code cell is tagged ``parameters`` (papermill) and holds the cloud defaults;
- the notebook names its kernel (``kernelspec`` python3) and ``language_info``;
- no execution counts and no outputs, except in cells that start with ``# NBVAL_CHECK_OUTPUT``:
  they keep their output and execution count 1 (nbval skips cells marked unrun), and nbval
  compares that output (after ``tests/notebooks/nbval_sanitize.cfg`` replaces job names,
  timestamps and buckets).

    python -m tools.notebook_hygiene strip                      # strip every notebook in notebooks/
    python -m tools.notebook_hygiene refresh outputs/main-tiny
        # after `make main MODEL=tiny`: run each notebook up to its checked cell with its cloud parameters
        # (local mode, against that run's data and jobs), store those outputs, strip the rest

The checked outputs come from the **cloud** parameters (only ``run_mode="local"`` and
``work_dir`` are set), since they show the request the cloud configuration sends.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
CHECK_MARK = "# NBVAL_CHECK_OUTPUT"
CHECKED_EXECUTION_COUNT = 1  # the same in every checked cell: no diff from one run to the next
KERNELS = ("python3", "sagemaker-sdk-v3")  # the main environment (SDK v2) and .venv-sessions (SDK v3)


def is_checked(cell) -> bool:
    return cell.cell_type == "code" and cell.source.lstrip().startswith(CHECK_MARK)


def strip(nb, checked_outputs: dict[str, list] | None = None):
    """Remove outputs, execution counts and run metadata; checked cells keep (or get) their outputs."""
    for key in ("papermill", "widgets"):
        nb.metadata.pop(key, None)
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        cell.execution_count = None
        if is_checked(cell):
            if checked_outputs is not None and cell.get("id") in checked_outputs:
                cell.outputs = checked_outputs[cell.id]
            cell.execution_count = CHECKED_EXECUTION_COUNT  # nbval ignores outputs of cells marked unrun
            for output in cell.outputs:
                if "execution_count" in output:
                    output["execution_count"] = CHECKED_EXECUTION_COUNT
        else:
            cell.outputs = []
    return nb


def problems(nb) -> list[str]:
    """What breaks the rules above, in words (empty when the notebook is clean)."""
    found = []
    kernelspec = nb.metadata.get("kernelspec", {})
    if kernelspec.get("name") != "python3" or kernelspec.get("language") != "python":
        found.append("metadata.kernelspec must name the python3 kernel (papermill needs it)")
    if nb.metadata.get("language_info", {}).get("name") != "python":
        found.append("metadata.language_info.name must be python")
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    if not code_cells or "parameters" not in code_cells[0].metadata.get("tags", []):
        found.append("the first code cell must be tagged 'parameters'")
    for number, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if is_checked(cell):
            if cell.execution_count != CHECKED_EXECUTION_COUNT:
                found.append(
                    f"cell {number} is checked by nbval and needs execution_count "
                    f"{CHECKED_EXECUTION_COUNT} (python -m tools.notebook_hygiene strip)"
                )
            if not cell.outputs:
                found.append(
                    f"cell {number} is checked by nbval but stores no output "
                    f"(python -m tools.notebook_hygiene refresh outputs/main-tiny)"
                )
        elif cell.outputs or cell.execution_count is not None:
            found.append(f"cell {number} keeps outputs or an execution count (python -m tools.notebook_hygiene strip)")
    return found


def checked_outputs_of(executed: Path) -> dict[str, list]:
    nb = nbformat.read(str(executed), as_version=4)
    outputs = {cell.id: cell.outputs for cell in nb.cells if is_checked(cell)}
    for cell_id, cell_outputs in outputs.items():
        if not cell_outputs or any(o.get("output_type") == "error" for o in cell_outputs):
            raise ValueError(f"{executed}: checked cell {cell_id} did not run cleanly; run the notebook first")
    return outputs


def cut_notebooks(dest: Path, work_dir: Path, extra_source=None, kernel: str = "python3") -> list[Path]:
    """Each notebook of ``kernel`` up to its checked cell, with its cloud parameters but
    ``run_mode="local"`` and ``work_dir``, written to ``dest/notebooks/`` (``scripts/`` linked next to
    it, as in the repository). ``extra_source(name)`` may
    return a cell to append."""
    from nbformat.v4 import new_code_cell
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    dest.mkdir(parents=True, exist_ok=True)
    for name in ("scripts",):  # the source_dir the notebooks upload (../scripts); the rest is imported by name
        link = dest / name
        if not link.exists():
            link.symlink_to(REPO / name, target_is_directory=True)
    folder = dest / "notebooks"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")):
        nb = load_notebook_node(str(path))  # papermill's reader: adds the metadata it works with
        checked = [i for i, cell in enumerate(nb.cells) if is_checked(cell)]
        if not checked or nb.metadata.get("kernelspec", {}).get("name") != kernel:
            continue
        nb.cells = nb.cells[: checked[-1] + 1]
        if extra_source is not None:
            nb.cells.append(new_code_cell(extra_source(path.name), metadata={"tags": []}))
        nb = parameterize_notebook(nb, {"run_mode": "local", "work_dir": str(work_dir)})
        nbformat.write(nb, str(folder / path.name))
        written.append(folder / path.name)
    return written


def kernel_environment(local_root: Path) -> dict:
    """Environment for notebook kernels running against an earlier run's local-mode root."""
    import os

    env = dict(os.environ)
    env.update(
        {
            "SAGEMAKER_LOCAL_ROOT": str(local_root),
            "NOTEBOOK_PLAIN_OUTPUT": "1",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "SAGEMAKER_SUPPRESS_V2_WARNING": "1",
            "PYTHONPATH": str(REPO),
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        }
    )
    return env


def refresh(run_out: Path) -> dict[str, dict[str, list]]:
    """Execute the cut notebooks against ``run_out`` (a main-job output folder); their checked outputs."""
    import os
    import tempfile

    import papermill

    collected = {}
    saved = dict(os.environ)
    os.environ.update(kernel_environment(run_out / "sagemaker-local"))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for kernel in KERNELS:
                for cut in cut_notebooks(Path(tmp) / kernel, run_out / "work", kernel=kernel):
                    executed = cut.with_suffix(".out.ipynb")
                    papermill.execute_notebook(
                        str(cut), str(executed), cwd=str(cut.parent), kernel_name=kernel, progress_bar=False
                    )
                    collected[cut.name] = checked_outputs_of(executed)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return collected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Strip notebook outputs; refresh the outputs nbval checks.")
    parser.add_argument("command", choices=["strip", "refresh"])
    parser.add_argument(
        "run_out", nargs="?", help="output folder of a main-job run, e.g. outputs/main-tiny (for 'refresh')"
    )
    args = parser.parse_args(argv)
    if args.command == "refresh" and not args.run_out:
        parser.error("refresh needs the output folder of a main-job run, e.g. outputs/main-tiny")
    collected = refresh(Path(args.run_out).resolve()) if args.command == "refresh" else {}
    for path in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        outputs = collected.get(path.name)
        nbformat.write(strip(nb, outputs), str(path))
        print(f"{path.relative_to(REPO)}: {'stored checked outputs, ' if outputs else ''}stripped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
