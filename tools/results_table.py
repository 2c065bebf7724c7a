"""The README's results table, rendered from a run's ``summary.json`` rather than typed by hand.

    python -m tools.results_table outputs/main/summary.json                      # print the table
    python -m tools.results_table outputs/main/summary.json \\
        --keep docs/runs/main-smollm2.json --whole-sets --write README.md          # what the README shows

One row per held-out figure of the run (a figure measured on data the loop never trained on):
the notebook, what is measured, the figure before and after training with one standard error each,
the change with its standard error where the summary has one (paired: the same problems and draws
before and after), whether the change counts as a gain (``verdict``), and, for figures of answers, how
varied the answers were: the number of distinct answers and the share of the most common one. Above
the table, a line names the run's model, date and machine.

``--keep`` stores a copy of the summary with that provenance added and this machine's absolute paths
removed: the copy in the repository is the source of the README's figures, and
``tests/notebooks/test_results_table.py`` checks that the README's table is its rendering.
``--times`` renders, instead, each notebook's wall time in its lane (``render_times``); ``--curves`` what
each loop's curves did, first quarter of the steps against the last, as the run's summary says it
(``render_curves``).
``--whole-sets`` leaves out the rows of a held-out set's seen and unseen templates: the README gives the
whole sets, docs/REAL_MODEL_RUN.md the same run's table with them.
``--write`` puts the table between the README's marker comments; ``--check`` exits 1 if the README's
table differs from the rendering.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
from pathlib import Path

# The rows are the ones a notebook's "What you saw" cell shows: one module builds them for both.
from helpers.results import rows
from tools import training_session_notebooks as session_notebooks

REPO = Path(__file__).resolve().parents[1]
BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"

# ---------------------------------------------------------------- provenance


def machine() -> dict:
    """This machine's CPU model (from /proc/cpuinfo) and core count."""
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu or "unknown CPU", "cores": os.cpu_count()}


def provenance(summary: dict, summary_file: Path | None = None) -> dict:
    """The run's model, date and machine: as stored in the summary, or else this machine's and the
    summary file's modification date (the run that wrote it ran here)."""
    stored = dict(summary.get("provenance") or {})
    if "date" not in stored:
        when = summary_file.stat().st_mtime if summary_file and summary_file.exists() else None
        stored["date"] = datetime.datetime.fromtimestamp(when, datetime.UTC).date().isoformat() if when else "unknown"
    stored.setdefault("machine", machine())
    stored.setdefault("model", summary.get("model") or "tiny")
    return stored


def strip_paths(value, replacements: dict[str, str]):
    """``value`` with each absolute path of this machine replaced by a relative name."""
    if isinstance(value, dict):
        return {k: strip_paths(v, replacements) for k, v in value.items()}
    if isinstance(value, list):
        return [strip_paths(v, replacements) for v in value]
    if isinstance(value, str):
        for absolute, relative in replacements.items():
            value = value.replace(absolute, relative)
        # anything else absolute under a home or temporary folder: keep the last part only
        return re.sub(
            r"(?<![^\s'\"(=])/(?:tmp|home|root|work|Users|var)/[^\s'\"]*?([^/\s'\"]+)(?=$|[\s'\"])", r"\1", value
        )
    return value


def kept_copy(summary: dict, summary_file: Path) -> dict:
    """The summary as the repository keeps it: its provenance added, absolute paths removed."""
    run_dir = str(summary_file.resolve().parent)
    replacements = {run_dir: "<run>", str(REPO): "."}
    copy = strip_paths(summary, replacements)
    copy["provenance"] = provenance(summary, summary_file)
    return copy


