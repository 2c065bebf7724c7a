"""A training job's ``model.tar.gz``, served: a job script run as a local-mode training job, launched as
notebook 03 launches its GRPO job (the PyTorch training image, ``sagemaker_program``, a ``model``
channel), then its ``ModelArtifacts`` ->
CreateModel -> CreateEndpointConfig -> CreateEndpoint through raw boto3, SDK v2's ``HuggingFaceModel``
and SDK v3's resources (``Model.create``, ``EndpointConfig.create``, ``Endpoint.create``), each
invoked and deleted. Each endpoint's greedy answers equal transformers' greedy ``generate`` on the
folder the job's archive unpacks to, on the same prompts.

The script is sft.py with LoRA (rank 4), two steps on the tiny model: every job script saves its model
through ``common.models.save_final_model``, the adapter merged, so the archive is a plain model folder
whichever loop wrote it. GRPO would leave the tiny base model as it is: it answers no GSM8K problem, so
every group's rewards are equal and its advantages zero (notebook 03 starts from notebook 01's model).

Also: an object another local-mode process wrote (a notebook kernel's job, beside this service) is
read through the service's S3, as one S3 serves every client on AWS.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from local_mode.tiny_model import tiny_model_dir

from .conftest import ROLE, boto3_session, create_endpoint
from .test_inference_endpoints_boto3 import sse_text

BUCKET = "job-model-endpoints"
SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
QUESTIONS = ["What is 2 + 3?", "Name a colour.", "Count to four."]
MAX_TOKENS = 16
TGI_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-tgi-inference:2.7.0-tgi3.3.6-gpu-py311-cu124-ubuntu22.04"


def messages(question: str) -> list[dict]:
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question}]


def source_dir_archive() -> bytes:
    """scripts/ as the SDK's tar_and_upload_dir packs a source_dir: sourcedir.tar.gz, files at the top."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as archive:
        archive.add(SCRIPTS, arcname=".", filter=lambda info: None if "__pycache__" in info.name else info)
    return packed.getvalue()


def job_request(name: str, code_uri: str, image: str) -> dict:
    """Notebook 03's kind of request, for two LoRA SFT steps on the tiny model."""
    hyperparameters = {
        "sagemaker_program": "sft.py",
        "sagemaker_submit_directory": code_uri,
        "sagemaker_region": "us-east-1",
        "max_steps": 2,
        "batch_size": 4,
        "per_device_batch_size": 4,
        "max_length": 96,
        "warmup_steps": 0,
        "learning_rate": 1e-2,  # far from the base weights in two steps, so that serving the base would show
        "lora_r": 4,
        "lora_alpha": 8,
    }
    channel = lambda name, prefix: {  # noqa: E731
        "ChannelName": name,
        "InputMode": "File",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"s3://{BUCKET}/{prefix}/"}},
    }
    return {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": image, "TrainingInputMode": "File"},
        "HyperParameters": {key: json.dumps(value) for key, value in hyperparameters.items()},
        "InputDataConfig": [channel("train", "data/chat"), channel("model", "base-model")],
        "OutputDataConfig": {"S3OutputPath": f"s3://{BUCKET}/jobs"},
        "ResourceConfig": {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 1, "VolumeSizeInGB": 100},
        "StoppingCondition": {"MaxRuntimeInSeconds": 900},
        "Environment": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    }


@pytest.fixture(scope="module")
def aws(endpoint):
    session = boto3_session(endpoint)
    return {name: session.client(name, endpoint_url=endpoint.url) for name in ("s3", "sagemaker", "sagemaker-runtime")}


