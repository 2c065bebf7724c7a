"""The checks SageMaker's service makes on CreateTrainingJob that botocore does not.

botocore validates types, required members and lengths before a call leaves the client; it does
not check enums or patterns. SageMaker does, and answers ValidationException in this form:
``1 validation error detected: Value 'x' at 'resourceConfig.instanceType' failed to satisfy
constraint: ...``. Local mode answers the same, read from botocore's own service model.
"""

from __future__ import annotations

import re
from functools import cache

import botocore.session


class ServiceError(Exception):
    """An error answered as the SageMaker service would: becomes a botocore ClientError."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status = code, message, status


@cache
def _shape(name: str):
    return botocore.session.get_session().get_service_model("sagemaker").shape_for(name)


def _constraint_error(value, where: str, constraint: str) -> ServiceError:
    return ServiceError(
        "ValidationException",
        f"1 validation error detected: Value '{value}' at '{where}' failed to satisfy constraint: {constraint}",
    )


def _check_pattern(value: str, shape_name: str, where: str) -> None:
    pattern = _shape(shape_name).metadata["pattern"]
    if not re.fullmatch(pattern, value):
        raise _constraint_error(value, where, f"Member must satisfy regular expression pattern: ^{pattern}")


def validate_create_training_job(request: dict) -> None:
    """Raise ServiceError for what SageMaker rejects; return None when the request is acceptable."""
    _check_pattern(request["TrainingJobName"], "TrainingJobName", "trainingJobName")
    _check_pattern(request["RoleArn"], "RoleArn", "roleArn")

    resources = request["ResourceConfig"]
    if "InstanceGroups" in resources:
        raise ServiceError(
            "ValidationException",
            "Local mode runs homogeneous clusters only: use InstanceType and InstanceCount "
            "instead of InstanceGroups (heterogeneous clusters run on SageMaker).",
        )
    allowed = _shape("TrainingInstanceType").enum
    instance_type = resources.get("InstanceType")
    if instance_type not in allowed:
        raise _constraint_error(
            instance_type,
            "resourceConfig.instanceType",
            f"Member must satisfy enum value set: [{', '.join(allowed)}]",
        )
    count = resources.get("InstanceCount", 0)
    if count < 1:
        raise _constraint_error(
            count, "resourceConfig.instanceCount", "Member must have value greater than or equal to 1"
        )

    stopping = request.get("StoppingCondition", {})
    if request.get("EnableManagedSpotTraining"):
        max_wait = stopping.get("MaxWaitTimeInSeconds")
        max_run = stopping.get("MaxRuntimeInSeconds", 86400)
        if max_wait is None:
            raise ServiceError(
                "ValidationException",
                "Invalid MaxWaitTimeInSeconds. It is required for managed spot training "
                "(set max_wait on the estimator, at least max_run).",
            )
        if max_wait < max_run:
            raise ServiceError(
                "ValidationException",
                f"Invalid MaxWaitTimeInSeconds ({max_wait}). It must be greater than or equal to "
                f"MaxRuntimeInSeconds ({max_run}).",
            )
    elif "MaxWaitTimeInSeconds" in stopping:
        raise ServiceError(
            "ValidationException",
            "MaxWaitTimeInSeconds can be set only for managed spot training (EnableManagedSpotTraining).",
        )

    for channel in request.get("InputDataConfig", []):
        source = channel.get("DataSource", {})
        s3 = source.get("S3DataSource")
        if s3 is None:
            raise ServiceError(
                "ValidationException",
                f"Channel '{channel['ChannelName']}': local mode reads channels from S3 only "
                "(S3DataSource); FileSystemDataSource needs SageMaker.",
            )
        if s3.get("S3DataType", "S3Prefix") != "S3Prefix":
            raise ServiceError(
                "ValidationException",
                f"Channel '{channel['ChannelName']}': local mode supports S3DataType 'S3Prefix' only, "
                f"got '{s3.get('S3DataType')}'.",
            )
        if not s3["S3Uri"].startswith("s3://"):
            raise ServiceError(
                "ValidationException",
                f"Channel '{channel['ChannelName']}': S3Uri must start with s3://, got '{s3['S3Uri']}'.",
            )
    local_path = request.get("CheckpointConfig", {}).get("LocalPath", "/opt/ml/checkpoints")
    if not local_path.startswith("/opt/ml/"):
        raise ServiceError(
            "ValidationException",
            f"CheckpointConfig.LocalPath '{local_path}': local mode supports checkpoint folders "
            "under /opt/ml/ (the default /opt/ml/checkpoints is the usual choice).",
        )
