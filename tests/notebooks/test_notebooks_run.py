"""Every notebook, run by papermill in local mode with the CI parameters: what the run produced.

The run happens once per session (fixture ``notebook_run`` in conftest.py); each test asserts
on its outputs: the summary, the jobs in the state file, the artifacts local mode keeps in its
S3 mirror on disk, and the requests the notebooks sent (request fidelity).
"""

from __future__ import annotations

import json
import math
import tarfile

import nbformat
import pytest
from common import stats

from helpers.metrics import merge_by_step
from tools import run_notebooks

# What each notebook must send, whatever the run mode: its cloud configuration. (The CI
# parameters change the model, data and steps only.)
PYTORCH_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312"
HF_IMAGE = (
    "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:"
    "2.8.0-transformers4.56.2-gpu-py312-cu129-ubuntu22.04"
)
EXPECTED_REQUESTS = {
    "01": dict(
        jobs=1,
        program="sft.py",
        image=HF_IMAGE,
        instance_type="ml.p4de.24xlarge",
        count=2,
        spot=False,
        checkpoint=False,
        torchrun=True,
        isolation=False,
        channels={"train", "test", "model"},
    ),
    "02": dict(
        jobs=1,
        program="dpo.py",
        image=PYTORCH_IMAGE,
        instance_type="ml.p4de.24xlarge",
        count=1,
        spot=False,
        checkpoint=False,
        torchrun=True,
        isolation=False,
        channels={"train", "test", "model"},
    ),
    "03": dict(
        jobs=1,
        program="grpo.py",
        image=PYTORCH_IMAGE,
        instance_type="ml.p5.48xlarge",
        count=1,
        spot=False,
        checkpoint=True,
        torchrun=True,
        isolation=False,
        channels={"train", "model"},
    ),
    "04": dict(
        jobs=1,
        program="code_rl.py",
        image=PYTORCH_IMAGE,
        instance_type="ml.p5.48xlarge",
        count=2,
        spot=False,
        checkpoint=False,
        torchrun=True,
        isolation=True,
        channels={"train", "model", "code"},
    ),
    # Notebook 4's held-out evaluation: evaluate.py on the starting and the trained model, with the code
    # job's settings (network isolation: the source arrives as channel "code").
    "04-held-out": dict(
        jobs=2,
        program="evaluate.py",
        image=PYTORCH_IMAGE,
        instance_type="ml.g5.2xlarge",
        count=1,
        spot=False,
        checkpoint=False,
        torchrun=False,
        isolation=True,
        channels={"test", "model", "code"},
    ),
    "05": dict(
        jobs=1,
        program="grpo.py",
        image=PYTORCH_IMAGE,
        instance_type="ml.p5.48xlarge",
        count=1,
        spot=True,
        checkpoint=True,
        torchrun=True,
        isolation=False,
        channels={"train", "model"},
    ),
    "06": dict(
        jobs=2,
        program="evaluate.py",
        image=PYTORCH_IMAGE,
        instance_type="ml.g5.2xlarge",
        count=1,
        spot=False,
        checkpoint=False,
        torchrun=False,
        isolation=False,
        channels={"test", "model"},
    ),
}
# A metric each script must report (in its metric lines and metrics.jsonl).
EXPECTED_METRICS = {
    "sft.py": "loss",
    "dpo.py": "rewards_accuracies",
    "grpo.py": "reward",
    "code_rl.py": "test_pass_fraction",
    "evaluate.py": "accuracy",
}


def _decode(value: str):
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


def test_every_notebook_ran(notebook_run):
    failed = [
        f"{r['notebook']} at {r.get('cell')}: {r.get('error')}"
        for r in notebook_run.summary["notebooks"]
        if r["status"] != "ok"
    ]
    assert not failed, "\n".join(failed)
    ran = {r["notebook"][:2] for r in notebook_run.summary["notebooks"]}  # 00-06 jobs, 07+ sessions
    assert ran >= {p.name[:2] for p in run_notebooks.notebooks()} - set(run_notebooks.SUITE_LEAVES_OUT)


