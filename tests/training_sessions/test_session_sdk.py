"""The endpoint driven by the real sagemaker-train SDK (SDK v3) in its own environment, unchanged:
a ServiceClient with a region and a role, the endpoint named only by environment variables."""

import importlib.util
from pathlib import Path

import pytest

from local_mode import session_service


def test_cross_entropy_lowers_the_loss_and_save_state_resumes_bitwise(sdk):
    out = sdk("cross_entropy_resume", steps=4)
    losses = out["uninterrupted"]
    assert losses[-1] < losses[0] * 0.95, losses
    # Stopped after 2 steps, restored from save_state with the optimizer into a new session: the
    # same floats as the run that never stopped.
    assert out["resumed"] == losses
    # Weights only: the same model at step 3, so the same loss before the first update; that update
    # starts AdamW's moments afresh, so the run parts from the uninterrupted one at step 4 (by ~3e-4 of
    # the loss at this learning rate: far beyond float noise, which the bitwise resume above rules out).
    assert out["fresh_optimizer"][0] == losses[2]
    assert abs(out["fresh_optimizer"][1] - losses[3]) > 1e-5 * abs(losses[3]), (out["fresh_optimizer"], losses)
    assert out["checkpoint"].startswith("arn:aws:sagemaker:us-east-1:123456789012:model-package/")
    # The first session: 2 x (forward_backward + optim_step) + save_state, billed for what it trained.
    assert out["last_sequence"] == 5
    assert out["billed"]["TrainingTokenCount"] == 2 * out["tokens_per_step"]


def test_pipelined_operations_run_in_submission_order(sdk):
    out = sdk("pipelining")
    assert out["sequence"] == 3
    assert out["step"]["grad_norm"] > 0 and out["step"]["step"] == 1.0  # the step saw the gradient
    assert out["after"] < out["before"]  # and the forward after it saw the step


def test_sampling_saved_weights_matches_the_training_weights(sdk):
    out = sdk("sampling_from_saved")
    own, package, base = out["own"], out["package"], out["base"]
    # A new session sampling the saved model package draws what the training session's weights do.
    assert package["tokens"] == own["tokens"] and package["logprobs"] == own["logprobs"]
    assert package["scored"] == own["scored"] and own["scored"][0] is None
    assert base["scored"] != own["scored"]  # the base model is another model
    for sample in own["tokens"]:
        assert len(sample) >= 1
    for text, stop in zip(own["texts"], own["stop"], strict=True):
        assert stop == "stop" and ("." in text or text.endswith("<|im_end|>")), (text, stop)


def test_saving_while_sampling_saves_the_trained_weights(sdk):
    out = sdk("save_while_sampling", requests=3)
    # Requests on the first package were still sampling when the second save returned: the case of an
    # overlapped loop, which samples step k+1 while step k trains and saves.
    assert out["overlapped"] > 0, out["overlapped"]
    for trained, after, before in zip(out["trained"], out["after"], out["before"], strict=True):
        # The new package scores as the training client's weights do, not as the package being sampled.
        assert after == pytest.approx(trained, abs=1e-4), (after, trained)
        assert max(abs(a - b) for a, b in zip(after, before, strict=True)) > 0.1


def test_a_later_process_describes_the_session(sdk, clients):
    control, _ = clients
    name = "described-later"
    control.create_training_session(
        TrainingSessionName=name,
        LoraConfig={"Rank": 2, "Alpha": 4},
        RoleArn="arn:aws:iam::123456789012:role/R",
        ModelConfig={
            "BaseModelArn": "arn:aws:sagemaker:us-east-1:aws:hub-content/SageMakerPublicHub/Model/"
            "local-tiny-qwen2/1.0.0"
        },
        OutputConfig={"S3Location": {"Path": "s3://session-tests/out"}},
    )
    out = sdk("describe", name=name)
    assert out["status"] == "Running" and out["listed"]
    assert "local/tiny-qwen2" in out["models"]
    control.stop_training_session(TrainingSessionName=name)


@pytest.fixture(scope="module")
def pick_digit_model(endpoint, tmp_path_factory, one_thread):
    """The job-side learning test's warm-up (one random digit, then end of turn), registered as a
    local base model: LoRA on the random tiny model cannot learn the format itself."""
    spec = importlib.util.spec_from_file_location(
        "grpo_learning", Path(__file__).resolve().parents[1] / "grpo" / "test_grpo_learning.py"
    )
    learning = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learning)
    from local_mode.tiny_model import tiny_model_dir

    folder = learning.warm_up_sft(
        tiny_model_dir(),
        tmp_path_factory.mktemp("pick-digit"),
        [{"prompt": "Pick a digit."}] * 8,
        learning.PickSevenEnvironment(),
        steps=30,
    )
    session_service.register_base_model("local/tiny-pick-digit", folder, endpoint.root)
    return "local/tiny-pick-digit"


@pytest.mark.slow
def test_grpo_through_the_sdk_learns_to_pick_seven(sdk, pick_digit_model):
    out = sdk("grpo_pick_seven", model=pick_digit_model, grpo_steps=30, group=16, learning_rate=2e-3, seed=0)
    rewards = out["rewards"]
    # Measured: about 0.15 over the first 5 steps, 0.4 over the last 10 (reward = share of '7').
    start, end = sum(rewards[:5]) / 5, sum(rewards[-10:]) / 10
    assert start < 0.3, rewards
    assert end > start + 0.15, rewards
