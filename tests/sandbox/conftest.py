"""The sandbox lives in scripts/ and is imported as the container imports it (``import sandbox``)."""

import pytest


@pytest.fixture(scope="session")
def judge_sandbox():
    """Two fork servers with every layer this machine has, short limits so attacks end fast."""
    from sandbox import Limits, Sandbox

    with Sandbox(workers=2, limits=Limits(time_limit=0.5, wall_limit=1.0, memory_mb=256, output_bytes=4 << 20)) as box:
        yield box


@pytest.fixture
def readable_runtime(judge_sandbox):
    """Skip with the one-line cause (and its fix) when the workers cannot read the runtime here.

    ``test_worker_uids_can_read_the_runtime`` fails with that line, so the suite says it once.
    """
    if judge_sandbox.layout_problem:
        pytest.skip(f"the sandbox cannot judge here: {judge_sandbox.layout_problem}")
