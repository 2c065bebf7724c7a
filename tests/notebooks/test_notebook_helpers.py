"""The notebook-side helpers on their own: metric lines, cost, launch errors, excerpts, requests, live view."""

from __future__ import annotations

import ast
import json
import math
import os
import textwrap
import threading
import time

import pytest
from botocore.exceptions import ClientError, NoCredentialsError

from helpers import cost, errors, job_request, live, metrics, show

REPO = show.REPO

# --------------------------------------------------------------------------- metrics


def test_metric_lines_parse_as_the_scripts_print_them():
    line = "step=12 loss=0.4312 lr=1.2e-05 grad_norm=-3 tokens=120"
    assert metrics.parse_metric_line(line) == {
        "step": 12,
        "loss": 0.4312,
        "lr": 1.2e-05,
        "grad_norm": -3.0,
        "tokens": 120.0,
    }
    # CloudWatch lines may carry a prefix (torchrun's rank tag); other key=value lines are not ours
    assert metrics.parse_metric_line("[1,0]<stdout>:step=3 reward=0.5")["reward"] == 0.5
    assert metrics.parse_metric_line("progress: step 12/100 (12%)") is None
    assert metrics.parse_metric_line("step=3 mode=fast") is None


def test_metric_definitions_read_the_same_values():
    import re

    definitions = metrics.metric_definitions("loss", "lr")
    line = "step=7 loss=1.5e-03 lr=0.0002"
    values = {d["Name"]: float(re.search(d["Regex"], line).group(1)) for d in definitions}
    assert values == {"loss": 1.5e-03, "lr": 0.0002}
    with pytest.raises(ValueError, match="a-z0-9_"):
        metrics.metric_definitions("Loss/train")


def test_records_of_one_step_are_merged_in_step_order():
    records = [
        {"step": 1, "loss": 2.0},
        {"step": 1, "test_pass_fraction": 0.5},
        {"step": 3, "loss": 1.0},
        {"step": 2, "loss": 1.5},
        {"step": 3, "loss": 0.9},
    ]
    assert metrics.merge_by_step(records) == [
        {"step": 1, "loss": 2.0, "test_pass_fraction": 0.5},
        {"step": 2, "loss": 1.5},
        {"step": 3, "loss": 0.9},
    ]


def test_latest_keeps_the_last_value_of_each_metric():
    records = [{"step": 1, "loss": 2.0, "accuracy": 0.1}, {"step": 2, "loss": 1.0}]
    assert metrics.latest(records) == {"step": 2, "loss": 1.0, "accuracy": 0.1}
    assert metrics.all_finite(records)
    assert not metrics.all_finite([{"step": 1, "loss": math.nan}])


# --------------------------------------------------------------------------- cost


def evaluation(accuracies, **options):
    """An evaluate.py result: one record per example with its accuracy, and the run's options."""
    mean = sum(accuracies) / len(accuracies)
    spread = math.sqrt(sum((a - mean) ** 2 for a in accuracies) / (len(accuracies) - 1) / len(accuracies))
    settings = {"n": len(accuracies), "samples_per_example": 4, "temperature": 1.0, "seed": 42, **options}
    records = [{"example": {"statement": f"problem {i}"}, "accuracy": a} for i, a in enumerate(accuracies)]
    return {"accuracy": mean, "standard_error": spread, "records": records, **settings}


def test_a_held_out_change_is_paired_over_the_same_examples():
    before = evaluation([0.0, 0.25, 0.5, 1.0])
    after = evaluation([0.25, 0.5, 0.75, 1.0])
    change = metrics.held_out_change(before, after)
    # differences 0.25, 0.25, 0.25, 0: mean 0.1875, sample std 0.125, standard error 0.0625; far below
    # the error of either figure, since each problem's difficulty cancels out of its difference
    assert change["change"] == pytest.approx(0.1875) and change["change_standard_error"] == pytest.approx(0.0625)
    assert change["before_standard_error"] > 3 * change["change_standard_error"]
    text = metrics.describe_change(change, "solve rate")
    assert "held-out solve rate, 4 problems x 4 answer(s) at temperature 1.0: 0.438 ± 0.213 -> 0.625" in text
    assert "change +0.188 ± 0.062 (paired), +3.0 standard errors" in text
    # these evaluations kept no answers: whether the model collapsed is unknown, so no gain is claimed
    assert text.endswith("the evaluation did not count its answers (an older one), not counted as a gain")


@pytest.mark.parametrize(
    "changed, named",
    [({"temperature": 0.5}, "temperature"), ({"seed": 7}, "seed"), ({"samples_per_example": 8}, "samples_per_example")],
)
def test_evaluations_that_did_not_meet_the_same_draws_are_not_compared(changed, named):
    with pytest.raises(ValueError, match=f"differ in {named}.*would not be paired"):
        metrics.held_out_change(evaluation([0.0, 1.0]), evaluation([0.0, 1.0], **changed))
    other_problems = evaluation([0.0, 1.0])
    other_problems["records"][0]["example"] = {"statement": "another problem"}
    with pytest.raises(ValueError, match="differ in their examples"):
        metrics.held_out_change(evaluation([0.0, 1.0]), other_problems)


def test_cost_estimate_multiplies_price_count_and_max_run():
    estimate = cost.estimate(
        "ml.p5.48xlarge", 2, 3 * 3600, use_spot=True, max_wait_seconds=6 * 3600, ask_pricing_api=False
    )
    rate = cost.ON_DEMAND_USD_PER_HOUR["ml.p5.48xlarge"]
    assert estimate.on_demand_ceiling == pytest.approx(rate * 2 * 3)
    low, high = estimate.spot_range
    assert low < high < estimate.on_demand_ceiling
    text = str(estimate)
    assert cost.PRICE_TABLE_DATE in text and "approximate" in text and "managed spot" in text


def test_clusters_for_the_same_run_are_priced_group_by_group():
    comparison = cost.compare_clusters(
        {
            "2 x p5": [("homogeneousCluster", "ml.p5.48xlarge", 2)],
            "p5 + 4 x c7i": [("learner", "ml.p5.48xlarge", 1), ("judge", "ml.c7i.16xlarge", 4)],
        },
        8 * 3600,
        ask_pricing_api=False,
    )
    p5, c7i = cost.ON_DEMAND_USD_PER_HOUR["ml.p5.48xlarge"], cost.ON_DEMAND_USD_PER_HOUR["ml.c7i.16xlarge"]
    today, hetero = comparison.clusters
    assert today.usd_per_hour == pytest.approx(2 * p5) and today.on_demand_ceiling == pytest.approx(16 * p5)
    assert hetero.usd_per_hour == pytest.approx(p5 + 4 * c7i)
    text = str(comparison)
    assert f"p5 + 4 x c7i costs {(p5 + 4 * c7i) / (2 * p5):.0%} of 2 x p5 per hour" in text
    assert f"saves ${8 * (p5 - 4 * c7i):,.2f} at max_run" in text and cost.PRICE_TABLE_DATE in text
    with pytest.raises(ValueError, match="at least one instance"):
        cost.compare_clusters({"empty": [("judge", "ml.c7i.16xlarge", 0)]}, 3600, ask_pricing_api=False)


