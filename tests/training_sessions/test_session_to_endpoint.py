"""A training session's checkpoint, served: SaveWeights with mergeWeights -> its model package's
``hf_merged/`` -> CreateModel -> CreateEndpointConfig -> CreateEndpoint, through raw boto3; the served
model proven to be the trained one; and ``LLMClient`` talking to the session and to the endpoint.

What is proven, and how closely:
  * the merged export's logits equal the base model with the exported PEFT adapter, within 1e-4;
  * the exported adapter is one an inference server loads: its adapter_config.json names its rank and
    target modules, and no lm_head (no module, no tensor);
  * greedy answers from the endpoint equal the session's own ``sample`` at temperature 0, token for
    token (the stream's deltas are the raw decoded text);
  * the log-probs of the same tokens under the weights the endpoint serves equal the trainer's
    ``compute_logprobs`` within 1e-4. Why 1e-4: both are fp32; the trainer computes x·W + s·(x·A)·B and
    the merged model x·(W + s·B·A), the same sums in another order, so they differ by fp32 rounding
    (about 1e-7 relative per product, ~1e-6 on the tiny model's logits); 1e-4 is far above that and far
    below a changed token's probability (the adapter moves them by more than 1e-2, checked). The
    endpoint's server, ``transformers serve``, does not return log-probs (it ignores ``logprobs``, as its
    UNUSED_CHAT_COMPLETION_FIELDS say), so they are computed from the folder that server loaded.

One inference server serves the module.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from local_mode.tiny_model import tiny_model_dir

from .conftest import boto3_session, create_endpoint
from .test_session_api_boto3 import create, datum, result

IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-tgi-inference:2.7.0-tgi3.3.6-gpu-py311-cu124-ubuntu22.04"
QUESTIONS = ["What is 2 + 3?", "Name a colour.", "Count to four."]
TOLERANCE = 1e-4


def messages(question: str) -> list[dict]:
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(tiny_model_dir())


@pytest.fixture(scope="module")
def served(endpoint, clients, tmp_path_factory):
    """A trained session, its merged save downloaded, and an endpoint serving it; all gone at the end."""
    control, runtime = clients
    aws = boto3_session(endpoint)
    s3 = aws.client("s3", endpoint_url=endpoint.url)
    name = f"serve-{uuid.uuid4().hex[:8]}"
    create(control, name, rank=4, group=name)
    ops = []
    for _ in range(3):  # a few steps at a high rate, so that the adapter is far from zero
        ops += [
            {"forwardBackward": {"lossFnName": "cross_entropy", "datumList": [datum([5, 6, 7, 8, 9, 10, 11, 12])]}},
            {"optimizerStep": {"adamParamsConfig": {"learningRate": 1e-2}}},
        ]
    ops.append({"saveWeights": {"mergeWeights": True, "description": "merged for an endpoint"}})
    for sequence, config in enumerate(ops, 1):
        op = runtime.execute_training_operation(
            trainingSessionName=name, sequenceNumber=sequence, operationConfig=config
        )
        done = result(runtime, name, op["operationId"], timeout=120)
        assert done["status"] == "Completed", done
    package_arn = done["operationResult"]["saveWeights"]["modelPackageArn"]
    package = control.describe_model_package(ModelPackageName=package_arn)
    uri = package["InferenceSpecification"]["Containers"][0]["ModelDataSource"]["S3DataSource"]["S3Uri"]
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    folder = tmp_path_factory.mktemp("saved")
    for item in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]:
        target = folder / item["Key"][len(prefix) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, item["Key"], str(target))

    sagemaker = aws.client("sagemaker", endpoint_url=endpoint.url)
    model = endpoint_name = f"{name}-merged"
    merged = {"S3DataSource": {"S3Uri": f"{uri}hf_merged/", "S3DataType": "S3Prefix", "CompressionType": "None"}}
    create_endpoint(sagemaker, endpoint_name, {"Image": IMAGE, "ModelDataSource": merged})
    try:
        sagemaker.get_waiter("endpoint_in_service").wait(
            EndpointName=endpoint_name, WaiterConfig={"Delay": 1, "MaxAttempts": 300}
        )
        yield {
            "session": name,
            "package": package_arn,
            "folder": folder,
            "endpoint": endpoint_name,
            "served_folder": endpoint.root / "hosting" / "model-data" / model,
            "runtime": runtime,
            "invoke": aws.client("sagemaker-runtime", endpoint_url=endpoint.url),
        }
    finally:
        sagemaker.delete_endpoint(EndpointName=endpoint_name)
        control.stop_training_session(TrainingSessionName=name)


def _sampling(runtime, name, config) -> dict:
    """A sampling operation's result. It names the saved package: without one, sampling and scoring
    read the base model (SageMaker's SDK documents an empty model package ARN as the base model)."""
    op = runtime.execute_sampling_operation(trainingSessionName=name, operationConfig=config)
    deadline = time.monotonic() + 120
    while True:
        answer = runtime.get_sampling_operation_result(trainingSessionName=name, operationId=op["operationId"])
        if answer["status"] != "InProgress" or time.monotonic() > deadline:
            assert answer["status"] == "Completed", answer
            return answer["operationResult"]


def _input(tokens: list[int]) -> dict:
    return {"chunks": [{"tokens": tokens, "type": "encoded_text"}]}


def _prompt(tokenizer, question) -> list[int]:
    encoded = tokenizer.apply_chat_template(
        messages(question), add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(encoded["input_ids"])


def _logits(model, tokens) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].float()


def test_merged_export_logits_equal_base_plus_adapter(served, tokenizer):
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32).eval()
    tokens = _prompt(tokenizer, QUESTIONS[0]) + [5, 6, 7, 8, 9, 10, 11, 12]
    base_logits = _logits(base, tokens)
    with_adapter = PeftModel.from_pretrained(base, str(served["folder"])).eval()
    adapter_logits = _logits(with_adapter, tokens)
    merged = AutoModelForCausalLM.from_pretrained(served["folder"] / "hf_merged").eval()
    merged_logits = _logits(merged, tokens)
    moved = (adapter_logits - base_logits).abs().max().item()
    difference = (merged_logits - adapter_logits).abs().max().item()
    print(f"adapter moved the logits by up to {moved:.3g}; merged vs base + adapter: {difference:.3g}")
    assert moved > 1e-2  # the adapter is trained: a merge that dropped it would be caught
    assert difference < TOLERANCE
    assert merged.config.dtype == torch.float32 and not hasattr(merged, "peft_config")


