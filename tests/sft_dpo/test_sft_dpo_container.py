"""sft.py and dpo.py run through the container contract, and bad input fails clearly."""

from __future__ import annotations

import json
import re

import pytest
import torch

METRIC_LINE = re.compile(r"^step=\d+( [a-z0-9_]+=-?[0-9.]+(?:[eE][-+]?[0-9]+)?)+$")


def _metric_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("step=")]


def _value(line: str, name: str) -> float:
    match = re.search(rf"\b{name}=(-?[0-9.]+(?:[eE][-+]?[0-9]+)?)", line)  # the notebooks' regex form
    assert match, f"{name} missing from {line!r}"
    return float(match.group(1))


def _reloads_and_generates(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert (model_dir / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Ken has 3 apples."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    output = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert output.shape[1] > prompt["input_ids"].shape[1]
    return model


@pytest.mark.parametrize(
    "script, dataset, names",
    [
        ("sft.py", "chat", ["loss", "lr", "grad_norm", "tokens"]),
        (
            "dpo.py",
            "preferences",
            [
                "loss",
                "rewards_chosen",
                "rewards_rejected",
                "rewards_accuracies",
                "rewards_margins",
                "logps_chosen",
                "logps_rejected",
                "lr",
                "grad_norm",
            ],
        ),
    ],
)
def test_script_runs_through_the_container_contract(
    script, dataset, names, tmp_path, offline_data, run_script, container_env, read_metrics, tiny_args, tiny_model_path
):
    env = container_env(tmp_path, {"train": offline_data[dataset], "test": offline_data[dataset]})
    result = run_script(script, [*tiny_args, "--max_steps", "3", "--checkpoint_every", "2"], env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    lines = _metric_lines(result.stdout)
    # both score the test set before their first step, as step 0: the starting model's preferences, or its
    # held-out loss per answer token, which the last evaluation's paired change starts from
    assert [int(line.split()[0][5:]) for line in lines] == [0, 1, 2, 3]
    before, *lines = lines
    assert METRIC_LINE.match(before), before
    if script == "dpo.py":
        assert "eval_likelihood_accuracy=" in before, before
        assert "eval_rewards_accuracies=0 " in before, before  # the policy is the reference: every reward is 0
    else:
        assert _value(before, "eval_conversation_loss") > 0 and "_change" not in before, before
        last = lines[-1]
        # the last evaluation gives the starting model's figure again, and the change from it
        assert _value(last, "eval_conversation_loss_before") == pytest.approx(
            _value(before, "eval_conversation_loss"), rel=1e-3
        )
        assert _value(last, "eval_conversation_loss_change") == pytest.approx(
            _value(last, "eval_conversation_loss") - _value(last, "eval_conversation_loss_before"), abs=1e-3
        )
        assert _value(last, "eval_conversation_loss_change_se") > 0
        # the answers to the test prompts whose reference teaches a format: 7 of every 8 offline conversations
        # (small talk teaches none), at step 0 and at the last step, paired
        share = _value(before, "eval_format_share")
        assert 0 <= share <= 1 and _value(before, "eval_format_conversations") > 0, before
        assert _value(last, "eval_format_conversations") == _value(before, "eval_format_conversations")
        assert _value(last, "eval_format_share_before") == pytest.approx(share, abs=1e-3)
        assert _value(last, "eval_format_share_change") == pytest.approx(
            _value(last, "eval_format_share") - share, abs=1e-3
        )
        assert _value(last, "eval_distinct_answers") >= 0 and 0 <= _value(last, "eval_most_common_share") <= 1
        assert "eval_format_share=" not in lines[-2]  # answers at step 0 and the last step only
    for line in lines:
        assert METRIC_LINE.match(line), line
        for name in names:
            _value(line, name)
    assert "eval_loss=" in lines[-1] and "eval_loss=" not in lines[-2]  # the test channel, scored at the end
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert records[-1]["loss"] == pytest.approx(_value(lines[-1], "loss"), rel=1e-3)
    assert "progress: step 3/3" in result.stdout
    assert (tmp_path / "checkpoints" / "step_00000002" / "manifest.json").is_file()  # $SAGEMAKER_BASE_DIR/checkpoints
    assert not (tmp_path / "output" / "failure").exists()

    trained = _reloads_and_generates(tmp_path / "model")
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), start.parameters(), strict=True))


