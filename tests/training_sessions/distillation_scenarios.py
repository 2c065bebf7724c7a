"""On-policy distillation through the real SDK (SDK v3, ``.venv-sessions``) and the local endpoint, with the
pieces notebook 16 calls (``helpers/training_sessions/distillation.py``). Run by ``test_distillation.py``:

    .venv-sessions/bin/python distillation_scenarios.py <scenario> '<json arguments>'

Each scenario prints one JSON line last, which the test reads.
"""

from __future__ import annotations

import json
import sys

import boto3
from botocore.exceptions import ClientError
from common.contract import UserError
from sagemaker.train.training_session import AdamParams, Datum, ModelInput, SamplingParams, ServiceClient

from helpers.training_sessions import datum_tools, distillation

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
MODEL = "local/tiny-qwen2"
ADAM = AdamParams(learning_rate=5e-3, weight_decay=0.0, grad_clip_norm=1.0)
TEXTS = ["The cat sat on the mat.", "Numbers: 1 2 3 4 5 6 7.", "Hello there, how are you today?"]
PROMPT_TEXT = "Numbers: 1 2"


def service() -> ServiceClient:
    return ServiceClient(region="us-east-1", role_arn=ROLE)


def trained(training_client, steps: int = 3):
    """A few cross-entropy steps on TEXTS: an adapter that changes what the model says."""
    tokenizer = training_client.get_tokenizer()
    datums = []
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        datums.append(
            Datum(
                model_input=ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
            )
        )
    for _ in range(steps):
        training_client.forward_backward(datums, "cross_entropy")
        training_client.optim_step(ADAM).result()
    return training_client


def distillation_step(student, teacher, seed: int = 7) -> dict:
    """One step of notebook 16's loop on one prompt: the student samples a group, the teacher scores it,
    the distillation datums train it. Returns what the test checks."""
    tokenizer = student.get_tokenizer()
    prompt = tokenizer(PROMPT_TEXT, add_special_tokens=False)["input_ids"]
    sampler = student.save_weights_and_get_sampling_client()
    params = SamplingParams(max_tokens=512, temperature=1.0, seed=seed, stop=["."])
    samples = sampler.sample(prompt, num_samples=4, sampling_params=params).result().sequences
    groups = [{"prompt": prompt, "samples": samples, "rewards": [0.0] * len(samples)}]
    distillation.score_with_teacher(teacher, groups)
    datums = distillation.distillation_datums(groups, len(samples), kl_coef=1.0, task_reward_weight=0.0)
    forward_backward = student.forward_backward(datums, loss_fn="importance_sampling")
    optim_step = student.optim_step(ADAM)
    forward_backward.result()
    return {
        "tokens": [list(s.tokens) for s in samples],
        "student_logprobs": [list(s.logprobs) for s in samples],
        "teacher_logprobs": groups[0]["teacher_logprobs"],
        "advantages": [datum_tools.values(d.loss_fn_inputs["advantages"])[len(prompt) - 1 :] for d in datums],
        "reverse_kl": distillation.kl_record(groups)["reverse_kl"],
        "grad_norm": optim_step.result().metrics["grad_norm"],
    }


def teacher_scores_with_its_weights() -> dict:
    """A teacher trained in its own session, saved, and opened in a fresh student's session: its log-probs
    of the student's tokens, against the teacher session's own scoring and the student's (the base model)."""
    svc = service()
    teacher_session = trained(svc.create_lora_training_client(MODEL, rank=8, alpha=16))
    teacher_arn = teacher_session.save_state("teacher").result().model_package_arn
    teachers_own = teacher_session.save_weights_and_get_sampling_client()
    student = svc.create_lora_training_client(MODEL, rank=4, alpha=8)  # another rank: only the tokens must agree
    try:
        teacher = distillation.open_teacher(student, teacher_arn, student.get_tokenizer())
        step = distillation_step(student, teacher)
        prompt = student.get_tokenizer()(PROMPT_TEXT, add_special_tokens=False)["input_ids"]
        base = student.create_sampling_client("")
        step["teacher_session_logprobs"] = [
            teachers_own.compute_logprobs(prompt + tokens).result()[len(prompt) :] for tokens in step["tokens"]
        ]
        step["base_logprobs"] = [
            base.compute_logprobs(prompt + tokens).result()[len(prompt) :] for tokens in step["tokens"]
        ]
        return step
    finally:
        for client in (student, teacher_session):
            client.stop()


