"""The README's results table, rendered from a run's ``summary.json`` rather than typed by hand.

    python -m tools.results_table outputs/main/summary.json                      # print the table
    python -m tools.results_table outputs/main/summary.json \\
        --keep docs/runs/main-tiny.json --write README.md                           # what the README shows

One row per held-out figure of the run (a figure measured on data the loop never trained on):
the notebook, what is measured, the figure before and after training with one standard error each,
the change with its standard error where the summary has one (paired: the same problems and draws
before and after), whether the change counts as a gain (``verdict``), and, for figures of answers, how
varied the answers were: the number of distinct answers and the share of the most common one. Above
the table, a line names the run's model, date and machine.

``--keep`` stores a copy of the summary with that provenance added and this machine's absolute paths
removed: the copy in the repository is the source of the README's figures, and
``tests/notebooks/test_results_table.py`` checks that the README's table is its rendering.
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


# ---------------------------------------------------------------- rows


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _with_error(value, error) -> str:
    value, error = _number(value), _number(error)
    if value is None:
        return "-"
    return f"{value:.3f} ± {error:.3f}" if error is not None else f"{value:.3f}"


def _change(before, after, change=None, error=None) -> str:
    change = _number(change)
    if change is None and _number(before) is not None and _number(after) is not None:
        change = _number(after) - _number(before)
    if change is None:
        return "-"
    error = _number(error)
    if error is None:
        return f"{change:+.3f}"
    size = f", {change / error:+.1f} s.e." if error else ""
    return f"{change:+.3f} ± {error:.3f}{size}"


def _diversity(record: dict, key: str, share: bool) -> str:
    """'before -> after' of one figure of the answers' diversity (``common.stats.answer_diversity``,
    kept by a paired change as ``before_answer_diversity`` and ``after_answer_diversity``); '-' where the
    record has none (a figure that is not of answers, or a run from before answers were counted)."""

    def show(diversity) -> str:
        value = _number(diversity.get(key)) if isinstance(diversity, dict) else None
        if value is None:
            return "-"
        return f"{value:.2f}" if share else f"{value:g}"

    before, after = record.get("before_answer_diversity"), record.get("after_answer_diversity")
    if before is None and after is None:
        return "-"
    return f"{show(before)} -> {show(after)}"


def verdict(
    change, error, after_answers: dict | None = None, answers: bool = True, lower_is_better: bool = False
) -> str:
    """Whether the run's change counts, by the rule every notebook applies (``common.stats``): beyond
    two paired standard errors, and, where the figure is of answers, the trained model's answers not
    collapsed into one. "-" where the summary has no paired standard error to judge the change by."""
    from common import stats

    change, error = _number(change), _number(error)
    if change is None or error is None:
        return "-"
    if answers:
        if isinstance(after_answers, dict) and stats.collapsed(after_answers):
            return "collapsed: not a gain"
        return "gain" if stats.counts_as_gain(change, error, after_answers) else "not a gain"
    gained = -change if lower_is_better else change
    return "gain" if error > 0 and gained > stats.GAIN_STANDARD_ERRORS * error else "not a gain"


def _row(notebook: str, what: str, before: str, after: str, change: str, record: dict, judged: str = "-") -> dict:
    return {
        "notebook": notebook,
        "what": what,
        "before": before,
        "after": after,
        "change": change,
        "verdict": judged,
        "distinct": _diversity(record, "distinct_answers", share=False),
        "share": _diversity(record, "most_common_share", share=True),
    }


def _notebook(name: str | None, fallback: str) -> str:
    return (name or fallback)[:2]


def rows(summary: dict) -> list[dict]:
    """The held-out figures of a summary, in notebook order."""
    found = []
    code = summary.get("code_rl_evaluation") or {}
    if _number(code.get("before")) is not None:
        found.append(
            _row(
                "04",
                f"code RL (training job): held-out pass rate, {code.get('examples', '?')} problems x "
                f"{code.get('samples_per_example', '?')} answer(s) at temperature {code.get('temperature', '?')}",
                _with_error(code["before"], code.get("before_standard_error")),
                _with_error(code.get("after"), code.get("after_standard_error")),
                _change(code["before"], code.get("after"), code.get("change"), code.get("change_standard_error")),
                code,
                verdict(code.get("change"), code.get("change_standard_error"), code.get("after_answer_diversity")),
            )
        )
    evaluation = summary.get("evaluation") or {}
    base, trained = evaluation.get("base") or {}, evaluation.get("trained") or {}
    paired = evaluation.get("held_out_change") or {}  # notebook 6's paired change, where the run kept one
    if _number(base.get("accuracy")) is not None or _number(trained.get("accuracy")) is not None:
        n = base.get("n", trained.get("n"))
        found.append(
            _row(
                "06",
                f"GSM8K held-out accuracy, {int(n) if _number(n) is not None else '?'} problems, greedy: "
                "the staged model -> the GRPO model",
                _with_error(base.get("accuracy"), base.get("standard_error")),
                _with_error(trained.get("accuracy"), trained.get("standard_error")),
                _change(
                    base.get("accuracy"),
                    trained.get("accuracy"),
                    paired.get("change"),
                    paired.get("change_standard_error"),
                ),
                paired or evaluation,
                verdict(
                    paired.get("change"), paired.get("change_standard_error"), paired.get("after_answer_diversity")
                ),
            )
        )
    for s in summary.get("training_sessions") or []:
        notebook = _notebook(s.get("notebook"), "??")
        loss = s.get("held_out_loss")
        if loss:
            before, after = loss.get("before") or {}, loss.get("after") or {}
            found.append(
                _row(
                    notebook,
                    f"SFT (training session): held-out loss per answer token, {after.get('conversations', '?')} "
                    "conversations (lower is better)",
                    _with_error(before.get("loss"), before.get("standard_error")),
                    _with_error(after.get("loss"), after.get("standard_error")),
                    _change(
                        before.get("loss"), after.get("loss"), loss.get("change"), loss.get("change_standard_error")
                    ),
                    loss,
                    verdict(loss.get("change"), loss.get("change_standard_error"), answers=False, lower_is_better=True),
                )
            )
        held_out = s.get("held_out")
        if held_out:
            kind = {"08": "GRPO", "09": "code RL"}.get(notebook, "training session")
            measure = held_out.get("measure") or ("pass rate" if notebook == "09" else "accuracy")
            found.append(
                _row(
                    notebook,
                    f"{kind} (training session): held-out {measure}, {held_out.get('problems', '?')} problems x "
                    f"{held_out.get('samples_per_problem', '?')} answer(s)",
                    _with_error(held_out.get("before"), held_out.get("before_standard_error")),
                    _with_error(held_out.get("after"), held_out.get("after_standard_error")),
                    _change(
                        held_out.get("before"),
                        held_out.get("after"),
                        held_out.get("change"),
                        held_out.get("change_standard_error"),
                    ),
                    held_out,
                    verdict(
                        held_out.get("change"),
                        held_out.get("change_standard_error"),
                        held_out.get("after_answer_diversity"),
                    ),
                )
            )
        preference = s.get("preference") or {}
        before, after = preference.get("held_out_before"), preference.get("held_out_after")
        if before and after:
            found.append(
                _row(
                    notebook,
                    f"DPO (training session): held-out likelihood accuracy, {after.get('pairs', '?')} pairs "
                    "(chosen more likely than rejected)",
                    _with_error(before.get("likelihood_accuracy"), before.get("likelihood_accuracy_se")),
                    _with_error(after.get("likelihood_accuracy"), after.get("likelihood_accuracy_se")),
                    _change(
                        before.get("likelihood_accuracy"),
                        after.get("likelihood_accuracy"),
                        preference.get("held_out_change"),
                        preference.get("held_out_change_se"),
                    ),
                    preference,
                    verdict(preference.get("held_out_change"), preference.get("held_out_change_se"), answers=False),
                )
            )
    teacher = summary.get("teacher_and_judge") or {}
    for name, accuracy in (teacher.get("held_out_accuracy") or {}).items():
        found.append(
            _row(
                "13",
                f"GSM8K held-out accuracy, {accuracy.get('n', '?')} problems, greedy, after SFT on the {name} answers",
                "-",
                _with_error(accuracy.get("accuracy"), accuracy.get("standard_error")),
                "-",
                accuracy,
            )
        )
    return sorted(found, key=lambda row: row["notebook"])  # stable: a notebook's rows keep their order


# ---------------------------------------------------------------- rendering


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(summary: dict, summary_file: Path | None = None) -> str:
    """The markdown the README shows: the provenance line, then the table."""
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
        "training are one answer (collapsed).",
        "",
        "| notebook | what is measured | before | after | change | counts? | distinct answers | most common answer's share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows(summary):
        cells = (row[k] for k in ("notebook", "what", "before", "after", "change", "verdict", "distinct", "share"))
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def replace_between_markers(text: str, block: str) -> str:
    """``text`` with what lies between the marker comments replaced by ``block``."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {BEGIN} ... {END} pair to write the table between")
    return text[: start + len(BEGIN)] + "\n" + block + text[end:]


def between_markers(text: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {BEGIN} ... {END} pair")
    return text[start + len(BEGIN) : end].lstrip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary", type=Path, help="a run's summary.json (or a kept copy of one)")
    parser.add_argument(
        "--keep", type=Path, help="write the summary's copy, with provenance and no absolute paths, here"
    )
    parser.add_argument("--write", type=Path, help="put the table between the marker comments of this file")
    parser.add_argument("--check", type=Path, help="exit 1 if this file's table is not the rendering")
    args = parser.parse_args(argv)
    summary = json.loads(args.summary.read_text())
    if args.keep:
        summary = kept_copy(summary, args.summary)
        args.keep.parent.mkdir(parents=True, exist_ok=True)
        args.keep.write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    block = render(summary, args.summary)
    if args.check:
        if between_markers(args.check.read_text()) != block:
            print(f"{args.check}: the results table is not the rendering of {args.summary}", file=sys.stderr)
            return 1
        return 0
    if args.write:
        args.write.write_text(replace_between_markers(args.write.read_text(), block))
    else:
        print(block, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
