"""Notebook 11 sends notebook 01's job through SDK v3's ``ModelTrainer``: its request cell is checked
by nbval, and its CreateTrainingJob request is compared with notebook 01's field by field.

Both notebooks are cut after their ``# NBVAL_CHECK_OUTPUT`` cell and run with their **cloud
parameters** in local mode (only ``run_mode`` and ``work_dir`` are injected): 01 in the main
environment (SDK v2, local mode in the kernel), 11 in the SDK v3 kernel against the local endpoint.
Their state file names the channels and the model where notebook 00 stages them. Nothing is
launched: each notebook previews its request with the SDK's own code, and a cell appended here saves it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tools.notebook_hygiene import cut_notebooks, is_checked, kernel_environment, problems

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NOTEBOOK = REPO / "notebooks" / "11_model_trainer_sft.ipynb"
SDK_V3_KERNEL = "sagemaker-sdk-v3"
BUCKET = "sagemaker-us-east-1-123456789012"  # local mode's default bucket, as on AWS for its account
WORKSHOP = f"s3://{BUCKET}/llm-training-loops"
STATE = {
    "run_mode": "local",
    "bucket": BUCKET,
    "role": "arn:aws:iam::123456789012:role/SageMakerLocalExecutionRole",
    "model": f"{WORKSHOP}/models/tiny",
    "channels": {"chat": {"train": f"{WORKSHOP}/data/chat/train", "test": f"{WORKSHOP}/data/chat/test"}},
}

# SDK v2's toolkit settings, sent as hyperparameters by the HuggingFace estimator. ModelTrainer does not
# use the toolkit: its ContainerEntrypoint runs the SDK's sm_train.sh from channel sm_drivers instead.
V2_TOOLKIT_HYPERPARAMETERS = {
    "sagemaker_program",
    "sagemaker_submit_directory",
    "sagemaker_torch_distributed_enabled",
    "sagemaker_container_log_level",
    "sagemaker_job_name",
    "sagemaker_region",
    "sagemaker_instance_type",
}
V3_CHANNELS = {"code", "sm_drivers"}  # scripts/ as a folder, and the SDK's drivers (sm_train.sh, torchrun_driver.py)
# Where the two requests must differ, and why; everything else must be equal.
ALLOWED_DIFFERENCES = {
    "TrainingJobName": "a new name per request (v2: sft-<date-time-ms>, v3: sft-<YYYYMMDDHHMMSS>)",
    "HyperParameters": f"v2 adds its toolkit's {sorted(V2_TOOLKIT_HYPERPARAMETERS)}; the script's options are equal",
    "AlgorithmSpecification": "v3 adds ContainerEntrypoint/ContainerArguments (sm_train.sh) instead of the toolkit; "
    "v2 adds EnableSageMakerMetricsTimeSeries (Studio's metric charts), which ModelTrainer "
    "has no setting for (the metric definitions reach CloudWatch either way)",
    "InputDataConfig": f"v3 adds channels {sorted(V3_CHANNELS)}; train, test and model are equal, but for the "
    "InputMode v3 names on each (File, what v2's channels take from TrainingInputMode)",
    "EnableManagedSpotTraining": "the twin runs on managed spot (Compute(enable_managed_spot_training=True)); 01 on demand",
    "StoppingCondition": "MaxWaitTimeInSeconds, required with spot (StoppingCondition(max_wait_time_in_seconds))",
    "CheckpointConfig": "checkpoints to S3, which a spot job resumes from; 01 sets none",
    "DebugHookConfig": "v2's estimator sends Debugger's defaults; v3 sends no Debugger configuration",
    "ProfilerConfig": "v2 switches its profiler off (disable_profiler=True); v3 configures none, so none runs",
    "OutputDataConfig": "the same S3OutputPath; v3 also names the service's default CompressionType GZIP",
}


def _save_request(name: str, target: Path) -> str:
    return (
        f"import json, pathlib\n"
        f"pathlib.Path({str(target / name[:2])!r} + '.json').write_text(json.dumps(request, default=str))"
    )


def _nbval(notebook: Path, env: dict, current_env: bool) -> subprocess.CompletedProcess:
    (notebook.parent / "pytest.ini").write_text("[pytest]\n")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nbval-lax",
            *(["--nbval-current-env"] if current_env else []),
            "-p",
            "no:cacheprovider",
            "--nbval-sanitize-with",
            str(HERE / "nbval_sanitize.cfg"),
            "-c",
            str(notebook.parent / "pytest.ini"),
            "--rootdir",
            str(notebook.parent),
            "-q",
            str(notebook),
        ],
        capture_output=True,
        text=True,
        cwd=notebook.parent,
        env=env,
        timeout=420,
    )


@pytest.fixture(scope="module")
def cloud_requests(tmp_path_factory) -> dict:
    """Notebooks 01 and 11 cut after their request cell, run under nbval: their requests and nbval's results."""
    from local_mode import session_service

    tmp = tmp_path_factory.mktemp("model_trainer")
    work, dumps, local_root = tmp / "work", tmp / "requests", tmp / "sagemaker-local"
    work.mkdir()
    dumps.mkdir()
    (work / "state.json").write_text(json.dumps(STATE))
    env = kernel_environment(local_root)

    def cut(kernel: str, prefix: str) -> Path:
        notebooks = cut_notebooks(tmp / kernel, work, lambda name: _save_request(name, dumps), kernel=kernel)
        return next(p for p in notebooks if p.name.startswith(prefix))

    try:
        results = {
            "01": _nbval(cut("python3", "01"), env, current_env=True),
            "11": _nbval(cut(SDK_V3_KERNEL, "11"), env, current_env=False),
        }
    finally:
        session_service.stop_service(local_root)  # the endpoint outlives the kernel that started it
    requests = {p.stem: json.loads(p.read_text()) for p in dumps.glob("*.json")}
    return {"nbval": results, "requests": requests, "local_root": local_root}


