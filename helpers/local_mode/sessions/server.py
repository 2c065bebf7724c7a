"""The local training-session endpoint: one HTTP process that speaks the protocols botocore does.

    python -m helpers.local_mode.sessions.server --root ~/.sagemaker-local [--port 0]

Which request is which, read from what botocore sends:
  * ``X-Amz-Target: SageMaker.<Operation>`` (JSON 1.1): the control plane, hub look-ups and model
    packages (service.py), and the training-job operations SDK v3's ``ModelTrainer`` sends, answered
    by local mode's job engine (``helpers.local_mode.api``, as for SDK v2 in-process);
  * a path of the ``sagemakertrainingsessionruntime`` model (REST-JSON): the runtime;
  * anything signed for ``s3``, ``sts`` or ``logs``: handed to moto in this process, whose S3 is the
    local store of local mode (mirrored to ``$SAGEMAKER_LOCAL_ROOT/s3``), so the SDK's default bucket
    and the sessions' artifacts are the same objects notebooks read; CloudWatch Logs holds the logs of
    the jobs this process runs.

Every SageMaker request is checked against botocore's own input shape (types, required members,
lengths, ranges, enums, patterns) before it reaches the service, as the real endpoint does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
import traceback
import uuid
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import botocore.session
from botocore.awsrequest import AWSPreparedRequest
from botocore.validate import ParamValidator

from ..api import SageMakerAPI
from ..validation import ServiceError

RUNTIME = "sagemakertrainingsessionruntime"
CONTROL_PLANE_OPERATIONS = (
    "CreateTrainingSession",
    "DescribeTrainingSession",
    "ListTrainingSessions",
    "StopTrainingSession",
    "DeleteTrainingSession",
    "ListHubContents",
    "DescribeHubContent",
    "CreateModelPackageGroup",
    "DescribeModelPackageGroup",
    "ListModelPackages",
    "DescribeModelPackage",
    "DeleteModelPackage",
)
# ModelTrainer.train() and TrainingJob.wait(): run by local mode's job engine in this process.
TRAINING_JOB_OPERATIONS = ("CreateTrainingJob", "DescribeTrainingJob", "ListTrainingJobs", "StopTrainingJob")
RUNTIME_OPERATIONS = {
    "ExecuteTrainingOperation": "execute_training_operation",
    "GetTrainingOperationResult": "operation_result",
    "ExecuteSamplingOperation": "execute_sampling_operation",
    "GetSamplingOperationResult": "sampling_operation_result",
}
_SIGNED_SERVICE = re.compile(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/aws4_request")


@cache
def service_model(name: str):
    return botocore.session.get_session().get_service_model(name)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# --------------------------------------------------------------------------- shape checks


def check_shape(params: dict, shape) -> None:
    """botocore's own validator (types, required, min), then what it leaves to the service:
    maxima, enums and patterns. Raises ValidationException in SageMaker's wording."""
    report = ParamValidator().validate(params, shape)
    if report.has_errors():
        raise ServiceError("ValidationException", report.generate_report())
    problems: list[str] = []
    _walk(params, shape, shape.name[:1].lower() + shape.name[1:], problems)
    if problems:
        raise ServiceError(
            "ValidationException",
            f"{len(problems)} validation error{'s' if len(problems) > 1 else ''} detected: " + "; ".join(problems),
        )


