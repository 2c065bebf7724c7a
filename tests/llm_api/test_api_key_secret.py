"""The API key never leaks: a training job reads it from Secrets Manager by name (moto in local mode), a
session-side judge reads it from OPENAI_API_KEY; the key reaches the endpoint, and no request SageMaker
shows back, log, metric, checkpoint, artifact or output holds it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
from fault_proxy import FaultProxy

pytestmark = pytest.mark.timeout(420)

REPO = Path(__file__).resolve().parents[2]
SECRET_NAME = "workshop/llm-api-key"


def places_holding(root: Path, marker: str) -> list[str]:
    """Every file under ``root`` whose bytes hold ``marker``, looking inside tar archives too."""
    found, needle = [], marker.encode()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if needle in data:
            found.append(str(path))
        if path.name.endswith((".tar.gz", ".tar")):
            with tarfile.open(fileobj=io.BytesIO(data)) as archive:
                for member in archive.getmembers():
                    if member.isfile() and needle in archive.extractfile(member).read():
                        found.append(f"{path}!{member.name}")
    return found


@pytest.fixture
def local_session(tmp_path, monkeypatch):
    monkeypatch.setenv("SAGEMAKER_LOCAL_ROOT", str(tmp_path / "sagemaker-local"))
    import local_mode
    from helpers.sagemaker_session import make_session

    session = make_session(run_mode="local")
    yield session
    local_mode.deactivate()


def test_a_job_reads_the_key_from_secrets_manager_and_leaks_it_nowhere(
    llm_server, local_session, offline_data, tmp_path, capsys
):
    from sagemaker.inputs import TrainingInput
    from sagemaker.pytorch import PyTorch

    from helpers.sagemaker_session import execution_role

    marker = f"marker-key-{uuid.uuid4().hex}"
    local_session.boto_session.client("secretsmanager").create_secret(Name=SECRET_NAME, SecretString=marker)
    train = local_session.upload_data(str(offline_data["gsm8k"]), key_prefix="llm/gsm8k")
    bucket = local_session.default_bucket()
    with FaultProxy(llm_server.base_url.removesuffix("/v1"), ["429"], retry_after=0.2) as proxy:
        estimator = PyTorch(
            entry_point="teacher_data.py",
            source_dir=str(REPO / "scripts"),
            role=execution_role(local_session),
            instance_type="ml.c5.xlarge",
            instance_count=1,
            framework_version="2.8.0",
            py_version="py312",
            sagemaker_session=local_session,
            checkpoint_s3_uri=f"s3://{bucket}/llm/checkpoints",
            hyperparameters={
                "teacher_model": llm_server.model,
                "llm_base_url": proxy.base_url,
                "llm_api_key_secret": SECRET_NAME,
                "max_problems": 3,
                "samples_per_problem": 2,
                "max_tokens": 8,
            },
        )
        estimator.fit({"train": TrainingInput(train)}, logs=True)
        first_job = estimator.latest_training_job.name
        local_session.wait_for_job(first_job)  # finished, also when it had to wait for another local job
        job_log = capsys.readouterr().out
        asked = len(proxy.headers)
        # The same job again, on the same checkpoint folder: every answer comes from the synced cache.
        estimator.fit({"train": TrainingInput(train)}, logs=True)
        local_session.wait_for_job(estimator.latest_training_job.name)
        again_log = capsys.readouterr().out
    assert "requests=6 cached_hits=6 retries=0 tokens=0" in again_log and len(proxy.headers) == asked
    description = estimator.latest_training_job.describe()

    assert description["TrainingJobStatus"] == "Completed"
    assert "requests=6 cached_hits=0 retries=1" in job_log  # the teacher was asked, one 429 retried
    # The key did its work: every request the endpoint received carried it...
    assert len(proxy.headers) == 7
    assert all(h["authorization"] == f"Bearer {marker}" for h in proxy.headers)
    # ...and only the secret's name travelled with the job.
    assert description["HyperParameters"]["llm_api_key_secret"] == json.dumps(SECRET_NAME)
    assert marker not in json.dumps(description, default=str)
    assert marker not in job_log + again_log
    root = Path(os.environ["SAGEMAKER_LOCAL_ROOT"])
    assert any(root.rglob("teacher_usage.json")) or any(root.rglob("output.tar.gz"))  # the search saw the outputs
    assert places_holding(root, marker) == []  # S3 (model, output, checkpoints with the cache), logs, job records


def test_a_session_side_judge_leaks_the_key_nowhere(llm_server, tmp_path):
    """The judge as a session loop runs it: in the SDK v3 environment, key from OPENAI_API_KEY."""
    marker = f"marker-key-{uuid.uuid4().hex}"
    out = tmp_path / "session"
    program = f"""
import json, sys
from common.llm_client import LLMClient
from environments.llm_judge import LLMJudgeEnvironment
from common.advantages import group_advantages_excluding
client = LLMClient({llm_server.model!r}, cache_dir={str(out / "cache")!r}, timeout_s=30)
env = LLMJudgeEnvironment(client)
problem = {{"question": "What is 2 + 2?"}}
scores = env.score([problem] * 2, ["#### 4", "#### 5"])
metrics = env.step_metrics()
advantages, excluded = group_advantages_excluding([s["reward"] for s in scores], 2)
record = {{"scores": scores, "metrics": metrics, "excluded": excluded, "usage": client.usage.as_dict(),
          "client": repr(client)}}
(__import__("pathlib").Path({str(out)!r}) / "step.json").write_text(json.dumps(record, default=str))
client.write_usage({str(out / "usage.json")!r})
print(json.dumps(record, default=str))
print(client.usage.report())
"""
    with FaultProxy(llm_server.base_url.removesuffix("/v1"), ["500"]) as proxy:
        environment = {**os.environ, "OPENAI_BASE_URL": proxy.base_url, "OPENAI_API_KEY": marker}
        python = str(REPO / ".venv-sessions" / "bin" / "python")
        run = subprocess.run([python, "-c", program], env=environment, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout.splitlines()[0])
    assert record["usage"]["requests"] == 2 and record["usage"]["retries"] == 1
    assert record["metrics"]["judge_failed"] + (2 - record["excluded"]) >= 2  # every verdict accounted for
    assert all(h["authorization"] == f"Bearer {marker}" for h in proxy.headers) and len(proxy.headers) == 3
    assert marker not in run.stdout + run.stderr
    assert places_holding(out, marker) == [] and (out / "usage.json").is_file() and any((out / "cache").rglob("*.json"))


def test_the_search_finds_a_key_in_a_file_and_inside_an_archive(tmp_path):
    """The leak search can fail: a key in a plain file or in a member of a model.tar.gz is found."""
    marker = f"marker-key-{uuid.uuid4().hex}"
    (tmp_path / "log.txt").write_text(f"Authorization: Bearer {marker}\n")
    inner = tmp_path / "config.json"
    inner.write_text(json.dumps({"api_key": marker}))
    with tarfile.open(tmp_path / "model.tar.gz", "w:gz") as archive:
        archive.add(inner, arcname="config.json")
    inner.unlink()
    assert places_holding(tmp_path, marker) == [str(tmp_path / "log.txt"), f"{tmp_path / 'model.tar.gz'}!config.json"]
