"""A later Python process (a later notebook kernel) sees earlier jobs, their logs and S3 objects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

LATER_KERNEL = textwrap.dedent(
    """
    import io, json, sys, tarfile
    from sagemaker.pytorch import PyTorch
    from helpers.sagemaker_session import make_session

    session = make_session(run_mode="local")
    job_name = sys.argv[1]
    estimator = PyTorch.attach(job_name, sagemaker_session=session)
    bucket, key = estimator.model_data[len("s3://"):].split("/", 1)
    body = session.boto_session.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        result = json.load(tar.extractfile("result.json"))
    data = session.read_s3_file(session.default_bucket(), "fixture/notes.txt")
    listed = [s["TrainingJobName"] for s in session.sagemaker_client.list_training_jobs()["TrainingJobSummaries"]]
    streams = session.boto_session.client("logs").describe_log_streams(
        logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix=job_name + "/")["logStreams"]
    print("RESULT " + json.dumps({"result": result, "data": data, "listed": listed, "streams": len(streams),
                                  "entry_point": estimator.entry_point}))
    """
)


def test_second_process_sees_jobs_and_objects(local_session, role, fixture_code, tmp_path):
    from sagemaker.pytorch import PyTorch

    local_session.upload_string_as_file_body("kept across kernels", local_session.default_bucket(), "fixture/notes.txt")
    estimator = PyTorch(
        entry_point="fixture_train.py", source_dir=str(fixture_code), role=role, instance_type="ml.m5.xlarge",
        instance_count=1, framework_version="2.8.0", py_version="py312", sagemaker_session=local_session,
        hyperparameters={"steps": 2},
    )  # fmt: skip
    estimator.fit(logs=False)

    script = tmp_path / "later_kernel.py"
    script.write_text(LATER_KERNEL)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    completed = subprocess.run(
        [sys.executable, str(script), estimator.latest_training_job.name],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = next(x for x in completed.stdout.splitlines() if x.startswith("RESULT "))
    seen = json.loads(line[len("RESULT ") :])
    assert seen["result"] == {"final_step": 2, "resumed_from": 0, "rows": 0}
    assert seen["data"] == "kept across kernels"
    assert seen["listed"] == [estimator.latest_training_job.name]
    assert seen["streams"] == 1
    assert seen["entry_point"] == "fixture_train.py"


KERNEL_THAT_DIES = textwrap.dedent(
    """
    import pathlib, sys, time
    from sagemaker.pytorch import PyTorch
    from helpers.sagemaker_session import execution_role, make_session

    session = make_session(run_mode="local")
    estimator = PyTorch(
        entry_point="fixture_train.py", source_dir=sys.argv[1], role=execution_role(session),
        instance_type="ml.m5.xlarge", instance_count=1, framework_version="2.8.0", py_version="py312",
        sagemaker_session=session, hyperparameters={"steps": 500, "step_seconds": 0.2},
    )
    estimator.fit(job_name="fixture-orphan-check", wait=False)
    logs = pathlib.Path(sys.argv[2])
    while not any("step=" in p.read_text() for p in logs.glob("*.jsonl")):
        time.sleep(0.2)
    print("TRAINING", flush=True)
    time.sleep(600)
    """
)


def _processes_of_job(job_name: str) -> list:
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("TRAINING_JOB_NAME") == job_name:
                found.append(process)
        except psutil.Error:
            continue
    return found


def test_killed_kernel_leaves_nothing_running(local_session, fixture_code, tmp_path):
    import signal
    import time

    root = Path(os.environ["SAGEMAKER_LOCAL_ROOT"])
    log = root / "logs" / "fixture-orphan-check"
    script = tmp_path / "dying_kernel.py"
    script.write_text(KERNEL_THAT_DIES)
    kernel = subprocess.Popen(
        [sys.executable, str(script), str(fixture_code), str(log)],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=tmp_path,
    )  # fmt: skip
    try:
        for line in kernel.stdout:
            if line.startswith("TRAINING"):
                break
        assert _processes_of_job("fixture-orphan-check"), "the job's host processes should be running"
        kernel.send_signal(signal.SIGKILL)  # no atexit, no cleanup in the kernel itself
        kernel.wait(timeout=10)
        deadline = time.time() + 20
        while _processes_of_job("fixture-orphan-check") and time.time() < deadline:
            time.sleep(0.5)
        assert _processes_of_job("fixture-orphan-check") == []
    finally:
        kernel.kill()
    # This process sees the job, and that nothing runs it any more.
    description = local_session.sagemaker_client.describe_training_job(TrainingJobName="fixture-orphan-check")
    assert description["TrainingJobStatus"] == "Failed"
    assert "ended before the job finished" in description["FailureReason"]


class _Reads:
    """A job store whose reads return the given records in turn."""

    def __init__(self, *records):
        self.records, self.saved = list(records), []

    def load_job(self, name):
        return dict(self.records.pop(0))

    def save_job(self, job):
        self.saved.append(job)


def test_a_job_that_ends_while_it_is_described_is_not_taken_for_an_orphan():
    """The runner saves the job's end, then leaves RUNNING; a describe that read the job before the
    save and checks RUNNING after it must not mark the finished job Failed."""
    from types import SimpleNamespace

    from local_mode.jobs import api

    ran_here = {"TrainingJobName": "just-ended", "SecondaryStatus": "Training", "_owner": api.process_identity()}
    store = _Reads({**ran_here, "TrainingJobStatus": "InProgress"}, {**ran_here, "TrainingJobStatus": "Completed"})
    assert api.SageMakerAPI(SimpleNamespace(storage=store))._load("just-ended")["TrainingJobStatus"] == "Completed"
    assert store.saved == []

    orphan = {**ran_here, "TrainingJobStatus": "InProgress"}  # still active when read again: nothing runs it
    store = _Reads(orphan, orphan)
    job = api.SageMakerAPI(SimpleNamespace(storage=store))._load("just-ended")
    assert job["TrainingJobStatus"] == "Failed" and "ended before the job finished" in job["FailureReason"]
    assert store.saved == [job]


def test_s3_writes_skip_the_network_checksum(local_session):
    """Local S3 is moto in this process: a PutObject carries no aws-chunked CRC, which cost a 540 MB model
    ~25 s per put (at every kernel's restore and every upload). The object still arrives whole, on disk too."""
    import local_mode

    sent = []
    s3 = local_session.boto_session.client("s3")
    s3.meta.events.register("before-send.s3.PutObject", lambda request, **_: sent.append(dict(request.headers)))
    body = os.urandom(3 * 1024 * 1024)
    bucket = local_session.default_bucket()
    s3.put_object(Bucket=bucket, Key="fixture/weights.bin", Body=body)
    (headers,) = sent
    assert not [h for h in headers if h.lower().startswith("x-amz-checksum")], headers
    assert "aws-chunked" not in str(headers.get("Content-Encoding", "")), headers
    assert s3.get_object(Bucket=bucket, Key="fixture/weights.bin")["Body"].read() == body
    assert (local_mode.active_root() / "s3" / bucket / "fixture" / "weights.bin").read_bytes() == body


def test_a_process_keeps_its_identity_when_the_wall_clock_steps(monkeypatch):
    """psutil's create_time follows the wall clock (Linux derives the boot time from it): after an NTP step
    the kernel running a job seemed another process, and local mode failed its job mid-run."""
    import psutil

    from local_mode import os_utils

    before = os_utils.process_identity()
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: 1e9)  # the clock stepped
    assert os_utils.process_identity() == before and os_utils.is_same_process(before)


