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
    from helpers.session import make_session

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

    local_session.upload_string_as_file_body(
        "kept across kernels", local_session.default_bucket(), "fixture/notes.txt"
    )
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
