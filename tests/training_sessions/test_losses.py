"""The engine's four losses and their LoRA gradients equal the formulas, and equal grpo.py's loss.

In-process (no endpoint): the engine is what the endpoint runs. The reference side computes every
datum unpadded, one at a time, from the formulas written out here, so micro-batching, padding and
the loss code of the engine are all under test. Weights are random (LoRA B non-zero), datums have
different lengths and the sampler's logprobs are far enough from the policy's that clipping bites.
"""

import grpo
import pytest
import torch

from helpers.local_mode.sessions import engine as engine_module
from helpers.tiny_model import tiny_model_dir

RTOL = 1e-5


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    built = engine_module.Engine(str(tiny_model_dir()), rank=4, alpha=8)
    with torch.no_grad():
        for _, param in built.named_trainable:
            param.normal_(0.0, 0.05)  # LoRA B starts at zero: make the adapter do something
    return built


def wire(values, dtype="float32"):
    return {"data": list(values), "dtype": dtype, "shape": [len(values)]}


def make_datums(engine, loss_fn, lengths=(5, 11, 8, 16), seed=1):
    """Datums as the wire carries them, and the same data as tensors for the reference."""
    generator = torch.Generator().manual_seed(seed)
    vocab = engine.model.config.vocab_size
    datums, reference = [], []
    for length in lengths:
        tokens = torch.randint(3, vocab, (length + 1,), generator=generator)
        inputs = {"target_tokens": tokens[1:],
                  "weights": torch.rand(length, generator=generator) * (torch.arange(length) >= 2)}  # prompt: 0
        if loss_fn != "cross_entropy":
            with torch.no_grad():
                policy = reference_logprobs(engine, tokens[:-1].tolist(), tokens[1:])
            inputs["logprobs"] = policy + 0.6 * torch.randn(length, generator=generator)  # ratios well off 1
            inputs["advantages"] = torch.randn(length, generator=generator)
        datums.append({"modelInput": {"chunks": [{"tokens": tokens[:-1].tolist()}]},
                       "lossFnInputs": {name: wire(value.tolist(), "int64" if name == "target_tokens" else "float32")
                                        for name, value in inputs.items()}})
        reference.append((tokens[:-1].tolist(), inputs))
    return datums, reference


def reference_logprobs(engine, tokens, targets):
    logits = engine.model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def formula(loss_fn, logp, inputs, low, high):
    w = inputs["weights"]
    if loss_fn == "cross_entropy":
        return -(w * logp).sum()
    ratio = torch.exp(logp - inputs["logprobs"])
    a = inputs["advantages"]
    if loss_fn == "importance_sampling":
        return -(w * ratio * a).sum()
    if loss_fn == "ppo":
        return -(w * torch.minimum(ratio * a, torch.clamp(ratio, low, high) * a)).sum()
    return -(w * torch.clamp(ratio, low, high).detach() * logp * a).sum()  # cispo


def engine_grads(engine, loss_fn, datums, config):
    engine.optimizer.zero_grad(set_to_none=True)
    result, _ = engine.forward_backward(loss_fn, datums, config, backward=True)
    grads = {n: p.grad.clone() for n, p in engine.named_trainable}
    engine.optimizer.zero_grad(set_to_none=True)
    return result, grads


def assert_grads_close(actual, expected):
    for name, grad in expected.items():
        scale = grad.abs().max().item()
        assert scale > 0, f"{name}: reference gradient is zero, the check would prove nothing"
        torch.testing.assert_close(actual[name], grad, rtol=RTOL, atol=RTOL * scale, msg=name)


@pytest.mark.parametrize("loss_fn,config", [
    ("cross_entropy", {}),
    ("importance_sampling", {}),
    ("ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    ("cispo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5}),
])
def test_loss_value_and_gradient_equal_the_formula(engine, loss_fn, config, monkeypatch, one_thread):
    monkeypatch.setattr(engine_module, "MICRO_BATCH", 3)  # 4 datums: two padded micro-batches
    datums, reference = make_datums(engine, loss_fn)
    low, high = config.get("clip_low_threshold"), config.get("clip_high_threshold")
    result, grads = engine_grads(engine, loss_fn, datums, config)

    total, clipped = torch.zeros(()), 0
    for (tokens, inputs), output in zip(reference, result["lossFnOutputs"], strict=True):
        logp = reference_logprobs(engine, tokens, inputs["target_tokens"])
        loss = formula(loss_fn, logp, inputs, low, high)
        total = total + loss
        torch.testing.assert_close(torch.tensor(output["logprobs"]["data"]), logp.detach(), rtol=RTOL, atol=1e-6)
        torch.testing.assert_close(output["loss"]["data"][0], loss.item(), rtol=RTOL, atol=1e-6)
        if low is not None:
            ratio = torch.exp(logp - inputs["logprobs"])
            clipped += int(((ratio < low) | (ratio > high)).sum())
    if low is not None:
        assert clipped > 0, "no ratio fell outside the clip range: clipping was not exercised"
    torch.testing.assert_close(result["metrics"]["loss:sum"], total.item(), rtol=RTOL, atol=1e-6)
    reference_params = [p for _, p in engine.named_trainable]
    expected = dict(zip([n for n, _ in engine.named_trainable],
                        torch.autograd.grad(total, reference_params), strict=True))
    assert_grads_close(grads, expected)


