"""Checkpoint sync tolerates a script that rotates checkpoints while local mode copies them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from local_mode.jobs import checkpoints


class _RecordingS3:
    def __init__(self):
        self.objects = {}

    def put_object(self, Bucket, Key, Body):  # noqa: N803 (boto3's argument names)
        self.objects[(Bucket, Key)] = Body


def _job_with_checkpoints(tmp_path: Path):
    host = SimpleNamespace(checkpoints=tmp_path / "checkpoints", synced={})
    host.checkpoints.mkdir()
    job = SimpleNamespace(
        job={"CheckpointConfig": {"S3Uri": "s3://bucket/run/checkpoints"}},
        aws=SimpleNamespace(s3=_RecordingS3()),
    )
    return job, host


def test_a_checkpoint_removed_between_listing_and_reading_is_skipped(tmp_path, monkeypatch):
    job, host = _job_with_checkpoints(tmp_path)
    kept = host.checkpoints / "step_00000012" / "model.pt"
    kept.parent.mkdir()
    kept.write_bytes(b"weights")
    rotated = host.checkpoints / "step_00000008" / "model.pt"  # listed, then deleted by the script
    monkeypatch.setattr(checkpoints, "files_under", lambda folder: [rotated, kept])

    checkpoints.sync(job.aws, job.job, [host])

    assert job.aws.s3.objects == {("bucket", "run/checkpoints/step_00000012/model.pt"): b"weights"}
    assert set(host.synced) == {kept}


def test_files_under_lists_nested_files_and_survives_a_missing_folder(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.bin").write_bytes(b"1")
    (tmp_path / "y.json").write_text("{}")

    assert checkpoints.files_under(tmp_path) == [tmp_path / "a" / "b" / "x.bin", tmp_path / "y.json"]
    assert checkpoints.files_under(tmp_path / "gone") == []
