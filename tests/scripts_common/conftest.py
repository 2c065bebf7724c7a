"""Unit tests of scripts/common: SageMaker variables cleared."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No SM_*/SAGEMAKER_* variables, the current directory a fresh tmp_path."""
    for key in list(os.environ):
        if key.startswith(("SM_", "SAGEMAKER_", "FI_")) or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    return monkeypatch
