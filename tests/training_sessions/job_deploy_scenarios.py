"""A training job's model deployed with SDK v3 (sagemaker-core's resources), in its own environment
(.venv-sessions), as notebook 14 deploys notebook 03's job model.

    .venv-sessions/bin/python job_deploy_scenarios.py <scenario> '<json arguments>'

The endpoint is reached only through the environment (AWS_ENDPOINT_URL_SAGEMAKER and the like). Each
scenario prints one JSON line last, which the test reads.
"""

from __future__ import annotations

import json
import sys

import boto3
from sagemaker.core import image_uris
from sagemaker.core.resources import Endpoint, EndpointConfig, Model, TrainingJob
from sagemaker.core.shapes import ContainerDefinition, ProductionVariant

from helpers import serving

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
REGION = "us-east-1"


def deploy_and_answer(job_name: str, conversations: list[list[dict]], max_tokens: int) -> dict:
    """TrainingJob -> Model -> EndpointConfig -> Endpoint, each conversation answered greedily, then all
    three deleted; what was sent and answered."""
    job = TrainingJob.get(training_job_name=job_name)
    model_data = job.model_artifacts.s3_model_artifacts
    bucket, _, key = model_data.removeprefix("s3://").partition("/")
    archive_bytes = boto3.client("s3").head_object(Bucket=bucket, Key=key)["ContentLength"]
    choice = serving.size_instance(archive_bytes, REGION)
    image = image_uris.retrieve(
        "huggingface-llm", region=REGION, version="3.3.6", image_scope="inference", instance_type=choice.instance_type
    )
    name = f"{job_name}-v3"
    model = Model.create(
        model_name=name,
        primary_container=ContainerDefinition(image=image, model_data_url=model_data),
        execution_role_arn=ROLE,
    )
    config = EndpointConfig.create(
        endpoint_config_name=name,
        production_variants=[
            ProductionVariant(
                variant_name="AllTraffic",
                model_name=name,
                instance_type=choice.instance_type,
                initial_instance_count=1,
            )
        ],
    )
    endpoint = None
    try:
        endpoint = Endpoint.create(endpoint_name=name, endpoint_config_name=name)
        endpoint.wait_for_status("InService", poll=1, timeout=300)
        answers = []
        for messages in conversations:
            body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
            reply = endpoint.invoke(body=json.dumps(body), content_type="application/json")
            answers.append(json.loads(reply.body.read())["choices"][0]["message"]["content"])
        described = boto3.client("sagemaker").describe_endpoint(EndpointName=name)
    finally:
        if endpoint is not None:
            endpoint.delete()
        config.delete()
        model.delete()
    return {
        "model_data": model_data,
        "instance_type": choice.instance_type,
        "image": described["ProductionVariants"][0]["DeployedImages"][0]["SpecifiedImage"],
        "status": described["EndpointStatus"],
        "answers": answers,
    }


if __name__ == "__main__":
    scenario, arguments = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(globals()[scenario](**arguments)))
