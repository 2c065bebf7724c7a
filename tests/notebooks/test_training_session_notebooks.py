"""The training-session notebooks (07 onwards): hygiene, and what their local-mode run shows.

They run once, in the shared main-job run (fixture ``notebook_run``: papermill, CI parameters from
``tools/training_session_notebooks.py``, the SDK v3 kernel ``sagemaker-sdk-v3``); these tests read
the records each notebook left in ``<work_dir>/training_sessions.json``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from common import stats

from helpers.training_sessions import records
from tools import run_notebooks, training_session_notebooks
from tools.notebook_hygiene import cut_notebooks, kernel_environment, problems

REPO = Path(__file__).resolve().parents[2]
SESSION_NOTEBOOKS = sorted(
    p
    for p in (REPO / "notebooks").glob("[0-9][0-9]_*session_*.ipynb")
    if p.name >= "07" and p.name[:2] in training_session_notebooks.NOTEBOOKS
)


def test_the_session_notebooks_are_there():
    assert [p.name for p in SESSION_NOTEBOOKS] == [
        "07_training_session_sft.ipynb",
        "08_training_session_grpo.ipynb",
        "09_training_session_code_rl.ipynb",
        "10_training_session_boto3.ipynb",
        "12_training_session_dpo.ipynb",
        "15_training_session_tool_rl.ipynb",
        "16_training_session_distillation.ipynb",
    ]


@pytest.mark.parametrize("path", SESSION_NOTEBOOKS, ids=lambda p: p.name)
def test_session_notebook_is_clean_and_runs_in_the_sdk_v3_kernel(path):
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "sagemaker-sdk-v3"
    assert training_session_notebooks.kernel_name(path) == "sagemaker-sdk-v3"
    # The job notebooks' rules, but for the kernel, which is the SDK v3 environment's.
    assert [p for p in problems(nb) if not p.startswith("metadata.kernelspec")] == []
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(path)], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert lint.returncode == 0, lint.stdout


@pytest.mark.parametrize("path", SESSION_NOTEBOOKS, ids=lambda p: p.name)
def test_session_parameters_default_to_the_cloud(path):
    cell = next(c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code")
    assert "parameters" in cell.metadata.get("tags", [])
    values = {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(cell.source).body}
    assert values["run_mode"] == "auto" and {"region", "role", "work_dir"} <= set(values)
    assert values["base_model"] == "openai/gpt-oss-20b"  # served by training sessions (SDK's Region table)
    passed = set(run_notebooks.ci_parameters(path, Path("/tmp/w")))
    assert passed <= set(values), f"papermill would pass unknown {sorted(passed - set(values))}"


@pytest.mark.parametrize("path", SESSION_NOTEBOOKS, ids=lambda p: p.name)
def test_papermill_reads_every_session_parameter(path):
    import papermill

    cell = next(c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code")
    assigned = [node.targets[0].id for node in ast.parse(cell.source).body]
    # A line papermill cannot parse is left out of what it inspects (and `-p name value` is then "unknown").
    assert sorted(papermill.inspect_notebook(str(path))) == sorted(assigned)


LOOP_NOTEBOOKS = [p for p in SESSION_NOTEBOOKS if p.name[:2] in ("07", "08", "09")]


def _calls(tree: ast.AST) -> set[str]:
    return {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }


@pytest.mark.parametrize("path", LOOP_NOTEBOOKS, ids=lambda p: p.name)
def test_the_loop_is_written_in_the_notebook_and_stops_its_session_in_a_finally(path):
    cells = [ast.parse(c.source) for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]
    step = {"forward_backward", "optim_step"}
    if not path.name.startswith("07"):  # GRPO and code RL: a sampler, samples, rewards, advantages and datums first
        step |= {"save_weights_and_get_sampling_client", "sample_groups", "score_groups", "policy_gradient_datums"}
    assert any(step <= _calls(tree) for tree in cells), f"no cell of {path.name} holds the step {sorted(step)}"
    loops = [
        node
        for tree in cells
        for node in ast.walk(tree)
        if isinstance(node, ast.Try) and any(isinstance(n, ast.For) for n in node.body)
    ]
    assert loops, f"{path.name}: the loop over the steps is not inside a try"
    assert all("close_session" in _calls(ast.Module(body=t.finalbody, type_ignores=[])) for t in loops), (
        "the session must be stopped in the loop's finally, however the cell ends"
    )


def test_session_building_blocks_hold_no_second_copy_of_a_loop():
    """The loops live in the notebooks: the package holds their pieces, and no module calls the step's
    operations itself (nor runs as a command: a notebook runs from a terminal through papermill)."""
    for path in sorted((REPO / "helpers" / "training_sessions").glob("*.py")):
        calls = _calls(ast.parse(path.read_text()))
        assert "optim_step" not in calls, path.name  # a step ends in optim_step: that call is the notebook's
        # The custom-loss technique wraps forward_backward (a forward, then the weighted call); the
        # notebook still sends optim_step after it.
        if path.name != "logprob_loss.py":
            assert "forward_backward" not in calls, path.name
        assert "__main__" not in path.read_text(), path.name


# The cloud configuration each notebook's parameters promise: LoRA, learning rate, loss.
CLOUD = {
    "07": {"rank": 32, "alpha": 64, "learning_rate": 1e-4, "loss_fn": "cross_entropy"},
    "08": {"rank": 32, "alpha": 64, "learning_rate": 4e-5, "loss_fn": "importance_sampling"},
    "09": {"rank": 32, "alpha": 64, "learning_rate": 4e-5, "loss_fn": "importance_sampling"},
    "10": {"rank": 32, "alpha": 64, "learning_rate": 1e-4, "loss_fn": None},
    "12": {"rank": 32, "alpha": 64, "learning_rate": 1e-5, "loss_fn": "cross_entropy"},  # DPO lives in the weights
}


@pytest.fixture(scope="module")
def cloud_requests(tmp_path_factory) -> dict:
    """Each session notebook cut after its ``# NBVAL_CHECK_OUTPUT`` cell, run under nbval in the SDK v3
    kernel with its cloud parameters (only ``run_mode="local"`` and ``work_dir`` set; nothing before that
    cell reaches a service); an appended cell saves the requests the checked cell printed."""
    tmp_path = tmp_path_factory.mktemp("session-requests")
    dumps = tmp_path / "requests"
    dumps.mkdir()

    def save_requests(name: str) -> str:
        return (
            f"import json, pathlib\npathlib.Path({str(dumps / (name[:2] + '.json'))!r})"
            ".write_text(json.dumps(requests, default=str))"
        )

    notebooks = [
        p
        for p in cut_notebooks(tmp_path, tmp_path / "work", save_requests, kernel="sagemaker-sdk-v3")
        if "_session_" in p.name
    ]  # 11, a training job in the same kernel, has its own test module
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nbval-lax",
            "--nbval-kernel-name",
            "sagemaker-sdk-v3",
            "-p",
            "no:cacheprovider",
            "--nbval-sanitize-with",
            str(REPO / "tests" / "notebooks" / "nbval_sanitize.cfg"),
            "-c",
            str(tmp_path / "pytest.ini"),
            "--rootdir",
            str(tmp_path),
            "-q",
            *map(str, notebooks),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=kernel_environment(tmp_path / "sagemaker-local"),
        timeout=300,
    )
    return {
        "nbval": result,
        "count": len(notebooks),
        "requests": {p.stem: json.loads(p.read_text()) for p in dumps.glob("*.json")},
    }


def test_session_request_cells_match_their_stored_outputs(cloud_requests):
    result = cloud_requests["nbval"]
    # The notebooks that preview their requests in a checked cell; 15 and 16 build on 08's and have none.
    previewing = [p for p in SESSION_NOTEBOOKS if p.name[:2] in ("07", "08", "09", "10", "12")]
    assert cloud_requests["count"] == len(previewing)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


@pytest.mark.parametrize("prefix", sorted(CLOUD))
def test_session_requests_are_the_cloud_configuration_and_valid(cloud_requests, prefix):
    import botocore.session
    from botocore.validate import validate_parameters

    expected, requests = CLOUD[prefix], cloud_requests["requests"].get(prefix)
    assert requests is not None, f"notebook {prefix} saved no requests: {cloud_requests['nbval'].stdout[-3000:]}"
    create, operation = requests["CreateTrainingSession"], requests["ExecuteTrainingOperation"]
    assert create["LoraConfig"] == {"Rank": expected["rank"], "Alpha": expected["alpha"]}
    assert "openai/gpt-oss-20b" in create["ModelConfig"]["BaseModelArn"]
    assert create["TrainingSessionName"] in create["OutputConfig"]["S3Location"]["Path"]
    adam = operation["optimizerStep"]["adamParamsConfig"]
    assert adam["learningRate"] == expected["learning_rate"] and adam["gradClipNorm"] == 1.0
    assert adam["weightDecay"] == 0.0
    if expected["loss_fn"]:
        assert requests["forwardBackward (without its datums)"]["lossFnName"] == expected["loss_fn"]
    # botocore accepts both (types, required members, minima), as it would before sending them; the role is
    # the reader's to set (None in the parameters, "<role>" in the preview).
    assert create["RoleArn"] == "<role>"
    session = botocore.session.get_session()
    validate_parameters(
        {**create, "RoleArn": "arn:aws:iam::123456789012:role/SageMakerRole"},
        session.get_service_model("sagemaker").operation_model("CreateTrainingSession").input_shape,
    )
    runtime = session.get_service_model("sagemakertrainingsessionruntime")
    validate_parameters(
        {"trainingSessionName": create["TrainingSessionName"], "sequenceNumber": 2, "operationConfig": operation},
        runtime.operation_model("ExecuteTrainingOperation").input_shape,
    )


def _record(notebook_run, prefix: str) -> dict:
    ran = {r["notebook"]: r for r in notebook_run.summary["notebooks"]}
    name = next(n for n in ran if n.startswith(prefix))
    assert ran[name]["status"] == "ok", ran[name]
    return next(s for s in notebook_run.summary["training_sessions"] if s["notebook"].startswith(prefix))


def test_session_sft_lowers_the_loss_and_is_billed(notebook_run):
    record = _record(notebook_run, "07")
    assert record["status"] == "Stopped"  # stopped at the end
    assert record["steps"] == training_session_notebooks.CI_PARAMETERS["07"]["max_steps"]
    first, last = record["first_loss"], record["final_metrics"]["loss"]
    assert last < first - 0.3, (first, last)
    held_out = record["held_out_loss"]
    before, after = held_out["before"], held_out["after"]
    assert after["loss"] < before["loss"] - 2 * max(before["standard_error"], after["standard_error"]), held_out
    billed = record["billable_tokens"]
    # Every training token of every step is billed; the estimate before launch is within 20 %.
    assert (
        billed["training"] > 0
        and abs(billed["training"] - record["estimated_training_tokens"]) < 0.2 * record["estimated_training_tokens"]
    )


def test_session_grpo_raises_the_reward(notebook_run):
    record = _record(notebook_run, "08")
    assert record["status"] == "Stopped"
    assert record["reward"]["last_third"] > record["reward"]["first_third"], record["reward"]
    # Held-out accuracy on 64 problems x 16 answers each, the same sampling seeds before and after.
    held_out = record["held_out"]
    # a rise counts only when the answers did not collapse into one (most of them the same number)
    assert held_out["after"] > held_out["before"] and not stats.collapsed(held_out["after_answer_diversity"]), held_out
    assert 0 < held_out["change_standard_error"] < 0.1 and held_out["problems"] == 64, held_out
    assert held_out["after_answer_diversity"]["answers"] == 64 * 16, held_out
    # half the held-out problems in the training wording (recall), half in words never trained on (transfer)
    assert {name: part["n"] for name, part in held_out["splits"].items()} == {"seen": 32, "unseen": 32}, held_out
    assert record["final_metrics"]["clip_fraction"] == 0  # on-policy: every ratio is 1
    assert record["billable_tokens"]["sample"] > 0 and record["billable_tokens"]["training"] > 0
    summary = (notebook_run.out / "summary.md").read_text()
    assert "## Training sessions" in summary
    assert all(line in summary for line in records.held_out_lines(held_out)), held_out


def test_session_grpo_resumed_with_its_optimizer_repeats_the_steps_and_without_it_does_not(notebook_run):
    resume = _record(notebook_run, "08")["resume"]
    assert (resume["from_step"], resume["steps"]) == (8, 2)
    # A new session from save_state with the optimizer: the same samples, rewards, losses and ratios as the
    # run that never stopped. From the weights alone, AdamW restarts its moments and the second step parts.
    assert resume["largest_difference"]["with the optimizer"] <= 1e-6, resume
    assert resume["largest_difference"]["weights only"] > 1e-5, resume


def test_session_code_rl_judges_every_step_in_the_sandbox_while_sampling(notebook_run):
    record = _record(notebook_run, "09")
    assert record["status"] == "Stopped"
    assert record["steps"] == training_session_notebooks.CI_PARAMETERS["09"]["max_steps"]
    assert 0 < record["no_code_rate"]["first_quarter"] < 1  # some completions hold a program, some not
    final = record["final_metrics"]
    assert {"accepted_rate", "wrong_answer_rate", "runtime_error_rate", "test_pass_fraction", "judge_time"} <= set(
        final
    )
    assert final["judge_time"] > 0  # the sandbox pool judged the last step's programs
    assert record["billable_tokens"]["sample"] > 0 and record["billable_tokens"]["training"] > 0
    summary = (notebook_run.out / "summary.md").read_text()
    assert "09_training_session_code_rl" in summary and "completions without a program" in summary
    # the held-out programs counted before and after, and the summary's verdict on the change is the rule's
    held_out, parameters = record["held_out"], training_session_notebooks.CI_PARAMETERS["09"]
    answers = parameters["held_out_problems"] * parameters["held_out_samples"]
    assert held_out["before_answer_diversity"]["answers"] == held_out["after_answer_diversity"]["answers"] == answers
    assert all(line in summary for line in records.held_out_lines(held_out)), held_out


def test_session_code_rl_writes_programs_more_often(notebook_run):
    record = _record(notebook_run, "09")
    no_code = record["no_code_rate"]
    # Its steps draw their problems from (seed, step) (resumable); measured 0.708 -> 0.604 with the CI parameters.
    assert no_code["last_quarter"] < no_code["first_quarter"] - 0.05, no_code
    # Each step trains on samples one update old, so the ratio stays near 1 (measured: sampler_kl at most 0.004);
    # samples that did not follow the updates drifted to 0.36 at learning rate 1e-3.
    assert abs(record["final_metrics"]["sampler_kl"]) < 0.05, record["final_metrics"]


def test_raw_api_notebook_steps_with_sequence_numbers_and_deletes_its_session(notebook_run):
    ran = {r["notebook"]: r for r in notebook_run.summary["notebooks"]}
    assert ran["10_training_session_boto3.ipynb"]["status"] == "ok", ran["10_training_session_boto3.ipynb"]
    executed = nbformat.read(notebook_run.out / "notebooks" / "10_training_session_boto3.ipynb", as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    steps = training_session_notebooks.CI_PARAMETERS["10"]["max_steps"]
    losses = [float(line.split("loss per answer token ")[1]) for line in text.splitlines() if "loss per answer" in line]
    assert len(losses) == steps and losses[-1] < losses[0], losses
    assert f"LastReceivedSequenceNumber {2 * steps}" in text  # the retried client token ran nothing new
    assert "\nTrue\n" in text and "deleted raw-api-sft-" in text


def test_session_dpo_raises_preference_accuracy_and_margin(notebook_run):
    record = _record(notebook_run, "12")
    assert record["status"] == "Stopped"  # stopped in the loop cell's finally
    assert record["steps"] == training_session_notebooks.CI_PARAMETERS["12"]["max_steps"]
    preference = record["preference"]
    accuracy, margin = preference["accuracy"], preference["margin"]
    # Measured with the CI parameters (16 steps of 16 pairs, lr 3e-3), first quarter -> last quarter of the steps:
    # accuracy 0.781 -> 1.000, margin 0.391 -> 1.669. The session is deterministic (fp32, one thread, seeded
    # LoRA and batch order); the margins below leave room for another CPU's rounding.
    assert accuracy["last_quarter"] > accuracy["first_quarter"] + 0.2, accuracy
    assert margin["last_quarter"] > margin["first_quarter"] + 0.1, margin
    # The first step's rewards are exactly 0: the reference is the session's own forward before any update.
    assert preference["held_out_before"]["reward_accuracy"] == 0 and preference["held_out_before"]["margin"] == 0
    # (to fp32 rounding: the step's forward batches the pairs by length, the reference pass in its own batches)
    assert record["first_step"]["rewards_margins"] == pytest.approx(0, abs=1e-6) and record["first_step"][
        "loss"
    ] == pytest.approx(0.693147, abs=1e-6)
    before, after = preference["held_out_before"], preference["held_out_after"]
    assert after["pairs"] == training_session_notebooks.CI_PARAMETERS["12"]["held_out_pairs"]
    assert after["margin_se"] > 0
    # The untrained tiny model prefers the answer of fewer tokens: the rejected one that stops after the last step,
    # the chosen one over "The answer is <n>.", half the pairs each (local_mode.offline_data.preference_records).
    assert before["likelihood_accuracy"] == 0.5 and 0 < before["likelihood_accuracy_se"] < 0.1, before
    # The paired change is recorded with its standard error, from the same pairs before and after.
    assert len(before["chosen_more_likely"]) == len(after["chosen_more_likely"]) == after["pairs"]
    changed = sum(after["chosen_more_likely"]) - sum(before["chosen_more_likely"])
    assert preference["held_out_change"] == pytest.approx(changed / after["pairs"])
    assert preference["held_out_change_se"] >= 0
    # The technique's second pass: the loop's forward passes read every training token once more (prefill).
    billed = record["billable_tokens"]
    assert preference["second_pass_prefill_tokens"] == billed["training"] > 0
    assert billed["prefill"] > billed["training"]  # plus the reference and the held-out scoring
    summary = (notebook_run.out / "summary.md").read_text()
    assert "12_training_session_dpo" in summary and "preference accuracy, first quarter" in summary
    assert "held-out likelihood accuracy, paired change" in summary


def test_the_summary_gives_held_out_figures_with_their_standard_errors_and_the_test_pass_fraction():
    held_out = {
        "before": 0.3,
        "before_standard_error": 0.04,
        "after": 0.35,
        "after_standard_error": 0.041,
        "change_standard_error": 0.02,
        "problems": 64,
        "samples_per_problem": 16,
    }
    base = {"status": "Stopped", "steps": 8, "final_metrics": {}, "billable_tokens": {}}
    lines = "\n".join(
        training_session_notebooks.render(
            [
                {
                    **base,
                    "notebook": "08_training_session_grpo",
                    "session": "a",
                    "held_out": held_out,
                    "resume": {"from_step": 0, "steps": 2, "largest_difference": {}},
                },  # a profile that skips it
                {
                    **base,
                    "notebook": "08_training_session_grpo",
                    "session": "c",
                    "held_out": held_out,
                    "resume": {"from_step": 8, "steps": 2, "largest_difference": {"with the optimizer": 0.0}},
                },
                {
                    **base,
                    "notebook": "09_training_session_code_rl",
                    "session": "b",
                    "test_pass_fraction": {"first_quarter": 0.0, "last_quarter": 0.125},
                    "held_out": {**held_out, "measure": "solve rate"},
                },
            ]
        )
    )
    assert "held-out accuracy 0.300 ± 0.040 -> 0.350 ± 0.041" in lines and "paired: ± 0.020" in lines
    assert "held-out solve rate 0.300 ± 0.040" in lines and "64 problems x 16 answers" in lines
    assert "test pass fraction, first quarter 0.000, last quarter 0.125" in lines
    assert "no resume in this run (resume_from_step = 0: the loop saved no checkpoint)" in lines
    assert "resumed from the checkpoint after step 8 for 2 steps, largest difference from the uninterrupted steps: with the optimizer 0" in lines  # fmt: skip