def identical_and_other_teacher() -> dict:
    """A student trained a little; the teacher is first the student itself (its own save_state), then the
    base model: the same step, from the same weights, with each."""
    svc = service()
    student = trained(svc.create_lora_training_client(MODEL, rank=8, alpha=16))
    try:
        itself = student.save_state("the student itself").result().model_package_arn
        tokenizer = student.get_tokenizer()
        same = distillation_step(student, distillation.open_teacher(student, itself, tokenizer))
        student.load_state(itself).result()  # the same weights again, the optimizer fresh
        other = distillation_step(student, student.create_sampling_client(""))  # the base model as the teacher
        return {"same": same, "other": other}
    finally:
        student.stop()


def other_tokenizer(base_model: str) -> dict:
    """A checkpoint of ``base_model`` (another tokenizer) offered as the teacher of a tiny-qwen2 student."""
    svc = service()
    teacher_session = svc.create_lora_training_client(base_model, rank=8, alpha=16)
    teacher_arn = teacher_session.save_state("teacher of another tokenizer").result().model_package_arn
    teacher_session.stop()
    student = svc.create_lora_training_client(MODEL, rank=8, alpha=16)
    try:
        distillation.open_teacher(student, teacher_arn, student.get_tokenizer())
        error = None
    except UserError as refused:
        error = str(refused)
    finally:
        student.stop()
    detail = boto3.client("sagemaker").describe_training_session(TrainingSessionName=student.training_session_name)
    return {"error": error, "billable": detail["TrainingSessionDetail"].get("BillableTokenUsage", {})}


def refusal(call) -> dict:
    """What the service answered ``call()`` with: its error code, HTTP status and message."""
    try:
        call()
    except ClientError as error:
        response = error.response
        return {
            "code": response["Error"]["Code"],
            "status": response["ResponseMetadata"]["HTTPStatusCode"],
            "message": response["Error"]["Message"],
        }
    return {"code": None, "status": 200, "message": ""}


def teacher_of_another_base_model(base_model: str) -> dict:
    """A checkpoint of ``base_model`` (the student's tokenizer, other weights) offered as the teacher of a
    tiny-qwen2 student, and restored into a session of tiny-qwen2 and into one of its own base model."""
    svc = service()
    teacher_session = trained(svc.create_lora_training_client(base_model, rank=8, alpha=16))
    teacher_arn = teacher_session.save_state("teacher of another base model").result().model_package_arn
    tokens = teacher_session.get_tokenizer()(PROMPT_TEXT + " 3 4", add_special_tokens=False)["input_ids"]
    teacher_session_logprobs = teacher_session.save_weights_and_get_sampling_client().compute_logprobs(tokens).result()
    teacher_session.stop()
    student = svc.create_lora_training_client(MODEL, rank=8, alpha=16)
    try:
        teacher = distillation.open_teacher(student, teacher_arn, student.get_tokenizer())  # the same tokenizer
        scored = refusal(lambda: teacher.compute_logprobs(tokens).result())
    finally:
        student.stop()
    restored_name = f"restore-{student.training_session_name[-12:]}"
    on_student_base_model = refusal(
        lambda: svc.create_training_client_from_state(
            teacher_arn, base_model=MODEL, rank=8, alpha=16, training_session_name=restored_name
        )
    )
    sagemaker = boto3.client("sagemaker")
    status = sagemaker.describe_training_session(TrainingSessionName=restored_name)["TrainingSessionDetail"]
    restored = svc.create_training_client_from_state(teacher_arn, rank=8, alpha=16)  # base_model read from the package
    try:
        detail = sagemaker.describe_training_session(TrainingSessionName=restored.training_session_name)
        reading_the_package = {
            "base_model": detail["TrainingSessionDetail"]["ModelConfig"]["BaseModelArn"],
            "logprobs": restored.save_weights_and_get_sampling_client().compute_logprobs(tokens).result(),
        }
    finally:
        restored.stop()
    return {
        "opened": teacher is not None,
        "compute_logprobs": scored,
        "from_state_on_the_student_base_model": on_student_base_model,
        "from_state_session_status": status["TrainingSessionStatus"],
        "from_state_reading_the_package": reading_the_package,
        "teacher_session_logprobs": teacher_session_logprobs,
    }


if __name__ == "__main__":
    scenario, arguments = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(globals()[scenario](**arguments)))
