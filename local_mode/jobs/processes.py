"""Where a job's processes start, stop and get interrupted.

``Supervisor.run`` starts the real toolkit once per host, pumps each host's output into the logs,
syncs checkpoints every few seconds, and watches the hosts until the job ends, returning its
``Outcome``: the first host that exits non-zero fails the job and the others are stopped
(SIGTERM, then SIGKILL after a grace period), so a job never waits on a peer that died.

Stopping a job (StopTrainingJob, MaxRuntime/MaxWait, a simulated Spot interruption) follows the
image, as SageMaker does: it sends SIGTERM to the container's first process and SIGKILL 120 s
later. In the PyTorch and Hugging Face images that process is ``bash -m
start_with_right_hostname.sh``, which runs the toolkit as a child and traps nothing; the kernel
drops a signal the first process of a PID namespace does not handle, so neither the toolkit
(5.1.4 installs no SIGTERM handler either) nor torchrun nor the script ever sees it. Local mode
therefore sends them nothing and kills every host's processes, at once by default: the script's
view is SageMaker's (no notice, then SIGKILL), only the moment its work stops moves.
For images whose entry point does pass SIGTERM to the script (``SAGEMAKER_LOCAL_SIGTERM_REACHES_SCRIPT``
names them) local mode sends SIGTERM to the processes the toolkit started (the script, or torchrun,
which passes it to its workers), lets the toolkit go on relaying their output, and sends SIGKILL
after ``STOP_GRACE_SECONDS``. ``SAGEMAKER_LOCAL_STOP_GRACE_SECONDS`` sets the grace for both.

A simulated Spot interruption (``SpotInterruption``) is due after some seconds of training or once
a log line reports ``step=<n>``; the job then stops as above and ``run`` returns ``Interrupted``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil

from local_mode.os_utils import port_holder

from . import checkpoints
from . import hosts as hostlib
from .job_status import JobEnded, Outcome
from .log_pump import LogPump
from .preloaded_torch_client import torch_server

STOP_GRACE_SECONDS = 10  # SIGTERM -> SIGKILL on stop, spot interruption, limits (SageMaker: 120 s)
SAGEMAKER_STOP_GRACE_SECONDS = 120  # StopTrainingJob: SIGTERM, then SIGKILL after this
GRACE_VARIABLE = "SAGEMAKER_LOCAL_STOP_GRACE_SECONDS"
SIGTERM_REACHES_SCRIPT_VARIABLE = "SAGEMAKER_LOCAL_SIGTERM_REACHES_SCRIPT"
PEER_GRACE_SECONDS = 5  # SIGTERM -> SIGKILL for the hosts left after one failed
CHECKPOINT_SYNC_SECONDS = 5
TORCHRUN_PORT = 7777  # sagemaker_training.torch_distributed.MASTER_PORT
PORT_WAIT_SECONDS = 30
STEP_LINE = re.compile(r"\bstep=(\d+)")


def sigterm_reaches_script(image: str) -> bool:
    """Whether the image's entry point passes SIGTERM on to the training script.

    SageMaker's PyTorch and Hugging Face images do not (see the module docstring), nor does an
    image whose init forwards the signal to the toolkit only: the toolkit has no handler, dies at
    once and the container ends with it. ``SAGEMAKER_LOCAL_SIGTERM_REACHES_SCRIPT`` is a comma-separated
    list of image names (repository parts, e.g. ``my-trainer``) whose entry point delivers SIGTERM
    to the script's processes and keeps the toolkit alive while they finish (such as a toolkit
    patched to forward it, under tini).
    """
    repository = image.rsplit("/", 1)[-1]
    names = [n.strip() for n in os.environ.get(SIGTERM_REACHES_SCRIPT_VARIABLE, "").split(",") if n.strip()]
    return any(name in repository for name in names)


def stop_grace_seconds(reaches_script: bool) -> float:
    """SIGTERM to SIGKILL. Where nothing in the container sees SIGTERM, waiting only moves the
    moment the work stops, so local mode kills at once unless told otherwise."""
    value = os.environ.get(GRACE_VARIABLE)
    if value is not None:
        try:
            return max(0.0, float(value))
        except ValueError:
            raise ValueError(
                f"{GRACE_VARIABLE}={value!r} is not a number of seconds; unset it or give e.g. {GRACE_VARIABLE}=10"
            ) from None
    return float(STOP_GRACE_SECONDS) if reaches_script else 0.0


class SpotInterruption:
    """A simulated Spot interruption, requested from another thread, due by time or by step."""

    def __init__(self):
        self._request: dict | None = None
        self._step_reached = threading.Event()

    def request(self, after_step: int | None, after_seconds: float | None) -> None:
        self._step_reached.clear()
        self._request = {"after_step": after_step, "after_seconds": after_seconds, "since": time.time()}

    def clear(self) -> None:
        """One simulated interruption per request."""
        self._request = None
        self._step_reached.clear()

    def observe(self, line: str) -> None:
        """A host's log line: a ``step=<n>`` at or past the requested step makes it due."""
        request = self._request
        if request is not None and request["after_step"] is not None:
            step = STEP_LINE.search(line)
            if step and int(step.group(1)) >= request["after_step"]:
                self._step_reached.set()

    def due(self, training_started: float) -> bool:
        request = self._request
        if request is None:
            return False
        if self._step_reached.is_set():
            return True
        if request["after_seconds"] is not None:
            return time.time() >= max(request["since"], training_started) + request["after_seconds"]
        return request["after_step"] is None


