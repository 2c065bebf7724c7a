"""What local mode asks of the operating system: ports, GPUs, process identities."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import psutil


def port_holder(port: int) -> str | None:
    """Who listens on the port ("pid N (command)"), or None when it is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
            return None
        except OSError:
            pass
    for connection in psutil.net_connections(kind="tcp"):
        if connection.laddr and connection.laddr.port == port and connection.status == psutil.CONN_LISTEN:
            try:
                return f"pid {connection.pid} ({' '.join(psutil.Process(connection.pid).cmdline())[:120]})"
            except (psutil.Error, TypeError):
                break
    return "another process"


def gpu_count() -> int:
    """What the toolkit will find (it runs `nvidia-smi --list-gpus` too)."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def process_identity(pid: int | None = None) -> dict:
    """A process's pid and start time: a pid alone may have been reused by another process.

    On Linux the start time is the kernel's, in clock ticks since boot (``/proc/<pid>/stat``), which a
    step of the wall clock leaves alone; psutil's ``create_time`` adds the boot time, which Linux derives
    from the wall clock, so after an NTP step the same process seemed another one, and local mode failed a
    job whose kernel was still running it."""
    process = psutil.Process(pid)
    try:
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        started = float(fields[19])  # field 22, starttime; fields after the name start at field 3
    except (OSError, IndexError, ValueError):
        started = process.create_time()
    return {"pid": process.pid, "started": started}


def is_same_process(identity: dict) -> bool:
    """Whether the process ``process_identity`` described (its pid and start time) still runs."""
    try:
        return process_identity(identity["pid"])["started"] == identity["started"]
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def stop_process_group(pid: int, grace_s: float = 15.0) -> None:
    """Stop the process group that ``pid`` leads (a server and what it started): SIGTERM, then SIGKILL
    after ``grace_s``. Returns once the leader is gone, whether this process started it or another did."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    try:
        psutil.Process(pid).wait(grace_s)
    except psutil.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait(grace_s)
    except psutil.Error:
        pass
