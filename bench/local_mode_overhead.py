"""How long local mode takes around a training script that does nothing.

For 1 and 2 hosts (2 hosts with torch_distributed, as the notebooks launch them), it prints the
median over several runs of:
  first line   time from Estimator.fit() to the script's first printed line
  job overhead time from fit() to the job's TrainingEndTime (the script itself takes ~0 s)
  fit() wall   time until fit() returned (adds the SDK's wait polling)
and the peak RSS of this process (SDK + moto + local mode) and of the largest host process.

    .venv/bin/python -m bench.local_mode_overhead [--runs 3] [--hosts 1 2]
Goal: under 3 s to the first line on 1 host.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from bench.tables import machine_description

NOOP = 'import time\nprint(f"first line at {time.time():.3f}", flush=True)\n'


def first_line_time(session, job_name: str) -> float:
    """The script's own clock reading, from algo-1's CloudWatch stream."""
    logs = session.boto_session.client("logs")
    streams = logs.describe_log_streams(
        logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix=job_name + "/algo-1"
    )
    stream = streams["logStreams"][0]["logStreamName"]
    events = logs.get_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream, startFromHead=True)
    for event in events["events"]:
        if event["message"].startswith("first line at "):
            return float(event["message"].split()[-1])
    raise RuntimeError(f"no first line in {stream}")


def one_run(session, role, code: Path, hosts: int) -> tuple[float, float, float]:
    from sagemaker.pytorch import PyTorch

    extra = {"distribution": {"torch_distributed": {"enabled": True}}} if hosts > 1 else {}
    estimator = PyTorch(
        entry_point="noop.py", source_dir=str(code), role=role, instance_type="ml.p5.48xlarge",
        instance_count=hosts, framework_version="2.8.0", py_version="py312", sagemaker_session=session, **extra,
    )  # fmt: skip
    started = time.time()
    estimator.fit(logs=False)
    returned = time.time()
    name = estimator.latest_training_job.name
    description = estimator.latest_training_job.describe()
    ended = description["TrainingEndTime"].timestamp()
    return first_line_time(session, name) - started, ended - started, returned - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    machine = machine_description(os.getloadavg())

    root = tempfile.mkdtemp(prefix="local-mode-bench-")
    os.environ["SAGEMAKER_LOCAL_ROOT"] = root
    os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    import contextlib

    import local_mode
    from helpers.sagemaker_session import execution_role, make_session

    code = Path(root) / "code"
    code.mkdir()
    (code / "noop.py").write_text(NOOP)
    with contextlib.redirect_stdout(io.StringIO()):
        session = make_session(run_mode="local")
    role = execution_role(session)

    rows = []
    with contextlib.redirect_stdout(io.StringIO()):
        cold = one_run(session, role, code, 1)  # right after make_session: the warm server is still importing torch
    for hosts in args.hosts:
        samples = []
        for _ in range(args.runs):
            with contextlib.redirect_stdout(io.StringIO()):
                samples.append(one_run(session, role, code, hosts))
        rows.append((hosts, *(statistics.median(s[i] for s in samples) for i in range(3))))
    local_mode.deactivate()

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"local mode overhead, no-op entry point, median of {args.runs} runs; machine: {machine}")
    print(f"{'hosts':>5}  {'first line (s)':>14}  {'job overhead (s)':>16}  {'fit() wall (s)':>14}")
    for hosts, first, overhead, wall in rows:
        print(f"{hosts:>5}  {first:>14.2f}  {overhead:>16.2f}  {wall:>14.2f}")
    print(f"first job right after make_session (1 host): first line {cold[0]:.2f} s, job overhead {cold[1]:.2f} s")
    print(f"peak RSS: this process {own:.0f} MiB, largest host process {children:.0f} MiB")


if __name__ == "__main__":
    main()
