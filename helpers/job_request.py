"""The CreateTrainingJob request: preview it, record what was sent, summarise it.

Whichever way a notebook launches (estimator, ``Session.train``, boto3), SageMaker
receives one ``CreateTrainingJob`` request. Three tools for it:

- ``estimator_request(estimator, inputs)`` / ``session_request(session, train_args)``:
  the request the SDK will send, built by the SDK's own code before anything is launched;
- ``record_requests(client, on_request)``: calls ``on_request(params)`` with every
  CreateTrainingJob request a boto3 SageMaker client sends (a botocore
  ``before-parameter-build`` hook, so it sees exactly the API parameters);
- ``summary(request)``: the fields that decide where and how the job runs (image,
  instances or instance groups, spot, checkpoints, distribution, isolation, channels), one per line, in a
  fixed order. The notebooks keep this output in git and the tests check it with nbval.
"""

from __future__ import annotations

import json
from collections.abc import Callable


def estimator_request(estimator, inputs=None, job_name: str | None = None) -> dict:
    """The CreateTrainingJob request ``estimator.fit(inputs)`` sends (nothing is launched).

    Uses the SDK v2 code path of ``fit`` (``_TrainingJob.get_train_args`` then the
    session's request builder); preparing uploads the ``source_dir`` as ``fit`` does.
    """
    from sagemaker.estimator import _TrainingJob

    estimator._prepare_for_training(job_name=job_name)
    train_args = _TrainingJob.get_train_args(estimator, inputs, experiment_config=None)
    return estimator.sagemaker_session._get_train_request(**train_args)


def session_request(session, train_args: dict) -> dict:
    """The CreateTrainingJob request ``session.train(**train_args)`` sends (nothing is launched)."""
    import inspect

    arguments = inspect.signature(session.train).bind(**train_args)
    arguments.apply_defaults()  # the request builder takes every argument train() defaults
    return session._get_train_request(**arguments.arguments)


def record_requests(client, on_request: Callable[[dict], None]) -> Callable:
    """Call ``on_request(params)`` for each CreateTrainingJob this boto3 client sends.

    Returns the handler (``client.meta.events.unregister(EVENT, handler)`` removes it).
    """

    def handler(params, **_):
        on_request(json.loads(json.dumps(params, default=str)))  # a plain copy, detached from botocore's

    client.meta.events.register(EVENT, handler, unique_id=f"record-requests-{id(on_request)}")
    return handler


EVENT = "before-parameter-build.sagemaker.CreateTrainingJob"


def summary_lines(request: dict) -> list[str]:
    algorithm = request.get("AlgorithmSpecification", {})
    resources = request.get("ResourceConfig", {})
    stopping = request.get("StoppingCondition", {})
    hyperparameters = request.get("HyperParameters", {}) or {}
    checkpoint = request.get("CheckpointConfig")
    lines = [
        f"TrainingJobName: {request.get('TrainingJobName')}",
        f"TrainingImage: {algorithm.get('TrainingImage')}",
        f"TrainingInputMode: {algorithm.get('TrainingInputMode')}",
        *(
            [f"InstanceGroups: {', '.join(instance_group_text(g) for g in resources['InstanceGroups'])}"]
            if resources.get("InstanceGroups")
            else [f"InstanceType: {resources.get('InstanceType')}", f"InstanceCount: {resources.get('InstanceCount')}"]
        ),
        f"VolumeSizeInGB: {resources.get('VolumeSizeInGB')}",
        f"MaxRuntimeInSeconds: {stopping.get('MaxRuntimeInSeconds')}",
        f"MaxWaitTimeInSeconds: {stopping.get('MaxWaitTimeInSeconds')}",
        f"EnableManagedSpotTraining: {bool(request.get('EnableManagedSpotTraining', False))}",
        f"CheckpointConfig: {checkpoint.get('S3Uri') + ' -> ' + checkpoint.get('LocalPath', '/opt/ml/checkpoints') if checkpoint else None}",
        f"EnableNetworkIsolation: {bool(request.get('EnableNetworkIsolation', False))}",
        f"OutputPath: {request.get('OutputDataConfig', {}).get('S3OutputPath')}",
    ]
    for channel in request.get("InputDataConfig", []):
        source = channel.get("DataSource", {}).get("S3DataSource", {})
        uri = source.get("S3Uri")
        groups = f" (to {', '.join(source['InstanceGroupNames'])} only)" if source.get("InstanceGroupNames") else ""
        lines.append(f"Channel {channel['ChannelName']}: {uri}{groups}")
    # The toolkit's own settings (entry point, distribution) are hyperparameters named sagemaker_*.
    for key in sorted(k for k in hyperparameters if k.startswith("sagemaker_") and k != "sagemaker_submit_directory"):
        lines.append(f"{key}: {hyperparameters[key]}")
    if "sagemaker_submit_directory" in hyperparameters:
        lines.append(f"sagemaker_submit_directory: {hyperparameters['sagemaker_submit_directory']}")
    script_options = sorted(k for k in hyperparameters if not k.startswith("sagemaker_"))
    lines.append(f"Script options: {', '.join(script_options)}")
    lines.append(f"Environment: {', '.join(sorted(request.get('Environment', {}) or {}))}")
    lines.append(f"Metrics: {', '.join(m['Name'] for m in algorithm.get('MetricDefinitions', []) or [])}")
    return lines


def instance_group_text(group: dict) -> str:
    """``learner 1 x ml.p5.48xlarge``: one group of a heterogeneous cluster's ``InstanceGroups``."""
    return f"{group['InstanceGroupName']} {group['InstanceCount']} x {group['InstanceType']}"


def summary(request: dict) -> str:
    return "\n".join(summary_lines(request))


def print_summary(request: dict) -> None:
    print(summary(request))