def test_notebook_11_is_clean_and_runs_in_the_sdk_v3_kernel():
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == SDK_V3_KERNEL
    assert [p for p in problems(nb) if not p.startswith("metadata.kernelspec")] == []
    assert len([c for c in nb.cells if is_checked(c)]) == 1
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(NOTEBOOK)], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert lint.returncode == 0, lint.stdout


def test_notebook_11_parameters_are_notebook_01s_cloud_defaults():
    import ast

    def parameters(path: Path) -> dict:
        cell = next(c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code")
        assert "parameters" in cell.metadata.get("tags", [])
        return {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(cell.source).body}

    twin, estimator = parameters(NOTEBOOK), parameters(REPO / "notebooks" / "01_estimator_sft.ipynb")
    assert {k: twin[k] for k in estimator} == estimator
    assert set(twin) - set(estimator) == {"use_spot", "max_wait_hours"}
    assert twin["use_spot"] is True and twin["max_wait_hours"] >= estimator["max_run_hours"]


def test_request_cells_match_their_stored_outputs(cloud_requests):
    for prefix, result in cloud_requests["nbval"].items():
        assert result.returncode == 0, (
            f"notebook {prefix}:\n" + result.stdout[:4000] + "\n...\n" + result.stdout[-3000:] + result.stderr[-2000:]
        )
        assert " passed" in result.stdout


def _channels(request: dict) -> dict:
    return {c["ChannelName"]: c for c in request.get("InputDataConfig", [])}


def test_the_twin_sends_notebook_01s_job(cloud_requests):
    v2, v3 = cloud_requests["requests"]["01"], cloud_requests["requests"]["11"]

    differing = sorted(key for key in set(v2) | set(v3) if v2.get(key) != v3.get(key))
    assert differing == sorted(ALLOWED_DIFFERENCES), {k: (v2.get(k), v3.get(k)) for k in differing}

    # Within the fields that differ, only what ALLOWED_DIFFERENCES names.
    assert v2["TrainingJobName"].startswith("sft-") and v3["TrainingJobName"].startswith("sft-")
    v2_options = {k: v for k, v in v2["HyperParameters"].items() if k not in V2_TOOLKIT_HYPERPARAMETERS}
    assert set(v2["HyperParameters"]) - set(v2_options) == V2_TOOLKIT_HYPERPARAMETERS
    assert v3["HyperParameters"] == v2_options  # the script's options, serialised alike (JSON text)
    algorithm_v3 = dict(v3["AlgorithmSpecification"])
    entrypoint = algorithm_v3.pop("ContainerEntrypoint") + algorithm_v3.pop("ContainerArguments")
    assert entrypoint[-1].endswith("/opt/ml/input/data/sm_drivers/sm_train.sh")
    algorithm_v2 = dict(v2["AlgorithmSpecification"])
    assert algorithm_v2.pop("EnableSageMakerMetricsTimeSeries") is True
    assert algorithm_v3 == algorithm_v2  # image, input mode, metric definitions
    channels_v2, channels_v3 = _channels(v2), _channels(v3)
    assert set(channels_v3) - set(channels_v2) == V3_CHANNELS
    assert {c["InputMode"] for c in channels_v3.values()} == {v2["AlgorithmSpecification"]["TrainingInputMode"]}
    assert {k: {f: v for f, v in channels_v3[k].items() if f != "InputMode"} for k in channels_v2} == channels_v2
    assert "EnableManagedSpotTraining" not in v2 and v3["EnableManagedSpotTraining"] is True
    assert v2["StoppingCondition"] == {"MaxRuntimeInSeconds": 2 * 3600}
    assert v3["StoppingCondition"] == {"MaxRuntimeInSeconds": 2 * 3600, "MaxWaitTimeInSeconds": 4 * 3600}
    assert "CheckpointConfig" not in v2
    assert v3["CheckpointConfig"]["LocalPath"] == "/opt/ml/checkpoints"
    assert v3["CheckpointConfig"]["S3Uri"].startswith(f"{WORKSHOP}/checkpoints/sft-")
    assert "DebugHookConfig" in v2 and "DebugHookConfig" not in v3
    assert v2["ProfilerConfig"] == {"DisableProfiler": True} and "ProfilerConfig" not in v3
    assert v3["OutputDataConfig"] == {**v2["OutputDataConfig"], "CompressionType": "GZIP"}


def test_the_twin_runs_torchrun_on_every_node(cloud_requests):
    """The v2 request says so with sagemaker_torch_distributed_enabled; the v3 one with the drivers it
    uploads: sm_train.sh starts torchrun_driver.py, configured by distributed.json (Torchrun())."""
    v2, v3 = cloud_requests["requests"]["01"], cloud_requests["requests"]["11"]
    assert json.loads(v2["HyperParameters"]["sagemaker_torch_distributed_enabled"]) is True
    assert json.loads(v2["HyperParameters"]["sagemaker_program"]) == "sft.py"
    drivers_uri = _channels(v3)["sm_drivers"]["DataSource"]["S3DataSource"]["S3Uri"]
    bucket, _, key = drivers_uri[len("s3://") :].partition("/")
    drivers = cloud_requests["local_root"] / "s3" / bucket / key  # local mode mirrors S3 on disk
    assert "distributed_drivers/torchrun_driver.py" in (drivers / "sm_train.sh").read_text()
    assert json.loads((drivers / "distributed.json").read_text()) == {"process_count_per_node": None, "smp": None}
    assert json.loads((drivers / "sourcecode.json").read_text())["entry_script"] == "sft.py"
    code_uri = _channels(v3)["code"]["DataSource"]["S3DataSource"]["S3Uri"]
    bucket, _, key = code_uri[len("s3://") :].partition("/")
    assert (cloud_requests["local_root"] / "s3" / bucket / key / "sft.py").read_bytes() == (
        REPO / "scripts" / "sft.py"
    ).read_bytes()
