"""Connecting to the training-session service: the run mode, the local endpoint, the session's lifetime
and the requests the SDK sends.

The loops are in the notebooks (07 SFT, 08 GRPO, 09 code RL): they run in the notebook's process and
drive a SageMaker training session with the SDK v3 clients (``sagemaker.train.training_session``); the
service keeps the model on its GPUs, the loop decides every step. Losses on the service are **sums**
over tokens and datums: the loop owns normalisation (the notebooks divide by the step's target tokens).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import time

from local_mode.account import LOCAL_ROLE  # the role local mode answers for (also the job notebooks')

# --------------------------------------------------------------------------- connecting


def resolve_run_mode(run_mode: str) -> str:
    """run_mode "auto" is "sagemaker" when AWS credentials are found, otherwise "local" (saying so)."""
    if run_mode not in ("auto", "local", "sagemaker"):
        raise ValueError(f"run_mode must be 'auto', 'local' or 'sagemaker', got {run_mode!r}.")
    if run_mode != "auto":
        return run_mode
    import boto3

    found = boto3.Session().get_credentials() is not None
    print(
        f"run_mode='auto': {'AWS credentials found, using SageMaker' if found else 'no AWS credentials, using local mode'}."
    )
    return "sagemaker" if found else "local"


def start_local_endpoint(root: str | os.PathLike | None = None) -> dict[str, str]:
    """Start the local training-session endpoint (a process of the main environment, which has torch)
    and point this process's SDK and boto3 at it. Returns the variables it set."""
    import local_mode

    root_args = ["--root", str(root)] if root else []
    environment = local_mode.run_in_main_environment(
        "local_mode.session_service", *root_args, timeout=300, doing="start the training-session endpoint"
    )
    os.environ.update(environment)
    return environment


def format_tuned_model(task: str = "gsm8k") -> str:
    """Local mode: the tiny model tuned to answer in the task's format ('#### n' for "gsm8k", a fenced
    program for "code"), registered with the local endpoint (built once per machine in the main
    environment, which has torch: ``local_mode/format_tuned_models.py``)."""
    import local_mode

    built = local_mode.run_in_main_environment(
        "local_mode.format_tuned_models", "--task", task, timeout=900, doing="build the format-tuned model"
    )
    return built["base_model"]


def connect(run_mode: str, region: str | None, role: str | None, **service_options):
    """A ``ServiceClient`` for SageMaker or for the local endpoint; the same calls follow either way.
    Returns it and the run mode ("auto" resolved)."""
    run_mode = resolve_run_mode(run_mode)
    if run_mode == "local":
        start_local_endpoint()
        region, role = region or "us-east-1", role or LOCAL_ROLE
    elif role is None:
        raise ValueError(
            "Set role to the ARN of an IAM role that SageMaker training sessions may assume "
            "(your Studio execution role works: it is shown in the Studio domain's settings)."
        )
    from sagemaker.train.training_session import ServiceClient

    return ServiceClient(region=region, role_arn=role, **service_options), run_mode


def explain(error: Exception) -> Exception:
    """A SageMaker error turned into one that says what to do."""
    code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
    message = str(error)
    if code in ("AccessDeniedException", "AccessDenied") or "not authorized" in message:
        return RuntimeError(
            "SageMaker refused the training-session call: the role (or your identity) lacks "
            "sagemaker:CreateTrainingSession / the runtime's permissions, or training sessions are "
            f"not available in this account and Region. Original error: {message}"
        )
    if code in ("UnknownOperationException", "InvalidAction") or "Could not connect" in message:
        return RuntimeError(
            "This Region does not answer the training-session API: choose a Region where "
            f"SageMaker training sessions are offered. Original error: {message}"
        )
    if code in ("ResourceLimitExceeded", "ThrottlingException", "ServiceQuotaExceededException"):
        return RuntimeError(
            "A training-session quota is reached (concurrent sessions or tokens): stop idle "
            "sessions (ServiceClient.list_sessions / stop_session) or request a quota increase "
            f"in Service Quotas. Original error: {message}"
        )
    return error


def choose_base_model(service, base_model: str) -> str:
    """``base_model`` if the service offers it, else an error listing what it does offer."""
    try:
        offered = service.list_base_models()
    except Exception as error:  # the first call that reaches the service: make its failure teach
        raise explain(error) from error
    if base_model not in offered:
        raise ValueError(
            f"Base model {base_model!r} is not offered here. list_base_models() gives: "
            f"{', '.join(offered) or 'nothing'}. Set base_model to one of them."
        )
    return base_model


def open_session(service, base_model: str, rank: int, alpha: int, **options):
    """A LoRA training client for notebooks, whose cells cannot share one ``with``: the loop's cell
    stops the session in its ``finally`` (``close_session``), and it is also stopped when the kernel
    exits, in case a cell before the loop fails (papermill stops the kernel after a failing cell; in
    Jupyter the session then stays Running until a kernel restart or the service's idle expiry)."""
    try:
        client = service.create_lora_training_client(base_model, rank=rank, alpha=alpha, **options)
    except Exception as error:
        raise explain(error) from error
    atexit.register(close_session, client)
    print(f"Training session {client.training_session_name} is Running.")
    return client


