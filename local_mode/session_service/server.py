"""The local training-session endpoint: one HTTP process that speaks the protocols botocore does.

    python -m local_mode.session_service.server --root ~/.sagemaker-local [--port 0]

Which request is which, read from what botocore sends:
  * ``X-Amz-Target: SageMaker.<Operation>`` (JSON 1.1): the control plane, hub look-ups and model
    packages (control_plane.py), and the training-job operations SDK v3's ``ModelTrainer`` sends, answered
    by local mode's job engine (``local_mode.jobs.api``, as for SDK v2 in-process), and the real-time
    endpoint operations (CreateModel ... DeleteEndpoint, ``local_mode.endpoints``);
  * ``POST /endpoints/{EndpointName}/invocations[-response-stream]`` (REST-JSON, signed for ``sagemaker``):
    SageMaker's runtime, InvokeEndpoint and its streaming twin, answered by the endpoint's inference
    server (its stream relayed in event-stream messages as they come);
  * a path of the ``sagemakertrainingsessionruntime`` model (REST-JSON): the runtime (runtime.py);
  * anything signed for ``s3``, ``sts`` or ``logs``: handed to moto in this process, whose S3 is the
    local store of local mode (mirrored to ``$SAGEMAKER_LOCAL_ROOT/s3``), so the SDK's default bucket
    and the sessions' artifacts are the same objects notebooks read; CloudWatch Logs holds the logs of
    the jobs this process runs.

Only the caller drives it: it listens on loopback, and every request must carry a SigV4 signature
made with the credentials ``client_environment()`` hands out (a secret drawn once per local root and
kept, owner-only, across restarts), checked by botocore's own signer; anything else gets 403 as AWS
answers it.

Every SageMaker request is read as a JSON object (anything else is a SerializationException) and
checked against botocore's own input shape (types, required members, lengths, ranges, enums,
patterns, finite numbers) before it reaches the service, as the real endpoint does. A client's
mistake is a 4xx in the protocol's error shape; a fault of the endpoint is a 500 whose traceback
goes to the endpoint's log, never to the client.
"""

from __future__ import annotations

import argparse
import datetime
import hmac
import json
import math
import os
import re
import sys
import threading
import traceback
import uuid
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import botocore.session
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSPreparedRequest, AWSRequest
from botocore.credentials import Credentials
from botocore.validate import ParamValidator

from local_mode.endpoints import HOSTING_OPERATIONS, runtime_route
from local_mode.validation import ServiceError

