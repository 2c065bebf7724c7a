"""The SageMaker contract: hyperparameters, channels, paths, failure file, EFA settings."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from common import contract
from common.contract import UserError, option


@dataclass
class _LoRAArgs(contract.TrainingArgs):
    max_steps: int = 10  # a new default; the help stays TrainingArgs'
    use_lora: bool = option(False, "a boolean")


@dataclass
class _EveryKindArgs:
    count: int = option(3, "an int")
    rate: float = option(0.5, "a float")
    name: str = option("tiny", "a string")
    flag: bool = option(True, "a boolean")
    limit: float | None = option(None, "an optional float; default: no limit")
    mode: Literal["fast", "exact"] = option("fast", "a choice from the annotation")
    colour: str = option("red", "a choice from the metadata", choices=["red", "green"])
    ratio: float = option(0.25, "a share in %")


@dataclass
class _GroupedArgs(_EveryKindArgs):
    help_group = "extra"

    count: int = 5  # still in the first section, with its help
    level: int = option(1, "an option of the extra group")


def _parser():
    from common import contract

    return contract.HyperparameterParser(_LoRAArgs, description="test script", prog="train.py")


def test_hyperparameters_as_sagemaker_passes_them(clean_env):
    args = _parser().parse(["--max_steps", "5", "--use_lora", "True", "--learning_rate", "2e-05"])
    assert (args.max_steps, args.use_lora, args.learning_rate, args.seed) == (5, True, 2e-5, 42)
    assert _parser().parse(["--use_lora", "False"]).use_lora is False


def test_sm_hps_fills_what_the_command_line_lacks(clean_env):
    clean_env.setenv(
        "SM_HPS", json.dumps({"max_steps": 7, "seed": 1, "use_lora": True, "sagemaker_program": "train.py"})
    )
    args = _parser().parse(["--seed", "3"])  # the command line wins; the toolkit's own keys are ignored
    assert (args.max_steps, args.seed, args.use_lora) == (7, 3, True)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--max_step", "3"], "Unknown hyperparameter 'max_step'"),  # no abbreviations
        (["--epochs", "3"], "Unknown hyperparameter 'epochs'"),
        (["--use_lora", "maybe"], "argument --use_lora: expected true or false, got 'maybe'"),
        (["--max_steps", "ten"], "argument --max_steps: invalid int value: 'ten'"),
        (["--strategy", "zero3"], "argument --strategy: invalid choice: 'zero3'"),
    ],
)
def test_bad_hyperparameters_are_user_errors_listing_valid_ones(clean_env, argv, expected):
    from common.contract import UserError

    with pytest.raises(UserError) as error:
        _parser().parse(argv)
    assert expected in str(error.value)
    assert "Valid hyperparameters: checkpoint_dir, checkpoint_every," in str(error.value)


def _every_kind(argv: list[str]):
    return contract.HyperparameterParser(_EveryKindArgs, description="kinds", prog="kinds.py").parse(argv)


def test_options_parse_to_their_annotated_types(clean_env):
    assert _every_kind([]) == _EveryKindArgs()  # nothing given: the dataclass's defaults
    args = _every_kind(
        [
            "--count",
            "7",
            "--rate",
            "1e-3",
            "--name",
            "x",
            "--flag",
            "false",
            "--limit",
            "2.5",
            "--mode",
            "exact",
            "--colour=green",
        ]
    )
    assert args == _EveryKindArgs(count=7, rate=1e-3, name="x", flag=False, limit=2.5, mode="exact", colour="green")
    assert [type(value) for value in (args.count, args.rate, args.limit)] == [int, float, float]


@pytest.mark.parametrize(
    "text, value",
    [
        ("True", True),
        ("true", True),
        ("1", True),
        ("yes", True),
        ("False", False),
        ("false", False),
        ("0", False),
        ("no", False),
    ],
)
def test_booleans_as_sagemaker_and_people_write_them(clean_env, text, value):
    assert _every_kind(["--flag", text]).flag is value


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--mode", "slow"], "argument --mode: invalid choice: 'slow'"),  # choices from Literal[...]
        (["--colour", "blue"], "argument --colour: invalid choice: 'blue'"),  # choices from option(choices=...)
        (["--limit", "none"], "argument --limit: invalid float value: 'none'"),
        (["--flag"], "argument --flag: expected one argument"),
    ],
)
def test_bad_values_name_the_option(clean_env, argv, expected):
    with pytest.raises(UserError) as error:
        _every_kind(argv)
    assert expected in str(error.value)
    assert "Valid hyperparameters: colour, count, flag, limit, mode, name, rate, ratio." in str(error.value)


def test_sm_hps_values_arrive_as_the_toolkit_writes_them(clean_env):
    clean_env.setenv(
        "SM_HPS",
        json.dumps(
            {"count": 9, "flag": False, "name": {"layers": [1, 2]}, "rate": 0.1, "sagemaker_region": "us-east-1"}
        ),
    )
    args = _every_kind(["--rate=0.2"])  # given on the command line (either spelling): SM_HPS does not override it
    assert (args.count, args.flag, args.rate) == (9, False, 0.2)
    assert json.loads(args.name) == {"layers": [1, 2]}  # a JSON value stays JSON, not Python's repr
    clean_env.setenv("SM_HPS", json.dumps({"epochs": 3}))
    with pytest.raises(UserError, match="Unknown hyperparameter 'epochs'"):
        _every_kind([])


@dataclass
class _RenamedArgs:
    group_size: int = option(8, "completions per prompt", old_names=("num_generations",))


@dataclass
class _RenamedWithNewDefault(_RenamedArgs):
    group_size: int = 4  # a subclass's default keeps the old name working


def test_a_renamed_options_old_name_still_works_and_says_the_new_one(clean_env, capsys):
    parser = contract.HyperparameterParser(_RenamedArgs, description="renamed", prog="renamed.py")
    assert parser.parse(["--num_generations", "3"]).group_size == 3
    assert capsys.readouterr().err.strip() == (
        "--num_generations is deprecated and goes in the next release: use --group_size (same value)."
    )
    assert parser.parse(["--group_size", "5"]).group_size == 5 and capsys.readouterr().err == ""
    clean_env.setenv("SM_HPS", json.dumps({"num_generations": 6}))  # as the toolkit passes an old job's keys
    assert parser.parse([]).group_size == 6 and "use --group_size" in capsys.readouterr().err
    assert parser.parse(["--group_size", "2"]).group_size == 2  # the command line wins under either name
    clean_env.delenv("SM_HPS")
    with pytest.raises(UserError, match="--num_generations is the old name of --group_size: give only --group_size"):
        parser.parse(["--group_size", "2", "--num_generations", "3"])
    assert "num_generations" not in parser.format_help() and parser.valid_names() == ["group_size"]
    subclass = contract.HyperparameterParser(_RenamedWithNewDefault, description="renamed", prog="renamed.py")
    assert subclass.parse([]).group_size == 4 and subclass.parse(["--num_generations=7"]).group_size == 7


def test_help_shows_each_default_once(clean_env):
    text = contract.HyperparameterParser(_GroupedArgs, description="kinds", prog="kinds.py").format_help()
    assert "an int (default: 5)" in text  # a subclass's default with the base class's help
    assert "a share in % (default: 0.25)" in text
    assert "a choice from the annotation (default: fast)" in text and "--mode {fast,exact}" in text
    assert "an optional float; default: no limit" in text and "None" not in text  # its help says the default
    options, extra = text.split("\noptions:\n")[1].split("\nextra:\n")  # a help_group class's own fields
    assert re.findall(r"^  --([a-z_]+)", options, flags=re.M) == [
        "count",
        "rate",
        "name",
        "flag",
        "limit",
        "mode",
        "colour",
        "ratio",
    ]
    assert re.findall(r"^  --([a-z_]+)", extra, flags=re.M) == ["level"]
    common = _parser().format_help()
    assert (
        "optimizer steps to run (default: 10)" in common and "print a metric line every N steps (default: 1)" in common
    )


def test_options_classes_are_checked_when_the_parser_is_built():
    @dataclass
    class Undocumented:
        steps: int = 3

    @dataclass
    class Listed:
        names: list = option(None, "names")

    with pytest.raises(TypeError, match=r"Undocumented.steps has no help: declare it with option\(default, help\)"):
        contract.HyperparameterParser(Undocumented, description="", prog="x.py")
    with pytest.raises(TypeError, match="options are int, float, str, bool"):
        contract.HyperparameterParser(Listed, description="", prog="x.py")
    with pytest.raises(TypeError, match="is not a dataclass"):
        contract.HyperparameterParser(dict, description="", prog="x.py")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"log_every": 0}, "--log_every must be at least 1, got 0."),  # was a ZeroDivisionError at the first step
        ({"max_steps": 0}, "--max_steps must be at least 1, got 0."),
        ({"checkpoint_every": -1}, "--checkpoint_every (-1) and --checkpoint_every_minutes (0.0) cannot be negative"),
        ({"checkpoint_every_minutes": -1.0}, "cannot be negative; 0 turns either off."),
    ],
)
def test_validate_refuses_values_that_cannot_work(changes, message):
    args = contract.TrainingArgs(**changes)
    with pytest.raises(UserError) as error:
        args.validate(world_size=1)
    assert message in str(error.value)
    contract.TrainingArgs().validate(world_size=8)  # the defaults are valid


def test_a_validate_error_is_the_jobs_failure_reason(clean_env, tmp_path):
    clean_env.setenv("SM_OUTPUT_DIR", str(tmp_path / "output"))  # /opt/ml/output on SageMaker

    def main():
        _parser().parse(["--log_every", "0"]).validate(world_size=1)

    with pytest.raises(SystemExit) as stopped:
        contract.run_main(main)
    assert stopped.value.code == 1
    assert (tmp_path / "output" / "failure").read_text() == "--log_every must be at least 1, got 0.\n"


def test_paths_by_hand_and_under_sagemaker(clean_env, tmp_path):
    from common import contract

    assert not contract.on_sagemaker()
    clean_env.setenv("SM_CHANNEL_TRAIN", str(tmp_path))  # a hand run may name its data this way
    assert not contract.on_sagemaker()
    assert contract.model_dir() == Path("output/model")
    assert contract.failure_file() == Path("output/failure")
    assert contract.default_checkpoint_dir() == Path("checkpoints")

    clean_env.setenv("SM_MODEL_DIR", "/opt/ml/model")
    assert contract.on_sagemaker()
    assert contract.default_checkpoint_dir() == Path("/opt/ml/checkpoints")
    assert contract.failure_file() == Path("/opt/ml/output/failure")
    clean_env.setenv("SM_OUTPUT_DIR", str(tmp_path / "out"))
    assert contract.failure_file() == tmp_path / "out" / "failure"
    clean_env.setenv("SAGEMAKER_BASE_DIR", str(tmp_path / "ml"))
    assert contract.default_checkpoint_dir() == tmp_path / "ml" / "checkpoints"
    clean_env.setenv("SM_HOSTS", '["algo-1", "algo-2"]')
    assert contract.hosts() == ["algo-1", "algo-2"]


def test_channels(clean_env, tmp_path):
    from common import contract
    from common.contract import UserError

    with pytest.raises(UserError, match=r"channel 'test' is missing \(SM_CHANNEL_TEST is not set\).*fit\(\{'test'"):
        contract.channel_file("test", "test.jsonl")
    folder = tmp_path / "train"
    folder.mkdir()
    clean_env.setenv("SM_CHANNEL_TRAIN", str(folder))
    with pytest.raises(UserError, match="has no train.jsonl \\(found: nothing\\)"):
        contract.channel_file("train", "train.jsonl")
    (folder / "part-0.jsonl").write_text("{}\n")
    assert contract.channel_file("train", "train.jsonl") == folder / "part-0.jsonl"  # the only one there
    (folder / "train.jsonl").write_text("{}\n")
    assert contract.channel_file("train", "train.jsonl") == folder / "train.jsonl"


def test_run_main_writes_the_failure_file(clean_env, tmp_path, capsys):
    from common import contract

    clean_env.setenv("SM_OUTPUT_DIR", str(tmp_path / "output"))

    def user_mistake():
        raise contract.UserError("data.jsonl, line 3: field 'answer' is empty.")

    with pytest.raises(SystemExit) as stopped:
        contract.run_main(user_mistake)
    assert stopped.value.code == 1
    assert (tmp_path / "output" / "failure").read_text() == "data.jsonl, line 3: field 'answer' is empty.\n"
    logged = capsys.readouterr().out  # run_main logs to stdout, which SageMaker sends to CloudWatch
    assert "ERROR common: data.jsonl, line 3: field 'answer' is empty." in logged and "Traceback" not in logged

    def bug():
        return {}["missing"]

    with pytest.raises(SystemExit):
        contract.run_main(bug)
    reason = (tmp_path / "output" / "failure").read_text()
    assert reason.startswith("Unexpected KeyError: 'missing'") and "traceback in the job's log" in reason
    assert "Traceback (most recent call last)" in capsys.readouterr().out

    # Another rank's reason from this run stays: ours is the consequence (a broken collective).
    def consequence():
        (tmp_path / "output" / "failure").write_text("rank 1: the real reason\n")
        raise RuntimeError("Connection closed by peer")

    with pytest.raises(SystemExit):
        contract.run_main(consequence)
    assert (tmp_path / "output" / "failure").read_text() == "rank 1: the real reason\n"

    with pytest.raises(SystemExit) as stopped:  # --help and friends pass through untouched
        contract.run_main(lambda: _parser().parse(["--help"]))
    assert stopped.value.code == 0


@pytest.mark.parametrize(
    "instance, expected",
    [
        ("ml.p4de.24xlarge", {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}),
        ("ml.p5.48xlarge", {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}),
        ("ml.g5.2xlarge", {}),
        ("local", {}),
    ],
)
def test_efa_settings_only_where_the_instance_has_efa(clean_env, instance, expected, caplog):
    import os

    from common import distributed

    clean_env.setenv("SM_CURRENT_INSTANCE_TYPE", instance)
    with caplog.at_level(logging.INFO):
        applied = distributed.configure_efa()
    assert applied == expected
    assert {k: os.environ[k] for k in expected} == expected
    assert ("EFA settings for" in caplog.text) == bool(expected)


def test_efa_settings_leave_explicit_values_alone(clean_env):
    import os

    from common import distributed

    clean_env.setenv("SM_CURRENT_INSTANCE_TYPE", "ml.p5.48xlarge")
    clean_env.setenv("FI_EFA_USE_DEVICE_RDMA", "0")
    distributed.configure_efa()
    assert os.environ["FI_EFA_USE_DEVICE_RDMA"] == "0"


def test_model_path_checks(clean_env, tmp_path):
    from common import models
    from common.contract import UserError

    assert models.resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"  # a hub id
    with pytest.raises(UserError, match="--model_name_or_path ./missing: no such folder"):
        models.resolve_model_path("./missing")
    with pytest.raises(UserError, match="no such folder"):
        models.resolve_model_path(str(tmp_path / "a" / "b"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="has no config.json"):
        models.resolve_model_path(str(tmp_path / "empty"))
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    clean_env.setenv("SM_CHANNEL_MODEL", str(weights))
    assert models.resolve_model_path("./missing") == str(weights)  # the channel wins
    with pytest.raises(UserError, match="--reference_model_name_or_path ./missing: no such folder"):
        models.resolve_model_path("./missing", "--reference_model_name_or_path", use_channel=False)


def test_model_channel_may_hold_a_jobs_model_tar_gz(clean_env, tmp_path):
    import tarfile

    from common import models
    from common.distributed import single_learner

    saved = tmp_path / "model"
    saved.mkdir()
    (saved / "config.json").write_text('{"model_type": "qwen2"}')
    (saved / "model.safetensors").write_bytes(b"weights")
    channel = tmp_path / "channel"
    channel.mkdir()
    with tarfile.open(channel / "model.tar.gz", "w:gz") as archive:  # as SageMaker packs SM_MODEL_DIR
        for path in saved.iterdir():
            archive.add(path, arcname=path.name)
    clean_env.setenv("SM_CHANNEL_MODEL", str(channel))
    clean_env.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    tempfile.tempdir = None  # re-read TMPDIR
    try:
        models.unpack_model_archive(single_learner("cpu"))
        unpacked = models.resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct")
    finally:
        tempfile.tempdir = None
    assert unpacked.startswith(str(tmp_path / "tmp" / "model-channel-"))
    assert (Path(unpacked) / "model.safetensors").read_bytes() == b"weights"


AUTOGROUPS = Path("/proc/sys/kernel/sched_autogroup_enabled")


@pytest.mark.skipif(
    not AUTOGROUPS.exists() or AUTOGROUPS.read_text().strip() != "1", reason="this kernel schedules without autogroups"
)
def test_a_niced_process_that_leads_its_session_gives_the_session_its_nice_value():
    """torchrun starts each worker in a session of its own: a worker that inherited nice 5 holds it for its
    session's CPU group; a process in a session it did not start leaves that session as it is."""
    import os
    import subprocess
    import sys

    code = (
        "from common import contract; "
        "held = contract.hold_nice_value(); print(held, (open('/proc/self/autogroup').read().split() or ['-'])[-1])"
    )
    base = os.nice(0)

    def run(niceness: int, new_session: bool) -> list[str]:
        command = ["nice", "-n", str(niceness), sys.executable, "-c", code]
        return subprocess.run(
            command, capture_output=True, text=True, check=True, start_new_session=new_session
        ).stdout.split()

    assert run(5, new_session=True) == ["True", str(min(19, base + 5))]
    # A process in the system's first session (a container's init's) is in the root group, which has no
    # nice value: its /proc/self/autogroup is empty.
    ours = (Path("/proc/self/autogroup").read_text().split() or ["-"])[-1]
    assert run(5, new_session=False) == ["False", ours]  # this test's own session keeps its value
    assert (Path("/proc/self/autogroup").read_text().split() or ["-"])[-1] == ours


def test_cpu_mixed_precision_autocasts_on_cpu_only_when_asked(monkeypatch):
    """Exact fp32 on CPU by default; CPU_MIXED_PRECISION=bf16 computes the products in bf16 with fp32
    weights, as on GPU; a value it does not know stops the job with the fix."""
    import torch
    from common import distributed

    learners = distributed.single_learner("cpu")
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    monkeypatch.delenv("CPU_MIXED_PRECISION", raising=False)
    with distributed.autocast(learners):
        assert layer(x).dtype == torch.float32
    monkeypatch.setenv("CPU_MIXED_PRECISION", "bf16")
    with distributed.autocast(learners):
        assert layer(x).dtype == torch.bfloat16
    assert layer.weight.dtype == torch.float32
    monkeypatch.setenv("CPU_MIXED_PRECISION", "fp16")
    with pytest.raises(UserError, match="CPU_MIXED_PRECISION='fp16': use no .* or bf16"):
        distributed.autocast(learners)
