"""A real OpenAI-compatible server on this machine: ``transformers serve`` with a local model folder.

The teacher and judge of notebook 13, the tests and the benchmark talk to it exactly as they would to
any provider: through ``OPENAI_BASE_URL`` (``http://127.0.0.1:<port>/v1``) and ``OPENAI_API_KEY`` (the
server accepts any key). It runs offline: the model is a folder (the tiny model, or SmolLM2 converted
by ``local_mode.offline_models``), preloaded, on the CPU.

    with serve(model_dir) as server:        # starts it, waits for /health, stops it at the end
        os.environ.update(server.environment())

    python -m local_mode.llm_server [MODEL_DIR]  # serves until interrupted
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from local_mode.os_utils import stop_process_group

# Any text is a valid key for the local server; the notebooks read OPENAI_API_KEY all the same.
LOCAL_API_KEY = "local-server-accepts-any-key"


@dataclasses.dataclass(frozen=True)
class LocalServer:
    base_url: str  # http://127.0.0.1:<port>/v1
    model: str  # the name requests give: the served folder
    log_path: Path

    def environment(self) -> dict[str, str]:
        """The two variables the client reads."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": LOCAL_API_KEY}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _transformers_cli() -> str:
    beside = Path(sys.executable).with_name("transformers")
    return str(beside) if beside.exists() else (shutil.which("transformers") or "transformers")


def start_server(
    model_dir: str | Path, *, port: int | None = None, threads: int = 1, log_path: str | Path | None = None
) -> tuple[subprocess.Popen, LocalServer]:
    """Start ``transformers serve`` on ``model_dir`` (offline, CPU, ``threads`` torch threads) in a
    session of its own, without waiting for it: ``serve`` waits and stops it; local mode's endpoints
    watch theirs. Its log goes to ``log_path`` (a temporary file by default)."""
    model_dir = Path(model_dir).resolve()
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a model folder (no config.json).")
    port = port or free_port()
    log_path = Path(log_path) if log_path else Path(f"/tmp/llm-server-{port}.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    for secret in ("OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN"):
        environment.pop(secret, None)  # the server needs none of them
    command = [
        _transformers_cli(),
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--log-level",
        "warning",
        "--default-seed",
        "0",
    ]
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment,
            start_new_session=True,
        )
    return process, LocalServer(f"http://127.0.0.1:{port}/v1", str(model_dir), log_path)


def health_url(server: LocalServer) -> str:
    return server.base_url.removesuffix("/v1") + "/health"


def stop_server(process: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM to the server's process group, SIGKILL after ``grace_s``."""
    stop_process_group(process.pid, grace_s)
    process.wait()


@contextlib.contextmanager
def serve(
    model_dir: str | Path, *, port: int | None = None, threads: int = 1, log_path: str | Path | None = None
) -> Iterator[LocalServer]:
    """Run ``transformers serve`` on ``model_dir`` (offline, CPU, ``threads`` torch threads) until the
    block ends. Its log goes to ``log_path`` (a temporary file by default)."""
    process, server = start_server(model_dir, port=port, threads=threads, log_path=log_path)
    try:
        _wait_healthy(health_url(server), process, server.log_path)
        yield server
    finally:
        stop_server(process)


def healthy(url: str) -> bool:
    """Whether the server answers its health check at ``url`` (``transformers serve``: ``/health``)."""
    with contextlib.suppress(OSError):
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    return False


def _wait_healthy(url: str, process: subprocess.Popen, log_path: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"transformers serve exited with {process.returncode}; its log:\n{log_path.read_text()}")
        if healthy(url):
            return
        time.sleep(0.5)
    raise RuntimeError(f"transformers serve did not answer {url} within {timeout_s} s; log in {log_path}")


if __name__ == "__main__":
    from local_mode.tiny_model import tiny_model_dir

    folder = sys.argv[1] if len(sys.argv) > 1 else tiny_model_dir()
    # The server runs in a session of its own, so a SIGTERM to this process's group does not reach it:
    # leave through serve()'s stop instead of dying at once, which left it running (notebook 14's judge).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with serve(folder) as running:
        print(f"OPENAI_BASE_URL={running.base_url}  model={running.model}  (Ctrl-C stops it)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
