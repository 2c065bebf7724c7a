"""Real-time endpoints with SDK v2 in a process where local mode is active: ``HuggingFaceModel.deploy()``
with the TGI image the SDK names and an uncompressed model prefix (ModelDataSource, CompressionType
None), ``Predictor.predict``, the streaming runtime through boto3 (decoded by botocore in this process),
the container's error, and a server killed mid-life; then ``delete_endpoint`` and ``delete_model``.

One inference server (the tiny model) serves the module; the kill test ends it, so it runs last.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from botocore.exceptions import ClientError

from local_mode.tiny_model import tiny_model_dir

MESSAGES = [{"role": "user", "content": "Name a colour."}]
PREFIX = "endpoint-models/tiny"


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """(session, predictor): the tiny model deployed with the SDK, deleted at the end whatever happened."""
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.huggingface import HuggingFaceModel, get_huggingface_llm_image_uri
    from sagemaker.serializers import JSONSerializer

    import local_mode
    from helpers.sagemaker_session import execution_role, make_session

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAGEMAKER_LOCAL_ROOT", str(tmp_path_factory.mktemp("endpoints-root")))
        session = make_session(run_mode="local")
        bucket = session.default_bucket()
        s3 = session.boto_session.client("s3")
        for file in tiny_model_dir().iterdir():
            s3.upload_file(str(file), bucket, f"{PREFIX}/{file.name}")
        model = HuggingFaceModel(
            model_data={
                "S3DataSource": {
                    "S3Uri": f"s3://{bucket}/{PREFIX}/",
                    "S3DataType": "S3Prefix",
                    "CompressionType": "None",
                }
            },
            image_uri=get_huggingface_llm_image_uri("huggingface", region=session.boto_region_name),
            role=execution_role(session),
            sagemaker_session=session,
        )
        predictor = model.deploy(
            initial_instance_count=1,
            instance_type="ml.g5.xlarge",
            endpoint_name="tiny-sdk",
            serializer=JSONSerializer(),
            deserializer=JSONDeserializer(),
        )
        try:
            yield session, predictor
        finally:
            try:
                predictor.delete_endpoint()
            except ClientError:
                pass  # the kill test deleted it
            local_mode.deactivate()


def test_deploy_serves_the_model_and_predict_answers(deployed):
    session, predictor = deployed
    described = session.sagemaker_client.describe_endpoint(EndpointName=predictor.endpoint_name)
    assert described["EndpointStatus"] == "InService"
    assert (
        "huggingface-pytorch-tgi-inference" in described["ProductionVariants"][0]["DeployedImages"][0]["SpecifiedImage"]
    )
    answer = predictor.predict({"messages": MESSAGES, "max_tokens": 12, "temperature": 0})
    assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] == 12
    again = predictor.predict({"messages": MESSAGES, "max_tokens": 12, "temperature": 0})
    assert answer["choices"][0]["message"] == again["choices"][0]["message"]  # greedy: the same answer


def test_response_stream_in_process_is_decoded_by_botocore(deployed):
    session, predictor = deployed
    runtime = session.boto_session.client("sagemaker-runtime")
    body = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0}
    whole = predictor.predict(body)["choices"][0]["message"]["content"]
    response = runtime.invoke_endpoint_with_response_stream(
        EndpointName=predictor.endpoint_name, ContentType="application/json", Body=json.dumps({**body, "stream": True})
    )
    raw = b"".join(event["PayloadPart"]["Bytes"] for event in response["Body"])
    deltas = [
        choice["delta"].get("content") or ""
        for line in raw.decode().splitlines()
        if line.startswith("data: ")
        for choice in json.loads(line[len("data: ") :])["choices"]
    ]
    assert len(deltas) > 2
    # The whole answer's content is trimmed by the server's response parser; the deltas are raw.
    assert "".join(deltas).strip() == whole


def test_container_error_comes_back_as_model_error(deployed):
    session, predictor = deployed
    runtime = session.boto_session.client("sagemaker-runtime")
    with pytest.raises(runtime.exceptions.ModelError) as caught:
        predictor.predict({"inputs": "Name a colour.", "parameters": {"max_new_tokens": 8}})
    response = caught.value.response
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 424 and response["OriginalStatusCode"] == 422
    assert "Unexpected fields" in response["OriginalMessage"]
    assert response["LogStreamArn"].endswith(f":log-group:/aws/sagemaker/Endpoints/{predictor.endpoint_name}")


def test_server_killed_mid_life_fails_the_endpoint_and_delete_cleans_up(deployed):
    import local_mode

    session, predictor = deployed
    client = session.sagemaker_client
    record_path = local_mode.active_root() / "hosting" / "endpoints" / f"{predictor.endpoint_name}.json"
    pid = json.loads(record_path.read_text())["_server"]["pid"]
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10  # the process's end is noticed within a moment, not at once
    while client.describe_endpoint(EndpointName=predictor.endpoint_name)["EndpointStatus"] == "InService":
        assert time.monotonic() < deadline, "the endpoint stayed InService after its server was killed"
        time.sleep(0.1)
    described = client.describe_endpoint(EndpointName=predictor.endpoint_name)
    assert described["EndpointStatus"] == "Failed"
    assert f"process (pid {pid}) was killed by signal SIGKILL" in described["FailureReason"]
    assert "Delete the endpoint and create it again" in described["FailureReason"]
    with pytest.raises(ClientError, match="is Failed, not InService"):
        predictor.predict({"messages": MESSAGES})

    config = client.describe_endpoint_config(EndpointConfigName=described["EndpointConfigName"])
    model_name = config["ProductionVariants"][0]["ModelName"]
    predictor.delete_model()  # reads the endpoint config, which delete_endpoint() removes
    predictor.delete_endpoint()
    client.get_waiter("endpoint_deleted").wait(EndpointName=predictor.endpoint_name, WaiterConfig={"Delay": 1})
    assert not record_path.exists()
    with pytest.raises(ClientError, match=f'Could not find model ".*:model/{model_name}"'):
        client.describe_model(ModelName=model_name)
    with pytest.raises(ClientError, match="Could not find endpoint configuration"):
        client.describe_endpoint_config(EndpointConfigName=described["EndpointConfigName"])
