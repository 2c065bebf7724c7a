"""A real OpenAI-compatible server (``transformers serve``) on the tiny model, one for the whole folder."""

from __future__ import annotations

from pathlib import Path

import pytest

# scripts/ as the job sees it (``common``, ``environments``), as helpers.training_sessions puts it on the path too.
SCRIPTS = str(Path(__file__).resolve().parents[2] / "scripts")


@pytest.fixture(scope="session")
def llm_server(tiny_model_path):
    from local_mode.llm_server import serve

    with serve(tiny_model_path) as server:
        yield server
