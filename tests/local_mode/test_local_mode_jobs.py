"""Training jobs in local mode, driven only through the SageMaker SDK's and boto3's public APIs.

Spot interruptions are delivered as the image would deliver them. In SageMaker's PyTorch image the
SIGTERM goes to ``bash -m start_with_right_hostname.sh``, which drops it: the script only ever sees
SIGKILL, and the job resumes from its last periodic checkpoint. An image whose entry point passes
SIGTERM on (named in ``SAGEMAKER_LOCAL_SIGTERM_REACHES_SCRIPT``) lets the script save the step it is in.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from pathlib import Path

import boto3
import pytest
from sagemaker.analytics import TrainingJobAnalytics
from sagemaker.estimator import Estimator
from sagemaker.exceptions import UnexpectedStatusException
from sagemaker.huggingface import HuggingFace
from sagemaker.inputs import TrainingInput
from sagemaker.pytorch import PyTorch

pytestmark = pytest.mark.timeout(240)

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
STEP_METRICS = [{"Name": "loss", "Regex": r"\bloss=(-?[0-9.]+(?:[eE][-+]?[0-9]+)?)"}]


def pytorch(session, role, code, **kwargs):
    options = dict(
        entry_point="fixture_train.py",
        source_dir=str(code),
        role=role,
        instance_type="ml.p5.48xlarge",
        instance_count=1,
        framework_version="2.8.0",
        py_version="py312",
        sagemaker_session=session,
    )
    options.update(kwargs)
    return PyTorch(**options)


def read_model(session, model_data: str) -> dict[str, bytes]:
    bucket, key = model_data[len("s3://") :].split("/", 1)
    body = session.boto_session.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def s3_file_is_whole(session, uri: str, body: bytes) -> bool:
    """The object, and local S3's copy of it on disk, both still hold ``body``."""
    bucket, key = uri[len("s3://") :].split("/", 1)
    stored = session.boto_session.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    on_disk = (Path(os.environ["SAGEMAKER_LOCAL_ROOT"]) / "s3" / bucket / key).read_bytes()
    return stored == on_disk == body


