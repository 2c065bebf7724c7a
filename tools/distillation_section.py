"""docs/BENCHMARKS.md's distillation figures (notebook 16 against GRPO), rendered from the kept summaries of
the runs they come from rather than typed by hand: each run's model, date and machine, then the lines the
main job's summary prints for notebook 16 (the teacher and the target, the reverse KL, each run's held-out
curve and where it first reached the target, the student's paired change).

    python -m tools.distillation_section --write docs/BENCHMARKS.md
    python -m tools.distillation_section --check docs/BENCHMARKS.md   # exit 1 if the docs differ

``tests/notebooks/test_results_table.py`` checks that the docs hold the rendering.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from helpers.training_sessions.records import held_out_lines, notebook_lines
from tools.results_table import replace_between_markers

REPO = Path(__file__).resolve().parents[1]
BEGIN = "<!-- distillation:begin -->"
END = "<!-- distillation:end -->"
NOTEBOOK = "16_training_session_distillation"
# The runs the section shows, each kept by ``python -m tools.results_table <run>/summary.json --keep ...``.
RUNS = ("docs/runs/main-tiny.json", "docs/runs/main-smollm2-16.json")


def render_run(summary: dict) -> list[str]:
    """One run's block: its provenance, then notebook 16's lines as the summary prints them."""
    (record,) = [s for s in summary.get("training_sessions") or [] if s["notebook"] == NOTEBOOK]
    where = summary["provenance"]
    lines = [
        f"Model `{where['model']}`, run of {where['date']} on {where['machine']['cpu']}, "
        f"{where['machine']['cores']} cores; {record['steps']} steps:",
        "",
    ]
    first, *rest = held_out_lines(record["held_out"])
    lines += [f"- student: {first}", *(f"  - {line}" for line in rest)]
    return lines + [f"- {line}" for line in notebook_lines(record)]


def render(paths: tuple[str, ...] = RUNS) -> str:
    blocks = ["\n".join(render_run(json.loads((REPO / path).read_text()))) for path in paths]
    return "\n\n".join(blocks) + "\n"


def replace(text: str, block: str) -> str:
    return replace_between_markers(text, block, BEGIN, END)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", type=Path, help="put the figures between the marker comments of this file")
    parser.add_argument("--check", type=Path, help="exit 1 if this file's figures are not the rendering")
    args = parser.parse_args(argv)
    block = render()
    if args.write:
        args.write.write_text(replace(args.write.read_text(), block))
    if args.check and replace(args.check.read_text(), block) != args.check.read_text():
        print(f"{args.check}: the distillation figures differ from the kept runs' rendering", file=sys.stderr)
        return 1
    if not (args.write or args.check):
        print(block, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
