"""A sandbox for judging untrusted programs (competitive-programming rewards).

``Sandbox`` runs each test in a forked, confined child of a clean pre-started interpreter;
``selftest.run_selftest`` attacks it with hostile programs before training relies on it.
See README.md for the layers and what each leaves to the others, ``confine.py`` for how each is
applied, ``forkserver.py`` for what a test inherits, ``checker.py`` for how outputs are compared.
"""

from .judge import ACCEPTED, REWARD_MODES, VERDICTS, Judgement, Limits, Sandbox, SandboxError, TestOutcome
from .selftest import SandboxEscape, run_selftest

__all__ = [
    "ACCEPTED",
    "REWARD_MODES",
    "VERDICTS",
    "Judgement",
    "Limits",
    "Sandbox",
    "SandboxError",
    "TestOutcome",
    "SandboxEscape",
    "run_selftest",
]
