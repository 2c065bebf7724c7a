"""What local mode keeps on disk, so that a later notebook kernel sees earlier jobs and S3 objects.

Layout under ``$SAGEMAKER_LOCAL_ROOT`` (default ``~/.sagemaker-local``)::

    s3/<bucket>/<key>                 every S3 object, mirrored on each write
    jobs/<job>.json                   DescribeTrainingJob response (times as epoch seconds)
    logs/<job>/<stream>.jsonl         CloudWatch log events, one {"t": ms, "m": text} per line
    metrics/<job>.jsonl               CloudWatch metric points, one {"name","value","t"} per line
    runs/<job>/                       the /opt/ml tree of every host, kept for inspection less what
                                      the instances lose at the end (model, checkpoints, channels)

Disk is the source of truth for jobs; moto holds S3, Logs and CloudWatch for the SDK inside one
process: a new process loads logs and metrics from disk when local mode starts, and each S3 object
when it is first read.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from pathlib import Path

DEFAULT_ROOT = "~/.sagemaker-local"
_TIME_KEYS = ("Time", "Timestamp")


def local_root() -> Path:
    return Path(os.environ.get("SAGEMAKER_LOCAL_ROOT") or DEFAULT_ROOT).expanduser()


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def to_wire(value):
    """Stored job description -> response shape: epoch floats under *Time keys become datetimes."""
    if isinstance(value, dict):
        return {
            k: (
                dt.datetime.fromtimestamp(v, tz=dt.UTC)
                if k.endswith(_TIME_KEYS) and isinstance(v, (int, float)) and not k.endswith("InSeconds")
                else to_wire(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [to_wire(v) for v in value]
    return value


class Storage:
    def __init__(self, root: Path):
        self.root = Path(root)
        for sub in ("s3", "jobs", "logs", "metrics", "runs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    # ---- jobs -------------------------------------------------------------------------------
    def job_path(self, name: str) -> Path:
        return self.root / "jobs" / f"{name}.json"

    def save_job(self, job: dict) -> None:
        with self._lock:
            _atomic_write(self.job_path(job["TrainingJobName"]), json.dumps(job, indent=1).encode())

    def load_job(self, name: str) -> dict | None:
        path = self.job_path(name)
        if not path.exists():
            return None
        return json.loads(path.read_text())

    def job_names(self) -> list[str]:
        return [p.stem for p in (self.root / "jobs").glob("*.json")]

    def run_dir(self, name: str) -> Path:
        return self.root / "runs" / name

    def stop_request_path(self, name: str) -> Path:
        """A StopTrainingJob sent from another process is left here for the process running the job."""
        return self.root / "jobs" / f"{name}.stop"

    # ---- S3 mirror ----------------------------------------------------------------------------
    def s3_path(self, bucket: str, key: str) -> Path:
        path = (self.root / "s3" / bucket / key).resolve()
        if not str(path).startswith(str((self.root / "s3").resolve()) + os.sep):
            raise ValueError(f"S3 key {key!r} cannot be mirrored to disk")
        return path

    def mirror_put(self, bucket: str, key: str, body: bytes) -> None:
        if key.endswith("/"):
            return  # a folder marker: the folder itself is enough on disk
        _atomic_write(self.s3_path(bucket, key), body)

    def mirror_put_from(self, bucket: str, key: str, write) -> int:
        """An object written by ``write(file)`` straight to disk (atomically, as ``mirror_put``); its size."""
        path = self.s3_path(bucket, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(tmp, "wb") as file:
                write(file)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path.stat().st_size

    def mirror_delete(self, bucket: str, key: str) -> None:
        path = self.s3_path(bucket, key)
        if path.is_file():
            path.unlink()
        # S3 has no folders: a prefix whose last object went is gone from listings, so its folder goes too
        bucket_dir = self.root / "s3" / bucket
        for parent in path.parents:
            if parent == bucket_dir or bucket_dir not in parent.parents:
                break
            try:
                parent.rmdir()  # only while empty: another object under the prefix keeps it
            except OSError:
                break

    def mirror_bucket(self, bucket: str) -> None:
        (self.root / "s3" / bucket).mkdir(parents=True, exist_ok=True)

    def s3_keys(self, bucket: str, prefix: str) -> list[str]:
        """The mirrored keys of ``bucket`` that start with ``prefix``."""
        base = self.root / "s3" / bucket
        folder = base / prefix if prefix.endswith("/") or not prefix else (base / prefix).parent
        if not folder.resolve().is_relative_to((self.root / "s3").resolve()) or not folder.is_dir():
            return []
        keys = (p.relative_to(base).as_posix() for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
        return sorted(k for k in keys if k.startswith(prefix))

    def s3_objects(self):
        """(bucket, key, path) for every mirrored object."""
        base = self.root / "s3"
        for bucket_dir in sorted(p for p in base.iterdir() if p.is_dir()):
            yield bucket_dir.name, None, bucket_dir
            for path in sorted(bucket_dir.rglob("*")):
                if path.is_file() and not path.name.startswith("."):
                    yield bucket_dir.name, path.relative_to(bucket_dir).as_posix(), path

    # ---- logs and metrics ---------------------------------------------------------------------
    def append_log(self, job: str, stream: str, events: list[tuple[int, str]]) -> None:
        path = self.root / "logs" / job / (stream.split("/", 1)[1] + ".jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, path.open("a") as f:
            for t, m in events:
                f.write(json.dumps({"t": t, "m": m}) + "\n")

    def log_streams(self):
        """(job, stream name, [(ms, message)]) for every stored stream."""
        for job_dir in sorted(p for p in (self.root / "logs").iterdir() if p.is_dir()):
            for path in sorted(job_dir.glob("*.jsonl")):
                events = [tuple(json.loads(line).values()) for line in path.read_text().splitlines() if line]
                yield job_dir.name, f"{job_dir.name}/{path.stem}", events

    def append_metric(self, job: str, name: str, value: float, t: float) -> None:
        with self._lock, (self.root / "metrics" / f"{job}.jsonl").open("a") as f:
            f.write(json.dumps({"name": name, "value": value, "t": t}) + "\n")

    def metric_points(self):
        """(job, [{"name","value","t"}]) for every job that reported metrics."""
        for path in sorted((self.root / "metrics").glob("*.jsonl")):
            yield path.stem, [json.loads(line) for line in path.read_text().splitlines() if line]


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` as (bucket, key)."""
    if not uri.startswith("s3://"):
        raise ValueError(f"Not an S3 URI: {uri!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key
