"""A finished job's artifacts in S3: list them, download them, load the model.

A training job leaves ``<output_path>/<job>/output/model.tar.gz`` (``SM_MODEL_DIR``) and
``output.tar.gz`` (``SM_OUTPUT_DATA_DIR``: here ``metrics.jsonl``). The next job can take
``model.tar.gz`` as its ``model`` channel as it is (the scripts unpack it).
"""

from __future__ import annotations

import tarfile
from pathlib import Path


def split_s3(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"Not an S3 URI: {uri!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
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


def remove_downloads(folder: str | Path) -> int:
    """Delete a folder of artifacts downloaded from S3, whose originals S3 keeps; says and returns the
    bytes it held (a model of 135 M parameters is 540 MB a copy)."""
    import shutil

    folder = Path(folder)
    if not folder.is_dir():
        print(f"nothing to remove: {folder} is not a folder")
        return 0
    held = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    shutil.rmtree(folder)
    print(f"removed {folder} ({held / 1e9:.2f} GB); the artifacts stay in S3")
    return held


def load_model(path: str | Path):
    """Load a downloaded model folder with transformers (a check that the artifact is usable)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(str(path)), AutoTokenizer.from_pretrained(str(path))
