"""Only the caller drives the endpoint: it listens on loopback, and every request must carry a SigV4
signature made with the credentials ``client_environment()`` hands out, checked by botocore's own
signer. An unsigned request, one signed with other keys, a tampered body or a stale signature gets
403 in the error shape of the protocol spoken, as AWS answers; the real SDK and boto3 still work."""

from __future__ import annotations

import datetime
import json
import stat
import uuid
from unittest import mock

import boto3
import psutil
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from .conftest import ROLE, TINY_ARN, boto3_session, control_plane_request, send


def test_the_endpoint_listens_on_loopback_only(endpoint):
    listening = [c for c in psutil.Process(endpoint.pid).net_connections("inet") if c.status == psutil.CONN_LISTEN]
    assert listening, "the endpoint process listens on no socket"
    assert {c.laddr.ip for c in listening} <= {"127.0.0.1", "::1"}, listening


def test_each_endpoint_has_its_own_secret_readable_by_its_owner_only(endpoint):
    env = endpoint.client_environment()
    assert len(env["AWS_SECRET_ACCESS_KEY"]) >= 32 and env["AWS_SECRET_ACCESS_KEY"] != "local-mode-secret-key"
    record = endpoint.root / "training-sessions" / "service.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert env["AWS_SECRET_ACCESS_KEY"] not in repr(endpoint)  # a notebook showing the endpoint does not print it


def error_of(status, headers, body) -> tuple[int, str, str]:
    if body.startswith(b"<"):  # S3 and STS answer in XML
        import xml.etree.ElementTree as ElementTree

        root = ElementTree.fromstring(body)
        error = root if root.tag == "Error" else root.find("Error")
        return status, error.findtext("Code"), error.findtext("Message")
    answer = json.loads(body)
    return status, answer.get("__type") or headers.get("x-amzn-ErrorType"), answer["message"]


def test_an_unsigned_request_gets_403(endpoint, clients):
    status, code, message = error_of(*control_plane_request(endpoint, "ListTrainingSessions", b"{}", credentials=False))
    assert (status, code) == (403, "MissingAuthenticationTokenException")
    assert "client_environment()" in message, message
    status, code, message = error_of(
        *send(endpoint, "GET", "/v1/training-sessions/any/operations/1", credentials=False)
    )  # the runtime
    assert (status, code) == (403, "MissingAuthenticationTokenException"), message
    status, code, message = error_of(*send(endpoint, "GET", "/", credentials=False, headers={"Host": "s3"}))
    assert (status, code) == (403, "AccessDenied"), message  # S3's anonymous answer


OTHER_KEY = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")


@pytest.mark.parametrize("keys", ["another access key", "the right access key, another secret"])
def test_a_request_signed_with_other_keys_gets_403(endpoint, keys):
    env = endpoint.client_environment()
    if keys == "another access key":
        session = boto3.Session(OTHER_KEY.access_key, OTHER_KEY.secret_key, region_name="us-east-1")
        expected = {"json": "UnrecognizedClientException", "s3": "InvalidAccessKeyId"}
        says = "access key"
    else:
        session = boto3.Session(env["AWS_ACCESS_KEY_ID"], OTHER_KEY.secret_key, region_name="us-east-1")
        expected = {"json": "InvalidSignatureException", "s3": "SignatureDoesNotMatch"}
        says = "secret"
    control = session.client("sagemaker", endpoint_url=endpoint.url)
    runtime = session.client("sagemakertrainingsessionruntime", endpoint_url=endpoint.url)
    s3 = session.client("s3", endpoint_url=endpoint.url)
    logs = session.client("logs", endpoint_url=endpoint.url)
    calls = [
        (control.list_training_sessions, {}, "json"),
        (runtime.get_training_operation_result, {"trainingSessionName": "any", "operationId": "1"}, "json"),
        (logs.describe_log_groups, {}, "json"),
        (s3.list_buckets, {}, "s3"),
    ]
    for call, arguments, protocol in calls:
        with pytest.raises(ClientError) as error:
            call(**arguments)
        response = error.value.response
        assert response["ResponseMetadata"]["HTTPStatusCode"] == 403, response
        assert response["Error"]["Code"] == expected[protocol], response
        assert says in response["Error"]["Message"] and "client_environment()" in response["Error"]["Message"]


def test_a_body_changed_after_signing_gets_403(endpoint):
    env = endpoint.client_environment()
    headers = {"X-Amz-Target": "SageMaker.ListTrainingSessions", "Content-Type": "application/x-amz-json-1.1"}
    request = AWSRequest(method="POST", url=endpoint.url + "/", data=b'{"MaxResults": 1}', headers=headers)
    SigV4Auth(Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]), "sagemaker", "us-east-1").add_auth(
        request
    )
    signed = dict(request.prepare().headers)
    status, code, message = error_of(*_post_as_signed(endpoint, signed, b'{"MaxResults": 2}'))  # not what was signed
    assert (status, code) == (403, "InvalidSignatureException"), message


def _post_as_signed(endpoint, headers: dict, body: bytes):
    import http.client
    from urllib.parse import urlsplit

    connection = http.client.HTTPConnection(urlsplit(endpoint.url).netloc, timeout=30)
    try:
        connection.request("POST", "/", body=body, headers={**headers, "Content-Length": str(len(body))})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_a_signature_older_than_15_minutes_gets_403(endpoint):
    stale = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) - datetime.timedelta(minutes=20)
    with mock.patch("botocore.auth.get_current_datetime", return_value=stale):
        status, code, message = error_of(*control_plane_request(endpoint, "ListTrainingSessions", b"{}"))
    assert (status, code) == (403, "InvalidSignatureException") and "expired" in message, message


def test_the_real_sdk_and_boto3_still_work(endpoint, clients, sdk):
    control, _ = clients
    name = f"auth-{uuid.uuid4().hex[:8]}"
    control.create_training_session(
        TrainingSessionName=name,
        LoraConfig={"Rank": 4, "Alpha": 8},
        RoleArn=ROLE,
        ModelConfig={"BaseModelArn": TINY_ARN},
        OutputConfig={"S3Location": {"Path": "s3://session-tests/out"}},
    )
    control.stop_training_session(TrainingSessionName=name)
    # sagemaker-train's ServiceClient and that environment's boto3, configured by client_environment() alone
    seen = sdk("describe", name=name)
    assert seen["status"] == "Stopped" and seen["listed"] and "local/tiny-qwen2" in json.dumps(seen["models"])
    out = sdk("pipelining")  # a session made, trained and stepped through the SDK
    assert out["sequence"] == 3 and out["after"] < out["before"]
    s3 = boto3_session(endpoint).client("s3", endpoint_url=endpoint.url)  # S3 signs its own way (unsigned payloads...)
    s3.create_bucket(Bucket="auth-tests")
    s3.put_object(Bucket="auth-tests", Key="a/b c.txt", Body=b"x" * 100_000)
    assert s3.get_object(Bucket="auth-tests", Key="a/b c.txt")["Body"].read() == b"x" * 100_000
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="auth-tests", Prefix="a/")["Contents"]] == ["a/b c.txt"]
