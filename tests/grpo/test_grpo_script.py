"""grpo.py and evaluate.py end to end through the container contract, as the SageMaker toolkit runs
them: ``python grpo.py --key value`` with the code folder as working directory, SM_* variables,
channels as folders. Also: resume after SIGKILL and after SIGTERM gives the uninterrupted result,
and two processes under torchrun (gloo) train together."""

import json
import math
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from common import stats
from container_env import container_env, run_script
from safetensors.torch import load_file

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
PYTHON = sys.executable
METRIC = r"\b{}=(-?[0-9.]+(?:[eE][-+]?[0-9]+)?)"  # the notebooks' metric_definitions regex
GRPO_OPTIONS = [
    "--max_steps",
    "6",
    "--prompts_per_step",
    "2",
    "--group_size",
    "4",
    "--micro_batch_size",
    "4",
    "--max_new_tokens",
    "12",
    "--learning_rate",
    "1e-3",
    "--beta",
    "0.04",
    "--num_iterations",
    "2",
    "--checkpoint_every",
    "2",
    "--seed",
    "3",
]


def grpo_command(model_path, root, *extra):
    return [
        PYTHON,
        "grpo.py",
        "--model_name_or_path",
        str(model_path),
        "--checkpoint_dir",
        str(root / "checkpoints"),
        *GRPO_OPTIONS,
        *extra,
    ]


def run(command, env, timeout=240):
    result = run_script(command, env, timeout=timeout, merge_output=True)
    return result.returncode, result.stdout


def metric_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("step=")]


def final_weights(root: Path) -> dict[str, torch.Tensor]:
    return load_file(root / "model" / "model.safetensors")


def comparable(records: list[dict]) -> list[dict]:
    """Metric records without the timings (which differ from run to run)."""
    return [{k: v for k, v in r.items() if not k.endswith("_time")} for r in records]


