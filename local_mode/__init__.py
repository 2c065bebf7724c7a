"""Everything that stands in for AWS and the internet, so that every notebook cell runs offline.

- ``local_mode.jobs``: SageMaker training jobs answered in this process; jobs run the real
  ``sagemaker-training`` toolkit, one process per host (``activate()`` starts it).
- ``local_mode.session_service``: the training-session service, a local process the SDK v3 and boto3
  reach through their endpoint settings.
- ``local_mode.endpoints``: models, endpoint configs and endpoints, served by ``transformers serve``.
- ``local_mode.llm_server``: an OpenAI-compatible server for the outside-model notebook.
- ``local_mode.tiny_model``, ``offline_models``, ``offline_data``, ``format_tuned_models``: the models and
  data sets that stand in for the Hugging Face Hub.
- ``local_mode.account``, ``storage``, ``validation``, ``os_utils``: what those share.

Names are loaded on first use, so importing the session service loads nothing of the job emulator.
See README.md beside this file.
"""

from __future__ import annotations

import importlib

_JOBS = (
    "activate", "active_root", "deactivate", "is_active", "simulate_spot_interruption",
    "start_training_sessions", "stop_training_sessions", "NOMINAL_SPOT_DISCOUNT",
)  # fmt: skip
_LAZY = {
    **{name: "local_mode.jobs" for name in _JOBS},
    "local_root": "local_mode.storage",
    "ACCOUNT_ID": "local_mode.account",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'local_mode' has no attribute {name!r}")


def environment_python(environment: str = ".venv") -> str:
    """The python of one of the project's environments: ``.venv`` (the main one, with torch: local mode's
    services run there), ``.venv-sessions`` (SDK v3) or ``.venv-image``. ``MAIN_ENV_PYTHON`` overrides
    the main one's."""
    import os
    from pathlib import Path

    if environment == ".venv" and os.environ.get("MAIN_ENV_PYTHON"):
        return os.environ["MAIN_ENV_PYTHON"]
    return str(Path(__file__).resolve().parents[1] / environment / "bin" / "python")


def run_in_main_environment(module: str, *args: str, timeout: float, doing: str) -> dict:
    """Run ``python -m module args`` in the main environment (from any environment, the SDK v3 one
    included) and return the JSON object its last line of output prints."""
    import json
    import subprocess

    python = environment_python()
    done = subprocess.run([python, "-m", module, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"Local mode could not {doing} with {python}:\n{done.stderr[-2000:]}\n"
            "Build the main environment first (README: make environments), or set MAIN_ENV_PYTHON to its python."
        )
    return json.loads(done.stdout.strip().splitlines()[-1])
