"""The code-RL notebook's plumbing (09): the code environment with a pool of sandboxed judges on this
machine. The loop is in the notebook: notebook 08's GRPO step, given this environment, with step k+1
sampled while step k is judged.

Nothing else is new: the environment (``scripts/environments/code.py``: the program is the completion's
last fenced block, the reward the share of tests passed, ``format_reward`` 1 when there is a program) and
the sandbox (``scripts/sandbox``) are the jobs'. The environment's ``step_metrics()`` gives each step's
verdict shares (``accepted_rate``, ``wrong_answer_rate``, ..., ``no_code_rate``), ``test_pass_fraction`` and
``judge_time``.
"""

from __future__ import annotations

import contextlib

import helpers.training_sessions  # noqa: F401 - puts scripts/ (environments, sandbox) on the path


@contextlib.contextmanager
def code_environment(judge_workers: int = 2, max_tests: int = 0, self_test: bool = True):
    """The code environment with a judge pool: ``judge_workers`` sandboxed fork servers on this machine,
    attacked with hostile programs first (``self_test``); they are stopped on the way out."""
    from environments.code import CodeEnvironment, local_judge
    from sandbox import Sandbox, run_selftest

    with Sandbox(workers=judge_workers) as sandbox:
        if self_test:
            run_selftest(sandbox, log=lambda line: None)  # raises SandboxEscape if an attack got out
        print(sandbox.describe())
        yield CodeEnvironment(judge=local_judge(sandbox), max_tests=max_tests)
