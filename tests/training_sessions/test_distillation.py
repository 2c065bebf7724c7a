"""On-policy distillation's maths, on the session engine and then through the real SDK and the local
endpoint with notebook 16's pieces (``distillation_scenarios.py``): the advantage is the per-token reverse
KL's negative, a teacher identical to the student gives no gradient, the teacher's log-probs come from the
teacher's weights (its checkpoint's, by model package), and a teacher with another tokenizer is refused
before any step."""

from pathlib import Path

import pytest
import torch
from common.contract import UserError
from common.distillation import check_same_tokenizer, distillation_advantages, reverse_kl
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoTokenizer

from local_mode.session_service import engine as engine_module

from .conftest import trained_looking_engine

PROMPT = [5, 6, 7, 8, 9]
logprob = st.floats(min_value=-30.0, max_value=0.0)


@given(st.lists(st.tuples(logprob, logprob), min_size=1, max_size=40), st.floats(0.0, 4.0), st.floats(-2.0, 2.0))
def test_the_advantage_is_the_negative_per_token_reverse_kl_plus_the_task_advantage(pairs, kl_coef, task):
    student, teacher = [s for s, _ in pairs], [t for _, t in pairs]
    advantages = distillation_advantages(student, teacher, kl_coef=kl_coef, task_advantage=task)
    assert advantages == pytest.approx([-kl_coef * (s - t) + task for s, t in pairs])
    without_task = distillation_advantages(student, teacher)
    assert -sum(without_task) / len(pairs) == pytest.approx(reverse_kl(student, teacher), abs=1e-9)


def test_mismatched_lengths_and_bad_coefficients_are_refused():
    with pytest.raises(ValueError, match="exactly the tokens"):
        distillation_advantages([-1.0, -2.0], [-1.0])
    with pytest.raises(ValueError, match="kl_coef"):
        distillation_advantages([-1.0], [-1.0], kl_coef=-1.0)


@pytest.fixture(scope="module")
def student(tiny_model_path, one_thread):
    return trained_looking_engine(tiny_model_path, seed=5)


def datum(tokens, sampled_from: int, sampler_logprobs, advantages):
    """The importance-sampling datum of one completion (shifted by one; weight 0 on the prompt)."""
    n_prompt = sampled_from - 1
    wire = lambda values, dtype="float32": {"data": list(values), "dtype": dtype, "shape": [len(values)]}  # noqa: E731
    return {
        "modelInput": {"chunks": [{"tokens": tokens[:-1], "type": "encoded_text"}]},
        "lossFnInputs": {
            "target_tokens": wire(tokens[1:], "int64"),
            "weights": wire([0.0] * n_prompt + [1.0] * len(sampler_logprobs)),
            "logprobs": wire([0.0] * n_prompt + list(sampler_logprobs)),
            "advantages": wire([0.0] * n_prompt + list(advantages)),
        },
    }


def gradient_norm(engine, teacher_adapter) -> tuple[float, list[float]]:
    """The student samples; the teacher (``teacher_adapter``, see ``Engine.weights``) scores its tokens;
    forward_backward with the distillation advantages. Returns the gradient's norm and the advantages."""
    (sample,) = engine.sample(PROMPT, 1, {"maxTokens": 16, "temperature": 1.0, "seed": 7})
    tokens = PROMPT + sample["tokens"]
    teacher = engine.compute_logprobs(tokens, teacher_adapter)[len(PROMPT) :]
    advantages = distillation_advantages(sample["logprobs"], teacher)
    engine.optimizer.zero_grad(set_to_none=True)
    engine.forward_backward(
        "importance_sampling", [datum(tokens, len(PROMPT), sample["logprobs"], advantages)], {}, backward=True
    )
    norm = float(torch.cat([p.grad.reshape(-1) for _, p in engine.named_trainable]).norm())
    engine.optimizer.zero_grad(set_to_none=True)
    return norm, advantages


def test_a_teacher_identical_to_the_student_gives_no_gradient_and_another_teacher_does(student):
    same, same_advantages = gradient_norm(student, engine_module.OWN_ADAPTER)
    other, other_advantages = gradient_norm(student, None)  # the base model, without the student's adapter
    assert max(map(abs, same_advantages)) < 1e-4  # the sampler's and the scorer's fp32 last bits only
    assert other > 0.01 and same < 1e-4 * other, (same, other)
    assert max(map(abs, other_advantages)) > 0.01


def test_the_teachers_logprobs_come_from_the_teachers_weights(student):
    tokens = PROMPT + [11, 12, 13, 14]
    own_before = student.compute_logprobs(tokens)
    teacher = {name: value + 0.05 for name, value in peft_state(student).items()}  # another adapter's tensors
    scored = student.compute_logprobs(tokens, teacher)
    assert (
        max(abs(a - b) for a, b in zip(scored[1:], own_before[1:], strict=True)) > 1e-3
    )  # other weights, other log-probs
    assert student.compute_logprobs(tokens) == own_before  # the student's own adapter is put back unchanged


def peft_state(engine) -> dict:
    from peft import get_peft_model_state_dict

    return {name: value.detach().clone() for name, value in get_peft_model_state_dict(engine.model).items()}