from . import FAKE_ACCESS_KEY, SECRET_VARIABLE
from .profile import phase

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
# The body goes to the model as it is (chat.py reads it); the answer comes back in parts, streamed by
# the second.
CHAT_OPERATIONS = ("SampleTrainingSession", "SampleTrainingSessionWithResponseStream")
_SIGNED_SERVICE = re.compile(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/aws4_request")
# AWS's JSON services read Java integers and longs: a number outside their range is not one.
INTEGER_RANGES = {"integer": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


@cache
def service_model(name: str):
    return botocore.session.get_session().get_service_model(name)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# --------------------------------------------------------------------------- shape checks


def read_request(body: bytes) -> dict:
    """The request body as AWS's JSON protocols read it: one JSON object (empty means {})."""
    fix = "send the operation's members as one JSON object, as the SDK or botocore serialize them."
    try:
        request = json.loads(body or b"{}")
    except RecursionError:
        raise ServiceError("SerializationException", f"The request body is nested too deeply to read: {fix}") from None
    except ValueError as error:  # malformed JSON, bytes that are not UTF-8 text, a form-encoded body
        reason = "it is not UTF-8 text" if isinstance(error, UnicodeDecodeError) else f"it is not JSON ({error})"
        raise ServiceError("SerializationException", f"The request body could not be read: {reason}; {fix}") from None
    if not isinstance(request, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(request), "a number")
        raise ServiceError("SerializationException", f"The request body is JSON {kind}, not a JSON object: {fix}")
    _refuse_non_finite(_non_finite(request, ""))
    return request


def _refuse_non_finite(found) -> None:
    found = list(found)
    if found:
        where, value = found[0]
        raise ServiceError(
            "ValidationException",
            f"Value {_json_number(value)} at '{where}' is not a finite number ({len(found)} such value"
            f"{'s' if len(found) > 1 else ''} in the request): every number must be finite, and NaN and "
            "Infinity are refused. Fix what produced it (a loss or advantage divided by zero, an overflow) and "
            "send the request again.",
        )


def _non_finite(value, where: str):
    if isinstance(value, float) and not math.isfinite(value):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _non_finite(item, f"{where}[{index}]")


def _json_number(value) -> str:
    if isinstance(value, str):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _non_finite_members(value, shape, where: str):
    """Number members sent as the strings "NaN", "Infinity", "-Infinity": how botocore serializes a
    non-finite float or double (Smithy's JSON protocols), which its validator then calls a wrong type."""
    kind = shape.type_name
    if kind in ("double", "float") and value in ("NaN", "Infinity", "-Infinity"):
        yield where, value
    elif kind == "structure" and isinstance(value, dict) and not getattr(shape, "is_document_type", False):
        for name, member in shape.members.items():
            if name in value:
                yield from _non_finite_members(value[name], member, f"{where}.{name}" if where else name)
    elif kind == "list" and isinstance(value, list):
        for index, item in enumerate(value):
            yield from _non_finite_members(item, shape.member, f"{where}[{index}]")
    elif kind == "map" and isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite_members(item, shape.value, f"{where}.{key}")


def check_shape(params: dict, shape) -> None:
    """botocore's own validator (types, required, min), then what it leaves to the service:
    maxima, integer ranges, enums and patterns. Raises ValidationException in SageMaker's wording."""
    _refuse_non_finite(_non_finite_members(params, shape, ""))
    try:
        report = ParamValidator().validate(params, shape)
    except (OverflowError, OSError, RuntimeError) as error:  # a timestamp past what a date can hold
        raise ServiceError(
            "ValidationException", f"A timestamp in the request is out of range ({error}): give epoch seconds."
        ) from None
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
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"Value '{value}' at '{where}' failed to satisfy constraint: Member must be a number")
            return
        low, high = INTEGER_RANGES.get(kind, (-math.inf, math.inf))
        if not low <= value <= high:
            problems.append(
                f"Value '{value}' at '{where}' failed to satisfy constraint: Member must be a {kind} in [{low}, {high}]"
            )
        elif "max" in meta and value > meta["max"]:
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


# --------------------------------------------------------------------------- errors, as each protocol sends them


def json_error(status: int, code: str, message: str) -> tuple[int, dict, bytes]:
    """JSON 1.1 (SageMaker's control plane, CloudWatch Logs): ``{"__type", "message"}``."""
    body = json.dumps({"__type": code, "message": message}).encode()
    return status, {"Content-Type": "application/x-amz-json-1.1", "x-amzn-ErrorType": code}, body


def rest_json_error(status: int, code: str, message: str) -> tuple[int, dict, bytes]:
    """REST-JSON (the runtime): the code in ``x-amzn-ErrorType``, ``{"message"}`` in the body."""
    return (
        status,
        {"Content-Type": "application/json", "x-amzn-ErrorType": code},
        json.dumps({"message": message}).encode(),
    )


def xml_error(status: int, code: str, message: str, service: str) -> tuple[int, dict, bytes]:
    """S3's ``<Error>``, or the query protocol's ``<ErrorResponse>`` (STS)."""
    from xml.sax.saxutils import escape

    error = f"<Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
    if service == "s3":
        body = f'<?xml version="1.0" encoding="UTF-8"?>\n<Error>{error}</Error>'
    else:
        body = f"<ErrorResponse><Error><Type>Sender</Type>{error}</Error></ErrorResponse>"
    return status, {"Content-Type": "application/xml"}, body.encode()


# --------------------------------------------------------------------------- signatures

SIGNATURE_LIFETIME = datetime.timedelta(minutes=15)  # AWS refuses an older or later X-Amz-Date
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request,"
    r"\s*SignedHeaders=(?P<headers>[^,]+),\s*Signature=(?P<signature>[0-9a-f]{64})"
)
# The codes AWS answers in each protocol: (unsigned, unknown access key, signature mismatch).
REFUSALS = {
    "json": ("MissingAuthenticationTokenException", "UnrecognizedClientException", "InvalidSignatureException"),
    "s3": ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"),
    "sts": ("MissingAuthenticationToken", "InvalidClientTokenId", "SignatureDoesNotMatch"),
}


