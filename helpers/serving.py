"""Notebook 14's side of serving: a trained model's saved weights, an endpoint sized and priced before
it is created, and one OpenAI-compatible address for sessions and endpoints.

- ``saved_weights``: the last weights a training session saved (its model packages, newest last).
- ``merged_weights``: where a ``save_weights(merge_weights=True)`` package keeps ``hf_merged/``, the
  folder an LLM container (TGI, LMI) serves, and its size.
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