def test_gradients_accumulate_until_optim_step(engine, one_thread):
    datums, _ = make_datums(engine, "cross_entropy")
    engine.optimizer.zero_grad(set_to_none=True)
    engine.forward_backward("cross_entropy", datums[:2], {}, backward=True)
    engine.forward_backward("cross_entropy", datums[2:], {}, backward=True)
    accumulated = {n: p.grad.clone() for n, p in engine.named_trainable}
    _, together = engine_grads(engine, "cross_entropy", datums, {})
    assert_grads_close(accumulated, together)


@pytest.mark.parametrize("loss_fn", ["ppo", "importance_sampling"])
def test_session_gradient_equals_grpo_scripts_loss(engine, loss_fn, one_thread):
    """The same rollouts through forward_backward and through grpo.py's grpo_loss (dapo aggregation:
    a sum over the update's tokens divided by their count) give the same LoRA gradient."""
    generator = torch.Generator().manual_seed(5)
    vocab = engine.model.config.vocab_size
    prompt_len, completion_len, lengths = 6, 7, [7, 3, 5, 7]  # completions that ended at different tokens
    rows = torch.randint(3, vocab, (len(lengths), prompt_len + completion_len), generator=generator)
    mask = torch.tensor([[1.0] * n + [0.0] * (completion_len - n) for n in lengths])
    advantages = torch.randn(len(lengths), generator=generator)
    epsilon, epsilon_high = (0.2, 0.28) if loss_fn == "ppo" else (1.0, 1e9)  # importance_sampling: no clip
    with torch.no_grad():
        current = grpo.completion_logprobs(engine.model, rows, torch.ones_like(rows), completion_len, 1.0)
    old = current + 0.4 * torch.randn(current.shape, generator=generator)

    loss, _ = grpo.grpo_loss(grpo.completion_logprobs(engine.model, rows, torch.ones_like(rows), completion_len, 1.0),
                             old, None, advantages, mask, loss_type="dapo", epsilon=epsilon,
                             epsilon_high=epsilon_high, beta=0.0, max_new_tokens=completion_len, num_micro_batches=1,
                             tokens_per_learner=float(mask.sum()))
    names = [n for n, _ in engine.named_trainable]
    expected = dict(zip(names, torch.autograd.grad(loss, [p for _, p in engine.named_trainable]), strict=True))

    datums = []
    for row, n, sampler, advantage in zip(rows.tolist(), lengths, old, advantages, strict=True):
        tokens = row[: prompt_len + n]
        width = len(tokens) - 1
        completion = [0.0] * (prompt_len - 1) + [1.0] * n  # position i predicts token i + 1
        datums.append({"modelInput": {"chunks": [{"tokens": tokens[:-1]}]}, "lossFnInputs": {
            "target_tokens": wire(tokens[1:], "int64"), "weights": wire(completion),
            "logprobs": wire([0.0] * (prompt_len - 1) + sampler[:n].tolist()),
            "advantages": wire([0.0] * (prompt_len - 1) + [float(advantage)] * n)}})
        assert len(completion) == width
    config = {"clip_low_threshold": 1 - epsilon, "clip_high_threshold": 1 + epsilon_high} if loss_fn == "ppo" else {}
    _, grads = engine_grads(engine, loss_fn, datums, config)
    tokens = float(mask.sum())
    assert_grads_close({n: g / tokens for n, g in grads.items()}, expected)  # the loop owns normalisation


def test_bad_datums_are_refused_with_the_fix(engine):
    good, _ = make_datums(engine, "ppo", lengths=(4,))
    short = {**good[0], "lossFnInputs": {**good[0]["lossFnInputs"], "weights": wire([1.0, 1.0])}}
    with pytest.raises(engine_module.InputError, match=r"weights'\] has 2 values but modelInput has 4 tokens"):
        engine_module.parse_datums([short], "ppo")
    odd = {**good[0], "lossFnInputs": {**good[0]["lossFnInputs"], "weights": wire([1.0] * 4, "float8")}}
    with pytest.raises(engine_module.InputError, match="dtype 'float8': use one of float32"):
        engine_module.parse_datums([odd], "ppo")
    lacking = {**good[0], "lossFnInputs": {k: v for k, v in good[0]["lossFnInputs"].items() if k != "advantages"}}
    with pytest.raises(engine_module.InputError, match="lacks advantages, which ppo needs"):
        engine_module.parse_datums([lacking], "ppo")
    with pytest.raises(engine_module.InputError, match=r"clip_high_threshold=20 is out of range"):
        engine_module.check_loss_config("ppo", {"clip_high_threshold": 20})
