"""SageMaker's training-job API, answered in this process.

botocore emits ``before-call.sagemaker.<Operation>`` after it has validated and serialized the
parameters and before anything is signed or sent; a handler that returns
``(http_response, parsed)`` is the response (botocore ``BaseClient._make_api_call``). One handler
therefore serves ``Estimator.fit``, ``Session.train``/``wait_for_job``, ``Estimator.attach`` and
raw ``boto3.client("sagemaker")`` alike, and errors become the same ``ClientError`` subclasses
the real service produces (``client.exceptions.ResourceInUse`` ...).
"""

from __future__ import annotations

import copy
import json
import time
import uuid

from botocore.awsrequest import AWSResponse

from local_mode.account import ACCOUNT_ID  # local mode's account, defined once for both environments
from local_mode.endpoints import HOSTING_OPERATIONS, Hosting
from local_mode.os_utils import is_same_process, process_identity
from local_mode.storage import to_wire
from local_mode.validation import ServiceError, epoch, page_start, validate_create_training_job

from . import runner

_ACTIVE = ("InProgress", "Stopping")


class SageMakerAPI:
    def __init__(self, aws):
        self.aws = aws
        self.storage = aws.storage
        self._operations = {
            "CreateTrainingJob": self.create_training_job,
            "DescribeTrainingJob": self.describe_training_job,
            "ListTrainingJobs": self.list_training_jobs,
            "StopTrainingJob": self.stop_training_job,
            "AddTags": self.add_tags,
            "ListTags": self.list_tags,
            "DeleteTags": self.delete_tags,
        }
        # Real-time endpoints (endpoints.py): Model.deploy(), Predictor.delete_endpoint(), raw boto3. Their
        # records and servers are set up at the first such call: a process that only trains never builds them.
        self._hosting: Hosting | None = None
        self._operations.update({name: self._hosting_operation(name) for name in HOSTING_OPERATIONS})

    @property
    def hosting(self) -> Hosting:
        if self._hosting is None:
            self._hosting = Hosting(self.aws)
        return self._hosting

    def _hosting_operation(self, name: str):
        return lambda request: self.hosting.operations[name](request)

    def __call__(self, model, params, **kwargs):
        """The botocore event handler."""
        request_id = str(uuid.uuid4())
        try:
            operation = self._operations.get(model.name)
            if operation is None:
                raise ServiceError(
                    "ValidationException",
                    f"Local mode answers the training-job and endpoint APIs only ({', '.join(self._operations)}); "
                    f"{model.name} needs SageMaker: make_session(run_mode='sagemaker').",
                )
            body = json.loads(params.get("body") or b"{}")
            parsed = to_wire(operation(body))
            status = 200
        except ServiceError as error:
            parsed = {"Error": {"Code": error.code, "Message": error.message}}
            status = error.status
        parsed["ResponseMetadata"] = {
            "RequestId": request_id,
            "HTTPStatusCode": status,
            "HTTPHeaders": {},
            "RetryAttempts": 0,
        }
        return AWSResponse(params.get("url", "https://api.sagemaker.local/"), status, {}, None), parsed

    # ---- operations ----------------------------------------------------------------------------
    def create_training_job(self, request: dict) -> dict:
        validate_create_training_job(request)
        name = request["TrainingJobName"]
        arn = f"arn:aws:sagemaker:{self.aws.region}:{ACCOUNT_ID}:training-job/{name.lower()}"
        if self.storage.load_job(name) is not None:
            raise ServiceError(
                "ResourceInUse",
                "Training job names must be unique within an AWS account and region, and a training job "
                f"with this name already exists ({arn})",
            )
        now = time.time()
        job = copy.deepcopy(request)
        job["_tags"] = job.pop("Tags", [])  # ListTags answers them; Describe does not show them
        job["AlgorithmSpecification"].setdefault("TrainingInputMode", "File")
        job["ResourceConfig"].setdefault("VolumeSizeInGB", 30)
        job["OutputDataConfig"].setdefault("KmsKeyId", "")  # Describe always carries it; attach reads it
        job.setdefault("StoppingCondition", {}).setdefault("MaxRuntimeInSeconds", 86400)
        job.setdefault("EnableNetworkIsolation", False)
        job.setdefault("EnableInterContainerTrafficEncryption", False)
        job.setdefault("EnableManagedSpotTraining", False)
        job.update(
            {
                "TrainingJobArn": arn,
                "TrainingJobStatus": "InProgress",
                "SecondaryStatus": "Starting",
                "CreationTime": now,
                "LastModifiedTime": now,
                "SecondaryStatusTransitions": [
                    {
                        "Status": "Starting",
                        "StartTime": now,
                        "StatusMessage": "Launching requested ML instances",
                    }
                ],
                "_owner": process_identity(),
            }
        )
        self.storage.save_job(job)
        runner.TrainingJob(self.aws, job).start()
        return {"TrainingJobArn": arn}

    def _load(self, name: str) -> dict:
        job = self.storage.load_job(name)
        if job is None:
            raise ServiceError("ValidationException", "Requested resource not found.")
        if job["TrainingJobStatus"] in _ACTIVE and not self._still_running(job):
            # Its runner saves the job's end, then leaves RUNNING: read it again, it may have just ended.
            job = self.storage.load_job(name)
            if job["TrainingJobStatus"] in _ACTIVE:
                # The kernel that ran it exited (a notebook closed, a crash): nothing runs it any more.
                job["TrainingJobStatus"] = job["SecondaryStatus"] = "Failed"
                job["FailureReason"] = (
                    "ClientError: local mode ran this job in a Python process that ended before the job "
                    f"finished (pid {job['_owner']['pid']}). Run the job again and keep that kernel open until it ends."
                )
                job["LastModifiedTime"] = time.time()
                self.storage.save_job(job)
        return job

    @staticmethod
    def _still_running(job: dict) -> bool:
        owner = job.get("_owner", {})
        if owner == process_identity():
            return job["TrainingJobName"] in runner.RUNNING
        return is_same_process(owner)

    def describe_training_job(self, request: dict) -> dict:
        job = self._load(request["TrainingJobName"])
        return {k: v for k, v in job.items() if not k.startswith("_")}

    def list_training_jobs(self, request: dict) -> dict:
        jobs = [self._load(name) for name in self.storage.job_names()]
        if "NameContains" in request:
            jobs = [j for j in jobs if request["NameContains"].lower() in j["TrainingJobName"].lower()]
        if "StatusEquals" in request:
            jobs = [j for j in jobs if j["TrainingJobStatus"] == request["StatusEquals"]]
        for key, keep in (
            ("CreationTimeAfter", lambda j, t: j["CreationTime"] > t),
            ("CreationTimeBefore", lambda j, t: j["CreationTime"] < t),
            ("LastModifiedTimeAfter", lambda j, t: j["LastModifiedTime"] > t),
            ("LastModifiedTimeBefore", lambda j, t: j["LastModifiedTime"] < t),
        ):
            if key in request:
                jobs = [j for j in jobs if keep(j, epoch(request[key]))]
        sort_key = {"Name": "TrainingJobName", "Status": "TrainingJobStatus"}.get(request.get("SortBy"), "CreationTime")
        jobs.sort(key=lambda j: j[sort_key], reverse=request.get("SortOrder", "Descending") == "Descending")
        start = page_start(request)
        size = request.get("MaxResults", 10)
        page = jobs[start : start + size]
        summaries = [
            {
                k: j[k]
                for k in (
                    "TrainingJobName", "TrainingJobArn", "CreationTime", "TrainingEndTime",
                    "LastModifiedTime", "TrainingJobStatus", "SecondaryStatus",
                )
                if k in j
            }
            for j in page
        ]  # fmt: skip
        response = {"TrainingJobSummaries": summaries}
        if start + size < len(jobs):
            response["NextToken"] = str(start + size)
        return response

    def stop_training_job(self, request: dict) -> dict:
        name = request["TrainingJobName"]
        job = self._load(name)
        if job["TrainingJobStatus"] not in _ACTIVE:
            raise ServiceError(
                "ValidationException",
                f"The request was rejected because the training job is in status {job['TrainingJobStatus']}.",
            )
        if name in runner.RUNNING:
            runner.RUNNING[name].stop()
        else:
            # Another kernel runs it: it picks the request up within a fraction of a second.
            self.storage.stop_request_path(name).touch()
        return {}

    # ---- tags (Estimator.attach lists them) ------------------------------------------------------
    def _job_for_arn(self, arn: str) -> dict:
        prefix = f"arn:aws:sagemaker:{self.aws.region}:{ACCOUNT_ID}:training-job/"
        name = arn[len(prefix) :] if arn.startswith(prefix) else None
        job = next((self.storage.load_job(n) for n in self.storage.job_names() if n.lower() == name), None)
        if job is None:
            raise ServiceError(
                "ValidationException",
                f"Local mode keeps tags of its own training jobs only; no training job has the ARN {arn}.",
            )
        return job

    def _save_tags(self, job: dict) -> None:
        running = runner.RUNNING.get(job["TrainingJobName"])
        if running is not None:
            running.job["_tags"] = job["_tags"]  # the job's thread saves its own copy of the document
        self.storage.save_job(job)

    def add_tags(self, request: dict) -> dict:
        job = self._job_for_arn(request["ResourceArn"])
        keys = {t["Key"] for t in request["Tags"]}
        job["_tags"] = [t for t in job.get("_tags", []) if t["Key"] not in keys] + request["Tags"]
        self._save_tags(job)
        return {"Tags": request["Tags"]}

    def list_tags(self, request: dict) -> dict:
        return {"Tags": self._job_for_arn(request["ResourceArn"]).get("_tags", [])}

    def delete_tags(self, request: dict) -> dict:
        job = self._job_for_arn(request["ResourceArn"])
        job["_tags"] = [t for t in job.get("_tags", []) if t["Key"] not in request["TagKeys"]]
        self._save_tags(job)
        return {}
