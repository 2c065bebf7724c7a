"""The README's results table is the rendering of a run's kept summary, not figures typed by hand.

``python -m tools.results_table <summary.json> --keep docs/runs/main-smollm2.json --write README.md``
writes both from the default run (``make main``, SmolLM2-135M-Instruct); these tests fail when either is edited without the other, and check the rendering
itself on a small made-up summary.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import results
from tools import results_table

REPO = Path(__file__).resolve().parents[2]
KEPT = REPO / "docs" / "runs" / "main-smollm2.json"  # the default run, every notebook
README = REPO / "README.md"


def test_readme_table_is_the_rendering_of_the_kept_summary():
    summary = json.loads(KEPT.read_text())
    shown = results_table.between_markers(README.read_text())
    assert shown == results_table.render(summary, splits=False), (
        "README.md's results table differs from the rendering of docs/runs/main-smollm2.json: regenerate it "
        "with python -m tools.results_table <run>/summary.json --keep docs/runs/main-smollm2.json --whole-sets "
        "--write README.md"
    )


def test_the_readme_gives_whole_sets_and_the_real_model_docs_their_parts():
    """The README's table keeps to the whole held-out sets (a row per figure of the run); docs/REAL_MODEL_RUN.md
    renders the same kept run with each set's seen and unseen templates as rows of their own."""
    summary = json.loads(KEPT.read_text())
    whole, parts = results_table.render(summary, splits=False), results_table.render(summary)
    split_rows = [row for row in results.rows(summary) if row["split"]]
    assert {row["split"] for row in split_rows} == {"seen", "unseen"}
    assert all(row["what"] not in whole and row["what"] in parts for row in split_rows)
    assert len(parts.splitlines()) - len(whole.splitlines()) == len(split_rows)
    assert all(row["what"] in whole for row in results.rows(summary) if not row["split"])


@pytest.mark.parametrize(
    ("page", "run"),
    [
        ("REAL_MODEL_RUN.md", "smollm2"),
        ("REAL_MODEL_RUN.md", "smollm2-10-11-15"),
        ("REAL_MODEL_RUN.md", "smollm2-13-14-16"),
        ("LOCAL_MODE.md", "tiny"),
    ],
)
def test_docs_hold_the_rendering_of_their_kept_summary(page, run):
    """The docs' generated blocks: the README's run with its held-out sets' parts; SmolLM2 runs of notebooks 10, 11 and 15, and of 13, 14 and 16; the quick
    run's (``make main MODEL=tiny``). Each is written from its kept summary docs/runs/main-<run>.json with
    ``--markers <run>``."""
    kept = REPO / "docs" / "runs" / f"main-{run}.json"
    begin, end = results_table.markers(run)
    shown = results_table.between_markers((REPO / "docs" / page).read_text(), begin, end)
    assert shown == results_table.render(json.loads(kept.read_text()))


def test_real_model_docs_give_where_the_default_runs_time_went():
    """docs/REAL_MODEL_RUN.md's table of each notebook's time is the rendering of the README's kept run."""
    begin, end = results_table.markers("smollm2-times")
    shown = results_table.between_markers((REPO / "docs" / "REAL_MODEL_RUN.md").read_text(), begin, end)
    assert shown == results_table.render_times(json.loads(KEPT.read_text())), (
        "regenerate it: python -m tools.results_table docs/runs/main-smollm2.json --times --markers smollm2-times "
        "--write docs/REAL_MODEL_RUN.md"
    )


@pytest.mark.parametrize(("markers", "render"), [("tiny-curves", "render_curves"), ("tiny-times", "render_times")])
def test_local_mode_docs_give_the_quick_runs_curves_and_times_as_rendered(markers, render):
    """docs/LOCAL_MODE.md says what the quick run's curves did and where its time went in blocks rendered
    from the same kept run as its table, never in figures typed by hand."""
    kept = json.loads((REPO / "docs" / "runs" / "main-tiny.json").read_text())
    begin, end = results_table.markers(markers)
    shown = results_table.between_markers((REPO / "docs" / "LOCAL_MODE.md").read_text(), begin, end)
    assert shown == getattr(results_table, render)(kept), (
        f"regenerate it: python -m tools.results_table docs/runs/main-tiny.json --{render.split('_')[1]} "
        f"--markers {markers} --write docs/LOCAL_MODE.md"
    )