def test_summary_is_written_for_people(notebook_run):
    text = (notebook_run.out / "summary.md").read_text()
    for notebook in notebook_run.summary["notebooks"]:
        assert notebook["notebook"] in text
    assert "GSM8K accuracy" in text and "Training jobs" in text and str(notebook_run.out / "notebooks") in text
    assert json.loads((notebook_run.out / "summary.json").read_text())["ok"] is True


@pytest.mark.parametrize("prefix", sorted(EXPECTED_REQUESTS))
def test_jobs_completed_and_sent_their_cloud_request(notebook_run, prefix):
    expected = EXPECTED_REQUESTS[prefix]
    jobs = [job for job in notebook_run.jobs(prefix[:2]) if _program(job) == expected["program"]]
    assert len(jobs) == expected["jobs"], [j["job_name"] for j in notebook_run.jobs(prefix[:2])]
    for job in jobs:
        assert job["status"] == "Completed", f"{job['job_name']}: {job.get('failure_reason')}"
        request = job["request"]
        hyperparameters = {k: _decode(v) for k, v in request["HyperParameters"].items()}
        assert hyperparameters["sagemaker_program"] == expected["program"]
        assert request["AlgorithmSpecification"]["TrainingImage"] == expected["image"]
        assert request["ResourceConfig"]["InstanceType"] == expected["instance_type"]
        assert request["ResourceConfig"]["InstanceCount"] == expected["count"]
        assert bool(request.get("EnableManagedSpotTraining")) is expected["spot"]
        assert bool(request.get("EnableNetworkIsolation")) is expected["isolation"]
        assert bool(hyperparameters.get("sagemaker_torch_distributed_enabled")) is expected["torchrun"]
        assert {c["ChannelName"] for c in request["InputDataConfig"]} == expected["channels"]
        checkpoint = request.get("CheckpointConfig")
        assert bool(checkpoint) is expected["checkpoint"]
        if checkpoint:
            assert checkpoint["S3Uri"].startswith("s3://") and job["job_name"] in checkpoint["S3Uri"]
            assert checkpoint.get("LocalPath", "/opt/ml/checkpoints") == "/opt/ml/checkpoints"
        if expected["spot"]:
            stopping = request["StoppingCondition"]
            assert stopping["MaxWaitTimeInSeconds"] >= stopping["MaxRuntimeInSeconds"]
        # local mode's own record of the job agrees with what the notebook sent
        stored = json.loads((notebook_run.local_root / "jobs" / f"{job['job_name']}.json").read_text())
        assert stored["ResourceConfig"] == request["ResourceConfig"]
        assert stored["AlgorithmSpecification"]["TrainingImage"] == expected["image"]


def _program(job) -> str:
    """The script a job ran, from its request."""
    return _decode(job["request"]["HyperParameters"]["sagemaker_program"])


def _metrics_records(notebook_run, job) -> list[dict]:
    output = notebook_run.s3_file(job["model_data"].replace("model.tar.gz", "output.tar.gz"))
    with tarfile.open(output) as archive:
        member = next(m for m in archive.getmembers() if m.name.lstrip("./") == "metrics.jsonl")
        return [json.loads(line) for line in archive.extractfile(member).read().decode().splitlines() if line.strip()]


@pytest.mark.parametrize("prefix", ["01", "02", "03", "04", "05", "06"])
def test_metrics_are_in_the_output_archive_and_finite(notebook_run, prefix):
    assert notebook_run.jobs(prefix)
    for job in notebook_run.jobs(prefix):
        records = _metrics_records(notebook_run, job)
        assert records, job["job_name"]
        steps = [r["step"] for r in records]
        # in step order; a step may span two records (code RL logs its verdict rates apart)
        assert steps == sorted(steps), f"{job['job_name']}: steps {steps}"
        merged = merge_by_step(records)
        assert any(EXPECTED_METRICS[_program(job)] in r for r in merged), f"{job['job_name']}: {merged[-1]}"
        for record in records:
            for name, value in record.items():
                assert isinstance(value, (int, float)) and math.isfinite(value), f"{job['job_name']}: {name}={value}"