def test_pytorch_fit_streams_logs_metrics_model_and_checkpoints(local_session, role, fixture_code, capsys, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"a": 1}\n{"a": 2}\n{"a": 3}\n')
    train_uri = local_session.upload_data(str(data), key_prefix="fixture/train")
    checkpoints = f"s3://{local_session.default_bucket()}/fixture/checkpoints"
    estimator = pytorch(
        local_session, role, fixture_code,
        hyperparameters={"steps": 3},
        metric_definitions=STEP_METRICS,
        checkpoint_s3_uri=checkpoints,
    )  # fmt: skip
    estimator.fit({"train": TrainingInput(train_uri)}, logs=True)

    out = capsys.readouterr().out
    assert "fixture started mode=steps host=algo-1" in out  # the SDK streamed the container's log
    assert "step=3 loss=0.3333" in out
    assert "Completed - Training job completed" in out
    # The script's temporary folder was the job's own, and went with the job, as a container's /tmp does.
    (job_tmp,) = re.findall(r"^tmp=(.+)$", out, re.MULTILINE)
    assert Path(job_tmp).resolve().is_relative_to(Path(os.environ["SAGEMAKER_LOCAL_ROOT"]).resolve()), job_tmp
    assert not Path(job_tmp).exists()

    model = read_model(local_session, estimator.model_data)
    assert json.loads(model["result.json"]) == {"final_step": 3, "resumed_from": 0, "rows": 3}
    # The channel was local S3's copy of the file, linked read-only (S3's, the job's download, the host's
    # tree), not a copy: a job's model channel is 540 MB on SmolLM2.
    assert "channel_file links=3 mode=444" in out
    # The instance's model, checkpoints and channels went with the job, as on SageMaker; the rest stays.
    run = Path(os.environ["SAGEMAKER_LOCAL_ROOT"]) / "runs" / estimator.latest_training_job.name
    host = run / "attempt-1" / "algo-1" / "opt" / "ml"
    assert (host / "input" / "config" / "hyperparameters.json").is_file()
    assert [p for p in ("model", "checkpoints", "input/data") if (host / p).exists()] == []
    assert not (run / "downloads" / "channels").exists()
    assert re.search(r"freed \d+\.\d MB of instance storage", out)
    assert s3_file_is_whole(local_session, train_uri + "/train.jsonl", b'{"a": 1}\n{"a": 2}\n{"a": 3}\n')

    description = estimator.latest_training_job.describe()
    assert description["FinalMetricDataList"][0]["MetricName"] == "loss"
    assert description["FinalMetricDataList"][0]["Value"] == pytest.approx(0.3333)
    assert description["TrainingTimeInSeconds"] >= 1
    assert description["BillableTimeInSeconds"] == description["TrainingTimeInSeconds"]
    frame = TrainingJobAnalytics(
        estimator.latest_training_job.name, ["loss"], sagemaker_session=local_session
    ).dataframe()
    # CloudWatch averages each 60 s period (TrainingJobAnalytics' default), as on SageMaker.
    assert list(frame["metric_name"]) == ["loss"]
    assert frame["value"].iloc[0] == pytest.approx((1.0 + 0.5 + 0.3333) / 3, abs=1e-3)

    # The checkpoint went to S3; a second job starts from it.
    s3 = local_session.boto_session.client("s3")
    saved = s3.get_object(Bucket=local_session.default_bucket(), Key="fixture/checkpoints/state.json")
    assert json.loads(saved["Body"].read()) == {"step": 3}
    again = pytorch(local_session, role, fixture_code, hyperparameters={"steps": 5}, checkpoint_s3_uri=checkpoints)
    again.fit(logs=False)
    assert json.loads(read_model(local_session, again.model_data)["result.json"])["resumed_from"] == 3


