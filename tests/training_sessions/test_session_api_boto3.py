"""The endpoint through raw boto3 clients (the main environment's botocore, pinned 1.44): what the
service checks, sequence-number rules, billing, the lifecycle and a killed service process."""

import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from botocore.exceptions import ClientError, ParamValidationError

from local_mode import session_service

from .conftest import boto3_session

REPO = Path(__file__).resolve().parents[2]

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
TINY_ARN = "arn:aws:sagemaker:us-east-1:aws:hub-content/SageMakerPublicHub/Model/local-tiny-qwen2/1.0.0"


def create(control, name=None, rank=4, base=TINY_ARN, group=None):
    """A session; with ``group``, a model package group it saves into (created here by that name)."""
    name = name or f"t-{uuid.uuid4().hex[:10]}"
    packages = {}
    if group:
        packages["ModelPackageGroupArn"] = control.create_model_package_group(ModelPackageGroupName=group)[
            "ModelPackageGroupArn"
        ]
    control.create_training_session(
        TrainingSessionName=name,
        LoraConfig={"Rank": rank, "Alpha": 2 * rank},
        RoleArn=ROLE,
        ModelConfig={"BaseModelArn": base},
        OutputConfig={"S3Location": {"Path": "s3://session-tests/out"}},
        **packages,
    )
    return name


def datum(tokens, **overrides):
    inputs = {
        "target_tokens": {"data": tokens[1:], "dtype": "int64"},
        "weights": {"data": [1.0] * (len(tokens) - 1), "dtype": "float32"},
    }
    inputs.update(overrides)
    return {
        "modelInput": {"chunks": [{"tokens": tokens[:-1], "type": "encoded_text"}]},
        "lossFnInputs": inputs,
    }


FORWARD_BACKWARD = {"forwardBackward": {"lossFnName": "cross_entropy", "datumList": [datum([5, 6, 7, 8, 9])]}}
STEP = {"optimizerStep": {"adamParamsConfig": {"learningRate": 1e-2}}}


