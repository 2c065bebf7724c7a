"""code_rl.py end to end through the container contract, and the judges' protocol with real programs.

The script runs as the SageMaker toolkit starts it: cwd = the code folder, ``SM_*`` variables,
hyperparameters in ``SM_HPS``, the data and the tiny model as channels; under torchrun with gloo for
two processes (rank 0 learns, rank 1 judges) and as one process (rank 0 judges too).
"""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from container_env import container_env, run_script, script_command


def run(command: list[str], env: dict[str, str], timeout: int = 240) -> subprocess.CompletedProcess:
    return run_script(command, env, timeout=timeout, merge_output=True)


HYPERPARAMETERS = {
    "max_steps": 2,
    "prompts_per_step": 2,
    "group_size": 2,
    "micro_batch_size": 2,
    "max_new_tokens": 16,
    "judge_workers": 1,
    "judge_timeout": 120,
    "max_tests": 2,
    "checkpoint_every": 0,
}


def one_record_per_step(log: str, metrics_file: Path, steps: list[int]) -> list[dict]:
    """The job printed one metric line per step and wrote one metrics.jsonl object per step, each with
    GRPO's metrics and the judge's verdict rates together."""
    lines = re.findall(r"^step=\d+ .*$", log, re.MULTILINE)
    assert [int(line.split()[0][len("step=") :]) for line in lines] == steps, lines
    for line in lines:
        assert " reward=" in line and " loss=" in line and " accepted_rate=" in line and " judge_time=" in line
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    assert [r["step"] for r in records] == steps
    for record in records:
        assert {
            "reward",
            "loss",
            "accepted_rate",
            "wrong_answer_rate",
            "no_code_rate",
            "test_pass_fraction",
            "judge_time",
        } <= set(record)
        assert abs(sum(v for k, v in record.items() if k.endswith("_rate")) - 1.0) < 1e-9  # verdict shares
    return records


@pytest.mark.parametrize("processes", [2, 1])
def test_code_rl_trains_with_judges(tmp_path, offline_data, tiny_model_path, processes):
    hyperparameters, data_set = dict(HYPERPARAMETERS), "code"
    if processes == 1:  # also resumed: 3 steps with a checkpoint after step 2 only
        hyperparameters.update(max_steps=3, checkpoint_every=2)
    else:  # functions to complete, judged by calls on the remote judge; completions end at a closing fence
        hyperparameters.update(stop="\n```\n")
        data_set = "functions"
    env = container_env(tmp_path, {"train": offline_data[data_set], "model": tiny_model_path}, hyperparameters)
    command = script_command("code_rl.py", nproc=processes)
    done = run(command, env)
    assert done.returncode == 0, done.stdout[-4000:]
    log = done.stdout
    # The judging rank attacked its sandbox first and said which layers it has.
    assert "sandbox self-test: fork bomb: sandbox_violation contained" in log
    assert "sandbox self-test passed" in log and "seccomp=" in log and "landlock=" in log
    if processes == 2:
        assert "judge: " in log and "stopping" in log  # rank 1 was told to stop at the end
    metrics_file = tmp_path / "output" / "data" / "metrics.jsonl"
    steps = list(range(1, hyperparameters["max_steps"] + 1))
    first_run = one_record_per_step(log, metrics_file, steps)
    assert (tmp_path / "model" / "config.json").is_file()
    assert not (tmp_path / "output" / "failure").exists()
    if processes == 2:
        return
    # As after a spot interruption that came after step 3 was logged but before it was checkpointed:
    # the restarted job redoes step 3 only, and metrics.jsonl still holds one record per step.
    done = run(command, env)
    assert done.returncode == 0, done.stdout[-4000:]
    resumed = re.findall(r"^step=\d+ .*$", done.stdout, re.MULTILINE)
    assert [line.split()[0] for line in resumed] == ["step=3"], resumed
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    assert [r["step"] for r in records] == steps
    assert records[:2] == first_run[:2] and "accepted_rate" in records[2] and "loss" in records[2]


JOB = Path(__file__).with_name("remote_judge_job.py")


def test_remote_judges_return_verdicts_in_order(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = run(script_command(str(JOB), ["judge"], nproc=3), env)
    assert done.returncode == 0, done.stdout[-4000:]
    results = json.loads(done.stdout.split("RESULTS ", 1)[1].splitlines()[0])
    assert [r["verdict"] for r in results] == [
        "accepted",
        "wrong_answer",
        "time_limit",
        "accepted",
        "sandbox_violation",
        "runtime_error",
    ]
    assert [r["reward"] for r in results] == [1.0, 0.5, 0.0, 1.0, 0.0, 0.0]


def test_a_failing_judge_fails_the_learner_without_hanging(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = run(script_command(str(JOB), ["broken"], nproc=2), env, timeout=120)
    assert "judge rank 1 failed: SandboxError" in done.stdout, done.stdout[-4000:]
    assert "JUDGES STOPPED" in done.stdout  # rank 0 still told the judges to stop, and they did


@pytest.mark.parametrize(
    "options, message",
    [
        (["--time_limit", "0"], "--time_limit must be positive, got 0.0 (seconds)."),
        (["--judge_timeout", "-5"], "--judge_timeout must be positive, got -5.0 (seconds)."),
        (["--memory_limit_mb", "0"], "--memory_limit_mb must be at least 1, got 0."),
        (["--max_tests", "-1"], "--max_tests cannot be negative, got -1"),
        (["--group_size", "1"], "at least 2 completions"),  # GRPO's own checks hold too
    ],
)
def test_bad_judging_options_are_refused(options, message):
    import code_rl
    from common.contract import UserError

    args = code_rl.parse_args(options)
    with pytest.raises(UserError, match=re.escape(message)):
        args.validate(world_size=1)  # what main() does on every rank before its sandbox starts


def test_help_lists_the_grpo_and_judging_options(capsys):
    import code_rl

    with pytest.raises(SystemExit):
        code_rl.parse_args(["--help"])
    grpo_part, judging = capsys.readouterr().out.split("\nGRPO:\n")[1].split("\njudging:\n")
    judging = " ".join(judging.split())  # as one line, whatever the terminal's width
    assert "--group_size" in grpo_part and "--reward_mode {fraction,all_or_nothing}" in judging
    assert "--self_test SELF_TEST attack the sandbox" in judging and "if any escapes (default: True)" in judging
