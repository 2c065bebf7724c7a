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
from botocore.utils import parse_to_aware_datetime


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
        group_names = _check_instance_groups(resources)
    else:
        _check_instance_type(resources.get("InstanceType"), "resourceConfig.instanceType")
        _check_instance_count(resources.get("InstanceCount", 0), "resourceConfig.instanceCount")
        group_names = []

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
        _check_channel_groups(channel["ChannelName"], s3.get("InstanceGroupNames"), group_names)
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


def _check_instance_type(instance_type, where: str) -> None:
    allowed = _shape("TrainingInstanceType").enum
    if instance_type not in allowed:
        raise _constraint_error(instance_type, where, f"Member must satisfy enum value set: [{', '.join(allowed)}]")


def _check_instance_count(count, where: str) -> None:
    if count < 1:
        raise _constraint_error(count, where, "Member must have value greater than or equal to 1")


def _check_instance_groups(resources: dict) -> list[str]:
    """A heterogeneous cluster: each group named once, with a valid type and at least one instance.
    Returns the group names."""
    if "InstanceType" in resources or "InstanceCount" in resources:
        raise ServiceError(
            "ValidationException",
            "ResourceConfig cannot set InstanceType or InstanceCount together with InstanceGroups: give each "
            "group's type and count in InstanceGroups only (the SDK: instance_groups= without "
            "instance_type= and instance_count=).",
        )
    groups = resources["InstanceGroups"]
    limit = _shape("InstanceGroups").metadata["max"]
    if not 1 <= len(groups) <= limit:
        raise _constraint_error(
            f"[{len(groups)} groups]",
            "resourceConfig.instanceGroups",
            f"Member must have length greater than or equal to 1 and less than or equal to {limit}",
        )
    names = []
    for number, group in enumerate(groups, start=1):
        where = f"resourceConfig.instanceGroups.{number}.member"
        name = group["InstanceGroupName"]
        _check_pattern(name, "InstanceGroupName", f"{where}.instanceGroupName")
        if len(name) > _shape("InstanceGroupName").metadata["max"]:
            raise _constraint_error(
                name, f"{where}.instanceGroupName", "Member must have length less than or equal to 64"
            )
        if name in names:
            raise ServiceError(
                "ValidationException",
                f"Instance group names must be unique within ResourceConfig.InstanceGroups: '{name}' is used "
                f"by groups {names.index(name) + 1} and {number}. Give each group its own name.",
            )
        names.append(name)
        _check_instance_type(group["InstanceType"], f"{where}.instanceType")
        _check_instance_count(group["InstanceCount"], f"{where}.instanceCount")
    return names


def _check_channel_groups(channel: str, assigned: list[str] | None, group_names: list[str]) -> None:
    """``S3DataSource.InstanceGroupNames`` may name only groups of the job's InstanceGroups."""
    if not assigned:
        return
    if not group_names:
        raise ServiceError(
            "ValidationException",
            f"Channel '{channel}' names instance groups {assigned} in InstanceGroupNames, but the job has no "
            "ResourceConfig.InstanceGroups: define the groups, or remove InstanceGroupNames from the channel.",
        )
    unknown = [name for name in assigned if name not in group_names]
    if unknown:
        raise ServiceError(
            "ValidationException",
            f"Channel '{channel}' is assigned to instance group(s) {unknown} that ResourceConfig.InstanceGroups "
            f"does not define (its groups: {group_names}). Name one of those groups in InstanceGroupNames.",
        )


def epoch(value) -> float:
    """A timestamp member as botocore accepts it (epoch seconds, or ISO 8601 text) in epoch seconds."""
    try:
        return parse_to_aware_datetime(value).timestamp()
    except (TypeError, ValueError, OverflowError, OSError, RuntimeError):
        raise ServiceError("ValidationException", f"Timestamp {value!r} is not a time: give epoch seconds.") from None


def page_start(request: dict) -> int:
    """Where a List* page starts: the NextToken the previous page gave (an offset), or 0."""
    token = request.get("NextToken", "0")
    if not re.fullmatch(r"[0-9]{1,12}", token):
        raise ServiceError(
            "ValidationException",
            f"NextToken {token!r} is not a token this endpoint gave: pass the NextToken of the previous "
            "page unchanged, or leave it out for the first page.",
        )
    return int(token)
