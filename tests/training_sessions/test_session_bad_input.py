"""Requests a real service refuses: each is answered 4xx in SageMaker's error shape, with a message
that says what to fix, no traceback and no server path; the session stays as it was and the
sequence number is not consumed (the same number then runs a good request)."""

from __future__ import annotations

import json
import math
import os
import time
import uuid

import pytest
from botocore.exceptions import ClientError

from .conftest import ROLE, TINY_ARN, control_plane_request, send

VOCAB = 969  # the tiny model's vocabulary (local_mode.tiny_model)
CONTEXT = 1024  # and its max_position_embeddings


def create(control) -> str:
    name = f"bad-{uuid.uuid4().hex[:10]}"
    control.create_training_session(
        TrainingSessionName=name,
        LoraConfig={"Rank": 4, "Alpha": 8},
        RoleArn=ROLE,
        ModelConfig={"BaseModelArn": TINY_ARN},
        OutputConfig={"S3Location": {"Path": "s3://session-tests/out"}},
    )
    return name


def datum(tokens, **inputs):
    lengths = len(tokens) - 1
    given = {
        "target_tokens": {"data": tokens[1:], "dtype": "int64"},
        "weights": {"data": [1.0] * lengths, "dtype": "float32"},
    }
    given.update(inputs)
    return {"modelInput": {"chunks": [{"tokens": tokens[:-1], "type": "encoded_text"}]}, "lossFnInputs": given}


def rl_inputs(length, advantage=1.0):
    return {
        "logprobs": {"data": [-1.0] * length, "dtype": "float32"},
        "advantages": {"data": [advantage] * length, "dtype": "float32"},
    }


GOOD = datum([5, 6, 7, 8, 9])


