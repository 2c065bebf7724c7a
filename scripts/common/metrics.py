"""Metric lines for SageMaker's ``metric_definitions`` and ``metrics.jsonl`` for notebooks.

Rank 0 prints one line per logging step, exactly::

    step=12 loss=0.4312 lr=1.2e-05 grad_norm=0.8123

(names ``[a-z0-9_]+``, values with 4 significant digits), which the regex
``\\bloss=(-?[0-9.]+(?:[eE][-+]?[0-9]+)?)`` reads, and appends the same record as one JSON
object to ``$SM_OUTPUT_DATA_DIR/metrics.jsonl``. A separate human line tells progress::

    progress: step 12/100 (12%) elapsed 0:01:05 eta 0:07:57 tokens/s 5321
"""

from __future__ import annotations

import json
import math
import re
import time
from datetime import timedelta
from pathlib import Path

from common.distributed import Learners

NAME = re.compile(r"^[a-z0-9_]+$")


def format_value(value: float) -> str:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return str(value)
    return f"{float(value):.4g}"


def format_metric_line(step: int, metrics: dict[str, float]) -> str:
    """``step=<int> name=<float> ...``; raises ValueError on a name the regexes cannot match."""
    parts = [f"step={int(step)}"]
    for name, value in metrics.items():
        if not NAME.match(name):
            raise ValueError(f"metric name {name!r} must match [a-z0-9_]+")
        parts.append(f"{name}={format_value(value)}")
    return " ".join(parts)


class MetricLogger:
    """Prints metric and progress lines on rank 0 and keeps ``metrics.jsonl`` (see module docstring).

    On resume pass ``resume_step``: records after it (logged before the interruption, repeated
    now) are dropped from ``metrics.jsonl`` so each step appears once.
    """

    def __init__(self, path: str | Path, learners: Learners, max_steps: int, resume_step: int = 0):
        self.path = Path(path)
        self.learners = learners
        self.max_steps = max_steps
        self.start_step = resume_step
        self.started = time.perf_counter()
        self.tokens = 0
        if learners.is_main:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept = []
            if self.path.exists():
                for line in self.path.read_text().splitlines():
                    try:
                        if json.loads(line)["step"] <= resume_step:
                            kept.append(line)
                    except (ValueError, KeyError, TypeError):
                        continue
            self.path.write_text("".join(line + "\n" for line in kept))

    def add_tokens(self, count: int) -> None:
        """Count a step's trained tokens for tokens/s: the non-pad tokens of the sequences the step
        trained on (prompts included), over all learners. Every loop counts them this way."""
        self.tokens += int(count)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` of ``step``."""
        if not self.learners.is_main:
            return
        print(format_metric_line(step, metrics), flush=True)
        record = {"step": int(step)}
        record.update({k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()})
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        elapsed = time.perf_counter() - self.started
        done = max(step - self.start_step, 1)
        eta = elapsed / done * max(self.max_steps - step, 0)
        percent = 100.0 * step / max(self.max_steps, 1)
        rate = f" tokens/s {self.tokens / elapsed:.0f}" if self.tokens and elapsed > 0 else ""
        print(
            f"progress: step {step}/{self.max_steps} ({percent:.0f}%) elapsed {timedelta(seconds=round(elapsed))} "
            f"eta {timedelta(seconds=round(eta))}{rate}",
            flush=True,
        )
