"""Show a piece of a training script in the notebook, read from the file itself.

The notebooks explain the scripts that run in the training container without copying
them: a function, a class or a method is found with ``ast`` (so the excerpt is always the
code that runs), and any other stretch of a file by the first lines that open and close it.

    show("scripts/grpo.py", "grpo_loss")             # a function
    show("scripts/sft.py", "main")                    # or a class, or "Class.method"
    show("scripts/grpo.py", start="for step in", end="policy_update(")

``preview(text)`` shows a model's answer on one line, whatever it holds.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(repr=False)
class Excerpt:
    path: Path
    first_line: int  # 1-based
    text: str

    @property
    def header(self) -> str:
        last = self.first_line + self.text.count("\n")
        return f"{_relative(self.path)}, lines {self.first_line}-{last}"

    def _repr_markdown_(self) -> str:
        return f"**{self.header}**\n\n```python\n{self.text}\n```"

    def __str__(self) -> str:
        return f"# {self.header}\n{self.text}"

    __repr__ = __str__


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _resolve(script: str | Path) -> Path:
    """``script`` as given (absolute, or relative to the working directory, as in a notebook:
    ``../scripts/sft.py``), else relative to the repository root (``scripts/sft.py``)."""
    for path in (Path(script), REPO / script):
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"No script at {script}: give a path relative to the working directory "
        f"('../scripts/sft.py' from notebooks/) or to the repository root ('scripts/sft.py')."
    )


def find_definition(script: str | Path, name: str) -> Excerpt:
    """The source of function/class ``name`` (``"Class.method"`` for a method), decorators included."""
    path = _resolve(script)
    source = path.read_text(encoding="utf-8")
    scope: list[ast.stmt] = ast.parse(source, filename=str(path)).body
    node = None
    for part in name.split("."):
        node = next(
            (
                n
                for n in scope
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part
            ),
            None,
        )
        if node is None:
            defined = sorted(
                n.name for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            )
            raise LookupError(f"{_relative(path)} defines no '{part}' here; it defines: {', '.join(defined)}")
        scope = node.body
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    lines = source.splitlines()[first - 1 : node.end_lineno]
    return Excerpt(path, first, "\n".join(lines))


def find_region(script: str | Path, start: str, end: str | None = None) -> Excerpt:
    """Lines from the first one containing ``start`` to the next one containing ``end``
    (inclusive); without ``end``, to the end of the indented block that ``start`` opens."""
    path = _resolve(script)
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        begin = next(i for i, line in enumerate(lines) if start in line)
    except StopIteration:
        raise LookupError(f"No line of {_relative(path)} contains {start!r}") from None
    if end is not None:
        try:
            stop = next(i for i in range(begin + 1, len(lines)) if end in lines[i])
        except StopIteration:
            raise LookupError(f"No line after line {begin + 1} of {_relative(path)} contains {end!r}") from None
    else:
        indent = len(lines[begin]) - len(lines[begin].lstrip())
        stop = begin
        for i in range(begin + 1, len(lines)):
            if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= indent:
                break
            stop = i
        while stop > begin and not lines[stop].strip():
            stop -= 1
    return Excerpt(path, begin + 1, "\n".join(lines[begin : stop + 1]))


def show(script: str | Path, name: str | None = None, *, start: str | None = None, end: str | None = None) -> None:
    """Display a definition by ``name`` or a region by ``start``/``end`` markers
    (``find_definition``/``find_region`` return the excerpt instead)."""
    if (name is None) == (start is None):
        raise ValueError("Give either the name of a function/class or start= (and optionally end=).")
    _display(find_definition(script, name) if name else find_region(script, start, end))


def _display(excerpt: Excerpt) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        print(excerpt)
        return
    if get_ipython() is None:
        print(excerpt)
    else:
        display(excerpt)  # Markdown where rendered, the plain text elsewhere


_REPEATS = re.compile(r"(.{1,12}?)\1{3,}", re.DOTALL)  # a unit of up to 12 characters, 4 times or more


def preview(text: str, width: int = 100) -> str:
    """A model's answer on one line: quoted with its escapes (a newline shows as \\n), a run of 16 characters
    or more that repeats one short piece written once with its count (``[\\n]×40``), and cut at ``width``
    characters with "…". A small model's answer is often hundreds of newlines or one word over and over;
    the cell keeps one line an answer."""

    def collapsed(run: re.Match) -> str:
        whole, piece = run.group(0), run.group(1)
        return f"[{piece}]×{len(whole) // len(piece)}" if len(whole) >= 16 else whole  # "####", "1000000" stay

    shown = _REPEATS.sub(collapsed, repr(text))
    return shown if len(shown) <= width else shown[: width - 1] + "…"
