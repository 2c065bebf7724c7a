"""A loss the service does not have, trained exactly through ``cross_entropy`` with weights ``-dL/dlogp``
(``helpers/training_sessions/logprob_loss.py``).

1. DPO, two ways from the same model, LoRA initialisation and pairs: two steps on a session through the
   technique (the real SDK, ``custom_loss_scenarios.py``), and two steps of ``scripts/dpo.py``'s own
   pipeline (``tokenize_pair``, ``collate_pairs``, ``completion_logps``, ``dpo_loss``) on a peft model
   built in this process as the local service builds its sessions' (``engine.py``: LoRA on every linear
   layer, dropout 0, initialised after ``torch.manual_seed(0)``; AdamW with the step's settings). The
   adapters must end equal.
2. Two losses with closed-form gradients: the weights the helper sends are ``-dL/dlogp`` as written by hand.
"""

from __future__ import annotations

from pathlib import Path

import dpo
import pytest
import torch
from common.preferences import dpo_loss

from local_mode.offline_data import preference_records

SCENARIOS = Path(__file__).with_name("custom_loss_scenarios.py")
RANK, ALPHA, BETA, MAX_PROMPT, MAX_LENGTH = 4, 8, 0.1, 64, 128
# Adam's first step is lr * g / (|g| + eps): with the usual eps (1e-8) that is lr * sign(g), blind to a
# gradient off by a factor (and Adam is blind to a common factor at every later step too). eps at the API's
# maximum, 0.01, is above most |g| here (measured: max 0.015, 95 % below 1e-3), so the update follows g
# itself and equal updates mean equal gradients, element by element. The optimizer step also reports the
# gradient's norm, compared as well. The notebooks' settings (eps 1e-8, clipped to norm 1) are the second case.
EPS_ADAM = {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 0.01, "weight_decay": 0.0}
NOTEBOOK_ADAM = {
    "learning_rate": 1e-3,
    "beta1": 0.9,
    "beta2": 0.999,
    "eps": 1e-8,
    "weight_decay": 0.0,
    "grad_clip_norm": 1.0,
}


def lora_model(tiny_model_path):
    """The local service's session model, built here with peft as ``engine.Engine`` builds it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    torch.manual_seed(0)  # the service's seed for a new adapter
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules="all-linear", lora_dropout=0.0, bias="none")
    model = get_peft_model(base, config)
    model.eval()
    return model


def dpo_script_steps(tiny_model_path, rows, steps: int, adam: dict) -> tuple[dict, dict, list[float], list[float]]:
    """``steps`` steps of dpo.py's loss on all pairs; (adapter before, adapter after, losses, gradient norms)."""
    from peft import get_peft_model_state_dict
    from transformers import AutoTokenizer

    model = lora_model(tiny_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    examples = [dpo.tokenize_pair(tokenizer, row, MAX_PROMPT, MAX_LENGTH) for row in rows]
    batch = dpo.collate_pairs(examples, tokenizer.pad_token_id, torch.device("cpu"))

    def pair_logps():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return dpo.completion_logps(logits, batch["input_ids"], batch["completion_mask"]).chunk(2)

    with torch.no_grad():
        ref_chosen, ref_rejected = pair_logps()  # the starting model is the reference, as in dpo.py
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=adam["learning_rate"], betas=(adam["beta1"], adam["beta2"]), eps=adam["eps"],
        weight_decay=adam["weight_decay"],
    )  # fmt: skip
    before = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    losses, grad_norms = [], []
    for _ in range(steps):
        chosen, rejected = pair_logps()
        loss = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, BETA)[0].mean()  # dpo.py: mean over pairs
        loss.backward()
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, adam.get("grad_clip_norm") or float("inf"))))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    after = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    return before, after, losses, grad_norms


def flat(state: dict) -> torch.Tensor:
    return torch.cat([state[k].reshape(-1).double() for k in sorted(state)])


