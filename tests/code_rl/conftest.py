"""code_rl.py and its environment import their siblings as top-level modules, as in the container."""

import pytest


@pytest.fixture(scope="module")
def code_sandbox():
    """Two fork servers with every layer this machine has."""
    from sandbox import Limits, Sandbox

    with Sandbox(workers=2, limits=Limits(time_limit=1.0, wall_limit=2.0)) as box:
        yield box