class Signatures:
    """Checks a request's SigV4 signature by computing it again with botocore's own signer (its
    canonical request, string to sign and signature) from the endpoint's credentials."""

    def __init__(self, access_key: str, secret_key: str):
        self.credentials = Credentials(access_key, secret_key)

    def refusal(self, method: str, path: str, headers, body: bytes) -> tuple[int, str, str] | None:
        """None when the request is signed by the endpoint's credentials; else (which, code index, message)."""
        hint = (
            "Point the client at this endpoint with the variables its client_environment() returns "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and the endpoint URLs), before the client is built."
        )
        authorization = headers.get("Authorization", "")
        signed = _AUTHORIZATION.fullmatch(authorization.strip())
        if signed is None:
            what = "is not signed" if not authorization else "has an Authorization header that is not AWS SigV4"
            return 0, f"Missing Authentication Token: the request {what}. {hint}"
        if signed["key"] != self.credentials.access_key:
            return 1, (
                f"The security token included in the request is invalid: access key {signed['key']} is not the "
                f"one this local endpoint hands out. {hint}"
            )
        stamp = headers.get("X-Amz-Date", "")
        try:
            when = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ")
        except ValueError:
            return 2, f"The request has no valid X-Amz-Date ({stamp!r}): sign it with an AWS SDK. {hint}"
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        if abs(now - when) > SIGNATURE_LIFETIME:
            return 2, (
                f"Signature expired: {stamp} is more than 15 minutes away from the endpoint's time "
                f"{now:%Y%m%dT%H%M%SZ}. Sign each request when it is sent (check this machine's clock)."
            )
        names = signed["headers"].split(";")
        request = AWSRequest(
            method=method,
            url=f"http://{headers.get('Host', '')}{path}",
            data=body,
            headers={name: headers.get(name, "") for name in names},
        )
        request.context["timestamp"] = stamp
        signer = (S3SigV4Auth if signed["service"] == "s3" else SigV4Auth)(
            self.credentials, signed["service"], signed["region"]
        )
        string_to_sign = signer.string_to_sign(request, signer.canonical_request(request))
        if not hmac.compare_digest(signer.signature(string_to_sign, request), signed["signature"]):
            return 2, (
                "The request signature we calculated does not match the signature you provided: the secret "
                f"access key is not this endpoint's, or the request changed after it was signed. {hint}"
            )
        return None


# --------------------------------------------------------------------------- the server


