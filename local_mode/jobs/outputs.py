"""What a job leaves in S3: ``<S3OutputPath>/<job>/output/{model,output}.tar.gz`` from algo-1's tree."""

from __future__ import annotations

import tarfile
from pathlib import Path

from local_mode.storage import split_s3


def upload_results(aws, status, leader, outcome) -> None:
    """The leader's ``/opt/ml/output/data`` always; its ``/opt/ml/model`` unless the job failed. Each archive
    is written straight to local S3's copy on disk, which moto loads when it is first read: a model's
    archive never passes through memory (a put held three copies of it: 1.5 GB for SmolLM2-135M)."""
    job = status.job
    if outcome.kind in ("Completed", "Stopped", "MaxRuntimeExceeded", "MaxWaitTimeExceeded"):
        status.secondary("Uploading", "Uploading generated training model")
    bucket, prefix = split_s3(job["OutputDataConfig"]["S3OutputPath"])
    base = "/".join(p for p in (prefix.rstrip("/"), job["TrainingJobName"], "output") if p)
    aws.put_file(bucket, f"{base}/output.tar.gz", lambda file: tar_gz(leader.tree / "output" / "data", file))
    if outcome.kind != "Failed":
        size = aws.put_file(bucket, f"{base}/model.tar.gz", lambda file: tar_gz(leader.tree / "model", file))
        job["ModelArtifacts"] = {"S3ModelArtifacts": f"s3://{bucket}/{base}/model.tar.gz"}
        status.say(f"model uploaded to s3://{bucket}/{base}/model.tar.gz ({size} bytes)")


def tar_gz(folder: Path, file) -> None:
    """The folder's contents at the archive's top level, as SageMaker packs them, written to ``file``."""
    # Level 0: gzip's stored blocks, read as any .tar.gz. Trained weights barely compress: a model of
    # 538 MB took 23.5 s on 2 loaded cores to become 501 MB at level 1, and 1.3 s to become 541 MB here.
    with tarfile.open(fileobj=file, mode="w:gz", compresslevel=0) as tar:
        if folder.exists():
            for path in sorted(folder.iterdir()):
                tar.add(path, arcname=path.name)