def test_sft_with_lora_saves_a_merged_plain_model_and_resumes(
    tmp_path, offline_data, run_in_process, tiny_args, same_weights, read_metrics, caplog
):
    import logging
    import shutil

    channels = {"train": offline_data["chat"], "test": offline_data["chat"]}
    args = [*tiny_args, "--max_steps", "3", "--lora_r", "4", "--checkpoint_every", "1", "--keep_checkpoints", "2"]
    run_in_process("sft", args, tmp_path, channels)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000002", "step_00000003"]
    assert not (tmp_path / "model" / "adapter_config.json").exists()
    _reloads_and_generates(tmp_path / "model")
    uninterrupted = read_metrics(tmp_path)[-1]

    # As if stopped after step 2: the adapter-only checkpoint resumes to the same merged weights.
    shutil.move(tmp_path / "model", tmp_path / "uninterrupted")
    shutil.rmtree(tmp_path / "checkpoints" / "step_00000003")
    with caplog.at_level(logging.INFO):
        run_in_process("sft", args, tmp_path, channels)
    assert f"resumed from {tmp_path / 'checkpoints' / 'step_00000002'}" in caplog.text
    same_weights(tmp_path / "uninterrupted", tmp_path / "model")
    # the starting model's held-out loss and answers came back from the checkpoint: the same paired changes
    resumed = read_metrics(tmp_path)[-1]
    for name in ("eval_conversation_loss_change", "eval_format_share_before", "eval_format_share_change"):
        assert resumed[name] == pytest.approx(uninterrupted[name], abs=1e-6), name


# --------------------------------------------------------------------------- bad input


@pytest.fixture
def failing_run(tmp_path, enter_container, monkeypatch):
    """failing_run(module, argv, channels) -> failure text; runs main() in this process through
    run_main, with the container's variables, and expects exit status 1."""
    import dpo
    import sft
    from common import contract

    modules = {"sft": sft, "dpo": dpo}

    def run(name: str, argv: list[str], channels: dict, hyperparameters: dict | None = None) -> str:
        enter_container(tmp_path, channels)
        if hyperparameters is not None:  # what the toolkit also puts in SM_HPS
            monkeypatch.setenv("SM_HPS", json.dumps(hyperparameters))
        with pytest.raises(SystemExit) as stopped:
            contract.run_main(lambda: modules[name].main(argv))
        assert stopped.value.code == 1
        return (tmp_path / "output" / "failure").read_text()

    return run


