"""A model package trained from another base model is refused wherever a session would load it: the
teacher's ``computeLogprobs`` and a ``sample`` on it, ``loadWeightsForSampling``, ``loadState`` (what
``create_training_client_from_state`` sends) and a chat answered by it (the ``X-Amzn-SageMaker-Model-Package``
header). The other base model here has the student's tokenizer and other weights: the client's tokenizer
check lets its checkpoint through, and a LoRA adapter of the same shapes would load without a complaint.
Each refusal is a 400 ValidationException at submit that names both base models and what to do; the
session is left as it was (a refused loadState takes no sequence number), and a checkpoint of the
session's own base model is still accepted."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
import torch
from botocore.exceptions import ClientError
from transformers import AutoModelForCausalLM

from local_mode import session_service

from .test_session_api_boto3 import FORWARD_BACKWARD, STEP, create, result
from .test_session_bad_input import assert_clean, forward_logprobs
from .test_session_chat import chat

OTHER_MODEL = "local/tiny-other-weights"
PROMPT = {"chunks": [{"tokens": [5, 6, 7, 8, 9], "type": "encoded_text"}]}
SCENARIOS = Path(__file__).with_name("distillation_scenarios.py")


@pytest.fixture(scope="module")
def other_base_model(endpoint, tiny_model_path, tmp_path_factory) -> str:
    """The tiny model's tokenizer and architecture with other weights, registered as another base model;
    its hub content ARN."""
    folder = tmp_path_factory.mktemp("tiny-other-weights")
    shutil.copytree(tiny_model_path, folder, dirs_exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(folder)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(folder)
    name = session_service.register_base_model(OTHER_MODEL, folder, root=endpoint.root)
    return f"arn:aws:sagemaker:{endpoint.region}:aws:hub-content/SageMakerPublicHub/Model/{name}/1.0.0"


def trained_and_saved(runtime, name: str, save: str) -> str:
    """One cross-entropy step on session ``name``, then ``save`` (saveWeights or saveState): its package."""
    for sequence, config in enumerate([FORWARD_BACKWARD, STEP, {save: {}}], 1):
        op = runtime.execute_training_operation(
            trainingSessionName=name, sequenceNumber=sequence, operationConfig=config
        )
        done = result(runtime, name, op["operationId"])
        assert done["status"] == "Completed", done
    return done["operationResult"][save]["modelPackageArn"]


@pytest.fixture(scope="module")
def sessions(clients, other_base_model):
    """(the student's session on the tiny model, a checkpoint of the other base model, one of the tiny model)."""
    control, runtime = clients
    teacher = create(control, base=other_base_model, group=f"other-{uuid.uuid4().hex[:8]}")
    other_package = trained_and_saved(runtime, teacher, "saveState")
    control.stop_training_session(TrainingSessionName=teacher)
    student = create(control, group=f"own-{uuid.uuid4().hex[:8]}")
    own_package = trained_and_saved(runtime, student, "saveWeights")
    yield student, other_package, own_package
    control.stop_training_session(TrainingSessionName=student)


def assert_refused(raised, package: str) -> str:
    response = raised.value.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert response["Error"]["Code"] == "ValidationException"
    message = response["Error"]["Message"]
    assert f"Model package {package} was trained from base model {OTHER_MODEL}" in message, message
    assert "runs base model local/tiny-qwen2" in message, message
    assert "give a checkpoint trained from local/tiny-qwen2" in message, message
    assert f"or use this one in a session of {OTHER_MODEL}" in message, message
    assert_clean(message)
    return message


def sampling_result(runtime, name: str, config: dict) -> dict:
    op = runtime.execute_sampling_operation(trainingSessionName=name, operationConfig=config)["operationId"]
    answer = runtime.get_sampling_operation_result(trainingSessionName=name, operationId=op)
    while answer["status"] in ("Pending", "InProgress"):
        answer = runtime.get_sampling_operation_result(trainingSessionName=name, operationId=op)
    assert answer["status"] == "Completed", answer
    return answer["operationResult"]


SAMPLING = {
    "computeLogprobs": lambda package: {"computeLogprobs": {"prompt": PROMPT, "modelPackageArn": package}},
    "sample": lambda package: {
        "sample": {
            "prompt": PROMPT,
            "numSamples": 1,
            "samplingParams": {"maxTokens": 512, "temperature": 1.0, "seed": 3, "stop": [" "]},
            "modelPackageArn": package,
        }
    },
    "loadWeightsForSampling": lambda package: {"loadWeightsForSampling": {"modelPackageArn": package}},
}


@pytest.mark.parametrize("operation", SAMPLING)
def test_a_sampling_operation_on_a_checkpoint_of_another_base_model_is_refused(clients, sessions, operation):
    control, runtime = clients
    student, other_package, own_package = sessions
    billed = control.describe_training_session(TrainingSessionName=student)["TrainingSessionDetail"]
    with pytest.raises(ClientError) as raised:
        runtime.execute_sampling_operation(
            trainingSessionName=student, operationConfig=SAMPLING[operation](other_package)
        )
    assert_refused(raised, other_package)
    after = control.describe_training_session(TrainingSessionName=student)["TrainingSessionDetail"]
    assert after["BillableTokenUsage"] == billed["BillableTokenUsage"]  # nothing ran
    # A checkpoint of the session's own base model: the same operation is accepted.
    assert set(sampling_result(runtime, student, SAMPLING[operation](own_package))) == {operation}


def test_load_state_of_another_base_model_is_refused_and_takes_no_sequence_number(clients, sessions):
    control, runtime = clients
    student, other_package, _ = sessions
    last = control.describe_training_session(TrainingSessionName=student)["TrainingSessionDetail"][
        "LastReceivedSequenceNumber"
    ]
    before = forward_logprobs(runtime, student, last + 1)
    with pytest.raises(ClientError) as raised:
        runtime.execute_training_operation(
            trainingSessionName=student,
            sequenceNumber=last + 2,
            operationConfig={"loadState": {"modelPackageArn": other_package, "loadOptimizer": True}},
        )
    assert_refused(raised, other_package)
    detail = control.describe_training_session(TrainingSessionName=student)["TrainingSessionDetail"]
    assert detail["LastReceivedSequenceNumber"] == last + 1
    assert forward_logprobs(runtime, student, last + 2) == before  # the same weights: nothing was loaded


@pytest.mark.parametrize("stream", [False, True], ids=["SampleTrainingSession", "WithResponseStream"])
def test_a_chat_answered_by_a_checkpoint_of_another_base_model_is_refused(clients, sessions, stream):
    _, runtime = clients
    student, other_package, own_package = sessions
    body = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 4, "stream": stream}
    with pytest.raises(ClientError) as raised:
        chat(runtime, student, body, stream, modelPackageArn=other_package)
    assert_refused(raised, other_package)
    content_type, answer = chat(runtime, student, body, stream, modelPackageArn=own_package)
    assert content_type == ("text/event-stream" if stream else "application/json") and answer


def test_through_the_sdk_a_teacher_of_another_base_model_passes_the_tokenizer_check_and_the_service_refuses_it(
    sdk, other_base_model
):
    run = sdk("teacher_of_another_base_model", script=SCENARIOS, base_model=OTHER_MODEL)
    # The tokenizers are the same: the client's check lets the teacher through, the service refuses its scores.
    assert run["opened"] is True
    for key in ("compute_logprobs", "from_state_on_the_student_base_model"):
        refused = run[key]
        assert (refused["code"], refused["status"]) == ("ValidationException", 400), refused
        assert f"was trained from base model {OTHER_MODEL}" in refused["message"], refused
        assert "create_training_client_from_state reads the base model from the package" in refused["message"]
    assert run["from_state_session_status"] == "Stopped"  # the SDK stops the session it could not restore
    # Without base_model, create_training_client_from_state reads the package's and the checkpoint loads.
    assert run["from_state_reading_the_package"]["base_model"].endswith(
        f"/Model/{session_service.hub_content_name(OTHER_MODEL)}/1.0.0"
    )
    assert run["from_state_reading_the_package"]["logprobs"] == pytest.approx(run["teacher_session_logprobs"], abs=1e-5)
