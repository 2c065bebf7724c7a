"""Losses the service does not have, trained through ``helpers/training_sessions/logprob_loss.py`` with the real SDK (SDK v3,
``.venv-sessions``), against the local endpoint. Run by ``test_custom_loss.py``:

    .venv-sessions/bin/python custom_loss_scenarios.py <scenario> '<json arguments>'

Each scenario prints one JSON line last, which the test reads.
"""

from __future__ import annotations

import json
import sys

import boto3
import torch
from sagemaker.train.training_session import AdamParams, ServiceClient

from helpers.training_sessions import datum_tools, dpo, logprob_loss

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
MODEL = "local/tiny-qwen2"


def adapter_file(training_client, out: str) -> str:
    """Save the session's weights and copy the adapter's safetensors file from the package's S3 folder."""
    arn = training_client.save_weights_for_sampler("custom-loss test").result().model_package_arn
    package = boto3.client("sagemaker").describe_model_package(ModelPackageName=arn)
    uri = package["InferenceSpecification"]["Containers"][0]["ModelDataSource"]["S3DataSource"]["S3Uri"]
    bucket, _, key = uri[len("s3://") :].rstrip("/").partition("/")
    boto3.client("s3").download_file(bucket, f"{key}/adapter_model.safetensors", out)
    return out


def dpo_steps(rows, rank, alpha, beta, steps, adam, max_prompt_length, max_length, out) -> dict:
    """``steps`` DPO steps on ``rows`` (all pairs every step) through the technique; the losses, the gradient norms
    the optimizer steps report and the adapter after them."""
    training_client = ServiceClient(region="us-east-1", role_arn=ROLE).create_lora_training_client(
        MODEL, rank=rank, alpha=alpha
    )
    try:
        datums = dpo.pair_datums(training_client.get_tokenizer(), rows, max_prompt_length, max_length)
        masks = dpo.answer_masks(datums)
        ref_chosen, ref_rejected = dpo.reference_logps(training_client, datums)  # before the first update
        losses, grad_norms = [], []
        for _ in range(steps):
            future, loss, _ = logprob_loss.forward_backward(
                training_client, datums, dpo.dpo_objective(masks, ref_chosen, ref_rejected, beta)
            )
            optim_step = training_client.optim_step(AdamParams(**adam))
            future.result()
            grad_norms.append(optim_step.result().metrics["grad_norm"])  # before clipping
            losses.append(loss)
        return {"losses": losses, "grad_norms": grad_norms, "adapter": adapter_file(training_client, out)}
    finally:
        training_client.stop()


def closed_form(texts, seed) -> dict:
    """Two losses whose gradient in logp is known, sent through the technique; the weights actually sent:

    - linear:  L = sum_t c_t * m_t * logp_t             ->  w = -c * m
    - squared: L = 1/2 sum_t m_t * (logp_t - y_t)^2     ->  w = m * (y - logp)
    (m: the datum's own weights, 1 on the answer).
    """
    training_client = ServiceClient(region="us-east-1", role_arn=ROLE).create_lora_training_client(
        MODEL, rank=4, alpha=8
    )
    try:
        tokenizer = training_client.get_tokenizer()
        datums = []
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            datums.append(datum_tools.supervised_datum(ids[:3], ids[3:]))  # the first 3 tokens a prompt: weight 0
        masks = dpo.answer_masks(datums)
        generator = torch.Generator().manual_seed(seed)
        c = [torch.rand(len(m), generator=generator, dtype=torch.float64) * 4 - 2 for m in masks]
        y = [-torch.rand(len(m), generator=generator, dtype=torch.float64) * 8 for m in masks]
        losses = {
            "linear": lambda lps: sum((ci * m * lp).sum() for ci, m, lp in zip(c, masks, lps, strict=True)),
            "squared": lambda lps: sum(
                (0.5 * m * (lp - yi) ** 2).sum() for yi, m, lp in zip(y, masks, lps, strict=True)
            ),
        }
        sent = []
        original = training_client.forward_backward

        def recording(batch, *args, **kwargs):  # what the helper hands the SDK
            sent.append([datum_tools.values(d.loss_fn_inputs["weights"]) for d in batch])
            return original(batch, *args, **kwargs)

        training_client.forward_backward = recording
        result = {"c": [x.tolist() for x in c], "y": [x.tolist() for x in y], "masks": [m.tolist() for m in masks]}
        for name, loss_fn in losses.items():
            logprobs = logprob_loss.token_logprobs(training_client, datums)  # the weights do not change here
            future, loss, _ = logprob_loss.forward_backward(training_client, datums, loss_fn)
            answer = future.result()
            result[name] = {
                "loss": loss,
                "logprobs": [lp.tolist() for lp in logprobs],
                "weights": sent[-1],
                "service_loss_sum": answer.metrics["loss:sum"],
            }
        return result
    finally:
        training_client.stop()


if __name__ == "__main__":
    scenario, arguments = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(globals()[scenario](**arguments)))
