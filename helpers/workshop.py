"""What every notebook does first: a session, a role, a bucket, and the shared state file.

``start(...)`` opens the SageMaker session for the run mode (``sagemaker``, ``local`` or
``auto``; see ``helpers.sagemaker_session``), finds the execution role and the default bucket, says
all of it, and records every CreateTrainingJob the session sends.

The notebooks hand results to each other through one small JSON file, the *state file*
(``outputs/state.json`` next to the notebooks unless the ``state_file`` parameter says
otherwise; the main job puts it in its output folder). It holds the run mode, the bucket,
the S3 URIs of the data channels and of the staged model, and every job launched: its
notebook, request, status and final metrics. It is plain JSON on purpose: the same facts
are in SageMaker (``ListTrainingJobs``/``DescribeTrainingJob``) and S3, the file only saves
the reader from looking them up.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from helpers.errors import LaunchError, explain
from helpers.job_request import record_requests
from helpers.live import JobResult, watch
from helpers.results import curve_ends

DEFAULT_STATE_FILE = "outputs/state.json"


class State:
    """The shared state file: read on every access, written atomically on every change."""

    def __init__(self, path: str | Path = DEFAULT_STATE_FILE):
        self.path = Path(path)

    def load(self) -> dict:
        if not self.path.exists():
            return {}
        return json.loads(self.path.read_text(encoding="utf-8"))

    def update(self, **entries) -> None:
        state = self.load()
        state.update(entries)
        self._write(state)

    def _write(self, state: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(state, indent=1, default=str), encoding="utf-8")
        os.replace(tmp, self.path)

    def require(self, key: str, written_by: str = "00_setup_and_data.ipynb"):
        state = self.load()
        if key not in state:
            raise LaunchError(
                f"{self.path} has no '{key}': run {written_by} first (with the same state_file), "
                f"it prepares the data and the model."
            )
        return state[key]

    def job(self, job_name: str) -> dict:
        for job in self.load().get("jobs", []):
            if job["job_name"] == job_name:
                return job
        raise KeyError(f"No job {job_name!r} in {self.path}")

    def record_job(self, notebook: str, request: dict) -> None:
        state = self.load()
        state.setdefault("jobs", []).append(
            {"notebook": notebook, "job_name": request.get("TrainingJobName"), "request": request, "status": "Created"}
        )
        self._write(state)

    def record_result(self, result: JobResult, label: str | None = None) -> None:
        state = self.load()
        jobs = state.setdefault("jobs", [])
        entry = next((j for j in jobs if j["job_name"] == result.job_name), None)
        if entry is None:
            entry = {"job_name": result.job_name}
            jobs.append(entry)
        entry.update(
            status=result.status,
            secondary_status=result.secondary_status,
            failure_reason=result.failure_reason,
            final_metrics=result.final_metrics,
            model_data=result.model_data,
            billable_seconds=result.description.get("BillableTimeInSeconds"),
            training_seconds=result.description.get("TrainingTimeInSeconds"),
            curve=curve(result.records),
        )
        if label:
            entry["label"] = label
        self._write(state)


def curve(records: list[dict]) -> dict:
    """What a job's training curve did, kept beside its final metrics: each metric's mean over the first and
    over the last quarter of the logged steps (``helpers.results.curve_ends``), and how many steps logged it."""
    names = sorted({name for record in records for name in record if name != "step"})
    return {
        name: {"first": ends[0], "last": ends[1], "steps": sum(name in record for record in records)}
        for name in names
        if (ends := curve_ends(records, name)) is not None
    }


@dataclass
class Workshop:
    session: object
    role: str
    bucket: str
    region: str
    run_mode: str
    notebook: str
    state: State
    prefix: str = "llm-training-loops"
    notes: list[str] = field(default_factory=list)

    def s3(self, *parts: str) -> str:
        """``s3://<bucket>/<prefix>/<parts...>``: where this workshop keeps things."""
        return "s3://" + "/".join([self.bucket, self.prefix, *parts])

    def data_set(self, name: str) -> dict[str, str]:
        """The S3 URIs of the channels (``train``, ``test``) notebook 0 staged for data set ``name``."""
        staged = self.state.require("channels")
        if name not in staged:
            raise LaunchError(
                f"No data set {name!r} in {self.state.path}: notebook 0 staged {', '.join(sorted(staged))}. "
                "Choose one of those, or run 00_setup_and_data.ipynb again (same state_file): it stages every one."
            )
        return staged[name]

    def starting_model(self, start_from: str = "base") -> str:
        """The S3 URI a job takes as its ``model`` channel: ``"base"`` the model notebook 0 staged,
        ``"sft"`` the ``model.tar.gz`` of notebook 1's SFT job (the scripts unpack either)."""
        if start_from == "base":
            return self.state.require("model")
        if start_from == "sft":
            sft_job = self.state.require("sft_job", written_by="01_estimator_sft.ipynb")
            model_data = self.state.job(sft_job).get("model_data")
            if not model_data:
                raise LaunchError(
                    f"SFT job {sft_job} has no model artifact (status {self.state.job(sft_job).get('status')}): "
                    'run 01_estimator_sft.ipynb to completion first, or start from "base".'
                )
            return model_data
        raise LaunchError(f'start_from must be "base" or "sft", got {start_from!r}.')

    def record(self, client) -> None:
        """Record every CreateTrainingJob this boto3 SageMaker client sends in the state file."""
        record_requests(client, lambda request: self.state.record_job(self.notebook, request))

    def watch(self, job_name: str, max_steps: int | None = None, label: str | None = None, **kwargs) -> JobResult:
        """``helpers.live.watch`` the job, then keep its outcome in the state file."""
        try:
            result = watch(self.session, job_name, max_steps, **kwargs)
        except Exception:
            description = self.session.sagemaker_client.describe_training_job(TrainingJobName=job_name)
            self.state.record_result(
                JobResult(
                    job_name,
                    description["TrainingJobStatus"],
                    description.get("SecondaryStatus", ""),
                    description.get("FailureReason"),
                    [],
                    description,
                ),
                label,
            )
            raise
        self.state.record_result(result, label)
        return result