def test_two_hosts_torch_distributed_all_reduce(local_session, role, fixture_code):
    estimator = pytorch(
        local_session, role, fixture_code,
        instance_count=2,
        distribution={"torch_distributed": {"enabled": True}},
        hyperparameters={"mode": "allreduce"},
    )  # fmt: skip
    estimator.fit(logs=False)
    result = json.loads(read_model(local_session, estimator.model_data)["allreduce.json"])
    assert result["world_size"] == 2
    assert result["sum"] == 3.0  # rank 0 contributed 1, rank 1 contributed 2
    assert len(result["hosts"]) == 2
    # the two hosts share this machine's cores rather than each taking all of them
    from local_mode.jobs.hosts import machine_threads

    assert result["threads"] == 2 * max(1, machine_threads() // 2), result


def test_network_isolation_ships_the_code_as_a_channel(local_session, role, fixture_code):
    """With isolation the SDK sends the code as channel 'code' and points the toolkit at the file
    inside the container; the job must run from it, with the request left as the SDK built it."""
    estimator = pytorch(
        local_session, role, fixture_code,
        hyperparameters={"steps": 2},
        enable_network_isolation=True,
    )  # fmt: skip
    estimator.fit(logs=False)
    description = estimator.latest_training_job.describe()
    assert description["EnableNetworkIsolation"] is True
    assert "code" in [c["ChannelName"] for c in description["InputDataConfig"]]
    assert json.loads(description["HyperParameters"]["sagemaker_submit_directory"]).startswith(
        "/opt/ml/input/data/code/"
    )
    assert json.loads(read_model(local_session, estimator.model_data)["result.json"])["final_step"] == 2


def test_failing_host_fails_the_job_and_stops_its_peer(local_session, role, fixture_code):
    estimator = pytorch(
        local_session, role, fixture_code,
        instance_count=2,
        distribution={"torch_distributed": {"enabled": True}},
        hyperparameters={"mode": "allreduce", "fail_host": "2"},
        max_run=120,
    )  # fmt: skip
    with pytest.raises(UnexpectedStatusException, match="rank 1 gave up on purpose"):
        estimator.fit(logs=False)
    description = estimator.latest_training_job.describe()
    assert description["TrainingJobStatus"] == "Failed"
    assert description["FailureReason"].startswith("AlgorithmError: rank 1 gave up on purpose")
    assert description["TrainingTimeInSeconds"] < 60  # not the 120 s limit: the waiting peer was stopped


def test_generic_estimator_failure_reason(local_session, role, fixture_code):
    from sagemaker import image_uris

    image = image_uris.retrieve("pytorch", region="us-east-1", version="2.8.0", py_version="py312",
                                instance_type="ml.p5.48xlarge", image_scope="training")  # fmt: skip
    estimator = Estimator(
        image_uri=image, entry_point="fixture_train.py", source_dir=str(fixture_code), role=role,
        instance_type="ml.p5.48xlarge", instance_count=1, hyperparameters={"mode": "fail"},
        sagemaker_session=local_session,
    )  # fmt: skip
    with pytest.raises(UnexpectedStatusException, match="failed on purpose"):
        estimator.fit(logs=False)


def test_huggingface_estimator_and_missing_requirements(local_session, role, tmp_path, fixture_code):
    code = tmp_path / "code"
    code.mkdir()
    (code / "fixture_train.py").write_text((fixture_code / "fixture_train.py").read_text())
    (code / "requirements.txt").write_text("packaging\nno-such-package-for-local-mode==1.0\n")
    estimator = HuggingFace(
        entry_point="fixture_train.py", source_dir=str(code), role=role,
        instance_type="ml.p5.48xlarge", instance_count=1,
        transformers_version="4.56.2", pytorch_version="2.8.0", py_version="py312",
        sagemaker_session=local_session,
    )  # fmt: skip
    with pytest.raises(UnexpectedStatusException) as raised:
        estimator.fit(logs=False)
    reason = estimator.latest_training_job.describe()["FailureReason"]
    assert "no-such-package-for-local-mode==1.0" in reason
    assert "pip install" in reason
    assert "packaging" not in reason.split("lacks:")[1].split(".")[0]  # installed, so not named
    assert "no-such-package" in str(raised.value)

    (code / "requirements.txt").write_text("packaging\n")
    estimator.fit(logs=False)
    assert json.loads(read_model(local_session, estimator.model_data)["result.json"])["final_step"] == 3


def test_session_train_and_boto3_waiter(local_session, role, fixture_code, tmp_path):
    # What the SDK does for script mode, by hand: the code as sourcedir.tar.gz in S3, and
    # hyperparameters (JSON-encoded) naming it.
    archive = tmp_path / "sourcedir.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(fixture_code / "fixture_train.py", arcname="fixture_train.py")
    code_uri = local_session.upload_data(str(archive), key_prefix="fixture/code")
    bucket = local_session.default_bucket()
    template = {
        "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/fixture/output"},
        "HyperParameters": {
            "sagemaker_program": json.dumps("fixture_train.py"),
            "sagemaker_submit_directory": json.dumps(code_uri),
            "steps": json.dumps(2),
        },
        "AlgorithmSpecification": {
            "TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-cpu-py312"
        },
    }

    local_session.train(
        input_mode="File",
        input_config=None,
        role=role,
        job_name="fixture-session-train",
        output_config=template["OutputDataConfig"],
        resource_config={"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        vpc_config=None,
        hyperparameters=template["HyperParameters"],
        stop_condition={"MaxRuntimeInSeconds": 300},
        tags=None,
        metric_definitions=None,
        image_uri=template["AlgorithmSpecification"]["TrainingImage"],
    )
    assert local_session.wait_for_job("fixture-session-train")["TrainingJobStatus"] == "Completed"

    sagemaker = boto3.client("sagemaker")  # the default session: local mode's
    sagemaker.create_training_job(
        TrainingJobName="fixture-boto3",
        AlgorithmSpecification={"TrainingImage": template["AlgorithmSpecification"]["TrainingImage"],
                                "TrainingInputMode": "File"},
        RoleArn=role,
        HyperParameters=template["HyperParameters"],
        OutputDataConfig=template["OutputDataConfig"],
        ResourceConfig={"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        StoppingCondition={"MaxRuntimeInSeconds": 300},
    )  # fmt: skip
    sagemaker.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName="fixture-boto3", WaiterConfig={"Delay": 1, "MaxAttempts": 120}
    )
    description = sagemaker.describe_training_job(TrainingJobName="fixture-boto3")
    assert description["TrainingJobStatus"] == "Completed"
    assert description["ModelArtifacts"]["S3ModelArtifacts"].endswith("fixture-boto3/output/model.tar.gz")
    names = [s["TrainingJobName"] for s in sagemaker.list_training_jobs(MaxResults=10)["TrainingJobSummaries"]]
    assert names == ["fixture-boto3", "fixture-session-train"]  # newest first


def test_stop_training_job(local_session, role, fixture_code):
    estimator = pytorch(local_session, role, fixture_code, hyperparameters={"steps": 200, "step_seconds": 0.5})
    estimator.fit(wait=False)
    job = estimator.latest_training_job
    client = local_session.sagemaker_client
    import time

    deadline = time.time() + 300  # the job may wait for another local job (one at a time per machine)
    while client.describe_training_job(TrainingJobName=job.name)["SecondaryStatus"] != "Training":
        assert time.time() < deadline
        time.sleep(0.2)
    job.stop()
    # The SDK's wait_for_job treats "Stopping" as an end state (and raises on it, on SageMaker too);
    # boto3's waiter waits through it.
    client.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName=job.name, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
    )
    description = client.describe_training_job(TrainingJobName=job.name)
    assert description["TrainingJobStatus"] == "Stopped"
    statuses = [t["Status"] for t in description["SecondaryStatusTransitions"]]
    assert statuses[-3:] == ["Stopping", "Uploading", "Stopped"]
    with pytest.raises(client.exceptions.ClientError, match="in status Stopped"):
        client.stop_training_job(TrainingJobName=job.name)


