"""Launch errors translated into what to do about them.

The first training job in a new account rarely starts: no credentials, no execution role,
an instance quota of 0, no p5 capacity in the region. The AWS error says what happened;
this module adds how to fix it. Wrap a launch in ``explain_launch_errors(...)``: any of
these errors is raised again as ``LaunchError`` whose message holds the original error
and the fix; anything else passes through untouched.

    with explain_launch_errors("ml.p5.48xlarge", 2, region):
        estimator.fit(inputs, wait=False)
"""

from __future__ import annotations

import re
from contextlib import contextmanager

QUOTAS_URL = "https://console.aws.amazon.com/servicequotas/home/services/sagemaker/quotas"
ROLE_DOCS = "https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-roles.html"


class LaunchError(RuntimeError):
    """A launch failed for a reason with a known fix (the message says both)."""


def _guidance(
    code: str, message: str, instance_type: str | None, instance_count: int | None, region: str | None
) -> str | None:
    where = f" in {region}" if region else ""
    what = f"{instance_count} x {instance_type}" if instance_type else "this instance type"
    if code == "ResourceLimitExceeded":
        quota = re.search(r"is (\d+) Instances", message)
        zero = quota is not None and quota.group(1) == "0"
        return (
            f"The account's quota for {instance_type or 'this instance'} training usage{where} is too small "
            f"for {what}{' (it is 0: new accounts start there for p4/p5)' if zero else ''}.\n"
            f"Fix: request an increase of '{instance_type} for training job usage' in Service Quotas "
            f"({QUOTAS_URL}), or for spot jobs '{instance_type} for spot training job usage'; "
            f"meanwhile set instance_type to one you have quota for (e.g. ml.g5.12xlarge) in the "
            f"parameters cell, or lower instance_count."
        )
    if (
        code in ("CapacityError", "InsufficientCapacityError", "InsufficientInstanceCapacity")
        or "capacity" in message.lower()
        and code in ("ValidationException", "ResourceInUse", "ThrottlingException")
    ):
        return (
            f"SageMaker has no free {instance_type or 'instance'} capacity{where} right now.\n"
            f"Fix: retry later, use managed spot with a long max_wait (it waits for capacity), try a "
            f"region with p5 capacity (us-east-1, us-east-2, us-west-2), reserve capacity with "
            f"SageMaker training plans, or start on a smaller type (ml.p4de.24xlarge, ml.g5.12xlarge)."
        )
    if code in ("AccessDeniedException", "AccessDenied") or (
        code == "ValidationException" and ("role" in message.lower() or "assume" in message.lower())
    ):
        return (
            "The execution role cannot be used by SageMaker, or your identity may not pass it.\n"
            "Fix: create a role trusted by sagemaker.amazonaws.com with the AmazonSageMakerFullAccess "
            "policy and S3 access to your bucket, then set role='arn:aws:iam::<account>:role/<name>' in "
            f"the parameters cell; your own identity needs iam:PassRole on it ({ROLE_DOCS})."
        )
    if code in ("UnrecognizedClientException", "InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException"):
        return (
            "The AWS credentials were rejected (unknown or expired).\n"
            "Fix: refresh them (aws sso login, or new keys in ~/.aws/credentials), or run with "
            "run_mode='local' to use local mode."
        )
    if code == "ValidationException" and "instance type" in message.lower():
        return (
            f"{instance_type} is not offered for training{where}.\n"
            "Fix: choose another region or instance type in the parameters cell."
        )
    return None


def explain(
    error: BaseException, instance_type: str | None = None, instance_count: int | None = None, region: str | None = None
) -> str | None:
    """Guidance for a launch error, or None if it is not one we know."""
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
    )

    if isinstance(error, (NoCredentialsError, PartialCredentialsError)):
        return (
            "No AWS credentials were found.\nFix: configure them (aws configure, aws sso login, or an "
            "instance/Studio role), or run with run_mode='local' (no AWS account needed)."
        )
    if isinstance(error, NoRegionError):
        return "No AWS region is set.\nFix: set region in the parameters cell, or AWS_DEFAULT_REGION."
    if isinstance(error, EndpointConnectionError):
        return (
            f"The SageMaker endpoint{' in ' + region if region else ''} cannot be reached.\n"
            "Fix: check the network and the region name."
        )
    if isinstance(error, ClientError):
        err = error.response.get("Error", {})
        return _guidance(err.get("Code", ""), err.get("Message", ""), instance_type, instance_count, region)
    text = str(error)
    if isinstance(error, ValueError) and "role" in text.lower() and "execution" in text.lower():
        return (
            "No execution role could be found for this identity (outside SageMaker Studio or a notebook "
            "instance there is none by default).\nFix: set role='arn:aws:iam::<account>:role/<name>' in the "
            f"parameters cell, a role trusted by sagemaker.amazonaws.com ({ROLE_DOCS})."
        )
    return None


def explain_failure(description: dict) -> str | None:
    """Guidance for a job that reached Failed (from its FailureReason), or None."""
    reason = description.get("FailureReason", "") or ""
    instance_type = description.get("ResourceConfig", {}).get("InstanceType")
    count = description.get("ResourceConfig", {}).get("InstanceCount")
    code = reason.split(":", 1)[0].strip()
    if code in ("CapacityError", "InsufficientCapacityError"):
        return _guidance("CapacityError", reason, instance_type, count, None)
    if "ResourceLimitExceeded" in reason:
        return _guidance("ResourceLimitExceeded", reason, instance_type, count, None)
    if code == "AlgorithmError":
        return (
            "The training script failed. Its reason is above (from /opt/ml/output/failure) and the full "
            "log is in CloudWatch under /aws/sagemaker/TrainingJobs."
        )
    return None


@contextmanager
def explain_launch_errors(
    instance_type: str | None = None, instance_count: int | None = None, region: str | None = None
):
    try:
        yield
    except Exception as error:
        guidance = explain(error, instance_type, instance_count, region)
        if guidance is None:
            raise
        raise LaunchError(f"{type(error).__name__}: {error}\n\n{guidance}") from error
