"""Rows of figures and the Markdown table they print as; the machine they were measured on.

Every benchmark returns ``Row``s; ``format_table`` lines them up in one table so figures measured
side by side read side by side, under a line naming the machine (``machine_description``: the CPU,
its matrix instruction sets, torch's threads, the load), since a ratio can change with the CPU.
Peak memory is the process's peak RSS on CPU and ``torch.cuda.max_memory_allocated`` on GPU (the
``memory`` column says which).
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


def format_table(rows: list[Row], title: str = "", machine: str | None = None) -> str:
    """A Markdown table (pipes escaped inside cells), optionally under a ``### title``, after the line
    naming the machine it was measured on: ``machine``, or ``machine_description()`` of this one now."""
    lines = [f"### {title}", ""] if title else []
    lines += [f"Machine: {machine if machine is not None else machine_description()}", ""]
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


# The instruction sets that decide how fast a CPU multiplies matrices: AVX2 and AVX-512 for fp32,
# AVX512-BF16 and AMX for bf16. A ratio between two implementations can flip between CPUs that differ
# here (docs/BENCHMARKS.md, "Ratios that depend on the CPU"), so every table names them.
MATMUL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_facts(cpuinfo: str) -> dict:
    """Model, vendor, physical cores and matmul instruction sets, from the text of Linux's /proc/cpuinfo."""
    fields: dict[str, str] = {}
    cores = set()
    physical_id = core_id = None
    for line in cpuinfo.splitlines() + [""]:
        if not line.strip():  # the end of one logical CPU's block
            if core_id is not None:
                cores.add((physical_id, core_id))
            physical_id = core_id = None
            continue
        key, _, value = (part.strip() for part in line.partition(":"))
        fields.setdefault(key, value)
        if key == "physical id":
            physical_id = value
        elif key == "core id":
            core_id = value
    flags = set((fields.get("flags") or fields.get("Features") or "").split())  # Features: ARM's name
    return {
        "model": fields.get("model name") or fields.get("Model") or None,
        "vendor": fields.get("vendor_id") or fields.get("CPU implementer") or None,
        "physical_cores": len(cores) or None,
        "flags": [flag for flag in MATMUL_FLAGS if flag in flags],
        "flags_read": bool(flags),
    }


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def machine_facts(load_average: tuple[float, ...] | None = None, threads: int | None = None) -> dict:
    """This machine, as ``machine_description`` writes it; ``load_average`` is the one at the start of the
    run (now if not given), ``threads`` the torch threads each measured run used (this process's if not given)."""
    try:
        with open("/proc/cpuinfo") as handle:
            facts = cpu_facts(handle.read())
    except OSError:  # not Linux: the model as the platform names it, flags unknown
        facts = cpu_facts("")
    facts["model"] = facts["model"] or platform.processor() or platform.machine()
    facts["logical_cpus"] = os.cpu_count()
    facts["usable_cpus"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        facts["memory_gib"] = round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30)
    except (ValueError, OSError):
        facts["memory_gib"] = None
    facts["load_average_when"] = "at the start" if load_average else "as the table was written"
    if load_average is None and hasattr(os, "getloadavg"):
        load_average = os.getloadavg()
    facts["load_average"] = [round(value, 2) for value in load_average] if load_average else None
    facts["torch"] = _version("torch")
    if facts["torch"]:
        import torch

        facts["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        facts["torch_threads"] = threads or torch.get_num_threads()
    facts["python"] = platform.python_version()
    facts["transformers"] = _version("transformers")
    facts["trl"] = _version("trl")
    return facts


def describe_machine(facts: dict) -> str:
    """One line: the CPU and what it has for matrix products, torch and its threads, the load, the libraries."""
    cores = facts.get("physical_cores")
    cores = f"{cores} core{'s' if cores != 1 else ''}, " if cores else ""
    vendor = f" ({facts['vendor']})" if facts.get("vendor") else ""
    parts = [
        f"{facts['model']}{vendor}, {cores}{facts['logical_cpus']} hardware threads "
        f"({facts['usable_cpus']} usable)" + (f", {facts['memory_gib']} GiB RAM" if facts.get("memory_gib") else "")
    ]
    if facts["flags_read"]:
        missing = [flag for flag in MATMUL_FLAGS if flag not in facts["flags"]]
        parts.append(
            f"CPU flags: {' '.join(facts['flags']) or '-'}" + (f" (not {' '.join(missing)})" if missing else "")
        )
    else:
        parts.append("CPU flags not read (no /proc/cpuinfo)")
    if facts.get("torch"):
        threads = facts["torch_threads"]
        parts.append(
            f"torch {facts['torch']}, CPU capability {facts['torch_cpu_capability']}, "
            f"{threads} torch thread{'s' if threads != 1 else ''}"
        )
    if facts.get("load_average"):
        load = " ".join(f"{value:.2f}" for value in facts["load_average"])
        parts.append(f"load average {load} {facts['load_average_when']}")
    libraries = [f"{name} {facts[name]}" for name in ("transformers", "trl") if facts.get(name)]
    parts.append(f"Python {facts['python']}" + "".join(f", {library}" for library in libraries))
    return "; ".join(parts)


def machine_description(load_average: tuple[float, ...] | None = None, threads: int | None = None) -> str:
    """The machine the figures come from, the line every benchmark table carries (``machine_facts``)."""
    return describe_machine(machine_facts(load_average, threads))
