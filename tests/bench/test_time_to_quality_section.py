"""docs/BENCHMARKS.md's time-to-quality tables are rendered from the kept run, not typed: the docs hold
the rendering of docs/runs/time-to-quality-smollm2.json, and the rendering computes its medians and
ratios from the runs."""

import json
from pathlib import Path

import pytest

from bench import time_to_quality
from tools.results_table import replace_between_markers

REPO = Path(__file__).resolve().parents[2]


def _run(seed: int, step: int | None, seconds_per_step: float, peak: float) -> dict:
    curve = [{"step": 0, "seconds": 0.0, "accuracy": 0.19}]
    last = step or 8
    curve += [
        {"step": s, "seconds": s * seconds_per_step, "accuracy": 0.5 if s == step else 0.3} for s in (4, 8) if s <= last
    ]
    return {
        "seed": seed,
        "curve": curve,
        "reached_at": curve[-1] if step else None,
        "peak_rss_mib": peak,
        "load_average": [1.0, 2.0],
        "answer_lengths": [24, 12],
    }


def _kept(runs_by_side: dict) -> dict:
    profile = {**time_to_quality.PROFILES["smollm2"]}
    rows = [
        {"case": f"{time_to_quality.SIDE_NAMES[side]} (smollm2)", "extra": {"runs": runs}}
        for side, runs in runs_by_side.items()
    ]
    return {"machine": "Machine X", "profile": profile, "rows": rows}


def test_the_section_computes_medians_and_ratios_from_the_runs():
    kept = _kept(
        {
            "grpo_lora": [_run(0, 4, 20.0, 4000), _run(1, 8, 22.0, 4100), _run(2, 8, 21.0, 4050)],
            "session_lora": [_run(0, 4, 24.0, 4500), _run(1, None, 25.0, 4600), _run(2, 8, 23.0, 4550)],
            "trl_lora": [_run(0, 8, 30.0, 4400), _run(1, 8, 28.0, 4300), _run(2, 4, 29.0, 4350)],
        }
    )
    text = time_to_quality.render_section(kept)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if " of 3 | " in line}
    # the session: reached in 2 of 3 seeds (96 s and 184 s: median 140), 24 s/step median
    session = rows["training session (local service), LoRA"].split(" | ")
    assert session[1:4] == ["2 of 3", "140.0 s (96.0-184.0)", f"{140.0 / 224.0:.2f}"]  # TRL: 224 s (116, 224, 240)
    assert session[4:7] == ["24.0", f"{24.0 / 29.0:.2f}", f"{24.0 / 21.0:.2f}"]
    assert session[7].rstrip(" |") == f"{4600 / 4100:.2f}"
    assert "| 1 | not in 32 | 0.19, 0.30, 0.30 | - | 25.0 | 4,600 MiB |" in text  # its seed 1 did not reach it


def test_the_docs_hold_the_rendering_of_the_kept_run():
    kept = time_to_quality.KEPT_RUN
    if not kept.exists():
        pytest.fail(
            f"{kept} is missing: keep a run's .json there (python -m bench.time_to_quality --seeds 3 --lanes 2)"
        )
    docs = (REPO / "docs" / "BENCHMARKS.md").read_text()
    rendered = time_to_quality.render_section(json.loads(kept.read_text()))
    assert replace_between_markers(docs, rendered, time_to_quality.SECTION_BEGIN, time_to_quality.SECTION_END) == docs