LAZY_KERNEL = textwrap.dedent(
    """
    import json, sys
    import boto3
    from helpers.sagemaker_session import make_session
    import local_mode

    session = make_session(run_mode="local")
    bucket = session.default_bucket()
    quiet = local_mode.jobs._active._quiet_s3  # moto itself, without local mode's hooks
    held_at_start = quiet.list_objects_v2(Bucket=bucket).get("KeyCount", 0)
    s3 = boto3.client("s3")  # a plain client: local mode's session is boto3's default
    body = s3.get_object(Bucket=bucket, Key="fixture/big/weights.bin")["Body"].read()
    held_after_read = sorted(o["Key"] for o in quiet.list_objects_v2(Bucket=bucket)["Contents"])
    listed = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="fixture/small/")["Contents"])
    s3.copy_object(Bucket=bucket, Key="fixture/copy.txt", CopySource={"Bucket": bucket, "Key": "fixture/lone.txt"})
    copied = s3.get_object(Bucket=bucket, Key="fixture/copy.txt")["Body"].read().decode()
    print("RESULT " + json.dumps({"held_at_start": held_at_start, "size": len(body), "held_after_read": held_after_read,
                                  "listed": listed, "copied": copied}))
    """
)


def test_s3_deletes_leave_no_file_or_empty_folder_on_disk(local_session):
    """A deleted object goes from the disk mirror, and so does a folder its prefix left empty (S3 has none
    to keep; notebook 05 deletes its checkpoints so): a prefix with objects left keeps its folder."""
    import local_mode

    s3 = local_session.boto_session.client("s3")
    bucket = local_session.default_bucket()
    keys = ["fixture/ckpt/step_1/model.pt", "fixture/ckpt/step_1/optimizer.pt", "fixture/ckpt/step_2/model.pt"]
    for key in keys + ["fixture/kept.txt"]:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    mirror = local_mode.active_root() / "s3" / bucket / "fixture"
    s3.delete_object(Bucket=bucket, Key=keys[2])
    assert not (mirror / "ckpt" / "step_2").exists() and (mirror / "ckpt" / "step_1" / "model.pt").is_file()
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[:2]], "Quiet": True})
    assert not (mirror / "ckpt").exists()
    assert (mirror / "kept.txt").read_bytes() == b"x"
    assert s3.list_objects_v2(Bucket=bucket, Prefix="fixture/ckpt/").get("KeyCount") == 0


def test_a_later_kernel_loads_each_s3_object_when_it_is_read(local_session, tmp_path):
    """A kernel starts without loading S3 from disk (a run of the real model leaves GBs of models there,
    which each kernel copied before): each object loads at its first read, a listing loads its prefix."""
    s3 = local_session.boto_session.client("s3")
    bucket = local_session.default_bucket()
    big = os.urandom(6 * 1024 * 1024)  # above moto's in-memory buffer: it spools to a file
    s3.put_object(Bucket=bucket, Key="fixture/big/weights.bin", Body=big)
    for name in ("a", "b"):
        s3.put_object(Bucket=bucket, Key=f"fixture/small/{name}.txt", Body=name.encode())
    s3.put_object(Bucket=bucket, Key="fixture/lone.txt", Body=b"copied from disk")

    script = tmp_path / "lazy_kernel.py"
    script.write_text(LAZY_KERNEL)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    completed = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "4 S3 object(s) load when read" in completed.stdout
    seen = json.loads(next(x for x in completed.stdout.splitlines() if x.startswith("RESULT "))[len("RESULT ") :])
    assert seen["held_at_start"] == 0
    assert seen["size"] == len(big)
    assert seen["held_after_read"] == ["fixture/big/weights.bin"]
    assert seen["listed"] == ["fixture/small/a.txt", "fixture/small/b.txt"]
    assert seen["copied"] == "copied from disk"
    import local_mode

    assert (local_mode.active_root() / "s3" / bucket / "fixture" / "copy.txt").read_bytes() == b"copied from disk"
