"""Every CPU benchmark, one combined table: ``make bench`` (``python -m bench.run_all``).

Sections, each in its own process so each peak RSS is its own:
  steps       training step time, our loops vs TRL 1.16 (``bench.train_steps``)
  generation  GRPO rollout tokens/s, batched vs one call per completion (``bench.generation``)
  local_mode  time to the script's first line and job overhead (``bench.local_mode_overhead``)
  sandbox     judged tests per second (``bench.sandbox_throughput``)
  sessions    training sessions through the SDK v3 vs in-process (``bench.training_sessions``)
  sampling    session sampling tokens/s at 1, 4, 16 requests in flight, batched vs one at a time,
              LoRA unmerged vs merged; tiny and SmolLM2 when installed (``bench.training_sessions_sampling``)
  precision   the session service's forward_backward and forward in fp32 vs bf16, seconds (``bench.cpu_precision``)
  time_to_quality  GRPO to a held-out target: grpo.py, LoRA, the session, TRL (``bench.time_to_quality``)
  tinker_peer the session service vs SkyRL's Tinker API server (``bench.tinker_peer``)
  llm_client  judged answers/s through the LLM client at concurrency 1, 4, 16, and its cache (``bench.llm_client``)
  serving     served tokens/s and p50/p99 latency at 1, 4, 16 requests in flight: a session's sample and a local
              endpoint against transformers serve; tiny and SmolLM2 when installed (``bench.serving``)
Every training and generation run uses one torch thread (see ``bench.train_steps``). The table opens
with the machine: CPU model, vendor, cores, its matrix instruction sets (AVX2, AVX-512, AVX512-BF16,
AMX), torch and its CPU capability, the threads, the load average at the start.
The table goes to stdout and to ``outputs/bench/cpu_benchmarks.md`` (rows also as ``.json``).

    python -m bench.run_all                       # everything (about 20 minutes on 2 busy cores)
    python -m bench.run_all --quick               # tiny model only, one round: a minute or three
    python -m bench.run_all --sections steps generation
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.fixtures import BENCH_OUTPUT, REPO_ROOT
from bench.tables import Row, describe_machine, format_table, machine_facts, median
from local_mode.os_utils import stop_process_group

# Every training and generation run of every section computes on one torch thread (bench.train_steps says why).
BENCH_THREADS = 1

SECTIONS = (
    "steps",
    "generation",
    "local_mode",
    "sandbox",
    "sessions",
    "sampling",
    "precision",
    "llm_client",
    "serving",
    "time_to_quality",
    "tinker_peer",
)


def steps_rows(quick: bool) -> list[Row]:
    from bench import train_steps

    if quick:
        return train_steps.measure(["sft", "dpo", "grpo"], ["tiny"], rounds=1, warmup=1, measured=3)
    rows = train_steps.measure(["sft", "dpo", "grpo"], ["tiny"], rounds=3, warmup=2, measured=5)
    # The 25 M model's steps take seconds each: fewer rounds keep the section within minutes.
    return rows + train_steps.measure(["sft", "dpo", "grpo"], ["small"], rounds=2, warmup=1, measured=3)


def generation_rows(quick: bool) -> list[Row]:
    from bench import generation

    return generation.measure(["tiny"] if quick else ["tiny", "small"], rounds=1 if quick else 3)


def local_mode_rows(quick: bool) -> list[Row]:
    """``bench.local_mode_overhead.one_run`` for 1 and 2 hosts, a no-op entry point, median of runs."""
    from bench import local_mode_overhead as overhead

    runs = 1 if quick else 3
    root = tempfile.mkdtemp(prefix="local-mode-bench-")
    os.environ["SAGEMAKER_LOCAL_ROOT"] = root
    os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    import local_mode
    from helpers.sagemaker_session import execution_role, make_session

    code = Path(root) / "code"
    code.mkdir()
    (code / "noop.py").write_text(overhead.NOOP)
    with contextlib.redirect_stdout(io.StringIO()):
        session = make_session(run_mode="local")
    role = execution_role(session)
    rows = []
    try:
        for hosts in (1, 2):
            samples = []
            try:
                for _ in range(runs):
                    with contextlib.redirect_stdout(io.StringIO()):
                        samples.append(overhead.one_run(session, role, code, hosts))
            except Exception as error:  # e.g. the rendezvous port taken by another job on a shared machine
                print(f"local mode, {hosts} host(s): {error}", flush=True)
                rows.append(
                    Row(
                        "local mode", f"{hosts} host(s)", None, "s", notes=f"failed: {str(error).splitlines()[0][:160]}"
                    )
                )
                continue
            own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            case = f"{hosts} host{'s' if hosts > 1 else ''}, no-op script" + (
                ", torch_distributed" if hosts > 1 else ""
            )
            notes = (
                f"median of {runs}; memory: notebook process (SDK + moto + local mode); largest host process "
                f"{children:.0f} MiB"
            )
            first, job, wall = (median([s[i] for s in samples]) for i in range(3))
            rows.append(
                Row(
                    "local mode: fit() to first line",
                    case,
                    first,
                    "s",
                    memory_mib=own,
                    notes=notes + ("; goal < 3 s" if hosts == 1 else ""),
                )
            )
            rows.append(
                Row(
                    "local mode: job overhead",
                    case,
                    job,
                    "s",
                    memory_mib=own,
                    notes=f"fit() to TrainingEndTime; fit() returned after {wall:.2f} s",
                )
            )
    finally:
        local_mode.deactivate()
    return rows


def sandbox_rows(quick: bool) -> list[Row]:
    from bench import sandbox_throughput

    tests = 100 if quick else 400
    rows = []
    for case in ("trivial", "mix"):
        for workers in (1, 2):
            row = sandbox_throughput.measure(workers, case, tests, time_limit=0.2)
            row.benchmark = "sandbox: judged tests"
            row.notes = (
                f"{row.extra['cpu_ms_per_test']:.1f} CPU ms/test = "
                f"{row.extra['tests_per_s_on_free_cores']:.0f} tests/s on free cores; " + row.notes
            )
            rows.append(row)
    return rows


def sessions_rows(quick: bool) -> list[Row]:
    from bench import training_sessions

    return training_sessions.measure(["tiny"] if quick else ["tiny", "small"], steps=3 if quick else 10)


def sampling_rows(quick: bool) -> list[Row]:
    from bench import training_sessions_sampling

    models = ["tiny"] if quick else ["tiny", "smollm2"]  # smollm2 is skipped when its wheel is not installed
    return training_sessions_sampling.measure(models, rounds=1 if quick else 2, long_tail_rounds=1)


def precision_rows(quick: bool) -> list[Row]:
    from bench import cpu_precision

    return cpu_precision.measure(["tiny"] if quick else ["tiny", "smollm2"], rounds=1 if quick else 3)


def time_to_quality_rows(quick: bool) -> list[Row]:
    from bench import time_to_quality

    return time_to_quality.measure(list(time_to_quality.SIDES), "tiny" if quick else "smollm2", seeds=1)


def tinker_peer_rows(quick: bool) -> list[Row]:
    from bench import tinker_peer

    return tinker_peer.measure(steps=2 if quick else 5)


def llm_client_rows(quick: bool) -> list[Row]:
    from bench import llm_client

    return llm_client.measure(answers=16 if quick else 32)


def serving_rows(quick: bool) -> list[Row]:
    from bench import serving

    models = ["tiny"] if quick else ["tiny", "smollm2"]  # smollm2 is skipped when its wheel is not installed
    return serving.measure(models, prompt_count=16 if quick else None)  # 16: as many as the most in flight


RUNNERS = {
    "steps": steps_rows,
    "generation": generation_rows,
    "local_mode": local_mode_rows,
    "sandbox": sandbox_rows,
    "sessions": sessions_rows,
    "sampling": sampling_rows,
    "precision": precision_rows,
    "time_to_quality": time_to_quality_rows,
    "tinker_peer": tinker_peer_rows,
    "llm_client": llm_client_rows,
    "serving": serving_rows,
}


def run_section(name: str, quick: bool, timeout: float = 1200) -> list[Row]:
    """One section in a fresh process; its rows come back as JSON."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        result_file = Path(handle.name)
    command = [sys.executable, "-m", "bench.run_all", "--section", name, "--result", str(result_file)]
    if quick:
        command.append("--quick")
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=str(REPO_ROOT),
    )
    started = time.perf_counter()
    # Its own process group, so a section that overruns is stopped with everything it started.
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, start_new_session=True)
    try:
        returncode = process.wait(timeout=timeout)
        failure = None if returncode == 0 else f"exit status {returncode}"
    except subprocess.TimeoutExpired:
        failure = f"no result within {timeout:.0f} s"
        stop_process_group(process.pid, grace_s=15)
        process.wait()
    print(f"[{name}: {time.perf_counter() - started:.0f} s]", flush=True)
    if failure:  # the other sections still run; the table says which one has no figures and why
        result_file.unlink(missing_ok=True)
        print(f"benchmark section {name} failed ({failure}); its output is above", flush=True)
        return [Row(name, "failed", None, "-", notes=f"{failure}; see the run's output")]
    records = json.loads(result_file.read_text())
    result_file.unlink()
    fields = set(Row.__dataclass_fields__)
    return [Row(**{k: v for k, v in record.items() if k in fields}) for record in records]