def stop_at_exit(sagemaker_client, training_session_name: str) -> None:
    """The raw API's ``open_session``: stop the session when the kernel exits, in case the last cell
    does not run (a cell failed). Stopping a session already stopped or deleted is a no-op here."""

    def stop():
        with contextlib.suppress(Exception):
            sagemaker_client.stop_training_session(TrainingSessionName=training_session_name)

    atexit.register(stop)


def close_session(client) -> None:
    with contextlib.suppress(Exception):  # already stopped, or the service is gone: nothing left to free
        client.stop()
        print(f"Stopped training session {client.training_session_name}.")


def adam_params(learning_rate: float):
    """The optimizer step every loop sends: AdamW without weight decay, gradients clipped to norm 1."""
    from sagemaker.train.training_session import AdamParams

    return AdamParams(learning_rate=learning_rate, weight_decay=0.0, grad_clip_norm=1.0)


# --------------------------------------------------------------------------- the requests, before launch


def sdk_requests(
    base_model: str, rank: int, alpha: int, role: str | None, learning_rate: float, forward_backward: dict | None = None
) -> dict:
    """The CreateTrainingSession request ``create_lora_training_client`` sends and the optimizer step's
    ExecuteTrainingOperation, built with the SDK's own code before anything is launched. What only
    SageMaker knows yet (the session name the SDK draws, the hub's ARN, the account's bucket and default
    model package group) is shown in <angle brackets>."""
    from sagemaker.train.training_session._utils import build_lora_config
    from sagemaker.train.training_session.service_client import (
        DEFAULT_MODEL_PACKAGE_GROUP_NAME,
        DEFAULT_SESSION_NAME_PREFIX,
        _build_create_session_args,
    )

    name = f"{DEFAULT_SESSION_NAME_PREFIX}-<8 hex digits>"
    create = _build_create_session_args(
        session_name=name,
        base_model_arn=f"<public hub ARN of {base_model}>",
        model_package_group_arn=f"<ARN of model package group {DEFAULT_MODEL_PACKAGE_GROUP_NAME}>",
        lora_config=build_lora_config(rank, alpha),
        role_arn=role or "<role>",
        s3_path=f"s3://<default bucket>/{name}/output",
        kms_key_arn=None,
        vpc_config=None,
    )
    operations = {"optimizerStep": {"adamParamsConfig": adam_params(learning_rate)._to_api()}}
    return {
        "CreateTrainingSession": create,
        "ExecuteTrainingOperation": operations,
        **({"forwardBackward (without its datums)": forward_backward} if forward_backward else {}),
    }


def print_requests(requests: dict) -> None:
    """One request a block, keys sorted: the output the notebooks keep in git and nbval checks."""
    for operation, request in requests.items():
        print(operation)
        print(json.dumps(request, indent=1, sort_keys=True, default=str))


# --------------------------------------------------------------------------- the raw API (boto3)


def create_session_request(
    session_name: str, base_model_arn: str, rank: int, alpha: int, role: str, output_path: str
) -> dict:
    """CreateTrainingSession's request as notebook 10 writes it: no model package group (SageMaker uses
    the account's default), checkpoints under ``<output_path>/training-sessions/<session>``."""
    return {
        "TrainingSessionName": session_name,
        "LoraConfig": {"Rank": rank, "Alpha": alpha},
        "RoleArn": role,
        "ModelConfig": {"BaseModelArn": base_model_arn, "AcceptEula": True},
        "OutputConfig": {"S3Location": {"Path": f"{output_path}/training-sessions/{session_name}"}},
    }


def base_model_arn(sagemaker_client, base_model: str) -> str:
    """The public hub's ARN for a model id (``provider/model``), as CreateTrainingSession wants it."""
    keyword = f"@huggingface-id:{base_model.lower()}"
    request = {"HubName": "SageMakerPublicHub", "HubContentType": "Model"}
    while True:
        try:
            page = sagemaker_client.list_hub_contents(**request)
        except Exception as error:  # the first call that reaches SageMaker: make its failure teach
            raise explain(error) from error
        for summary in page["HubContentSummaries"]:
            if keyword in summary.get("HubContentSearchKeywords", []):
                return summary["HubContentArn"]
        if not page.get("NextToken"):
            break
        request["NextToken"] = page["NextToken"]
    raise ValueError(
        f"No public hub model has the id {base_model!r} in this Region. Set base_model to one that "
        "training sessions serve here (ServiceClient(...).list_base_models() lists them)."
    )


def wait_for_operation(runtime_client, session_name: str, operation_id: str, timeout: float = 600) -> dict:
    """Poll GetTrainingOperationResult until the operation ends; a Failed one raises with its reason."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = runtime_client.get_training_operation_result(
            trainingSessionName=session_name, operationId=operation_id
        )
        if answer["status"] == "Completed":
            return answer
        if answer["status"] in ("Failed", "Skipped"):
            raise RuntimeError(f"Operation {operation_id} {answer['status']}: {answer.get('errorDetails', answer)}")
        time.sleep(1)  # the service holds each request until the operation ends or ~20 s pass
    raise TimeoutError(f"Operation {operation_id} did not finish within {timeout:.0f} s.")