@pytest.fixture(scope="module")
def job_model(endpoint, aws, offline_data, tmp_path_factory):
    """The job's model.tar.gz in local S3, unpacked here, and the greedy answers of that folder."""
    from sagemaker import image_uris  # SDK v2, as notebook 03 names the image

    s3, sagemaker = aws["s3"], aws["sagemaker"]
    s3.create_bucket(Bucket=BUCKET)
    for file in tiny_model_dir().iterdir():
        s3.upload_file(str(file), BUCKET, f"base-model/{file.name}")
    s3.upload_file(str(offline_data["chat"] / "train.jsonl"), BUCKET, "data/chat/train.jsonl")
    name = f"sft-job-{int(time.time())}"
    s3.put_object(Bucket=BUCKET, Key=f"code/{name}/sourcedir.tar.gz", Body=source_dir_archive())
    image = image_uris.retrieve(
        "pytorch", "us-east-1", version="2.8.0", py_version="py312", instance_type="ml.p5.48xlarge",
        image_scope="training",
    )  # fmt: skip
    sagemaker.create_training_job(**job_request(name, f"s3://{BUCKET}/code/{name}/sourcedir.tar.gz", image))
    sagemaker.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName=name, WaiterConfig={"Delay": 2, "MaxAttempts": 300}
    )
    job = sagemaker.describe_training_job(TrainingJobName=name)
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    uri = job["ModelArtifacts"]["S3ModelArtifacts"]
    folder = tmp_path_factory.mktemp("job-model")
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    with tarfile.open(fileobj=io.BytesIO(s3.get_object(Bucket=bucket, Key=key)["Body"].read())) as archive:
        archive.extractall(folder, filter="data")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    greedy = []
    for question in QUESTIONS:
        inputs = tokenizer.apply_chat_template(
            messages(question), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            out = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_TOKENS)
        greedy.append(tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
    return {"job": name, "uri": uri, "folder": folder, "greedy": greedy}


def test_the_jobs_archive_is_a_trained_model_folder_at_its_top(job_model):
    folder = job_model["folder"]
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= {p.name for p in folder.iterdir()}
    assert not (folder / "adapter_config.json").exists()  # a plain model: LoRA, if any, merged by the script
    trained, base = load_file(folder / "model.safetensors"), load_file(tiny_model_dir() / "model.safetensors")
    moved = max((trained[name].float() - base[name].float()).abs().max().item() for name in base)
    assert moved > 1e-3, "the job's model is the base model: serving it would prove nothing"
    assert any(len(answer) > 0 for answer in job_model["greedy"])


def test_boto3_deploys_the_jobs_model_and_answers_as_its_greedy_generate(job_model, aws):
    sagemaker, runtime = aws["sagemaker"], aws["sagemaker-runtime"]
    name = f"{job_model['job']}-boto3"
    create_endpoint(sagemaker, name, {"Image": TGI_IMAGE, "ModelDataUrl": job_model["uri"]}, "ml.g5.2xlarge")
    try:
        sagemaker.get_waiter("endpoint_in_service").wait(
            EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 300}
        )
        for question, expected in zip(QUESTIONS, job_model["greedy"], strict=True):
            body = {"messages": messages(question), "max_tokens": MAX_TOKENS, "temperature": 0}
            answer = runtime.invoke_endpoint(EndpointName=name, ContentType="application/json", Body=json.dumps(body))
            content = json.loads(answer["Body"].read())["choices"][0]["message"]["content"]
            assert content == expected.strip()  # transformers serve trims the whole answer
            stream = runtime.invoke_endpoint_with_response_stream(
                EndpointName=name, ContentType="application/json", Body=json.dumps({**body, "stream": True})
            )
            raw = b"".join(event["PayloadPart"]["Bytes"] for event in stream["Body"] if "PayloadPart" in event)
            assert sse_text(raw) == expected  # the deltas are raw
    finally:
        sagemaker.delete_endpoint(EndpointName=name)
        sagemaker.delete_endpoint_config(EndpointConfigName=name)
        sagemaker.delete_model(ModelName=name)
    sagemaker.get_waiter("endpoint_deleted").wait(EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})


