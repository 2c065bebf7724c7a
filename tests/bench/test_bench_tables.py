"""Benchmark tables: number formatting, ratios, memory columns, Markdown layout, the machine line every
table carries. Nothing timed."""

from pathlib import Path

import pytest

from bench.tables import (
    COLUMNS,
    Row,
    cpu_facts,
    describe_machine,
    format_number,
    format_table,
    machine_description,
    machine_facts,
)


def cpuinfo(vendor: str, model: str, flags: str, core_ids: tuple[int, ...]) -> str:
    """/proc/cpuinfo's text for one socket, one block per logical CPU, trimmed to the fields that matter."""
    return "\n".join(
        f"processor\t: {n}\nvendor_id\t: {vendor}\nmodel name\t: {model}\nphysical id\t: 0\n"
        f"core id\t\t: {core}\nflags\t\t: fpu sse2 avx {flags}\n"
        for n, core in enumerate(core_ids)
    )


# Two hyper-threads of one core of an Intel Xeon with AVX512-BF16 and AMX, the kind the GRPO and sampling
# ratios flipped on (docs/BENCHMARKS.md, "Ratios that depend on the CPU"; the model names are examples),
# and two cores of an AMD EPYC, which has no AMX.
XEON_CPUINFO = cpuinfo(
    "GenuineIntel", "Intel(R) Xeon(R) Platinum 8488C", "avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", (0, 0)
)
EPYC_CPUINFO = cpuinfo("AuthenticAMD", "AMD EPYC 9R14", "avx2 avx512f avx512_bf16 avx512_vnni", (0, 1))


@pytest.mark.parametrize(
    "value, text",
    [
        (None, "-"),
        (0, "0"),
        (0.123456, "0.123"),
        (1.0, "1"),
        (12.345, "12.3"),
        (999.4, "999"),
        (1234.5, "1234"),
        (0.000123, "1.23e-04"),
        (123456.0, "1.23e+05"),
        (-0.5, "-0.5"),
    ],
)
def test_format_number(value, text):
    assert format_number(value) == text


def test_ratio_is_ours_over_baseline_and_empty_without_one():
    assert Row("sft step", "tiny", 0.02, "s/step", 0.04).ratio == pytest.approx(0.5)
    assert Row("sandbox", "trivial", 250.0, "tests/s").ratio is None
    assert Row("x", "y", None, "s", 1.0).ratio is None
    assert Row("x", "y", 1.0, "s", 0.0).ratio is None


def test_table_layout():
    rows = [
        Row(
            "sft step",
            "tiny (1.3 M params)",
            0.0213,
            "s/step",
            0.0426,
            "TRL SFTTrainer",
            480.4,
            601.0,
            notes="median of 3x5",
        ),
        Row("sandbox", "trivial | 2 workers", 251.0, "tests/s", memory_mib=95.2),
    ]
    assert format_table(rows, "Combined", machine="a test machine").splitlines() == [
        "### Combined",
        "",
        "Machine: a test machine",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|---|---|---|---|---|---|---|",
        "| sft step | tiny (1.3 M params) | 0.0213 | 0.0426 (TRL SFTTrainer) | 0.50 | s/step | 480 / 601 RSS "
        "| median of 3x5 |",
        "| sandbox | trivial \\| 2 workers | 251 | - | - | tests/s | 95.2 RSS |  |",
    ]


def test_table_without_memory_or_title():
    row = Row("grpo step: reward", "tiny", 0.0005, "s/step", 0.001, "TRL", memory_kind="max allocated")
    lines = format_table([row], machine="a test machine").splitlines()
    assert lines[:2] == ["Machine: a test machine", ""]
    assert lines[2].startswith("| benchmark |")
    assert lines[4] == "| grpo step: reward | tiny | 5.00e-04 | 0.001 (TRL) | 0.50 | s/step | - |  |"


def test_to_dict_carries_the_ratio():
    record = Row("a", "b", 2.0, "s", 4.0, extra={"cpu_ms_per_test": 3.0}).to_dict()
    assert record["ratio"] == 0.5 and record["extra"] == {"cpu_ms_per_test": 3.0}


def test_cpu_facts_read_the_model_vendor_cores_and_matmul_flags():
    xeon = cpu_facts(XEON_CPUINFO)
    assert xeon["model"] == "Intel(R) Xeon(R) Platinum 8488C" and xeon["vendor"] == "GenuineIntel"
    assert xeon["physical_cores"] == 1  # two hyper-threads of core 0
    assert xeon["flags"] == ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]
    epyc = cpu_facts(EPYC_CPUINFO)
    assert epyc["model"] == "AMD EPYC 9R14" and epyc["vendor"] == "AuthenticAMD" and epyc["physical_cores"] == 2
    assert epyc["flags"] == ["avx2", "avx512f", "avx512_bf16"]  # no AMX
    assert cpu_facts("")["flags_read"] is False and cpu_facts("")["model"] is None


def test_the_machine_line_names_the_cpu_its_flags_torch_threads_and_load():
    facts = cpu_facts(EPYC_CPUINFO) | {
        "logical_cpus": 2,
        "usable_cpus": 2,
        "memory_gib": 24,
        "load_average": [1.0, 1.1, 1.2],
        "load_average_when": "at the start",
        "torch": "2.13.0+cpu",
        "torch_cpu_capability": "AVX512",
        "torch_threads": 1,
        "python": "3.11.7",
        "transformers": "5.25.0",
        "trl": None,
    }
    assert describe_machine(facts) == (
        "AMD EPYC 9R14 (AuthenticAMD), 2 cores, 2 hardware threads (2 usable), 24 GiB RAM; "
        "CPU flags: avx2 avx512f avx512_bf16 (not amx_tile amx_bf16); "
        "torch 2.13.0+cpu, CPU capability AVX512, 1 torch thread; load average 1.00 1.10 1.20 at the start; "
        "Python 3.11.7, transformers 5.25.0"
    )
    xeon = describe_machine(facts | cpu_facts(XEON_CPUINFO) | {"torch_threads": 2})
    assert "Intel(R) Xeon(R) Platinum 8488C (GenuineIntel), 1 core," in xeon
    assert "CPU flags: avx2 avx512f avx512_bf16 amx_tile amx_bf16;" in xeon and "2 torch threads" in xeon


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads Linux's /proc/cpuinfo")
def test_this_machine_is_described_from_proc_cpuinfo_and_torch():
    import torch

    model = next(
        line.split(":", 1)[1].strip()
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("model name")
    )
    facts = machine_facts(load_average=(0.5, 0.25, 0.125), threads=1)
    assert facts["model"] == model and facts["torch_threads"] == 1
    assert facts["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    line = machine_description(load_average=(0.5, 0.25, 0.125), threads=1)
    assert line.startswith(model) and "load average 0.50 0.25 0.12 at the start" in line
    assert f"CPU capability {torch.backends.cpu.get_cpu_capability()}, 1 torch thread;" in line
    # without a machine given, a table names this one
    first = format_table([Row("sandbox", "trivial", 251.0, "tests/s")]).splitlines()[0]
    assert first.startswith(f"Machine: {model}") and "CPU flags:" in first
