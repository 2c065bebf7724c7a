"""The local training-session endpoint for these tests, and a way to drive it with the real SDK.

The SDK (sagemaker-train, SDK v3) cannot be imported here: it lives in ``.venv-sessions``. Tests
that go through it run ``sdk_scenarios.py`` with that environment's Python, pointed at the
endpoint by ``RunningService.client_environment()`` alone, and read the JSON line it prints.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import boto3
import pytest
import torch

from local_mode import session_service

REPO = Path(__file__).resolve().parents[2]

SESSIONS_PYTHON = REPO / ".venv-sessions" / "bin" / "python"
SCENARIOS = Path(__file__).with_name("sdk_scenarios.py")
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
TINY_ARN = "arn:aws:sagemaker:us-east-1:aws:hub-content/SageMakerPublicHub/Model/local-tiny-qwen2/1.0.0"


@pytest.fixture(scope="session")
def endpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("sessions-root")
    # A result request is held until the operation ends, at most this long: the test that reads a
    # Pending operation would otherwise wait the default 20 s for its answer.
    os.environ["SAGEMAKER_LOCAL_SESSION_LONG_POLL"] = "2"
    started = session_service.start_service(root)
    yield started
    session_service.stop_service(root)


def boto3_session(endpoint) -> boto3.Session:
    """A boto3 session with the credentials the endpoint hands out (it checks every signature)."""
    env = endpoint.client_environment()
    return boto3.Session(
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=endpoint.region,
    )


@pytest.fixture(scope="session")
def clients(endpoint):
    """Raw boto3 clients of the main environment, pointed at the endpoint."""
    session = boto3_session(endpoint)
    return (
        session.client("sagemaker", endpoint_url=endpoint.url),
        session.client("sagemakertrainingsessionruntime", endpoint_url=endpoint.url),
    )


def create_endpoint(sagemaker, name: str, container: dict, instance_type: str = "ml.g5.xlarge") -> None:
    """A model, an endpoint configuration and an endpoint, all named ``name``, through raw boto3; the
    endpoint is Creating when this returns."""
    sagemaker.create_model(ModelName=name, ExecutionRoleArn=ROLE, PrimaryContainer=container)
    variant = {"VariantName": "AllTraffic", "ModelName": name, "InstanceType": instance_type, "InitialInstanceCount": 1}
    sagemaker.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[variant])
    sagemaker.create_endpoint(EndpointName=name, EndpointConfigName=name)


def send(endpoint, method: str, path: str, body: bytes = b"", headers: dict | None = None, credentials=None):
    """One HTTP request as a client would send it, signed with SigV4 by botocore's own signer (with the
    endpoint's credentials unless others are given; ``credentials=False`` sends it unsigned), whatever
    its body: what botocore would refuse to build still reaches the endpoint. Returns (status, headers,
    body)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method=method, url=endpoint.url + path, data=body, headers=dict(headers or {}))
    if credentials is not False:
        env = endpoint.client_environment()
        credentials = credentials or Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
        SigV4Auth(credentials, "sagemaker", endpoint.region).add_auth(request)
    prepared = request.prepare()
    connection = http.client.HTTPConnection(urlsplit(endpoint.url).netloc, timeout=120)
    try:
        connection.request(method, path, body=prepared.body, headers=dict(prepared.headers))
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def control_plane_request(endpoint, operation: str, body: bytes, **kwargs):
    """A JSON 1.1 request to SageMaker's control plane (X-Amz-Target: SageMaker.<operation>)."""
    headers = {"X-Amz-Target": f"SageMaker.{operation}", "Content-Type": "application/x-amz-json-1.1"}
    return send(endpoint, "POST", "/", body, headers, **kwargs)


def run_sdk(endpoint, scenario: str, timeout: float = 240, script: Path = SCENARIOS, **arguments) -> dict:
    """Run one scenario of ``script`` (sdk_scenarios.py) in the SDK v3 environment; its last stdout line is JSON."""
    if not SESSIONS_PYTHON.exists():
        pytest.fail(
            "The SDK v3 environment is missing: build it with `make .venv-sessions/.stamp` (requirements-sessions.txt)."
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON"))}
    env.update(endpoint.client_environment())
    done = subprocess.run(
        [str(SESSIONS_PYTHON), str(script), scenario, json.dumps(arguments)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{scenario} failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def trained_looking_engine(model_path, seed: int):
    """A session engine on ``model_path`` whose adapter looks trained: every LoRA weight drawn around 0 (at
    initialisation B is zero, and the adapter changes nothing). ``seed`` fixes the adapter's draw."""
    from local_mode.session_service import engine as engine_module

    torch.manual_seed(seed)
    engine = engine_module.Engine(str(model_path), rank=4, alpha=8)
    with torch.no_grad():
        for _, param in engine.named_trainable:
            param.normal_(0.0, 0.05)
    return engine


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread in this process: the machine is shared, more threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def sdk(endpoint):
    """sdk(scenario, **arguments) -> the scenario's JSON result (see sdk_scenarios.py; ``script=`` another file)."""
    return lambda scenario, script=SCENARIOS, **arguments: run_sdk(endpoint, scenario, script=script, **arguments)
