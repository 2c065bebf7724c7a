"""A live view of a running training job, from the same two APIs the console uses.

``watch(session, job_name, max_steps)`` polls ``DescribeTrainingJob`` for the status and
secondary status and reads the job's CloudWatch log streams
(``/aws/sagemaker/TrainingJobs``, ``<job>/algo-N-...``) for the scripts' metric lines
(``step=12 loss=0.43 ...``). It shows a progress bar by step, the latest metrics and the
last log lines as ipywidgets in Jupyter; where no widget front end is attached (papermill,
nbval, a terminal, or ``NOTEBOOK_PLAIN_OUTPUT=1``) it prints plain text lines instead. It
returns when the job ends, with the metric records, for ``helpers.plots``.
"""

from __future__ import annotations

import html
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

try:  # the same reader in both SDKs: v2's sagemaker.logs moved to sagemaker.core.logs in v3
    from sagemaker.logs import Position, log_stream
except ImportError:
    from sagemaker.core.logs import Position, log_stream

from helpers.errors import explain_failure
from helpers.metrics import latest, parse_metric_line

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
TERMINAL = ("Completed", "Failed", "Stopped")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # the colours some tools print to a terminal


class JobFailed(RuntimeError):
    """The watched job ended Failed or Stopped (the message holds the reason and the fix)."""


@dataclass
class JobResult:
    job_name: str
    status: str
    secondary_status: str
    failure_reason: str | None
    records: list[dict]
    description: dict = field(repr=False)
    log_lines: list[str] = field(default_factory=list, repr=False)

    @property
    def final_metrics(self) -> dict:
        return latest(self.records)

    @property
    def model_data(self) -> str | None:
        return self.description.get("ModelArtifacts", {}).get("S3ModelArtifacts")


class LogReader:
    """Reads every log stream of a job from the start, remembering where each stream was left.

    Each stream is read with the SDK's ``sagemaker.logs.log_stream`` (what ``logs_for_job`` uses),
    from the (timestamp, events already seen at it) position ``logs_for_job`` keeps too.
    """

    def __init__(self, logs_client, job_name: str):
        self.client, self.job_name = logs_client, job_name
        self.positions: dict[str, Position] = {}

    def _streams(self) -> list[str]:
        try:
            response = self.client.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=self.job_name + "/")
        except self.client.exceptions.ResourceNotFoundException:
            return []  # the log group appears with the first job's first line
        return sorted(s["logStreamName"] for s in response.get("logStreams", []))

    def read(self) -> list[tuple[str, str]]:
        """New (stream, message) pairs since the last call."""
        new = []
        for stream in self._streams():
            position = self.positions.get(stream, Position(timestamp=0, skip=0))
            for event in log_stream(self.client, LOG_GROUP, stream, position.timestamp, position.skip):
                new.append((stream, event["message"]))
                seen_at_timestamp = position.skip + 1 if event["timestamp"] == position.timestamp else 1
                position = Position(timestamp=event["timestamp"], skip=seen_at_timestamp)
            self.positions[stream] = position
        return new


def save_log(session, job_name: str, path: str | os.PathLike, last: int = 12) -> Path:
    """Every host's CloudWatch log of ``job_name``, whole, in the file ``path`` (one section a host, without
    colour codes); printed: the file's path and each host's last ``last`` lines. A job's log runs to hundreds
    of lines (the toolkit's environment, pip, torchrun, the script) and its hosts' lines interleave: the file
    keeps every line to read or search, the cell shows how each host ended."""
    reader = LogReader(session.boto_session.client("logs", region_name=session.boto_region_name), job_name)
    hosts: dict[str, list[str]] = {}
    for stream, message in reader.read():
        hosts.setdefault(stream, []).extend(ANSI_ESCAPE.sub("", message).splitlines() or [""])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"==> {stream} <==\n" + "\n".join(lines) + "\n\n" for stream, lines in hosts.items()))
    print(f"{sum(map(len, hosts.values()))} log lines from {len(hosts)} host(s), whole in {path}")
    for stream, lines in hosts.items():
        print(f"--- {stream}: the last {min(last, len(lines))} of {len(lines)} lines")
        print("\n".join(line if len(line) <= 160 else line[:159] + "…" for line in lines[-last:]))
    return path


def use_widgets() -> bool:
    """True in a Jupyter kernel with a widget front end; False under papermill, pytest, a terminal."""
    forced = os.environ.get("NOTEBOOK_PLAIN_OUTPUT")
    if forced is not None:
        return forced in ("0", "false", "no")
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return False
    try:  # papermill and nbval run kernels with no front end to draw widgets
        import psutil

        parent = " ".join(psutil.Process(os.getppid()).cmdline())
        return not any(name in parent for name in ("papermill", "pytest", "nbclient", "run_notebooks"))
    except Exception:
        return True


