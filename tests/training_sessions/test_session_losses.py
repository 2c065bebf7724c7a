"""The session engine's losses against their formulas, and against scripts/grpo.py's loss.

In-process on the engine the endpoint runs (the SDK cannot report a gradient, only its effect):
random LoRA weights (B is zero at initialisation, which would hide half the gradient), several
datums of different lengths, non-trivial weights, sampler log-probs far enough from the model's
that clipping is active. Values and gradients must match to 1e-5 relative.
"""

import copy
import random

import grpo
import pytest
import torch
from common.data import pad_rows

from local_mode.session_service import engine as engine_module

from .conftest import trained_looking_engine

RELATIVE = 1e-5


@pytest.fixture(scope="module")
def session_engine(tiny_model_path):
    return trained_looking_engine(tiny_model_path, seed=1)


def wire(values, dtype="float32"):
    return {"data": list(values), "dtype": dtype, "shape": [len(values)]}


def make_datums(engine, loss_fn, seed=0, lengths=(5, 9, 14)):
    rng = random.Random(seed)
    vocab = engine.model.config.vocab_size
    datums = []
    for length in lengths:
        tokens = [rng.randrange(vocab) for _ in range(length + 1)]
        inputs = {
            "target_tokens": wire(tokens[1:], "int64"),
            "weights": wire([rng.choice([0.0, 0.5, 1.0, 2.0]) for _ in range(length)]),
        }
        if loss_fn != "cross_entropy":
            inputs["advantages"] = wire([rng.uniform(-2, 2) for _ in range(length)])
        datums.append(
            {
                "modelInput": {"chunks": [{"tokens": tokens[:-1], "type": "encoded_text"}]},
                "lossFnInputs": inputs,
            }
        )
    if loss_fn != "cross_entropy":  # sampler log-probs: the model's own, moved by up to +-0.5
        for datum, current in zip(datums, reference_logprobs(engine, datums), strict=True):
            noise = [rng.uniform(-0.5, 0.5) for _ in range(current.numel())]
            datum["lossFnInputs"]["logprobs"] = wire((current.detach() + torch.tensor(noise)).tolist())
    return datums


def reference_logprobs(engine, datums):
    """log p(target_i | tokens[:i+1]) datum by datum, no padding: position i predicts target i."""
    out = []
    for datum in datums:
        tokens = datum["modelInput"]["chunks"][0]["tokens"]
        targets = torch.tensor(datum["lossFnInputs"]["target_tokens"]["data"])
        logits = engine.model(input_ids=torch.tensor([tokens])).logits[0].float()
        out.append(torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1))
    return out


def formula(loss_fn, logprobs, inputs, low, high):
    """The loss as the docs write it, term by term."""
    w = torch.tensor(inputs["weights"]["data"])
    if loss_fn == "cross_entropy":
        return -(w * logprobs).sum()
    a = torch.tensor(inputs["advantages"]["data"])
    ratio = torch.exp(logprobs - torch.tensor(inputs["logprobs"]["data"]))
    if loss_fn == "importance_sampling":
        return -(w * ratio * a).sum()
    if loss_fn == "ppo":
        return -(w * torch.minimum(ratio * a, torch.clamp(ratio, low, high) * a)).sum()
    return -(w * torch.clamp(ratio, low, high).detach() * logprobs * a).sum()


def gradients(engine):
    return torch.cat([p.grad.reshape(-1) for _, p in engine.named_trainable])


