"""The request each notebook builds for its cloud configuration: checked by nbval and field by field.

Each notebook is cut after its ``# NBVAL_CHECK_OUTPUT`` cell (nothing after it is launched)
and run in local mode with its **cloud parameters** (only ``run_mode`` and ``work_dir`` are
injected, as papermill would), against the data, model and jobs of the session's notebook
run. Every SageMaker call is answered locally; the checked cell previews the
CreateTrainingJob request with the SDK's own code.

- nbval (``pytest --nbval-lax``) compares the checked cells with the outputs stored in git
  (``nbval_sanitize.cfg`` blanks job-name timestamps and bucket names);
- a cell appended here saves each previewed request, which the fidelity tests compare with
  the cloud configuration the notebook promises (instances, image, spot, checkpoints,
  distribution, network isolation, hyperparameters).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.notebook_hygiene import cut_notebooks, kernel_environment

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PYTORCH_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312"
HF_IMAGE = (
    "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:"
    "2.8.0-transformers4.56.2-gpu-py312-cu129-ubuntu22.04"
)


@pytest.fixture(scope="module")
def cloud_requests(notebook_run, tmp_path_factory) -> dict:
    """Run the cut notebooks under nbval; returns {notebook prefix: request} and nbval's result."""
    tmp_path = tmp_path_factory.mktemp("requests")
    dumps = tmp_path / "requests"
    dumps.mkdir()

    def save_request(name: str) -> str:
        target = dumps / f"{name[:2]}.json"
        return f"import json, pathlib\npathlib.Path({str(target)!r}).write_text(json.dumps(request, default=str))"

    notebooks = cut_notebooks(tmp_path, notebook_run.out / "work", save_request)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nbval-lax",
            "--nbval-current-env",
            "-p",
            "no:cacheprovider",
            "--nbval-sanitize-with",
            str(HERE / "nbval_sanitize.cfg"),
            "-c",
            str(tmp_path / "pytest.ini"),
            "--rootdir",
            str(tmp_path),
            "-q",
            *map(str, notebooks),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=kernel_environment(notebook_run.local_root),
        timeout=420,
    )
    requests = {p.stem: json.loads(p.read_text()) for p in dumps.glob("*.json")}
    return {"nbval": result, "requests": requests, "count": len(notebooks)}


def test_request_cells_match_their_stored_outputs(cloud_requests):
    result = cloud_requests["nbval"]
    assert cloud_requests["count"] == 6
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout


def _hyperparameters(request: dict) -> dict:
    decoded = {}
    for key, value in request["HyperParameters"].items():
        try:
            decoded[key] = json.loads(value)
        except ValueError:
            decoded[key] = value
    return decoded


# The cloud configuration each notebook promises (its parameters cell's defaults).
CLOUD = {
    "01": dict(
        image=HF_IMAGE,
        instance_type="ml.p4de.24xlarge",
        count=2,
        spot=False,
        isolation=False,
        torchrun=True,
        checkpoint=False,
        max_run=2 * 3600,
        program="sft.py",
        options={"max_steps": 300, "batch_size": 64, "per_device_batch_size": 4, "max_length": 2048},
    ),
    "02": dict(
        image=PYTORCH_IMAGE,
        instance_type="ml.p4de.24xlarge",
        count=1,
        spot=False,
        isolation=False,
        torchrun=True,
        checkpoint=False,
        max_run=2 * 3600,
        program="dpo.py",
        options={"max_steps": 200, "batch_size": 32, "beta": 0.1, "max_length": 1024},
    ),
    "03": dict(
        image=PYTORCH_IMAGE,
        instance_type="ml.p5.48xlarge",
        count=1,
        spot=False,
        isolation=False,
        torchrun=True,
        checkpoint=True,
        max_run=8 * 3600,
        program="grpo.py",
        options={"max_steps": 200, "prompts_per_step": 64, "group_size": 8, "max_new_tokens": 512},
    ),
    "04": dict(
        image=PYTORCH_IMAGE,
        instance_type="ml.p5.48xlarge",
        count=2,
        spot=False,
        isolation=True,
        torchrun=True,
        checkpoint=False,
        max_run=8 * 3600,
        program="code_rl.py",
        options={"max_steps": 100, "prompts_per_step": 32, "group_size": 8},
    ),
    "05": dict(
        image=PYTORCH_IMAGE,
        instance_type="ml.p5.48xlarge",
        count=1,
        spot=True,
        isolation=False,
        torchrun=True,
        checkpoint=True,
        max_run=8 * 3600,
        max_wait=16 * 3600,
        program="grpo.py",
        options={"max_steps": 200, "checkpoint_every": 0, "checkpoint_every_minutes": 10},
    ),
    "06": dict(
        image=PYTORCH_IMAGE,
        instance_type="ml.g5.2xlarge",
        count=1,
        spot=False,
        isolation=False,
        torchrun=False,
        checkpoint=False,
        max_run=3600,
        program="evaluate.py",
        options={"max_examples": 500, "environment": "gsm8k"},
    ),
}


@pytest.mark.parametrize("prefix", sorted(CLOUD))
def test_cloud_request_fidelity(cloud_requests, prefix):
    expected = CLOUD[prefix]
    request = cloud_requests["requests"].get(prefix)
    assert request is not None, f"notebook {prefix} saved no request: {cloud_requests['nbval'].stdout[-3000:]}"
    hyperparameters = _hyperparameters(request)
    assert request["AlgorithmSpecification"]["TrainingImage"] == expected["image"]
    assert request["ResourceConfig"]["InstanceType"] == expected["instance_type"]
    assert request["ResourceConfig"]["InstanceCount"] == expected["count"]
    assert bool(request.get("EnableManagedSpotTraining")) is expected["spot"]
    assert bool(request.get("EnableNetworkIsolation")) is expected["isolation"]
    assert bool(hyperparameters.get("sagemaker_torch_distributed_enabled")) is expected["torchrun"]
    assert hyperparameters["sagemaker_program"] == expected["program"]
    assert request["StoppingCondition"]["MaxRuntimeInSeconds"] == expected["max_run"]
    assert request["StoppingCondition"].get("MaxWaitTimeInSeconds") == expected.get("max_wait")
    assert bool(request.get("CheckpointConfig")) is expected["checkpoint"]
    if expected["checkpoint"]:
        assert request["CheckpointConfig"]["S3Uri"].endswith(request["TrainingJobName"])
    for option, value in expected["options"].items():
        assert hyperparameters[option] == value, f"{option}: {hyperparameters.get(option)!r} != {value!r}"
    channels = {c["ChannelName"] for c in request["InputDataConfig"]}
    assert "model" in channels, "the model is staged in S3 as a channel, not downloaded by every host"
    if expected["isolation"]:  # the SDK sends the code as a channel: an isolated container cannot reach S3
        assert "code" in channels
