"""What the training-session notebooks share: connecting, datum construction, the session's lifetime,
billing and metric records.

The loops are in the notebooks (07 SFT, 08 GRPO, 09 code RL): they run in the notebook's process and
drive a SageMaker training session with the SDK v3 clients (``sagemaker.train.training_session``); the
service keeps the model on its GPUs, the loop decides every step. Losses on the service are **sums**
over tokens and datums: the loop owns normalisation (the notebooks divide by the step's target tokens).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import subprocess
import time
from pathlib import Path

from helpers.local_account import LOCAL_ROLE  # the role local mode answers for (also the job notebooks')
from session_loops import REPO

# Prices per million tokens, an assumption for the estimate only: replace them with your Region's
# figures from the SageMaker pricing page (training sessions bill prefill, sample and training tokens).
PRICE_PER_MILLION = {"prefill": 0.10, "sample": 0.30, "training": 0.60}


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
    python = os.environ.get("MAIN_ENV_PYTHON") or str(REPO / ".venv" / "bin" / "python")
    code = (
        "import json; from helpers.local_mode import sessions; "
        f"print(json.dumps(sessions.start_service({str(root) if root else None!r}).client_environment()))"
    )
    done = subprocess.run([python, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(
            f"Local mode could not start the training-session endpoint with {python}:\n"
            f"{done.stderr[-2000:]}\nBuild the main environment first (README: make .venv/.stamp), "
            "or set MAIN_ENV_PYTHON to its python."
        )
    environment = json.loads(done.stdout.strip().splitlines()[-1])
    os.environ.update(environment)
    return environment


def local_warm_start_model(task: str = "gsm8k") -> str:
    """Local mode: the tiny model tuned to answer in the task's format ('#### n' for "gsm8k", a fenced
    program for "code"), registered with the local endpoint (built once per machine by
    ``local_warm_start.py`` in the main environment, which has torch)."""
    python = os.environ.get("MAIN_ENV_PYTHON") or str(REPO / ".venv" / "bin" / "python")
    done = subprocess.run(
        [python, "-m", "session_loops.local_warm_start", "--task", task],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"Building the local warm-start model failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["base_model"]


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


# --------------------------------------------------------------------------- datums


def supervised_datum(prompt: list[int], answer: list[int]):
    """One SFT example. Position i of ``model_input`` predicts ``target_tokens[i]``: the shift by one.
    Weight 0 on targets that are prompt tokens, 1 on the answer's: only the answer is learned.

        tokens        p0 p1 p2 a0 a1 a2
        model_input   p0 p1 p2 a0 a1
        target_tokens p1 p2 a0 a1 a2
        weights       0  0  1  1  1
    """
    from sagemaker.train.training_session import Datum, ModelInput

    tokens = prompt + answer
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
    return Datum(
        model_input=ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights}
    )


def policy_gradient_datum(prompt: list[int], sample, advantage: float):
    """One sampled completion for importance_sampling / ppo: the same shift, the sampler's logprobs
    and the advantage on the completion's tokens, zeros on the prompt's."""
    from sagemaker.train.training_session import Datum, ModelInput

    tokens = prompt + list(sample.tokens)
    n_prompt, n_answer = len(prompt) - 1, len(sample.tokens)
    return Datum(
        model_input=ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "weights": [0.0] * n_prompt + [1.0] * n_answer,
            "logprobs": [0.0] * n_prompt + [float(x) for x in sample.logprobs],
            "advantages": [0.0] * n_prompt + [advantage] * n_answer,
        },
    )


def wire_datum(datum) -> dict:
    """A datum as ExecuteTrainingOperation's ``datumList`` takes it (the raw API, notebook 10)."""
    return {
        "modelInput": {"chunks": [{"tokens": datum.model_input.to_ints(), "type": "encoded_text"}]},
        "lossFnInputs": {
            "target_tokens": {"data": values(datum.loss_fn_inputs["target_tokens"]), "dtype": "int64"},
            "weights": {"data": values(datum.loss_fn_inputs["weights"]), "dtype": "float32"},
        },
    }


