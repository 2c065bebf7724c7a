"""Notebook 14's side of serving: a trained model's saved weights, an endpoint sized and priced before
it is created, and one OpenAI-compatible address for sessions and endpoints.

- ``saved_weights``: the last weights a training session saved (its model packages, newest last).
- ``merged_weights``: where a ``save_weights(merge_weights=True)`` package keeps ``hf_merged/``, the
  folder an LLM container (TGI, LMI) serves, and its size.
- ``training_job_model``: a training job's ``model.tar.gz`` (the job the state file records), which
  an LLM container serves as it is.
- ``size_instance`` / ``endpoint_cost``: the cheapest GPU instance whose memory holds the weights with
  room for the KV cache (the SDK's own table of GPUs per instance type), and what an endpoint on it
  costs per hour, said before anything is created.
- ``OpenAIGateway``: an OpenAI chat-completions address on this machine (``http://127.0.0.1:<port>/v1``)
  in front of SageMaker's runtime, so that ``common.llm_client.LLMClient`` (and any OpenAI client) uses
  a training session's model or a real-time endpoint as a teacher, a judge or the model evaluated.
  The model name picks the target: ``training-session/<name>`` (its current weights),
  ``training-session/<name>@<model package ARN>`` (a saved checkpoint), ``endpoint/<name>``. The body
  goes on as it came (SampleTrainingSession and the LLM containers both read chat-completions bodies),
  signed by boto3 with this kernel's credentials; a stream is relayed as it comes. It listens on
  loopback only and asks for its own key, drawn at start: the credentials it signs with stay here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# SageMaker real-time inference, on-demand USD per instance-hour, us-east-1, approximate, from the public
# pricing page as of the date below. Endpoints bill per second for as long as they stand.
HOSTING_PRICE_DATE = "2025-05-01"
HOSTING_USD_PER_HOUR = {
    "ml.g5.2xlarge": 1.52,
    "ml.g5.4xlarge": 2.03,
    "ml.g5.12xlarge": 7.09,
    "ml.g5.48xlarge": 20.36,
    "ml.p4d.24xlarge": 37.69,
    "ml.p4de.24xlarge": 47.11,
    "ml.p5.48xlarge": 113.07,
}
# The weights, plus this share of them for the KV cache, activations and the CUDA context.
MEMORY_HEADROOM = 0.3


# --------------------------------------------------------------------------- saved weights


def saved_weights(sagemaker_client, session_name: str) -> dict:
    """The last weights ``session_name`` saved (``save_weights*``, not ``save_state``): its model package,
    described. A session saves into its model package group, under its ``OutputConfig`` path."""
    detail = sagemaker_client.describe_training_session(TrainingSessionName=session_name)["TrainingSessionDetail"]
    output = detail["OutputConfig"]["S3Location"]["Path"].rstrip("/") + "/"
    group = detail["ModelPackageGroupArn"].rsplit("/", 1)[-1]
    pages = sagemaker_client.get_paginator("list_model_packages").paginate(
        ModelPackageGroupName=group, SortBy="CreationTime", SortOrder="Descending"
    )
    for summary in (s for page in pages for s in page["ModelPackageSummaryList"]):
        package = sagemaker_client.describe_model_package(ModelPackageName=summary["ModelPackageArn"])
        container = package["InferenceSpecification"]["Containers"][0]
        if container["ModelDataSource"]["S3DataSource"]["S3Uri"].startswith(output) and not container.get(
            "IsCheckpoint"
        ):
            return {
                **package,
                "LoraConfig": detail["LoraConfig"],
                "BaseModelArn": detail["ModelConfig"]["BaseModelArn"],
            }
    raise LookupError(
        f"Training session {session_name} saved no weights in model package group {group}: run its notebook "
        "to the end (it saves the trained weights for its held-out evaluation)."
    )


def merged_weights(s3_client, package: dict) -> dict:
    """``{"S3Uri", "bytes", "files"}`` of the package's ``hf_merged/`` folder; a package saved without
    ``merge_weights=True`` has none, and the error says so."""
    uri = package["InferenceSpecification"]["Containers"][0]["ModelDataSource"]["S3DataSource"]["S3Uri"]
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    prefix = key.rstrip("/") + "/hf_merged/"
    objects = [
        o
        for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", [])
    ]
    if not any(o["Key"].endswith("config.json") for o in objects):
        raise LookupError(
            f"Model package {package['ModelPackageArn']} has no merged weights under s3://{bucket}/{prefix}: "
            "save them with save_weights_for_sampler(merge_weights=True)."
        )
    return {
        "S3Uri": f"s3://{bucket}/{prefix}",
        "bytes": sum(o["Size"] for o in objects if o["Key"].endswith(".safetensors")),
        "files": sorted(o["Key"][len(prefix) :] for o in objects),
    }


def training_job_model(sagemaker_client, s3_client, state_file: str, job_key: str = "grpo_job") -> dict:
    """``{"job", "S3Uri", "bytes"}`` of the ``model.tar.gz`` of the job the state file records under
    ``job_key`` (notebook 03 records its GRPO job as ``grpo_job``): the folder the script saved in
    ``SM_MODEL_DIR``, LoRA merged, which SageMaker packed. ``bytes`` is the archive's size, which stands
    in for the weights' (safetensors compress little). A job not recorded, or not completed, is a
    LookupError that says which notebook to run."""
    from helpers.workshop import State

    job_name = State(state_file).load().get(job_key)
    if job_name is None:
        raise LookupError(
            f"{state_file} records no {job_key}: run notebook 03 (03_boto3_grpo.ipynb) first, with this work_dir."
        )
    job = sagemaker_client.describe_training_job(TrainingJobName=job_name)
    if job["TrainingJobStatus"] != "Completed":
        raise LookupError(
            f"Training job {job_name} is {job['TrainingJobStatus']}, not Completed: run notebook 03 to its end first."
        )
    uri = job["ModelArtifacts"]["S3ModelArtifacts"]
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return {"job": job_name, "S3Uri": uri, "bytes": s3_client.head_object(Bucket=bucket, Key=key)["ContentLength"]}


# --------------------------------------------------------------------------- sizing and cost


@dataclass(frozen=True)
class InstanceChoice:
    instance_type: str
    gpus: int
    gpu_memory_gib: float
    needed_gib: float
    usd_per_hour: float

    def lines(self, hours: float) -> list[str]:
        return [
            f"{self.instance_type}: {self.gpus} GPU(s), {self.gpu_memory_gib:.0f} GiB for {self.needed_gib:.2f} GiB "
            f"(weights + {MEMORY_HEADROOM:.0%} headroom)",
            f"${self.usd_per_hour:.2f}/h (SageMaker real-time inference, us-east-1, approximate, {HOSTING_PRICE_DATE}); "
            f"standing {hours:g} h: at most ${self.usd_per_hour * hours:.2f}",
        ]


def size_instance(weights_bytes: int, region: str) -> InstanceChoice:
    """The cheapest priced instance whose GPUs hold the weights with ``MEMORY_HEADROOM``, from the SDK's
    table of GPUs per instance type (``sagemaker.core.instance_types_gpu_info``)."""
    from sagemaker.core import instance_types_gpu_info

    gpus = instance_types_gpu_info.retrieve(region or "us-east-1")
    needed = weights_bytes * (1 + MEMORY_HEADROOM) / 2**30
    fitting = [
        InstanceChoice(kind, gpus[kind]["Count"], gpus[kind]["TotalGpuMemoryInMiB"] / 1024, needed, price)
        for kind, price in HOSTING_USD_PER_HOUR.items()
        if kind in gpus and gpus[kind]["TotalGpuMemoryInMiB"] / 1024 >= needed
    ]
    if not fitting:
        raise ValueError(
            f"No instance in the price table holds {needed:.1f} GiB: add a larger one to HOSTING_USD_PER_HOUR."
        )
    return min(fitting, key=lambda choice: choice.usd_per_hour)


# --------------------------------------------------------------------------- the gateway


class OpenAIGateway:
    """See the module docstring. ``with OpenAIGateway() as gateway: LLMClient(model, base_url=gateway.base_url,
    api_key=gateway.api_key)``."""

    def __init__(self, boto_session=None):
        import boto3

        boto_session = boto_session or boto3.Session()
        self.sessions = boto_session.client("sagemakertrainingsessionruntime")
        self.endpoints = boto_session.client("sagemaker-runtime")
        self.api_key = secrets.token_urlsafe(24)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, name="openai-gateway", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def forward(self, model: str, body: bytes, stream: bool):
        """(content type, answer bytes or an iterator of them) from the target ``model`` names."""
        kind, _, target = model.partition("/")
        if kind == "endpoint" and target:
            if stream:
                answer = self.endpoints.invoke_endpoint_with_response_stream(
                    EndpointName=target, ContentType="application/json", Body=body
                )
                return answer.get("ContentType", "text/event-stream"), _payload_parts(answer["Body"])
            answer = self.endpoints.invoke_endpoint(EndpointName=target, ContentType="application/json", Body=body)
            return answer["ContentType"], answer["Body"].read()
        if kind == "training-session" and target:
            name, _, package = target.partition("@")
            extra = {"modelPackageArn": package} if package else {}
            call = (
                self.sessions.sample_training_session_with_response_stream
                if stream
                else self.sessions.sample_training_session
            )
            answer = call(trainingSessionName=name, contentType="application/json", body=body, **extra)
            data = answer["body"]
            return answer.get("contentType", "application/json"), (
                iter(lambda: data.read(4096), b"") if stream else (data.read() if hasattr(data, "read") else data)
            )
        raise _Refused(
            404,
            f"Unknown model {model!r}: name 'training-session/<name>', 'training-session/<name>@<model package ARN>' "
            "or 'endpoint/<name>'.",
        )


class _Refused(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def _payload_parts(events):
    """InvokeEndpointWithResponseStream's PayloadPart bytes; a ModelStreamError ends the stream with an
    OpenAI error event (botocore raises it while iterating)."""
    from botocore.exceptions import EventStreamError

    try:
        for event in events:
            if "PayloadPart" in event:
                yield event["PayloadPart"]["Bytes"]
    except EventStreamError as error:
        yield (
            b"data: " + json.dumps({"error": {"message": str(error), "code": "model_stream_error"}}).encode() + b"\n\n"
        )


def _handler(gateway: OpenAIGateway):
    from botocore.exceptions import BotoCoreError, ClientError

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # a notebook's output is not the place for an access log
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                if not secrets.compare_digest(self.headers.get("Authorization", ""), f"Bearer {gateway.api_key}"):
                    raise _Refused(401, "Give the gateway's api_key (OpenAIGateway.api_key).", "invalid_api_key")
                if self.path.rstrip("/") != "/v1/chat/completions":
                    raise _Refused(404, f"{self.path}: the gateway answers POST /v1/chat/completions only.")
                try:
                    request = json.loads(body)
                except ValueError:
                    raise _Refused(400, "The body is not JSON: send a chat-completions object.") from None
                if not isinstance(request, dict) or not isinstance(request.get("model"), str):
                    raise _Refused(400, "The body must be a JSON object with a model name.")
                content_type, answer = gateway.forward(request["model"], body, bool(request.get("stream")))
            except _Refused as refused:
                return self._error(refused.status, refused.message, refused.code)
            except ClientError as error:
                response = error.response
                status = response.get("OriginalStatusCode") or response["ResponseMetadata"]["HTTPStatusCode"]
                return self._error(status, response["Error"].get("Message", str(error)), response["Error"]["Code"])
            except BotoCoreError as error:  # no credentials, no connection: SageMaker was not reached
                return self._error(502, str(error), type(error).__name__)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            if isinstance(answer, bytes):
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client stopped reading
                for part in answer:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        def _error(self, status: int, message: str, code: str) -> None:
            data = json.dumps({"error": {"message": message, "type": code, "code": code}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


# --------------------------------------------------------------------------- the notebook's small steps


def trained_session(work_dir: str, notebook: str = "08_training_session_grpo") -> str:
    """The training session ``notebook`` recorded in ``<work_dir>/training_sessions.json``."""
    from pathlib import Path

    path = Path(work_dir) / "training_sessions.json"
    entries = json.loads(path.read_text()) if path.exists() else []
    for entry in entries:
        if entry["notebook"] == notebook:
            return entry["session"]
    raise LookupError(f"{path} records no session of notebook {notebook}: run it first with this work_dir.")


def base_model_id(sagemaker_client, package: dict) -> str:
    """The Hugging Face id of the base model a package's weights were trained on (its hub content)."""
    base = package["InferenceSpecification"]["Containers"][0]["BaseModel"]
    document = sagemaker_client.describe_hub_content(
        HubName="SageMakerPublicHub", HubContentType="Model", HubContentName=base["HubContentName"]
    )["HubContentDocument"]
    return json.loads(document)["HuggingfaceId"]


