"""What a job leaves in S3: ``<S3OutputPath>/<job>/output/{model,output}.tar.gz`` from algo-1's tree."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from local_mode.storage import split_s3


def upload_results(aws, status, leader, outcome) -> None:
    """The leader's ``/opt/ml/output/data`` always; its ``/opt/ml/model`` unless the job failed."""
    job = status.job
    if outcome.kind in ("Completed", "Stopped", "MaxRuntimeExceeded", "MaxWaitTimeExceeded"):
        status.secondary("Uploading", "Uploading generated training model")
    bucket, prefix = split_s3(job["OutputDataConfig"]["S3OutputPath"])
    base = "/".join(p for p in (prefix.rstrip("/"), job["TrainingJobName"], "output") if p)
    output = tar_gz(leader.tree / "output" / "data")
    aws.s3.put_object(Bucket=bucket, Key=f"{base}/output.tar.gz", Body=output)
    if outcome.kind != "Failed":
        model = tar_gz(leader.tree / "model")
        aws.s3.put_object(Bucket=bucket, Key=f"{base}/model.tar.gz", Body=model)
        job["ModelArtifacts"] = {"S3ModelArtifacts": f"s3://{bucket}/{base}/model.tar.gz"}
        status.say(f"model uploaded to s3://{bucket}/{base}/model.tar.gz ({len(model)} bytes)")


def tar_gz(folder: Path) -> bytes:
    """The folder's contents at the archive's top level, as SageMaker packs them."""
    buffer = io.BytesIO()
    # Level 1: model weights barely compress at any level, and level 9 (tarfile's default) took
    # minutes on 2 loaded cores for a 540 MB model; the archive is read the same either way.
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        if folder.exists():
            for path in sorted(folder.iterdir()):
                tar.add(path, arcname=path.name)
    return buffer.getvalue()
