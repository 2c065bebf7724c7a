"""A finished job's artifacts in S3: list them, download them, turn the model into a channel.

A training job leaves ``<output_path>/<job>/output/model.tar.gz`` (``SM_MODEL_DIR``) and
``output.tar.gz`` (``SM_OUTPUT_DATA_DIR``: here ``metrics.jsonl``). A ``model`` channel
must be a folder with ``config.json`` (what ``save_pretrained`` writes), so passing a
trained model to the next job (evaluation, the next stage) means unpacking
``model.tar.gz`` once and uploading the folder.
"""

from __future__ import annotations

import tarfile
from pathlib import Path


def split_s3(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"Not an S3 URI: {uri!r}")
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key


def list_job_outputs(session, job_name: str) -> list[str]:
    """Every S3 object under the job's output folder, as URIs."""
    description = session.sagemaker_client.describe_training_job(TrainingJobName=job_name)
    bucket, prefix = split_s3(description["OutputDataConfig"]["S3OutputPath"].rstrip("/") + f"/{job_name}/")
    return [f"s3://{bucket}/{key}" for key in session.list_s3_files(bucket, prefix)]


def download_and_extract(session, tar_uri: str, dest: str | Path) -> Path:
    """Download a ``.tar.gz`` from S3 with ``Session.download_data`` and unpack it into ``dest``."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    bucket, key = split_s3(tar_uri)
    session.download_data(str(dest), bucket, key_prefix=key)
    archive = dest / Path(key).name
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()
    return dest


def model_as_channel(session, model_data: str, dest_uri: str, workdir: str | Path) -> str:
    """Unpack a job's ``model.tar.gz`` and upload the folder to ``dest_uri`` (a ``model`` channel)."""
    folder = download_and_extract(session, model_data, Path(workdir))
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{model_data} holds no config.json: the job did not save_pretrained into SM_MODEL_DIR.")
    bucket, key = split_s3(dest_uri)
    return session.upload_data(str(folder), bucket=bucket, key_prefix=key.rstrip("/"))


def load_model(path: str | Path):
    """Load a downloaded model folder with transformers (a check that the artifact is usable)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(str(path)), AutoTokenizer.from_pretrained(str(path))
