"""The local endpoint's credentials belong to its root folder, not to one process: a client built
before a restart still works after it, and the stored secret is readable by its owner only."""

import json
import socket
import stat

import boto3
import pytest
from botocore.exceptions import ClientError

from local_mode import session_service


def credentials_file(root):
    return root / "training-sessions" / "credentials.json"


def test_a_client_built_before_a_restart_still_works_after_it(tmp_path, monkeypatch):
    root = tmp_path / "root"
    first = session_service.start_service(root)
    try:
        for name, value in first.client_environment().items():  # as a kernel given the variables
            monkeypatch.setenv(name, value)
        client = boto3.Session().client("sagemaker")
        assert client.meta.endpoint_url == first.url
        assert client.list_training_sessions()["TrainingSessionSummaries"] == []
        assert session_service.stop_service(root) and session_service.running_endpoint(root) is None

        second = session_service.start_service(root)
        assert second.pid != first.pid
        assert second.client_environment() == first.client_environment()
        assert client.list_training_sessions()["TrainingSessionSummaries"] == []  # the same client, unchanged
        stranger = boto3.Session(session_service.FAKE_ACCESS_KEY, "not-the-endpoints").client("sagemaker")
        with pytest.raises(ClientError, match="InvalidSignatureException"):  # the signature is still checked
            stranger.list_training_sessions()

        stored = credentials_file(root)
        assert stat.S_IMODE(stored.stat().st_mode) == 0o600
        assert json.loads(stored.read_text()) == {"secret_key": first.secret_key, "port": int(first.url.split(":")[-1])}
    finally:
        session_service.stop_service(root)


def test_a_taken_port_or_an_exposed_secret_is_replaced(tmp_path):
    root = tmp_path / "root"
    first = session_service.start_service(root)
    session_service.stop_service(root)
    port = int(first.url.split(":")[-1])
    with socket.socket() as squatter:  # another program took the port meanwhile
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        second = session_service.start_service(root)
        try:
            assert second.url != first.url and second.secret_key == first.secret_key
            assert json.loads(credentials_file(root).read_text())["port"] == int(second.url.split(":")[-1])
        finally:
            session_service.stop_service(root)
    credentials_file(root).chmod(0o644)  # readable by others: no longer a secret
    third = session_service.start_service(root)
    try:
        assert third.secret_key != first.secret_key and len(third.secret_key) >= 32
        assert stat.S_IMODE(credentials_file(root).stat().st_mode) == 0o600
        env = third.client_environment()
        client = boto3.Session(
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=third.region,
        ).client("sagemaker", endpoint_url=third.url)
        assert client.list_training_sessions()["TrainingSessionSummaries"] == []
    finally:
        session_service.stop_service(root)