def result(runtime, name, op, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        answer = runtime.get_training_operation_result(trainingSessionName=name, operationId=op)
        if answer["status"] in ("Completed", "Failed", "Skipped") or time.monotonic() > deadline:
            return answer


def code(error):
    return error.value.response["Error"]["Code"], error.value.response["Error"]["Message"]


def test_hub_lists_the_local_base_models(clients):
    control, _ = clients
    listed = control.list_hub_contents(HubName="SageMakerPublicHub", HubContentType="Model")["HubContentSummaries"]
    from local_mode.offline_models import smollm2_installed

    names = {s["HubContentName"] for s in listed}
    # The project's models, the real one where its wheel is; other tests may register more on this endpoint.
    assert "local-tiny-qwen2" in names and ("local-smollm2-135m-instruct" in names) == smollm2_installed(), names
    assert all("@capability:training_session" in s["HubContentSearchKeywords"] for s in listed)
    described = control.describe_hub_content(
        HubName="SageMakerPublicHub", HubContentType="Model", HubContentName="local-tiny-qwen2"
    )
    assert described["HubContentArn"] == TINY_ARN
    assert '"HuggingfaceId": "local/tiny-qwen2"' in described["HubContentDocument"]


def test_out_of_order_sequence_numbers_wait_and_duplicates_answer_the_first(clients, endpoint):
    control, runtime = clients
    name = create(control)
    # Sequence 2 (the optimizer step) arrives first: it waits for 1 instead of stepping on no gradient.
    step = runtime.execute_training_operation(
        trainingSessionName=name, sequenceNumber=2, clientToken="step-1", operationConfig=STEP
    )["operationId"]
    time.sleep(0.5)
    assert runtime.get_training_operation_result(trainingSessionName=name, operationId=step)["status"] == "Pending"
    first = runtime.execute_training_operation(
        trainingSessionName=name, sequenceNumber=1, clientToken="fb-1", operationConfig=FORWARD_BACKWARD
    )["operationId"]
    again = runtime.execute_training_operation(
        trainingSessionName=name, sequenceNumber=1, clientToken="fb-1", operationConfig=FORWARD_BACKWARD
    )["operationId"]
    assert again == first
    fb, optim = result(runtime, name, first), result(runtime, name, step)
    assert fb["status"] == optim["status"] == "Completed"
    assert optim["operationResult"]["optimizerStep"]["metrics"]["grad_norm"] > 0  # the gradient was there
    assert fb["tokenUsage"]["trainingTokens"] == 4
    assert len(fb["operationResult"]["forwardBackward"]["lossFnOutputs"][0]["logprobs"]["data"]) == 4

    with pytest.raises(ClientError) as error:  # a number already used, under another token
        runtime.execute_training_operation(
            trainingSessionName=name, sequenceNumber=2, clientToken="other", operationConfig=STEP
        )
    assert code(error)[0] == "ConflictException"
    assert "Sequence number 2 is already used" in code(error)[1] and "LastReceivedSequenceNumber is 2" in code(error)[1]

    detail = control.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    assert detail["TrainingSessionStatus"] == "Running"
    assert detail["LastReceivedSequenceNumber"] == 2
    assert detail["BillableTokenUsage"]["TrainingTokenCount"] == 4
    control.stop_training_session(TrainingSessionName=name)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"weights": {"data": [1.0, 1.0], "dtype": "float32"}}, "has 2 values but modelInput has 4 tokens"),
        ({"weights": {"data": [1.0] * 4, "dtype": "float8"}}, "dtype 'float8': use one of"),
        (None, "lacks logprobs, advantages, which ppo needs"),
    ],
)
def test_bad_datums_are_refused_and_the_session_is_unchanged(clients, change, message):
    control, runtime = clients
    name = create(control)
    loss = "ppo" if change is None else "cross_entropy"
    bad = datum([5, 6, 7, 8, 9], **(change or {}))
    with pytest.raises(ClientError) as error:
        runtime.execute_training_operation(
            trainingSessionName=name,
            sequenceNumber=1,
            operationConfig={"forwardBackward": {"lossFnName": loss, "datumList": [bad]}},
        )
    assert code(error)[0] == "ValidationException"
    assert message in code(error)[1]
    detail = control.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    assert detail["LastReceivedSequenceNumber"] == 0  # not received: the same number can be sent again
    op = runtime.execute_training_operation(
        trainingSessionName=name, sequenceNumber=1, operationConfig=FORWARD_BACKWARD
    )["operationId"]
    assert result(runtime, name, op)["status"] == "Completed"
    control.stop_training_session(TrainingSessionName=name)


def test_limits_in_the_shapes_are_checked_by_the_endpoint_not_by_botocore(clients):
    """botocore validates types, required members and minima before sending; it does not check
    maxima (rank <= 256, learningRate <= 0.01). The endpoint does, in SageMaker's words."""
    control, runtime = clients
    with pytest.raises(ParamValidationError, match="valid min value: 1"):
        create(control, rank=0)
    with pytest.raises(ClientError) as error:
        create(control, rank=300)
    assert code(error)[0] == "ValidationException"
    assert (
        "'createTrainingSessionRequest.loraConfig.rank'" in code(error)[1]
        and "less than or equal to 256" in code(error)[1]
    )
    name = create(control)
    with pytest.raises(ClientError) as error:
        runtime.execute_training_operation(
            trainingSessionName=name,
            sequenceNumber=1,
            operationConfig={"optimizerStep": {"adamParamsConfig": {"learningRate": 0.05}}},
        )
    assert code(error)[0] == "ValidationException" and "less than or equal to 0.01" in code(error)[1]
    with pytest.raises(ClientError) as error:
        runtime.execute_training_operation(
            trainingSessionName=name,
            sequenceNumber=1,
            operationConfig={
                "forwardBackward": {
                    "lossFnName": "ppo",
                    "datumList": [datum([1, 2, 3])],
                    "lossFnConfig": {"clip_high_threshold": 50},
                }
            },
        )
    assert "clip_high_threshold=50 is out of range" in code(error)[1]
    control.stop_training_session(TrainingSessionName=name)