def test_pricing_api_without_credentials_falls_back_quickly(monkeypatch, tmp_path):
    import time

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    started = time.monotonic()
    price = cost.price_for("ml.g5.12xlarge", "us-east-1")
    assert time.monotonic() - started < 10
    assert price.usd_per_hour == cost.ON_DEMAND_USD_PER_HOUR["ml.g5.12xlarge"]
    assert "Pricing API not used" in price.source and "NoCredentialsError" in price.source


def test_unknown_instance_type_names_the_table():
    with pytest.raises(KeyError, match="ON_DEMAND_USD_PER_HOUR"):
        cost.estimate("ml.x9.huge", ask_pricing_api=False)


# --------------------------------------------------------------------------- launch errors


def _client_error(code: str, message: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, "CreateTrainingJob")


def test_zero_quota_is_explained_with_the_quota_to_raise():
    error = _client_error(
        "ResourceLimitExceeded",
        "The account-level service limit 'ml.p5.48xlarge for training "
        "job usage' is 0 Instances, with current utilization of 0 Instances and a request delta "
        "of 2 Instances.",
    )
    with pytest.raises(errors.LaunchError) as raised:
        with errors.explain_launch_errors("ml.p5.48xlarge", 2, "us-east-1"):
            raise error
    message = str(raised.value)
    assert "it is 0" in message and "Service Quotas" in message and "ml.p5.48xlarge for training job usage" in message
    assert raised.value.__cause__ is error


@pytest.mark.parametrize(
    "error, expected",
    [
        (
            _client_error("CapacityError", "Unable to provision requested ML compute capacity."),
            "no free ml.p5.48xlarge capacity",
        ),
        (_client_error("ValidationException", "Could not assume role arn:aws:iam::1:role/x"), "iam:PassRole"),
        (NoCredentialsError(), "run_mode='local'"),
    ],
)
def test_known_launch_errors_get_a_fix(error, expected):
    assert expected in errors.explain(error, "ml.p5.48xlarge", 2, "us-east-1")


def test_unknown_errors_pass_through_untouched():
    with pytest.raises(ZeroDivisionError):
        with errors.explain_launch_errors("ml.p5.48xlarge"):
            1 / 0  # noqa: B018


def test_failed_job_with_capacity_error_is_explained():
    guidance = errors.explain_failure(
        {
            "FailureReason": "CapacityError: Unable to provision requested ML compute capacity.",
            "ResourceConfig": {"InstanceType": "ml.p5.48xlarge"},
        }
    )
    assert "capacity" in guidance and "ml.p5.48xlarge" in guidance


# --------------------------------------------------------------------------- excerpts

SCRIPT = textwrap.dedent('''
    import torch


    def loss_fn(x):
        """The loss."""
        return x.sum()


    class Trainer:
        @staticmethod
        def step(batch):
            for item in batch:
                item.backward()
            return len(batch)
''')


def test_show_finds_functions_methods_and_regions(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    excerpt = show.find_definition(script, "loss_fn")
    assert excerpt.text.startswith("def loss_fn(x):") and excerpt.text.endswith("return x.sum()")
    assert excerpt.first_line == 5
    method = show.find_definition(script, "Trainer.step")
    assert method.text.lstrip().startswith("@staticmethod") and "return len(batch)" in method.text
    region = show.find_region(script, "for item in", ".backward()")
    assert region.text.splitlines() == ["        for item in batch:", "            item.backward()"]
    block = show.find_region(script, "for item in")
    assert block.text.endswith("item.backward()")


def test_show_names_what_exists_when_a_name_is_wrong(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    with pytest.raises(LookupError, match="Trainer, loss_fn"):
        show.find_definition(script, "grpo_loss")
    with pytest.raises(FileNotFoundError, match="scripts/sft.py"):
        show.find_definition(tmp_path / "missing.py", "x")


def test_show_reads_the_real_scripts():
    assert "def grpo_loss" in show.find_definition("scripts/grpo.py", "grpo_loss").text


def test_every_excerpt_a_notebook_shows_is_found():
    """Each ``show(...)`` in a notebook still names code that exists: moving a function out of a script
    breaks the notebook's cell, and this says which one in seconds, not at the end of the main job."""
    calls = []
    for notebook in sorted((REPO / "notebooks").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            tree = ast.parse("\n".join(line for line in source.splitlines() if not line.startswith(("%", "!"))))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "show":
                    args = [ast.literal_eval(a) for a in node.args]
                    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                    calls.append((notebook.name, args, kwargs))
    assert len(calls) >= 10, calls
    for name, args, kwargs in calls:
        script = REPO / "notebooks" / args[0]  # the notebooks run from notebooks/
        excerpt = show.find_definition(script, args[1]) if len(args) > 1 else show.find_region(script, **kwargs)
        assert excerpt.text.strip(), (name, args, kwargs)


# --------------------------------------------------------------------------- requests

REQUEST = {
    "TrainingJobName": "grpo-1",
    "AlgorithmSpecification": {
        "TrainingImage": "img:1",
        "TrainingInputMode": "File",
        "MetricDefinitions": metrics.metric_definitions("reward"),
    },
    "RoleArn": "arn:aws:iam::123456789012:role/r",
    "HyperParameters": {
        "sagemaker_program": '"grpo.py"',
        "sagemaker_torch_distributed_enabled": "true",
        "sagemaker_submit_directory": '"s3://b/code.tar.gz"',
        "max_steps": "3",
    },
    "InputDataConfig": [
        {
            "ChannelName": "train",
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/data/train"}},
        }
    ],
    "OutputDataConfig": {"S3OutputPath": "s3://b/jobs"},
    "ResourceConfig": {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2, "VolumeSizeInGB": 300},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200},
    "CheckpointConfig": {"S3Uri": "s3://b/ckpt", "LocalPath": "/opt/ml/checkpoints"},
    "EnableManagedSpotTraining": True,
    "EnableNetworkIsolation": True,
}


def test_summary_lists_the_fields_that_decide_the_job():
    lines = job_request.summary_lines(REQUEST)
    assert "InstanceType: ml.p5.48xlarge" in lines and "InstanceCount: 2" in lines
    assert "EnableManagedSpotTraining: True" in lines and "EnableNetworkIsolation: True" in lines
    assert "CheckpointConfig: s3://b/ckpt -> /opt/ml/checkpoints" in lines
    assert "sagemaker_torch_distributed_enabled: true" in lines
    assert "Script options: max_steps" in lines and "Metrics: reward" in lines
    assert lines[-1].startswith("Metrics") and lines[0] == "TrainingJobName: grpo-1"


def test_summary_of_a_heterogeneous_cluster_names_each_group():
    resources = {
        "InstanceGroups": [
            {"InstanceGroupName": "learner", "InstanceType": "ml.p5.48xlarge", "InstanceCount": 1},
            {"InstanceGroupName": "judge", "InstanceType": "ml.c7i.16xlarge", "InstanceCount": 4},
        ],
        "VolumeSizeInGB": 300,
    }
    channels = [
        {
            "ChannelName": "train",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": "s3://b/data/train",
                    "InstanceGroupNames": ["learner"],
                }
            },
        }
    ]
    lines = job_request.summary_lines({**REQUEST, "ResourceConfig": resources, "InputDataConfig": channels})
    assert "InstanceGroups: learner 1 x ml.p5.48xlarge, judge 4 x ml.c7i.16xlarge" in lines
    assert not [line for line in lines if line.startswith(("InstanceType", "InstanceCount"))]
    assert "Channel train: s3://b/data/train (to learner only)" in lines