def test_render_curves_gives_each_jobs_curve_and_each_sessions_lines_without_billing():
    summary = {
        **SUMMARY,
        "curves": [
            {
                "notebook": "01_estimator_sft",
                "metric": "loss",
                "should": "falls",
                "no_direction": None,
                "holds": True,
                "first": 5.08,
                "last": 1.92,
                "max": 6.9,
                "steps": 80,
            },
            {
                "notebook": "03_boto3_grpo",
                "metric": "reward",
                "should": "rises",
                "no_direction": None,
                "holds": False,
                "first": 0.5,
                "last": 0.4,
                "max": 0.6,
                "steps": 16,
            },
        ],
    }
    summary["training_sessions"] = [
        {**s, "session": "s-1", "status": "Stopped", "steps": 8, "billable_tokens": {"training": 9}}
        for s in summary["training_sessions"]
        if s["notebook"] == "07_training_session_sft"
    ]
    lines = results_table.render_curves(summary).splitlines()
    assert lines[0].startswith("Model `tiny`, run of 2025-01-02 on Some CPU @ 2GHz, 2 cores.")
    assert "- 01_estimator_sft: loss 5.08 -> 1.92 over 80 steps: falls, as expected" in lines
    assert "- 03_boto3_grpo: reward 0.5 -> 0.4 over 16 steps: expected to rise, and it did not" in lines
    assert "  - held-out loss per answer token 6.884 ± 0.012 -> 6.023 ± 0.030 (19 conversations)" in lines
    assert not any("billable" in line for line in lines)


def test_readme_gives_the_time_of_the_tables_run():
    minutes = json.loads(KEPT.read_text())["seconds"] / 60
    assert f"| `make main` | {minutes:.0f} min in the run of the table below" in README.read_text(), (
        f"README.md's time for make main is not the kept run's ({minutes:.0f} min): write that run's time"
    )
    quick = round(json.loads((REPO / "docs" / "runs" / "main-tiny.json").read_text())["seconds"])
    assert f"| `make main MODEL=tiny` | {quick} s in the run of docs/LOCAL_MODE.md's table |" in README.read_text()


def test_kept_summary_names_its_run_and_holds_no_absolute_paths():
    summary = json.loads(KEPT.read_text())
    provenance = summary["provenance"]
    assert provenance["model"] and provenance["date"] != "unknown"
    assert provenance["machine"]["cpu"] and provenance["machine"]["cores"] >= 1
    assert summary["ok"], "the README's figures come from a run in which every notebook ran"
    # ... of the default model, every notebook in one run: the run a new user's `make main` makes
    from tools import run_notebooks

    assert provenance["model"] == "smollm2"
    assert [r["notebook"][:2] for r in summary["notebooks"]] == [p.name[:2] for p in run_notebooks.notebooks()]
    text = json.dumps(summary)
    assert not re.search(r'"/(tmp|home|root|work|Users|var)/', text), "an absolute path of the machine it ran on"
    assert results_table.rows(summary), "the kept summary has no held-out figure"


SUMMARY = {
    "ok": True,
    "model": "tiny",
    "notebooks": [
        {"notebook": "00_setup_and_data", "status": "ok"},
        {"notebook": "01_estimator_sft", "status": "failed"},
    ],
    "provenance": {"model": "tiny", "date": "2025-01-02", "machine": {"cpu": "Some CPU @ 2GHz", "cores": 2}},
    "code_rl_evaluation": {
        "before": 0.0,
        "before_standard_error": 0.0,
        "after": 0.125,
        "after_standard_error": 0.05,
        "change": 0.125,
        "change_standard_error": 0.05,
        "examples": 16,
        "samples_per_example": 1,
        "temperature": 0.0,
    },
    "evaluation": {
        "base": {"accuracy": 0.0, "standard_error": 0.0, "n": 32.0, "job_name": "eval-base"},
        "trained": {"accuracy": 0.1875, "standard_error": 0.069, "n": 32.0, "job_name": "eval-trained"},
        # the GRPO model answers '2' to every problem: +2.7 standard errors, and a collapse
        "held_out_change": {
            "change": 0.1875,
            "change_standard_error": 0.069,
            "before_answer_diversity": {"answers": 32, "distinct_answers": 0, "most_common_share": 0.0},
            "after_answer_diversity": {"answers": 32, "distinct_answers": 1, "most_common_share": 1.0},
        },
    },
    "training_sessions": [
        {
            "notebook": "07_training_session_sft",
            "held_out_loss": {
                "before": {"loss": 6.884, "standard_error": 0.012, "conversations": 19},
                "after": {"loss": 6.023, "standard_error": 0.030, "conversations": 19},
            },
        },
        {
            "notebook": "08_training_session_grpo",
            "held_out": {
                "before": 0.25,
                "before_standard_error": 0.02,
                "after": 0.5,
                "after_standard_error": 0.03,
                "change": 0.25,
                "change_standard_error": 0.04,
                "problems": 64,
                "samples_per_problem": 16,
                "before_answer_diversity": {"answers": 1024, "distinct_answers": 40, "most_common_share": 0.1},
                "after_answer_diversity": {"answers": 1024, "distinct_answers": 12, "most_common_share": 0.45},
            },
        },
    ],
}


