"""SageMaker real-time endpoints through the local endpoint, with raw boto3 as the SDK v3 environment
uses it: CreateModel -> CreateEndpointConfig -> CreateEndpoint -> InService -> InvokeEndpoint and its
streaming twin (event stream decoded by botocore) -> DeleteEndpoint, the answer equal to transformers'
own greedy generate, and the faults: a malformed body, an endpoint Creating, missing or deleted, and a
server process killed mid-stream.

One inference server (the tiny model) serves the module; the kill test ends it, so it runs last.
"""

from __future__ import annotations

import io
import json
import os
import signal
import tarfile
import time

import pytest
from botocore.exceptions import ClientError, EventStreamError

from local_mode.tiny_model import tiny_model_dir

from .conftest import ROLE, boto3_session

BUCKET = "endpoint-tests"
MODEL_URI = f"s3://{BUCKET}/tiny/model.tar.gz"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-tgi-inference:2.7.0-tgi3.3.6-gpu-py311-cu124-ubuntu22.04"
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2 + 3?"}]
ENDPOINT = "tiny-chat"


def model_archive() -> bytes:
    """The tiny model's folder as SageMaker's LLM containers read model.tar.gz: its files at the top."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as archive:
        for file in sorted(tiny_model_dir().iterdir()):
            archive.add(file, arcname=file.name)
    return packed.getvalue()


@pytest.fixture(scope="module")
def aws(endpoint):
    session = boto3_session(endpoint)
    clients = {
        name: session.client(name, endpoint_url=endpoint.url) for name in ("s3", "sagemaker", "sagemaker-runtime")
    }
    clients["s3"].create_bucket(Bucket=BUCKET)
    clients["s3"].put_object(Bucket=BUCKET, Key="tiny/model.tar.gz", Body=model_archive())
    sagemaker = clients["sagemaker"]
    sagemaker.create_model(
        ModelName="tiny", ExecutionRoleArn=ROLE, PrimaryContainer={"Image": IMAGE, "ModelDataUrl": MODEL_URI}
    )
    sagemaker.create_endpoint_config(
        EndpointConfigName="tiny",
        ProductionVariants=[
            {
                "VariantName": "AllTraffic",
                "ModelName": "tiny",
                "InstanceType": "ml.g5.xlarge",
                "InitialInstanceCount": 1,
            }
        ],
    )
    return clients


@pytest.fixture(scope="module")
def served(aws):
    """The module's endpoint, InService; deleted at the end whatever happened."""
    sagemaker = aws["sagemaker"]
    sagemaker.create_endpoint(EndpointName=ENDPOINT, EndpointConfigName="tiny")
    try:
        started = time.monotonic()
        sagemaker.get_waiter("endpoint_in_service").wait(
            EndpointName=ENDPOINT, WaiterConfig={"Delay": 1, "MaxAttempts": 300}
        )
        print(f"endpoint InService after {time.monotonic() - started:.1f} s")
        yield ENDPOINT
    finally:
        try:
            sagemaker.delete_endpoint(EndpointName=ENDPOINT)
        except ClientError:
            pass  # the kill test deleted it


def invoke(runtime, body, name=ENDPOINT) -> dict:
    response = runtime.invoke_endpoint(EndpointName=name, ContentType="application/json", Body=json.dumps(body))
    assert response["InvokedProductionVariant"] == "AllTraffic"
    assert response["ContentType"].startswith("application/json")
    return json.loads(response["Body"].read())


def greedy_reference(messages, max_new_tokens: int) -> str:
    """transformers' own greedy generate on the same model and prompt: the answer's text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir()).eval()
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def sse_text(raw: bytes) -> str:
    """The answer's text from chat.completion.chunk server-sent events."""
    text = ""
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[len("data: ") :])["choices"]:
                text += choice.get("delta", {}).get("content") or ""
    return text


def test_invoke_answers_as_transformers_greedy_generate(aws, served):
    answer = invoke(
        aws["sagemaker-runtime"], {"messages": MESSAGES, "max_tokens": 24, "temperature": 0, "model": "tgi"}
    )
    assert answer["object"] == "chat.completion"
    content = answer["choices"][0]["message"]["content"]
    # The whole answer's content comes through transformers serve's response parser for Qwen2 models
    # (thinking and content regions), which trims the whitespace around it; the tiny model's greedy
    # answer opens with newlines. The stream's deltas are the raw text (next test).
    assert content and content == greedy_reference(MESSAGES, 24).strip()
    assert answer["usage"]["completion_tokens"] == 24


def test_response_stream_relays_the_same_answer_in_payload_parts(aws, served):
    body = {"messages": MESSAGES, "max_tokens": 24, "temperature": 0, "stream": True}
    response = aws["sagemaker-runtime"].invoke_endpoint_with_response_stream(
        EndpointName=served, ContentType="application/json", Body=json.dumps(body)
    )
    assert response["ContentType"].startswith("text/event-stream")
    events = list(response["Body"])
    assert len(events) > 2 and all(set(event) == {"PayloadPart"} for event in events)
    streamed = sse_text(b"".join(event["PayloadPart"]["Bytes"] for event in events))
    assert streamed == greedy_reference(MESSAGES, 24)


@pytest.mark.parametrize(
    ("body", "container_says"),
    [(b"{not json", "JSON decode error"), (json.dumps({"inputs": "What is 2 + 3?"}).encode(), "Unexpected fields")],
)
def test_malformed_body_is_a_model_error_with_the_container_message(aws, served, body, container_says):
    runtime = aws["sagemaker-runtime"]
    with pytest.raises(runtime.exceptions.ModelError) as caught:
        runtime.invoke_endpoint(EndpointName=served, ContentType="application/json", Body=body)
    response = caught.value.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert response["OriginalStatusCode"] == 422
    assert container_says in response["OriginalMessage"]
    assert "Received client error (422)" in response["Error"]["Message"]
    assert '"messages"' in response["Error"]["Message"]  # how to fix it: the body the container reads


