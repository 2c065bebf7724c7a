"""One /opt/ml tree per host and the command that runs the real training toolkit on it.

Two layouts, chosen once per process and said in the live log:

* ``mount namespaces`` (root, ``unshare`` present: CI, containers, most Linux boxes as root).
  Every host process gets its own mount and UTS namespace, its tree bind-mounted at the literal
  ``/opt/ml``, a private ``/etc/hosts`` where ``algo-1..algo-N`` resolve to 127.0.0.1, and the
  hostname ``algo-i``. The machine's own ``/etc/hosts`` is never written; an empty ``/opt/ml``
  mount point is created when missing.
* ``loopback addresses`` (everything else: laptops, Studio). ``SAGEMAKER_BASE_DIR`` relocates
  ``/opt/ml`` (the toolkit reads it) and the hosts are named by distinct loopback addresses
  ``127.0.0.1..127.0.0.N`` in the resource config, so torchrun's ``--master_addr`` resolves
  without touching name resolution. ``SM_CURRENT_HOST`` then reads ``127.0.0.i`` instead of
  ``algo-i``.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

NAMESPACES = "mount namespaces"
LOOPBACK = "loopback addresses"

# Runs inside the new namespaces: private /etc/hosts, the host tree at /opt/ml, hostname algo-i,
# then the container's entry point: the image's (`train` is sagemaker_training.cli.train) or the
# request's ContainerEntrypoint + ContainerArguments.
_IN_NAMESPACE = (
    'mount --bind "$1" /etc/hosts && mount --bind "$2" /opt/ml && hostname "$3" '
    '&& shift 3 && exec "$@"'
)


@cache
def isolation() -> str:
    if (
        os.environ.get("SAGEMAKER_LOCAL_NO_NAMESPACES") == "1"
        or os.geteuid() != 0
        or not shutil.which("unshare")
    ):
        return LOOPBACK
    try:
        os.makedirs("/opt/ml", exist_ok=True)
        probe = subprocess.run(
            ["unshare", "--mount", "--uts", "--propagation", "private", "true"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return LOOPBACK
    return NAMESPACES if probe.returncode == 0 else LOOPBACK


@dataclass
class Host:
    name: str  # algo-i: log stream names and messages
    address: str  # what the toolkit sees as the host name (algo-i, or 127.0.0.i in LOOPBACK)
    tree: Path  # this host's /opt/ml
    checkpoints: Path | None = None  # the real folder behind CheckpointConfig.LocalPath
    synced: dict = field(default_factory=dict)  # checkpoint file -> (size, mtime) last uploaded

    @property
    def base_dir(self) -> str:
        """Where the host's processes see the tree."""
        return "/opt/ml" if isolation() == NAMESPACES else str(self.tree)

    def path(self, opt_ml_path: str) -> Path:
        """The real location of a path the container sees under /opt/ml."""
        return self.tree / os.path.relpath(opt_ml_path, "/opt/ml")


def make_hosts(run_dir: Path, count: int) -> list[Host]:
    mode = isolation()
    hosts = []
    for i in range(1, count + 1):
        address = f"algo-{i}" if mode == NAMESPACES else f"127.0.0.{i}"
        hosts.append(Host(f"algo-{i}", address, run_dir / f"algo-{i}" / "opt" / "ml"))
    if mode == NAMESPACES:
        system_hosts = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
        names = " ".join(h.name for h in hosts)
        (run_dir / "etc_hosts").write_text(f"127.0.0.1 localhost {names}\n{system_hosts}")
    return hosts


def write_config(host: Host, hosts: list[Host], request: dict, hyperparameters: dict) -> None:
    """input/config/*.json exactly as SageMaker writes them (network interface: loopback)."""
    config = host.tree / "input" / "config"
    config.mkdir(parents=True, exist_ok=True)
    instance_type = request["ResourceConfig"]["InstanceType"]
    addresses = [h.address for h in hosts]
    resource = {
        "current_host": host.address,
        "current_instance_type": instance_type,
        "current_group_name": "homogeneousCluster",
        "hosts": addresses,
        "instance_groups": [
            {"instance_group_name": "homogeneousCluster", "instance_type": instance_type, "hosts": addresses}
        ],
        "network_interface_name": "lo",
    }
    channels = {
        c["ChannelName"]: {
            "TrainingInputMode": c.get(
                "InputMode", request["AlgorithmSpecification"].get("TrainingInputMode", "File")
            ),
            "S3DistributionType": c["DataSource"]["S3DataSource"].get(
                "S3DistributionType", "FullyReplicated"
            ),
            "RecordWrapperType": c.get("RecordWrapperType", "None"),
            **({"ContentType": c["ContentType"]} if "ContentType" in c else {}),
        }
        for c in request.get("InputDataConfig", [])
    }
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (config / "resourceconfig.json").write_text(json.dumps(resource))
    (config / "inputdataconfig.json").write_text(json.dumps(channels))
    for sub in ("model", "output/data", "code", "input/data"):
        (host.tree / sub).mkdir(parents=True, exist_ok=True)


def host_command(host: Host, run_dir: Path, entrypoint: list[str] | None = None) -> list[str]:
    """The toolkit, or ``entrypoint`` (a request's ContainerEntrypoint + ContainerArguments)."""
    command = entrypoint or [sys.executable, "-m", "sagemaker_training.cli.train"]
    if isolation() == NAMESPACES:
        return [
            "unshare", "--mount", "--uts", "--propagation", "private", "--",
            "/bin/sh", "-c", _IN_NAMESPACE, "sh", str(run_dir / "etc_hosts"), str(host.tree), host.name, *command,
        ]  # fmt: skip
    return command