def target_tokens_of_wire(datum_list: list[dict]) -> int:
    return sum(sum(1 for w in d["lossFnInputs"]["weights"]["data"] if w) for d in datum_list)


def target_tokens(datums) -> int:
    """Tokens with a non-zero weight: what the summed loss is divided by."""
    return sum(sum(1 for w in values(d.loss_fn_inputs["weights"]) if w) for d in datums)


def values(tensor) -> list:
    """A loss input or output as a plain list (a TensorData, its wire dict, or a list)."""
    if isinstance(tensor, dict):
        return tensor["data"]
    return list(getattr(tensor, "data", tensor))


# --------------------------------------------------------------------------- RL pieces


def ratio_stats(datums, outputs, low: float, high: float) -> dict[str, float]:
    """How off-policy the batch was: the training model's logprobs (returned by forward_backward, before
    this step's update) against the sampler's, over the completion tokens. ``clip_fraction`` is the share
    of tokens whose ratio lies outside [low, high]."""
    n = outside = 0
    kl = 0.0
    for datum, output in zip(datums, outputs, strict=True):
        inputs = datum.loss_fn_inputs
        for w, old, new in zip(
            values(inputs["weights"]), values(inputs["logprobs"]), values(output["logprobs"]), strict=True
        ):
            if w:
                ratio = math.exp(new - old)
                outside += not (low <= ratio <= high)
                kl += old - new
                n += 1
    return {"clip_fraction": outside / max(n, 1), "sampler_kl": kl / max(n, 1)}


# --------------------------------------------------------------------------- billing and metrics


def billable_tokens(training_session_name: str) -> dict[str, int]:
    """The session's BillableTokenUsage from DescribeTrainingSession."""
    import boto3

    detail = boto3.client("sagemaker").describe_training_session(TrainingSessionName=training_session_name)[
        "TrainingSessionDetail"
    ]
    usage = detail.get("BillableTokenUsage", {})
    return {
        "prefill": usage.get("PrefillTokenCount", 0),
        "sample": usage.get("SampleTokenCount", 0),
        "training": usage.get("TrainingTokenCount", 0),
    }


def cost(tokens: dict[str, int]) -> float:
    return sum(tokens[kind] * PRICE_PER_MILLION[kind] / 1e6 for kind in PRICE_PER_MILLION)


def log_step(history: list[dict], record: dict) -> None:
    """Keep the step's metrics and print them as one line (readable in a notebook, a terminal or a log)."""
    record = {"step": len(history) + 1, **record, "time": round(time.time(), 3)}
    history.append(record)
    print(
        "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items() if k != "time"),
        flush=True,
    )


def largest_difference(records: list[dict], others: list[dict]) -> float:
    """The largest absolute difference between two runs' step records, over every number they both hold
    but the clock's (``time``, ``judge_time``): 0.0 when a resumed run repeated the steps exactly."""
    largest = 0.0
    for one, other in zip(records, others, strict=True):
        for key in one.keys() & other.keys() - {"time", "judge_time"}:
            if isinstance(one[key], (int, float)) and isinstance(other[key], (int, float)):
                largest = max(largest, abs(one[key] - other[key]))
    return largest


def record(work_dir: str | os.PathLike, notebook: str, training_client, history: list[dict], **extra) -> dict:
    """Append this notebook's session (name, status, steps, final metrics, billable tokens) to
    ``<work_dir>/training_sessions.json``, which the main job's summary reads."""
    import boto3

    name = training_client.training_session_name
    detail = boto3.client("sagemaker").describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    entry = {
        "notebook": notebook,
        "session": name,
        "status": detail["TrainingSessionStatus"],
        "steps": len(history),
        "final_metrics": {k: v for k, v in (history[-1] if history else {}).items() if k not in ("step", "time")},
        "billable_tokens": billable_tokens(name),
        **extra,
    }
    path = Path(work_dir) / "training_sessions.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = [e for e in (json.loads(path.read_text()) if path.exists() else []) if e["notebook"] != notebook]
    path.write_text(json.dumps(entries + [entry], indent=1))
    return entry