def _walk(value, shape, where: str, problems: list[str]) -> None:
    meta = shape.metadata
    kind = shape.type_name
    if value is None:
        return
    if kind == "structure":
        if getattr(shape, "is_document_type", False):
            return
        for name, member in shape.members.items():
            if isinstance(value, dict) and name in value:
                _walk(value[name], member, f"{where}.{name[:1].lower() + name[1:]}", problems)
    elif kind == "list":
        if "max" in meta and len(value) > meta["max"]:
            problems.append(
                f"Value at '{where}' failed to satisfy constraint: Member must have length less than "
                f"or equal to {meta['max']}"
            )
        for index, item in enumerate(value):
            _walk(item, shape.member, f"{where}.{index + 1}.member", problems)
    elif kind == "map":
        for key, item in value.items():
            _walk(item, shape.value, f"{where}.{key}", problems)
    elif kind in ("integer", "long", "double", "float"):
        if "max" in meta and value > meta["max"]:
            problems.append(
                f"Value '{value}' at '{where}' failed to satisfy constraint: Member must have value "
                f"less than or equal to {meta['max']}"
            )
    elif kind == "string":
        if shape.enum and value not in shape.enum:
            problems.append(
                f"Value '{value}' at '{where}' failed to satisfy constraint: Member must satisfy enum "
                f"value set: [{', '.join(shape.enum)}]"
            )
        if "max" in meta and len(value) > meta["max"]:
            problems.append(
                f"Value '{value}' at '{where}' failed to satisfy constraint: Member must have length "
                f"less than or equal to {meta['max']}"
            )
        pattern = meta.get("pattern")
        if pattern:
            try:
                matched = re.fullmatch(pattern, value)
            except re.error:  # a Java-only construct (\p{L}...): the real service checks it, we cannot
                matched = True
            if not matched:
                problems.append(
                    f"Value '{value}' at '{where}' failed to satisfy constraint: Member must satisfy "
                    f"regular expression pattern: {pattern}"
                )


# --------------------------------------------------------------------------- runtime routes


@cache
def runtime_routes() -> list[tuple[str, re.Pattern, str]]:
    model = service_model(RUNTIME)
    routes = []
    for name in model.operation_names:
        http = model.operation_model(name).http
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(http["requestUri"]))
        routes.append((http["method"], re.compile(f"^{regex}$"), name))
    return routes


# --------------------------------------------------------------------------- the server


