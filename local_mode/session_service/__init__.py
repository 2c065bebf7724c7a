"""SageMaker training sessions on this machine: a local endpoint the unchanged SDK v3 and boto3 reach.

    from local_mode import session_service
    endpoint = session_service.start_service()          # one process per machine, reused if running
    os.environ.update(endpoint.client_environment())   # or pass it to a subprocess / kernel
    # then, in the SDK v3 environment, unchanged:
    #   ServiceClient(region="us-east-1", role_arn=...).create_lora_training_client("local/tiny-qwen2")

The endpoint (server.py) is a process of the main environment (torch, transformers, peft); the
SDK (``sagemaker-train``) lives in its own environment (``.venv-sessions``) and reaches it over
HTTP through documented settings only: ``AWS_ENDPOINT_URL_<SERVICE>`` (botocore) and the SDK's
``SAGEMAKER_TRAINING_SESSION_ENDPOINT`` / ``SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from local_mode.os_utils import is_same_process, process_identity
from local_mode.storage import _atomic_write, local_root

TINY_MODEL_ID = "local/tiny-qwen2"
SMOLLM2_MODEL_ID = "local/smollm2-135m-instruct"  # served when its wheel is installed (local_mode.offline_models)
FAKE_ACCESS_KEY = "LOCALMODEACCESSKEY"
SECRET_VARIABLE = "SAGEMAKER_LOCAL_SESSION_SECRET_KEY"  # how the starting process gives the endpoint its secret
REPO = Path(__file__).resolve().parents[3]
# What the sessions' forward and forward_backward compute in. fp32: exact, the same figures on every
# machine (the tests' and CI's). bf16: the matrix products in bfloat16 with the weights, gradients and
# optimizer state kept in fp32, as a GPU service computes; on a CPU with bf16 instructions (AVX512-BF16,
# AMX) SmolLM2's LoRA forward_backward ran 2.0x faster and forward 2.4x (docs/BENCHMARKS.md), on others
# it is slower.
# Sampling is fp32 either way (``Engine.computing`` says why).
PRECISION_VARIABLE = "SAGEMAKER_LOCAL_SESSION_PRECISION"
PRECISIONS = ("fp32", "bf16")


@dataclass
class RunningService:
    url: str
    pid: int
    root: Path
    region: str
    # Drawn once for the root folder and kept (owner-only) in training-sessions/credentials.json, so a
    # client built before a restart of the endpoint still signs its requests right; requests signed
    # with anything else are refused. Not in repr: a notebook that shows the endpoint does not print it.
    secret_key: str = field(repr=False)

    def client_environment(self) -> dict[str, str]:
        """The variables that send the SDK, boto3 or the AWS CLI of any process here."""
        return {
            "AWS_ENDPOINT_URL_SAGEMAKER": self.url,  # control plane, hub look-ups, model packages
            "AWS_ENDPOINT_URL_SAGEMAKERTRAININGSESSIONRUNTIME": self.url,
            "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": self.url,  # InvokeEndpoint[WithResponseStream]: local endpoints
            "AWS_ENDPOINT_URL_S3": self.url,  # the local S3 store (default bucket, artifacts)
            "AWS_ENDPOINT_URL_STS": self.url,
            "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": self.url,  # the logs of the training jobs it runs
            "SAGEMAKER_TRAINING_SESSION_ENDPOINT": self.url,
            "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT": self.url,
            # The endpoint checks every request's signature against these: only the processes given them
            # drive it (the record they are read from is readable by this user only).
            "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
            # No IAM here: ModelTrainer's role check (iam:SimulatePrincipalPolicy) is skipped by the
            # SDK's documented switch; the role is still sent, and checked for shape, with each job.
            "SAGEMAKER_VALIDATE_ROLE": "false",
            "HF_HUB_CACHE": str(hf_cache(self.root)),  # base models' tokenizers under their hub-style ids
            "HF_HUB_OFFLINE": "1",
            # The SDK names its default bucket after the account, asking STS at a hard-coded regional
            # URL that no endpoint variable redirects; the SDK's documented defaults file names the
            # bucket instead (the same name AWS would give it).
            "SAGEMAKER_USER_CONFIG_OVERRIDE": str(sdk_defaults_file(self.root, self.region)),
        }


def sdk_defaults_file(root: Path, region: str) -> Path:
    from local_mode.account import ACCOUNT_ID

    path = _sessions_root(root) / "sdk-config" / "config.yaml"
    text = (
        "SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n"
        f"      Session:\n        DefaultS3Bucket: sagemaker-{region}-{ACCOUNT_ID}\n"
    )
    if not path.exists() or path.read_text() != text:
        _atomic_write(path, text.encode())
    return path


def _sessions_root(root: Path) -> Path:
    return Path(root) / "training-sessions"


def hf_cache(root: Path) -> Path:
    return _sessions_root(root) / "hf-cache"


def hub_content_name(model_id: str) -> str:
    """A hub-style id (provider/model) as a Hub content name (letters, digits, dashes)."""
    return re.sub(r"-+", "-", re.sub(r"[^a-zA-Z0-9]", "-", model_id)).strip("-").lower()[:63]


def register_base_model(model_id: str, path: str | os.PathLike, root: str | os.PathLike | None = None) -> str:
    """Serve a local model folder (save_pretrained layout) as base model ``model_id``.

    ``list_base_models()`` then lists it, sessions train it, and ``get_tokenizer()`` loads its
    tokenizer with no network (its files are linked into a Hugging Face cache under the id).
    Returns the Hub content name.
    """
    if model_id.count("/") != 1:
        raise ValueError(f"Base model id {model_id!r} must look like a hub id, provider/model.")
    path = Path(path).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} has no config.json: give a folder written by save_pretrained.")
    root = Path(root).expanduser() if root else local_root()
    name = hub_content_name(model_id)
    snapshot = hf_cache(root) / f"models--{model_id.replace('/', '--')}" / "snapshots" / "local"
    snapshot.mkdir(parents=True, exist_ok=True)
    for file in path.iterdir():
        link = snapshot / file.name
        if file.is_file() and not link.exists():
            link.symlink_to(file)
    (snapshot.parents[1] / "refs").mkdir(exist_ok=True)
    (snapshot.parents[1] / "refs" / "main").write_text("local")
    registry = _sessions_root(root) / "base-models.json"
    models = json.loads(registry.read_text()) if registry.exists() else {}
    models[name] = {"HuggingfaceId": model_id, "path": str(path), "version": "1.0.0", "created": time.time()}
    _atomic_write(registry, json.dumps(models, indent=1).encode())
    return name


def _info_path(root: Path) -> Path:
    return _sessions_root(root) / "service.json"


def _credentials_path(root: Path) -> Path:
    return _sessions_root(root) / "credentials.json"


def _stable_credentials(root: Path) -> dict:
    """The endpoint's secret key for ``root``, and the port it last listened on: drawn once, kept in a
    file that only this user may read or write (0600), and the same on every later start, so that a
    client (a kernel's boto3 or SDK) built before a restart still reaches the endpoint and is still
    accepted. A record that others could read, or that is not whole, is replaced by a new secret."""
    path = _credentials_path(root)
    try:
        status = path.stat()
        if status.st_uid == os.getuid() and status.st_mode & 0o077 == 0:
            stored = json.loads(path.read_text())
            if isinstance(stored.get("secret_key"), str) and len(stored["secret_key"]) >= 32:
                return stored
    except (OSError, ValueError, AttributeError):
        pass
    stored = {"secret_key": secrets.token_urlsafe(32)}
    _write_private(path, json.dumps(stored).encode())
    return stored


def _port_free(port: int) -> bool:
    """Whether the endpoint could listen on ``port`` now (as it binds: with SO_REUSEADDR)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def running_endpoint(root: str | os.PathLike | None = None) -> RunningService | None:
    root = Path(root).expanduser() if root else local_root()
    try:
        info = json.loads(_info_path(root).read_text())
        if not is_same_process(info):
            return None
        secret_key = info["secret_key"]
    except (OSError, ValueError, KeyError):
        return None
    return RunningService(f"http://127.0.0.1:{info['port']}", info["pid"], root, info["region"], secret_key)


def configured_precision() -> str:
    """The precision ``SAGEMAKER_LOCAL_SESSION_PRECISION`` names (default fp32)."""
    value = os.environ.get(PRECISION_VARIABLE, "") or "fp32"
    if value not in PRECISIONS:
        raise ValueError(
            f"{PRECISION_VARIABLE}={value!r}: use fp32 (exact, the default) or bf16 (faster on a CPU with "
            "bf16 instructions), then start the endpoint again."
        )
    return value


def start_service(
    root: str | os.PathLike | None = None, region: str = "us-east-1", timeout: float = 120.0
) -> RunningService:
    """Start the endpoint process for ``root`` (or return the one already running) and register the
    tiny model, and SmolLM2-135M-Instruct where its wheel is installed. The process outlives this
    Python process, as the real service outlives a kernel. Kernels that start at once (the main
    job runs two lanes of notebooks) take turns, so they share one endpoint. Its secret key is the
    root's (drawn once, kept owner-only) and its port the last start's where that is free: a client
    built before the endpoint was stopped and started again goes on working."""
    root = Path(root).expanduser() if root else local_root()
    configured_precision()  # a bad setting is refused here, not by an endpoint that exits at its start
    _sessions_root(root).mkdir(parents=True, exist_ok=True)
    with open(_sessions_root(root) / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return _start_service(root, region, timeout)


def _start_service(root: Path, region: str, timeout: float) -> RunningService:
    from local_mode.offline_models import smollm2_dir, smollm2_installed
    from local_mode.tiny_model import tiny_model_dir

    register_base_model(TINY_MODEL_ID, tiny_model_dir(), root)
    if smollm2_installed():
        register_base_model(SMOLLM2_MODEL_ID, smollm2_dir(), root)
    existing = running_endpoint(root)
    if existing is not None:
        return existing
    credentials = _stable_credentials(root)
    secret_key = credentials["secret_key"]
    # The port of the last start, where it is free: a client built then still reaches the endpoint.
    port = credentials.get("port") if isinstance(credentials.get("port"), int) else 0
    if port and not _port_free(port):
        port = 0
    try:
        process, info = _launch(root, region, timeout, port, secret_key)
    except RuntimeError:
        if not port or _port_free(port):
            raise
        process, info = _launch(root, region, timeout, 0, secret_key)  # taken between the check and the bind
    info["started"] = process_identity(process.pid)["started"]
    info["secret_key"] = secret_key
    _write_private(_info_path(root), json.dumps(info).encode())
    if credentials.get("port") != info["port"]:
        _write_private(_credentials_path(root), json.dumps({**credentials, "port": info["port"]}).encode())
    return RunningService(f"http://127.0.0.1:{info['port']}", process.pid, root, region, secret_key)


def _launch(root: Path, region: str, timeout: float, port: int, secret_key: str) -> tuple[subprocess.Popen, dict]:
    """Start the endpoint process on ``port`` (0: any free one) and wait until it listens."""
    ready = _sessions_root(root) / f"ready-{os.getpid()}.json"
    ready.unlink(missing_ok=True)
    log = open(_sessions_root(root) / "service.log", "ab")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        SECRET_VARIABLE: secret_key,
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "local_mode.session_service.server",
            "--root",
            str(root),
            "--region",
            region,
            "--port",
            str(port),
            "--ready-file",
            str(ready),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=REPO,
        start_new_session=True,  # a Ctrl-C in the notebook's terminal does not reach it
    )
    log.close()  # the process holds its own copy
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if process.poll() is not None:
            raise RuntimeError(
                f"The training-session endpoint exited with code {process.returncode}; "
                f"see {_sessions_root(root) / 'service.log'}."
            )
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(
                f"The training-session endpoint did not start within {timeout:.0f} s; "
                f"see {_sessions_root(root) / 'service.log'}."
            )
        time.sleep(0.05)
    info = json.loads(ready.read_text())
    ready.unlink()
    return process, info


def _write_private(path: Path, data: bytes) -> None:
    """Written whole (atomically), readable and writable by this user only."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as file:
        file.write(data)
    os.chmod(tmp, 0o600)  # in case it existed with other permissions
    os.replace(tmp, path)


def stop_service(root: str | os.PathLike | None = None, timeout: float = 10.0) -> bool:
    """Stop the endpoint of ``root`` if one runs, and any other service process of that root (one whose
    record was lost); its Running sessions become Failed on next start."""
    root = Path(root).expanduser() if root else local_root()
    endpoint = running_endpoint(root)
    processes = [psutil.Process(endpoint.pid)] if endpoint else []
    for process in psutil.process_iter(["cmdline"]):
        command = process.info["cmdline"] or []
        if "local_mode.session_service.server" in command and str(root) in command and process not in processes:
            processes.append(process)
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(processes, timeout)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout)
    _info_path(root).unlink(missing_ok=True)
    return endpoint is not None