def test_the_session_imports_the_jobs_dpo_loss():
    from helpers.training_sessions import dpo as session_dpo

    assert dpo.dpo_loss is dpo_loss and session_dpo.dpo_loss is dpo_loss


# Measured: the updates differ by 4.6e-6 (eps 0.01) and 4.5e-5 (eps 1e-8, where float noise in a tiny gradient
# element becomes a whole lr * sign step) relative to their norm.
@pytest.mark.parametrize(
    "adam, tolerance",
    [
        pytest.param(EPS_ADAM, 1e-4, id="adam-eps-0.01"),
        pytest.param(NOTEBOOK_ADAM, 1e-3, id="notebook-adam", marks=pytest.mark.slow),  # the same proof, blunter
    ],
)
def test_dpo_through_cross_entropy_weights_updates_as_dpo_py(
    sdk, tiny_model_path, tmp_path, adam, tolerance, one_thread
):
    from safetensors.torch import load_file

    rows = preference_records(6, seed=5)
    steps = 2  # the second step runs where the rewards are no longer 0 and LoRA's B is no longer 0
    session = sdk(
        "dpo_steps",
        script=SCENARIOS,
        rows=rows,
        rank=RANK,
        alpha=ALPHA,
        beta=BETA,
        steps=steps,
        adam=adam,
        max_prompt_length=MAX_PROMPT,
        max_length=MAX_LENGTH,
        out=str(tmp_path / "session_adapter.safetensors"),
    )
    before, after, losses, grad_norms = dpo_script_steps(tiny_model_path, rows, steps, adam)
    session_after = load_file(session["adapter"])
    assert sorted(session_after) == sorted(after), "the session's adapter has other tensors than peft's"

    # The same loss at each step: at step 1 log 2 (policy = reference), then what the first update did.
    assert session["losses"][0] == pytest.approx(0.6931471805599453, abs=1e-6)
    assert session["losses"] == pytest.approx(losses, rel=1e-5)
    assert losses[1] < losses[0] - 1e-3  # the first step moved the model
    assert session["grad_norms"] == pytest.approx(grad_norms, rel=1e-5)
    update_session, update_script = flat(session_after) - flat(before), flat(after) - flat(before)
    assert update_script.norm() > 0
    relative = float((update_session - update_script).norm() / update_script.norm())
    assert relative < tolerance, relative


def test_the_weights_sent_are_minus_the_closed_form_gradient(sdk):
    texts = ["The cat sat on the mat.", "Numbers: 1 2 3 4 5 6 7.", "Hello there, how are you today?"]
    result = sdk("closed_form", script=SCENARIOS, texts=texts, seed=3)
    masks = [torch.tensor(m, dtype=torch.float64) for m in result["masks"]]
    assert all(m[:2].sum() == 0 and m[2:].sum() > 0 for m in masks)  # prompt weight 0, answer 1

    linear = result["linear"]
    for sent, c, m in zip(linear["weights"], result["c"], masks, strict=True):
        assert torch.allclose(torch.tensor(sent, dtype=torch.float64), -torch.tensor(c) * m, atol=1e-6)
    # For a linear loss the service's cross-entropy, -sum(w * logp) = sum(c * m * logp), is L itself.
    assert linear["service_loss_sum"] == pytest.approx(linear["loss"], rel=1e-5)

    squared = result["squared"]
    for sent, lp, y, m in zip(squared["weights"], squared["logprobs"], result["y"], masks, strict=True):
        expected = m * (torch.tensor(y) - torch.tensor(lp))
        assert torch.allclose(torch.tensor(sent, dtype=torch.float64), expected, atol=1e-5)
        assert expected.abs().max() > 0.1  # far from the minimum: the gradient is not trivially small
    manual = sum(
        0.5 * (m * (torch.tensor(lp) - torch.tensor(y)) ** 2).sum()
        for lp, y, m in zip(squared["logprobs"], result["y"], masks, strict=True)
    )
    assert squared["loss"] == pytest.approx(float(manual), rel=1e-6)