def test_record_requests_sees_exactly_what_the_client_sends():
    import boto3
    from botocore.stub import Stubber

    client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    seen = []
    job_request.record_requests(client, seen.append)
    with Stubber(client) as stub:
        stub.add_response(
            "create_training_job",
            {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/grpo-1"},
            {k: v for k, v in REQUEST.items()},
        )
        client.create_training_job(**REQUEST)
    assert seen == [json.loads(json.dumps(REQUEST))]


# --------------------------------------------------------------------------- live view


class _FakeLogs:
    class exceptions:
        class ResourceNotFoundException(Exception):
            pass

    def __init__(self, batches):
        self.batches = batches  # the messages each describe_log_streams call finds newly logged
        self.calls = 0
        self.events: list[dict] = []  # every event so far, kept as CloudWatch keeps them

    def describe_log_streams(self, **_):
        if self.calls < len(self.batches):
            self.events += [{"timestamp": len(self.events), "message": m} for m in self.batches[self.calls]]
        self.calls += 1
        return {"logStreams": [{"logStreamName": "job/algo-1-1"}]}

    def get_log_events(self, startTime=0, nextToken=None, **_):  # noqa: N803 (boto3's argument names)
        if nextToken is not None:  # one page holds them all
            return {"events": [], "nextForwardToken": nextToken}
        return {"events": [e for e in self.events if e["timestamp"] >= startTime], "nextForwardToken": "f/end"}


class _FakeSession:
    boto_region_name = "us-east-1"

    def __init__(self, statuses, log_batches, failure=None, endpoint="https://api.sagemaker.us-east-1.amazonaws.com"):
        statuses = list(statuses)
        logs = _FakeLogs(log_batches)

        class SageMaker:
            class meta:
                endpoint_url = endpoint

            def describe_training_job(self, TrainingJobName):
                status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
                return {
                    "TrainingJobName": TrainingJobName,
                    "TrainingJobStatus": status[0],
                    "SecondaryStatus": status[1],
                    "FailureReason": failure,
                    "ResourceConfig": {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 1},
                    "SecondaryStatusTransitions": [{"Status": status[1], "StatusMessage": "msg"}],
                }

        class Boto:
            def client(self, name, **_):
                assert name == "logs"
                return logs

        self.sagemaker_client, self.boto_session = SageMaker(), Boto()


def test_watch_follows_a_job_to_completion_in_plain_text(capsys):
    session = _FakeSession(
        [("InProgress", "Starting"), ("InProgress", "Training"), ("Completed", "Completed")],
        [["toolkit starting"], ["step=1 loss=2.0", "step=2 loss=1.5"], ["step=3 loss=1.0", "done"]],
    )
    result = live.watch(session, "job", max_steps=3, poll_seconds=0.01, widgets=False)
    assert result.status == "Completed"
    assert [r["step"] for r in result.records] == [1, 2, 3] and result.final_metrics["loss"] == 1.0
    out = capsys.readouterr().out
    assert "[job] InProgress / Training" in out and "step 3/3 loss=1" in out and "[job] Completed" in out


def test_watch_keeps_the_later_value_of_a_step_logged_twice():
    session = _FakeSession(
        [("InProgress", "Training"), ("Completed", "Completed")],
        [["step=1 loss=2.0", "step=2 loss=1.5"], ["step=2 loss=1.4", "step=3 loss=1.0"]],
    )
    result = live.watch(session, "job", max_steps=3, poll_seconds=0.01, widgets=False)
    assert [(r["step"], r["loss"]) for r in result.records] == [(1, 2.0), (2, 1.4), (3, 1.0)]


def test_watch_raises_with_the_reason_and_the_fix_when_the_job_fails():
    session = _FakeSession(
        [("Failed", "Failed")],
        [["Traceback...", "ValueError: bad row"]],
        failure="CapacityError: Unable to provision requested ML compute capacity.",
    )
    with pytest.raises(live.JobFailed, match="(?s)CapacityError.*retry later.*ValueError: bad row"):
        live.watch(session, "job", poll_seconds=0.01, widgets=False)


@pytest.mark.parametrize(
    "endpoint, expected",
    [
        ("https://api.sagemaker.us-east-1.amazonaws.com", [2.0, 2.3, 2.645, 3.042, 3.498]),
        ("http://127.0.0.1:8123", [1.0] * 5),  # the local endpoint (SDK v3 in local mode)
    ],
)
def test_watch_polls_gently_on_aws_and_every_second_locally(monkeypatch, endpoint, expected):
    slept = []
    monkeypatch.setattr(live.time, "sleep", slept.append)
    session = _FakeSession([("InProgress", "Training")] * 5 + [("Completed", "Completed")], [[]], endpoint=endpoint)
    live.watch(session, "job", widgets=False)
    assert slept == pytest.approx(expected, abs=1e-3)

    slept.clear()  # a long job on AWS: the interval stops growing at 15 s
    session = _FakeSession([("InProgress", "Training")] * 40 + [("Completed", "Completed")], [[]], endpoint=endpoint)
    live.watch(session, "job", widgets=False)
    assert max(slept) == (15.0 if "amazonaws" in endpoint else 1.0)


def test_widgets_are_off_outside_a_jupyter_front_end(monkeypatch):
    monkeypatch.delenv("NOTEBOOK_PLAIN_OUTPUT", raising=False)
    assert live.use_widgets() is False  # pytest is no Jupyter front end
    monkeypatch.setenv("NOTEBOOK_PLAIN_OUTPUT", "0")
    assert live.use_widgets() is True


# --------------------------------------------------------------------------- main-job summary


def test_summary_names_the_failing_notebook_and_cell(tmp_path):
    from tools import run_notebooks

    results = [
        {"notebook": "00_setup_and_data.ipynb", "status": "ok", "seconds": 3.0},
        {
            "notebook": "01_estimator_sft.ipynb",
            "status": "failed",
            "seconds": 5.0,
            "cell": "cell 7: show(...)",
            "error": "LookupError: no 'x'",
        },
    ]
    state = tmp_path / "state.json"
    state.write_text(
        json.dumps(
            {
                "jobs": [
                    {
                        "notebook": "01",
                        "job_name": "sft-1",
                        "status": "Completed",
                        "final_metrics": {"step": 4, "loss": 1.25},
                    }
                ],
                "evaluation": {
                    "base": {"accuracy": 0.25, "n": 8, "job_name": "e1"},
                    "trained": {"accuracy": 0.5, "n": 8, "job_name": "e2"},
                },
            }
        )
    )
    summary = run_notebooks.build_summary(results, state, tmp_path)
    text = run_notebooks.render_markdown(summary)
    assert not summary["ok"]
    assert "01_estimator_sft.ipynb: failed" in text and "cell 7: show(...)" in text and "LookupError" in text
    assert "sft-1 -- Completed; last step 4: loss=1.25" in text
    assert "base: accuracy 0.250" in text and "trained: accuracy 0.500" in text


def test_the_summary_judges_the_judge_before_its_win_rate_and_says_when_the_rate_says_nothing():
    from environments.llm_judge import judge_quality, win_rate

    from tools import run_notebooks, training_session_notebooks

    def verdicts(*outcomes):  # the answer each pair's verdict chose, in both orders
        return [{"outcome": o, "a_first": o, "b_first": o} for o in outcomes]

    reading = judge_quality(verdicts(*["a"] * 15, "b"), ["a"] * 16)  # 15 of 16 checked pairs right
    by_position = judge_quality([{"outcome": "position", "a_first": "a", "b_first": "b"}] * 16, ["a"] * 16)
    rate = win_rate(verdicts(*["a"] * 12, "b", "b", "b", "b"))  # 12 of 16 pairs to the trained model
    result = {
        "held_out_accuracy": {"synthetic": {"accuracy": 0.25, "standard_error": 0.108, "n": 16}},
        "judge": reading,
        "win_rate": rate,
        "pairwise_verdicts": "one token",
    }
    lines = "\n".join(run_notebooks.render_teacher_and_judge(result))
    assert "SFT on the synthetic answers: held-out accuracy 0.250 ± 0.108 (16 problems, greedy)" in lines
    assert "the judge, with one token verdicts: The judge on 16 pairs where exactly one answer is right" in lines
    assert "16 verdicts survived the swap; 0.94 ± 0.06 of them chose the right answer (a coin: 0.50 ± 0.12)" in lines
    assert "SFT on the teacher's answers vs the base model, each pair judged in both orders: 12 wins, 4 losses" in lines
    assert "win rate 0.750 ± 0.112" in lines and "SFT on the teacher's answers judged better" in lines
    weak = "\n".join(run_notebooks.render_teacher_and_judge({**result, "judge": by_position}))
    assert "read first in 100% of the 32 orders" in weak and "this win rate says nothing" in weak
    assert "judged better" not in weak
    # a state file from before the judge was judged: its rate of one random order per pair is not shown
    assert "win rate" not in "\n".join(run_notebooks.render_teacher_and_judge({**result, "judge": None}))
    assert run_notebooks.render_teacher_and_judge({}) == []
    # Notebook 14's record: each served model's accuracy, the judge, and each model's rate against the base
    session = {"notebook": "14_serve_and_deploy", "session": "s", "status": "Stopped", "steps": 0}
    session |= {"held_out_accuracy": {"trained": [0.5, 0.125], "base": [0.25, 0.108]}, "judge": by_position}
    session |= {"win_rates": {"trained": rate}}
    lines = "\n".join(training_session_notebooks.render([session]))
    assert "trained model: held-out accuracy 0.500 ± 0.125, greedy" in lines
    assert "Too weak to judge" in lines and "trained model vs base model, each pair judged in both orders" in lines
    assert "this win rate says nothing about the two models" in lines


def test_job_notebooks_and_session_notebooks_are_two_lanes():
    from tools import run_notebooks

    prefixes = [[n.name[:2] for n in lane] for lane in run_notebooks.lanes(run_notebooks.notebooks())]
    assert prefixes == [
        ["01", "02", "03", "04", "05", "06", "11", "13"],
        ["07", "08", "09", "10", "12", "14", "15", "16"],
    ]


def test_lanes_run_side_by_side_after_00_and_a_failure_ends_only_its_lane(tmp_path, monkeypatch):
    from tools import run_notebooks

    spans = {}

    def fake_execute(notebook, out, work_dir, model, cell_timeout, yielding=False):
        started = time.monotonic()
        time.sleep(0.3)
        spans[notebook.name[:2]] = (started, time.monotonic())
        failed = notebook.name.startswith("02")
        return {"notebook": notebook.name, "status": "failed" if failed else "ok", "seconds": 0.3,
                "cell": "cell 3: x", "error": "ValueError: on purpose" if failed else None}  # fmt: skip

    monkeypatch.setattr(run_notebooks, "execute", fake_execute)
    monkeypatch.setattr(run_notebooks, "prepare_environment", lambda out: {})
    summary = run_notebooks.run(tmp_path, only=["00", "01", "02", "03", "07", "08"])
    assert [r["notebook"][:2] for r in summary["notebooks"]] == ["00", "01", "02", "07", "08"]  # 03 never ran
    assert not summary["ok"]
    assert all(spans["00"][1] <= start for name, (start, _) in spans.items() if name != "00")
    assert spans["07"][0] < spans["01"][1] and spans["01"][0] < spans["07"][1]  # at the same time
    assert summary["seconds"] < sum(end - start for start, end in spans.values())
    assert summary["lanes"] == [["01_estimator_sft", "02_sagemaker_session_dpo", "03_boto3_grpo"], ["07_training_session_sft", "08_training_session_grpo"]]  # fmt: skip
    assert "2 lanes side by side: 01, 02, 03; 07, 08)" in run_notebooks.render_markdown(summary)


@pytest.mark.parametrize("fails", [None, "02"])
def test_notebook_14_starts_once_03_of_the_other_lane_has_finished_or_will_not_run(tmp_path, monkeypatch, fails):
    """14 deploys 03's job model: it waits for 03 however long the job lane takes, and runs anyway (saying
    to run 03 first) when a failure before 03 ended the job lane."""
    from tools import run_notebooks

    spans = {}

    def fake_execute(notebook, out, work_dir, model, cell_timeout, yielding=False):
        started = time.monotonic()
        time.sleep(1.0 if notebook.name[:2] in ("01", "02", "03") else 0.05)  # the job lane is the slow one
        spans[notebook.name[:2]] = (started, time.monotonic())
        status = "failed" if notebook.name[:2] == fails else "ok"
        return {"notebook": notebook.name, "status": status, "seconds": 0.0, "cell": "", "error": "on purpose"}

    monkeypatch.setattr(run_notebooks, "execute", fake_execute)
    monkeypatch.setattr(run_notebooks, "prepare_environment", lambda out: {})
    monkeypatch.setattr(run_notebooks.session_service, "stop_service", lambda root, *args, **kwargs: None)
    run_notebooks.run(tmp_path, only=["00", "01", "02", "03", "08", "14"])
    assert "14" in spans
    if fails is None:
        assert spans["03"][1] <= spans["14"][0]
    else:
        assert "03" not in spans and spans["02"][1] <= spans["14"][0]
    assert spans["08"][0] < spans["01"][1]  # the rest of the session lane does not wait


def test_the_notebooks_of_the_sdk_v3_kernel_use_the_session_endpoint_whichever_lane_they_are_in():
    from tools import run_notebooks

    users = [n.name[:2] for n in run_notebooks.notebooks() if run_notebooks.uses_session_endpoint(n)]
    assert users == ["07", "08", "09", "10", "11", "12", "14", "15", "16"]  # 11 runs in the job lane


def test_the_session_endpoint_stops_once_its_last_user_is_done_or_will_not_run():
    from tools import run_notebooks

    stops = []
    notebooks = {n.name[:2]: n for n in run_notebooks.notebooks()}
    users = run_notebooks.EndpointUsers(list(notebooks.values()), lambda: stops.append(1))
    users.done([notebooks["01"], notebooks["07"], notebooks["13"]])
    session_lane = [notebooks[n] for n in ("08", "09", "10", "12", "14", "15", "16")]
    users.done(session_lane)  # a lane that failed at 08
    assert not stops  # 11 has not run yet
    users.done([notebooks["11"]])
    users.done([notebooks["11"], notebooks["12"]])  # a lane's end names its notebooks again
    assert stops == [1]  # once


def test_the_session_endpoint_stays_up_while_a_job_lane_notebook_still_uses_it(tmp_path, monkeypatch):
    """The session lane ends first, deterministically, while notebook 11 (job lane; its ModelTrainer job is
    answered by the same endpoint) still runs: the endpoint stops only once 11 is done, before 13."""
    from tools import run_notebooks

    events = []
    eleven_started, session_lane_over = threading.Event(), threading.Event()

    class LanesObserved(run_notebooks.ThreadPoolExecutor):  # says when a lane has ended, its clean-up included
        def map(self, function, lanes):
            def observed(lane):
                try:
                    return function(lane)
                finally:
                    if run_notebooks.is_session_lane(lane):
                        session_lane_over.set()

            return super().map(observed, lanes)

    def fake_execute(notebook, out, work_dir, model, cell_timeout, yielding=False):
        name = notebook.name[:2]
        events.append(("start", name))
        if name == "11":
            eleven_started.set()
            events.append(("session lane over while 11 ran", session_lane_over.wait(120)))
        if name == "07":
            events.append(("07 ran while 11 ran", eleven_started.wait(120)))
        events.append(("end", name))
        return {"notebook": notebook.name, "status": "ok", "seconds": 0.0}

    monkeypatch.setattr(run_notebooks, "execute", fake_execute)
    monkeypatch.setattr(run_notebooks, "prepare_environment", lambda out: {})
    monkeypatch.setattr(run_notebooks, "ThreadPoolExecutor", LanesObserved)
    monkeypatch.setattr(
        run_notebooks.session_service, "stop_service", lambda root, *args, **kwargs: events.append(("stop",))
    )
    summary = run_notebooks.run(tmp_path, only=["00", "07", "11", "13"])
    assert summary["ok"] and summary["lanes"] == [["11_model_trainer_sft", "13_teacher_and_judge"], ["07_training_session_sft"]]  # fmt: skip
    assert ("07 ran while 11 ran", True) in events and ("session lane over while 11 ran", True) in events, events
    first_stop = events.index(("stop",))
    assert events.index(("end", "11")) < first_stop < events.index(("start", "13")), events


def test_an_interrupted_run_stops_the_session_endpoint(tmp_path, monkeypatch):
    from tools import run_notebooks

    stops = []

    def fake_execute(notebook, out, work_dir, model, cell_timeout, yielding=False):
        if notebook.name.startswith("11"):
            raise KeyboardInterrupt  # Ctrl-C while a job-lane notebook uses the endpoint
        return {"notebook": notebook.name, "status": "ok", "seconds": 0.0}

    monkeypatch.setattr(run_notebooks, "execute", fake_execute)
    monkeypatch.setattr(run_notebooks, "prepare_environment", lambda out: {})
    monkeypatch.setattr(run_notebooks.session_service, "stop_service", lambda root, *args, **kwargs: stops.append(root))
    with pytest.raises(KeyboardInterrupt):
        run_notebooks.run(tmp_path, only=["00", "11"])
    assert stops and set(stops) == {tmp_path.resolve() / "sagemaker-local"}


def test_each_lane_and_the_session_service_get_their_share_of_the_cores(tmp_path, monkeypatch):
    from tools import run_notebooks

    seen = {}

    def fake_execute(notebook, out, work_dir, model, cell_timeout, yielding=False):
        seen[notebook.name[:2]] = (os.environ["OMP_NUM_THREADS"], os.environ["SAGEMAKER_LOCAL_SESSION_THREADS"])
        if notebook.name.startswith("01"):  # a long job notebook: the session lane ends while it runs
            deadline = time.monotonic() + 60
            while os.environ["OMP_NUM_THREADS"] != "4" and time.monotonic() < deadline:
                time.sleep(0.01)
        return {"notebook": notebook.name, "status": "ok", "seconds": 0.0}

    monkeypatch.setattr(run_notebooks, "execute", fake_execute)
    monkeypatch.setattr(run_notebooks, "prepare_environment", lambda out: {})
    monkeypatch.setattr(run_notebooks.hostlib, "machine_threads", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SAGEMAKER_LOCAL_SESSION_THREADS", raising=False)
    run_notebooks.run(tmp_path / "two-lanes", only=["00", "01", "02", "07"])
    assert seen["01"] == seen["07"] == ("2", "2"), seen  # side by side: half the cores each
    assert seen["02"] == ("4", "2"), seen  # it started after the session lane had ended: all of them
    assert "OMP_NUM_THREADS" not in os.environ  # put back as the run found it

    alone = run_notebooks.run(tmp_path / "sessions", only=["00", "07", "08"])
    assert seen["07"] == seen["08"] == ("4", "4"), seen  # the session lane alone, the service included
    assert "(one after another)" in run_notebooks.render_markdown(alone)


def test_the_real_model_profile_runs_the_session_lane_first_and_in_bf16(tmp_path, monkeypatch):
    """SmolLM2: the job lane's kernels yield the cores to the session lane, whose service computes on all of
    them; jobs and sessions compute in bf16 where the CPU has bf16 instructions; the tiny profile shares
    equally, in exact fp32."""
    from local_mode import session_service
    from tools import run_notebooks

    seen = {}

    def fake_execute(notebook, out, work_dir, model, cell_timeout, yielding=False):
        seen[notebook.name[:2]] = (
            yielding,
            os.environ["SAGEMAKER_LOCAL_SESSION_THREADS"],
            os.environ[session_service.PRECISION_VARIABLE],
            os.environ.get(run_notebooks.CPU_PRECISION_VARIABLE, "-"),
        )
        return {"notebook": notebook.name, "status": "ok", "seconds": 0.0}

    monkeypatch.setattr(run_notebooks, "execute", fake_execute)
    monkeypatch.setattr(run_notebooks, "prepare_environment", lambda out: {})
    monkeypatch.setattr(run_notebooks.hostlib, "machine_threads", lambda: 4)
    for variable in ("OMP_NUM_THREADS", "SAGEMAKER_LOCAL_SESSION_THREADS", session_service.PRECISION_VARIABLE):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv(run_notebooks.CPU_PRECISION_VARIABLE, raising=False)
    monkeypatch.setattr(run_notebooks.hostlib, "native_bf16", lambda: True)
    # no notebook runs: the real model's disk-space check (25 GiB) does not apply to this machine's /tmp
    monkeypatch.setattr(run_notebooks.disk_space, "main_job_shortage", lambda *args: None)
    run_notebooks.run(tmp_path / "smollm2", only=["00", "01", "04", "07"], model="smollm2")
    assert seen["00"][0] is False and seen["01"] == (True, "4", "bf16", "no"), seen
    assert seen["04"] == (True, "4", "bf16", "bf16"), seen  # code RL's jobs compute in bf16, GRPO's and SFT's not
    assert seen["07"][:3] == (False, "4", "bf16"), seen
    assert session_service.PRECISION_VARIABLE not in os.environ  # put back as the run found it
    assert run_notebooks.CPU_PRECISION_VARIABLE not in os.environ

    monkeypatch.setattr(run_notebooks.hostlib, "native_bf16", lambda: False)  # bf16 would be slower there
    run_notebooks.run(tmp_path / "smollm2-old-cpu", only=["00", "04", "07"], model="smollm2")
    assert seen["04"] == (True, "4", "fp32", "no") and seen["07"][:3] == (False, "4", "fp32"), seen

    run_notebooks.run(tmp_path / "tiny", only=["00", "01", "04", "07"])
    assert seen["01"] == seen["04"] == (False, "2", "fp32", "no") and seen["07"][:3] == (False, "2", "fp32"), seen
    assert run_notebooks.CPU_PRECISION_VARIABLE not in os.environ


def test_a_yielding_kernel_runs_at_a_lower_priority(tmp_path):
    """A real kernel started by ``YieldingKernelManager`` is niced, its session's CPU group too where Linux
    schedules by autogroup (jupyter starts a kernel in a session of its own), and a process it starts as
    local mode starts a job's host (a process group, not a session) shares both."""
    import pathlib

    from tools import run_notebooks

    manager = run_notebooks.YieldingKernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(tmp_path))
    client = manager.client()
    client.start_channels()
    probe = "import os; print(os.nice(0), ((open('/proc/self/autogroup').read().split() if os.path.exists('/proc/self/autogroup') else []) or ['-'])[-1])"
    try:
        client.wait_for_ready(timeout=120)
        outputs = []
        code = (
            f"import subprocess, sys\n{probe}\n"
            f"print(subprocess.run([sys.executable, '-c', {probe!r}], capture_output=True, text=True, process_group=0).stdout)"
        )
        client.execute_interactive(
            code, timeout=60, output_hook=lambda msg: outputs.append(msg["content"].get("text", ""))
        )
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    niceness = str(min(19, os.nice(0) + run_notebooks.JOB_LANE_NICENESS))
    autogroups = pathlib.Path("/proc/sys/kernel/sched_autogroup_enabled")
    grouped = autogroups.exists() and autogroups.read_text().strip() == "1"
    kernel, host = "".join(outputs).split()[:2], "".join(outputs).split()[2:]
    assert kernel == host and kernel[0] == niceness, outputs
    if grouped:
        assert kernel[1] == niceness, outputs


def test_a_notebook_run_again_replaces_its_jobs_and_the_summary_keeps_the_others(tmp_path, monkeypatch):
    """`--only 05 06` after a run whose 05 failed: one job per notebook, one summary of the whole folder."""
    from tools import run_notebooks

    state_file = tmp_path / "work" / "state.json"
    attempt = {"01": 0}
    state_lock = threading.Lock()  # the two lanes run in threads: one read-modify-write at a time

    def fake_execute(notebook, out, work_dir, model, cell_timeout, yielding=False):
        with state_lock:
            state = json.loads(state_file.read_text()) if state_file.exists() else {}
            if notebook.name.startswith("01"):  # the notebook launches a job: it fails the first time
                attempt["01"] += 1
                state.setdefault("jobs", []).append({"notebook": notebook.stem, "job_name": f"sft-{attempt['01']}"})
            state_file.parent.mkdir(parents=True, exist_ok=True)
            state_file.write_text(json.dumps(state))
        failed = notebook.name.startswith("01") and attempt["01"] == 1
        return {"notebook": notebook.name, "status": "failed" if failed else "ok", "seconds": 1.0,
                "cell": "cell 3: x", "error": "OSError: No space left on device" if failed else None}  # fmt: skip

    monkeypatch.setattr(run_notebooks, "execute", fake_execute)
    monkeypatch.setattr(run_notebooks, "prepare_environment", lambda out: {})
    first = run_notebooks.run(tmp_path, only=["00", "01", "07"])
    assert not first["ok"] and [j["job_name"] for j in first["jobs"]] == ["sft-1"]

    again = run_notebooks.run(tmp_path, only=["01"])
    assert [j["job_name"] for j in again["jobs"]] == ["sft-2"]  # the failed attempt's job is gone
    assert [(r["notebook"][:2], r["status"], r.get("earlier_run", False)) for r in again["notebooks"]] == [
        ("00", "ok", True), ("01", "ok", False), ("07", "ok", True)]  # fmt: skip
    assert again["ok"]
    assert (
        "07_training_session_sft.ipynb: ok in 1 s (an earlier run into this folder)"
        in (tmp_path / "summary.md").read_text()
    )


def test_widget_view_shows_status_progress_and_metrics():
    view = live._WidgetView("job", 4)
    view.update(
        {
            "TrainingJobStatus": "InProgress",
            "SecondaryStatus": "Training",
            "SecondaryStatusTransitions": [{"Status": "Training", "StatusMessage": "in progress"}],
        },
        [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}],
        ["line 1", "line 2"],
    )
    assert view.progress.value == 2 and view.progress.max == 4 and view.step_label.value == "2/4"
    assert "InProgress / Training - in progress" in view.status.value
    assert "<td>loss</td><td>1.5</td>" in view.metrics.value and view.log.value.endswith("line 2")