def streamed_deltas(body):
    """The text deltas of a chat-completions stream (``data: {...}`` lines, then ``data: [DONE]``), as
    they arrive: ``body`` is SampleTrainingSessionWithResponseStream's body."""
    pending = b""
    for part in iter(lambda: body.read(256), b""):
        pending += part
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                event = json.loads(line[len(b"data: ") :])
                if "error" in event:
                    raise RuntimeError(f"The stream ended with an error: {event['error']}")
                for choice in event["choices"]:
                    if choice["delta"].get("content"):
                        yield choice["delta"]["content"]


def adapter_config(s3_client, package: dict) -> dict:
    """The package's ``adapter_config.json``: what an inference server reads before it loads the adapter."""
    uri = package["InferenceSpecification"]["Containers"][0]["ModelDataSource"]["S3DataSource"]["S3Uri"]
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return json.loads(s3_client.get_object(Bucket=bucket, Key=key.rstrip("/") + "/adapter_config.json")["Body"].read())


def greedy_agreement(
    endpoint_runtime, endpoint_name: str, session_runtime, session_name: str, conversations, max_tokens, stop
) -> list[bool]:
    """For each conversation, whether the endpoint's greedy answer is the session's (temperature 0, the
    same body to both). Compared without surrounding whitespace, which some servers trim from a whole
    answer (transformers serve's response parser does)."""
    same = []
    for messages in conversations:
        body = json.dumps(
            {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **({"stop": stop} if stop else {})}
        ).encode()
        served = endpoint_runtime.invoke_endpoint(EndpointName=endpoint_name, ContentType="application/json", Body=body)
        session = session_runtime.sample_training_session(
            trainingSessionName=session_name, contentType="application/json", body=body
        )
        texts = [json.loads(r.read())["choices"][0]["message"]["content"] for r in (served["Body"], session["body"])]
        same.append(texts[0].strip() == texts[1].strip())
    return same