def test_exported_adapter_names_its_rank_and_targets_and_no_lm_head(served):
    from safetensors import safe_open

    config = json.loads((served["folder"] / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    targets = set(config["target_modules"])
    linear = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert targets == linear, targets  # every linear layer of the blocks ("all-linear"), named one by one
    assert "lm_head" not in targets and not config.get("modules_to_save")
    with safe_open(served["folder"] / "adapter_model.safetensors", "pt") as tensors:
        keys = list(tensors.keys())
    assert keys and not [k for k in keys if "lm_head" in k or "embed_tokens" in k]
    assert {k.split(".")[-3] for k in keys} == linear  # ...q_proj.lora_A.weight: a tensor pair per target


def _streamed_text(raw: bytes) -> str:
    text = ""
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[len("data: ") :])["choices"]:
                text += choice.get("delta", {}).get("content") or ""
    return text


@pytest.mark.parametrize("question", QUESTIONS)
def test_endpoint_greedy_answer_is_the_sessions_sample_at_temperature_0(served, tokenizer, question):
    prompt = _prompt(tokenizer, question)
    params = {"maxTokens": 512, "temperature": 0.0}  # the API's least maxTokens
    sample = {"prompt": _input(prompt), "numSamples": 1, "samplingParams": params, "modelPackageArn": served["package"]}
    sampled = _sampling(served["runtime"], served["session"], {"sample": sample})["sample"]["sequences"][0]
    body = {"messages": messages(question), "max_tokens": len(sampled["tokens"]), "temperature": 0, "stream": True}
    response = served["invoke"].invoke_endpoint_with_response_stream(
        EndpointName=served["endpoint"], ContentType="application/json", Body=json.dumps(body)
    )
    streamed = _streamed_text(b"".join(e["PayloadPart"]["Bytes"] for e in response["Body"] if "PayloadPart" in e))
    assert streamed == tokenizer.decode(sampled["tokens"], skip_special_tokens=True)
    assert len(sampled["tokens"]) >= 8  # a real answer compared, not a stop after one token


def test_served_weights_give_the_trainers_logprobs_of_the_same_tokens(served, tokenizer):
    served_model = AutoModelForCausalLM.from_pretrained(served["served_folder"]).eval()
    worst = 0.0
    for question in QUESTIONS:
        prompt = _prompt(tokenizer, question)
        sample = {
            "prompt": _input(prompt),
            "numSamples": 1,
            "samplingParams": {"maxTokens": 512, "temperature": 0.0},
            "modelPackageArn": served["package"],
        }
        answer = _sampling(served["runtime"], served["session"], {"sample": sample})["sample"]["sequences"][0]
        tokens = prompt + answer["tokens"]
        config = {"computeLogprobs": {"prompt": _input(tokens), "modelPackageArn": served["package"]}}
        trainer = _sampling(served["runtime"], served["session"], config)["computeLogprobs"]["logprobs"]
        logits = _logits(served_model, tokens)[:-1]
        own = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:]).unsqueeze(-1)).squeeze(-1)
        assert trainer[0] is None and len(trainer) == len(tokens)
        worst = max(worst, max(abs(a - b) for a, b in zip(trainer[1:], own.tolist(), strict=True)))
    print(f"largest log-prob difference, served weights vs compute_logprobs: {worst:.3g}")
    assert worst < TOLERANCE