def start_host(host: hostlib.Host, run_dir: Path, env: dict[str, str], entrypoint: list[str] | None = None):
    """Start the toolkit for one host: forked warm when possible, else a fresh process. A request's
    own ``entrypoint`` always runs as a fresh process (the warm server forks the toolkit only)."""
    starter = torch_server() if entrypoint is None else None
    if starter is not None:
        output = run_dir / f"{host.name}.output"
        os.mkfifo(output)
        namespace = (
            [str(run_dir / "etc_hosts"), str(host.tree), host.name]
            if hostlib.isolation() == hostlib.NAMESPACES
            else None
        )
        try:
            return starter.start(env, host.tree, output, namespace)
        except OSError:
            output.unlink()  # the server is gone (it could not import torch?): a plain process instead
    return subprocess.Popen(
        hostlib.host_command(host, run_dir, entrypoint),
        env=env,
        cwd=host.tree,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        # its own process group: stopping reaches torchrun's workers; its notebook's session, and priority
        process_group=0,
    )


class Supervisor:
    """The processes of one job: started, watched, stopped."""

    def __init__(self, aws, status, spot: SpotInterruption, stop_requested):
        self.aws, self.status, self.spot = aws, status, spot  # status: job_status.JobStatus
        self.stop_requested = stop_requested  # () -> bool: StopTrainingJob was called
        self.processes: list = []
        self.streams: dict[str, str] = {}  # host -> log stream, kept across spot restarts
        self.training_started = 0.0

    def run(self, hosts: list[hostlib.Host], training_module: str | None) -> Outcome:
        """Train on ``hosts`` until the job ends; the last log lines are in before it returns."""
        if len(hosts) > 1:
            self._wait_for_torchrun_port()
        job = self.status.job
        pump = LogPump(self.aws, self.status, on_line=self.spot.observe)
        self.processes, pumps = [], []
        for host in hosts:
            stream = self.streams.setdefault(host.name, f"{self.status.name}/{host.name}-{int(time.time())}")
            env = hostlib.host_environment(host, job, self.aws.region, training_module)
            env.update(self.aws.job_environment())  # Secrets Manager (an API key by name), answered by moto
            entrypoint = hostlib.container_entrypoint(job)
            if entrypoint:
                # Local mode never installs packages; an entry point that runs pip (ModelTrainer's
                # requirements) may only find them satisfied in this environment.
                env["PIP_NO_INDEX"] = "1"
            process = start_host(host, host.tree.parents[2], env, entrypoint)
            self.processes.append(process)
            pumps.append(pump.start(process, stream))
        self.training_started = time.time()
        self.status.say(f"training on {len(hosts)} host(s): {', '.join(h.name for h in hosts)}")
        outcome = self._watch(hosts)
        for thread in pumps:
            thread.join(timeout=10)  # the last lines reach the logs before the job is reported done
        return outcome

    def _watch(self, hosts) -> Outcome:
        job = self.status.job
        stopping = job["StoppingCondition"]
        runtime_deadline = self.training_started + stopping.get("MaxRuntimeInSeconds", 86400)
        wait_deadline = job["CreationTime"] + stopping.get("MaxWaitTimeInSeconds", 10**9)
        last_sync = time.time()
        while True:
            codes = [p.poll() for p in self.processes]
            failed = [(h, c) for h, c in zip(hosts, codes, strict=True) if c not in (None, 0)]
            if failed:
                host, code = failed[0]
                self.status.say(f"{host.name} exited with code {code}: stopping the other hosts")
                self.terminate(PEER_GRACE_SECONDS)
                return Outcome("Failed", _failure_reason(host, code))
            if all(c == 0 for c in codes):
                return Outcome("Completed")
            outcome = None
            if self.stop_requested():
                outcome = Outcome("Stopped")
            elif self.spot.due(self.training_started):
                self.status.say("simulated Spot interruption")
                outcome = Outcome("Interrupted")
            elif time.time() > runtime_deadline:
                outcome = Outcome("MaxRuntimeExceeded")
            elif job.get("EnableManagedSpotTraining") and time.time() > wait_deadline:
                outcome = Outcome("MaxWaitTimeExceeded")
            if outcome is not None:
                self._stop_as_the_image_would()
                return outcome
            if time.time() - last_sync > CHECKPOINT_SYNC_SECONDS:
                checkpoints.sync(self.aws, job, hosts)
                last_sync = time.time()
            time.sleep(0.05)

    def _wait_for_torchrun_port(self) -> None:
        """torchrun's rendezvous listens on port 7777 (fixed by the toolkit) on algo-1."""
        deadline = time.time() + PORT_WAIT_SECONDS
        said = False
        while (holder := port_holder(TORCHRUN_PORT)) is not None:
            if time.time() > deadline:
                raise JobEnded(
                    "Failed",
                    f"ClientError: port {TORCHRUN_PORT}, where the training toolkit starts torchrun's "
                    f"rendezvous on algo-1, is taken on this machine by {holder}. Stop that process and "
                    "run the job again.",
                )
            if not said:
                self.status.say(f"port {TORCHRUN_PORT} is taken by {holder}; waiting up to {PORT_WAIT_SECONDS}s")
                said = True
            if self.stop_requested():
                raise JobEnded("Stopped")
            time.sleep(0.5)

    def _stop_as_the_image_would(self) -> None:
        """SIGTERM where SageMaker sends it (the container's first process), then SIGKILL."""
        image = self.status.job["AlgorithmSpecification"].get("TrainingImage", "")
        reaches_script = sigterm_reaches_script(image)
        grace = stop_grace_seconds(reaches_script)
        kill = f"SIGKILL after {grace:g} s" if grace else "SIGKILL at once"
        if reaches_script:
            self.status.say(
                f"SIGTERM to the training processes ({SIGTERM_REACHES_SCRIPT_VARIABLE}: the image's "
                f"entry point passes it on); {kill} (SageMaker: after {SAGEMAKER_STOP_GRACE_SECONDS} s)"
            )
            _signal_training_processes(self.processes, signal.SIGTERM)
        else:
            self.status.say(
                f"SIGTERM to the container's first process, which passes it to nothing (PyTorch/Hugging "
                f"Face images: bash -m start_with_right_hostname.sh, no trap): the script gets no notice; "
                f"{kill} (SageMaker: after {SAGEMAKER_STOP_GRACE_SECONDS} s; {GRACE_VARIABLE} to wait "
                "here too)"
            )
        _kill_after(self.processes, grace)

    def terminate(self, grace: float) -> None:
        """SIGTERM every host's process tree, SIGKILL what is left after ``grace`` seconds."""
        processes = self.processes
        tree = _process_trees(processes)
        for process in processes:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for member in tree:
            try:
                member.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(tree, timeout=grace)
        _kill(alive, processes)


