"""``CheckpointConfig``: S3 into every host's checkpoint folder at the start, and back while it trains.

SageMaker restores ``CheckpointConfig.S3Uri`` into ``LocalPath`` on each host before training and
uploads what appears there during training and at the end; local mode does the same, every few
seconds, uploading a file only when its size or modification time changed.
"""

from __future__ import annotations

import os
from pathlib import Path

from local_mode.storage import split_s3


def checkpoint_prefix(job: dict) -> tuple[str, str] | None:
    """(bucket, key prefix ending in "/") of ``CheckpointConfig.S3Uri``, or None without one."""
    uri = job.get("CheckpointConfig", {}).get("S3Uri")
    if not uri:
        return None
    bucket, prefix = split_s3(uri)
    return bucket, prefix.rstrip("/") + "/" if prefix else ""


def restore(aws, job: dict, hosts, say) -> None:
    target = checkpoint_prefix(job)
    if target is None:
        return
    bucket, prefix = target
    keys = aws.list_keys(bucket, prefix)
    for host in hosts:
        for key in keys:
            path = host.checkpoints / key[len(prefix) :]
            if aws.link_object(bucket, key, path, read_only=False):
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        host.synced = {p: _signature(p) for p in files_under(host.checkpoints)}
    if keys:
        say(f"restored {len(keys)} checkpoint file(s) from s3://{bucket}/{prefix}")


def sync(aws, job: dict, hosts) -> None:
    """Upload every checkpoint file that is new or changed since the last sync."""
    target = checkpoint_prefix(job)
    if target is None:
        return
    bucket, prefix = target
    for host in hosts:
        synced = host.synced
        for path in files_under(host.checkpoints):
            # The script rotates checkpoints while we look: a file listed here may be gone
            # by the time it is read, and is then simply not uploaded.
            try:
                signature = _signature(path)
                if synced.get(path) == signature:
                    continue
                body = path.read_bytes()
            except FileNotFoundError:
                continue
            key = prefix + path.relative_to(host.checkpoints).as_posix()
            aws.s3.put_object(Bucket=bucket, Key=key, Body=body)
            synced[path] = signature
        host.synced = synced


def files_under(folder: Path) -> list[Path]:
    """Files below ``folder``, sorted; folders removed during the walk are skipped."""
    files = []
    for root, _dirs, names in os.walk(folder):
        files.extend(Path(root) / name for name in names)
    return sorted(files)


def _signature(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns
