"""One name for each concept, across the scripts, the session loops' building blocks, the notebooks'
parameters and the runner's CI parameters:

- ``group_size``: completions sampled per prompt (TRL's ``num_generations``, said once in ``grpo.py``'s
  help; ``--num_generations`` still works for a release, with a deprecation line);
- ``prompts_per_step``: prompts (problems) per RL step; ``batch_size`` is only SFT's conversations and
  DPO's pairs per optimizer step;
- ``max_steps``: optimizer steps (13 prefixes the SFT jobs' options with ``sft_``);
- ``test_pass_fraction`` (mean share of a program's tests that pass, the training metric) and the
  solve rate (share of problems whose program passes every test, held out), never "pass rate".
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CODE = sorted([*(ROOT / "scripts").rglob("*.py"), *(ROOT / "helpers" / "training_sessions").rglob("*.py")])

# Old names that may appear only where they are the deprecated alias or TRL's keyword.
OLD_NAMES = re.compile(r"num_generations|problems_per_step|pass_rate|pass rate")
ALLOWED = (
    'old_names=("num_generations",)',  # grpo.py's deprecated alias
    "(TRL calls it num_generations)",  # said once, in the option's help
)
RETIRED_PARAMETERS = {"num_generations", "problems_per_step", "steps", "sft_steps"}
# An RL notebook's prompts per step is prompts_per_step; batch_size is examples per optimizer step.
SUPERVISED = {"01", "02", "07", "11", "12"}


def parameters(path: Path) -> dict[str, ast.expr]:
    notebook = nbformat.read(path, as_version=4)
    cell = next(c for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
    return {
        target.id: node.value
        for node in ast.parse(cell.source).body
        if isinstance(node, ast.Assign)
        for target in node.targets
    }


def stray_old_names(text: str) -> list[str]:
    return [
        line.strip() for line in text.splitlines() if OLD_NAMES.search(line) and not any(a in line for a in ALLOWED)
    ]


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_scripts_and_session_loops_use_one_name_each(path):
    assert stray_old_names(path.read_text()) == []


def test_only_sft_and_dpo_have_a_batch_size():
    """Their examples (conversations, pairs) per optimizer step; evaluate.py's is generate_batch_size."""
    declared = {
        p.name for p in (ROOT / "scripts").glob("*.py") if re.search(r"^    batch_size: int", p.read_text(), re.M)
    }
    assert declared == {"sft.py", "dpo.py"}


def test_the_alias_and_trls_name_are_said_once():
    grpo = (ROOT / "scripts" / "grpo.py").read_text()
    assert grpo.count("num_generations") == 2  # the alias, and the help that names TRL's keyword
    assert all("num_generations" not in p.read_text() for p in CODE if p.name != "grpo.py")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_notebook_parameters_use_one_name_each(path):
    names = set(parameters(path))
    assert names & RETIRED_PARAMETERS == set()
    if path.name[:2] not in SUPERVISED:
        assert "batch_size" not in names, "an RL notebook's prompts per step is prompts_per_step"
    if "group_size" in names and path.name[:2] != "13":  # 13's group is the judge's, not an RL step's
        assert "prompts_per_step" in names and "max_steps" in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_notebook_code_and_text_use_one_name_each(path):
    notebook = nbformat.read(path, as_version=4)
    assert [line for cell in notebook.cells for line in stray_old_names(cell.source)] == []


def test_the_runners_parameters_use_the_notebooks_names():
    from tools import run_notebooks

    for profile in (run_notebooks.CI_PARAMETERS, run_notebooks.SMOLLM2_PARAMETERS):
        for number, values in profile.items():
            assert set(values) & RETIRED_PARAMETERS == set(), number
            if number not in SUPERVISED:
                assert "batch_size" not in values, number


def test_the_deprecated_flag_still_works_and_names_the_new_one(capsys):
    import grpo

    args = grpo.parse_args(["--num_generations", "4", "--prompts_per_step", "4"])
    assert args.group_size == 4
    assert capsys.readouterr().err.strip() == (
        "--num_generations is deprecated and goes in the next release: use --group_size (same value)."
    )
    assert grpo.parse_args(["--group_size", "4"]).group_size == 4 and capsys.readouterr().err == ""