def test_endpoint_that_is_creating_refuses_invocations_and_can_be_deleted(aws, served):
    sagemaker, runtime = aws["sagemaker"], aws["sagemaker-runtime"]
    sagemaker.create_endpoint(EndpointName="tiny-creating", EndpointConfigName="tiny")
    try:
        assert sagemaker.describe_endpoint(EndpointName="tiny-creating")["EndpointStatus"] == "Creating"
        with pytest.raises(ClientError) as caught:
            invoke(runtime, {"messages": MESSAGES}, name="tiny-creating")
        error = caught.value.response["Error"]
        assert error["Code"] == "ValidationError" and caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        assert "is Creating, not InService" in error["Message"] and "endpoint_in_service" in error["Message"]
    finally:
        sagemaker.delete_endpoint(EndpointName="tiny-creating")
    sagemaker.get_waiter("endpoint_deleted").wait(EndpointName="tiny-creating", WaiterConfig={"Delay": 1})
    with pytest.raises(ClientError, match="Endpoint tiny-creating of account .* not found"):
        invoke(runtime, {"messages": MESSAGES}, name="tiny-creating")


def test_control_plane_refusals_say_what_to_fix(aws, served):
    sagemaker = aws["sagemaker"]
    with pytest.raises(ClientError, match="Could not find model data at s3://endpoint-tests/missing.tar.gz"):
        sagemaker.create_model(
            ModelName="missing-data",
            ExecutionRoleArn=ROLE,
            PrimaryContainer={"Image": IMAGE, "ModelDataUrl": f"s3://{BUCKET}/missing.tar.gz"},
        )
    with pytest.raises(ClientError, match="HF_MODEL_ID would download from the Hugging Face Hub"):
        sagemaker.create_model(
            ModelName="hub-model",
            ExecutionRoleArn=ROLE,
            PrimaryContainer={"Image": IMAGE, "Environment": {"HF_MODEL_ID": "Qwen/Qwen2.5-0.5B-Instruct"}},
        )
    with pytest.raises(ClientError, match='Cannot create already existing model "arn:aws:sagemaker:.*:model/tiny"'):
        sagemaker.create_model(
            ModelName="tiny", ExecutionRoleArn=ROLE, PrimaryContainer={"Image": IMAGE, "ModelDataUrl": MODEL_URI}
        )
    with pytest.raises(ClientError, match='Could not find model "arn:aws:sagemaker:.*:model/no-such-model"'):
        sagemaker.create_endpoint_config(
            EndpointConfigName="orphan",
            ProductionVariants=[
                {"VariantName": "AllTraffic", "ModelName": "no-such-model", "InstanceType": "ml.g5.xlarge"}
            ],
        )
    with pytest.raises(ClientError, match="Member must satisfy enum value set"):
        sagemaker.create_endpoint_config(
            EndpointConfigName="bad-type",
            ProductionVariants=[{"VariantName": "AllTraffic", "ModelName": "tiny", "InstanceType": "ml.nope.huge"}],
        )
    described = sagemaker.describe_endpoint_config(EndpointConfigName="tiny")
    assert described["ProductionVariants"][0]["ModelName"] == "tiny"
    assert sagemaker.describe_model(ModelName="tiny")["PrimaryContainer"]["ModelDataUrl"] == MODEL_URI
    listed = sagemaker.list_endpoints(NameContains="tiny-chat")["Endpoints"]
    assert [(e["EndpointName"], e["EndpointStatus"]) for e in listed] == [("tiny-chat", "InService")]
    with pytest.raises(ClientError, match='Could not find endpoint "arn:aws:sagemaker:.*:endpoint/nowhere"'):
        sagemaker.describe_endpoint(EndpointName="nowhere")


def test_server_killed_mid_stream_breaks_the_stream_and_fails_the_endpoint(aws, served, endpoint):
    sagemaker, runtime = aws["sagemaker"], aws["sagemaker-runtime"]
    record = json.loads((endpoint.root / "hosting" / "endpoints" / f"{served}.json").read_text())
    body = {"messages": MESSAGES, "max_tokens": 1000, "temperature": 0, "stream": True}
    response = runtime.invoke_endpoint_with_response_stream(
        EndpointName=served, ContentType="application/json", Body=json.dumps(body)
    )
    events = iter(response["Body"])
    assert "PayloadPart" in next(events)
    os.killpg(record["_server"]["pid"], signal.SIGKILL)
    with pytest.raises(EventStreamError) as caught:
        for _ in events:
            pass
    assert caught.value.response["Error"]["Code"] == "ModelStreamError"
    assert "inference server process stopped while streaming; the endpoint is now Failed" in str(caught.value)

    described = sagemaker.describe_endpoint(EndpointName=served)
    assert described["EndpointStatus"] == "Failed"
    assert f"process (pid {record['_server']['pid']}) was killed by signal SIGKILL" in described["FailureReason"]
    for secret in (endpoint.client_environment()["AWS_SECRET_ACCESS_KEY"],):
        assert secret not in described["FailureReason"]
    with pytest.raises(ClientError, match="is Failed, not InService"):
        invoke(runtime, {"messages": MESSAGES})

    sagemaker.delete_endpoint(EndpointName=served)
    sagemaker.get_waiter("endpoint_deleted").wait(EndpointName=served, WaiterConfig={"Delay": 1})
    with pytest.raises(ClientError, match=f"Endpoint {served} of account .* not found"):
        invoke(runtime, {"messages": MESSAGES})