class RequestRouter:
    def __init__(self, root: Path, region: str, secret_key: str):
        from local_mode.jobs.api import SageMakerAPI  # the training jobs this endpoint also runs
        from local_mode.jobs.aws import LocalAWS

        from .control_plane import ControlPlane
        from .runtime import Runtime

        self.signatures = Signatures(FAKE_ACCESS_KEY, secret_key)
        self.aws = LocalAWS(root, region)
        self.control_plane_api = ControlPlane(self.aws, region)
        self.runtime_api = Runtime(self.control_plane_api)
        self.control_plane_api.go_live = self.runtime_api.go_live
        self.jobs = SageMakerAPI(self.aws)
        from moto.core.models import botocore_stubber

        self.moto = botocore_stubber

    # ---- SageMaker (JSON 1.1)
    def control_plane(self, target: str, body: bytes) -> tuple[int, dict, bytes]:
        operation = target.split(".", 1)[1]
        try:
            answers = CONTROL_PLANE_OPERATIONS + TRAINING_JOB_OPERATIONS + HOSTING_OPERATIONS
            if operation not in answers:
                raise ServiceError(
                    "ValidationException",
                    f"The local endpoint answers {', '.join(answers)}; {operation} needs SageMaker.",
                )
            request = read_request(body)
            check_shape(request, service_model("sagemaker").operation_model(operation).input_shape)
            if operation in HOSTING_OPERATIONS:
                response = self.jobs.hosting.operations[operation](request)
            else:
                handler = self.jobs if operation in TRAINING_JOB_OPERATIONS else self.control_plane_api
                response = getattr(handler, _snake(operation))(request)
            return 200, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(response).encode()
        except ServiceError as error:
            return json_error(error.status, error.code, error.message)

    # ---- SageMaker's runtime (REST-JSON): real-time endpoints
    def invocation(self, method: str, path: str, body: bytes, headers) -> tuple[int, dict, object] | None:
        route = runtime_route(method, path)
        if route is None:
            return None
        operation, name = route
        shape = service_model("sagemaker-runtime").operation_model(operation).input_shape
        try:
            check_shape({"EndpointName": name, "Body": body}, shape)
        except ServiceError as error:
            return rest_json_error(400, "ValidationError", error.message)
        return self.jobs.hosting.invoke(operation, name, body, headers)

    # ---- runtime (REST-JSON)
    def runtime(self, method: str, path: str, body: bytes, headers=None) -> tuple[int, dict, bytes] | None:
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
        try:
            if operation in CHAT_OPERATIONS:
                headers = headers or {}
                name = unquote(match["trainingSessionName"])
                check_shape(
                    {"trainingSessionName": name, "body": body},
                    service_model(RUNTIME).operation_model(operation).input_shape,
                )
                content_type, parts = self.runtime_api.sample_chat(
                    name, body, headers.get("Content-Type"), headers.get("X-Amzn-SageMaker-Model-Package")
                )
                if operation == "SampleTrainingSession":
                    parts = b"".join(parts)
                return 200, {"Content-Type": content_type}, parts
            with phase(f"http:{operation}", bytes_in=len(body)):  # a result's long-poll wait included
                shape = service_model(RUNTIME).operation_model(operation).input_shape
                # Members bound to the URI are read from it only: a body cannot name another session.
                in_uri = {n for n, m in shape.members.items() if m.serialization.get("location")}
                request = {k: v for k, v in read_request(body).items() if k not in in_uri}
                request.update({k: unquote(v) for k, v in match.groupdict().items()})
                check_shape(request, shape)
                response = getattr(self.runtime_api, RUNTIME_OPERATIONS[operation])(request)
                return 200, {"Content-Type": "application/json"}, json.dumps(response).encode()
        except ServiceError as error:
            code = {"ResourceNotFound": "ResourceNotFoundException"}.get(error.code, error.code)
            status = {"ResourceNotFoundException": 404, "ConflictException": 409}.get(code, error.status)
            return rest_json_error(status, code, error.message)

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
        if service == "s3" and method in ("GET", "HEAD"):
            self._catch_up(path)
        if service == "s3" and "x-amz-copy-source" in (name.lower() for name in headers):
            source = next(v for k, v in headers.items() if k.lower() == "x-amz-copy-source")
            bucket, _, key = unquote(source).lstrip("/").partition("/")
            if bucket and key:
                self.aws.catch_up(bucket, key.split("?versionId=")[0], exact=True)
        status, out_headers, out_body = self.moto.process_request(request)
        if isinstance(out_body, str):
            out_body = out_body.encode()
        if service == "s3" and status < 300:
            self._mirror(method, path)
        return status, dict(out_headers), out_body or b""

    def _catch_up(self, path: str) -> None:
        """Before a read: the objects another local-mode process wrote to disk since this one started (a
        notebook kernel's training job), so that every client sees one S3, as on AWS."""
        parts = urlsplit(path)
        bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
        if key:  # an object
            self.aws.catch_up(bucket, key, exact=True)
            return
        prefix = parse_qs(parts.query).get("prefix", [""])[0]  # a listing (a whole bucket is not scanned)
        if bucket and prefix:
            self.aws.catch_up(bucket, prefix)

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
    router: RequestRouter

    def log_message(self, format, *args):  # noqa: A002 - quiet: one line per poll would flood the log
        pass

    def _refused(self, body: bytes, target: str, service: str, is_runtime: bool):
        """403 in the error shape of the protocol spoken, or None for a request the caller signed."""
        refusal = self.router.signatures.refusal(self.command, self.path, self.headers, body)
        if refusal is None:
            return None
        which, message = refusal
        if target or is_runtime:
            code = REFUSALS["json"][which]
            return (rest_json_error if is_runtime else json_error)(403, code, message)
        protocol = "sts" if service == "sts" else "s3"
        return xml_error(403, REFUSALS[protocol][which], message, protocol)

    def _handle(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True  # the body's end is unknown: nothing more can be read from it
            answer = json_error(400, "SerializationException", "Content-Length must be a whole number of bytes.")
            length = 0
        else:
            answer = None
        body = self.rfile.read(length) if length else b""
        target = self.headers.get("X-Amz-Target", "")
        signed = _SIGNED_SERVICE.search(self.headers.get("Authorization", ""))
        service = signed.group(1) if signed else ""
        is_runtime = not target and self.path.startswith(("/v1/training-sessions", "/training-sessions", "/endpoints/"))
        try:
            answer = answer or self._refused(body, target, service, is_runtime)
            if answer is None and target.startswith("SageMaker."):
                answer = self.router.control_plane(target, body)
            elif answer is None and (service == "sagemaker" or is_runtime):
                path = urlsplit(self.path).path
                answer = self.router.invocation(self.command, path, body, self.headers)
                answer = answer or self.router.runtime(self.command, path, body, self.headers)
            if answer is None:
                answer = self.router.aws_service(service or "s3", self.command, self.path, dict(self.headers), body)
        except Exception:  # noqa: BLE001 - a fault of the endpoint, not of the request
            # The traceback goes to the endpoint's log (service.log); the client gets no internals.
            print(
                f"[local-mode] {self.command} {self.path} failed:\n{traceback.format_exc()}",
                file=sys.stderr,
                flush=True,
            )
            message = (
                "The local training-session endpoint failed on this request; its traceback is in service.log "
                "in the training-sessions folder of $SAGEMAKER_LOCAL_ROOT."
            )
            answer = (rest_json_error if is_runtime else json_error)(500, "InternalServerException", message)
        status, headers, out = answer
        self.send_response(status)
        # A HEAD answer has no body, and its Content-Length is the object's (S3's HeadObject size).
        head_length = next((v for k, v in headers.items() if k.lower() == "content-length"), "0")
        headers = {k: v for k, v in headers.items() if k.lower() not in ("content-length", "transfer-encoding")}
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        if not isinstance(out, bytes):  # a streamed answer: each part as it comes, in HTTP/1.1 chunks
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in out:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("Content-Length", str(head_length if self.command == "HEAD" else len(out)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle


def serve(root: Path, region: str, port: int, ready_file: Path | None, secret_key: str) -> None:
    import torch

    # One thread per operation: on a shared CPU more threads contend (sampling ran 40x slower with 2).
    torch.set_num_threads(int(os.environ.get("SAGEMAKER_LOCAL_SESSION_THREADS", "1")))
    Handler.router = RequestRouter(root, region, secret_key)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)  # loopback only: no other machine reaches it
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
    # The secret the requests must be signed with, from the starting process; taken out of the
    # environment so that the training jobs this process runs do not inherit it.
    secret_key = os.environ.pop(SECRET_VARIABLE, None)
    if not secret_key:
        parser.error(f"{SECRET_VARIABLE} must hold the secret access key the endpoint accepts.")
    serve(
        Path(args.root).expanduser(),
        args.region,
        args.port,
        Path(args.ready_file) if args.ready_file else None,
        secret_key,
    )


if __name__ == "__main__":
    main()