class Endpoint:
    def __init__(self, root: Path, region: str):
        from ..aws import LocalAWS
        from .service import SessionService

        self.aws = LocalAWS(root, region)
        self.service = SessionService(self.aws, region)
        self.jobs = SageMakerAPI(self.aws)
        from moto.core.models import botocore_stubber

        self.moto = botocore_stubber

    # ---- SageMaker (JSON 1.1)
    def control_plane(self, target: str, body: bytes) -> tuple[int, dict, bytes]:
        operation = target.split(".", 1)[1]
        try:
            answers = CONTROL_PLANE_OPERATIONS + TRAINING_JOB_OPERATIONS
            if operation not in answers:
                raise ServiceError(
                    "ValidationException",
                    f"The local endpoint answers {', '.join(answers)}; {operation} needs SageMaker.",
                )
            request = json.loads(body or b"{}")
            check_shape(request, service_model("sagemaker").operation_model(operation).input_shape)
            handler = self.jobs if operation in TRAINING_JOB_OPERATIONS else self.service
            response = getattr(handler, _snake(operation))(request)
            return 200, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(response).encode()
        except ServiceError as error:
            return (
                error.status,
                {"Content-Type": "application/x-amz-json-1.1"},
                json.dumps({"__type": error.code, "message": error.message}).encode(),
            )

    # ---- runtime (REST-JSON)
    def runtime(self, method: str, path: str, body: bytes) -> tuple[int, dict, bytes] | None:
        found = next(
            (
                (operation, match)
                for route_method, pattern, operation in runtime_routes()
                if route_method == method and (match := pattern.match(path))
            ),
            None,
        )
        if found is None:
            return None
        operation, match = found
        headers = {"Content-Type": "application/json"}
        try:
            if operation not in RUNTIME_OPERATIONS:
                raise ServiceError(
                    "ValidationException",
                    f"{operation} sends a request body to the model as is; the local endpoint "
                    "serves the operation API (ExecuteSamplingOperation) instead.",
                )
            request = {k: unquote(v) for k, v in match.groupdict().items()}
            request.update(json.loads(body or b"{}"))
            check_shape(request, service_model(RUNTIME).operation_model(operation).input_shape)
            response = getattr(self.service, RUNTIME_OPERATIONS[operation])(request)
            return 200, headers, json.dumps(response).encode()
        except ServiceError as error:
            code = {"ResourceNotFound": "ResourceNotFoundException"}.get(error.code, error.code)
            status = {"ResourceNotFoundException": 404, "ConflictException": 409}.get(code, error.status)
            return (
                status,
                {**headers, "x-amzn-ErrorType": code},
                json.dumps({"message": error.message}).encode(),
            )

    # ---- S3, STS and CloudWatch Logs: moto, with S3 writes mirrored to disk
    def aws_service(self, service: str, method: str, path: str, headers: dict, body: bytes):
        host = {
            "s3": "s3.amazonaws.com",
            "sts": "sts.amazonaws.com",
            "logs": f"logs.{self.aws.region}.amazonaws.com",
        }.get(service)
        if host is None:
            return (
                400,
                {"Content-Type": "text/plain"},
                f"The local endpoint does not serve {service}.".encode(),
            )
        headers = {k: v for k, v in headers.items() if k.lower() != "host"}
        headers["Host"] = host
        request = AWSPreparedRequest(method, f"https://{host}{path}", headers, body, stream_output=False)
        status, out_headers, out_body = self.moto.process_request(request)
        if isinstance(out_body, str):
            out_body = out_body.encode()
        if service == "s3" and status < 300:
            self._mirror(method, path)
        return status, dict(out_headers), out_body or b""

    def _mirror(self, method: str, path: str) -> None:
        parts = urlsplit(path)
        query = parse_qs(parts.query, keep_blank_values=True)
        bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
        storage = self.aws.storage
        if not key:
            if method == "PUT" and not query:
                storage.mirror_bucket(bucket)
            elif method == "POST" and "delete" in query:
                storage.mirror_bucket(bucket)  # DeleteObjects: re-read below is simpler than parsing XML
                live = set(self.aws.list_keys(bucket, ""))
                for _, stored_key, _ in [o for o in storage.s3_objects() if o[0] == bucket and o[1]]:
                    if stored_key not in live:
                        storage.mirror_delete(bucket, stored_key)
            return
        if (method == "PUT" and "partNumber" not in query) or (method == "POST" and "uploadId" in query):
            data = self.aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            storage.mirror_put(bucket, key, data)
        elif method == "DELETE" and not query:
            storage.mirror_delete(bucket, key)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle's algorithm and the client's delayed ACK the
    # second waits ~40 ms, on every call.
    disable_nagle_algorithm = True
    endpoint: Endpoint

    def log_message(self, format, *args):  # noqa: A002 - quiet: one line per poll would flood the log
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            target = self.headers.get("X-Amz-Target", "")
            signed = _SIGNED_SERVICE.search(self.headers.get("Authorization", ""))
            service = signed.group(1) if signed else ""
            answer = None
            if target.startswith("SageMaker."):
                answer = self.endpoint.control_plane(target, body)
            elif service == "sagemaker" or self.path.startswith(("/v1/training-sessions", "/training-sessions")):
                answer = self.endpoint.runtime(self.command, urlsplit(self.path).path, body)
            if answer is None:
                answer = self.endpoint.aws_service(service or "s3", self.command, self.path, dict(self.headers), body)
        except Exception:  # noqa: BLE001 - answered as the service's 500, with the reason
            answer = (
                500,
                {"Content-Type": "application/json", "x-amzn-ErrorType": "InternalServerException"},
                json.dumps({"__type": "InternalServerException", "message": traceback.format_exc(limit=3)}).encode(),
            )
        status, headers, out = answer
        self.send_response(status)
        headers = {k: v for k, v in headers.items() if k.lower() not in ("content-length", "transfer-encoding")}
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        self.send_header("Content-Length", str(0 if self.command == "HEAD" else len(out)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle


def serve(root: Path, region: str, port: int, ready_file: Path | None) -> None:
    import torch

    # One thread per operation: on a shared CPU more threads contend (sampling ran 40x slower with 2).
    torch.set_num_threads(int(os.environ.get("SAGEMAKER_LOCAL_SESSION_THREADS", "1")))
    Handler.endpoint = Endpoint(root, region)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    if ready_file is not None:
        info = {"port": server.server_address[1], "pid": os.getpid(), "region": region, "root": str(root)}
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, ready_file)
    print(f"[local-mode] training-session endpoint on http://127.0.0.1:{server.server_address[1]}", flush=True)
    threading.current_thread().name = "endpoint"
    server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file")
    args = parser.parse_args()
    serve(
        Path(args.root).expanduser(),
        args.region,
        args.port,
        Path(args.ready_file) if args.ready_file else None,
    )


if __name__ == "__main__":
    main()