def _failure_reason(host: hostlib.Host, code: int) -> str:
    failure = host.tree / "output" / "failure"
    text = failure.read_text(errors="replace").strip() if failure.exists() else ""
    return f"AlgorithmError: {text or f'{host.name} exited with code {code} and wrote no failure reason'}"


def _signal_training_processes(processes, signum: int) -> None:
    """Signal what each host's toolkit started (the script, or torchrun), not the toolkit itself."""
    for process in processes:
        try:
            children = psutil.Process(process.pid).children(recursive=False)
        except psutil.NoSuchProcess:
            continue
        for child in children:
            try:
                child.send_signal(signum)
            except psutil.NoSuchProcess:
                pass


def _process_trees(processes) -> list[psutil.Process]:
    """Every host's process and its descendants."""
    tree = []
    for process in processes:
        try:
            parent = psutil.Process(process.pid)
            tree += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return tree


def _kill(tree: list[psutil.Process], processes) -> None:
    """SIGKILL ``tree`` and the hosts' process groups, and reap the hosts."""
    for member in tree:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()


def _kill_after(processes, grace: float) -> None:
    """Wait up to ``grace`` seconds for every host's toolkit to exit, then SIGKILL whatever is left
    of the hosts' processes: when its first process goes, a container ends with everything in it."""
    tree = _process_trees(processes)  # taken first: a toolkit that exits leaves its children orphans
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        time.sleep(0.05)
    _kill(tree + _process_trees(processes), processes)