def test_pricing_api_answer_is_read_from_the_on_demand_terms():
    import boto3
    from botocore.stub import Stubber

    product = {
        "product": {
            "attributes": {
                "instanceName": "ml.p5.48xlarge",
                "usagetype": "USE1-Train:ml.p5.48xlarge",
                "component": "Training",
            }
        },
        "terms": {"OnDemand": {"T1": {"priceDimensions": {"D1": {"unit": "Hrs", "pricePerUnit": {"USD": "63.296"}}}}}},
    }
    session = boto3.Session(aws_access_key_id="x", aws_secret_access_key="y", region_name="us-east-1")
    client = session.client("pricing", region_name="us-east-1")
    stubber = Stubber(client)
    stubber.add_response("get_products", {"PriceList": [json.dumps(product)], "FormatVersion": "aws_v1"})

    class _Session:
        def client(self, *args, **kwargs):
            return client

    with stubber:
        assert cost.pricing_api_price("ml.p5.48xlarge", "us-east-1", boto_session=_Session()) == 63.296
        stubber.add_response("get_products", {"PriceList": [json.dumps(product)], "FormatVersion": "aws_v1"})
        price = cost.price_for("ml.p5.48xlarge", "us-east-1", boto_session=_Session())
    assert price.usd_per_hour == 63.296 and "Pricing API" in price.source and "today" in price.source


