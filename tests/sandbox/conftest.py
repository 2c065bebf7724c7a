"""The sandbox lives in scripts/ and is imported as the container imports it (``import sandbox``)."""

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))


@pytest.fixture(scope="session")
def judge_sandbox():
    """Two fork servers with every layer this machine has, short limits so attacks end fast."""
    from sandbox import Limits, Sandbox

    with Sandbox(workers=2, limits=Limits(time_limit=0.5, wall_limit=1.0, memory_mb=256,
                                          output_bytes=4 << 20)) as box:
        yield box