def _write_jsonl(path, rows):
    path.mkdir(parents=True, exist_ok=True)
    (path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_unknown_hyperparameter_lists_the_valid_ones(failing_run, offline_data, tiny_model_path):
    reason = failing_run(
        "sft", ["--model_name_or_path", str(tiny_model_path), "--learning", "1e-4"], {"train": offline_data["chat"]}
    )
    assert "Unknown hyperparameter 'learning'" in reason
    assert "learning_rate" in reason and "per_device_batch_size" in reason


def test_unknown_hyperparameter_from_sm_hps(failing_run, offline_data, tiny_model_path):
    reason = failing_run(
        "dpo",
        ["--model_name_or_path", str(tiny_model_path)],
        {"train": offline_data["preferences"]},
        hyperparameters={"beta": 0.1, "betta": 0.2},
    )
    assert "Unknown hyperparameter 'betta'" in reason


@pytest.mark.parametrize(
    "name, options, expected",
    [
        ("sft", ["--log_every", "0"], "--log_every must be at least 1, got 0."),  # was a ZeroDivisionError
        ("sft", ["--lora_r", "8", "--strategy", "fsdp"], "--lora_r with --strategy fsdp is not supported"),
        (
            "sft",
            ["--batch_size", "6", "--per_device_batch_size", "4"],
            "--batch_size 6 must be a multiple of --per_device_batch_size 4 x 1 processes.",
        ),
        ("dpo", ["--max_prompt_length", "1024"], "--max_prompt_length (1024) must be below --max_length (1024)."),
        ("dpo", ["--beta", "0"], "--beta must be positive, got 0.0."),
        ("dpo", ["--per_device_batch_size", "0"], "--per_device_batch_size must be at least 1, got 0."),
    ],
)
def test_bad_option_values_are_the_failure_reason(failing_run, offline_data, tiny_model_path, name, options, expected):
    channel = offline_data["chat" if name == "sft" else "preferences"]
    reason = failing_run(name, ["--model_name_or_path", str(tiny_model_path), *options], {"train": channel})
    assert expected in reason


def test_missing_field_names_file_line_and_field(failing_run, tmp_path, tiny_model_path):
    rows = [{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "p", "chosen": "a"}]
    folder = _write_jsonl(tmp_path / "prefs", rows)
    reason = failing_run("dpo", ["--model_name_or_path", str(tiny_model_path)], {"train": folder})
    assert f"{folder / 'train.jsonl'}, line 2: field 'rejected' is missing" in reason


def test_empty_answer_names_file_line_and_field(failing_run, tmp_path, tiny_model_path):
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    bad = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]}
    folder = _write_jsonl(tmp_path / "chat", [good, good, bad])
    reason = failing_run("sft", ["--model_name_or_path", str(tiny_model_path)], {"train": folder})
    assert f"{folder / 'train.jsonl'}, line 3: messages[1] (assistant): field 'content' is missing or empty" in reason

    folder = _write_jsonl(tmp_path / "prefs", [{"prompt": "p", "chosen": "", "rejected": "b"}])
    reason = failing_run("dpo", ["--model_name_or_path", str(tiny_model_path)], {"train": folder})
    assert "line 1: field 'chosen' is empty" in reason


def test_missing_channel_says_how_to_pass_it(failing_run, tiny_model_path):
    reason = failing_run("sft", ["--model_name_or_path", str(tiny_model_path)], {})
    assert "channel 'train' is missing" in reason and "fit({'train'" in reason and "SM_CHANNEL_TRAIN" in reason


def test_model_path_that_does_not_exist(failing_run, offline_data, tmp_path):
    reason = failing_run(
        "sft", ["--model_name_or_path", str(tmp_path / "no-such-model")], {"train": offline_data["chat"]}
    )
    assert f"--model_name_or_path {tmp_path / 'no-such-model'}: no such folder" in reason


def test_a_real_process_exits_non_zero_with_the_reason(tmp_path, offline_data, run_script, container_env, tiny_args):
    env = container_env(tmp_path, {"train": offline_data["chat"]})
    result = run_script("sft.py", [*tiny_args, "--max_step", "3"], env)
    assert result.returncode == 1
    reason = (tmp_path / "output" / "failure").read_text()
    assert "Unknown hyperparameter 'max_step'" in reason  # abbreviations are not accepted either
    assert "Traceback" not in result.stdout + result.stderr  # a user error, not a traceback wall


def test_help_explains_every_option(capsys):
    import dpo
    import sft

    for module in (sft, dpo):
        with pytest.raises(SystemExit) as stopped:
            module.parse_args(["--help"])
        assert stopped.value.code == 0
        text = capsys.readouterr().out
        parser_options = re.findall(r"^  (--[a-z_]+)", text, flags=re.M)
        assert "--model_name_or_path" in parser_options and "--max_steps" in parser_options
        for option in parser_options:  # every option line is followed by an explanation
            assert re.search(rf"^  {option} .*\n?.*\S", text, flags=re.M), option
