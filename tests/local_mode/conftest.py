"""Local-mode fixtures: a fresh SAGEMAKER_LOCAL_ROOT per test and the fixture entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURE_CODE = Path(__file__).parent / "fixture_code"


@pytest.fixture
def local_session(tmp_path, monkeypatch):
    """make_session("local") on an empty state root; the jobs it started are stopped afterwards."""
    monkeypatch.setenv("SAGEMAKER_LOCAL_ROOT", str(tmp_path / "sagemaker-local"))
    import local_mode
    from helpers.sagemaker_session import make_session

    session = make_session(run_mode="local")
    yield session
    local_mode.deactivate()


@pytest.fixture
def fixture_code() -> Path:
    return FIXTURE_CODE


@pytest.fixture
def role(local_session) -> str:
    from helpers.sagemaker_session import execution_role

    return execution_role(local_session)