def host_environment(host: Host, job: dict, region: str, training_module: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "AWS_", "SAGEMAKER_"))}
    env.update(job.get("Environment", {}))
    env.update(
        {
            # torchrun and the venv's python first on PATH, as in the training image.
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONUNBUFFERED": "1",
            "TRAINING_JOB_NAME": job["TrainingJobName"],
            "TRAINING_JOB_ARN": job["TrainingJobArn"],
            "AWS_REGION": region,
            # The toolkit otherwise waits up to 15 minutes for the hosts' DNS names.
            "SM_STUDIO_LOCAL_MODE": "true",
            # Gloo (CPU) and NCCL talk over loopback: all hosts are on this machine.
            "GLOO_SOCKET_IFNAME": "lo",
        }
    )
    if training_module:
        env["SAGEMAKER_TRAINING_MODULE"] = training_module
    if isolation() != NAMESPACES:
        env["SAGEMAKER_BASE_DIR"] = str(host.tree)
    return env


def link_or_copy_tree(src: Path, dst: Path) -> None:
    """Hard-link a downloaded channel into a host's tree (copy when links are not possible)."""
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)


# ---- starting a host ---------------------------------------------------------------------------
class _WarmStarter:
    """The warm_start.py server of this process (torch imported once, a fork per host)."""

    def __init__(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_BASE_DIR"))}
        command = [sys.executable, "-u", "-P", str(Path(__file__).with_name("warm_start.py"))]
        if isolation() == NAMESPACES:
            command.append("--preload-toolkit")
        self._server = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self._ids = itertools.count()
        self._started: dict[int, queue.Queue] = {}
        self._exits: dict[int, int] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._read_replies, name="local-mode-warm-start", daemon=True).start()

    def alive(self) -> bool:
        return self._server.poll() is None

    def _read_replies(self) -> None:
        for line in self._server.stdout:
            message = json.loads(line)
            if "exited" in message:
                with self._lock:
                    self._exits[message["exited"]] = message["code"]
            else:
                self._started[message["id"]].put(message["pid"])
        with self._lock:  # the server died: its children were re-parented and cannot report
            self._exits = _ExitedUnknown(self._exits)

    def start(self, env: dict, cwd: Path, output: Path, namespace: list[str] | None) -> WarmHostProcess:
        request_id = next(self._ids)
        self._started[request_id] = queue.Queue()
        request = {
            "id": request_id,
            "env": env,
            "cwd": str(cwd),
            "output": str(output),
            "namespace": namespace,
        }
        self._server.stdin.write((json.dumps(request) + "\n").encode())
        self._server.stdin.flush()
        try:
            # The first request waits for the server to import torch: generous on a loaded machine.
            deadline = time.time() + 300
            while True:
                try:
                    pid = self._started[request_id].get(timeout=0.5)
                    break
                except queue.Empty:
                    if not self.alive():
                        raise OSError("the warm start server exited") from None
                    if time.time() > deadline:
                        self.close()  # a late fork must not start a second copy of this host
                        raise OSError("the warm start server did not answer in 300 s") from None
        finally:
            del self._started[request_id]
        return WarmHostProcess(self, pid, output)

    def close(self) -> None:
        """Stop the server (and whatever it forked that is still in its process group)."""
        try:
            os.killpg(self._server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._server.wait()

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            return self._exits.get(pid)


class _ExitedUnknown(dict):
    """After the server died every host counts as killed."""

    def get(self, pid, default=None):
        return super().get(pid, -9)


class WarmHostProcess:
    """What the runner needs of a Popen, for a host forked by the warm server."""

    def __init__(self, starter: _WarmStarter, pid: int, output: Path):
        self._starter, self.pid, self._output = starter, pid, output
        self._stdout = None

    @property
    def stdout(self):
        if self._stdout is None:
            self._stdout = open(self._output, "rb")  # noqa: SIM115  blocks until the host opens its end
        return self._stdout

    def poll(self) -> int | None:
        code = self._starter.exit_code(self.pid)
        if code is not None and self._stdout is None:
            self._release_reader()
        return code

    def _release_reader(self) -> None:
        """A host that died before opening its output would leave the reader waiting: open and close
        the writing end once so that the reader sees the end of the output."""
        try:
            os.close(os.open(self._output, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader waiting

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(0.05)
        return code


_warm: _WarmStarter | None = None
_warm_lock = threading.Lock()


def warm_up() -> None:
    """Start the warm server early (it imports torch in the background) so the first job is quick."""
    _warm_starter()


def _warm_starter() -> _WarmStarter | None:
    """The warm server, started on first use; None where it cannot run (then: plain processes)."""
    global _warm
    if os.environ.get("SAGEMAKER_LOCAL_WARM_START", "1") == "0":
        return None
    with _warm_lock:
        if _warm is None or not _warm.alive():
            try:
                _warm = _WarmStarter()
            except OSError:
                return None
        return _warm


def start_host(host: Host, run_dir: Path, env: dict[str, str], entrypoint: list[str] | None = None):
    """Start the toolkit for one host: forked warm when possible, else a fresh process. A request's
    own ``entrypoint`` always runs as a fresh process (the warm server forks the toolkit only)."""
    starter = _warm_starter() if entrypoint is None else None
    if starter is not None:
        output = run_dir / f"{host.name}.output"
        os.mkfifo(output)
        namespace = (
            [str(run_dir / "etc_hosts"), str(host.tree), host.name] if isolation() == NAMESPACES else None
        )
        try:
            return starter.start(env, host.tree, output, namespace)
        except OSError:
            output.unlink()  # the server is gone (it could not import torch?): a plain process instead
    return subprocess.Popen(
        host_command(host, run_dir, entrypoint),
        env=env,
        cwd=host.tree,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: stopping reaches torchrun's workers
    )