class _WidgetView:
    def __init__(self, job_name: str, max_steps: int | None):
        import ipywidgets as w
        from IPython.display import display

        self.status = w.HTML(f"<b>{html.escape(job_name)}</b>: starting")
        self.progress = w.IntProgress(
            value=0, min=0, max=max_steps or 1, description="step", layout=w.Layout(width="60%")
        )
        self.step_label = w.Label("")
        self.metrics = w.HTML("")
        self.log = w.Textarea(value="", layout=w.Layout(width="100%", height="160px"), disabled=True)
        self.job_name, self.max_steps = job_name, max_steps
        display(w.VBox([self.status, w.HBox([self.progress, self.step_label]), self.metrics, self.log]))

    def update(self, description: dict, records: list[dict], log_tail: list[str]) -> None:
        status, secondary = description["TrainingJobStatus"], description.get("SecondaryStatus", "")
        message = _last_transition_message(description)
        self.status.value = (
            f"<b>{html.escape(self.job_name)}</b>: {status} / {secondary}"
            f"{' - ' + html.escape(message) if message else ''}"
        )
        step = records[-1]["step"] if records else 0
        if self.max_steps:
            self.progress.value = min(step, self.max_steps)
        self.step_label.value = f"{step}/{self.max_steps or '?'}"
        values = latest(records)
        self.metrics.value = (
            "<table>"
            + "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.5g}</td></tr>" for k, v in values.items() if k != "step")
            + "</table>"
        )
        self.log.value = "\n".join(log_tail[-12:])


class _TextView:
    """One line per status change and about ten progress lines per job."""

    def __init__(self, job_name: str, max_steps: int | None):
        self.job_name, self.max_steps = job_name, max_steps
        self.last_state: tuple | None = None
        self.last_step_printed = -1
        self.every = max(1, (max_steps or 10) // 10)

    def update(self, description: dict, records: list[dict], log_tail: list[str]) -> None:
        state = (description["TrainingJobStatus"], description.get("SecondaryStatus", ""))
        if state != self.last_state:
            message = _last_transition_message(description)
            print(f"[{self.job_name}] {state[0]} / {state[1]}{' - ' + message if message else ''}", flush=True)
            self.last_state = state
        for record in records:
            step = record["step"]
            final = self.max_steps is not None and step >= self.max_steps
            if step > self.last_step_printed and (step - self.last_step_printed >= self.every or final):
                values = " ".join(f"{k}={v:.4g}" for k, v in record.items() if k != "step")
                print(f"[{self.job_name}] step {step}/{self.max_steps or '?'} {values}", flush=True)
                self.last_step_printed = step


def _last_transition_message(description: dict) -> str:
    transitions = description.get("SecondaryStatusTransitions") or []
    return transitions[-1].get("StatusMessage", "") if transitions else ""


def watch(
    session,
    job_name: str,
    max_steps: int | None = None,
    *,
    poll_seconds: float | None = None,
    max_poll_seconds: float | None = None,
    timeout_seconds: float | None = None,
    widgets: bool | None = None,
    raise_on_failure: bool = True,
) -> JobResult:
    """Follow ``job_name`` until it ends; returns its status, metric records and description.

    On SageMaker the polls start at 2 s and slow down to 15 s, gentle on the APIs for long jobs.
    Local mode answers from this machine, so it polls every second and a job's end shows at once."""
    endpoint = urlparse(session.sagemaker_client.meta.endpoint_url).hostname
    local = getattr(session, "run_mode", None) == "local" or endpoint in ("127.0.0.1", "localhost")
    poll_seconds = poll_seconds or (1.0 if local else 2.0)
    max_poll_seconds = max_poll_seconds or (1.0 if local else 15.0)
    client = session.sagemaker_client
    logs = LogReader(session.boto_session.client("logs", region_name=session.boto_region_name), job_name)
    view = (_WidgetView if (use_widgets() if widgets is None else widgets) else _TextView)(job_name, max_steps)
    by_step: dict[int, dict] = {}
    log_lines: list[str] = []
    started = time.monotonic()
    delay = poll_seconds
    while True:
        description = client.describe_training_job(TrainingJobName=job_name)
        ended = description["TrainingJobStatus"] in TERMINAL
        for _stream, message in logs.read():
            log_lines.append(message)
            record = parse_metric_line(message)
            if record is not None:
                # a resumed job logs some steps again: merge, latest wins
                by_step.setdefault(record["step"], {}).update(record)
        records = [by_step[s] for s in sorted(by_step)]
        view.update(description, records, log_lines)
        if ended:
            break
        if timeout_seconds is not None and time.monotonic() - started > timeout_seconds:
            raise TimeoutError(
                f"{job_name} still {description['TrainingJobStatus']} after {timeout_seconds:.0f} s; "
                f"it keeps running: watch it again or stop it with stop_training_job."
            )
        time.sleep(delay)
        delay = min(max_poll_seconds, delay * 1.15)

    result = JobResult(
        job_name,
        description["TrainingJobStatus"],
        description.get("SecondaryStatus", ""),
        description.get("FailureReason"),
        records,
        description,
        log_lines,
    )
    _print_ending(result)
    if raise_on_failure and result.status != "Completed":
        guidance = explain_failure(description)
        tail = "\n".join(log_lines[-15:])
        raise JobFailed(
            f"{job_name} ended {result.status}: {result.failure_reason}\n"
            f"{guidance + chr(10) if guidance else ''}Last log lines:\n{tail}"
        )
    return result


def _print_ending(result: JobResult) -> None:
    d = result.description
    parts = [f"[{result.job_name}] {result.status}"]
    if d.get("TrainingTimeInSeconds") is not None:
        parts.append(f"training {d['TrainingTimeInSeconds']} s")
    if d.get("BillableTimeInSeconds") is not None:
        parts.append(f"billable {d['BillableTimeInSeconds']} s")
    if result.records:
        final = " ".join(f"{k}={v:.4g}" for k, v in result.final_metrics.items() if k != "step")
        parts.append(f"last step {result.records[-1]['step']}: {final}")
    print(", ".join(parts), flush=True)
