"""One switch between SageMaker and local mode; the notebook cells stay the same.

    session = make_session(run_mode="auto")      # "sagemaker", "local" or "auto"
    role = execution_role(session)
    print(describe_mode(session))

``make_session`` always returns a real ``sagemaker.Session``. In local mode its boto3 session
answers every SageMaker call on this machine (``local_mode``), jobs run as processes,
and nothing reaches AWS. The SDK's own Docker local mode (``instance_type="local"`` with
``sagemaker.local.LocalSession``) is untouched and still works where Docker is installed.
"""

from __future__ import annotations

import copy
import logging
import os

import boto3
import botocore.config
import botocore.exceptions

import local_mode
from local_mode.account import LOCAL_ROLE  # the role local mode answers for, defined once

# The SDK logs where it looked for defaults files when imported, and every config value it applies on each
# estimator ("sagemaker.config INFO - ..."): nothing a learner acts on. Its documented switch, set before the
# import, keeps its warnings.
logging.getLogger("sagemaker.config").setLevel(logging.WARNING)
import sagemaker  # noqa: E402

RUN_MODES = ("auto", "sagemaker", "local")
DEFAULT_REGION = "us-east-1"
ROLE_ENV = "SAGEMAKER_EXECUTION_ROLE_ARN"  # an explicit role wins over discovery


class LocalModeSession(sagemaker.Session):
    """A ``sagemaker.Session`` whose AWS is answered by local_mode.

    Only the polling defaults differ: local jobs and endpoints take seconds, so waiting polls every
    second instead of every 5-30 (the requests sent are the same).
    """

    run_mode = "local"

    def wait_for_job(self, job, poll=1):
        return super().wait_for_job(job, poll=poll)

    def logs_for_job(self, job_name, wait=False, poll=1, log_type="All", timeout=None):
        return super().logs_for_job(job_name, wait=wait, poll=poll, log_type=log_type, timeout=timeout)

    def wait_for_endpoint(self, endpoint, poll=1, live_logging=False):
        return super().wait_for_endpoint(endpoint, poll=poll, live_logging=live_logging)


def _say(text: str) -> None:
    print(f"[session] {text}", flush=True)


# Local mode applies no SDK defaults file (a VPC, a KMS key or a role there are AWS things); it only
# switches the SDK's telemetry off, since nothing may leave the machine.
LOCAL_SDK_CONFIG = {
    "SchemaVersion": "1.0",
    "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}},
}


def _local_session(region: str, default_bucket: str | None) -> LocalModeSession:
    boto_session = local_mode.activate(region=region)
    bucket = default_bucket or f"sagemaker-{region}-{local_mode.ACCOUNT_ID}"
    return LocalModeSession(
        boto_session=boto_session,
        default_bucket=bucket,  # the SDK would otherwise ask STS on a hard-coded endpoint
        sagemaker_config=copy.deepcopy(LOCAL_SDK_CONFIG),
    )


def _aws_unreachable_reason(region: str) -> str | None:
    """None when AWS credentials exist and STS accepts them; else why not, in words."""
    boto_session = boto3.Session(region_name=region)
    if boto_session.get_credentials() is None:
        return "no AWS credentials were found"
    sts = boto_session.client(
        "sts",
        config=botocore.config.Config(connect_timeout=3, read_timeout=5, retries={"max_attempts": 1}),
    )
    try:
        sts.get_caller_identity()
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
        return f"AWS did not accept the credentials ({error})"
    return None


def make_session(
    run_mode: str = "auto", region: str | None = None, default_bucket: str | None = None
) -> sagemaker.Session:
    """A sagemaker.Session for SageMaker (``"sagemaker"``), this machine (``"local"``) or
    whichever is available (``"auto"``: local when no AWS credentials or execution role)."""
    if run_mode not in RUN_MODES:
        raise ValueError(f"run_mode must be one of {RUN_MODES}, got {run_mode!r}")
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION

    if run_mode == "local":
        return _local_session(region, default_bucket)

    if local_mode.is_active():
        if run_mode == "auto":
            return _local_session(region, default_bucket)
        raise RuntimeError(
            "run_mode='sagemaker' but local mode is already active in this Python process, and it "
            "answers every AWS call here. Restart the kernel and call make_session(run_mode='sagemaker') first."
        )

    reason = _aws_unreachable_reason(region)
    if reason is not None:
        if run_mode == "sagemaker":
            raise RuntimeError(
                f"run_mode='sagemaker' but {reason}. Configure AWS first: `aws configure` (or "
                "`aws sso login --profile NAME` and AWS_PROFILE=NAME), or open the notebook in SageMaker "
                "Studio, where credentials come with the environment. To run everything on this machine "
                "instead, use make_session(run_mode='local')."
            )
        _say(f"LOCAL MODE: {reason}, so training jobs run on this machine (run_mode='local').")
        return _local_session(region, default_bucket)

    session = sagemaker.Session(boto_session=boto3.Session(region_name=region), default_bucket=default_bucket)
    if run_mode == "auto":
        try:
            execution_role(session)
        except RuntimeError as error:
            _say(f"LOCAL MODE: credentials found but no SageMaker execution role ({error}).")
            return _local_session(region, default_bucket)
    session.run_mode = "sagemaker"
    return session


def execution_role(session: sagemaker.Session) -> str:
    """The IAM role training jobs run as: the real one on SageMaker, a well-formed fake one locally."""
    if getattr(session, "run_mode", None) == "local":
        return LOCAL_ROLE
    if os.environ.get(ROLE_ENV):
        return os.environ[ROLE_ENV]
    try:
        return sagemaker.get_execution_role(sagemaker_session=session)
    except (ValueError, botocore.exceptions.ClientError) as error:
        raise RuntimeError(
            f"No SageMaker execution role could be found ({error}). In SageMaker Studio or on a notebook "
            "instance the role comes with the environment. Elsewhere, create a role that SageMaker can "
            "assume (policy AmazonSageMakerFullAccess) and export "
            f"{ROLE_ENV}=arn:aws:iam::<account>:role/<name>, or use make_session(run_mode='local')."
        ) from error


def describe_mode(session: sagemaker.Session) -> str:
    """One line saying where jobs will run."""
    if getattr(session, "run_mode", None) == "local":
        return (
            f"local mode: jobs run on this machine as processes (no Docker, no AWS); state in "
            f"{local_mode.active_root() or local_mode.local_root()}; "
            f"region {session.boto_region_name} is nominal."
        )
    return f"SageMaker: jobs run in AWS account region {session.boto_region_name} and are billed."