def start(
    notebook: str,
    run_mode: str = "auto",
    region: str | None = None,
    role: str | None = None,
    bucket: str | None = None,
    state_file: str | Path = DEFAULT_STATE_FILE,
) -> Workshop:
    """Open the session for ``run_mode`` (``helpers.sagemaker_session.make_session``) and say where everything goes."""
    from helpers.sagemaker_session import describe_mode, execution_role, make_session

    _plain_tracebacks()
    try:
        session = make_session(run_mode=run_mode, region=region, default_bucket=bucket)
        role = role or execution_role(session)
        bucket = session.default_bucket()
    except LaunchError:
        raise
    except Exception as error:
        guidance = explain(error, region=region)
        if guidance is None:
            raise
        raise LaunchError(f"{type(error).__name__}: {error}\n\n{guidance}") from error
    mode = getattr(session, "run_mode", "sagemaker")
    workshop = Workshop(session, role, bucket, session.boto_region_name, mode, notebook, State(state_file))
    workshop.record(session.sagemaker_client)
    workshop.state.update(run_mode=mode, region=workshop.region, bucket=bucket, role=role)
    print(
        "\n".join(
            [describe_mode(session), f"role: {role}", f"bucket: s3://{bucket}", f"state file: {workshop.state.path}"]
        )
    )
    return workshop


def _plain_tracebacks() -> None:
    """Undo the rich traceback hook that importing the SageMaker SDK (sagemaker_core) installs.

    With it, a failing cell shows a picture of the error instead of an error: papermill, nbval
    and the main job's summary then cannot say which exception was raised. IPython's own
    methods come back by deleting the instance attributes that shadow them.
    """
    import sys

    import sagemaker  # noqa: F401  (the import installs the hook; undo it after)

    sys.excepthook = sys.__excepthook__
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        for name in ("_showtraceback", "showtraceback", "showsyntaxerror"):
            shell.__dict__.pop(name, None)
