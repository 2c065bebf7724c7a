"""code_rl.py on a heterogeneous cluster in local mode: 1 learner host and 2 CPU judge hosts.

The learner generates, sends the programs to the judge hosts' services over TCP and trains on their
verdicts; each judge host runs the sandbox self-test and then its supervised judge service. One
job shows both the cluster and its recovery (a job costs ~50 s here): the test SIGKILLs a judge
service while it judges; its programs are resent to the other judge, the supervisor restarts the
service, the learner takes it back, and the job completes with every step's verdicts.

The tiny model is first taught one answer, ``while 1:0`` in a fenced block, on the one problem of the
data set: every completion is then a program that runs until its time limit, so the judges have
work in every step and a request is in flight long enough to be interrupted.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import tarfile
import time
from pathlib import Path

import psutil
import pytest
from sagemaker.inputs import TrainingInput
from sagemaker.instance_group import InstanceGroup
from sagemaker.pytorch import PyTorch

from helpers.live import LogReader
from local_mode import offline_data

pytestmark = pytest.mark.timeout(300)
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
PROGRAM = "```python\nwhile 1:0\n```"
HYPERPARAMETERS = {
    "max_steps": 3,
    "prompts_per_step": 2,
    "group_size": 2,
    "micro_batch_size": 2,
    "max_new_tokens": 16,
    "temperature": 0.1,
    "judge_workers": 1,
    "judge_timeout": 120,
    "max_tests": 2,
    "time_limit": 0.3,
    "checkpoint_every": 0,
    "self_test": True,
    "judge_group": "judge",
    "verdict_timeout": 60,
    # torchrun spans the learners only (the PyTorch estimator does not send it itself)
    "sagemaker_distribution_instance_groups": ["learner"],
}


@pytest.fixture(scope="module")
def code_rl_inputs(tiny_model_path, tmp_path_factory) -> dict[str, Path]:
    """{"train": one reverse problem, "model": the tiny model after 40 SFT steps on ``PROGRAM``}."""
    import random

    import torch
    from environments.code import CodeEnvironment  # scripts/ is on the path once offline_data is imported
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("code_rl_groups")
    problem = next(p for p in offline_data.code_problem_records(5) if p["id"].startswith("reverse"))
    offline_data.write_jsonl(root / "train" / "train.jsonl", [problem, {**problem, "id": "reverse-copy"}])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    messages = CodeEnvironment().prompt_messages(problem)  # as the job's environment asks
    prompt = tokenizer(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )["input_ids"]
    answer = tokenizer(PROGRAM, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    input_ids = torch.tensor([prompt + answer] * 2)
    labels = torch.tensor([[-100] * len(prompt) + answer] * 2)
    for _ in range(40):
        model(input_ids=input_ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.set_num_threads(threads)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return {"train": root / "train", "model": root / "model"}


def start_job(session, role, inputs, job_name):
    learner = InstanceGroup("learner", "ml.p5.48xlarge", 1)
    estimator = PyTorch(
        entry_point="code_rl.py", source_dir=str(SCRIPTS), role=role, sagemaker_session=session,
        instance_groups=[learner, InstanceGroup("judge", "ml.c7i.16xlarge", 2)],
        distribution={"torch_distributed": {"enabled": True}, "instance_groups": [learner]},
        framework_version="2.8.0", py_version="py312", enable_network_isolation=True,
        hyperparameters=HYPERPARAMETERS, environment={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    # The data and the model go to the learners only: a judge gets programs and tests from them.
    channels = {
        name: TrainingInput(
            session.upload_data(str(folder), key_prefix=f"{job_name}/{name}"), instance_groups=["learner"]
        )
        for name, folder in inputs.items()
    }
    estimator.fit(channels, job_name=job_name, wait=False)
    return estimator


def by_host(lines: list[tuple[str, str]]) -> dict[str, list[str]]:
    """{"algo-1": [...], ...}: each host's lines (log streams are <job>/<host>-<epoch>)."""
    hosts: dict[str, list[str]] = {}
    for stream, message in lines:
        hosts.setdefault(stream.split("/", 1)[1].rsplit("-", 1)[0], []).append(message)
    return hosts


def check_every_step_was_judged(session, estimator, log: list[str]) -> None:
    description = session.wait_for_job(estimator.latest_training_job.name)
    assert description["TrainingJobStatus"] == "Completed", description.get("FailureReason")
    output = estimator.model_data.replace("model.tar.gz", "output.tar.gz")
    bucket, key = output[len("s3://") :].split("/", 1)
    body = session.boto_session.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        records = [json.loads(line) for line in tar.extractfile("metrics.jsonl").read().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:  # four programs a step, each judged: they all ran out of time
        assert record["time_limit_rate"] == 1.0 and record["no_code_rate"] == 0.0, record
        assert record["judge_time"] > 0.3
    assert [int(m) for m in re.findall(r"^step=(\d+) ", "\n".join(log), re.MULTILINE)] == [1, 2, 3]


def test_learner_and_judge_groups_survive_a_judge_killed_mid_step(local_session, role, code_rl_inputs):
    estimator = start_job(local_session, role, code_rl_inputs, "code-rl-groups-kill")
    reader = LogReader(local_session.boto_session.client("logs"), "code-rl-groups-kill")
    job = estimator.latest_training_job
    lines, service = [], None
    while service is None and job.describe()["TrainingJobStatus"] == "InProgress":  # algo-2's service pid
        lines += reader.read()
        found = [re.search(r"judge service pid (\d+)", m) for s, m in lines if "/algo-2-" in s]
        service = next((int(f.group(1)) for f in found if f), None)
        time.sleep(0.2)
    assert service, lines[-20:]
    while job.describe()["TrainingJobStatus"] == "InProgress":  # a program runs under a sandbox worker: kill now
        if any(worker.children() for worker in psutil.Process(service).children()):
            os.kill(service, signal.SIGKILL)
            break
        time.sleep(0.01)
    else:
        pytest.fail("the judge service never ran a program")
    local_session.wait_for_job("code-rl-groups-kill")
    hosts = by_host(lines + reader.read())
    check_every_step_was_judged(local_session, estimator, hosts["algo-1"])
    learner, killed, other = ("\n".join(hosts[h]) for h in ("algo-1", "algo-2", "algo-3"))
    # the cluster: both judge hosts passed the sandbox self-test, started a service and the learner reached it
    assert "judge algo-2:29800 ready" in learner and "judge algo-3:29801 ready" in learner
    for log in (killed, other):
        assert "sandbox self-test passed" in log and "judge service pid" in log
        assert "step=" not in log  # judges judge; only the learner trains and logs steps
    assert re.search(r"judge: [1-9]\d* programs judged, stopping", other), other[-2000:]
    # the kill: algo-2's programs went to algo-3, its supervisor restarted it and the learner took it back
    assert re.search(r"judge algo-2:29800 failed \(.*\): its \d+ programs go to the 1 other judge", learner), learner
    assert f"judge service pid {service} died (killed by signal 9); restarting it (1 of 5)" in killed
    assert len(re.findall(r"judge service pid \d+ on port 29800", killed)) == 2  # the restart
    assert "judge algo-2:29800 is back" in learner
    assert "judge algo-2:29800 stopped after" in learner and "judge algo-3:29801 stopped after" in learner