def test_offline_data_becomes_channel_files_without_empty_fields(tmp_path):
    from helpers import data_prep

    dataset = data_prep.load("code", "offline", n_train=6, n_test=2, workdir=tmp_path)
    folders = data_prep.write_channels(dataset, tmp_path / "channels")
    assert set(folders) == {"train", "test"}
    rows = [json.loads(line) for line in (folders["train"] / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(None not in row.values() for row in rows)
    assert any("fn_name" in row for row in rows) and any("fn_name" not in row for row in rows)
    with pytest.raises(ValueError, match="hub' or 'offline"):
        data_prep.load("gsm8k", "somewhere")


def test_starting_model_is_the_staged_base_or_the_sft_artifact(tmp_path):
    from helpers.errors import LaunchError
    from helpers.workshop import State, Workshop

    state = State(tmp_path / "state.json")
    ws = Workshop(session=None, role="r", bucket="b", region="us-east-1", run_mode="local", notebook="03", state=state)
    state.update(model="s3://b/model/")
    assert ws.starting_model("base") == "s3://b/model/"
    with pytest.raises(LaunchError, match="01_estimator_sft.ipynb"):
        ws.starting_model("sft")
    state.update(sft_job="sft-1", jobs=[{"job_name": "sft-1", "status": "Failed"}])
    with pytest.raises(LaunchError, match="no model artifact"):
        ws.starting_model("sft")
    state.update(jobs=[{"job_name": "sft-1", "status": "Completed", "model_data": "s3://b/sft-1/output/model.tar.gz"}])
    assert ws.starting_model("sft") == "s3://b/sft-1/output/model.tar.gz"
    with pytest.raises(LaunchError, match="start_from"):
        ws.starting_model("SFT")


def test_a_data_set_notebook_0_did_not_stage_is_named_with_those_it_did(tmp_path):
    from helpers.errors import LaunchError
    from helpers.workshop import State, Workshop

    state = State(tmp_path / "state.json")
    ws = Workshop(session=None, role="r", bucket="b", region="us-east-1", run_mode="local", notebook="04", state=state)
    with pytest.raises(LaunchError, match="has no 'channels': run 00_setup_and_data.ipynb first"):
        ws.data_set("functions")
    state.update(channels={"code": {"train": "s3://b/code/train", "test": "s3://b/code/test"}})
    assert ws.data_set("code")["train"] == "s3://b/code/train"
    with pytest.raises(
        LaunchError, match=r"No data set 'functions'.*staged code\. .*run 00_setup_and_data.ipynb again"
    ):
        ws.data_set("functions")


def test_summary_says_what_each_curve_did(tmp_path):
    from tools import run_notebooks

    lines = [f"step={s} reward={r} frac_reward_zero_std=0.5" for s, r in enumerate([0.1, 0.2, 0.3, 0.6, 0.7, 0.9], 1)]
    lines.insert(2, "step=2 format_reward=0.4")  # a second record of step 2 is merged into it
    lines.insert(4, "step=3 reward=0.0")  # a step run again after a resume: the later value wins
    lines[5:5] = ["step=3 reward=0.3", "INFO not a metric line"]
    stream = tmp_path / "sagemaker-local" / "logs" / "grpo-1" / "algo-1-123.jsonl"
    stream.parent.mkdir(parents=True)
    stream.write_text("".join(json.dumps({"t": t, "m": m}) + "\n" for t, m in enumerate(lines)))
    state = tmp_path / "state.json"
    state.write_text(
        json.dumps(
            {
                "jobs": [
                    {
                        "notebook": "03_boto3_grpo",
                        "job_name": "grpo-1",
                        "status": "Completed",
                        "model_data": "s3://b/grpo-1/output/model.tar.gz",
                        "request": {"HyperParameters": {"sagemaker_program": json.dumps("grpo.py")}},
                    }
                ]
            }
        )
    )
    summary = run_notebooks.build_summary(
        [{"notebook": "03_boto3_grpo.ipynb", "status": "ok", "seconds": 1.0}], state, tmp_path
    )
    curves = {c["metric"]: c for c in summary["curves"]}
    assert set(curves) == {"reward", "format_reward", "frac_reward_zero_std"}
    assert (curves["reward"]["first"], curves["reward"]["last"], curves["reward"]["steps"]) == (0.1, 0.9, 6)
    assert "03_boto3_grpo: reward 0.1 -> 0.9 over 6 steps: rises, as expected" in run_notebooks.render_markdown(summary)


def test_save_log_keeps_every_hosts_log_in_a_file_and_shows_each_hosts_end(tmp_path, capsys, monkeypatch):
    """Two hosts' CloudWatch streams (moto), with a terminal's colour codes: the file holds every line of
    each host in its own section, the cell each host's last lines."""
    from types import SimpleNamespace

    import boto3
    from moto import mock_aws

    for variable in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        session = SimpleNamespace(boto_session=boto3.Session(region_name="us-east-1"), boto_region_name="us-east-1")
        logs = session.boto_session.client("logs")
        logs.create_log_group(logGroupName=live.LOG_GROUP)
        for host in ("algo-1", "algo-2"):
            stream = f"job-1/{host}-1700000000"
            logs.create_log_stream(logGroupName=live.LOG_GROUP, logStreamName=stream)
            now = int(time.time() * 1000)  # CloudWatch keeps no event older than 14 days
            events = [{"timestamp": now + i, "message": f"\x1b[32m{host} line {i}\x1b[0m"} for i in range(40)]
            logs.put_log_events(logGroupName=live.LOG_GROUP, logStreamName=stream, logEvents=events)
        path = live.save_log(session, "job-1", tmp_path / "logs" / "job-1.log", last=3)
    text = path.read_text()
    assert "\x1b" not in text and text.count(" line ") == 80
    assert text.index("==> job-1/algo-1") < text.index("algo-1 line 39") < text.index("==> job-1/algo-2")
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == f"80 log lines from 2 host(s), whole in {path}"
    assert shown[1:] == [
        "--- job-1/algo-1-1700000000: the last 3 of 40 lines", "algo-1 line 37", "algo-1 line 38", "algo-1 line 39",
        "--- job-1/algo-2-1700000000: the last 3 of 40 lines", "algo-2 line 37", "algo-2 line 38", "algo-2 line 39",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "answer, shown",
    [
        ("\n" * 40 + "K" * 38, "'[\\n]×40[K]×38'"),
        ("So it is 42.\n#### 42", "'So it is 42.\\n#### 42'"),  # short runs stay as written
        ("x = 1000000", "'x = 1000000'"),
        ("```python" * 40, "'[```python]×40'"),
        ("word " * 100, "'[word ]×100'"),
    ],
)
def test_an_answer_preview_is_one_line_whatever_the_model_wrote(answer, shown):
    assert show.preview(answer) == shown


def test_an_answer_preview_is_cut_at_its_width():
    text = show.preview("abcdefghij" * 3 + " the end of a long answer", width=20)
    assert len(text) == 20 and text.endswith("…") and "\n" not in text


def test_a_progress_line_says_where_each_running_notebook_is(tmp_path):
    """The real model's run lasts over an hour: between a notebook's start and end lines, a line every few
    minutes names each running notebook, its minutes so far and the cell papermill is running."""
    import nbformat

    from tools import run_notebooks

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# 08")] + [nbformat.v4.new_code_cell("x") for _ in range(5)]
    for cell, status in zip(
        notebook.cells[1:], ["completed", "completed", "running", "pending", "pending"], strict=True
    ):
        cell.metadata["papermill"] = {"status": status}
    nbformat.write(notebook, tmp_path / "08_training_session_grpo.ipynb")
    (tmp_path / "02_sagemaker_session_dpo.ipynb").write_text('{"cells": [')  # caught mid-write

    assert run_notebooks.cells_run(tmp_path / "08_training_session_grpo.ipynb") == (2, 5)
    assert run_notebooks.cells_run(tmp_path / "02_sagemaker_session_dpo.ipynb") is None
    assert run_notebooks.cells_run(tmp_path / "03_boto3_grpo.ipynb") is None  # not written yet
    running = {"08_training_session_grpo.ipynb": 1000.0, "02_sagemaker_session_dpo.ipynb": 1540.0}
    line = run_notebooks.progress_line(running, tmp_path, now=1600.0)
    assert line == "    running: 02_sagemaker_session_dpo for 1 min; 08_training_session_grpo for 10 min, cell 3 of 5"


def test_a_run_says_its_progress_while_notebooks_run_and_stops_saying_it_when_it_ends(tmp_path, monkeypatch, capsys):
    from tools import run_notebooks

    both_lanes = threading.Barrier(2, timeout=30)

    def slow_execute(notebook, out, work_dir, model, cell_timeout, yielding=False):
        if not notebook.name.startswith("00"):
            both_lanes.wait()  # 01 and 07 run at once, however slowly the machine starts their threads
        time.sleep(1.5)  # several progress lines' time, with room on a loaded machine
        return {"notebook": notebook.name, "status": "ok", "seconds": 1.5}

    monkeypatch.setattr(run_notebooks, "execute", slow_execute)
    monkeypatch.setattr(run_notebooks, "prepare_environment", lambda out: {})
    monkeypatch.setattr(run_notebooks, "PROGRESS_EVERY_S", 0.2)
    run_notebooks.run(tmp_path, only=["00", "01", "07"])
    printed = capsys.readouterr().out
    assert "    running: 00_setup_and_data for 0 min" in printed
    assert "    running: 01_estimator_sft for 0 min; 07_training_session_sft for 0 min" in printed  # side by side
    time.sleep(0.5)
    assert "running:" not in capsys.readouterr().out  # the run has ended: no more lines