# ---------------------------------------------------------------- rendering


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(summary: dict, summary_file: Path | None = None, splits: bool = True) -> str:
    """The markdown the README shows: the provenance line, then the table. ``splits=False`` leaves out the
    rows of a held-out set's parts (its seen and unseen templates), for a page that gives the whole sets."""
    p = provenance(summary, summary_file)
    m = p.get("machine") or {}
    cores = m.get("cores")
    notebooks = summary.get("notebooks") or []
    ran = sum(1 for n in notebooks if n.get("status") == "ok")
    lines = [
        f"Model `{p['model']}`, run of {p['date']} on {m.get('cpu', 'unknown CPU')}"
        + (f", {cores} cores" if cores else "")
        + (f"; {ran} of {len(notebooks)} notebooks ran" if notebooks else "")
        + ". ± one standard error; a change with ± is paired (the same problems and draws before and after). "
        "A change counts as a gain beyond two of its standard errors, and never when most answers after "
        "training are one answer (collapsed)."
        + ("" if splits else " Whole held-out sets only: their seen and unseen templates apart are left out here."),
        "",
        "| notebook | what is measured | before | after | change | counts? | distinct answers | most common answer's share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows(summary):
        if row["split"] and not splits:
            continue
        cells = (row[k] for k in ("notebook", "what", "before", "after", "change", "verdict", "distinct", "share"))
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def render_times(summary: dict) -> str:
    """Where a run's time went: each notebook's wall time in its lane. After notebook 00 the two lanes run
    side by side and share the cores, so a notebook's time depends on what ran beside it."""
    seconds = {n["notebook"].removesuffix(".ipynb"): n for n in summary.get("notebooks") or []}
    lines = [
        f"Wall time of the whole run: {summary['seconds']:.0f} s ({summary['seconds'] / 60:.1f} min); notebook 00 "
        "first, then the two lanes side by side.",
        "",
        "| lane | notebook | status | seconds |",
        "|---|---|---|---|",
    ]
    lanes = summary.get("lanes") or []
    first = [name for name in seconds if not any(name in lane for lane in lanes)]
    named = [
        ("session notebooks" if lane[0][:2] in session_notebooks.NOTEBOOKS else "job notebooks", lane) for lane in lanes
    ]
    for lane_name, lane in [("first", first), *named]:
        ran = [seconds[name] for name in lane if name in seconds]
        for n in ran:
            lines.append(
                f"| {lane_name} | {n['notebook'].removesuffix('.ipynb')} | {n['status']} | {n['seconds']:.0f} |"
            )
        if ran and lane_name != "first":
            lines.append(f"| {lane_name} | all, one after another | | **{sum(n['seconds'] for n in ran):.0f}** |")
    return "\n".join(lines) + "\n"


def render_curves(summary: dict) -> str:
    """What each loop's curves did in a run, as its summary says it: every training job's curve (the mean of
    the first quarter of the steps -> the last quarter, and whether it moved the way it should), then each
    training session's lines without its billing."""
    from tools.run_notebooks import render_curve

    p = provenance(summary)
    m = p.get("machine") or {}
    lines = [
        f"Model `{p['model']}`, run of {p['date']} on {m.get('cpu', 'unknown CPU')}"
        + (f", {m['cores']} cores" if m.get("cores") else "")
        + ". Training jobs, the mean of the first quarter of the steps -> the last quarter:",
        "",
        *(render_curve(c) for c in summary.get("curves") or []),
    ]
    sessions = session_notebooks.render(summary.get("training_sessions") or [])
    if sessions:
        lines += ["", "Training sessions:", ""]
        lines += [line for line in sessions[3:] if not line.startswith("  - billable tokens:")]
    return "\n".join(lines) + "\n"


def replace_between_markers(text: str, block: str, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with what lies between the marker comments ``begin`` and ``end`` replaced by ``block``:
    every generated part of the docs is written this way (this table, BENCHMARKS' sections)."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"no {begin} ... {end} pair to write the generated part between")
    return text[: start + len(begin)] + "\n" + block + text[stop:]


def between_markers(text: str, begin: str = BEGIN, end: str = END) -> str:
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"no {begin} ... {end} pair")
    return text[start + len(begin) : stop].lstrip("\n")


def markers(name: str) -> tuple[str, str]:
    """The marker comments of a generated block: ``results`` is the README's table."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary", type=Path, help="a run's summary.json (or a kept copy of one)")
    parser.add_argument(
        "--keep", type=Path, help="write the summary's copy, with provenance and no absolute paths, here"
    )
    parser.add_argument("--write", type=Path, help="put the table between the marker comments of this file")
    parser.add_argument("--check", type=Path, help="exit 1 if this file's table is not the rendering")
    parser.add_argument(
        "--markers",
        default="results",
        help="the name in the marker comments <!-- NAME:begin --> ... <!-- NAME:end --> (default: %(default)s)",
    )
    parser.add_argument(
        "--whole-sets",
        action="store_true",
        help="leave out the rows of a held-out set's seen and unseen templates (the README's table)",
    )
    parser.add_argument(
        "--times", action="store_true", help="render where the run's time went (render_times), not its results"
    )
    parser.add_argument(
        "--curves", action="store_true", help="render what each loop's curves did (render_curves), not its results"
    )
    args = parser.parse_args(argv)
    begin, end = markers(args.markers)
    summary = json.loads(args.summary.read_text())
    if args.keep:
        summary = kept_copy(summary, args.summary)
        args.keep.parent.mkdir(parents=True, exist_ok=True)
        args.keep.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    if args.times:
        block = render_times(summary)
    elif args.curves:
        block = render_curves(summary)
    else:
        block = render(summary, args.summary, splits=not args.whole_sets)
    if args.check:
        if between_markers(args.check.read_text(), begin, end) != block:
            print(f"{args.check}: the results table is not the rendering of {args.summary}", file=sys.stderr)
            return 1
        return 0
    if args.write:
        args.write.write_text(replace_between_markers(args.write.read_text(), block, begin, end))
    else:
        print(block, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
