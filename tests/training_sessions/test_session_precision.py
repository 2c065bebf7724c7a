"""The sessions' compute precision (SAGEMAKER_LOCAL_SESSION_PRECISION): fp32 by default, exact; bf16
computes the forward passes and the samplers in bfloat16 while the adapter and its optimizer stay
fp32; a value it does not know is refused before an endpoint starts."""

import pytest
import torch

from helpers.local_mode import sessions
from helpers.local_mode.sessions import engine as engine_module

from .test_session_losses import make_datums

PROMPT = [5, 6, 7, 8, 9]
SEEDED = {"maxTokens": 16, "temperature": 1.0, "seed": 3}


def trained_looking(engine):
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for _, param in engine.named_trainable:
            param.copy_(torch.randn(param.shape, generator=generator) * 0.05)  # B is zero at initialisation
    return engine


@pytest.fixture(scope="module")
def engines(tiny_model_path):
    return {
        precision: trained_looking(engine_module.Engine(str(tiny_model_path), rank=4, alpha=8, precision=precision))
        for precision in ("fp32", "bf16")
    }


def test_the_default_is_exact_fp32(monkeypatch, tiny_model_path):
    monkeypatch.delenv(sessions.PRECISION_VARIABLE, raising=False)
    assert sessions.configured_precision() == "fp32"
    monkeypatch.setenv(sessions.PRECISION_VARIABLE, "bf16")
    assert engine_module.Engine(str(tiny_model_path), rank=4, alpha=8).precision == "bf16"


def test_bf16_forward_is_close_to_fp32_but_not_equal(engines, one_thread):
    tokens = list(range(3, 40))
    exact = torch.tensor(engines["fp32"].compute_logprobs(tokens)[1:])
    bf16 = torch.tensor(engines["bf16"].compute_logprobs(tokens)[1:])
    assert not torch.equal(exact, bf16)  # the products ran in bfloat16
    assert (exact - bf16).abs().max() < 0.1, (exact - bf16).abs().max()


def test_bf16_trains_fp32_weights_in_the_direction_fp32_does(engines, one_thread):
    steps = {}
    for precision, engine in engines.items():
        before = [p.detach().clone() for _, p in engine.named_trainable]
        engine.forward_backward("cross_entropy", make_datums(engine, "cross_entropy"), {}, backward=True)
        assert all(p.grad.dtype == torch.float32 for _, p in engine.named_trainable)
        engine.optim_step({"learningRate": 1e-3})
        assert all(p.dtype == torch.float32 for _, p in engine.named_trainable)
        steps[precision] = torch.cat(
            [(p.detach() - b).reshape(-1) for (_, p), b in zip(engine.named_trainable, before, strict=True)]
        )
    cosine = torch.nn.functional.cosine_similarity(steps["fp32"], steps["bf16"], dim=0)
    assert cosine > 0.9, cosine


def test_bf16_samples_a_saved_adapter_from_a_bf16_copy_and_seeded_samples_repeat(engines, one_thread):
    engine = engines["bf16"]
    saved = {name.replace(".default", ""): p.detach().clone() for name, p in engine.named_trainable}  # as saved
    first = engine.sample(PROMPT, 3, SEEDED, adapter=saved)
    assert next(engine.merged_sampler[1].parameters()).dtype == torch.bfloat16
    assert next(engine.model.parameters()).dtype == torch.float32  # the session's own model is untouched
    again = engine.sample(PROMPT, 3, SEEDED, adapter=saved)
    assert [s["tokens"] for s in first] == [s["tokens"] for s in again]
    assert all(len(s["tokens"]) == len(s["logprobs"]) > 0 for s in first)


def test_an_unknown_precision_is_refused_before_an_endpoint_starts(monkeypatch, tmp_path):
    monkeypatch.setenv(sessions.PRECISION_VARIABLE, "fp8")
    with pytest.raises(ValueError, match="SAGEMAKER_LOCAL_SESSION_PRECISION='fp8': use fp32 .* or bf16"):
        sessions.start_service(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written
