"""A real OpenAI-compatible server (``transformers serve``) on the tiny model, one for the whole folder."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def llm_server(tiny_model_path):
    from local_mode.llm_server import serve

    with serve(tiny_model_path) as server:
        yield server
