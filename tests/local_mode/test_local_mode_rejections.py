"""What SageMaker rejects, local mode rejects, with the service's error codes, as ClientError."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError

ROLE = "arn:aws:iam::123456789012:role/SageMakerLocalExecutionRole"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8-gpu-py312"


def request(**changes) -> dict:
    base = dict(
        TrainingJobName="fixture-rejected",
        AlgorithmSpecification={"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        RoleArn=ROLE,
        OutputDataConfig={"S3OutputPath": "s3://sagemaker-us-east-1-123456789012/out"},
        ResourceConfig={"InstanceType": "ml.p5.48xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        StoppingCondition={"MaxRuntimeInSeconds": 600},
    )
    base.update(changes)
    return base


@pytest.mark.parametrize(
    "changes, code, message",
    [
        (dict(ResourceConfig={"InstanceType": "ml.p5.48xl", "InstanceCount": 1, "VolumeSizeInGB": 10}),
         "ValidationException", "Value 'ml.p5.48xl' at 'resourceConfig.instanceType' failed to satisfy constraint"),
        (dict(ResourceConfig={"InstanceType": "ml.p5.48xlarge", "InstanceCount": 0, "VolumeSizeInGB": 10}),
         "ValidationException", "at 'resourceConfig.instanceCount'"),
        (dict(TrainingJobName="bad_name_with_underscores"),
         "ValidationException", "at 'trainingJobName' failed to satisfy constraint: Member must satisfy regular"),
        (dict(RoleArn="arn:aws:iam::12345:role/too-short-account"),
         "ValidationException", "at 'roleArn' failed to satisfy constraint"),
        (dict(EnableManagedSpotTraining=True),
         "ValidationException", "MaxWaitTimeInSeconds. It is required for managed spot training"),
        (dict(EnableManagedSpotTraining=True, StoppingCondition={"MaxRuntimeInSeconds": 600, "MaxWaitTimeInSeconds": 300}),
         "ValidationException", "greater than or equal to MaxRuntimeInSeconds"),
    ],
    ids=["instance-type", "instance-count", "job-name", "role-arn", "spot-no-max-wait", "spot-max-wait-short"],
)  # fmt: skip
def test_create_training_job_rejections(local_session, changes, code, message):
    client = boto3.client("sagemaker")
    with pytest.raises(ClientError) as raised:
        client.create_training_job(**request(**changes))
    assert raised.value.response["Error"]["Code"] == code
    assert message in raised.value.response["Error"]["Message"]
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    # Nothing was created.
    assert client.list_training_jobs()["TrainingJobSummaries"] == []


def test_name_in_use_and_unknown_job(local_session, fixture_code, role):
    from sagemaker.pytorch import PyTorch

    estimator = PyTorch(
        entry_point="fixture_train.py", source_dir=str(fixture_code), role=role, instance_type="ml.m5.xlarge",
        instance_count=1, framework_version="2.8.0", py_version="py312", sagemaker_session=local_session,
        hyperparameters={"steps": 1},
    )  # fmt: skip
    estimator.fit(job_name="fixture-in-use", logs=False)
    client = local_session.sagemaker_client
    with pytest.raises(client.exceptions.ResourceInUse, match="a training job with this name already exists"):
        client.create_training_job(**request(TrainingJobName="fixture-in-use"))
    with pytest.raises(ClientError, match="Requested resource not found"):
        client.describe_training_job(TrainingJobName="fixture-never-created")
    with pytest.raises(ClientError, match="needs SageMaker"):
        client.list_processing_jobs()  # an operation local mode does not answer


GROUPS = [
    {"InstanceGroupName": "learner", "InstanceType": "ml.p5.48xlarge", "InstanceCount": 1},
    {"InstanceGroupName": "judge", "InstanceType": "ml.c7i.16xlarge", "InstanceCount": 2},
]


def groups(*changes: dict) -> list[dict]:
    """GROUPS with the i-th group updated by the i-th change."""
    return [{**group, **change} for group, change in zip(GROUPS, changes + ({},) * len(GROUPS), strict=False)]


def channel(**s3) -> dict:
    source = {"S3DataType": "S3Prefix", "S3Uri": "s3://sagemaker-us-east-1-123456789012/data", **s3}
    return {"ChannelName": "tests", "DataSource": {"S3DataSource": source}}


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(ResourceConfig={"InstanceType": "ml.p5.48xlarge", "InstanceGroups": GROUPS, "VolumeSizeInGB": 10}),
         "cannot set InstanceType or InstanceCount together with InstanceGroups"),
        (dict(ResourceConfig={"InstanceCount": 3, "InstanceGroups": GROUPS, "VolumeSizeInGB": 10}),
         "cannot set InstanceType or InstanceCount together with InstanceGroups"),
        (dict(ResourceConfig={"InstanceGroups": groups({}, {"InstanceGroupName": "learner"}), "VolumeSizeInGB": 10}),
         "Instance group names must be unique within ResourceConfig.InstanceGroups: 'learner' is used by groups 1 and 2"),
        (dict(ResourceConfig={"InstanceGroups": groups({"InstanceGroupName": "two\nlines"}), "VolumeSizeInGB": 10}),
         "at 'resourceConfig.instanceGroups.1.member.instanceGroupName' failed to satisfy constraint"),
        (dict(ResourceConfig={"InstanceGroups": groups({}, {"InstanceCount": 0}), "VolumeSizeInGB": 10}),
         "Value '0' at 'resourceConfig.instanceGroups.2.member.instanceCount' failed to satisfy constraint: "
         "Member must have value greater than or equal to 1"),
        (dict(ResourceConfig={"InstanceGroups": groups({"InstanceType": "ml.c7i.huge"}), "VolumeSizeInGB": 10}),
         "Value 'ml.c7i.huge' at 'resourceConfig.instanceGroups.1.member.instanceType' failed to satisfy constraint"),
        (dict(ResourceConfig={"InstanceGroups": groups() * 3, "VolumeSizeInGB": 10}),
         "at 'resourceConfig.instanceGroups' failed to satisfy constraint: Member must have length"),
        (dict(ResourceConfig={"InstanceGroups": GROUPS, "VolumeSizeInGB": 10},
              InputDataConfig=[channel(InstanceGroupNames=["judges"])]),
         "Channel 'tests' is assigned to instance group(s) ['judges'] that ResourceConfig.InstanceGroups does not define"),
        (dict(InputDataConfig=[channel(InstanceGroupNames=["judge"])]),
         "Channel 'tests' names instance groups ['judge'] in InstanceGroupNames, but the job has no "
         "ResourceConfig.InstanceGroups"),
    ],
    ids=["groups-and-type", "groups-and-count", "duplicate-name", "bad-name", "count-zero", "group-type",
         "six-groups", "channel-unknown-group", "channel-groups-without-groups"],
)  # fmt: skip
def test_instance_group_rejections(local_session, changes, message):
    client = boto3.client("sagemaker")
    with pytest.raises(ClientError) as raised:
        client.create_training_job(**request(**changes))
    assert raised.value.response["Error"]["Code"] == "ValidationException"
    assert message in raised.value.response["Error"]["Message"]
    assert client.list_training_jobs()["TrainingJobSummaries"] == []