def test_spot_interruption_restarts_from_checkpoint(local_session, role, fixture_code):
    from local_mode import NOMINAL_SPOT_DISCOUNT, simulate_spot_interruption

    estimator = pytorch(
        local_session, role, fixture_code,
        hyperparameters={"steps": 6, "step_seconds": 0.3},
        use_spot_instances=True, max_run=300, max_wait=600,
        checkpoint_s3_uri=f"s3://{local_session.default_bucket()}/spot/checkpoints",
    )  # fmt: skip
    estimator.fit(wait=False)
    simulate_spot_interruption(estimator.latest_training_job.name, after_step=2)
    description = local_session.wait_for_job(estimator.latest_training_job.name)

    statuses = [t["Status"] for t in description["SecondaryStatusTransitions"]]
    assert statuses == ["Starting", "Starting", "Downloading", "Training", "Interrupted", "Restarting",
                        "Training", "Uploading", "Completed"]  # fmt: skip
    result = json.loads(read_model(local_session, estimator.model_data)["result.json"])
    assert result["final_step"] == 6
    assert 2 <= result["resumed_from"] < 6  # resumed from its checkpoint, not from scratch
    # Neither instance kept its checkpoints: the interrupted one went at the interruption, the other at the end.
    run = Path(os.environ["SAGEMAKER_LOCAL_ROOT"]) / "runs" / estimator.latest_training_job.name
    assert [a.name for a in sorted(run.glob("attempt-*"))] == ["attempt-1", "attempt-2"]
    assert list(run.glob("attempt-*/algo-1/opt/ml/checkpoints")) == []
    saved = local_session.boto_session.client("s3").get_object(
        Bucket=local_session.default_bucket(), Key="spot/checkpoints/state.json"
    )
    assert json.loads(saved["Body"].read()) == {"step": 6}
    expected = max(1, round(description["TrainingTimeInSeconds"] * (1 - NOMINAL_SPOT_DISCOUNT)))
    assert description["BillableTimeInSeconds"] == expected


