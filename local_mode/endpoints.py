"""SageMaker real-time endpoints on this machine: models, endpoint configs, endpoints and their runtime.

Each endpoint is a real inference server process, ``transformers serve`` (local_mode/llm_server.py), on a
free loopback port, serving the folder its model's data unpacks to: ``ModelDataUrl`` (an s3://
``model.tar.gz`` in local mode's S3) or ``ModelDataSource.S3DataSource`` (a ``model.tar.gz``, or an
uncompressed prefix with ``CompressionType`` None). The folder is what ``save_pretrained`` wrote, at the
top of the archive or prefix, as SageMaker's LLM containers read ``/opt/ml/model``.

The body format is that of the LLM containers (Hugging Face TGI, ``get_huggingface_llm_image_uri``, and
LMI): their Messages API, an OpenAI chat-completions body
(``{"messages": [...], "max_tokens": 64, "temperature": 0, "stream": false}``), answered with a
``chat.completion`` object, or with ``chat.completion.chunk`` server-sent events when it asks to stream.
InvokeEndpoint forwards the body to the server's chat-completions route and returns its answer;
InvokeEndpointWithResponseStream relays the server's bytes as they come, in ``PayloadPart`` events.
Those containers serve one model and ignore the body's ``model``; here it is set to the served folder.

What SageMaker answers, answered here the same way:
  * a status sequence: Creating (unpacking, starting, until the server's /health answers) -> InService,
    or Failed with a FailureReason; Deleting, then gone (DescribeEndpoint: ValidationException);
  * the container's 4xx/5xx: ModelError (HTTP 424) with OriginalStatusCode, OriginalMessage and the
    server's message in Message; its silence past 60 s (SageMaker's limit): ModelError;
  * an endpoint that is missing, Creating, Failed or Deleting: ValidationError naming its status;
  * a server process that dies: the endpoint becomes Failed with the exit status and the last lines of
    the server's log; a stream it was sending ends with a ``ModelStreamError`` event (StreamBroken).

Endpoints, like SageMaker's, outlive the Python process that created them: another kernel describes
and invokes them (state on disk, the server's pid and start time); DeleteEndpoint stops the process.
Layout under ``$SAGEMAKER_LOCAL_ROOT/hosting``: ``models/``, ``endpoint-configs/``, ``endpoints/``
(one JSON record each), ``model-data/<model>/`` (the unpacked folder), ``logs/<endpoint>.log``.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import shutil
import signal
import socket
import subprocess
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

from moto.core.eventstream import EventStreamEncoder

from local_mode.account import ACCOUNT_ID
from local_mode.os_utils import is_same_process, process_identity, stop_process_group
from local_mode.storage import _atomic_write
from local_mode.validation import ServiceError, _check_pattern, _constraint_error, _shape

HOSTING_OPERATIONS = (
    "CreateModel",
    "DescribeModel",
    "DeleteModel",
    "CreateEndpointConfig",
    "DescribeEndpointConfig",
    "DeleteEndpointConfig",
    "CreateEndpoint",
    "DescribeEndpoint",
    "DeleteEndpoint",
    "ListEndpoints",
)
INVOCATION_TIMEOUT_S = 60  # SageMaker's limit on a real-time endpoint's answer
DEFAULT_STARTUP_TIMEOUT_S = 600  # ContainerStartupHealthCheckTimeoutInSeconds when the variant gives none
STOP_GRACE_S = 10
FAILURE_REASON_MAX = 1024  # DescribeEndpoint's FailureReason holds at most this many characters
LOG_TAIL_LINES = 8
CHAT_ROUTE = "/v1/chat/completions"
READS = (
    "Send the Messages API body the LLM containers (TGI, LMI) read: an OpenAI chat-completions object such as "
    '{"messages": [{"role": "user", "content": "..."}], "max_tokens": 64, "temperature": 0}.'
)
_KINDS = {"model": "models", "endpoint-config": "endpoint-configs", "endpoint": "endpoints"}
_ENCODER = EventStreamEncoder()  # moto's AWS event-stream framing (prelude, headers, CRC32s)


def _private(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("_")}


class Hosting:
    """The hosting operations of the control plane, and the runtime's two invocations."""

    def __init__(self, aws):
        self.region = aws.region
        self.s3 = aws.s3
        self._catch_up = aws.catch_up  # model data another local-mode process wrote (a notebook's job)
        self.root = aws.storage.root / "hosting"
        for folder in (*_KINDS.values(), "model-data", "logs"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._servers: dict[str, subprocess.Popen] = {}  # the endpoints whose server this process started
        self.operations = {name: getattr(self, _snake(name)) for name in HOSTING_OPERATIONS}

    # ---- records on disk -------------------------------------------------------------------------
    def arn(self, kind: str, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{ACCOUNT_ID}:{kind}/{name.lower()}"

    def _path(self, kind: str, name: str) -> Path:
        return self.root / _KINDS[kind] / f"{name.lower()}.json"  # names are unique regardless of case

    def _load(self, kind: str, name: str) -> dict | None:
        try:
            return json.loads(self._path(kind, name).read_text())
        except FileNotFoundError:
            return None

    def _save(self, kind: str, name: str, record: dict) -> None:
        _atomic_write(self._path(kind, name), json.dumps(record, indent=1).encode())

    def _require(self, kind: str, name: str) -> dict:
        record = self._load(kind, name)
        if record is None:
            what = {"endpoint-config": "endpoint configuration"}.get(kind, kind)
            raise ServiceError("ValidationException", f'Could not find {what} "{self.arn(kind, name)}".')
        return record

    def _refuse_existing(self, kind: str, name: str) -> None:
        if self._load(kind, name) is not None:
            what = {"endpoint-config": "endpoint configuration"}.get(kind, kind)
            raise ServiceError(
                "ValidationException", f'Cannot create already existing {what} "{self.arn(kind, name)}".'
            )

    # ---- models ----------------------------------------------------------------------------------
    def create_model(self, request: dict) -> dict:
        name = request["ModelName"]
        _check_pattern(name, "ModelName", "modelName")
        if "ExecutionRoleArn" in request:
            _check_pattern(request["ExecutionRoleArn"], "RoleArn", "executionRoleArn")
        containers = [request["PrimaryContainer"]] if "PrimaryContainer" in request else request.get("Containers", [])
        if len(containers) != 1:
            raise ServiceError(
                "ValidationException",
                f"Local mode serves models of one container; this one has {len(containers)}. Give PrimaryContainer "
                "(the SDK: Model(image_uri=..., model_data=...)).",
            )
        self._check_model_data(_model_data(containers[0]))
        self._refuse_existing("model", name)
        record = {
            **request,
            "ModelArn": self.arn("model", name),
            "CreationTime": time.time(),
            "EnableNetworkIsolation": request.get("EnableNetworkIsolation", False),
        }
        record["_tags"] = record.pop("Tags", [])
        self._save("model", name, record)
        return {"ModelArn": record["ModelArn"]}

    def _check_model_data(self, source: dict) -> None:
        bucket, key = _split_s3(source["S3Uri"])
        try:
            self._catch_up(bucket, key)
            if source["compressed"]:
                self.s3.head_object(Bucket=bucket, Key=key)
                return
            if self.s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("KeyCount", 0):
                return
        except self.s3.exceptions.ClientError:
            pass
        raise ServiceError("ValidationException", f"Could not find model data at {source['S3Uri']}.")

    def describe_model(self, request: dict) -> dict:
        return _private(self._require("model", request["ModelName"]))

    def delete_model(self, request: dict) -> dict:
        name = request["ModelName"]
        self._require("model", name)
        self._path("model", name).unlink(missing_ok=True)
        # Its unpacked folder goes too (SmolLM2's is 538 MB); a server that runs has loaded it already.
        with open(self.root / "model-data" / f".{name.lower()}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            shutil.rmtree(self.root / "model-data" / name.lower(), ignore_errors=True)
        return {}

    # ---- endpoint configs ------------------------------------------------------------------------
    def create_endpoint_config(self, request: dict) -> dict:
        name = request["EndpointConfigName"]
        _check_pattern(name, "EndpointConfigName", "endpointConfigName")
        variants = request["ProductionVariants"]
        if len(variants) != 1:
            raise ServiceError(
                "ValidationException",
                f"Local mode serves one production variant per endpoint; this configuration has {len(variants)}. "
                "Keep one (the SDK's deploy() makes one).",
            )
        variant = variants[0]
        _check_pattern(variant["VariantName"], "VariantName", "productionVariants.1.member.variantName")
        instance_type = variant.get("InstanceType")
        if instance_type is None:
            raise ServiceError(
                "ValidationException",
                "Local mode serves instance-backed variants only: give the variant an InstanceType (serverless "
                "and inference-component endpoints need SageMaker).",
            )
        allowed = _shape("ProductionVariantInstanceType").enum
        if instance_type not in allowed:
            raise _constraint_error(
                instance_type,
                "productionVariants.1.member.instanceType",
                f"Member must satisfy enum value set: [{', '.join(allowed)}]",
            )
        self._require("model", variant["ModelName"])
        self._refuse_existing("endpoint-config", name)
        record = {**request, "EndpointConfigArn": self.arn("endpoint-config", name), "CreationTime": time.time()}
        record["_tags"] = record.pop("Tags", [])
        self._save("endpoint-config", name, record)
        return {"EndpointConfigArn": record["EndpointConfigArn"]}

    def describe_endpoint_config(self, request: dict) -> dict:
        return _private(self._require("endpoint-config", request["EndpointConfigName"]))

    def delete_endpoint_config(self, request: dict) -> dict:
        self._require("endpoint-config", request["EndpointConfigName"])
        self._path("endpoint-config", request["EndpointConfigName"]).unlink(missing_ok=True)
        return {}

    # ---- endpoints -------------------------------------------------------------------------------
    def create_endpoint(self, request: dict) -> dict:
        name = request["EndpointName"]
        _check_pattern(name, "EndpointName", "endpointName")
        config = self._require("endpoint-config", request["EndpointConfigName"])
        variant = config["ProductionVariants"][0]
        model = self._require("model", variant["ModelName"])
        now = time.time()
        with self._lock:
            self._refuse_existing("endpoint", name)
            record = {
                "EndpointName": name,
                "EndpointArn": self.arn("endpoint", name),
                "EndpointConfigName": config["EndpointConfigName"],
                "ProductionVariants": [
                    {
                        "VariantName": variant["VariantName"],
                        "DeployedImages": [{"SpecifiedImage": _image(model)}],
                        "CurrentWeight": variant.get("InitialVariantWeight", 1.0),
                        "DesiredWeight": variant.get("InitialVariantWeight", 1.0),
                        "CurrentInstanceCount": 0,
                        "DesiredInstanceCount": variant.get("InitialInstanceCount", 1),
                    }
                ],
                "EndpointStatus": "Creating",
                "CreationTime": now,
                "LastModifiedTime": now,
                "_owner": process_identity(),  # the process that brings it up (and watches its server)
                "_tags": request.get("Tags", []),
            }
            self._save("endpoint", name, record)
        timeout = variant.get("ContainerStartupHealthCheckTimeoutInSeconds", DEFAULT_STARTUP_TIMEOUT_S)
        threading.Thread(
            target=self._bring_up, args=(name, model, timeout), name=f"endpoint-{name}", daemon=True
        ).start()
        return {"EndpointArn": record["EndpointArn"]}

    def describe_endpoint(self, request: dict) -> dict:
        name = request["EndpointName"]
        record = self._current(name)
        if record is None:
            raise ServiceError("ValidationException", f'Could not find endpoint "{self.arn("endpoint", name)}".')
        return _private(record)

    def list_endpoints(self, request: dict) -> dict:
        names = [path.stem for path in (self.root / "endpoints").glob("*.json")]
        records = [r for r in (self._current(n) for n in names) if r is not None]
        if "NameContains" in request:
            records = [r for r in records if request["NameContains"].lower() in r["EndpointName"].lower()]
        if "StatusEquals" in request:
            records = [r for r in records if r["EndpointStatus"] == request["StatusEquals"]]
        records.sort(key=lambda r: r["CreationTime"], reverse=request.get("SortOrder", "Descending") == "Descending")
        keys = ("EndpointName", "EndpointArn", "CreationTime", "LastModifiedTime", "EndpointStatus")
        return {"Endpoints": [{k: r[k] for k in keys} for r in records]}

    def delete_endpoint(self, request: dict) -> dict:
        name = request["EndpointName"]
        with self._lock:
            record = self._current(name)
            if record is None:
                raise ServiceError("ValidationException", f'Could not find endpoint "{self.arn("endpoint", name)}".')
            record.update(EndpointStatus="Deleting", LastModifiedTime=time.time())
            self._save("endpoint", name, record)
        threading.Thread(target=self._tear_down, args=(name,), name=f"delete-{name}", daemon=True).start()
        return {}

    # ---- an endpoint's life ----------------------------------------------------------------------
    def _bring_up(self, name: str, model: dict, timeout_s: float) -> None:
        from local_mode import llm_server

        try:
            folder = self._model_folder(model)
        except ServiceError as error:
            self._fail(name, error.message)
            return
        port = llm_server.free_port()
        log = self.root / "logs" / f"{name.lower()}.log"
        with self._lock:
            record = self._load("endpoint", name)
            if record is None or record["EndpointStatus"] != "Creating":
                return  # deleted while its model was unpacked
            process, server = llm_server.start_server(folder, port=port, log_path=log)
            self._servers[name] = process
            record["_server"] = {**process_identity(process.pid), "port": port, "model": str(folder), "log": str(log)}
            self._save("endpoint", name, record)
        threading.Thread(target=self._watch, args=(name, process), name=f"watch-{name}", daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while process.poll() is None:
            record = self._load("endpoint", name)
            if record is None or record["EndpointStatus"] != "Creating":
                return
            if llm_server.healthy(f"http://127.0.0.1:{port}/health"):
                self._in_service(name)
                return
            if time.monotonic() > deadline:
                self._fail(
                    name,
                    f"The inference server did not answer its health check within {timeout_s:.0f} s "
                    f"(ContainerStartupHealthCheckTimeoutInSeconds). {_log_tail(log)}",
                )
                llm_server.stop_server(process, STOP_GRACE_S)
                return
            time.sleep(0.5)

    def _in_service(self, name: str) -> None:
        with self._lock:
            record = self._load("endpoint", name)
            if record is not None and record["EndpointStatus"] == "Creating":
                variant = record["ProductionVariants"][0]
                variant["CurrentInstanceCount"] = variant["DesiredInstanceCount"]
                record.update(EndpointStatus="InService", LastModifiedTime=time.time())
                self._save("endpoint", name, record)

    def _watch(self, name: str, process: subprocess.Popen) -> None:
        """Waits for the server this process started; its end, unless asked for, fails the endpoint."""
        process.wait()
        self._servers.pop(name, None)
        self._server_ended(name, process.pid, _exit_status(process.returncode))

    def _server_ended(self, name: str, pid: int, how: str) -> None:
        with self._lock:
            record = self._load("endpoint", name)
            if record is None or record.get("_server", {}).get("pid") != pid:
                return
            if record["EndpointStatus"] in ("Creating", "InService"):
                self._fail(
                    name,
                    f"The inference server process (pid {pid}) {how}. {_log_tail(Path(record['_server']['log']))} "
                    "Delete the endpoint and create it again.",
                )

    def _fail(self, name: str, reason: str) -> None:
        with self._lock:
            record = self._load("endpoint", name)
            if record is None or record["EndpointStatus"] not in ("Creating", "InService"):
                return
            record.update(
                EndpointStatus="Failed", FailureReason=reason[:FAILURE_REASON_MAX], LastModifiedTime=time.time()
            )
            record["ProductionVariants"][0]["CurrentInstanceCount"] = 0
            self._save("endpoint", name, record)

    def _current(self, name: str) -> dict | None:
        """The endpoint's record, brought up to date with its server process (which may have died, or
        been started by a Python process that has since ended)."""
        record = self._load("endpoint", name)
        if record is None:
            return None
        status, server = record["EndpointStatus"], record.get("_server")
        own = self._servers.get(name)
        if own is not None:
            if own.poll() is not None:  # its watcher has not saved the end yet
                self._server_ended(name, own.pid, _exit_status(own.returncode))
        elif status in ("Creating", "InService") and server is not None and not is_same_process(server):
            self._server_ended(name, server["pid"], "is no longer running (it ended while no process watched it)")
        elif status == "Creating" and server is not None and not is_same_process(record["_owner"]):
            from local_mode import llm_server

            if llm_server.healthy(
                f"http://127.0.0.1:{server['port']}/health"
            ):  # its server came up after the process bringing it up ended
                self._in_service(name)
        elif status == "Creating" and server is None and not is_same_process(record["_owner"]):
            self._fail(
                name,
                f"The Python process that created the endpoint (pid {record['_owner']['pid']}) ended before its "
                "inference server started. Delete the endpoint and create it again.",
            )
        elif status == "Deleting" and (server is None or not is_same_process(server)):
            if not any(t.name == f"delete-{name}" for t in threading.enumerate()):
                self._path("endpoint", name).unlink(missing_ok=True)
                return None
        return self._load("endpoint", name)

    def _tear_down(self, name: str) -> None:
        record = self._load("endpoint", name) or {}
        server = record.get("_server")
        own = self._servers.pop(name, None)
        if own is not None:
            from local_mode.llm_server import stop_server

            stop_server(own, STOP_GRACE_S)
        elif server is not None and is_same_process(server):
            stop_process_group(server["pid"], STOP_GRACE_S)
        self._path("endpoint", name).unlink(missing_ok=True)

    def _model_folder(self, model: dict) -> Path:
        """The model's data unpacked once per model (a model cannot change), shared by its endpoints."""
        source = _model_data(model.get("PrimaryContainer") or model["Containers"][0])
        folder = self.root / "model-data" / model["ModelName"].lower()
        marker = folder / ".local-mode-unpacked"
        with open(self.root / "model-data" / f".{model['ModelName'].lower()}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two endpoints of one model unpack it once
            if marker.exists() and marker.read_text() == str(model["CreationTime"]):
                return folder
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            bucket, key = _split_s3(source["S3Uri"])
            try:
                if source["compressed"]:
                    body = self.s3.get_object(Bucket=bucket, Key=key)["Body"]
                    with tarfile.open(fileobj=body, mode="r|*") as archive:
                        archive.extractall(folder, filter="data")  # no path may leave the folder
                else:
                    prefix = key if key.endswith("/") or not key else key + "/"
                    for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                        for item in page.get("Contents", []):
                            relative = item["Key"][len(prefix) :]
                            if relative and not relative.endswith("/"):
                                target = (folder / relative).resolve()
                                if not target.is_relative_to(folder.resolve()):
                                    continue
                                target.parent.mkdir(parents=True, exist_ok=True)
                                self.s3.download_file(bucket, item["Key"], str(target))
            except (tarfile.TarError, OSError, self.s3.exceptions.ClientError) as error:
                raise ServiceError(
                    "ValidationException",
                    f"Failed to extract model data archive from URL {source['S3Uri']}: {error}. Pack the folder "
                    "save_pretrained wrote as a gzipped tar with its files at the top (tar -czf model.tar.gz -C "
                    "FOLDER .).",
                ) from None
            if not (folder / "config.json").is_file():
                found = sorted(p.name for p in folder.iterdir())[:8]
                raise ServiceError(
                    "ValidationException",
                    f"The model data at {source['S3Uri']} has no config.json at its top (found: {found}): the LLM "
                    "containers read the folder save_pretrained wrote from /opt/ml/model. Pack that folder's "
                    "files at the archive's top (tar -czf model.tar.gz -C FOLDER .).",
                )
            marker.write_text(str(model["CreationTime"]))
            return folder

    # ---- the runtime -----------------------------------------------------------------------------
    def invoke(self, operation: str, name: str, body: bytes, headers) -> tuple[int, dict, bytes | Iterator[bytes]]:
        """InvokeEndpoint[WithResponseStream] as the HTTP response SageMaker's runtime sends:
        (status, headers, body), the body an iterator of event-stream messages when streaming."""
        record = self._current(name)
        if record is None:
            return _runtime_error(400, "ValidationError", f"Endpoint {name} of account {ACCOUNT_ID} not found.")
        status = record["EndpointStatus"]
        if status != "InService":
            fix = {
                "Creating": "wait until DescribeEndpoint shows InService (boto3: the endpoint_in_service waiter; "
                "the SDK: deploy(wait=True)), then invoke it again",
                "Failed": f"see its FailureReason ({record.get('FailureReason', '')[:300]}), then delete it and create "
                "it again",
            }.get(status, "create it again")
            return _runtime_error(
                400, "ValidationError", f"Endpoint {name} of account {ACCOUNT_ID} is {status}, not InService: {fix}."
            )
        server = record["_server"]
        content_type = headers.get("Content-Type") or "application/json"
        connection = http.client.HTTPConnection("127.0.0.1", server["port"], timeout=INVOCATION_TIMEOUT_S)
        try:
            connection.request(
                "POST", CHAT_ROUTE, body=_for_server(body, server["model"]), headers={"Content-Type": content_type}
            )
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            return self._unreachable(name, record, error)
        variant = record["ProductionVariants"][0]["VariantName"]
        answer_type = response.getheader("Content-Type", "application/json")
        if response.status >= 400 or operation == "InvokeEndpoint":
            try:
                answer = response.read()
            except (OSError, http.client.HTTPException) as error:
                return self._unreachable(name, record, error)
            finally:
                connection.close()
            if response.status >= 400:
                return self._model_error(name, response.status, answer)
            return 200, {"Content-Type": answer_type, "x-Amzn-Invoked-Production-Variant": variant}, answer
        out_headers = {
            "Content-Type": "application/vnd.amazon.eventstream",
            "X-Amzn-SageMaker-Content-Type": answer_type,
            "x-Amzn-Invoked-Production-Variant": variant,
        }
        return 200, out_headers, self._relay(name, connection, response)

    def _relay(self, name: str, connection, response) -> Iterator[bytes]:
        """The server's bytes as they come, one PayloadPart per read; a broken stream ends with a
        ModelStreamError event, as SageMaker's does."""
        try:
            while True:
                part = response.read1(65536)
                if not part:
                    return
                yield _event("PayloadPart", part)
        except (OSError, http.client.HTTPException) as error:
            reason = f"the inference server's connection broke ({type(error).__name__})"
            record = self._load("endpoint", name)
            if record is not None and self._wait_server_gone(name, record):
                reason = "the inference server process stopped while streaming; the endpoint is now Failed"
            message = {
                "Message": f"Model stream broken: {reason}. Delete the endpoint and create it again.",
                "ErrorCode": "StreamBroken",
            }
            yield _exception_event("ModelStreamError", json.dumps(message).encode())
        finally:
            connection.close()

    def _wait_server_gone(self, name: str, record: dict, wait_s: float = 3.0) -> bool:
        """Whether the endpoint's server has stopped (waiting a little: a dying process closes its sockets
        before it is gone); if so, the endpoint is Failed when this returns."""
        server = record.get("_server") or {}
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            own = self._servers.get(name)
            gone = own.poll() is not None if own is not None else not is_same_process(server)
            if gone:
                self._current(name)
                return True
            time.sleep(0.1)
        return False

    def _unreachable(self, name: str, record: dict, error: Exception):
        if isinstance(error, (TimeoutError, socket.timeout)):
            message = (
                "Your invocation timed out while waiting for a response from container primary "
                f"({INVOCATION_TIMEOUT_S} s). Ask for fewer tokens (max_tokens), or serve a smaller model."
            )
        elif self._wait_server_gone(name, record):
            message = (
                "Received server error (0) from primary: the inference server process stopped while answering; "
                "the endpoint is now Failed (DescribeEndpoint gives the reason). Delete it and create it again."
            )
        else:
            message = (
                f"Received server error (0) from primary: the inference server did not answer ({type(error).__name__})."
            )
        return _runtime_error(424, "ModelError", message, LogStreamArn=self._log_arn(name))

    def _model_error(self, name: str, status: int, answer: bytes):
        text = answer.decode("utf-8", "replace")
        kind = "client" if status < 500 else "server"
        return _runtime_error(
            424,
            "ModelError",
            f'Received {kind} error ({status}) from primary with message "{text}". {READS}',
            OriginalStatusCode=status,
            OriginalMessage=text,
            LogStreamArn=self._log_arn(name),
        )

    def _log_arn(self, name: str) -> str:
        return f"arn:aws:logs:{self.region}:{ACCOUNT_ID}:log-group:/aws/sagemaker/Endpoints/{name}"


# ---- helpers ---------------------------------------------------------------------------------------
def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def _split_s3(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ServiceError("ValidationException", f"Model data location {uri!r} must be an s3:// URL.")
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def _model_data(container: dict) -> dict:
    """Where a container's model data is: {"S3Uri", "compressed"}."""
    if container.get("ModelDataUrl"):
        return {"S3Uri": container["ModelDataUrl"], "compressed": True}
    source = (container.get("ModelDataSource") or {}).get("S3DataSource")
    if source:
        return {"S3Uri": source["S3Uri"], "compressed": source.get("CompressionType") == "Gzip"}
    raise ServiceError(
        "ValidationException",
        "Local mode serves a model from its model data in S3 only: give the container ModelDataUrl (an s3:// "
        "model.tar.gz) or ModelDataSource.S3DataSource (CompressionType None for an uncompressed prefix). An "
        "HF_MODEL_ID would download from the Hugging Face Hub, which local mode does not reach.",
    )


def _image(model: dict) -> str:
    return (model.get("PrimaryContainer") or model["Containers"][0]).get("Image", "")


def _for_server(body: bytes, model_folder: str) -> bytes:
    """The body for the server: TGI and LMI serve one model and ignore ``model`` (examples send "tgi");
    transformers serve would load whatever it names, so it names the served folder. Anything that is not
    a JSON object goes as it came, and the server says what is wrong with it."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not isinstance(request, dict) or "model" not in request:
        return body
    return json.dumps({**request, "model": model_folder}).encode()


def _runtime_error(status: int, code: str, message: str, **members) -> tuple[int, dict, bytes]:
    """The runtime's REST-JSON error: the code in ``x-amzn-ErrorType``, the members in the body."""
    body = {"message": message} if not members else {"Message": message, **members}
    return status, {"Content-Type": "application/json", "x-amzn-ErrorType": code}, json.dumps(body).encode()


def _event(event_type: str, payload: bytes) -> bytes:
    headers = {":message-type": "event", ":event-type": event_type, ":content-type": "application/octet-stream"}
    return _ENCODER.encode_message(headers, payload)


def _exception_event(exception_type: str, payload: bytes) -> bytes:
    headers = {":message-type": "exception", ":exception-type": exception_type, ":content-type": "application/json"}
    return _ENCODER.encode_message(headers, payload)


def _exit_status(code: int | None) -> str:
    if code is not None and code < 0:
        return f"was killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _log_tail(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    if not lines:
        return f"Its log ({log}) is empty."
    return f"The last lines of its log ({log}): " + " | ".join(lines[-LOG_TAIL_LINES:])


def runtime_route(method: str, path: str) -> tuple[str, str] | None:
    """(operation, endpoint name) for a request to SageMaker's runtime, or None."""
    if method != "POST" or not path.startswith("/endpoints/"):
        return None
    name, _, action = path[len("/endpoints/") :].partition("/")
    operation = {"invocations": "InvokeEndpoint", "invocations-response-stream": "InvokeEndpointWithResponseStream"}
    return (operation[action], unquote(name)) if action in operation and name else None


class RuntimeAPI:
    """The ``before-call.sagemaker-runtime`` handler: the runtime answered in this process, its HTTP
    response read by botocore's own parser, as botocore reads one from the network."""

    def __init__(self, hosting: Hosting):
        self.hosting = hosting

    def __call__(self, model, params, **kwargs):
        from botocore.awsrequest import AWSResponse, HeadersDict
        from botocore.endpoint import convert_to_response_dict
        from botocore.parsers import create_parser

        route = runtime_route(params.get("method", "POST"), params["url_path"].split("?")[0])
        if route is None or route[0] != model.name:
            status, headers, body = _runtime_error(
                400,
                "ValidationError",
                f"Local mode answers InvokeEndpoint and InvokeEndpointWithResponseStream; {model.name} needs SageMaker.",
            )
        else:
            status, headers, body = self.hosting.invoke(
                model.name, route[1], params.get("body") or b"", HeadersDict(params.get("headers", {}))
            )
        headers = {**headers, "x-amzn-RequestId": str(uuid.uuid4())}
        http_response = AWSResponse(
            params.get("url", "https://runtime.sagemaker.local/"), status, HeadersDict(headers), _RawBody(body)
        )
        response_dict = convert_to_response_dict(http_response, model)
        parser = create_parser(model.service_model.protocol)
        parsed = parser.parse(response_dict, model.output_shape)
        if status >= 300:  # the modeled members of the error (OriginalStatusCode ...), as botocore's Endpoint adds them
            error_shape = model.service_model.shape_for_error_code(parsed.get("Error", {}).get("Code"))
            if error_shape is not None:
                parsed.update(parser.parse(response_dict, error_shape))
        return http_response, parsed


class _RawBody:
    """An answer's body as botocore reads one from urllib3: ``stream()`` and ``read(amt)``."""

    def __init__(self, body: bytes | Iterator[bytes]):
        self._parts = iter([body]) if isinstance(body, bytes) else body
        self._pending = b""  # read from the parts, not yet handed out

    def stream(self, amt: int = 1024, decode_content=None) -> Iterator[bytes]:
        if self._pending:
            yield self._pending
            self._pending = b""
        yield from self._parts

    def read(self, amt: int | None = None) -> bytes:
        data = self._pending
        while amt is None or len(data) < amt:
            part = next(self._parts, None)
            if part is None:
                break
            data += part
        cut = len(data) if amt is None else amt
        self._pending = data[cut:]
        return data[:cut]

    def close(self) -> None:
        close = getattr(self._parts, "close", None)
        if close is not None:
            close()
