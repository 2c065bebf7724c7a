"""A real OpenAI-compatible server (``transformers serve``) on the tiny model, one for the whole folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # fault_proxy.py, for the tests beside it
# scripts/ as the job sees it (``common``, ``environments``), as session_loops puts it on the path too.
SCRIPTS = str(Path(__file__).resolve().parents[2] / "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)


@pytest.fixture(scope="session")
def llm_server(tiny_model_path):
    from helpers.llm_server import serve

    with serve(tiny_model_path) as server:
        yield server
