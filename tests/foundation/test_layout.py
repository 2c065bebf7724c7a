"""The layout's promises: the workshop, the emulator and the tools import each other one way, the
session service loads nothing of the job emulator, and nothing edits ``sys.path``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("helpers", "local_mode", "tools", "bench")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path) -> set[str]:
    """The project modules ``path`` imports when it is imported: module-level statements only (an import
    inside a function runs later, one under ``if TYPE_CHECKING`` never)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {m for m in found if m.split(".")[0] in PACKAGES}


def graph() -> dict[str, set[str]]:
    files = [p for package in PACKAGES for p in (REPO / package).rglob("*.py")]
    modules = {module_name(p): p for p in files}
    # A module's own packages are loaded before it whatever it imports: an edge to them is no cycle.
    return {
        name: {m for m in top_level_imports(path) if m in modules and m != name and not name.startswith(m + ".")}
        for name, path in modules.items()
    }


def test_no_module_imports_itself_through_others():
    edges = graph()
    assert len(edges) > 50 and edges["tools.run_notebooks"]  # the graph was read
    done: set[str] = set()

    def visit(node: str, trail: list[str]) -> None:
        for target in sorted(edges[node]):
            assert target not in trail, "import cycle: " + " -> ".join(trail[trail.index(target) :] + [target])
            if target not in done:
                visit(target, trail + [target])
        done.add(node)

    for node in sorted(edges):
        if node not in done:
            visit(node, [node])


def test_the_emulator_imports_nothing_of_the_workshop_or_its_tools():
    """local_mode stands in for AWS and the internet: it knows nothing of what runs on it."""
    offenders = {
        name: sorted(m for m in targets if m.startswith(("helpers", "tools", "bench")))
        for name, targets in graph().items()
        if name.startswith("local_mode")
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_importing_the_session_service_loads_nothing_of_the_job_emulator():
    code = (
        "import sys; import local_mode.session_service.server, local_mode.session_service.engine; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('local_mode'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "local_mode.session_service.engine" in loaded  # the probe itself worked
    # server.py answers the training-job operations too, and loads them when it starts serving
    assert not [m for m in loaded if m.startswith("local_mode.jobs")], loaded


def test_nothing_but_the_container_side_edits_sys_path():
    """Notebooks, tests and benchmarks import by name (the project is installed in each environment);
    only scripts/ may, where a container needs it (the sandbox's fork servers run by path)."""
    editing = []
    for folder in ("notebooks", "helpers", "local_mode", "tools", "bench", "tests"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".py", ".ipynb") and path != Path(__file__).resolve():
                text = path.read_text()
                if "sys.path.insert" in text or "sys.path.append" in text or "sys.path[" in text:
                    editing.append(str(path.relative_to(REPO)))
    assert editing == []