def test_rendering_of_a_made_up_summary():
    text = results_table.render(SUMMARY)
    lines = text.splitlines()
    assert lines[0].startswith("Model `tiny`, run of 2025-01-02 on Some CPU @ 2GHz, 2 cores; 1 of 2 notebooks ran.")
    assert lines[2] == (
        "| notebook | what is measured | before | after | change | counts? | distinct answers "
        "| most common answer's share |"
    )
    rows = [line.split(" | ") for line in lines[4:]]
    assert [row[0] for row in rows] == ["| 04", "| 06", "| 07", "| 08"]
    code, gsm8k, sft, grpo = rows
    # a paired change, with its size in standard errors; no answers counted: not a gain
    assert code[2:6] == ["0.000 ± 0.000", "0.125 ± 0.050", "+0.125 ± 0.050, +2.5 s.e.", "not a gain"]
    assert "16 problems x 1 answer(s) at temperature 0.0" in code[1]
    # beyond two standard errors, but every answer is one answer: refused
    assert gsm8k[2:] == ["0.000 ± 0.000", "0.188 ± 0.069", "+0.188 ± 0.069, +2.7 s.e.", "collapsed: not a gain", "0 -> 1", "0.00 -> 1.00 |"]  # fmt: skip
    # no paired standard error in the summary: the change alone, and no verdict
    assert sft[2:6] == ["6.884 ± 0.012", "6.023 ± 0.030", "-0.861", "-"]
    assert grpo[4:] == ["+0.250 ± 0.040, +6.2 s.e.", "gain", "40 -> 12", "0.10 -> 0.45 |"]
    assert code[6:] == ["-", "- |"]


@pytest.mark.parametrize(
    "change, error, after, expected",
    [
        (0.2, 0.05, {"most_common_share": 0.3}, "gain"),
        (0.2, 0.05, {"most_common_share": 0.6}, "collapsed: not a gain"),
        (0.05, 0.05, {"most_common_share": 0.3}, "not a gain"),  # within two standard errors
        (0.2, 0.05, None, "not a gain"),  # answers not counted: a collapse cannot be ruled out
        (0.2, None, {"most_common_share": 0.3}, "-"),
    ],
)
def test_a_change_counts_beyond_two_standard_errors_and_never_when_collapsed(change, error, after, expected):
    assert results.verdict(change, error, after) == expected


def test_a_lower_loss_is_the_gain_of_a_loss_figure():
    assert results.verdict(-0.5, 0.1, answers=False, lower_is_better=True) == "gain"
    assert results.verdict(0.5, 0.1, answers=False, lower_is_better=True) == "not a gain"


@pytest.mark.parametrize("most_common_share, verdict", [(0.25, "gain"), (0.75, "collapsed: not a gain")])
def test_an_sft_jobs_share_of_answers_in_the_taught_format_is_a_row_and_a_collapse_is_refused(
    most_common_share, verdict
):
    final = {  # the last metric line of sft.py with a test channel
        "eval_format_share": 0.9,
        "eval_format_share_se": 0.05,
        "eval_format_conversations": 28,
        "eval_format_share_before": 0.1,
        "eval_format_share_before_se": 0.05,
        "eval_format_share_change": 0.8,
        "eval_format_share_change_se": 0.08,
        "eval_distinct_answers_before": 3,
        "eval_most_common_share_before": 0.1,
        "eval_distinct_answers": 19,
        "eval_most_common_share": most_common_share,
    }
    (row,) = results.rows({"jobs": [{"notebook": "11_model_trainer_sft", "final_metrics": final}]})
    assert row["notebook"] == "11" and "taught format, 28 prompts" in row["what"]
    assert (row["before"], row["after"], row["change"]) == (
        "0.100 ± 0.050",
        "0.900 ± 0.050",
        "+0.800 ± 0.080, +10.0 s.e.",
    )
    assert row["verdict"] == verdict
    assert row["distinct"] == "3 -> 19"


