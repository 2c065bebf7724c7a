"""SampleTrainingSession and SampleTrainingSessionWithResponseStream through raw boto3: a chat body in,
the session's model's answer out, equal to what ``sample`` gives the same prompt; bad bodies refused."""

import json
import time
import uuid

import pytest
from botocore.exceptions import ClientError
from transformers import AutoTokenizer

from local_mode.tiny_model import tiny_model_dir

from .test_session_api_boto3 import FORWARD_BACKWARD, STEP, create, result

MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(tiny_model_dir())


def chat(runtime, name, body, stream=False, **extra):
    call = runtime.sample_training_session_with_response_stream if stream else runtime.sample_training_session
    response = call(trainingSessionName=name, contentType="application/json", body=json.dumps(body).encode(), **extra)
    data = response["body"]
    return response["contentType"], data.read() if hasattr(data, "read") else data


def sampled(runtime, name, prompt, params, package=None):
    """The session's own sampling operation, for comparison."""
    config = {"prompt": {"chunks": [{"tokens": prompt, "type": "encoded_text"}]}, "numSamples": 1}
    config["samplingParams"] = params
    if package:
        config["modelPackageArn"] = package
    op = runtime.execute_sampling_operation(trainingSessionName=name, operationConfig={"sample": config})
    deadline = time.monotonic() + 120
    while True:
        answer = runtime.get_sampling_operation_result(trainingSessionName=name, operationId=op["operationId"])
        if answer["status"] != "InProgress" or time.monotonic() > deadline:
            assert answer["status"] == "Completed", answer
            return answer["operationResult"]["sample"]["sequences"][0]


def events(stream_body: bytes) -> list:
    lines = [line for line in stream_body.decode().split("\n\n") if line]
    assert all(line.startswith("data: ") for line in lines), lines
    return [line.removeprefix("data: ") for line in lines]


@pytest.fixture(scope="module")
def session(clients):
    control, runtime = clients
    name = create(control)
    yield name
    control.stop_training_session(TrainingSessionName=name)


def test_a_greedy_chat_answer_is_what_sample_gives_its_prompt(clients, session, tokenizer):
    _, runtime = clients
    content_type, body = chat(
        runtime, session, {"messages": MESSAGES, "max_tokens": 512, "temperature": 0, "logprobs": True}
    )
    answer = json.loads(body)
    assert content_type == "application/json" and answer["object"] == "chat.completion"
    prompt = list(
        tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
    )
    expected = sampled(runtime, session, prompt, {"maxTokens": 512, "temperature": 0.0})
    choice = answer["choices"][0]
    assert choice["message"]["content"] == tokenizer.decode(expected["tokens"], skip_special_tokens=True)
    assert [t["logprob"] for t in choice["logprobs"]["content"]] == pytest.approx(expected["logprobs"], abs=1e-6)
    assert answer["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(expected["tokens"]),
        "total_tokens": len(prompt) + len(expected["tokens"]),
    }
    assert choice["finish_reason"] == ("stop" if expected["stopReason"] == "stop" else "length")


def test_the_streamed_answer_is_the_same_answer_in_token_deltas(clients, session):
    _, runtime = clients
    body = {"messages": MESSAGES, "max_tokens": 16, "temperature": 0.7, "seed": 11, "n": 2}
    _, whole = chat(runtime, session, body)
    content_type, streamed = chat(runtime, session, {**body, "stream": True}, stream=True)
    assert content_type == "text/event-stream"
    found = events(streamed)
    assert found[-1] == "[DONE]"
    chunks = [json.loads(e) for e in found[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    texts = {0: "", 1: ""}
    for c in chunks:
        for choice in c["choices"]:
            texts[choice["index"]] += choice["delta"].get("content", "")
    assert [texts[0], texts[1]] == [c["message"]["content"] for c in json.loads(whole)["choices"]]  # seeded: equal
    deltas = [ch["delta"]["content"] for c in chunks for ch in c["choices"] if ch["delta"].get("content")]
    assert len(deltas) > 2  # token by token, not one piece
    assert chunks[-1]["usage"] == json.loads(whole)["usage"]


def test_a_model_package_names_the_saved_weights_the_chat_answers_with(clients, tokenizer):
    control, runtime = clients
    name = f"chat-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ClientError) as raised:  # saving needs a group to register the package in
        runtime.execute_training_operation(
            trainingSessionName=create(control), sequenceNumber=1, operationConfig={"saveWeights": {}}
        )
    assert "ModelPackageGroupArn" in raised.value.response["Error"]["Message"]
    create(control, name, group=name)
    try:
        for sequence, config in enumerate([FORWARD_BACKWARD, STEP, {"saveWeights": {}}], 1):
            op = runtime.execute_training_operation(
                trainingSessionName=name, sequenceNumber=sequence, operationConfig=config
            )
            done = result(runtime, name, op["operationId"])
            assert done["status"] == "Completed", done
        package = done["operationResult"]["saveWeights"]["modelPackageArn"]
        prompt = list(
            tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"
            ]
        )
        expected = sampled(runtime, name, prompt, {"maxTokens": 512, "temperature": 0.0}, package)
        _, body = chat(
            runtime, name, {"messages": MESSAGES, "max_tokens": 512, "temperature": 0}, modelPackageArn=package
        )
        assert json.loads(body)["choices"][0]["message"]["content"] == tokenizer.decode(
            expected["tokens"], skip_special_tokens=True
        )
    finally:
        control.stop_training_session(TrainingSessionName=name)


@pytest.mark.parametrize(
    "body, names",
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not an object"),
        (json.dumps({"messages": []}).encode(), "messages must be a non-empty list"),
        (json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(), "role is one of"),
        (json.dumps({"messages": MESSAGES, "temperature": "hot"}).encode(), "temperature is 'hot'"),
        (json.dumps({"messages": MESSAGES, "max_tokens": 0}).encode(), "max_tokens is 0"),
        (json.dumps({"messages": MESSAGES, "n": 1000}).encode(), "n is 1000"),
        (json.dumps({"messages": MESSAGES, "stop": [""]}).encode(), "stop must be"),
    ],
)
def test_a_bad_body_gets_a_validation_error_that_names_the_problem(clients, session, body, names):
    _, runtime = clients
    with pytest.raises(ClientError) as raised:
        runtime.sample_training_session(trainingSessionName=session, contentType="application/json", body=body)
    error = raised.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert error["Error"]["Code"] == "ValidationException"
    assert names in error["Error"]["Message"] and "chat-completions" in error["Error"]["Message"]


def test_the_wrong_content_type_an_unknown_and_a_stopped_session_are_refused(clients):
    control, runtime = clients
    name = create(control)
    body = json.dumps({"messages": MESSAGES, "max_tokens": 4}).encode()
    with pytest.raises(ClientError) as raised:
        runtime.sample_training_session(trainingSessionName=name, contentType="text/plain", body=body)
    assert raised.value.response["Error"]["Code"] == "ValidationException"
    assert "application/json" in raised.value.response["Error"]["Message"]
    control.stop_training_session(TrainingSessionName=name)
    with pytest.raises(ClientError) as raised:
        runtime.sample_training_session(trainingSessionName=name, contentType="application/json", body=body)
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 409
    with pytest.raises(ClientError) as raised:
        runtime.sample_training_session_with_response_stream(
            trainingSessionName=f"missing-{uuid.uuid4().hex[:8]}", contentType="application/json", body=body
        )
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