@pytest.mark.parametrize("prefix", ["01", "02", "03"])
def test_trained_models_load_and_run(notebook_run, prefix, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (job,) = notebook_run.jobs(prefix)
    with tarfile.open(notebook_run.s3_file(job["model_data"])) as archive:
        archive.extractall(tmp_path, filter="data")
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    ids = tokenizer("Natalia sold 48 clips.", return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    assert torch.isfinite(logits).all()


def test_grpo_model_was_evaluated_before_and_after(notebook_run):
    state = notebook_run.state
    evaluation = state["evaluation"]
    assert set(evaluation) == {"base", "trained", "held_out_change"}  # paired, with each model's answers
    for label in ("base", "trained"):
        assert 0.0 <= evaluation[label]["accuracy"] <= 1.0
        assert evaluation[label]["n_seen"] == evaluation[label]["n_unseen"] == evaluation[label]["n"] / 2
    # notebook 0's held-out problems: half of the training templates, half of templates never trained on
    assert sorted(evaluation["held_out_change"]["splits"]) == ["seen", "unseen"]
    requests = {job["job_name"]: job["request"] for job in notebook_run.jobs("06")}
    models = {
        name: next(
            c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"] if c["ChannelName"] == "model"
        )
        for name, request in requests.items()
    }
    assert models[evaluation["base"]["job_name"]].rstrip("/") == state["model"].rstrip("/")
    assert state["grpo_job"] in models[evaluation["trained"]["job_name"]]
    assert "accuracy" in (notebook_run.out / "summary.md").read_text()
    assert "- unseen templates (16 problems; " in (notebook_run.out / "summary.md").read_text()


def test_spot_job_was_interrupted_and_resumed_from_a_checkpoint(notebook_run):
    (job,) = notebook_run.jobs("05")
    stored = json.loads((notebook_run.local_root / "jobs" / f"{job['job_name']}.json").read_text())
    transitions = [t["Status"] for t in stored["SecondaryStatusTransitions"]]
    assert "Interrupted" in transitions, transitions
    assert transitions.index("Interrupted") < len(transitions) - 1 and transitions[-1] == "Completed"
    spot = notebook_run.state["spot"]
    assert spot["job_name"] == job["job_name"] and "simulated" in spot["note"]
    max_steps = run_notebooks.CI_PARAMETERS["05"]["max_steps"]
    assert spot["resumed_from_step"] is not None and 1 <= spot["resumed_from_step"] < max_steps
    assert job["final_metrics"]["step"] == max_steps
    assert 0 < spot["savings_percent"] < 100


def test_spot_job_checkpoints_are_deleted_from_s3_once_it_completed(notebook_run):
    """They served the resume; the completed job's model is in its archive, and S3 bills what it keeps."""
    (job,) = notebook_run.jobs("05")
    spot = notebook_run.state["spot"]
    assert spot["checkpoints_deleted"] is True and spot["checkpoint_mb"] > 0
    request = json.loads((notebook_run.local_root / "jobs" / f"{job['job_name']}.json").read_text())
    bucket, _, prefix = request["CheckpointConfig"]["S3Uri"].removeprefix("s3://").partition("/")
    left = [p for p in (notebook_run.local_root / "s3" / bucket / prefix).rglob("*") if p.is_file()]
    assert left == []
    said = f"its checkpoints in S3: {spot['checkpoint_mb']:.0f} MB, deleted once the job completed"
    assert said in (notebook_run.out / "summary.md").read_text()


def test_live_view_printed_progress_in_plain_text(notebook_run):
    nb = nbformat.read(str(notebook_run.out / "notebooks" / "03_boto3_grpo.ipynb"), as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    (job,) = notebook_run.jobs("03")
    steps = run_notebooks.CI_PARAMETERS["03"]["max_steps"]
    assert f"[{job['job_name']}] InProgress / Training" in text
    assert f"[{job['job_name']}] step {steps}/{steps}" in text and f"[{job['job_name']}] Completed" in text


def test_executed_notebooks_have_no_errors_and_show_plots(notebook_run):
    for path in sorted((notebook_run.out / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        assert not [o for o in outputs if o.get("output_type") == "error"], path.name
        if path.name[:2] in ("01", "02", "03", "05", "06"):
            assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} shows no plot"


def _curve(notebook_run, prefix: str, metric: str) -> list[float]:
    """The metric over the whole run, from the job's log (an interrupted job's archive holds only
    the steps of its last attempt)."""
    (job,) = [job for job in notebook_run.jobs(prefix) if _program(job) != "evaluate.py"]
    values = [r[metric] for r in run_notebooks.job_metrics(notebook_run.out, job) if metric in r]
    assert values, f"{job['job_name']} logged no {metric}"
    return values


def _ends(values: list[float]) -> tuple[float, float]:
    """Mean of the first and of the last quarter of a curve."""
    k = max(1, len(values) // 4)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def test_sft_loss_falls(notebook_run):
    first, last = _ends(_curve(notebook_run, "01", "loss"))
    assert last < 0.5 * first, (first, last)


@pytest.mark.parametrize("prefix", ["01", "11"])
def test_sft_job_scores_the_held_out_conversations_before_its_first_step_and_after_its_last(notebook_run, prefix):
    """Notebook 01's and 11's held-out lesson: the loss per answer token of test conversations the job never
    trains on, the starting model's at step 0 and the SFT model's after the last step, paired."""
    from helpers.results import recorded, rows

    (job,) = notebook_run.jobs(prefix)
    scored = [r for r in run_notebooks.job_metrics(notebook_run.out, job) if "eval_conversation_loss" in r]
    before, after = scored[0], scored[-1]
    assert [before["step"], after["step"]] == [0, run_notebooks.CI_PARAMETERS[prefix]["max_steps"]]
    assert after["eval_conversation_loss_before"] == pytest.approx(before["eval_conversation_loss"], rel=1e-3)
    assert after["eval_conversation_loss"] < before["eval_conversation_loss"], (before, after)
    (row,) = [
        r
        for r in rows(recorded(notebook_run.out / "work"))
        if r["what"].startswith("SFT (training job): held-out loss") and r["notebook"] == prefix
    ]
    assert row["verdict"] == "gain", row  # the loss fell beyond two standard errors of its paired change
    # the starting model's and the SFT model's greedy answers to the prompts that teach a format, paired; the
    # tiny model does not learn the format in these steps (0.000 -> 0.036 and 0.000 in the quick run)
    assert after["eval_format_share_before"] == before["eval_format_share"]
    assert after["eval_format_conversations"] == before["eval_format_conversations"] > 0
    (row,) = [
        r
        for r in rows(recorded(notebook_run.out / "work"))
        if r["what"].startswith("SFT (training job): held-out answers in the taught format") and r["notebook"] == prefix
    ]
    assert row["verdict"] in ("gain", "not a gain", "collapsed: not a gain") and "->" in row["distinct"], row


def test_session_sft_checks_the_format_of_its_held_out_answers_before_and_after(notebook_run):
    """Notebook 07 asks the same held-out prompts for a greedy answer before and after its loop and records the
    share in the taught format as a paired held-out change, with each model's answers counted."""
    from helpers.results import recorded, rows

    (record,) = [s for s in notebook_run.summary["training_sessions"] if s["notebook"].startswith("07")]
    held_out = record["held_out"]
    assert held_out["measure"] == "share of answers in the taught format"
    assert held_out["problems"] == held_out["before_answer_diversity"]["answers"] > 0
    assert held_out["change"] == pytest.approx(held_out["after"] - held_out["before"])
    (row,) = [
        r for r in rows(recorded(notebook_run.out / "work")) if r["notebook"] == "07" and "taught format" in r["what"]
    ]
    assert row["unit"] == "share of answers in the format" and row["judged"], row


def test_dpo_learns_to_prefer_the_chosen_answers(notebook_run):
    accuracies, margins = (
        _curve(notebook_run, "02", "rewards_accuracies"),
        _curve(notebook_run, "02", "rewards_margins"),
    )
    assert len(accuracies) == run_notebooks.CI_PARAMETERS["02"]["max_steps"]
    assert _ends(accuracies)[1] > _ends(accuracies)[0] + 0.2, accuracies
    assert _ends(margins)[1] > _ends(margins)[0] + 0.05, margins


def test_dpo_job_scores_the_held_out_pairs_before_its_first_step_and_after_its_last(notebook_run):
    from helpers.results import recorded, rows

    (job,) = notebook_run.jobs("02")
    scored = [r for r in run_notebooks.job_metrics(notebook_run.out, job) if "eval_likelihood_accuracy" in r]
    before, after = scored[0], scored[-1]
    assert [before["step"], after["step"]] == [0, run_notebooks.CI_PARAMETERS["02"]["max_steps"]]
    # Before the first step the policy is the reference: every implicit reward is 0, and the likelihood accuracy is
    # the starting model's. The untrained tiny model prefers the answer of fewer tokens: the rejected one that
    # stops after the last step, the chosen one over "The answer is <n>.", half the pairs each.
    assert before["eval_rewards_accuracies"] == 0 and before["eval_likelihood_accuracy_change"] == 0
    assert before["eval_likelihood_accuracy"] == 0.5 and 0 < before["eval_likelihood_accuracy_se"] < 0.1, before
    assert after["eval_reference_likelihood_accuracy"] == before["eval_likelihood_accuracy"]
    assert after["eval_likelihood_accuracy_change"] == pytest.approx(
        after["eval_likelihood_accuracy"] - before["eval_likelihood_accuracy"], abs=1e-3
    )
    # Measured with the CI parameters (20 steps of 8 pairs, lr 3e-3): 0.50 -> 1.00, +0.50 ± 0.09 (5.6 s.e.; at lr
    # 1e-3 it stayed 0.50). The summary's row (and the notebook's "What you saw") judge that paired change.
    (row,) = [r for r in rows(recorded(notebook_run.out / "work")) if r["what"].startswith("DPO (training job)")]
    assert row["notebook"] == "02" and row["before"].startswith("0.500 ±") and row["verdict"] == "gain", row


@pytest.mark.parametrize("prefix", ["03", "05"])
def test_grpo_reward_starts_above_zero_and_rises(notebook_run, prefix):
    rewards = _curve(notebook_run, prefix, "reward")
    assert len(rewards) == run_notebooks.CI_PARAMETERS[prefix]["max_steps"]
    first, last = _ends(rewards)
    assert first > 0.0, rewards  # the SFT model already earns some reward: the policy gets a gradient at once
    assert last > first + 0.1, rewards
    zero_std = _curve(notebook_run, prefix, "frac_reward_zero_std")
    assert sum(zero_std) / len(zero_std) < 0.75 and min(zero_std) < 1.0, zero_std
    assert max(_curve(notebook_run, prefix, "grad_norm")) > 0.0


def test_code_rl_writes_programs_more_often(notebook_run):
    first, last = _ends(_curve(notebook_run, "04", "no_code_rate"))
    assert last < first - 0.1, (first, last)


def _section(notebook_run, heading: str) -> str:
    """The summary's section under ``heading``, up to the next one."""
    return (notebook_run.out / "summary.md").read_text().split(heading, 1)[1].split("\n## ", 1)[0]


def _says_what_the_answers_allow(section: str, change: dict) -> None:
    """A summary section claims a gain only where the rule allows one (beyond two standard errors, and
    the trained model's answers not collapsed); where they collapsed, it says so and claims none."""
    after = change["after_answer_diversity"]
    assert stats.judge_change(change["change"], change["change_standard_error"], after) in section, section
    if stats.collapsed(after):
        assert stats.describe_answers(after) in section and ": a gain" not in section, section


def test_held_out_accuracy_counts_as_a_gain_only_when_the_answers_did_not_collapse(notebook_run):
    """Notebook 6's greedy evaluation on the same held-out problems before and after GRPO. A tiny model can
    raise its accuracy by giving one answer to most problems (it scores the problems whose reference is that
    answer): the rise counts only beyond two standard errors and without that collapse, and where the answers
    collapsed the summary says "collapsed" beside the figures."""
    evaluation = notebook_run.state["evaluation"]
    examples = run_notebooks.CI_PARAMETERS["06"]["max_eval_examples"]
    assert evaluation["trained"]["n"] == evaluation["base"]["n"] == examples
    change = evaluation["held_out_change"]
    assert change["before_answer_diversity"]["answers"] == change["after_answer_diversity"]["answers"] == examples
    section = _section(notebook_run, "## GSM8K accuracy on held-out problems")
    _says_what_the_answers_allow(section, change)
    after = change["after_answer_diversity"]
    if not stats.collapsed(after):
        assert stats.counts_as_gain(change["change"], change["change_standard_error"], after), change


def test_code_rl_held_out_solve_rate_is_measured_before_and_after_on_the_same_draws(notebook_run):
    """Notebook 4's two evaluation jobs: the starting model and the code-RL model on the same held-out
    problems; the summary states both figures and the paired change with their standard errors."""
    held_out = notebook_run.state["code_rl_evaluation"]
    assert held_out["data_set"] == "code" and held_out["examples"] == run_notebooks.CI_PARAMETERS["04"]["eval_examples"]
    models = {job["job_name"]: job["request"]["InputDataConfig"] for job in notebook_run.jobs("04")}
    (trained,) = [job["model_data"] for job in notebook_run.jobs("04") if _program(job) == "code_rl.py"]
    after = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in models[held_out["jobs"]["after"]]}
    assert after["model"] == trained
    assert "Code RL: held-out solve rate before and after" in (notebook_run.out / "summary.md").read_text()
    assert all(math.isfinite(held_out[k]) for k in ("before", "after", "change", "change_standard_error"))
    answers = held_out["examples"] * held_out["samples_per_example"]  # every program counted, before and after
    assert held_out["before_answer_diversity"]["answers"] == held_out["after_answer_diversity"]["answers"] == answers
    _says_what_the_answers_allow(_section(notebook_run, "## Code RL: held-out solve rate before and after"), held_out)


def test_summary_says_what_each_curve_shows(notebook_run):
    text = (notebook_run.out / "summary.md").read_text()
    assert "What the curves show" in text
    shown = {(c["notebook"][:2], c["metric"]) for c in notebook_run.summary["curves"]}
    assert {
        ("01", "loss"),
        ("02", "rewards_accuracies"),
        ("03", "reward"),
        ("04", "no_code_rate"),
        ("05", "reward"),
    } <= shown


def test_teacher_and_judge_notebook_accounts_for_every_request_and_shows_no_key(notebook_run):
    from local_mode.llm_server import LOCAL_API_KEY

    jobs = notebook_run.jobs("13")
    assert [j["status"] for j in jobs] == ["Completed"] * 3  # the teacher's data, then SFT on it and on the original
    nb = nbformat.read(str(notebook_run.out / "notebooks" / "13_teacher_and_judge.ipynb"), as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert '"requests":' in text and '"cached_hits":' in text and "retries" in text  # the teacher job's account
    assert "held-out accuracy" in text and "the change's, paired: ±" in text and "win rate" in text
    from environments.llm_judge import describe_judge, describe_win_rate, judge_too_weak

    result = notebook_run.state["teacher_and_judge"]
    rate, judge = result["win_rate"], result["judge"]
    usage = notebook_run.state["judge_usage"]
    parameters = run_notebooks.CI_PARAMETERS["13"]
    # the reward judge's groups, then the checked pairs and the held-out pairs, each asked in both orders
    asked = parameters["judge_groups"] * parameters["group_size"] + 2 * (judge["judgeable"] + parameters["held_out"])
    assert usage["requests"] + usage["failures"] == asked  # every verdict asked once: answered or failed, none lost
    assert usage["parse_failures"] <= usage["requests"] and usage["total_tokens"] > 0
    assert LOCAL_API_KEY not in (notebook_run.out / "notebooks" / "13_teacher_and_judge.ipynb").read_text()
    # The tiny judge writes no JSON, but its one-token choices are choices: every order of every pair answered.
    assert result["pairwise_verdicts"] == "one token"
    assert (rate["judged"], rate["failed"], rate["orders"]) == (parameters["held_out"], 0, 2 * parameters["held_out"])
    assert judge["judgeable"] >= 1 and judge["orders"] == 2 * judge["judgeable"]
    names = ("SFT on the teacher's answers", "the base model")
    # A judge too weak to judge is said to be, and its rate is said to say nothing
    assert ("this win rate says nothing" in text) == (judge_too_weak(judge, rate) is not None)
    # Three models on the same held-out problems, and each comparison paired on them
    accuracy, changes = result["held_out_accuracy"], result["held_out_changes"]
    assert set(accuracy) == {"base", "synthetic", "original"}
    assert {(c["before_model"], c["after_model"]) for c in changes.values()} == {
        ("base", "synthetic"),
        ("base", "original"),
        ("original", "synthetic"),
    }
    for change in changes.values():
        before, after = accuracy[change["before_model"]], accuracy[change["after_model"]]
        assert (change["before"], change["after"]) == (before["accuracy"], after["accuracy"])
        assert change["change"] == pytest.approx(after["accuracy"] - before["accuracy"])
        assert change["after_answer_diversity"]["answers"] == parameters["held_out"]
    summary = (notebook_run.out / "summary.md").read_text()
    assert "## Teacher and judge (notebook 13)" in summary
    assert describe_judge(judge) in summary and describe_win_rate(rate, judge, *names) in summary


def test_serving_notebook_judges_the_judge_then_each_served_model_against_the_base(notebook_run):
    """Notebook 14 judges with notebook 13's protocol: the judge on pairs the checker knows, then every served
    model against the base model in both orders, recorded for the summary with their standard errors."""
    from environments.llm_judge import describe_judge, describe_win_rate

    entry = next(s for s in notebook_run.summary["training_sessions"] if s["notebook"].startswith("14"))
    judge, rates = entry["judge"], entry["win_rates"]
    problems = run_notebooks.CI_PARAMETERS["14"]["held_out_problems"]
    assert "trained" in rates and set(entry["held_out_accuracy"]) == {"base", *rates}
    assert judge["judgeable"] >= 1 and judge["orders"] == 2 * judge["judgeable"]
    nb = nbformat.read(str(notebook_run.out / "notebooks" / "14_serve_and_deploy.ipynb"), as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    summary = (notebook_run.out / "summary.md").read_text()
    assert describe_judge(judge) in text and describe_judge(judge) in summary
    for label, rate in rates.items():
        assert (rate["judged"], rate["failed"], rate["orders"]) == (problems, 0, 2 * problems)
        said = describe_win_rate(rate, judge, f"{label} model", "base model")
        assert said in text and said in summary
    # the trained model against the base model, paired on the same problems, with each one's answer diversity
    held_out, accuracy = entry["held_out"], entry["held_out_accuracy"]
    assert (held_out["before"], held_out["after"]) == (accuracy["base"][0], accuracy["trained"][0])
    assert held_out["problems"] == problems and held_out["after_answer_diversity"]["answers"] == problems
    from helpers import results

    row = next(r for r in results.rows(notebook_run.summary) if r["notebook"] == "14")
    assert row["what"].startswith("08's model served") and "±" in row["change"]  # the summary's row, paired


def test_every_direction_the_summary_states_holds(notebook_run):
    """The summary claims no direction its own figures contradict (the curves without one, such as
    sampled accuracy, carry their reason instead)."""
    curves = run_notebooks.learning_curves(notebook_run.state, notebook_run.out)
    stated = [c for c in curves if c["should"]]
    assert {c["notebook"][:2] for c in stated} >= {"01", "02", "03", "04", "05"}
    assert [run_notebooks.render_curve(c) for c in stated if not c["holds"]] == []
    text = (notebook_run.out / "summary.md").read_text()
    assert "should" not in text and "and it did not" not in text
    assert all(run_notebooks.render_curve(c) in text for c in curves)
