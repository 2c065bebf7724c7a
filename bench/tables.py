"""Rows of figures and the Markdown table they print as; the machine they were measured on.

Every benchmark returns ``Row``s; ``format_table`` lines them up in one table so figures measured
side by side read side by side. Peak memory is the process's peak RSS on CPU and
``torch.cuda.max_memory_allocated`` on GPU (the ``memory`` column says which).
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
from dataclasses import asdict, dataclass, field


@dataclass
class Row:
    """One measured figure: ``ours`` against ``baseline`` (TRL, or the slower way), in ``unit``.

    ``ratio`` is ours / baseline for times (lower is better) and is left empty when there is no
    baseline. ``memory_mib`` is the peak memory of ours (and ``baseline_memory_mib`` of the
    baseline) in MiB.
    """

    benchmark: str
    case: str
    ours: float | None
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    memory_mib: float | None = None
    baseline_memory_mib: float | None = None
    memory_kind: str = "RSS"
    notes: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.ours is None or not self.baseline:
            return None
        return self.ours / self.baseline

    def to_dict(self) -> dict:
        record = asdict(self)
        record["ratio"] = self.ratio
        return record


COLUMNS = ("benchmark", "case", "ours", "baseline", "ratio", "unit", "peak memory MiB (ours / baseline)", "notes")


def format_number(value: float | None) -> str:
    """Three significant digits, plain for everyday magnitudes and scientific beyond them."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e5:
        return f"{value:.3g}" if magnitude < 1000 else f"{value:.0f}"
    return f"{value:.2e}"


def _cells(row: Row) -> list[str]:
    baseline = format_number(row.baseline)
    if row.baseline is not None and row.baseline_name:
        baseline = f"{baseline} ({row.baseline_name})"
    memory = format_number(row.memory_mib)
    if row.baseline_memory_mib is not None:
        memory = f"{memory} / {format_number(row.baseline_memory_mib)}"
    if row.memory_mib is not None or row.baseline_memory_mib is not None:
        memory = f"{memory} {row.memory_kind}"
    ratio = "-" if row.ratio is None else f"{row.ratio:.2f}"
    return [row.benchmark, row.case, format_number(row.ours), baseline, ratio, row.unit, memory, row.notes]


def format_table(rows: list[Row], title: str = "") -> str:
    """A Markdown table (pipes escaped inside cells), optionally under a ``### title``."""
    lines = [f"### {title}", ""] if title else []
    body = [[cell.replace("|", "\\|") for cell in _cells(row)] for row in rows]
    lines.append("| " + " | ".join(COLUMNS) + " |")
    lines.append("|" + "|".join("---" for _ in COLUMNS) + "|")
    lines.extend("| " + " | ".join(cells) + " |" for cells in body)
    return "\n".join(lines) + "\n"


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def peak_rss_mib() -> float:
    """This process's peak resident set size so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if platform.system() == "Darwin" else peak / 1024


def machine_description() -> str:
    """CPU model, cores, memory, load average and library versions: where the figures come from."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = ""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory = f", {pages * page_size / 2**30:.0f} GiB RAM"
    except (ValueError, OSError):
        pass
    load = ""
    if hasattr(os, "getloadavg"):
        load = ", load average " + " ".join(f"{value:.2f}" for value in os.getloadavg())
    versions = []
    for name in ("torch", "transformers", "trl"):
        try:
            versions.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            continue
    return f"{cpu}, {os.cpu_count()} cores{memory}{load}; Python {platform.python_version()}, {', '.join(versions)}"
