"""bench.training_sessions_step runs a session step on tiny shapes, as it is and with the replaced code put
back (``--before``): the same samples and loss both ways, so its paired runs time the same work."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_step(*flags: str) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-m", "bench.training_sessions_step", "--model", "tiny", *flags],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_step_before_and_after_does_the_same_work(tiny_model_path):
    after, before = run_step(), run_step("--before")
    assert (before["before"], after["before"]) == (True, False)
    assert after["first_tokens"] == before["first_tokens"] and after["generated_tokens"] == before["generated_tokens"]
    assert after["trained_tokens"] == before["trained_tokens"] > 0
    assert abs(after["loss"] - before["loss"]) <= 1e-5 * abs(before["loss"]) + 1e-7
    for report in (before, after):
        assert set(report["cpu_seconds"]) == {"merge 1", "merge 2", "sample pass", "forward_backward", "optim_step"}
        assert report["peak_rss_mib"] > 0