def test_unknown_base_model_and_name_reuse(clients):
    control, _ = clients
    with pytest.raises(ClientError) as error:
        create(control, base=TINY_ARN.replace("local-tiny-qwen2", "meta-llama-3"))
    assert code(error)[0] == "ResourceNotFound"
    assert "local mode serves local/tiny-qwen2" in code(error)[1] and "register_base_model" in code(error)[1]
    name = create(control)
    with pytest.raises(ClientError) as error:
        create(control, name=name)
    assert code(error)[0] == "ResourceInUse"
    control.stop_training_session(TrainingSessionName=name)


def test_lifecycle_stop_then_delete(clients):
    control, runtime = clients
    name = create(control)
    with pytest.raises(ClientError) as error:
        control.delete_training_session(TrainingSessionName=name)
    assert code(error)[0] == "ConflictException" and "stop it first" in code(error)[1]
    control.stop_training_session(TrainingSessionName=name)
    detail = control.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    assert detail["TrainingSessionStatus"] == "Stopped" and "EndTime" in detail
    with pytest.raises(ClientError) as error:
        runtime.execute_training_operation(trainingSessionName=name, sequenceNumber=1, operationConfig=FORWARD_BACKWARD)
    assert code(error)[0] == "ConflictException" and "is Stopped" in code(error)[1]
    with pytest.raises(ClientError) as error:  # what the SDK's stop() treats as already done
        control.stop_training_session(TrainingSessionName=name)
    assert "invalid session state transition from Stopped to Stopping" in code(error)[1]
    listed = control.list_training_sessions(NameContains=name)["TrainingSessionSummaries"]
    assert [s["TrainingSessionStatus"] for s in listed] == ["Stopped"]
    control.delete_training_session(TrainingSessionName=name)
    with pytest.raises(ClientError) as error:
        control.describe_training_session(TrainingSessionName=name)
    assert code(error)[0] == "ResourceNotFound"


def test_kernels_that_start_the_service_at_once_share_one(tmp_path):
    root = tmp_path / "root"
    start = f"from local_mode import session_service; print(session_service.start_service({str(root)!r}).pid)"
    starters = [
        subprocess.Popen([sys.executable, "-c", start], stdout=subprocess.PIPE, text=True, cwd=REPO) for _ in range(2)
    ]
    try:
        pids = {int(p.communicate(timeout=120)[0].split()[-1]) for p in starters}
        assert len(pids) == 1, pids
        running = [p for p in psutil.process_iter(["cmdline"]) if str(root) in " ".join(p.info["cmdline"] or [])]
        assert [p.pid for p in running] == list(pids)
    finally:
        session_service.stop_service(root)


def test_stopping_the_service_stops_a_stray_one_of_the_same_root(tmp_path):
    root = tmp_path / "root"
    first = session_service.start_service(root)
    (root / "training-sessions" / "service.json").unlink()  # its record lost: the next start makes another
    second = session_service.start_service(root)
    assert second.pid != first.pid
    assert session_service.stop_service(root)
    assert not any(psutil.pid_exists(p.pid) and psutil.Process(p.pid).status() != "zombie" for p in (first, second))


def test_a_killed_service_leaves_its_sessions_failed(tmp_path):
    root = tmp_path / "root"
    first = session_service.start_service(root)
    name = create(boto3_session(first).client("sagemaker", endpoint_url=first.url))
    psutil.Process(first.pid).kill()
    psutil.Process(first.pid).wait(10)
    assert session_service.running_endpoint(root) is None
    second = session_service.start_service(root)
    try:
        assert second.pid != first.pid
        client = boto3_session(second).client("sagemaker", endpoint_url=second.url)
        detail = client.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
        assert detail["TrainingSessionStatus"] == "Failed"
        assert f"ended (pid {first.pid})" in detail["ErrorDetails"]
        assert not [
            p
            for p in psutil.process_iter(["cmdline"])
            if str(root) in " ".join(p.info["cmdline"] or []) and p.pid != second.pid
        ]  # nothing of the first service runs on
    finally:
        session_service.stop_service(root)