def result(runtime, name, op, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        answer = runtime.get_training_operation_result(trainingSessionName=name, operationId=op)
        if answer["status"] in ("Completed", "Failed", "Skipped") or time.monotonic() > deadline:
            return answer


def forward_logprobs(runtime, name, sequence):
    op = runtime.execute_training_operation(
        trainingSessionName=name,
        sequenceNumber=sequence,
        operationConfig={"forward": {"lossFnName": "cross_entropy", "datumList": [GOOD]}},
    )["operationId"]
    answer = result(runtime, name, op)
    assert answer["status"] == "Completed", answer
    return answer["operationResult"]["forward"]["lossFnOutputs"][0]["logprobs"]["data"]


def assert_clean(message: str) -> None:
    """What a client sees: no traceback, no file of the server, no Python exception name."""
    assert "Traceback" not in message and 'File "' not in message and ".py" not in message, message
    assert os.sep + "work" + os.sep not in message and str(os.path.expanduser("~")) not in message, message


@pytest.fixture(scope="module")
def session(clients):
    """A Running session with gradient accumulated and one step taken: its state is worth keeping."""
    control, runtime = clients
    name = create(control)
    fb = runtime.execute_training_operation(
        trainingSessionName=name,
        sequenceNumber=1,
        operationConfig={"forwardBackward": {"lossFnName": "cross_entropy", "datumList": [GOOD]}},
    )["operationId"]
    step = runtime.execute_training_operation(
        trainingSessionName=name,
        sequenceNumber=2,
        operationConfig={"optimizerStep": {"adamParamsConfig": {"learningRate": 1e-3}}},
    )["operationId"]
    assert result(runtime, name, fb)["status"] == result(runtime, name, step)["status"] == "Completed"
    yield name
    control.stop_training_session(TrainingSessionName=name)


def refused(clients, session, operation_config, sampling=False):
    """Send one bad operation; return (code, message) after checking that the session is unchanged:
    the same LastReceivedSequenceNumber, and the next number still free and the weights as they were
    (a forward with that number gives the logprobs a forward gave before)."""
    control, runtime = clients
    last = control.describe_training_session(TrainingSessionName=session)["TrainingSessionDetail"][
        "LastReceivedSequenceNumber"
    ]
    before = forward_logprobs(runtime, session, last + 1)
    with pytest.raises(ClientError) as error:
        if sampling:
            runtime.execute_sampling_operation(trainingSessionName=session, operationConfig=operation_config)
        else:
            runtime.execute_training_operation(
                trainingSessionName=session, sequenceNumber=last + 2, operationConfig=operation_config
            )
    detail = control.describe_training_session(TrainingSessionName=session)["TrainingSessionDetail"]
    assert detail["LastReceivedSequenceNumber"] == last + 1  # the refused request took no number
    # No optimizer step ran, nor gradient from a poisoned loss: the same weights, the same floats.
    assert forward_logprobs(runtime, session, last + 2) == before
    assert error.value.response["ResponseMetadata"]["HTTPStatusCode"] in range(400, 500)
    code, message = error.value.response["Error"]["Code"], error.value.response["Error"]["Message"]
    assert_clean(message)
    return code, message


NON_FINITE = {
    "a NaN weight with cross_entropy": {
        "forwardBackward": {
            "lossFnName": "cross_entropy",
            "datumList": [datum([5, 6, 7, 8], weights={"data": [1.0, math.nan, 1.0], "dtype": "float32"})],
        }
    },
    "an infinite advantage with importance_sampling": {
        "forwardBackward": {
            "lossFnName": "importance_sampling",
            "datumList": [datum([5, 6, 7, 8], **rl_inputs(3, advantage=math.inf))],
        }
    },
    "a NaN learning rate": {"optimizerStep": {"adamParamsConfig": {"learningRate": math.nan}}},
    "a -inf logprob with ppo": {
        "forwardBackward": {
            "lossFnName": "ppo",
            "datumList": [
                datum(
                    [5, 6, 7, 8], **{**rl_inputs(3), "logprobs": {"data": [-1.0, -math.inf, -1.0], "dtype": "float32"}}
                )
            ],
        }
    },
}


@pytest.mark.parametrize("config", NON_FINITE.values(), ids=NON_FINITE.keys())
def test_non_finite_numbers_are_refused_at_submit(clients, session, config):
    code, message = refused(clients, session, config)
    assert code == "ValidationException"
    assert "finite" in message and ("NaN" in message or "Infinity" in message), message


def test_a_weight_that_overflows_its_dtype_is_refused(clients, session):
    bad = datum([5, 6, 7, 8], weights={"data": [1.0, 1e6, 1.0], "dtype": "float16"})
    code, message = refused(clients, session, {"forwardBackward": {"lossFnName": "cross_entropy", "datumList": [bad]}})
    assert code == "ValidationException"
    assert "datumList[0]" in message and "weights" in message and "float16" in message, message


def test_a_non_finite_sampling_parameter_is_refused(clients, session):
    config = {
        "sample": {
            "prompt": {"chunks": [{"tokens": [5, 6], "type": "encoded_text"}]},
            "numSamples": 1,
            "samplingParams": {"maxTokens": 512, "temperature": math.inf},
        }
    }
    code, message = refused(clients, session, config, sampling=True)
    assert code == "ValidationException" and "temperature" in message and "finite" in message, message


@pytest.mark.parametrize(
    "where, tokens, targets",
    [
        ("modelInput", [5, VOCAB, 7, 8], None),
        ("modelInput", [5, -1, 7, 8], None),
        ("target_tokens", [5, 6, 7, 8], [6, 7, VOCAB + 4000]),
        ("target_tokens", [5, 6, 7, 8], [6, -3, 8]),
    ],
)
def test_token_ids_outside_the_vocabulary_are_refused(clients, session, where, tokens, targets):
    bad = datum(tokens)
    if targets is not None:
        bad["lossFnInputs"]["target_tokens"]["data"] = targets
    code, message = refused(clients, session, {"forwardBackward": {"lossFnName": "cross_entropy", "datumList": [bad]}})
    assert code == "ValidationException"
    assert where in message and f"[0, {VOCAB})" in message and "datumList[0]" in message, message


@pytest.mark.parametrize("token", [VOCAB, -5])
def test_sampling_prompt_tokens_outside_the_vocabulary_are_refused(clients, session, token):
    for kind, config in (
        ("sample", {"numSamples": 1, "samplingParams": {"maxTokens": 512}}),
        ("computeLogprobs", {}),
    ):
        prompt = {"chunks": [{"tokens": [5, token, 7], "type": "encoded_text"}]}
        code, message = refused(clients, session, {kind: {"prompt": prompt, **config}}, sampling=True)
        assert code == "ValidationException" and "prompt" in message and f"[0, {VOCAB})" in message, message


def test_a_datum_longer_than_the_context_is_refused_naming_the_limit(clients, session):
    long = datum([5] * (CONTEXT + 2))
    code, message = refused(clients, session, {"forward": {"lossFnName": "cross_entropy", "datumList": [long]}})
    assert code == "ValidationException"
    assert f"{CONTEXT + 1} tokens" in message and f"context of {CONTEXT}" in message, message
    prompt = {"chunks": [{"tokens": [5] * (CONTEXT + 1), "type": "encoded_text"}]}
    code, message = refused(
        clients, session, {"computeLogprobs": {"prompt": prompt}}, sampling=True
    )  # a prompt too long to score
    assert code == "ValidationException" and f"context of {CONTEXT}" in message, message


def test_a_client_token_reused_with_other_parameters_is_refused(clients):
    control, runtime = clients
    name = create(control)
    forward = {"forward": {"lossFnName": "cross_entropy", "datumList": [GOOD]}}
    first = runtime.execute_training_operation(
        trainingSessionName=name, sequenceNumber=1, clientToken="tok-1", operationConfig=forward
    )["operationId"]
    again = runtime.execute_training_operation(
        trainingSessionName=name, sequenceNumber=1, clientToken="tok-1", operationConfig=forward
    )["operationId"]
    assert again == first  # a retry: the first operation answers
    for sequence, config in (
        (2, forward),  # another number
        (1, {"forward": {"lossFnName": "cross_entropy", "datumList": [datum([5, 6, 7])]}}),  # other data
    ):
        with pytest.raises(ClientError) as error:
            runtime.execute_training_operation(
                trainingSessionName=name, sequenceNumber=sequence, clientToken="tok-1", operationConfig=config
            )
        code, message = error.value.response["Error"]["Code"], error.value.response["Error"]["Message"]
        assert code == "ConflictException" and "clientToken tok-1" in message and "other parameters" in message
    detail = control.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    assert detail["LastReceivedSequenceNumber"] == 1
    control.stop_training_session(TrainingSessionName=name)


UNREADABLE = {
    "malformed JSON": b'{"TrainingSessionName": "x",',
    "2 MB of random bytes": os.urandom(2 * 1024 * 1024),
    "a JSON array": b'[{"TrainingSessionName": "x"}]',
    "a form-encoded body": b"TrainingSessionName=x&MaxResults=3",
    "a JSON string": b'"hello"',
    "JSON nested 100000 deep": b"[" * 100_000 + b"]" * 100_000,
}


def check_unreadable_answer(status, headers, body, runtime):
    assert status == 400, (status, body[:400])
    if runtime:
        code = headers.get("x-amzn-ErrorType")
        message = json.loads(body)["message"]
    else:
        answer = json.loads(body)
        code, message = answer["__type"], answer["message"]
    assert code == "SerializationException", (code, message)
    assert "JSON object" in message, message
    assert_clean(message)


@pytest.mark.parametrize("body", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_unreadable_bodies_get_a_4xx_from_the_control_plane(endpoint, body):
    status, headers, answer = control_plane_request(endpoint, "ListTrainingSessions", body)
    check_unreadable_answer(status, headers, answer, runtime=False)
    status, headers, answer = control_plane_request(endpoint, "DescribeTrainingJob", body)  # the job API
    check_unreadable_answer(status, headers, answer, runtime=False)


@pytest.mark.parametrize("body", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_unreadable_bodies_get_a_4xx_from_the_runtime(endpoint, clients, session, body):
    control, _ = clients
    last = control.describe_training_session(TrainingSessionName=session)["TrainingSessionDetail"]
    for path in (f"/v1/training-sessions/{session}/operations", f"/v1/training-sessions/{session}/sampling-operations"):
        status, headers, answer = send(endpoint, "POST", path, body, {"Content-Type": "application/json"})
        check_unreadable_answer(status, headers, answer, runtime=True)
    now = control.describe_training_session(TrainingSessionName=session)["TrainingSessionDetail"]
    assert now["LastReceivedSequenceNumber"] == last["LastReceivedSequenceNumber"]


def test_a_page_token_the_endpoint_never_gave_is_refused(endpoint):
    for operation in ("ListTrainingSessions", "ListModelPackages", "ListTrainingJobs"):
        status, _, answer = control_plane_request(endpoint, operation, json.dumps({"NextToken": "page-two"}).encode())
        assert status == 400, answer
        answer = json.loads(answer)
        assert answer["__type"] == "ValidationException" and "NextToken" in answer["message"], answer
        assert_clean(answer["message"])


def test_a_time_filter_given_as_text_is_read_as_a_time(endpoint):
    """botocore accepts ISO 8601 text for a timestamp member as well as epoch seconds."""
    for operation in ("ListTrainingSessions", "ListTrainingJobs"):
        body = json.dumps({"CreationTimeAfter": "2020-01-01T00:00:00Z"}).encode()
        status, _, answer = control_plane_request(endpoint, operation, body)
        assert status == 200, answer


def test_a_body_member_cannot_replace_the_session_named_in_the_path(endpoint, clients):
    """The session is named by the URI; a trainingSessionName in the body is no member of the payload."""
    control, runtime = clients
    name = create(control)
    body = {
        "trainingSessionName": "another-session",
        "sequenceNumber": 1,
        "operationConfig": {"forward": {"lossFnName": "cross_entropy", "datumList": [GOOD]}},
    }
    status, _, answer = send(
        endpoint,
        "POST",
        f"/v1/training-sessions/{name}/operations",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 200, answer
    assert result(runtime, name, json.loads(answer)["operationId"])["status"] == "Completed"
    control.stop_training_session(TrainingSessionName=name)
