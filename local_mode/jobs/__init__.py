"""SageMaker training jobs on this machine, without Docker, through the unchanged SDK and boto3.

``activate()`` returns a boto3 session on which every SageMaker call is answered by local
handlers (api.py) and S3/STS/Logs/CloudWatch by moto (aws.py); jobs run the real
``sagemaker-training`` toolkit, one process per host (runner.py and the modules it names). State lives under
``$SAGEMAKER_LOCAL_ROOT`` (default ``~/.sagemaker-local``, storage.py). Notebooks reach this
through ``helpers.sagemaker_session.make_session(run_mode="local")``.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path

import boto3

from local_mode.endpoints import RuntimeAPI
from local_mode.storage import local_root

from . import preloaded_torch_client, processes, runner
from .api import ACCOUNT_ID, SageMakerAPI
from .aws import LocalAWS, say
from .job_status import NOMINAL_SPOT_DISCOUNT

__all__ = [
    "ACCOUNT_ID",
    "NOMINAL_SPOT_DISCOUNT",
    "activate",
    "active_root",
    "deactivate",
    "is_active",
    "local_root",
    "simulate_spot_interruption",
    "start_training_sessions",
    "stop_training_sessions",
]

_active: LocalAWS | None = None


def activate(region: str = "us-east-1", root: str | os.PathLike | None = None) -> boto3.Session:
    """Start local mode in this process (idempotent) and return its boto3 session.

    The session is also ``boto3.DEFAULT_SESSION`` while local mode is active, so plain
    ``boto3.client("sagemaker")`` calls are answered locally too. Calling again with another
    root or region starts afresh from what that root holds.
    """
    global _active
    root = Path(root).expanduser() if root else local_root()
    if _active is not None and _active.storage.root == root and _active.region == region:
        return _active.session
    deactivate()
    say(f"starting: SageMaker answered in this process, state under {root}")
    _active = LocalAWS(root, region)
    api = SageMakerAPI(_active)
    _active.botocore_session.register("before-call.sagemaker", api)
    # InvokeEndpoint and its streaming twin: botocore names the runtime's events after its service id.
    _active.botocore_session.register("before-call.sagemaker-runtime", RuntimeAPI(api.hosting))
    boto3.DEFAULT_SESSION = _active.session
    preloaded_torch_client.start_early()
    return _active.session


def is_active() -> bool:
    return _active is not None


def active_root() -> Path | None:
    return _active.storage.root if _active is not None else None


def deactivate() -> None:
    """Stop the jobs this process runs and stop answering AWS calls locally."""
    global _active
    for job in list(runner.RUNNING.values()):
        job.stop()
    for job in list(runner.RUNNING.values()):
        job.join(timeout=processes.stop_grace_seconds(True) + 10)
    if _active is not None:
        _active.stop()  # restores boto3.DEFAULT_SESSION as it was
        _active = None


def start_training_sessions(region: str = "us-east-1", root: str | os.PathLike | None = None):
    """Start (or find) the local training-session endpoint for ``root`` and return it; its
    ``client_environment()`` points the SDK v3, boto3 or the AWS CLI of any process at it.

    Unlike job hosts, the endpoint outlives this Python process, as the service outlives a kernel:
    a restarted kernel finds its sessions still Running. ``stop_training_sessions()`` ends it.
    """
    from local_mode import session_service

    root = root or (_active.storage.root if _active is not None else None)
    return session_service.start_service(root, region)


def stop_training_sessions(root: str | os.PathLike | None = None) -> bool:
    """Stop the training-session endpoint of ``root``; the sessions it held become Failed."""
    from local_mode import session_service

    return session_service.stop_service(root or (_active.storage.root if _active is not None else None))


# Host processes run in their own sessions (a Ctrl-C in the terminal does not reach them), so
# they are stopped explicitly when the Python process ends: nothing is left running.
atexit.register(deactivate)


def simulate_spot_interruption(
    job_name: str, after_step: int | None = None, after_seconds: float | None = None
) -> None:
    """Interrupt a running managed spot job as EC2 reclaiming its capacity would.

    The hosts get SIGTERM (then SIGKILL after a grace period), checkpoints are synced to
    ``CheckpointConfig.S3Uri``, and the job restarts by itself with the checkpoints restored,
    showing SageMaker's transitions Interrupted -> Restarting -> Training.

    after_step: interrupt once a log line ``step=<n>`` with n >= after_step appears.
    after_seconds: interrupt that many seconds after training starts (or after this call).
    Neither: interrupt as soon as the job is training.
    """
    job = runner.RUNNING.get(job_name)
    if job is None:
        raise ValueError(
            f"Training job {job_name!r} is not running in this Python process: a Spot interruption can be "
            "simulated only for a job this kernel started and that has not finished yet."
        )
    if not job.job.get("EnableManagedSpotTraining"):
        raise ValueError(
            f"Training job {job_name!r} is not a managed spot job: create it with use_spot_instances=True "
            "(EnableManagedSpotTraining) to simulate a Spot interruption."
        )
    job.request_spot_interruption(after_step, after_seconds)
    when = (
        f"at step {after_step}" if after_step is not None
        else f"{after_seconds}s into training" if after_seconds is not None else "now"
    )  # fmt: skip
    say(f"job {job_name}: Spot interruption scheduled {when}")
