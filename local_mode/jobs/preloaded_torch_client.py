"""The client of preloaded_torch.py: one warm server per process, a fork of it per host.

``torch_server()`` starts the server on first use (or returns None where it cannot run: then
hosts start as plain processes); ``start_early()`` starts it early, so that torch is imported in the
background while the notebook is still building its request. ``PreloadedTorchServer.start`` returns a
``WarmHostProcess``: what the process supervision needs of a Popen (pid, stdout, poll, wait).
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .hosts import NAMESPACES, isolation


class PreloadedTorchServer:
    """The preloaded_torch.py server of this process (torch imported once, a fork per host)."""

    def __init__(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_BASE_DIR"))}
        command = [sys.executable, "-u", "-P", str(Path(__file__).with_name("preloaded_torch.py"))]
        if isolation() == NAMESPACES:
            command.append("--preload-toolkit")
        self._server = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            process_group=0,  # a group to stop; in its notebook's session, and so at its priority
        )
        self._ids = itertools.count()
        self._started: dict[int, queue.Queue] = {}
        self._exits: dict[int, int] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._read_replies, name="local-mode-preloaded-torch", daemon=True).start()

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
                        raise OSError("the preloaded torch server exited") from None
                    if time.time() > deadline:
                        self.close()  # a late fork must not start a second copy of this host
                        raise OSError("the preloaded torch server did not answer in 300 s") from None
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

    def __init__(self, starter: PreloadedTorchServer, pid: int, output: Path):
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


_server: PreloadedTorchServer | None = None
_server_lock = threading.Lock()


def start_early() -> None:
    """Start the preloaded torch server early (it imports torch in the background) so the first job is quick."""
    torch_server()


def torch_server() -> PreloadedTorchServer | None:
    """The preloaded torch server, started on first use; None where it cannot run (then: plain processes)."""
    global _server
    if os.environ.get("SAGEMAKER_LOCAL_WARM_START", "1") == "0":
        return None
    with _server_lock:
        if _server is None or not _server.alive():
            try:
                _server = PreloadedTorchServer()
            except OSError:
                return None
        return _server
