"""Clean notebook diffs: outputs are stripped in git, except the cells whose output is checked.

Rules (enforced by tests/notebooks/test_notebook_hygiene.py):
- the first code cell is tagged ``parameters`` (papermill) and holds the cloud defaults;
- the notebook names its kernel (``kernelspec`` python3) and ``language_info``;
- no execution counts and no outputs, except in cells that start with ``# NBVAL_CHECK_OUTPUT``:
  they keep the output of a local-mode run with the CI parameters, which nbval compares
  (after ``tests/notebooks/nbval_sanitize.cfg`` replaces job names, timestamps and buckets).

    python -m helpers.notebook_hygiene strip                      # strip every notebook in notebooks/
    python -m helpers.notebook_hygiene store outputs/main/notebooks
        # strip, and take the checked cells' outputs from the executed copies of `make main`
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
CHECK_MARK = "# NBVAL_CHECK_OUTPUT"


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
            for output in cell.outputs:
                if "execution_count" in output:
                    output["execution_count"] = None
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
        if cell.execution_count is not None:
            found.append(f"cell {number} has an execution count (strip it)")
        if is_checked(cell):
            if not cell.outputs:
                found.append(f"cell {number} is checked by nbval but stores no output "
                             f"(python -m helpers.notebook_hygiene store <executed notebooks>)")
        elif cell.outputs:
            found.append(f"cell {number} keeps outputs (python -m helpers.notebook_hygiene strip)")
    return found


def checked_outputs_of(executed: Path) -> dict[str, list]:
    nb = nbformat.read(str(executed), as_version=4)
    outputs = {cell.id: cell.outputs for cell in nb.cells if is_checked(cell)}
    for cell_id, cell_outputs in outputs.items():
        if not cell_outputs or any(o.get("output_type") == "error" for o in cell_outputs):
            raise ValueError(f"{executed}: checked cell {cell_id} did not run cleanly; run the notebook first")
    return outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Strip notebook outputs; store the outputs nbval checks.")
    parser.add_argument("command", choices=["strip", "store"])
    parser.add_argument("executed", nargs="?", help="folder of executed notebooks (for 'store')")
    args = parser.parse_args(argv)
    if args.command == "store" and not args.executed:
        parser.error("store needs the folder of executed notebooks, e.g. outputs/main/notebooks")
    for path in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        outputs = checked_outputs_of(Path(args.executed) / path.name) if args.command == "store" else None
        nbformat.write(strip(nb, outputs), str(path))
        print(f"{path.relative_to(REPO)}: {'stored checked outputs, ' if outputs else ''}stripped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