def main(argv: list[str] | None = None) -> Path | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--quick", action="store_true", help="tiny model, one round, fewer tests")
    parser.add_argument("--out", default=str(BENCH_OUTPUT / "cpu_benchmarks.md"))
    parser.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.section:  # a child process: one section, rows to --result
        rows = RUNNERS[args.section](args.quick)
        Path(args.result).write_text(json.dumps([row.to_dict() for row in rows]))
        return None

    machine = machine_facts(load_average=os.getloadavg(), threads=BENCH_THREADS)
    description = describe_machine(machine)
    print(f"Machine: {description}", flush=True)  # first, so a long run's output says at once where it runs
    rows = []
    for name in args.sections:
        print(f"[{name}]", flush=True)
        # GRPO to a target on SmolLM2 takes far longer than a section of step times; serving sends SmolLM2's
        # prompts nine times (three servers, three levels) at a few tokens/s.
        rows += run_section(name, args.quick, timeout={"time_to_quality": 7200, "serving": 3600}.get(name, 1200))
    text = (
        f"# CPU benchmarks{' (quick)' if args.quick else ''}\n\n"
        "ratio = ours / baseline: below 1 is faster for s/step; above 1 is faster for tokens/s.\n\n"
        + format_table(rows, "Combined", machine=description)
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(
        json.dumps({"machine": description, "cpu": machine, "rows": [r.to_dict() for r in rows]}, indent=1)
    )
    print(text)
    print(f"written to {out}")
    return out


if __name__ == "__main__":
    main()