def relative(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize(
    "loss_fn, config",
    [
        ("cross_entropy", {}),
        ("importance_sampling", {}),
        ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
        ("cispo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.2}),
    ],
)
def test_loss_value_and_gradient_match_the_formula(session_engine, loss_fn, config, one_thread):
    engine = session_engine
    datums = make_datums(engine, loss_fn)
    engine.optimizer.zero_grad(set_to_none=True)
    result, tokens = engine.forward_backward(loss_fn, datums, config, backward=True)
    got_grad = gradients(engine).clone()
    engine.optimizer.zero_grad(set_to_none=True)

    low = config.get("clip_low_threshold", 0.8 if loss_fn == "ppo" else 0.0)
    high = config.get("clip_high_threshold", 1.2 if loss_fn == "ppo" else 4.0)
    logprobs = reference_logprobs(engine, datums)
    per_datum = [formula(loss_fn, lp, d["lossFnInputs"], low, high) for lp, d in zip(logprobs, datums, strict=True)]
    expected = torch.stack(per_datum).sum()
    expected.backward()
    want_grad = gradients(engine).clone()
    engine.optimizer.zero_grad(set_to_none=True)

    assert tokens == sum(len(d["modelInput"]["chunks"][0]["tokens"]) for d in datums)
    assert abs(result["metrics"]["loss:sum"] - expected.item()) <= RELATIVE * abs(expected.item())
    for output, lp, value in zip(result["lossFnOutputs"], logprobs, per_datum, strict=True):
        assert torch.allclose(torch.tensor(output["logprobs"]["data"]), lp.detach(), rtol=RELATIVE, atol=1e-6)
        assert abs(output["loss"]["data"][0] - value.item()) <= RELATIVE * abs(value.item()) + 1e-6
    assert relative(got_grad, want_grad) < RELATIVE
    if loss_fn in ("ppo", "cispo"):  # the thresholds bite on some tokens, so clipping is exercised
        ratio = torch.cat(
            [
                torch.exp(lp.detach() - torch.tensor(d["lossFnInputs"]["logprobs"]["data"]))
                for lp, d in zip(logprobs, datums, strict=True)
            ]
        )
        assert ((ratio < low) | (ratio > high)).float().mean() > 0.2


def test_gradients_accumulate_until_optim_step(session_engine, one_thread):
    engine = session_engine
    first, second = make_datums(engine, "cross_entropy", seed=1), make_datums(engine, "cross_entropy", seed=2)
    engine.optimizer.zero_grad(set_to_none=True)
    engine.forward_backward("cross_entropy", first + second, {}, backward=True)
    together = gradients(engine).clone()
    engine.optimizer.zero_grad(set_to_none=True)
    engine.forward_backward("cross_entropy", first, {}, backward=True)
    engine.forward_backward("cross_entropy", second, {}, backward=True)
    assert relative(gradients(engine), together) < RELATIVE
    engine.optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("loss_fn, epsilon", [("importance_sampling", None), ("ppo", 0.1)])
def test_session_gradient_equals_grpo_script_gradient(session_engine, loss_fn, epsilon, one_thread):
    """The same rollouts give the same LoRA gradient through forward_backward as through grpo.py's
    loss (dapo aggregation: token sum over the update's tokens) on a model with the same adapter."""
    engine = session_engine
    rng = random.Random(3)
    vocab = engine.model.config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in (4, 7, 5)]
    completions = [[rng.randrange(vocab) for _ in range(n)] for n in (6, 3, 8)]
    rewards = torch.tensor([1.0, 0.0, 0.5])
    advantages = rewards - rewards.mean()

    # grpo.py's side: prompts padded left, completions right, its log-probs and loss.
    script_model = copy.deepcopy(engine.model)
    prompt_ids, prompt_mask = pad_rows(prompts, 0, left=True, device="cpu")
    completion_ids, completion_mask = pad_rows(completions, 0, left=False, device="cpu")
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    mask = completion_mask.float()
    logprobs = grpo.completion_logprobs(script_model, input_ids, attention_mask, completion_ids.size(1), 1.0)
    noise = torch.tensor([[rng.uniform(-0.3, 0.3) for _ in range(completion_ids.size(1))] for _ in completions])
    old = logprobs.detach() + (noise if epsilon is not None else 0.0)
    tokens = float(mask.sum())
    loss, _ = grpo.grpo_loss(
        logprobs,
        old,
        None,
        advantages,
        mask,
        loss_type="dapo",
        epsilon=epsilon or 0.2,
        epsilon_high=epsilon or 0.2,
        beta=0.0,
        max_new_tokens=8,
        num_micro_batches=1,
        tokens_per_learner=tokens,
    )
    loss.backward()
    script_grad = torch.cat([p.grad.reshape(-1) for n, p in script_model.named_parameters() if p.requires_grad])

    # The session's side: one datum per rollout, weights on completion tokens, A / tokens per token.
    datums = []
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        ids = prompt + completion
        n_prompt = len(prompt) - 1
        sampler = old[row, : len(completion)].tolist()
        datums.append(
            {
                "modelInput": {"chunks": [{"tokens": ids[:-1], "type": "encoded_text"}]},
                "lossFnInputs": {
                    "target_tokens": wire(ids[1:], "int64"),
                    "weights": wire([0.0] * n_prompt + [1.0] * len(completion)),
                    "logprobs": wire([0.0] * n_prompt + sampler),
                    "advantages": wire([0.0] * n_prompt + [advantages[row].item() / tokens] * len(completion)),
                },
            }
        )
    config = {} if epsilon is None else {"clip_low_threshold": 1 - epsilon, "clip_high_threshold": 1 + epsilon}
    engine.optimizer.zero_grad(set_to_none=True)
    result, _ = engine.forward_backward(loss_fn, datums, config, backward=True)
    session_grad = gradients(engine).clone()
    engine.optimizer.zero_grad(set_to_none=True)

    assert abs(result["metrics"]["loss:sum"] - loss.item()) <= 1e-5 * abs(loss.item()) + 1e-7
    assert relative(session_grad, script_grad) < RELATIVE
    if epsilon is not None:
        ratio = torch.exp(logprobs.detach() - old)[mask.bool()]
        assert ((ratio < 1 - epsilon) | (ratio > 1 + epsilon)).any()


def test_bad_datums_are_refused_with_the_fix(session_engine):
    engine = session_engine
    good = make_datums(engine, "cross_entropy", lengths=(4,))[0]
    short = copy.deepcopy(good)
    short["lossFnInputs"]["weights"] = wire([1.0, 1.0])
    with pytest.raises(engine_module.InputError, match=r"weights'\] has 2 values but modelInput has 4 tokens"):
        engine_module.parse_datums([good, short], "cross_entropy")
    odd = copy.deepcopy(good)
    odd["lossFnInputs"]["weights"]["dtype"] = "float8"
    with pytest.raises(engine_module.InputError, match=r"dtype 'float8': use one of float32"):
        engine_module.parse_datums([odd], "cross_entropy")
    with pytest.raises(engine_module.InputError, match=r"lacks logprobs, advantages, which ppo needs"):
        engine_module.parse_datums([good], "ppo")
    with pytest.raises(engine_module.InputError, match=r"clip_high_threshold=20 is out of range"):
        engine_module.check_loss_config("ppo", {"clip_high_threshold": 20})
    with pytest.raises(engine_module.InputError, match=r"'epsilon' is not supported"):
        engine_module.check_loss_config("ppo", {"epsilon": 0.2})


def test_micro_batches_keep_the_order_and_bound_the_datums_and_padded_tokens_of_a_pass():
    engine = engine_module
    lengths = [10, 600, 30, 4096, 5000, 7, 7, 7, 900, 900, 900, 900, 900] + [3] * 40
    parsed = [([0] * n, {"i": i}) for i, n in enumerate(lengths)]
    batches = engine.micro_batches(parsed)
    assert [item for batch in batches for item in batch] == parsed  # every datum once, in order
    for batch in batches:
        width = max(len(tokens) for tokens, _ in batch)
        assert len(batch) <= engine.MICRO_BATCH
        assert len(batch) == 1 or width * len(batch) <= engine.MICRO_BATCH_TOKENS
    assert [len(b) for b in batches if len(b[0][0]) == 5000] == [1]  # longer than the budget: alone
    assert max(len(b) for b in batches) == engine.MICRO_BATCH  # short datums still share a pass


def test_passes_of_like_length_answer_each_datum_in_its_place(session_engine, one_thread, monkeypatch):
    """forward_backward runs datums in passes sorted by length (little padding) and answers in the
    order they were sent: each output is its own datum's, and the gradient is the sum of theirs."""
    engine = session_engine
    monkeypatch.setattr(engine_module, "MICRO_BATCH", 2)  # five datums, three passes
    widths = []
    real_logprobs = engine._logprobs
    monkeypatch.setattr(
        engine, "_logprobs", lambda rows, targets: widths.append(max(map(len, rows))) or real_logprobs(rows, targets)
    )
    datums = make_datums(engine, "cross_entropy", seed=4, lengths=(14, 3, 9, 15, 4))
    engine.optimizer.zero_grad(set_to_none=True)
    result, _ = engine.forward_backward("cross_entropy", datums, {}, backward=True)
    got_grad = gradients(engine).clone()
    engine.optimizer.zero_grad(set_to_none=True)
    assert widths == [4, 14, 15]  # (3, 4), (9, 14), (15): by length, not (14, 3), (9, 15), (4)
    logprobs = reference_logprobs(engine, datums)
    per_datum = [formula("cross_entropy", lp, d["lossFnInputs"], 0, 0) for lp, d in zip(logprobs, datums, strict=True)]
    torch.stack(per_datum).sum().backward()
    want_grad = gradients(engine).clone()
    engine.optimizer.zero_grad(set_to_none=True)
    for output, lp, value in zip(result["lossFnOutputs"], logprobs, per_datum, strict=True):
        assert len(output["logprobs"]["data"]) == lp.numel()
        assert torch.allclose(torch.tensor(output["logprobs"]["data"]), lp.detach(), rtol=RELATIVE, atol=1e-6)
        assert abs(output["loss"]["data"][0] - value.item()) <= RELATIVE * abs(value.item()) + 1e-6
    assert relative(got_grad, want_grad) < RELATIVE
