"""``make bench``'s header: the table opens with the machine it was measured on, the CPU's matrix instruction
sets and torch's threads among it, in the Markdown and the JSON. Run here with the quick sandbox section,
the fastest; no figure is asserted."""

import json

from bench import run_all
from bench.tables import MATMUL_FLAGS, machine_facts


def test_the_combined_table_names_the_cpu(tmp_path, capsys):
    out = tmp_path / "cpu_benchmarks.md"
    run_all.main(["--quick", "--sections", "sandbox", "--out", str(out)])
    printed = capsys.readouterr().out.splitlines()

    here = machine_facts()
    lines = out.read_text().splitlines()
    machine = next(line for line in lines if line.startswith("Machine: "))
    assert lines.index(machine) < next(i for i, line in enumerate(lines) if line.startswith("| benchmark |"))
    assert machine.startswith(f"Machine: {here['model']}")
    if here["flags_read"]:
        missing = [flag for flag in MATMUL_FLAGS if flag not in here["flags"]]
        assert f"CPU flags: {' '.join(here['flags']) or '-'}" in machine
        assert all(flag in machine for flag in missing)  # named as absent
    assert f"CPU capability {here['torch_cpu_capability']}, 1 torch thread;" in machine
    assert "at the start" in machine
    assert any(line.startswith("| sandbox") for line in lines)
    assert printed[0] == machine  # the run's first line, before any section

    record = json.loads(out.with_suffix(".json").read_text())
    assert record["machine"] == machine.removeprefix("Machine: ")
    assert record["cpu"]["model"] == here["model"] and record["cpu"]["flags"] == here["flags"]