def test_a_teacher_with_another_tokenizer_is_refused_before_any_step(tiny_model_path):
    student_tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    check_same_tokenizer(student_tokenizer, AutoTokenizer.from_pretrained(tiny_model_path))  # the same: accepted
    other = AutoTokenizer.from_pretrained(tiny_model_path)
    other.add_tokens(["<teacher-only>"])
    with pytest.raises(UserError, match="not the student's.*1 tokens map to other ids.*'<teacher-only>'"):
        check_same_tokenizer(student_tokenizer, other)


# --------------------------------------------------------------------------- through the SDK and the local endpoint

SCENARIOS = Path(__file__).with_name("distillation_scenarios.py")


def test_through_the_service_the_teachers_logprobs_are_its_checkpoints_and_the_advantage_is_their_difference(sdk):
    step = sdk("teacher_scores_with_its_weights", script=SCENARIOS)
    n_tokens = sum(map(len, step["tokens"]))
    for student, teacher, own, base, advantages in zip(
        step["student_logprobs"],
        step["teacher_logprobs"],
        step["teacher_session_logprobs"],
        step["base_logprobs"],
        step["advantages"],
        strict=True,
    ):
        assert len(teacher) == len(student) == len(advantages)  # exactly the tokens the student sampled
        assert teacher == pytest.approx(own, abs=1e-4)  # what the teacher's own session says of them
        assert student == pytest.approx(base, abs=1e-4)  # a fresh adapter: the student is still the base model
        assert advantages == pytest.approx(
            [-(s - t) / n_tokens for s, t in zip(student, teacher, strict=True)], abs=1e-7
        )
    differences = [
        abs(t - b)
        for ts, bs in zip(step["teacher_logprobs"], step["base_logprobs"], strict=True)
        for t, b in zip(ts, bs, strict=True)
    ]
    assert max(differences) > 0.05  # the teacher's weights, not the student's
    assert step["grad_norm"] > 0.0


def test_through_the_service_a_teacher_identical_to_the_student_gives_no_gradient(sdk):
    runs = sdk("identical_and_other_teacher", script=SCENARIOS)
    same, other = runs["same"], runs["other"]
    assert same["tokens"] == other["tokens"]  # the same weights and seeds sampled the same answers
    assert max(abs(a) for answer in same["advantages"] for a in answer) < 1e-6
    assert abs(same["reverse_kl"]) < 1e-5 < abs(other["reverse_kl"])
    assert other["grad_norm"] > 1e-3 and same["grad_norm"] < 1e-3 * other["grad_norm"], (same, other)


def test_through_the_service_a_teacher_of_another_tokenizer_is_refused_before_any_step(
    sdk, endpoint, tiny_model_path, tmp_path
):
    import shutil

    from local_mode import session_service

    folder = tmp_path / "tiny-other-tokenizer"
    shutil.copytree(tiny_model_path, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["<teacher-only>"])
    tokenizer.save_pretrained(folder)
    session_service.register_base_model("local/tiny-other-tokenizer", folder, root=endpoint.root)
    refused = sdk("other_tokenizer", script=SCENARIOS, base_model="local/tiny-other-tokenizer")
    assert refused["error"] and "The teacher's tokenizer is not the student's" in refused["error"]
    assert "'<teacher-only>'" in refused["error"] and "same base model" in refused["error"]
    assert not refused["billable"].get("TrainingTokenCount") and not refused["billable"].get("SampleTokenCount")


def curve_point(step, seconds, per_problem, answers=("1", "2", "3", "1")):
    from common import stats

    accuracy, standard_error = stats.mean_and_standard_error(per_problem)
    return {
        "step": step,
        "seconds": seconds,
        "accuracy": accuracy,
        "standard_error": standard_error,
        "per_problem": per_problem,
        "answer_diversity": stats.answer_diversity(list(answers)),
    }


def test_the_comparison_finds_the_first_measure_at_the_target_and_says_when_the_start_is_within_its_noise():
    from helpers.training_sessions.distillation import comparison_lines, first_reaching

    start = curve_point(0, 0.0, [1, 0, 0, 0, 1, 0, 0, 0])
    distilled = [start, curve_point(4, 20.0, [1, 1, 0, 0, 1, 0, 1, 0]), curve_point(8, 40.0, [1, 1, 1, 0, 1, 1, 1, 0])]
    rl = [start, curve_point(4, 10.0, [1, 0, 0, 0, 1, 0, 0, 0]), curve_point(8, 20.0, [1, 1, 0, 0, 1, 0, 0, 0])]
    teacher = curve_point(None, None, [1, 1, 1, 1, 1, 1, 1, 0])
    target = 0.9 * teacher["accuracy"]  # 0.7875
    assert first_reaching(distilled, 0.5)["step"] == 4 and first_reaching(rl, target) is None
    lines = comparison_lines({"distillation": distilled, "GRPO": rl}, target, teacher)
    assert lines[0].startswith("target 0.787: +3.3 standard errors of the start (0.250 ± 0.164)")
    assert "within the start's noise" not in lines[0]
    assert "GRPO: did not reach it in 8 steps (best 0.375" in "\n".join(lines)
    assert "distillation - GRPO after step 8: +0.375 ± 0.183 (paired)" in lines[-1]
    near = comparison_lines({"distillation": distilled}, 0.3, teacher)
    assert "within the start's noise" in near[0] and "reached it at step 4, after 20 s" in near[1]