def test_llm_client_uses_the_session_and_the_endpoint_as_models_and_as_a_judge(
    served, endpoint, monkeypatch, tokenizer
):
    from common.llm_client import LLMClient, LLMRequestFailed
    from environments.llm_judge import PairwiseJudge, win_rate

    from helpers.serving import OpenAIGateway
    from helpers.teacher_judge import choice_token_ids

    for variable, value in endpoint.client_environment().items():
        monkeypatch.setenv(variable, value)
    chat = messages(QUESTIONS[0])
    with OpenAIGateway() as gateway:
        session = LLMClient(f"training-session/{served['session']}", base_url=gateway.base_url, api_key=gateway.api_key)
        saved = LLMClient(
            f"training-session/{served['session']}@{served['package']}",
            base_url=gateway.base_url,
            api_key=gateway.api_key,
        )
        deployed = LLMClient(f"endpoint/{served['endpoint']}", base_url=gateway.base_url, api_key=gateway.api_key)
        try:
            answers = [c.complete_many([chat], max_tokens=24, temperature=0)[0] for c in (session, saved, deployed)]
            direct = served["runtime"].sample_training_session(
                trainingSessionName=served["session"],
                contentType="application/json",
                body=json.dumps({"messages": chat, "max_tokens": 24, "temperature": 0}).encode(),
            )
            expected = json.loads(direct["body"].read())["choices"][0]["message"]["content"]
            assert answers[0].text == answers[1].text == expected and answers[0].completion_tokens == 24
            # transformers serve trims the whole answer's surrounding whitespace (endpoint tests)
            assert answers[2].text == expected.strip() and answers[2].completion_tokens == 24

            judge = PairwiseJudge(deployed, choice_token_ids=choice_token_ids(tiny_model_dir()))
            verdicts = judge.compare(QUESTIONS, ["5", "red", "1 2 3 4"], ["seven", "", "no"])
            # one constrained token in each order of each pair
            assert all({v["a_first"], v["b_first"]} <= {"a", "b"} for v in verdicts), verdicts
            assert win_rate(verdicts)["judged"] == len(QUESTIONS)

            stranger = LLMClient("endpoint/nowhere", base_url=gateway.base_url, api_key=gateway.api_key, max_retries=0)
            with pytest.raises(LLMRequestFailed, match="nowhere"):
                stranger.complete_many([chat], max_tokens=4)
            stranger.close()
            keyless = LLMClient(
                f"endpoint/{served['endpoint']}", base_url=gateway.base_url, api_key="guess", max_retries=0
            )
            with pytest.raises(LLMRequestFailed, match="401"):
                keyless.complete_many([chat], max_tokens=4)
            keyless.close()
        finally:
            for client in (session, saved, deployed):
                client.close()
