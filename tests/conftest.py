"""Fixtures shared by every test folder: offline settings, the tiny model, the project's data sets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"

# Nothing in the suite may reach a hub, AWS or a telemetry endpoint.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """The cached tiny Qwen2 model and tokenizer (built once per machine)."""
    from local_mode.tiny_model import tiny_model_dir

    return tiny_model_dir()


@pytest.fixture(scope="session")
def offline_data(tmp_path_factory) -> dict[str, Path]:
    """The project's own small data sets: {name: folder with train.jsonl and test.jsonl}."""
    from local_mode.offline_data import write_all

    return write_all(tmp_path_factory.mktemp("data"), n_train=32, n_test=8)
