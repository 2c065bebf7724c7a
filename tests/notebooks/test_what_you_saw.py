"""Every notebook ends with what its run showed: a "## What you saw" markdown cell, then a code cell that
calls ``what_you_saw`` with the notebook's own name (its figures, computed, never typed), both before
"## Try next"."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def heading(cell: dict) -> str:
    return "".join(cell["source"]).lstrip() if cell["cell_type"] == "markdown" else ""


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_the_notebook_ends_with_what_you_saw_before_try_next(notebook):
    assert len(NOTEBOOKS) >= 17  # the folder was found
    cells = json.loads(notebook.read_text())["cells"]
    saw = [i for i, cell in enumerate(cells) if heading(cell).startswith("## What you saw")]
    try_next = [i for i, cell in enumerate(cells) if heading(cell).startswith("## Try next")]
    assert len(saw) == 1, f"{notebook.name}: one '## What you saw' markdown cell, found {len(saw)}"
    assert len(try_next) == 1, f"{notebook.name}: one '## Try next' markdown cell, found {len(try_next)}"
    assert saw[0] < try_next[0], f"{notebook.name}: 'What you saw' comes before 'Try next'"
    call = cells[saw[0] + 1]
    assert call["cell_type"] == "code", f"{notebook.name}: a code cell follows '## What you saw'"
    source = "".join(call["source"])
    assert "from helpers.what_you_saw import what_you_saw" in source
    calls = re.findall(r'^what_you_saw\("([^"]+)", work_dir\)$', source, flags=re.MULTILINE)
    assert calls == [notebook.stem], f"{notebook.name}: the cell calls what_you_saw({notebook.stem!r}, work_dir)"
    between = [cell for cell in cells[saw[0] + 2 : try_next[0]] if cell["cell_type"] == "code"]
    assert not between, f"{notebook.name}: no code runs between the figures and 'Try next'"