def test_sdk_v2_huggingface_model_deploys_the_jobs_model_data(job_model, endpoint, monkeypatch):
    import boto3
    import sagemaker
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.huggingface import HuggingFaceModel, get_huggingface_llm_image_uri
    from sagemaker.serializers import JSONSerializer

    for variable, value in endpoint.client_environment().items():  # every client the SDK makes (STS, S3 too)
        monkeypatch.setenv(variable, value)
    session = sagemaker.Session(boto_session=boto3.Session())
    model = HuggingFaceModel(
        model_data=job_model["uri"],
        image_uri=get_huggingface_llm_image_uri("huggingface", region="us-east-1"),
        role=ROLE,
        sagemaker_session=session,
    )
    name = f"{job_model['job']}-v2"
    predictor = model.deploy(
        initial_instance_count=1,
        instance_type="ml.g5.2xlarge",
        endpoint_name=name,
        serializer=JSONSerializer(),
        deserializer=JSONDeserializer(),
        wait=False,
    )
    try:
        session.wait_for_endpoint(name, poll=1)
        described = session.sagemaker_client.describe_endpoint(EndpointName=name)
        image = described["ProductionVariants"][0]["DeployedImages"][0]["SpecifiedImage"]
        assert "huggingface-pytorch-tgi-inference" in image
        for question, expected in zip(QUESTIONS, job_model["greedy"], strict=True):
            answer = predictor.predict({"messages": messages(question), "max_tokens": MAX_TOKENS, "temperature": 0})
            assert answer["choices"][0]["message"]["content"] == expected.strip()
    finally:
        predictor.delete_model()
        predictor.delete_endpoint()


def test_sdk_v3_resources_deploy_the_jobs_model(job_model, sdk):
    script = Path(__file__).with_name("job_deploy_scenarios.py")
    done = sdk(
        "deploy_and_answer",
        script=script,
        job_name=job_model["job"],
        conversations=[messages(q) for q in QUESTIONS],
        max_tokens=MAX_TOKENS,
    )
    assert done["model_data"] == job_model["uri"] and done["status"] == "InService"
    assert "huggingface-pytorch-tgi-inference" in done["image"] and done["instance_type"].startswith("ml.g")
    assert done["answers"] == [expected.strip() for expected in job_model["greedy"]]


def test_service_reads_what_another_local_mode_process_wrote(endpoint, aws):
    """A kernel's in-process local mode mirrors its S3 writes to disk; the service started earlier loads
    them when they are read (and CreateModel finds a job's archive written so)."""
    from local_mode.storage import Storage

    s3, sagemaker = aws["s3"], aws["sagemaker"]
    s3.create_bucket(Bucket=BUCKET)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as packed:
        for file in sorted(tiny_model_dir().iterdir()):
            packed.add(file, arcname=file.name)
    mirror = Storage(endpoint.root)  # what another process's after-call hook writes
    stamp = int(time.time() * 1000)
    job_archive = f"elsewhere/{stamp}-job/output/model.tar.gz"
    mirror.mirror_put(BUCKET, job_archive, archive.getvalue())
    sagemaker.create_model(
        ModelName=f"elsewhere-{stamp}",
        ExecutionRoleArn=ROLE,
        PrimaryContainer={"Image": TGI_IMAGE, "ModelDataUrl": f"s3://{BUCKET}/{job_archive}"},
    )
    sagemaker.delete_model(ModelName=f"elsewhere-{stamp}")

    listed, read = f"elsewhere/{stamp}-list/a.txt", f"elsewhere/{stamp}-get/b.txt"
    mirror.mirror_put(BUCKET, listed, b"listed")
    mirror.mirror_put(BUCKET, read, b"read")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"elsewhere/{stamp}-list/")["Contents"]] == [
        listed
    ]
    assert s3.get_object(Bucket=BUCKET, Key=read)["Body"].read() == b"read"
    assert s3.head_object(Bucket=BUCKET, Key=job_archive)["ContentLength"] == len(archive.getvalue())