@dataclass
class Judge:
    model: str
    base_url: str
    api_key: str = dataclasses.field(repr=False)
    choice_token_ids: dict[str, int] | None
    close: object = dataclasses.field(repr=False, default=lambda: None)


def open_judge(run_mode: str, judge_model: str | None, choice_token_ids: dict | None, log_dir: str) -> Judge:
    """Notebook 13's judge: on SageMaker, ``judge_model`` at your provider (``OPENAI_BASE_URL``,
    ``OPENAI_API_KEY``); in local mode, ``transformers serve`` on the project's plain tiny model, a model
    that is neither of the two it compares, answering with one token by ``logit_bias``."""
    import os
    from pathlib import Path

    if run_mode == "local":
        import subprocess

        import local_mode
        from helpers.teacher_judge import choice_token_ids as token_ids
        from local_mode import llm_server
        from local_mode.os_utils import stop_process_group
        from local_mode.tiny_model import tiny_model_dir

        # transformers serve of the main environment (this kernel's lacks accelerate, which it loads with)
        log = open(Path(log_dir) / "judge-server.log", "w")  # noqa: SIM115 - the server's, closed with it
        process = subprocess.Popen(
            [local_mode.environment_python(), "-m", "local_mode.llm_server", str(tiny_model_dir())],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        )
        line = process.stdout.readline()  # "OPENAI_BASE_URL=<url>  model=<folder>  ..." once it answers
        if not line.startswith("OPENAI_BASE_URL="):
            stop_process_group(process.pid, 5)
            raise RuntimeError(f"The local judge's server did not start; its log: {log.name}")
        base_url, model = line.split()[0].partition("=")[2], line.split()[1].partition("=")[2]

        def close():
            stop_process_group(process.pid, 15)
            process.wait()
            log.close()

        ids = choice_token_ids or token_ids(tiny_model_dir())
        return Judge(model, base_url, llm_server.LOCAL_API_KEY, ids, close)
    missing = [name for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY") if not os.environ.get(name)]
    if missing or not judge_model:
        raise RuntimeError(
            f"Set {' and '.join(missing) or 'the variables'} in this kernel's environment and give judge_model "
            "(a name your provider lists at GET /v1/models), as for notebook 13."
        )
    return Judge(judge_model, os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], choice_token_ids)