def test_max_runtime_stops_the_job(local_session, role, fixture_code):
    estimator = pytorch(
        local_session, role, fixture_code, hyperparameters={"steps": 500, "step_seconds": 0.2}, max_run=3
    )
    estimator.fit(logs=False)  # Stopped is not an error for the SDK: it warns
    description = estimator.latest_training_job.describe()
    assert description["TrainingJobStatus"] == "Stopped"
    assert description["SecondaryStatus"] == "MaxRuntimeExceeded"
    assert description["TrainingTimeInSeconds"] < 30


LOG_GROUP = "/aws/sagemaker/TrainingJobs"
CUSTOM_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-trainer:latest"


def job_log(session, job_name: str) -> list[str]:
    """Every line the job's hosts printed, across its attempts, in order."""
    logs = session.boto_session.client("logs")
    streams = logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=job_name)["logStreams"]
    lines = []
    for stream in streams:
        events = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=stream["logStreamName"], startFromHead=True)[
            "events"
        ]
        lines += [e["message"] for e in events]
    return lines


def split_attempts(lines: list[str], resumed_marker: str) -> tuple[list[str], list[str]]:
    """The lines before the restarted script's first resume line, and from it on."""
    at = next(i for i, line in enumerate(lines) if resumed_marker in line)
    return lines[:at], lines[at:]


def steps_in(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for line in lines for m in [re.match(r"step=(\d+) ", line)] if m]


