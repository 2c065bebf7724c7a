"""The sessions' compute precision (SAGEMAKER_LOCAL_SESSION_PRECISION): fp32 by default, exact; bf16
computes forward and forward_backward in bfloat16 while the adapter, its gradients and its optimizer
stay fp32, and sampling stays exact fp32; a value it does not know is refused before an endpoint
starts."""

import pytest
import torch

from local_mode import session_service
from local_mode.session_service import engine as engine_module

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
    monkeypatch.delenv(session_service.PRECISION_VARIABLE, raising=False)
    assert session_service.configured_precision() == "fp32"
    monkeypatch.setenv(session_service.PRECISION_VARIABLE, "bf16")
    assert engine_module.Engine(str(tiny_model_path), rank=4, alpha=8).precision == "bf16"


def forward_logprobs(engine) -> torch.Tensor:
    output, _ = engine.forward_backward("cross_entropy", make_datums(engine, "cross_entropy"), {}, backward=False)
    return torch.cat([torch.tensor(datum["logprobs"]["data"]) for datum in output["lossFnOutputs"]])


def test_bf16_forward_is_close_to_fp32_but_not_equal(engines, one_thread):
    exact, bf16 = forward_logprobs(engines["fp32"]), forward_logprobs(engines["bf16"])
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


def test_sampling_and_compute_logprobs_stay_exact_fp32_in_bf16(tiny_model_path, one_thread):
    """Fresh engines with the same adapter: bf16 samples the same seeded tokens as fp32, with the same
    log-probs, and scores a sequence the same (a seeded request's samples must not depend on the
    requests beside it in a pass, which bf16's products would make them)."""
    fp32, bf16 = (
        trained_looking(engine_module.Engine(str(tiny_model_path), rank=4, alpha=8, precision=precision))
        for precision in ("fp32", "bf16")
    )
    saved = {name.replace(".default", ""): p.detach().clone() for name, p in bf16.named_trainable}  # as saved
    assert bf16.sample(PROMPT, 3, SEEDED, adapter=saved) == fp32.sample(PROMPT, 3, SEEDED, adapter=saved)
    assert bf16.sample(PROMPT, 2, SEEDED) == fp32.sample(PROMPT, 2, SEEDED)  # the session's own adapter
    tokens = list(range(3, 40))
    assert bf16.compute_logprobs(tokens) == fp32.compute_logprobs(tokens)


def test_an_unknown_precision_is_refused_before_an_endpoint_starts(monkeypatch, tmp_path):
    monkeypatch.setenv(session_service.PRECISION_VARIABLE, "fp8")
    with pytest.raises(ValueError, match="SAGEMAKER_LOCAL_SESSION_PRECISION='fp8': use fp32 .* or bf16"):
        session_service.start_service(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written
