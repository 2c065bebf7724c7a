"""The training-session API: control plane, runtime, hub look-ups and model packages, over state on disk.

One ``SessionService`` lives in the local endpoint process (server.py). Requests reach it already
parsed and checked against botocore's shapes (protocol.py); it answers dicts or raises
``ServiceError`` with SageMaker's codes. Layout under ``$SAGEMAKER_LOCAL_ROOT/training-sessions``::

    sessions/<name>.json                 DescribeTrainingSession's detail (times as epoch seconds)
    base-models.json                     hub content name -> {HuggingfaceId, path, version}
    model-package-groups/<group>.json    DescribeModelPackageGroup
    model-packages/<group>/<n>.json      DescribeModelPackage (artifacts in S3, under OutputConfig)
    hf-cache/                            the base models' tokenizers under their hub-style ids

A session's model lives in this process only: if the process ends, the sessions it held are
Failed (with ErrorDetails) when the service next starts, and their checkpoints stay loadable.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path

from ...artifacts import split_s3
from ..api import ACCOUNT_ID
from ..os_utils import process_identity
from ..storage import _atomic_write
from ..validation import ServiceError
from . import engine as engine_module

PUBLIC_HUB = "SageMakerPublicHub"
ACTIVE = ("Created", "Scheduled", "Running", "Blocked")
LONG_POLL_SECONDS = float(os.environ.get("SAGEMAKER_LOCAL_SESSION_LONG_POLL", "20"))
TIMING_LOG = os.environ.get("SAGEMAKER_LOCAL_SESSION_TIMING_LOG")
IDLE_TIMEOUT_SECONDS = float(os.environ.get("SAGEMAKER_LOCAL_SESSION_IDLE_TIMEOUT", "3600"))


def not_found(message: str) -> ServiceError:
    return ServiceError("ResourceNotFound", message)


class Operation:
    def __init__(self, kind: str, config: dict, sequence: int | None = None, token: str | None = None):
        self.id = uuid.uuid4().hex
        self.kind, self.config, self.sequence, self.token = kind, config, sequence, token
        self.status = "Pending"
        self.result: dict | None = None
        self.error: str | None = None
        self.tokens = 0
        self.done = threading.Event()
        self.finished_at: float | None = None

    def answer(self) -> dict:
        response = {"status": self.status}
        if self.result is not None:
            response["operationResult"] = {self.kind: self.result}
        if self.error is not None:
            response["errorDetails"] = self.error
        if self.tokens and self.sequence is not None:
            response["tokenUsage"] = {"trainingTokens": self.tokens}
        return response


class LiveSession:
    """A Running session: its engine, its operations, and the thread that runs them in order."""

    def __init__(self, service: SessionService, detail: dict, engine: engine_module.Engine):
        self.service, self.detail, self.engine = service, detail, engine
        self.name = detail["TrainingSessionName"]
        self.operations: dict[str, Operation] = {}
        self.by_sequence: dict[int, Operation] = {}
        self.by_token: dict[str, Operation] = {}
        self.next_sequence = 1
        self.cond = threading.Condition()
        self.closed = False
        self.last_activity = time.time()
        self.package_engines: dict[str, engine_module.Engine] = {}
        threading.Thread(target=self._run_training, name=f"session-{self.name}", daemon=True).start()

    # ---- submission
    def submit_training(self, sequence: int, token: str | None, kind: str, config: dict) -> Operation:
        with self.cond:
            if token is not None and token in self.by_token:
                return self.by_token[token]  # a retried submit: the first operation answers
            if sequence in self.by_sequence:
                first = self.by_sequence[sequence]
                raise ServiceError(
                    "ConflictException",
                    f"Sequence number {sequence} is already used by operation {first.id} of training session "
                    f"{self.name}; send each operation with the next number "
                    f"(LastReceivedSequenceNumber is {self.detail.get('LastReceivedSequenceNumber', 0)}), "
                    "or resend with the same clientToken to get the first operation back.",
                    status=409,
                )
            if sequence < self.next_sequence:
                raise ServiceError(
                    "ConflictException",
                    f"Sequence number {sequence} has already run in training session {self.name}; the next one "
                    f"expected is {self.next_sequence}.",
                    status=409,
                )
            operation = Operation(kind, config, sequence, token)
            self.operations[operation.id] = operation
            self.by_sequence[sequence] = operation
            if token is not None:
                self.by_token[token] = operation
            last = max(self.detail.get("LastReceivedSequenceNumber") or 0, sequence)
            self.detail["LastReceivedSequenceNumber"] = last
            self.last_activity = time.time()
            self.cond.notify_all()
        self.service.save(self.detail)
        return operation

    def submit_sampling(self, kind: str, config: dict) -> Operation:
        operation = Operation(kind, config)
        self.operations[operation.id] = operation
        self.last_activity = time.time()
        threading.Thread(target=self._run_sampling, args=(operation,), daemon=True).start()
        return operation

    # ---- execution
    def _run_training(self) -> None:
        while True:
            with self.cond:
                while not self.closed and self.next_sequence not in self.by_sequence:
                    self.cond.wait()  # a gap waits for the operation that fills it
                if self.closed:
                    for op in self.by_sequence.values():
                        if not op.done.is_set():
                            self._finish(
                                op,
                                "Skipped",
                                error=f"Training session {self.name} stopped before this operation ran.",
                            )
                    return
                operation = self.by_sequence[self.next_sequence]
            self._execute(operation, self.service.run_training_operation)
            with self.cond:
                self.next_sequence += 1

    def _run_sampling(self, operation: Operation) -> None:
        # Not one at a time: the engine's sampling queue runs the requests in flight in shared passes.
        self._execute(operation, self.service.run_sampling_operation)

    def _execute(self, operation: Operation, run) -> None:
        operation.status = "InProgress"
        try:
            result, usage = run(self, operation)
        except (engine_module.InputError, ServiceError) as error:
            self._finish(operation, "Failed", error=getattr(error, "message", str(error)))
        except Exception as error:  # noqa: BLE001 - reported on the operation, the session carries on
            self._finish(operation, "Failed", error=f"{type(error).__name__}: {error}")
        else:
            if operation.sequence is not None:
                operation.tokens = usage.get("TrainingTokenCount", 0)
            self.service.bill(self, usage)
            self._finish(operation, "Completed", result=result)

    def _finish(self, operation: Operation, status: str, result=None, error=None) -> None:
        operation.result, operation.error, operation.status = result, error, status
        operation.finished_at = time.time()
        self.last_activity = time.time()
        operation.done.set()
        if TIMING_LOG:  # for bench.training_sessions: when each operation ended, on this machine's clock
            with open(TIMING_LOG, "a") as log:
                log.write(f"{operation.id} {operation.finished_at:.6f}\n")

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.engine = None
        self.package_engines = {}


class SessionService:
    def __init__(self, aws, region: str):
        self.aws = aws
        self.region = region
        self.root = aws.storage.root / "training-sessions"
        for sub in ("sessions", "model-package-groups", "model-packages"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.live: dict[str, LiveSession] = {}
        self.lock = threading.RLock()
        self.identity = process_identity()
        self._adapters: dict[str, dict] = {}
        self._fail_orphans()
        threading.Thread(target=self._expire_idle, name="session-expiry", daemon=True).start()

    # ---- storage
    def _session_path(self, name: str) -> Path:
        return self.root / "sessions" / f"{name}.json"

    def save(self, detail: dict) -> None:
        detail["LastModifiedTime"] = time.time()
        _atomic_write(self._session_path(detail["TrainingSessionName"]), json.dumps(detail, indent=1).encode())

    def load(self, name: str) -> dict:
        path = self._session_path(name)
        if not path.exists():
            raise not_found(
                f"Training session {name} does not exist in this account and region "
                "(ListTrainingSessions lists the ones that do)."
            )
        live = self.live.get(name)
        return live.detail if live is not None else json.loads(path.read_text())

    def _fail_orphans(self) -> None:
        """Sessions held by a service process that has ended: their model is gone."""
        for path in (self.root / "sessions").glob("*.json"):
            detail = json.loads(path.read_text())
            owner = detail.get("_owner", {})
            if detail["TrainingSessionStatus"] in ACTIVE + ("Stopping",) and owner != self.identity:
                detail["TrainingSessionStatus"] = "Failed"
                detail["EndTime"] = time.time()
                detail["ErrorDetails"] = (
                    f"The local training-session service that held this session ended (pid {owner.get('pid')}) "
                    "and its model with it. Checkpoints saved with save_state are still in S3: create a new "
                    "session from one (create_training_client_from_state)."
                )
                self.save(detail)

    def _expire_idle(self) -> None:
        while True:
            time.sleep(min(5.0, IDLE_TIMEOUT_SECONDS))
            for live in list(self.live.values()):
                if time.time() - live.last_activity > IDLE_TIMEOUT_SECONDS:
                    self._end(
                        live.detail,
                        "Expired",
                        error=(
                            f"The session was idle for more than {IDLE_TIMEOUT_SECONDS:.0f} s (local mode's "
                            "SAGEMAKER_LOCAL_SESSION_IDLE_TIMEOUT) and expired; create a new session."
                        ),
                    )

    def _end(self, detail: dict, status: str, error: str | None = None) -> None:
        with self.lock:
            live = self.live.pop(detail["TrainingSessionName"], None)
            if live is not None:
                live.close()
            detail["TrainingSessionStatus"] = status
            detail["EndTime"] = time.time()
            if error:
                detail["ErrorDetails"] = error
            self.save(detail)

    # ---- base models (the hub look-ups answer these)
    def base_models(self) -> dict[str, dict]:
        path = self.root / "base-models.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def hub_content_arn(self, name: str, version: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:aws:hub-content/{PUBLIC_HUB}/Model/{name}/{version}"

    def _hub_summary(self, name: str, entry: dict) -> dict:
        return {
            "HubContentName": name,
            "HubContentArn": self.hub_content_arn(name, entry["version"]),
            "HubContentVersion": entry["version"],
            "HubContentType": "Model",
            "DocumentSchemaVersion": "2.0.0",
            "HubContentDisplayName": entry["HuggingfaceId"],
            "HubContentDescription": f"Local model folder {entry['path']}",
            "HubContentSearchKeywords": [
                "@capability:training_session",
                f"@huggingface-id:{entry['HuggingfaceId'].lower()}",
            ],
            "HubContentStatus": "Available",
            "CreationTime": entry.get("created", 0.0),
        }

    def _check_public_hub(self, request: dict) -> None:
        if request.get("HubName") not in (
            PUBLIC_HUB,
            f"arn:aws:sagemaker:{self.region}:aws:hub/{PUBLIC_HUB}",
        ):
            raise not_found(
                f"Hub {request.get('HubName')} does not exist: local mode serves {PUBLIC_HUB} only, "
                "with the base models registered by helpers.local_mode.sessions.register_base_model."
            )

    def list_hub_contents(self, request: dict) -> dict:
        self._check_public_hub(request)
        summaries = [self._hub_summary(name, entry) for name, entry in sorted(self.base_models().items())]
        if request.get("HubContentType") != "Model":
            summaries = []
        return {"HubContentSummaries": summaries}

    def describe_hub_content(self, request: dict) -> dict:
        self._check_public_hub(request)
        name = request["HubContentName"]
        entry = self.base_models().get(name)
        if entry is None or request.get("HubContentType") != "Model":
            raise not_found(
                f"Hub content {name} of type {request.get('HubContentType')} does not exist in "
                f"{PUBLIC_HUB}; local mode has: {', '.join(self.base_models()) or 'none'}."
            )
        summary = self._hub_summary(name, entry)
        summary.pop("HubContentSearchKeywords")
        return {
            **summary,
            "HubName": PUBLIC_HUB,
            "HubArn": f"arn:aws:sagemaker:{self.region}:aws:hub/{PUBLIC_HUB}",
            "HubContentDocument": json.dumps({"HuggingfaceId": entry["HuggingfaceId"]}),
            "HubContentSearchKeywords": self._hub_summary(name, entry)["HubContentSearchKeywords"],
        }

    def _base_model_for_arn(self, arn: str) -> tuple[str, dict]:
        marker = f"hub-content/{PUBLIC_HUB}/Model/"
        name = arn.split(marker, 1)[1].split("/")[0] if marker in arn else None
        models = self.base_models()
        if name not in models:
            raise not_found(
                f"Base model {arn} is not available: local mode serves "
                f"{', '.join(e['HuggingfaceId'] for e in models.values()) or 'no model yet'}. Register a local "
                "model folder with helpers.local_mode.sessions.register_base_model(model_id, path)."
            )
        return name, models[name]

    # ---- model package groups and packages
    def _group_name(self, name_or_arn: str) -> str:
        return name_or_arn.rsplit("model-package-group/", 1)[-1]

    def _group_arn(self, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{ACCOUNT_ID}:model-package-group/{name.lower()}"

    def create_model_package_group(self, request: dict) -> dict:
        name = request["ModelPackageGroupName"]
        path = self.root / "model-package-groups" / f"{name}.json"
        with self.lock:
            if path.exists():
                raise ServiceError(
                    "ValidationException", f"Model Package Group already exists: {self._group_arn(name)}"
                )
            group = {
                "ModelPackageGroupName": name,
                "ModelPackageGroupArn": self._group_arn(name),
                "ModelPackageGroupDescription": request.get("ModelPackageGroupDescription", ""),
                "CreationTime": time.time(),
                "ModelPackageGroupStatus": "Completed",
                "CreatedBy": {},
            }
            _atomic_write(path, json.dumps(group).encode())
        return {"ModelPackageGroupArn": group["ModelPackageGroupArn"]}

    def describe_model_package_group(self, request: dict) -> dict:
        name = self._group_name(request["ModelPackageGroupName"])
        path = self.root / "model-package-groups" / f"{name}.json"
        if not path.exists():
            raise ServiceError("ValidationException", f"Model Package Group {name} does not exist.")
        return json.loads(path.read_text())

    def _packages(self, group: str) -> list[dict]:
        folder = self.root / "model-packages" / group
        return sorted(
            (json.loads(p.read_text()) for p in folder.glob("*.json")), key=lambda p: p["ModelPackageVersion"]
        )

    def _package(self, arn: str) -> dict:
        try:
            group, version = arn.rsplit("model-package/", 1)[1].rsplit("/", 1)
            return json.loads((self.root / "model-packages" / group / f"{int(version)}.json").read_text())
        except (IndexError, ValueError, FileNotFoundError):
            raise ServiceError("ValidationException", f"Model package {arn} does not exist.") from None

    def register_package(self, live: LiveSession, s3_uri: str, checkpoint: bool, description: str) -> dict:
        group = self._group_name(live.detail["ModelPackageGroupArn"])
        name, entry = self._base_model_for_arn(live.detail["ModelConfig"]["BaseModelArn"])
        with self.lock:
            version = len(self._packages(group)) + 1
            package = {
                "ModelPackageName": group,
                "ModelPackageGroupName": group,
                "ModelPackageVersion": version,
                "ModelPackageArn": f"arn:aws:sagemaker:{self.region}:{ACCOUNT_ID}:model-package/{group}/{version}",
                "ModelPackageDescription": description,
                "CreationTime": time.time(),
                "ModelPackageStatus": "Completed",
                "ModelApprovalStatus": "PendingManualApproval",
                "InferenceSpecification": {
                    "Containers": [
                        {
                            "Image": "local-mode",
                            "ModelDataSource": {
                                "S3DataSource": {
                                    "S3Uri": s3_uri,
                                    "S3DataType": "S3Prefix",
                                    "CompressionType": "None",
                                }
                            },
                            "BaseModel": {"HubContentName": name, "HubContentVersion": entry["version"]},
                            "IsCheckpoint": checkpoint,
                        }
                    ],
                    "SupportedContentTypes": ["application/json"],
                    "SupportedResponseMIMETypes": ["application/json"],
                },
                "ModelPackageStatusDetails": {"ValidationStatuses": [], "ImageScanStatuses": []},
                "_session": live.name,
                "_lora": live.detail["LoraConfig"],
            }
            _atomic_write(self.root / "model-packages" / group / f"{version}.json", json.dumps(package).encode())
        return package

    def describe_model_package(self, request: dict) -> dict:
        package = self._package(request["ModelPackageName"])
        return {k: v for k, v in package.items() if not k.startswith("_")}

    def list_model_packages(self, request: dict) -> dict:
        packages = self._packages(self._group_name(request.get("ModelPackageGroupName", "")))
        packages.sort(key=lambda p: p["CreationTime"], reverse=request.get("SortOrder", "Ascending") == "Descending")
        keys = (
            "ModelPackageName",
            "ModelPackageGroupName",
            "ModelPackageVersion",
            "ModelPackageArn",
            "ModelPackageDescription",
            "CreationTime",
            "ModelPackageStatus",
            "ModelApprovalStatus",
        )
        return _page(packages, request, "ModelPackageSummaryList", keys)

    def delete_model_package(self, request: dict) -> dict:
        package = self._package(request["ModelPackageName"])
        (
            self.root / "model-packages" / package["ModelPackageGroupName"] / f"{package['ModelPackageVersion']}.json"
        ).unlink()
        return {}

    # ---- control plane
    def create_training_session(self, request: dict) -> dict:
        name = request["TrainingSessionName"]
        arn = f"arn:aws:sagemaker:{self.region}:{ACCOUNT_ID}:training-session/{name}"
        base_name, entry = self._base_model_for_arn(request["ModelConfig"]["BaseModelArn"])
        group = request.get("ModelPackageGroupArn")
        if group:
            self.describe_model_package_group({"ModelPackageGroupName": group})
        output = request["OutputConfig"]["S3Location"]["Path"]
        if not output.startswith("s3://"):
            raise ServiceError("ValidationException", f"OutputConfig.S3Location.Path {output} must be an s3:// URI.")
        with self.lock:
            if self._session_path(name).exists():
                raise ServiceError(
                    "ResourceInUse",
                    f"A training session named {name} already exists ({arn}); "
                    "choose another name or delete that session first.",
                )
            now = time.time()
            detail = {
                "TrainingSessionArn": arn,
                "TrainingSessionName": name,
                "TrainingSessionStatus": "Created",
                "CreationTime": now,
                "LastModifiedTime": now,
                "LastReceivedSequenceNumber": 0,
                "BillableTokenUsage": {
                    "PrefillTokenCount": 0,
                    "SampleTokenCount": 0,
                    "TrainingTokenCount": 0,
                },
                "RoleArn": request["RoleArn"],
                "LoraConfig": request["LoraConfig"],
                "ModelConfig": request["ModelConfig"],
                "OutputConfig": request["OutputConfig"],
                "_owner": self.identity,
            }
            for key in ("ModelPackageGroupArn", "VpcConfig", "Tags"):
                if key in request:
                    detail[key] = request[key]
            self.save(detail)
        # The model is loaded before answering, so the first Describe already says Running (the SDK
        # polls every 10 s: a Created -> Running transition would cost each new session that long).
        try:
            engine = engine_module.Engine(entry["path"], request["LoraConfig"]["Rank"], request["LoraConfig"]["Alpha"])
        except Exception as error:  # noqa: BLE001
            self._end(detail, "Failed", error=f"Loading base model {entry['HuggingfaceId']} failed: {error}")
            return {"TrainingSessionArn": arn}
        with self.lock:
            detail["TrainingSessionStatus"] = "Running"
            self.live[name] = LiveSession(self, detail, engine)
            self.save(detail)
        return {"TrainingSessionArn": arn}

    def describe_training_session(self, request: dict) -> dict:
        detail = self.load(request["TrainingSessionName"])
        return {"TrainingSessionDetail": {k: v for k, v in detail.items() if not k.startswith("_")}}

    def list_training_sessions(self, request: dict) -> dict:
        details = [self.load(p.stem) for p in (self.root / "sessions").glob("*.json")]
        if "NameContains" in request:
            details = [d for d in details if request["NameContains"].lower() in d["TrainingSessionName"].lower()]
        if "StatusEquals" in request:
            details = [d for d in details if d["TrainingSessionStatus"] == request["StatusEquals"]]
        if "CreationTimeAfter" in request:
            details = [d for d in details if d["CreationTime"] > float(request["CreationTimeAfter"])]
        if "CreationTimeBefore" in request:
            details = [d for d in details if d["CreationTime"] < float(request["CreationTimeBefore"])]
        details.sort(key=lambda d: d["CreationTime"], reverse=True)
        keys = ("TrainingSessionArn", "TrainingSessionStatus", "CreationTime", "LastModifiedTime")
        return _page(details, request, "TrainingSessionSummaries", keys)

    def stop_training_session(self, request: dict) -> dict:
        detail = self.load(request["TrainingSessionName"])
        status = detail["TrainingSessionStatus"]
        if status not in ACTIVE:
            raise ServiceError(
                "ValidationException",
                f"Training session {detail['TrainingSessionName']}: invalid "
                f"session state transition from {status} to Stopping.",
            )
        self._end(detail, "Stopped")
        return {}

    def delete_training_session(self, request: dict) -> dict:
        detail = self.load(request["TrainingSessionName"])
        if detail["TrainingSessionStatus"] in ACTIVE + ("Stopping",):
            raise ServiceError(
                "ConflictException",
                f"Training session {detail['TrainingSessionName']} is "
                f"{detail['TrainingSessionStatus']}: stop it first (StopTrainingSession), then "
                "delete it.",
                status=409,
            )
        self._session_path(detail["TrainingSessionName"]).unlink()
        return {}

    # ---- runtime
    def _live(self, name: str) -> LiveSession:
        detail = self.load(name)
        live = self.live.get(name)
        if live is None:
            extra = f" ({detail['ErrorDetails']})" if detail.get("ErrorDetails") else ""
            raise ServiceError(
                "ConflictException",
                f"Training session {name} is {detail['TrainingSessionStatus']}{extra}: operations run only on a "
                "Running session. Create a new one (from a checkpoint with create_training_client_from_state).",
                status=409,
            )
        return live

    def execute_training_operation(self, request: dict) -> dict:
        live = self._live(request["trainingSessionName"])
        kind, config = _union(request["operationConfig"], "operationConfig")
        if kind in (
            "forward",
            "forwardBackward",
        ):  # refused now, not when it runs: the session stays as it was
            try:
                engine_module.check_loss_config(config["lossFnName"], config.get("lossFnConfig"))
                engine_module.parse_datums(config["datumList"], config["lossFnName"])
            except engine_module.InputError as error:
                raise ServiceError("ValidationException", str(error)) from None
        if kind == "loadState":
            self._package(config["modelPackageArn"])
        operation = live.submit_training(request["sequenceNumber"], request.get("clientToken"), kind, config)
        return {"operationId": operation.id}

    def execute_sampling_operation(self, request: dict) -> dict:
        live = self._live(request["trainingSessionName"])
        kind, config = _union(request["operationConfig"], "operationConfig")
        if config.get("modelPackageArn"):
            self._package(config["modelPackageArn"])
        prompt = config.get("prompt")
        if prompt is not None:
            try:
                engine_module.model_input_tokens(prompt, "prompt")
            except engine_module.InputError as error:
                raise ServiceError("ValidationException", str(error)) from None
        return {"operationId": live.submit_sampling(kind, config).id}

    def operation_result(self, request: dict) -> dict:
        name = request["trainingSessionName"]
        live = self.live.get(name)
        operation = live.operations.get(request["operationId"]) if live else None
        if operation is None:
            self.load(name)
            raise ServiceError(
                "ResourceNotFoundException",
                f"Operation {request['operationId']} does not exist in training session {name}.",
                status=404,
            )
        # Held until the operation ends (or LONG_POLL_SECONDS pass): the SDK polls every 2 s, so an
        # immediate "InProgress" would add up to 2 s to every result().
        operation.done.wait(LONG_POLL_SECONDS)
        return operation.answer()

    def run_training_operation(self, live: LiveSession, operation: Operation) -> tuple[dict, dict]:
        engine, config = live.engine, operation.config
        if operation.kind in ("forward", "forwardBackward"):
            backward = operation.kind == "forwardBackward"
            result, tokens = engine.forward_backward(
                config["lossFnName"], config["datumList"], config.get("lossFnConfig"), backward
            )
            return result, {"TrainingTokenCount" if backward else "PrefillTokenCount": tokens}
        if operation.kind == "optimizerStep":
            return engine.optim_step(config["adamParamsConfig"]), {}
        if operation.kind in ("saveWeights", "saveState"):
            return self._save(live, operation), {}
        if operation.kind == "loadState":
            package = self._package(config["modelPackageArn"])
            self._load_package(live, package, bool(config["loadOptimizer"]))
            return {}, {}
        raise ServiceError("ValidationException", f"Unknown training operation {operation.kind}.")

    def run_sampling_operation(self, live: LiveSession, operation: Operation) -> tuple[dict, dict]:
        """Sampling and scoring read a saved model package's weights, or the base model when none is
        named: SageMaker's SDK documents ``model_package_arn=""`` as the base model (Tinker samples
        only saved weights too), so the adapter being trained is never sampled mid-step."""
        engine, config = live.engine, operation.config
        if operation.kind == "loadWeightsForSampling":
            self._adapter_of(self._package(config["modelPackageArn"]))
            return {}, {}
        package = self._package(config["modelPackageArn"]) if config.get("modelPackageArn") else None
        adapter = self._adapter_of(package) if package is not None else None  # None: the base model
        if package is not None and package["_lora"]["Rank"] != live.detail["LoraConfig"]["Rank"]:
            engine = self._package_engine(live, package)  # another rank: its own model, cached
        tokens = engine_module.model_input_tokens(config["prompt"], "prompt")
        if operation.kind == "computeLogprobs":
            return {"logprobs": engine.compute_logprobs(tokens, adapter)}, {"PrefillTokenCount": len(tokens)}
        samples = engine.sample(tokens, config["numSamples"], config["samplingParams"], adapter)
        result = {"sequences": samples}
        if config.get("includePromptLogprobs"):
            result["promptLogprobs"] = engine.compute_logprobs(tokens, adapter)
        usage = {
            "PrefillTokenCount": len(tokens) * config["numSamples"],
            "SampleTokenCount": sum(len(s["tokens"]) for s in samples),
        }
        return result, usage

    def _package_engine(self, live: LiveSession, package: dict) -> engine_module.Engine:
        cached = live.package_engines.get(package["ModelPackageArn"])
        if cached is None:
            _, entry = self._base_model_for_arn(live.detail["ModelConfig"]["BaseModelArn"])
            cached = engine_module.Engine(entry["path"], package["_lora"]["Rank"], package["_lora"]["Alpha"])
            cached.load_adapter_from_peft(self._adapter_of(package))
            live.package_engines = {package["ModelPackageArn"]: cached}  # one at a time: memory
        return cached

    def sampling_operation_result(self, request: dict) -> dict:
        return self.operation_result(request)

    # ---- artifacts
    def _save(self, live: LiveSession, operation: Operation) -> dict:
        checkpoint = operation.kind == "saveState"
        base = live.detail["OutputConfig"]["S3Location"]["Path"].rstrip("/")
        folder = "checkpoints" if checkpoint else "weights"
        prefix = f"{base}/{folder}/{uuid.uuid4().hex[:8]}"  # the SDK's default path already names the session
        bucket, key = split_s3(prefix)
        self._ensure_bucket(bucket)
        # Under the engine's lock: a sampling operation on saved weights swaps them into this model
        # while it samples, and a save then would write those instead of the weights being trained
        # (an overlapped RL loop saves while its next batch samples).
        with live.engine.lock, tempfile.TemporaryDirectory() as tmp:
            live.engine.model.save_pretrained(tmp)  # a PEFT adapter folder: PeftModel.from_pretrained loads it
            files = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
            if checkpoint:
                files["optimizer.pt"] = live.engine.state_bytes(with_optimizer=True)
            if operation.config.get("mergeWeights"):
                from safetensors.torch import save

                files["hf_merged/model.safetensors"] = save(live.engine.merged_state())
        for name, data in files.items():
            self.aws.s3.put_object(Bucket=bucket, Key=f"{key}/{name}", Body=data)
        package = self.register_package(live, prefix + "/", checkpoint, operation.config.get("description", ""))
        return {"modelPackageArn": package["ModelPackageArn"]}

    def _ensure_bucket(self, bucket: str) -> None:
        try:
            self.aws.s3.head_bucket(Bucket=bucket)
        except Exception:  # noqa: BLE001 - absent: SageMaker writes to an existing bucket; local mode makes it
            self.aws.create_bucket(bucket)

    def _read(self, package: dict, name: str) -> bytes:
        uri = package["InferenceSpecification"]["Containers"][0]["ModelDataSource"]["S3DataSource"]["S3Uri"]
        bucket, key = split_s3(uri.rstrip("/"))
        try:
            return self.aws.s3.get_object(Bucket=bucket, Key=f"{key}/{name}")["Body"].read()
        except Exception:  # noqa: BLE001
            raise ServiceError(
                "ValidationException",
                f"Model package {package['ModelPackageArn']} has no {name} under {uri}: its artifacts were deleted.",
            ) from None

    def _adapter_of(self, package: dict) -> dict:
        from safetensors.torch import load

        arn = package["ModelPackageArn"]
        with self.lock:
            if arn not in self._adapters:  # a loop samples the same saved weights many times
                self._adapters = {arn: load(self._read(package, "adapter_model.safetensors"))}
            return self._adapters[arn]

    def _load_package(self, live: LiveSession, package: dict, with_optimizer: bool) -> None:
        if package["_lora"]["Rank"] != live.detail["LoraConfig"]["Rank"]:
            raise ServiceError(
                "ValidationException",
                f"Model package {package['ModelPackageArn']} was saved with LoRA rank "
                f"{package['_lora']['Rank']}; this session has rank {live.detail['LoraConfig']['Rank']}. "
                "Create the session with the checkpoint's rank.",
            )
        is_checkpoint = package["InferenceSpecification"]["Containers"][0]["IsCheckpoint"]
        if with_optimizer and not is_checkpoint:
            raise ServiceError(
                "ValidationException",
                f"Model package {package['ModelPackageArn']} holds weights only (saveWeights): load it "
                "without the optimizer, or give a saveState checkpoint.",
            )
        engine = live.engine
        with engine.lock:
            engine.load_adapter_from_peft(self._adapter_of(package))
            engine.reset_optimizer()
            if with_optimizer:
                engine.load_optimizer_bytes(self._read(package, "optimizer.pt"))

    # ---- billing
    def bill(self, live: LiveSession, usage: dict) -> None:
        if not usage:
            return
        with self.lock:
            counts = live.detail["BillableTokenUsage"]
            for key, value in usage.items():
                counts[key] = counts.get(key, 0) + int(value)
            self.save(live.detail)


def _page(items: list[dict], request: dict, list_key: str, keys: tuple[str, ...]) -> dict:
    """One page of a List* answer: MaxResults summaries from NextToken (an offset) on."""
    start, size = int(request.get("NextToken", 0)), request.get("MaxResults", 10)
    response = {list_key: [{k: item[k] for k in keys if k in item} for item in items[start : start + size]]}
    if start + size < len(items):
        response["NextToken"] = str(start + size)
    return response


def _union(config: dict, where: str) -> tuple[str, dict]:
    """The one member set in a union shape (botocore checks the shape, not that exactly one is set)."""
    members = [k for k, v in config.items() if v is not None]
    if len(members) != 1:
        raise ServiceError(
            "ValidationException",
            f"{where} must set exactly one operation, got {len(members)} ({', '.join(members) or 'none'}).",
        )
    return members[0], config[members[0]]
