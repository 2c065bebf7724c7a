"""Training jobs through the local endpoint, as SDK v3's ModelTrainer sends them: CreateTrainingJob,
DescribeTrainingJob, ListTrainingJobs and StopTrainingJob run by local mode's job engine, the logs in
CloudWatch Logs, every request checked against botocore's input shape first. Raw boto3 clients of the
main environment, pointed at the endpoint (the real ModelTrainer: tests/notebooks/test_model_trainer_notebook.py)."""

from __future__ import annotations

import io
import tarfile
import time
import uuid

import pytest
from botocore.exceptions import ClientError

from local_mode.jobs import hosts

from .conftest import boto3_session

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
BUCKET = "endpoint-job-tests"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-trainer:latest"  # script mode: this environment's Python


@pytest.fixture(scope="module")
def aws(endpoint):
    session = boto3_session(endpoint)
    s3 = session.client("s3", endpoint_url=endpoint.url)
    s3.create_bucket(Bucket=BUCKET)
    return {name: session.client(name, endpoint_url=endpoint.url) for name in ("sagemaker", "logs")} | {"s3": s3}


def job_request(name: str, **overrides) -> dict:
    request = {
        "TrainingJobName": name,
        "AlgorithmSpecification": {
            "TrainingImage": IMAGE,
            "TrainingInputMode": "File",
            "MetricDefinitions": [{"Name": "loss", "Regex": r"loss=([0-9.]+)"}],
        },
        "RoleArn": ROLE,
        "OutputDataConfig": {"S3OutputPath": f"s3://{BUCKET}/jobs"},
        "ResourceConfig": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
    }
    request.update(overrides)
    return request


def entrypoint_job(name: str, shell: str, count: int = 1) -> dict:
    """A job whose ContainerEntrypoint replaces the image's, as ModelTrainer's /bin/bash -c sm_train.sh does."""
    request = job_request(
        name, ResourceConfig={"InstanceType": "ml.m5.xlarge", "InstanceCount": count, "VolumeSizeInGB": 10}
    )
    request["AlgorithmSpecification"] |= {"ContainerEntrypoint": ["/bin/sh"], "ContainerArguments": ["-c", shell]}
    return request


def wait(sagemaker, name: str, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout  # a local job may wait for the machine-wide lock first
    while (job := sagemaker.describe_training_job(TrainingJobName=name))["TrainingJobStatus"] in (
        "InProgress",
        "Stopping",
    ):
        assert time.monotonic() < deadline, job["SecondaryStatusTransitions"]
        time.sleep(0.5)
    return job


def log_lines(logs, name: str) -> list[str]:
    streams = logs.describe_log_streams(logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix=name)
    lines = []
    for stream in streams["logStreams"]:
        events = logs.get_log_events(
            logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream["logStreamName"], startFromHead=True
        )["events"]
        lines += [event["message"] for event in events]
    return lines


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_a_script_mode_job_runs_and_its_log_reaches_cloudwatch(aws):
    code = io.BytesIO()
    with tarfile.open(fileobj=code, mode="w:gz") as tar:
        script = b"print('step=1 loss=0.25', flush=True)\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(script)
        tar.addfile(info, io.BytesIO(script))
    aws["s3"].put_object(Bucket=BUCKET, Key="code/sourcedir.tar.gz", Body=code.getvalue())
    name = unique("script")
    aws["sagemaker"].create_training_job(
        **job_request(
            name,
            HyperParameters={
                "sagemaker_program": '"train.py"',
                "sagemaker_submit_directory": f'"s3://{BUCKET}/code/sourcedir.tar.gz"',
            },
        )
    )

    job = wait(aws["sagemaker"], name)
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    assert [m["Value"] for m in job["FinalMetricDataList"]] == [0.25]
    assert "step=1 loss=0.25" in log_lines(aws["logs"], name)
    listed = aws["sagemaker"].list_training_jobs(NameContains=name)["TrainingJobSummaries"]
    assert [(j["TrainingJobName"], j["TrainingJobStatus"]) for j in listed] == [(name, "Completed")]


def test_a_container_entrypoint_replaces_the_toolkit(aws):
    name = unique("entrypoint")
    shell = (
        "echo loss=0.5 host=$(cat /opt/ml/input/config/resourceconfig.json | tr -d ' ' | cut -c1-25) "
        "&& echo done > /opt/ml/model/result.txt"
    )
    aws["sagemaker"].create_training_job(**entrypoint_job(name, shell, count=2))

    job = wait(aws["sagemaker"], name)
    if hosts.isolation() != hosts.NAMESPACES:  # the SDK's scripts need the literal /opt/ml
        assert job["TrainingJobStatus"] == "Failed"
        assert "ContainerEntrypoint" in job["FailureReason"] and hosts.NAMESPACES in job["FailureReason"]
        return
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    lines = log_lines(aws["logs"], name)
    assert sorted(line for line in lines if line.startswith("loss=")) == [
        'loss=0.5 host={"current_host":"algo-1",',
        'loss=0.5 host={"current_host":"algo-2",',
    ]
    model = aws["s3"].get_object(Bucket=BUCKET, Key=f"jobs/{name}/output/model.tar.gz")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(model)) as tar:
        assert tar.extractfile("result.txt").read() == b"done\n"


def test_stop_training_job_stops_a_running_job(aws):
    if hosts.isolation() != hosts.NAMESPACES:
        pytest.skip("ContainerEntrypoint jobs run with mount namespaces only")
    name = unique("stop")
    aws["sagemaker"].create_training_job(**entrypoint_job(name, "echo started; sleep 120"))
    deadline = time.monotonic() + 300
    while "started" not in log_lines(aws["logs"], name):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    aws["sagemaker"].stop_training_job(TrainingJobName=name)
    assert wait(aws["sagemaker"], name, timeout=60)["TrainingJobStatus"] == "Stopped"


def test_the_endpoint_checks_job_requests_as_sagemaker_does(aws):
    sagemaker = aws["sagemaker"]
    with pytest.raises(ClientError) as error:  # botocore sends enums unchecked; the service checks them
        sagemaker.create_training_job(
            **job_request(
                unique("bad"),
                ResourceConfig={"InstanceType": "ml.not-an-instance", "InstanceCount": 1, "VolumeSizeInGB": 10},
            )
        )
    assert error.value.response["Error"]["Code"] == "ValidationException"
    assert "resourceConfig.instanceType" in error.value.response["Error"]["Message"]

    with pytest.raises(ClientError) as error:
        sagemaker.create_training_job(**job_request(unique("spot"), EnableManagedSpotTraining=True))
    assert "MaxWaitTimeInSeconds" in error.value.response["Error"]["Message"]

    with pytest.raises(ClientError) as error:
        sagemaker.describe_training_job(TrainingJobName=unique("missing"))
    assert error.value.response["Error"]["Code"] == "ValidationException"

    with pytest.raises(ClientError) as error:  # an operation the endpoint does not answer says which it does
        sagemaker.describe_processing_job(ProcessingJobName="anything")
    assert error.value.response["Error"]["Code"] == "ValidationException"
    assert "CreateTrainingJob" in error.value.response["Error"]["Message"]
