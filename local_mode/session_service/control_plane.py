"""The control plane of the training-session API, over state on disk: CreateTrainingSession and its
lifecycle, the hub look-ups that list base models, and model package groups and packages.

One ``ControlPlane`` lives in the local endpoint process (server.py), beside the ``Runtime``
(runtime.py) that runs the operations of its Running sessions. Requests reach it already parsed and
checked against botocore's shapes (server.py); it answers dicts or raises ``ServiceError`` with
SageMaker's codes. Layout under ``$SAGEMAKER_LOCAL_ROOT/training-sessions``::

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
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from local_mode.account import ACCOUNT_ID
from local_mode.os_utils import process_identity
from local_mode.storage import _atomic_write
from local_mode.validation import ServiceError, epoch, page_start

from . import engine as engine_module

if TYPE_CHECKING:  # types only: the runtime is given to the control plane as ``go_live``
    from .runtime import LiveSession

PUBLIC_HUB = "SageMakerPublicHub"
ACTIVE = ("Created", "Scheduled", "Running", "Blocked")
IDLE_TIMEOUT_SECONDS = float(os.environ.get("SAGEMAKER_LOCAL_SESSION_IDLE_TIMEOUT", "3600"))


def not_found(message: str) -> ServiceError:
    return ServiceError("ResourceNotFound", message)


class ControlPlane:
    """SageMaker's side of the API: sessions' lifecycle, the hub's base models, model packages.
    Running sessions are kept in ``live``; the runtime (runtime.py) runs their operations: ``go_live``
    turns a loaded session into one it runs."""

    def __init__(self, aws, region: str, go_live: Callable[[dict, engine_module.Engine], LiveSession] | None = None):
        self.aws = aws
        self.region = region
        self.root = aws.storage.root / "training-sessions"
        for sub in ("sessions", "model-package-groups", "model-packages"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.live: dict[str, LiveSession] = {}
        self.lock = threading.RLock()
        self.identity = process_identity()
        self.go_live = go_live
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
                del live
                engine_module.return_freed_memory(collect=True)  # the session's model and optimizer
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
                "with the base models registered by local_mode.session_service.register_base_model."
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

    def base_model_for_arn(self, arn: str) -> tuple[str, dict]:
        marker = f"hub-content/{PUBLIC_HUB}/Model/"
        name = arn.split(marker, 1)[1].split("/")[0] if marker in arn else None
        models = self.base_models()
        if name not in models:
            raise not_found(
                f"Base model {arn} is not available: local mode serves "
                f"{', '.join(e['HuggingfaceId'] for e in models.values()) or 'no model yet'}. Register a local "
                "model folder with local_mode.session_service.register_base_model(model_id, path)."
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

    def package(self, arn: str) -> dict:
        found = PACKAGE_ARN.search(arn)
        path = self.root / "model-packages" / found["group"] / f"{int(found['version'])}.json" if found else None
        if path is None or not path.is_file():
            raise ServiceError(
                "ValidationException",
                f"Model package {arn} does not exist (a package is named arn:aws:sagemaker:<region>:<account>:"
                "model-package/<group>/<version>, as save_state and save_weights return it).",
            )
        return json.loads(path.read_text())

    def register_package(self, live: LiveSession, s3_uri: str, checkpoint: bool, description: str) -> dict:
        group = self._group_name(live.detail["ModelPackageGroupArn"])
        name, entry = self.base_model_for_arn(live.detail["ModelConfig"]["BaseModelArn"])
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
        package = self.package(request["ModelPackageName"])
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
        package = self.package(request["ModelPackageName"])
        (
            self.root / "model-packages" / package["ModelPackageGroupName"] / f"{package['ModelPackageVersion']}.json"
        ).unlink()
        return {}

    # ---- control plane
    def create_training_session(self, request: dict) -> dict:
        name = request["TrainingSessionName"]
        arn = f"arn:aws:sagemaker:{self.region}:{ACCOUNT_ID}:training-session/{name}"
        base_name, entry = self.base_model_for_arn(request["ModelConfig"]["BaseModelArn"])
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
            self.live[name] = self.go_live(detail, engine)
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
            details = [d for d in details if d["CreationTime"] > epoch(request["CreationTimeAfter"])]
        if "CreationTimeBefore" in request:
            details = [d for d in details if d["CreationTime"] < epoch(request["CreationTimeBefore"])]
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

    # ---- billing
    def bill(self, live: LiveSession, usage: dict) -> None:
        if not usage:
            return
        with self.lock:
            counts = live.detail["BillableTokenUsage"]
            for key, value in usage.items():
                counts[key] = counts.get(key, 0) + int(value)
            self.save(live.detail)


PACKAGE_ARN = re.compile(r"model-package/(?P<group>[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62})/(?P<version>[0-9]{1,9})$")


def _page(items: list[dict], request: dict, list_key: str, keys: tuple[str, ...]) -> dict:
    """One page of a List* answer: MaxResults summaries from NextToken (an offset) on."""
    start, size = page_start(request), request.get("MaxResults", 10)
    response = {list_key: [{k: item[k] for k in keys if k in item} for item in items[start : start + size]]}
    if start + size < len(items):
        response["NextToken"] = str(start + size)
    return response
