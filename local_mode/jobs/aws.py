"""The AWS around a training job, answered inside this process.

moto answers S3, STS, CloudWatch Logs and CloudWatch metrics, so the SDK's own code runs as it
does against AWS: it uploads ``sourcedir.tar.gz`` and data, streams logs, reads ``model_data``.
Secrets Manager is moto too: the notebook stores a secret through this process's session, and a job
that reads it (an API key, by the secret's name) reaches the same moto over loopback, through a moto
server this process starts on first need (``job_environment``). Secrets are kept in memory only.
SageMaker calls never reach moto: the ``before-call.sagemaker`` handler answers every one of them
first (see api.py). S3 writes are mirrored to disk, and a later notebook kernel sees what an earlier
one left from there: logs and metrics loaded when local mode starts, each S3 object when it is first read.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from pathlib import Path

import boto3
import botocore.loaders
import botocore.session
from moto import mock_aws

from local_mode.storage import Storage

FAKE_ACCESS_KEY = "LOCALMODEACCESSKEY"  # never leaves this process: every call is answered in it
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
METRICS_NAMESPACE = "/aws/sagemaker/TrainingJobs"
_S3_WRITES = ("PutObject", "CompleteMultipartUpload", "CopyObject")
# Reads that must see what is on disk: the objects are loaded from there when first read (see _restore).
_S3_READS = (
    "GetObject",
    "HeadObject",
    "GetObjectAttributes",
    "ListObjects",
    "ListObjectsV2",
    "CopyObject",
    "UploadPartCopy",
)


def say(text: str) -> None:
    print(f"[local-mode] {text}", flush=True)


# One loader for every session local mode makes: botocore's service models (SageMaker's is large)
# are then read from disk once per process instead of once per session.
_LOADER = botocore.loaders.create_loader()


def _botocore_session(region: str) -> botocore.session.Session:
    session = botocore.session.Session()
    session.register_component("data_loader", _LOADER)
    session.set_credentials(FAKE_ACCESS_KEY, "local-mode-secret-key")
    session.set_config_variable("region", region)
    # S3 here is moto in this process: no network for a checksum to guard. botocore's default (a CRC
    # sent aws-chunked with every PutObject) made a 540 MB model cost ~25 s per put, and every kernel
    # re-puts what the disk holds at start; 10x less without it (measured on 100 MB: 4.7 s -> 0.5 s).
    session.set_config_variable("request_checksum_calculation", "when_required")
    session.set_config_variable("response_checksum_validation", "when_required")
    return session


class LocalAWS:
    """moto started for this process, plus the boto3 session that local mode hands out."""

    def __init__(self, root, region: str):
        self.storage = Storage(root)
        self.region = region
        self.say = say
        # Credentials stay out of os.environ: the fake ones live in the session objects only.
        self._mock = mock_aws(config={"core": {"mock_credentials": False, "reset_boto3_session": True}})
        self._mock.start()
        self._lock = threading.Lock()
        self._log_groups_made = False
        self._moto_server = None  # Secrets Manager for the jobs' processes, started on first need

        # The session whose S3 writes are mirrored to disk: the SDK's and the runner's.
        self.botocore_session = _botocore_session(region)
        self.botocore_session.register("before-parameter-build.s3", self._remember_s3_target)
        self.botocore_session.register("before-parameter-build.s3", self._load_before_read)
        self.botocore_session.register("after-call.s3", self._mirror_s3_write)
        self.session = boto3.Session(botocore_session=self.botocore_session, region_name=region)
        # A session without the mirror: restoring from disk must not write to disk again.
        self._quiet = boto3.Session(botocore_session=_botocore_session(region), region_name=region)
        self._quiet_s3 = self._quiet.client("s3")
        self.s3 = self.session.client("s3")
        self.logs = self._quiet.client("logs")
        self.cloudwatch = self._quiet.client("cloudwatch")
        self._restore()

    def stop(self) -> None:
        if self._moto_server is not None:
            self._moto_server.stop()
            self._moto_server = None
        self._mock.stop()

    def job_environment(self) -> dict[str, str]:
        """Variables that point a job's AWS SDK at this process's moto for Secrets Manager, with
        credentials good only here. Set on the job's processes, never in the job's request."""
        with self._lock:
            if self._moto_server is None:
                import logging

                from moto.server import ThreadedMotoServer

                logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
                self._moto_server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
                self._moto_server.start()
            host, port = self._moto_server.get_host_and_port()
        return {
            "AWS_ENDPOINT_URL_SECRETS_MANAGER": f"http://{host}:{port}",
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": "local-mode-secret-key",
        }

    # ---- S3 --------------------------------------------------------------------------------------
    @staticmethod
    def _remember_s3_target(params, context, **kwargs):
        context["local_mode_s3"] = {k: params.get(k) for k in ("Bucket", "Key", "Delete")}

    def _load_before_read(self, params, model, **kwargs):
        """Before a read, the objects on disk that it may see and that moto lacks (or holds older)."""
        if model.name not in _S3_READS:
            return
        if model.name in ("CopyObject", "UploadPartCopy"):
            source = params.get("CopySource")
            if isinstance(source, str):
                bucket, _, key = source.lstrip("/").partition("/")
                source = {"Bucket": bucket, "Key": key.split("?versionId=")[0]}
            if isinstance(source, dict) and source.get("Bucket") and source.get("Key"):
                self.catch_up(source["Bucket"], source["Key"], exact=True)
            return
        if params.get("Key") and params.get("Bucket"):
            self.catch_up(params["Bucket"], params["Key"], exact=True)
        elif params.get("Bucket"):
            self.catch_up(params["Bucket"], params.get("Prefix") or "")

    def _mirror_s3_write(self, http_response, model, context, **kwargs):
        target = context.get("local_mode_s3")
        if target is None or http_response.status_code >= 300:
            return
        bucket, key = target["Bucket"], target["Key"]
        if model.name in _S3_WRITES:
            body = self._quiet_s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            self.storage.mirror_put(bucket, key, body)
        elif model.name == "DeleteObject":
            self.storage.mirror_delete(bucket, key)
        elif model.name == "DeleteObjects":
            for item in (target["Delete"] or {}).get("Objects", []):
                self.storage.mirror_delete(bucket, item["Key"])
        elif model.name == "CreateBucket":
            self.storage.mirror_bucket(bucket)

    def create_bucket(self, bucket: str, client=None) -> None:
        client = client or self.s3
        if self.region == "us-east-1":
            client.create_bucket(Bucket=bucket)
        else:
            client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": self.region})

    def list_keys(self, bucket: str, prefix: str) -> list[str]:
        """The keys under ``prefix``, on disk and in moto, without loading any object (``link_object`` or a
        read then takes each one)."""
        keys = set(self.storage.s3_keys(bucket, prefix))
        try:
            for page in self._quiet_s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                keys.update(item["Key"] for item in page.get("Contents", []))
        except self._quiet_s3.exceptions.NoSuchBucket:  # not loaded yet: the keys on disk are all there is
            pass
        return sorted(keys)

    def put_file(self, bucket: str, key: str, write) -> int:
        """Put an object that ``write(file)`` writes, straight to its copy on disk (a job's archive, which
        would otherwise be held in memory three times); moto loads it when it is first read, and forgets
        any older object under the key now. Returns its size."""
        size = self.storage.mirror_put_from(bucket, key, write)
        try:
            self._quiet_s3.delete_object(Bucket=bucket, Key=key)
        except self._quiet_s3.exceptions.ClientError:  # a bucket moto does not hold yet: nothing to forget
            pass
        return size

    def link_object(self, bucket: str, key: str, target: Path, read_only: bool) -> bool:
        """Lay the object at ``target`` as a hard link to its copy on disk, which is never older than moto's
        (this process mirrors every write as it is made, other processes write there). False where there is
        none (an object only a client without the mirror wrote) or links are not possible: download it then.

        An S3 write replaces the disk copy by a rename, so the link keeps the bytes it was given. A write
        into the file in place would change S3's copy too: ``read_only`` for an input channel, which the
        scripts only read (SageMaker's instance has its own download); a checkpoint stays writable, and
        what a job changes there goes to S3 on the next sync anyway."""
        try:
            copy = self.storage.s3_path(bucket, key)
            if not copy.is_file():
                return False
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(copy, target)
            if read_only:
                os.chmod(target, 0o444)
        except (OSError, ValueError):
            return False
        return True

    def catch_up(self, bucket: str, prefix: str, exact: bool = False) -> int:
        """Load the objects under ``s3://bucket/prefix`` (the one object ``prefix`` names, if ``exact``) that
        are on disk and that moto lacks or holds at another size: what earlier processes left (loaded when
        first read, see ``_restore``), and what another local-mode process wrote since (a notebook kernel's
        training job beside the training-session service): on AWS every client sees one S3. Returns how
        many objects it loaded."""
        if exact:
            try:
                keys = [prefix] if self.storage.s3_path(bucket, prefix).is_file() else []
            except ValueError:
                keys = []
        else:
            keys = self.storage.s3_keys(bucket, prefix)
        if not keys:
            return 0
        here = {}
        try:
            for page in self._quiet_s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                here.update((item["Key"], item["Size"]) for item in page.get("Contents", []))
        except self._quiet_s3.exceptions.NoSuchBucket:
            self.create_bucket(bucket, client=self._quiet_s3)
        loaded = 0
        for key in keys:
            path = self.storage.s3_path(bucket, key)
            try:
                if here.get(key) == path.stat().st_size:
                    continue
                body = path.read_bytes()
            except FileNotFoundError:  # deleted while we looked
                continue
            self._quiet_s3.put_object(Bucket=bucket, Key=key, Body=body)
            loaded += 1
        return loaded

    # ---- logs and metrics ------------------------------------------------------------------------
    def _ensure_log_group(self) -> None:
        if not self._log_groups_made:
            try:
                self.logs.create_log_group(logGroupName=LOG_GROUP)
            except self.logs.exceptions.ResourceAlreadyExistsException:
                pass
            self._log_groups_made = True

    def create_log_stream(self, stream: str) -> None:
        with self._lock:
            self._ensure_log_group()
            try:
                self.logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
            except self.logs.exceptions.ResourceAlreadyExistsException:
                pass  # the same host's stream after a Spot restart

    def put_log_event(self, job: str, stream: str, millis: int, message: str) -> None:
        message = message or " "  # CloudWatch rejects empty events
        with self._lock:
            self.logs.put_log_events(
                logGroupName=LOG_GROUP,
                logStreamName=stream,
                logEvents=[{"timestamp": millis, "message": message}],
            )
        self.storage.append_log(job, stream, [(millis, message)])

    def put_metric(self, job: str, name: str, value: float, when: float, persist: bool = True) -> None:
        with self._lock:
            self.cloudwatch.put_metric_data(
                Namespace=METRICS_NAMESPACE,
                MetricData=[
                    {
                        "MetricName": name,
                        "Dimensions": [{"Name": "TrainingJobName", "Value": job}],
                        "Timestamp": dt.datetime.fromtimestamp(when, tz=dt.UTC),
                        "Value": value,
                    }
                ],
            )
        if persist:
            self.storage.append_metric(job, name, value, when)

    # ---- restore from disk -----------------------------------------------------------------------
    def _restore(self) -> None:
        """What earlier processes left: the buckets, log streams and metrics now; each S3 object when it is
        first read (``_load_before_read``). Loading every object at the start cost every later notebook
        kernel of a SmolLM2 run 74 s, 6.6 GB of memory and 5.4 GB of temporary files (moto spools bodies
        over 5 MB to files) for 5.1 GB in S3; starting now takes 1.4 s."""
        objects = 0
        for bucket, key, _ in self.storage.s3_objects():
            if key is None:
                self.create_bucket(bucket, client=self._quiet_s3)
            else:
                objects += 1
        streams = 0
        for _, stream, events in self.storage.log_streams():
            self.create_log_stream(stream)
            events = sorted(events)
            for start in range(0, len(events), 5000):
                batch = [{"timestamp": t, "message": m} for t, m in events[start : start + 5000]]
                self.logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream, logEvents=batch)
            streams += 1
        for job, points in self.storage.metric_points():
            for point in points:
                self.put_metric(job, point["name"], point["value"], point["t"], persist=False)
        if objects or streams:
            say(f"restored {streams} log stream(s) from {self.storage.root}; its {objects} S3 object(s) load when read")