def test_write_between_markers_and_check(tmp_path):
    summary_file = tmp_path / "summary.json"
    summary_file.write_text(json.dumps(SUMMARY))
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n{results_table.BEGIN}\nold figures\n{results_table.END}\n\nAfter.\n")
    assert results_table.main([str(summary_file), "--check", str(readme)]) == 1
    assert results_table.main([str(summary_file), "--write", str(readme)]) == 0
    text = readme.read_text()
    assert "old figures" not in text and text.endswith(f"{results_table.END}\n\nAfter.\n")
    assert results_table.between_markers(text) == results_table.render(SUMMARY)
    assert results_table.main([str(summary_file), "--check", str(readme)]) == 0
    readme.write_text("no markers\n")
    with pytest.raises(ValueError):
        results_table.main([str(summary_file), "--write", str(readme)])


def test_kept_copy_removes_the_run_folder_and_adds_provenance(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    summary = {
        "model": None,
        "paths": {
            "executed notebooks": str(run / "notebooks"),
            "state file": str(run / "work" / "state.json"),
            "elsewhere": "/tmp/x/y/summary.md",
        },
        "notebooks": [{"notebook": "00_setup_and_data", "executed": str(results_table.REPO / "notebooks")}],
    }
    (run / "summary.json").write_text(json.dumps(summary))
    kept = results_table.kept_copy(summary, run / "summary.json")
    assert kept["paths"] == {
        "executed notebooks": "<run>/notebooks",
        "state file": "<run>/work/state.json",
        "elsewhere": "summary.md",
    }
    assert kept["notebooks"][0]["executed"] == "./notebooks"
    assert kept["provenance"]["model"] == "tiny" and kept["provenance"]["machine"]["cores"] >= 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", kept["provenance"]["date"])


def test_the_benchmarks_distillation_figures_are_the_rendering_of_the_runs_they_name():
    from tools import distillation_section

    docs = (REPO / "docs" / "BENCHMARKS.md").read_text()
    assert distillation_section.replace(docs, distillation_section.render()) == docs
    for path in distillation_section.RUNS:
        assert (REPO / path).exists(), f"{path}: keep it with python -m tools.results_table <run>/summary.json --keep"


def test_render_times_gives_each_notebook_in_its_lane_and_each_lanes_sum():
    summary = {
        "seconds": 130.4,
        "lanes": [["01_estimator_sft"], ["07_training_session_sft", "08_training_session_grpo"]],
        "notebooks": [
            {"notebook": "00_setup_and_data.ipynb", "status": "ok", "seconds": 10.2},
            {"notebook": "01_estimator_sft.ipynb", "status": "ok", "seconds": 100.0},
            {"notebook": "07_training_session_sft.ipynb", "status": "ok", "seconds": 60.4},
            {"notebook": "08_training_session_grpo.ipynb", "status": "failed", "seconds": 49.4},
        ],
    }
    lines = results_table.render_times(summary).splitlines()
    assert lines[0].startswith("Wall time of the whole run: 130 s (2.2 min)")
    assert lines[4:] == [
        "| first | 00_setup_and_data | ok | 10 |",
        "| job notebooks | 01_estimator_sft | ok | 100 |",
        "| job notebooks | all, one after another | | **100** |",
        "| session notebooks | 07_training_session_sft | ok | 60 |",
        "| session notebooks | 08_training_session_grpo | failed | 49 |",
        "| session notebooks | all, one after another | | **110** |",
    ]
    # A run of session notebooks alone has one lane, named by what it holds.
    alone = {**summary, "lanes": [summary["lanes"][1]], "notebooks": summary["notebooks"][::2]}
    assert "| session notebooks | all, one after another | | **60** |" in results_table.render_times(alone)
