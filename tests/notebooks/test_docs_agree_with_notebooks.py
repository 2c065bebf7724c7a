"""What the README and notebooks/README.md state about the notebooks, checked against the notebooks and the
code: the list of notebooks, each one's kernel, and how many data sets notebook 00 stages. A new notebook,
a kernel moved or a data set added fails here until the text says so."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[2]
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}


def notebooks() -> list[Path]:
    return sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def kernel(path: Path) -> str:
    return nbformat.read(str(path), as_version=4).metadata["kernelspec"]["name"]


def staged_data_sets() -> list[str]:
    """The data sets notebook 00 stages in the cloud: its staging loop runs over ``data_prep.data_sets``
    (read from its code), which offline adds the sets that exist offline only."""
    from helpers import data_prep

    source = "\n".join(
        c.source for c in nbformat.read(str(notebooks()[0]), as_version=4).cells if c.cell_type == "code"
    )
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.For) and ast.unparse(node.iter) == "data_prep.data_sets(data_source)":
            return data_prep.data_sets("hub")
    raise AssertionError("notebook 00 has no loop over the data sets it stages")


def test_the_readme_maps_every_notebook_in_order_with_its_kernel():
    rows = re.findall(
        r"^\| \[(\d\d)\]\(notebooks/([^)]+\.ipynb)\) \|.*\| `([\w-]+)` \|$", (REPO / "README.md").read_text(), re.M
    )
    assert [(file, name) for _, file, name in rows] == [(p.name, kernel(p)) for p in notebooks()]
    assert all(file.startswith(number) for number, file, _ in rows)


def test_the_notebooks_readme_has_a_row_for_every_notebook_in_order():
    rows = re.findall(r"^\| `(\d\d_[^`]+\.ipynb)` \|", (REPO / "notebooks" / "README.md").read_text(), re.M)
    assert rows == [p.name for p in notebooks()]


def test_the_kernels_the_notebooks_readme_names_are_the_notebooks_own():
    text = (REPO / "notebooks" / "README.md").read_text()
    found = re.search(r"Notebooks ([\d\-, and]+) run in the kernel `([\w-]+)`.*?notebooks ([\d\-, and]+) in the kernel[^`]*`([\w-]+)`", text, re.S)  # fmt: skip
    assert found, "notebooks/README.md no longer says which kernel runs which notebooks"

    def numbers(text: str) -> set[str]:
        named = set()
        for first, _, last in re.findall(r"(\d\d)(-(\d\d))?", text):
            named |= {f"{n:02d}" for n in range(int(first), int(last or first) + 1)}
        return named

    said = {n: found.group(2) for n in numbers(found.group(1))} | {n: found.group(4) for n in numbers(found.group(3))}
    assert said == {p.name[:2]: kernel(p) for p in notebooks()}


def test_the_count_of_data_sets_the_docs_give_is_what_notebook_00_stages():
    staged = staged_data_sets()
    for path in (REPO / "README.md", REPO / "notebooks" / "README.md"):
        stated = re.findall(r"\b(one|two|three|four|five|six|seven|eight|nine) data sets\b", path.read_text())
        assert stated, f"{path.name} no longer says how many data sets notebook 00 stages"
        assert {NUMBERS[word] for word in stated} == {len(staged)}, (path.name, stated, staged)
    listed = re.search(r"data sets \(([^)]*)\)", (REPO / "notebooks" / "README.md").read_text()).group(1)
    assert re.findall(r"`(\w+)`", listed) == staged
    from helpers import data_prep

    for offline_only in data_prep.OFFLINE_ONLY:  # named beside them, as offline only
        assert f"offline also `{offline_only}`" in (REPO / "notebooks" / "README.md").read_text()


def parameter_names(path: Path) -> set[str]:
    nb = nbformat.read(str(path), as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    return {node.targets[0].id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)}


def test_every_notebook_ends_with_exercises_on_its_own_parameters_and_links_to_its_neighbours():
    paths = notebooks()
    for index, path in enumerate(paths):
        last = nbformat.read(str(path), as_version=4).cells[-1]
        assert last.cell_type == "markdown" and last.source.startswith("## Try next"), path.name
        exercises = [line for line in last.source.splitlines() if line.startswith("- ")]
        assert 2 <= len(exercises) <= 3, (path.name, exercises)
        for exercise in exercises:  # each names a parameter the notebook has, and what to watch
            assert set(re.findall(r"`(\w+)", exercise)) & parameter_names(path), (path.name, exercise)
            assert "watch" in exercise or "check" in exercise or "compare" in exercise, (path.name, exercise)
        neighbours = [p.name for p in paths[max(0, index - 1) : index]] + [p.name for p in paths[index + 1 : index + 2]]
        assert re.findall(r"\]\((\d\d_[^)]+\.ipynb)\)", last.source) == neighbours, path.name
