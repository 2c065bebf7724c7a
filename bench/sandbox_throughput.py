"""How many tests per second the sandbox judges, with every confinement layer this machine has.

For 1 and 2 workers it judges
  trivial   a program that reads two numbers and prints their sum, ``--tests`` times;
  mix       the same, with one test in ten an infinite loop (killed at --time_limit CPU seconds /
            2 x + 0.2 wall) and one in ten a program that prints a wrong answer,
and prints judged tests/s, the CPU time per test (this process + fork servers + programs; on a
shared machine, what the same work gives on free cores is min(workers, cores) / that), the median
time per test inside the worker, and peak RSS: this process (the judge), the largest fork server,
and the largest judged program.

    .venv/bin/python -m bench.sandbox_throughput [--tests 400]
Goal: at least 200 trivial tests/s on 2 cores with 2 workers and every layer on.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

from sandbox import Limits, Sandbox

from bench.tables import Row, format_table, machine_description, peak_rss_mib

SUM = "a, b = map(int, input().split())\nprint(a + b)\n"
LOOP = "while True:\n    pass\n"
WRONG = "print(0)\n"


def server_peak_rss_mib(pids: list[int]) -> float:
    peaks = []
    for pid in pids:
        with open(f"/proc/{pid}/status") as handle:
            peaks += [int(line.split()[1]) / 1024 for line in handle if line.startswith("VmHWM:")]
    return max(peaks)


def cpu_seconds(server_pids: list[int]) -> float:
    """CPU used so far by this process, the fork servers and the programs they reaped."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    total = own.ru_utime + own.ru_stime
    for pid in server_pids:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
    return total


def measure(workers: int, case: str, tests: int, time_limit: float) -> Row:
    limits = Limits(time_limit=time_limit, wall_limit=2 * time_limit + 0.2)
    with Sandbox(workers=workers, limits=limits) as box:
        layers = ", ".join(name for name, on in box.active_layers().items() if on)
        items = []
        for index in range(tests):
            program = SUM
            if case == "mix" and index % 10 == 3:
                program = LOOP
            elif case == "mix" and index % 10 == 7:
                program = WRONG
            items.append(
                ({"testtype": "stdin", "tests": [{"input": f"{index} 1\n", "output": f"{index + 1}\n"}]}, program)
            )
        box.judge_many(items[: 2 * workers], "fraction")  # warm the workers
        started, cpu_before = time.perf_counter(), cpu_seconds(box.server_pids)
        judged = box.judge_many(items, "fraction")
        elapsed, cpu_used = time.perf_counter() - started, cpu_seconds(box.server_pids) - cpu_before
        outcomes = [o for j in judged for o in j.outcomes]
        verdicts = {v: sum(o.verdict == v for o in outcomes) for v in {o.verdict for o in outcomes}}
        expected_ok = tests if case == "trivial" else tests - tests // 10 * 2
        assert verdicts.get("accepted", 0) >= expected_ok - 1, verdicts
        return Row(
            "sandbox",
            f"{case}, {workers} worker{'s' if workers > 1 else ''}",
            tests / elapsed,
            "tests/s",
            memory_mib=peak_rss_mib(),
            notes=f"{' '.join(f'{k}={v}' for k, v in sorted(verdicts.items()))}; layers: {layers}",
            extra={
                "cpu_ms_per_test": 1000 * cpu_used / tests,
                # what the same work gives when min(workers, cores) cores are free for it
                "tests_per_s_on_free_cores": min(workers, os.cpu_count() or 1) * tests / cpu_used,
                "median_ms_in_worker": 1000 * statistics.median(o.wall for o in outcomes),
                "server_peak_rss_mib": server_peak_rss_mib(box.server_pids),
                "program_peak_rss_mib": max(o.max_rss_kb for o in outcomes) / 1024,
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", type=int, default=400, help="tests per case (default: %(default)s)")
    parser.add_argument(
        "--time_limit",
        type=float,
        default=0.2,
        help="CPU seconds per test; the loops of the mix run into it (default: %(default)s)",
    )
    args = parser.parse_args()
    machine = machine_description(os.getloadavg())
    rows = [measure(workers, case, args.tests, args.time_limit) for case in ("trivial", "mix") for workers in (1, 2)]
    print(format_table(rows, "Sandbox throughput (judged tests per second)", machine))
    for row in rows:
        print(
            f"{row.case}: {row.ours:.0f} tests/s measured, {row.extra['cpu_ms_per_test']:.1f} CPU ms per test "
            f"(judge + servers + programs) = {row.extra['tests_per_s_on_free_cores']:.0f} tests/s on free cores, median {row.extra['median_ms_in_worker']:.1f} ms per test in the "
            f"worker, peak RSS judge {row.memory_mib:.0f} MiB, fork server {row.extra['server_peak_rss_mib']:.0f} MiB, "
            f"program {row.extra['program_peak_rss_mib']:.0f} MiB"
        )


if __name__ == "__main__":
    main()
