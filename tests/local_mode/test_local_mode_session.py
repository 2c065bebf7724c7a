"""make_session: the one switch between SageMaker and local mode, and its teaching errors."""

from __future__ import annotations

import pytest
import sagemaker

import local_mode
from helpers.sagemaker_session import LOCAL_ROLE, describe_mode, execution_role, make_session


@pytest.fixture
def no_aws_credentials(monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("SAGEMAKER_LOCAL_ROOT", str(tmp_path / "sagemaker-local"))
    local_mode.deactivate()
    yield
    local_mode.deactivate()


def test_sagemaker_mode_without_credentials_teaches(no_aws_credentials):
    with pytest.raises(RuntimeError) as raised:
        make_session(run_mode="sagemaker")
    message = str(raised.value)
    assert "no AWS credentials were found" in message
    assert "aws configure" in message
    assert "run_mode='local'" in message
    assert not local_mode.is_active()


def test_auto_mode_without_credentials_is_local_and_says_so(no_aws_credentials, capsys):
    session = make_session(run_mode="auto")
    out = capsys.readouterr().out
    assert "LOCAL MODE: no AWS credentials were found" in out
    assert isinstance(session, sagemaker.Session)
    assert execution_role(session) == LOCAL_ROLE
    assert describe_mode(session).startswith("local mode: jobs run on this machine")
    assert session.default_bucket() == "sagemaker-us-east-1-123456789012"
    # Once local mode answers AWS in this process, SageMaker mode must not pretend to work.
    with pytest.raises(RuntimeError, match="local mode is already active"):
        make_session(run_mode="sagemaker")


def test_unknown_run_mode():
    with pytest.raises(ValueError, match="run_mode must be one of"):
        make_session(run_mode="docker")


def test_preloaded_torch_server_can_be_closed_with_what_it_forked():
    """A server that stopped answering is closed before a plain process replaces it, so a late fork
    cannot start a second copy of the host."""
    from local_mode.jobs import preloaded_torch_client

    starter = preloaded_torch_client.PreloadedTorchServer()
    assert starter.alive()
    starter.close()
    assert not starter.alive()
    starter.close()  # closing twice is harmless
