"""Heterogeneous clusters (``ResourceConfig.InstanceGroups``) in local mode, through the SDK v2.

Each host gets its group's environment as SageMaker's toolkit derives it from resourceconfig.json,
and only the channels assigned to its group (``InstanceGroupNames``), sharded over that group's hosts.
"""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from sagemaker.inputs import TrainingInput
from sagemaker.instance_group import InstanceGroup
from sagemaker.pytorch import PyTorch

from helpers.live import LogReader

pytestmark = pytest.mark.timeout(240)


def test_two_instance_groups_give_each_host_its_group_and_its_channels(local_session, role, fixture_code, tmp_path):
    shared, tests = tmp_path / "shared", tmp_path / "tests"
    shared.mkdir()
    tests.mkdir()
    (shared / "prompts.jsonl").write_text("{}\n")
    for i in range(4):
        (tests / f"t{i}.json").write_text("{}")
    shared_uri = local_session.upload_data(str(shared), key_prefix="groups/shared")
    tests_uri = local_session.upload_data(str(tests), key_prefix="groups/tests")
    estimator = PyTorch(
        entry_point="fixture_train.py", source_dir=str(fixture_code), role=role,
        instance_groups=[InstanceGroup("learner", "ml.p5.48xlarge", 1), InstanceGroup("judge", "ml.c7i.16xlarge", 2)],
        framework_version="2.8.0", py_version="py312", sagemaker_session=local_session,
        hyperparameters={"mode": "groups"},
    )  # fmt: skip
    estimator.fit(
        {
            "shared": TrainingInput(shared_uri),
            "tests": TrainingInput(tests_uri, instance_groups=["judge"], distribution="ShardedByS3Key"),
        },
        job_name="fixture-groups", logs=False,
    )  # fmt: skip

    description = estimator.latest_training_job.describe()
    assert description["TrainingJobStatus"] == "Completed"
    assert "InstanceType" not in description["ResourceConfig"]
    logs = LogReader(local_session.boto_session.client("logs"), "fixture-groups")
    seen = [json.loads(m[len("groups ") :]) for _, m in logs.read() if m.startswith("groups ")]
    by_host = {s["SM_CURRENT_HOST"]: s for s in seen}
    hosts = json.loads(seen[0]["SM_HOSTS"])
    assert len(hosts) == 3 and set(by_host) == set(hosts)
    learner, judges = hosts[:1], hosts[1:]  # algo-1..3 in the order of the groups
    groups_dict = {
        "learner": {"instance_group_name": "learner", "instance_type": "ml.p5.48xlarge", "hosts": learner},
        "judge": {"instance_group_name": "judge", "instance_type": "ml.c7i.16xlarge", "hosts": judges},
    }
    for host in hosts:
        env = by_host[host]
        group = "learner" if host in learner else "judge"
        assert env["SM_CURRENT_INSTANCE_GROUP"] == group
        assert env["SM_CURRENT_INSTANCE_TYPE"] == groups_dict[group]["instance_type"]
        assert json.loads(env["SM_CURRENT_INSTANCE_GROUP_HOSTS"]) == groups_dict[group]["hosts"]
        assert json.loads(env["SM_INSTANCE_GROUPS"]) == ["learner", "judge"]
        assert json.loads(env["SM_INSTANCE_GROUPS_DICT"]) == groups_dict
        assert env["SM_IS_HETERO"] == "true"
    assert by_host[learner[0]]["files"] == {"shared": ["prompts.jsonl"]}  # "tests" goes to the judges only
    assert by_host[judges[0]]["files"] == {"shared": ["prompts.jsonl"], "tests": ["t0.json", "t2.json"]}
    assert by_host[judges[1]]["files"] == {"shared": ["prompts.jsonl"], "tests": ["t1.json", "t3.json"]}


@pytest.mark.parametrize(
    "hyperparameters, judge_rank",
    [({}, "0"), ({"sagemaker_distribution_instance_groups": ["learner"]}, "None")],
    ids=["distribution-only", "distribution-groups-as-hyperparameter"],
)
def test_torch_distributed_spans_one_group(local_session, role, fixture_code, hyperparameters, judge_rank):
    """torchrun never spans two groups. The SDK's PyTorch estimator drops ``distribution["instance_groups"]``
    for torch_distributed (it sends no ``sagemaker_distribution_instance_groups``), so the toolkit
    falls back to each host's own group: the judge runs a torchrun world of its own (RANK=0). Sent as
    a hyperparameter, the group list keeps the judge out of torchrun (the toolkit's ProcessRunner)."""
    learner = InstanceGroup("learner", "ml.p5.48xlarge", 2)
    estimator = PyTorch(
        entry_point="fixture_train.py", source_dir=str(fixture_code), role=role,
        instance_groups=[learner, InstanceGroup("judge", "ml.c7i.16xlarge", 1)],
        distribution={"torch_distributed": {"enabled": True}, "instance_groups": [learner]},
        framework_version="2.8.0", py_version="py312", sagemaker_session=local_session,
        hyperparameters={"mode": "allreduce", "judge_group": "judge", **hyperparameters},
    )  # fmt: skip
    estimator.fit(job_name="fixture-groups-torchrun", logs=False)

    model = estimator.model_data
    bucket, key = model[len("s3://") :].split("/", 1)
    body = local_session.boto_session.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        result = json.loads(tar.extractfile("allreduce.json").read())
    assert result["world_size"] == 2 and result["sum"] == 3.0  # the two learners, not the judge
    logs = LogReader(local_session.boto_session.client("logs"), "fixture-groups-torchrun")
    judges = [m for _, m in logs.read() if m.startswith("judge host=")]
    assert len(judges) == 1 and judges[0].endswith(f"torchrun_rank={judge_rank}")
