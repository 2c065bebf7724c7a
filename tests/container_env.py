"""The environment the SageMaker toolkit gives a training script, with /opt/ml relocated under a
folder: one builder for every test that starts a script through the container contract."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def container_env(root: Path, channels: dict[str, Path], hyperparameters: dict | None = None) -> dict[str, str]:
    """This process's environment less its ``SM_*``/``SAGEMAKER_*`` variables, plus the container's:
    model, output and checkpoint folders under ``root``, one host, no GPU, ``SM_CHANNEL_<NAME>`` per
    channel and, when given, the hyperparameters as ``SM_HPS`` (the toolkit also passes them as
    ``--key value``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_"))}
    env.update(
        {
            "SAGEMAKER_BASE_DIR": str(root),
            "SM_MODEL_DIR": str(root / "model"),
            "SM_OUTPUT_DATA_DIR": str(root / "output" / "data"),
            "SM_OUTPUT_DIR": str(root / "output"),
            "SM_HOSTS": json.dumps(["algo-1"]),
            "SM_CURRENT_HOST": "algo-1",
            "SM_NUM_GPUS": "0",
            "SM_CURRENT_INSTANCE_TYPE": "local",
            "OMP_NUM_THREADS": "1",  # the same thread count in every run: identical float sums
            "PYTHONUNBUFFERED": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # torchrun
        }
    )
    if hyperparameters is not None:
        env["SM_HPS"] = json.dumps(hyperparameters)
    for name, folder in channels.items():
        env[f"SM_CHANNEL_{name.upper()}"] = str(folder)
    return env
