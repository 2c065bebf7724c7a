"""S3 to disk before training: the source directory and the input channels, downloaded once per job.

What SageMaker would refuse to start (no objects under a channel, a source directory that cannot be
read, requirements this environment lacks) raises ``JobEnded("Failed", ...)`` with its reason.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

from local_mode.storage import split_s3

from .job_status import JobEnded
from .requirements_check import missing_requirements


@dataclass
class Channel:
    """A channel downloaded once; the hosts that receive it link or copy from ``folder``."""

    name: str
    request: dict  # the channel in InputDataConfig
    folder: Path
    files: list[Path]
    sharded: bool  # S3DataDistributionType ShardedByS3Key: each receiving host gets every n-th file


def get_object(aws, bucket: str, key: str, what: str) -> bytes:
    try:
        return aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except aws.s3.exceptions.ClientError as error:
        raise JobEnded(
            "Failed", f"ClientError: Data download failed for {what}: s3://{bucket}/{key}: {error}"
        ) from None


def download_code(aws, job: dict, hyperparameters: dict, target: Path, say) -> Path | None:
    """The source directory (``sagemaker_submit_directory``) unpacked into ``target``, or None."""
    uri = hyperparameters.get("sagemaker_submit_directory")
    if not uri:
        return None
    uri = _code_channel_uri(job, str(uri))
    if not uri.startswith("s3://"):
        raise JobEnded(
            "Failed",
            "ClientError: sagemaker_submit_directory must be an s3:// URI or a file in an input channel "
            f"(/opt/ml/input/data/<channel>/...), got {uri!r}.",
        )
    bucket, key = split_s3(uri)
    body = get_object(aws, bucket, key, what="source code (sagemaker_submit_directory)")
    target.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        tar.extractall(target, filter="data")
    requirements = target / "requirements.txt"
    if requirements.exists():
        missing = missing_requirements(requirements.read_text())
        if missing:
            raise JobEnded(
                "Failed",
                "ClientError: local mode never installs packages, and requirements.txt in the source "
                f"directory asks for what this environment lacks: {', '.join(missing)}. Install them "
                f"into this Python environment (pip install {' '.join(repr(m) for m in missing)}) "
                "and run the job again.",
            )
        # Satisfied already; the toolkit would run `pip install -r requirements.txt` otherwise.
        requirements.unlink()
        say("requirements.txt satisfied by this environment (not installed again)")
    return target


def _code_channel_uri(job: dict, uri: str) -> str:
    """With network isolation the SDK ships the code as channel ``code`` and points
    ``sagemaker_submit_directory`` at the file inside the container
    (``/opt/ml/input/data/code/sourcedir.tar.gz``): read it from that channel's S3 source."""
    prefix = "/opt/ml/input/data/"
    if not uri.startswith(prefix):
        return uri
    name, _, relative = uri[len(prefix) :].partition("/")
    for channel in job.get("InputDataConfig", []):
        if channel["ChannelName"] == name:
            source = channel["DataSource"]["S3DataSource"]["S3Uri"]
            if source.rstrip("/").endswith("/" + relative):  # the channel is the file itself
                return source
            return f"{source.rstrip('/')}/{relative}"
    raise JobEnded(
        "Failed",
        f"ClientError: sagemaker_submit_directory is {uri!r}, but the job has no input channel {name!r}.",
    )


def download_channels(aws, job: dict, target: Path, say) -> list[Channel]:
    """Every channel of the job downloaded once under ``target``."""
    config = job.get("InputDataConfig", [])
    if config:
        say(f"downloading {len(config)} channel(s): {', '.join(c['ChannelName'] for c in config)}")
    channels = []
    for channel in config:
        source = channel["DataSource"]["S3DataSource"]
        bucket, prefix = split_s3(source["S3Uri"])
        keys = aws.list_keys(bucket, prefix)
        if not keys:
            raise JobEnded(
                "Failed",
                f"ClientError: Data download failed: no objects under {source['S3Uri']} for channel "
                f"'{channel['ChannelName']}'. Upload the data first (sagemaker_session.upload_data).",
            )
        folder = target / channel["ChannelName"]
        for key in keys:
            relative = key[len(prefix) :].lstrip("/") or key.rsplit("/", 1)[-1]
            path = folder / relative
            if aws.link_object(bucket, key, path, read_only=True):
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(get_object(aws, bucket, key, what=f"channel '{channel['ChannelName']}'"))
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        sharded = source.get("S3DataDistributionType") == "ShardedByS3Key"
        channels.append(Channel(channel["ChannelName"], channel, folder, files, sharded))
    return channels