def test_pytorch_image_interruption_never_reaches_the_script(local_session, role, fixture_code):
    """The faithful path: no SIGTERM in the script, the job resumes from its last periodic
    checkpoint, and the steps after it are lost (computed again), not the whole run."""
    from local_mode import simulate_spot_interruption

    every = 3
    estimator = pytorch(
        local_session, role, fixture_code,
        hyperparameters={"steps": 12, "step_seconds": 0.3, "checkpoint_every": every},
        use_spot_instances=True, max_run=300, max_wait=600,
        checkpoint_s3_uri=f"s3://{local_session.default_bucket()}/spot-dlc/checkpoints",
    )  # fmt: skip
    estimator.fit(wait=False)
    name = estimator.latest_training_job.name
    simulate_spot_interruption(name, after_step=5)
    description = local_session.wait_for_job(name)
    assert description["TrainingJobStatus"] == "Completed"
    assert "Interrupted" in [t["Status"] for t in description["SecondaryStatusTransitions"]]

    lines = job_log(local_session, name)
    assert not any("SIGTERM received" in line for line in lines), "the PyTorch image drops SIGTERM"
    first, second = split_attempts(lines, "resumed from step")
    last_before = max(steps_in(first))
    resumed = json.loads(read_model(local_session, estimator.model_data)["result.json"])["resumed_from"]
    assert resumed > 0, "the job started over instead of resuming from its checkpoint"
    assert last_before >= 5 and resumed == every * (last_before // every)  # the newest periodic checkpoint
    lost = last_before - resumed
    assert lost == last_before % every
    assert second[0] == f"resumed from step {resumed}"
    assert steps_in(second) == list(range(resumed + 1, 13))  # the lost steps, and only they, run again


def test_image_that_passes_sigterm_on_gets_the_scripts_save(
    local_session, role, monkeypatch, tmp_path, tiny_model_path, offline_data
):
    """sft.py with only the SIGTERM save (no periodic checkpoint): in an image whose entry point
    delivers SIGTERM to the script, it saves the step it is in, and the job resumes from exactly it."""
    from local_mode import simulate_spot_interruption

    monkeypatch.setenv("SAGEMAKER_LOCAL_SIGTERM_REACHES_SCRIPT", "my-trainer")
    monkeypatch.setenv("SAGEMAKER_LOCAL_STOP_GRACE_SECONDS", "60")  # a loaded machine: ends when the script does
    model_uri = local_session.upload_data(str(tiny_model_path), key_prefix="spot-custom/model")
    train_uri = local_session.upload_data(str(offline_data["chat"]), key_prefix="spot-custom/chat")
    estimator = Estimator(
        image_uri=CUSTOM_IMAGE, entry_point="sft.py", source_dir=str(SCRIPTS), role=role,
        instance_type="ml.g5.xlarge", instance_count=1, sagemaker_session=local_session,
        hyperparameters={"max_steps": 40, "batch_size": 4, "per_device_batch_size": 2, "checkpoint_every": 0,
                         "log_every": 1},
        environment={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        use_spot_instances=True, max_run=600, max_wait=1200,
        checkpoint_s3_uri=f"s3://{local_session.default_bucket()}/spot-custom/checkpoints",
    )  # fmt: skip
    estimator.fit({"train": TrainingInput(train_uri), "model": TrainingInput(model_uri)}, wait=False)
    name = estimator.latest_training_job.name
    simulate_spot_interruption(name, after_step=3)
    description = local_session.wait_for_job(name)
    assert description["TrainingJobStatus"] == "Completed", description.get("FailureReason")

    lines = job_log(local_session, name)
    first, second = split_attempts(lines, "resumed from")
    assert any("SIGTERM received" in line for line in first)
    stopped = [
        int(m.group(1)) for line in first for m in [re.search(r"stopped by SIGTERM after step (\d+)", line)] if m
    ]
    assert len(stopped) == 1 and stopped[0] >= 3
    interrupted = max(steps_in(first))
    assert stopped[0] == interrupted  # it stopped at the end of the step it was in, and saved that one
    assert re.search(rf"\(step {interrupted}\)", second[0]), second[0]  # the resume step is the interrupted one
    assert steps_in(second) == list(range(interrupted + 1, 41))  # nothing lost, nothing redone
    assert "model.safetensors" in read_model(local_session, estimator.model_data)


def test_an_ended_jobs_instances_keep_only_what_it_was_given_and_what_it_reported(tmp_path):
    """All of an instance's tree goes with the job but its config, code and output, whatever the script
    left: a checkpoint half-written in a staging folder beside the synced one (SmolLM2's is 1.6 GB) as
    well as the model and channels. A channel linked to local S3's copy is not counted as freed."""
    from local_mode.jobs import hosts as hostlib

    tree = tmp_path / "algo-1" / "opt" / "ml"
    files = {
        "input/config/hyperparameters.json": b"{}",
        "code/train.py": b"print()",
        "output/failure": b"why",
        "output/data/metrics.json": b"{}",
        "model/model.safetensors": b"m" * 1000,
        "checkpoints/step_4/model.pt": b"c" * 300,
        ".checkpoints-staging/.tmp-step_8/model.pt": b"s" * 70,
        "input/data/train/train.jsonl": b"linked",
    }
    for name, data in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(data)
    s3_copy = tmp_path / "s3" / "train.jsonl"
    s3_copy.parent.mkdir()
    os.link(tree / "input/data/train/train.jsonl", s3_copy)
    host = hostlib.Host("algo-1", "algo-1", tree, checkpoints=tree / "checkpoints")

    freed = hostlib.release_instances([host])

    left = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
    assert left == ["code/train.py", "input/config/hyperparameters.json", "output/data/metrics.json", "output/failure"]
    assert freed == 1000 + 300 + 70  # not the linked channel: S3's copy still holds its bytes
    assert s3_copy.read_bytes() == b"linked"
