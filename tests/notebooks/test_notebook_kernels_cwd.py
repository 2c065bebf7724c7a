"""The main job runs its two lanes of notebooks in threads of one process: each kernel must start in
notebooks/ whatever the process's working directory, and running a notebook must not change it (a
lane that did would start the other lane's next kernel in the wrong folder)."""

from __future__ import annotations

import os
import threading

import nbformat

from tools import run_notebooks


def test_each_kernel_starts_in_notebooks_and_the_process_stays_where_it_was(tmp_path, monkeypatch):
    notebook = tmp_path / "99_where.ipynb"
    cell = "import os, time\nprint(os.getcwd())\ntime.sleep(3)"
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)], metadata=kernel), str(notebook))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (tmp_path / "notebooks").mkdir()

    seen, entry = set(), {}
    runner = threading.Thread(
        target=lambda: entry.update(run_notebooks.execute(notebook, tmp_path, tmp_path / "work", "tiny", 120))
    )
    runner.start()
    while runner.is_alive():  # what another lane's thread would see while this notebook runs
        seen.add(os.getcwd())
        runner.join(0.05)
    assert entry["status"] == "ok", entry.get("error")
    assert seen == {str(elsewhere)}
    executed = nbformat.read(str(tmp_path / "notebooks" / notebook.name), as_version=4)
    printed = [o["text"].strip() for c in executed.cells if c.cell_type == "code" for o in c.outputs if "text" in o]
    assert printed == [str(run_notebooks.NOTEBOOK_DIR)]