def read_metrics(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "output" / "data" / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def digit_task(tiny_model_path, tmp_path_factory):
    """GSM8K-format rows "Pick a digit." / "#### 7" and the tiny model after a few seconds of SFT to
    answer any question with one random digit: rewards are then mixed within groups, the policy
    moves, and the resume tests compare runs that actually train."""
    from common import generation
    from environments.gsm8k import GSM8KEnvironment
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("digit-task")
    (root / "train").mkdir()
    (root / "train" / "train.jsonl").write_text(json.dumps({"question": "Pick a digit.", "answer": "#### 7"}) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    prompt = generation.prompt_token_ids(tokenizer, GSM8KEnvironment().prompt_messages({"question": "Pick a digit."}))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    for step in range(30):
        answers = [
            tokenizer(str((step * 7 + i) % 10), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            for i in range(20)
        ]
        input_ids = torch.tensor([prompt + answer for answer in answers])
        labels = torch.tensor([[-100] * len(prompt) + answer for answer in answers])
        model(input_ids=input_ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.set_num_threads(threads)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root / "model", root / "train"


@pytest.fixture(scope="module")
def reference_run(digit_task, tmp_path_factory):
    """One uninterrupted run on the digit task, the yardstick of the resume tests."""
    model_path, train = digit_task
    root = tmp_path_factory.mktemp("grpo-reference")
    code, output = run(grpo_command(model_path, root), container_env(root, {"train": train}))
    assert code == 0, output
    # the run trained: some groups had mixed rewards and the weights moved
    assert any(r["frac_reward_zero_std"] < 1 for r in read_metrics(root)), output
    start = load_file(model_path / "model.safetensors")
    assert any(not torch.equal(start[name], tensor) for name, tensor in final_weights(root).items())
    return root, output


def test_grpo_end_to_end(tiny_model_path, offline_data, tmp_path):
    root = tmp_path
    code, output = run(
        grpo_command(tiny_model_path, root, "--max_steps", "4"), container_env(root, {"train": offline_data["gsm8k"]})
    )
    assert code == 0, output
    lines = metric_lines(output)
    assert [line.split()[0] for line in lines] == ["step=1", "step=2", "step=3", "step=4"]
    for name in (
        "reward",
        "reward_std",
        "accuracy",
        "kl",
        "clip_ratio",
        "completion_length",
        "loss",
        "lr",
        "gen_time",
        "reward_time",
        "train_time",
    ):
        values = [float(m.group(1)) for line in lines for m in [re.search(METRIC.format(name), line)] if m]
        assert len(values) == 4, f"{name} missing in {lines}"
        assert all(math.isfinite(v) for v in values), (name, values)
    assert all(re.fullmatch(r"step=\d+( [a-z0-9_]+=-?[0-9.]+(e[-+]?\d+)?)+", line) for line in lines), lines
    assert [r["step"] for r in read_metrics(root)] == [1, 2, 3, 4]
    assert float(re.search(METRIC.format("completion_length"), lines[0]).group(1)) > 0
    # the model saved is reloadable and generates
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(root / "model")
    tokenizer = AutoTokenizer.from_pretrained(root / "model")
    ids = tokenizer("Natalia sold", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape[1] == ids.shape[1] + 3
    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == ["step_00000002", "step_00000004"]


def assert_same_as_reference(root: Path, reference_root: Path):
    reference = final_weights(reference_root)
    resumed = final_weights(root)
    assert reference.keys() == resumed.keys()
    for name in reference:
        torch.testing.assert_close(resumed[name], reference[name], rtol=1e-6, atol=1e-7, msg=name)
    assert comparable(read_metrics(root)) == comparable(read_metrics(reference_root))


def test_resume_after_sigkill_matches_uninterrupted(reference_run, digit_task, tmp_path):
    model_path, train = digit_task
    env = container_env(tmp_path, {"train": train})
    process = subprocess.Popen(
        grpo_command(model_path, tmp_path),
        cwd=SCRIPTS,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = []
    for line in process.stdout:
        output.append(line)
        if line.startswith("step=3 "):  # the checkpoint of step 2 is written; steps 4 to 6 are to come
            process.kill()  # an instance gone without warning
            break
    process.wait()
    assert process.returncode == -signal.SIGKILL, "".join(output)
    assert (tmp_path / "checkpoints" / "step_00000002" / "manifest.json").is_file()
    assert not (tmp_path / "model" / "model.safetensors").exists()

    code, output = run(grpo_command(model_path, tmp_path), env)
    assert code == 0, output
    assert "resumed from" in output and metric_lines(output)[0].startswith("step=3 ")
    assert_same_as_reference(tmp_path, reference_run[0])  # step 3, logged twice, is recorded once


def test_resume_after_sigterm_matches_uninterrupted(reference_run, digit_task, tmp_path):
    model_path, train = digit_task
    env = container_env(tmp_path, {"train": train})
    process = subprocess.Popen(
        grpo_command(model_path, tmp_path),
        cwd=SCRIPTS,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = []
    for line in process.stdout:
        output.append(line)
        if line.startswith("step=1 "):
            process.send_signal(signal.SIGTERM)  # what SageMaker sends before a spot instance goes
    assert process.wait(timeout=120) == 0, "".join(output)
    stopped_at = int(metric_lines("".join(output))[-1].split()[0].removeprefix("step="))
    assert 1 <= stopped_at < 6 and "SIGTERM" in "".join(output)  # it stops at the end of the step it was in
    assert (tmp_path / "checkpoints" / f"step_{stopped_at:08d}" / "manifest.json").is_file()
    assert not (tmp_path / "model" / "model.safetensors").exists()
    assert not (tmp_path / "output" / "failure").exists()

    code, output = run(grpo_command(model_path, tmp_path), env)
    assert code == 0, output
    assert_same_as_reference(tmp_path, reference_run[0])


@pytest.mark.parametrize("strategy", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_two_learners_under_torchrun(tiny_model_path, offline_data, tmp_path, strategy):
    torchrun = shutil.which("torchrun", path=str(Path(PYTHON).parent))
    command = [
        torchrun,
        "--standalone",
        "--nproc_per_node",
        "2",
        "grpo.py",
        "--model_name_or_path",
        str(tiny_model_path),
        "--checkpoint_dir",
        str(tmp_path / "checkpoints"),
        "--max_steps",
        "2",
        "--prompts_per_step",
        "2",
        "--group_size",
        "4",
        "--micro_batch_size",
        "2",
        "--max_new_tokens",
        "8",
        "--learning_rate",
        "1e-3",
        "--checkpoint_every",
        "1",
        "--strategy",
        strategy,
        "--beta",
        "0.04",
        "--num_iterations",
        "2",
    ]
    code, output = run(command, container_env(tmp_path, {"train": offline_data["gsm8k"]}))
    assert code == 0, output
    assert [line.split()[0] for line in metric_lines(output)] == ["step=1", "step=2"]  # rank 0 only
    assert "backend gloo" in output
    assert (tmp_path / "model" / "model.safetensors").is_file()
    assert (tmp_path / "checkpoints" / "step_00000002" / "manifest.json").is_file()


def test_bad_data_row_fails_with_reason(tiny_model_path, tmp_path):
    train = tmp_path / "train"
    train.mkdir()
    (train / "train.jsonl").write_text(
        '{"question": "What is 1 + 1?", "answer": "1 + 1 = 2\\n#### 2"}\n'
        '{"question": "What is 2 + 2?", "answer": "4"}\n'
    )
    code, output = run(grpo_command(tiny_model_path, tmp_path), container_env(tmp_path, {"train": train}))
    assert code != 0
    reason = (tmp_path / "output" / "failure").read_text()
    assert "train.jsonl, line 2" in reason and "####" in reason, reason


@pytest.mark.parametrize(
    "options,message",
    [
        (["--micro_batch_size", "3"], "--micro_batch_size 3 must divide"),
        (["--prompts_per_step", "3"], "--prompts_per_step 3 must be a multiple of the number of learners (2)"),
        (["--group_size", "1"], "at least 2 completions"),
        (["--temperature", "0"], "--temperature must be positive"),
        (["--micro_batch_size", "0"], "--micro_batch_size must be at least 1, got 0."),  # not a ZeroDivisionError
        (["--log_every", "0"], "--log_every must be at least 1, got 0."),
    ],
)
def test_bad_options_are_refused_with_the_option_named(options, message):
    import grpo
    from common import distributed
    from common.contract import UserError

    args = grpo.parse_args(["--prompts_per_step", "4", "--group_size", "4", *options])
    learners = distributed.Learners(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    with pytest.raises(UserError, match=re.escape(message)):
        args.validate(learners.world_size)


def test_unknown_hyperparameter_is_refused():
    import grpo
    from common.contract import UserError

    with pytest.raises(UserError, match="group_size"):
        grpo.parse_args(["--group_sizes", "4"])


def test_evaluate_end_to_end(tiny_model_path, offline_data, tmp_path):
    # The model arrives as channel 'model' (which wins over --model_name_or_path) holding a training
    # job's model.tar.gz, which SageMaker does not unpack.
    import tarfile

    channel = tmp_path / "model-channel"
    channel.mkdir()
    with tarfile.open(channel / "model.tar.gz", "w:gz") as archive:
        for file in Path(tiny_model_path).iterdir():
            archive.add(file, arcname=file.name)
    env = container_env(tmp_path, {"test": offline_data["gsm8k"], "model": channel})
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    code, output = run(
        [
            PYTHON,
            "evaluate.py",
            "--model_name_or_path",
            "Qwen/does-not-exist",
            "--environment",
            "gsm8k",
            "--max_new_tokens",
            "8",
            "--generate_batch_size",
            "3",
        ],
        env,
    )
    assert code == 0, output
    line = metric_lines(output)[0]
    # the offline set's test split: half seen templates, half unseen, each with its own figures
    split = r"accuracy_{0}=[0-9.]+ standard_error_{0}=[0-9.e-]+ n_{0}=4"
    whole = r"step=0 accuracy=[0-9.]+ standard_error=[0-9.e-]+ mean_reward=[0-9.]+ n=8"
    assert re.fullmatch(f"{whole} {split.format('seen')} {split.format('unseen')}", line), line
    unpacked = [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith("model-channel-")]
    assert len(unpacked) == 1 and (unpacked[0] / "config.json").is_file()
    assert json.loads((tmp_path / "model" / "evaluation.json").read_text())["model"] == str(unpacked[0])
    for folder in (tmp_path / "output" / "data", tmp_path / "model"):
        result = json.loads((folder / "evaluation.json").read_text())
        assert result["n"] == 8 and len(result["records"]) == 8
        assert [r["index"] for r in result["records"]] == list(range(8))
        assert result["accuracy"] == sum(r["correct"] for r in result["records"]) / 8
        assert all({"completion", "reward", "correct", "reference", "example"} <= r.keys() for r in result["records"])
        for name, part in result["splits"].items():
            mine = [r["accuracy"] for r in result["records"] if r["example"]["split"] == name]
            assert (part["accuracy"], part["standard_error"]) == stats.mean_and_standard_error(mine)
            assert part["n"] == 4 and part["answer_diversity"]["answers"] == 4
        assert sorted(result["splits"]) == ["seen", "unseen"]


def test_evaluate_refuses_an_unknown_environment(monkeypatch):
    import importlib.util

    from common.contract import UserError

    # loaded from its file: a package called ``evaluate`` may be installed too
    spec = importlib.util.spec_from_file_location("evaluate_script", SCRIPTS / "evaluate.py")
    evaluate_script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, evaluate_script)  # its dataclass resolves its annotations there
    spec.loader.exec_module(evaluate_script)
    with pytest.raises(UserError, match=r"--environment.*gsm8k"):
        evaluate_script.parse_args(["--environment", "chess"])
    with pytest.raises(UserError, match=r"--generate_batch_size must be at least 1, got 0."):
        evaluate_script.parse_args(["--generate_batch_size", "0"]).validate(world_size=1)
    with pytest.raises(UserError, match=r"greedy answers are all the same. Set --temperature above 0"):
        evaluate_script.parse_args(["--samples_per_example", "4"]).validate(world_size=1)
    with pytest.raises(UserError, match=r"--temperature must be 0 \(greedy\) or above, got nan"):
        evaluate_script.parse_args(["--temperature", "nan"]).validate(world_size=1)


def test_sampled_evaluation_draws_the_same_answers_whatever_the_batch_size(tiny_model_path, offline_data, tmp_path):
    """Each example draws from seed + its index: two models evaluated with the same options meet the same
    draws, and how many prompts share a generate call changes nothing. An example's accuracy is the share
    of its answers that are right; the standard error is over examples."""
    from common import stats

    results = []
    for batch_size in (2, 5):
        folder = tmp_path / f"batch-{batch_size}"
        env = container_env(folder, {"test": offline_data["gsm8k"]})
        options = ["--temperature", "1.0", "--samples_per_example", "3", "--max_examples", "5"]
        code, output = run(
            [PYTHON, "evaluate.py", "--model_name_or_path", str(tiny_model_path), "--environment", "gsm8k"]
            + ["--max_new_tokens", "6", "--generate_batch_size", str(batch_size), *options],
            env,
        )
        assert code == 0, output
        results.append(json.loads((folder / "model" / "evaluation.json").read_text()))
    one, other = results
    assert [r["completions"] for r in one["records"]] == [r["completions"] for r in other["records"]]
    assert all(len(r["completions"]) == 3 and len(set(r["completions"])) > 1 for r in one["records"])  # sampled
    for record in one["records"]:
        assert record["accuracy"] == sum(record["rights"]) / 3 and record["completion"] == record["completions"][0]
    assert (one["accuracy"], one["standard_error"]) == stats.mean_and_standard_error(
        [r["accuracy"] for r in one["records"]]
    )
    assert one["samples_per_example"] == 3 and one["temperature"] == 1.0
    # every answer counted: the number GSM8K's checker read from each completion, None where it read none
    from environments.gsm8k import extract_answer

    for record in one["records"]:
        read = [extract_answer(c) for c in record["completions"]]
        assert record["answers"] == [None if a is None else a.strip() for a in read]
        assert record["answer"] == record["answers"][0]
    assert one["answer_diversity"] == stats.answer_diversity([a for r in one["records"] for a in r["answers"]])
    assert one["answer_diversity"]["answers"] == 15


def test_evaluate_code_environment_judges_in_the_sandbox(tiny_model_path, offline_data, tmp_path):
    env = container_env(tmp_path, {"test": offline_data["code"]})
    code, output = run(
        [
            PYTHON,
            "evaluate.py",
            "--model_name_or_path",
            str(tiny_model_path),
            "--environment",
            "code",
            "--max_new_tokens",
            "8",
            "--max_examples",
            "2",
        ],
        env,
    )
    assert code == 0, output
    assert "sandbox self-test" in output
    assert re.fullmatch(r"step=0 accuracy=0 standard_error=0 mean_reward=0 n=2", metric_lines(output)[0])
    result = json.loads((tmp_path / "model" / "evaluation.json").read_text())
    # the tiny model writes no program, and the verdict says so
    assert [r["verdict"] for r in result["records"]] == ["no_code", "no_code"]
    # no program is no answer: nothing to count, and nothing collapsed into one
    assert [r["answer"] for r in result["records"]] == [None, None]
    assert result["answer_diversity"] == {
        "answers": 2,
        "no_answer": 2,
        "distinct_answers": 0,
        "most_common_answer": None,
        "most_common_count": 0,
        "most_common_share": 0.0,
    }
    assert all("tests" not in r["example"] and r["total"] == 4 for r in result["records"])
