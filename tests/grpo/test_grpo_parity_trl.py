"""Our GRPO maths against TRL 1.16's own code on identical inputs (CPU, fp32).

TRL's ``GRPOTrainer`` is built on the tiny model and its real ``_compute_loss`` and
``_generate_and_score_completions`` are called; nothing of TRL is re-implemented here.
"""

import pytest
import torch
from common.advantages import group_advantages
from grpo import completion_logprobs, grpo_loss

MAX_COMPLETION = 6
TEMPERATURE = 0.7


def make_trainer(model_path, tmp_path, reward_func=None, **config):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        **config,
    )
    reward_func = reward_func or (lambda completions, **kwargs: [0.0] * len(completions))
    return GRPOTrainer(
        model=str(model_path),
        reward_funcs=reward_func,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["hello"] * 8}),
    )


def prepared_batch(model):
    """Left-padded prompts, right-padded completions of different lengths, stale old log-probs
    (so ratios leave the clip range both ways), a different reference model and random advantages."""
    generator = torch.Generator().manual_seed(0)
    batch_size, prompt_length = 4, 5
    vocab = model.config.vocab_size
    prompt_ids = torch.randint(3, vocab, (batch_size, prompt_length), generator=generator)
    prompt_mask = torch.ones(batch_size, prompt_length, dtype=torch.long)
    prompt_mask[0, :2] = 0
    prompt_mask[2, :1] = 0
    completion_ids = torch.randint(3, vocab, (batch_size, MAX_COMPLETION), generator=generator)
    completion_mask = torch.ones(batch_size, MAX_COMPLETION, dtype=torch.long)
    completion_mask[1, 3:] = 0
    completion_mask[3, 5:] = 0
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention_mask = torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        current = completion_logprobs(model, input_ids, attention_mask, MAX_COMPLETION, TEMPERATURE)
    old = current + 0.3 * torch.randn(current.shape, generator=generator)
    ref = current + 0.5 * torch.randn(current.shape, generator=generator)
    advantages = torch.tensor([1.2, -0.7, 0.4, -1.5])
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": completion_mask.sum().float(),
    }


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_and_gradients_match_trl(tiny_model_path, tmp_path, loss_type, beta):
    # Two accumulation steps, so the scaling for gradient accumulation is compared too.
    trainer = make_trainer(
        tiny_model_path,
        tmp_path,
        loss_type=loss_type,
        beta=beta,
        epsilon=0.2,
        epsilon_high=0.28,
        temperature=TEMPERATURE,
        max_completion_length=MAX_COMPLETION,
        per_device_train_batch_size=4,
        num_generations=4,
        gradient_accumulation_steps=2,
    )
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 2
    batch = prepared_batch(model)

    trl_loss = trainer._compute_loss(model, batch)
    trl_loss.backward()
    trl_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    logprobs = completion_logprobs(model, input_ids, attention_mask, MAX_COMPLETION, TEMPERATURE)
    our_loss, stats = grpo_loss(
        logprobs,
        batch["old_per_token_logps"],
        batch["ref_per_token_logps"],
        batch["advantages"],
        batch["completion_mask"].float(),
        loss_type=loss_type,
        epsilon=0.2,
        epsilon_high=0.28,
        beta=beta,
        max_new_tokens=MAX_COMPLETION,
        num_micro_batches=2,
        tokens_per_learner=float(batch["num_items_in_batch"]),
    )
    our_loss.backward()

    assert abs(trl_loss.item()) > 1e-3  # a loss far from zero, so the relative comparison means something
    assert our_loss.item() == pytest.approx(trl_loss.item(), rel=1e-5)
    for ours, theirs in zip((p.grad for p in model.parameters()), trl_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-7)
    assert stats["clipped_tokens"] > 0  # the stale old log-probs did push ratios out of the clip range
    if beta:
        assert stats["kl_sum"] > 0


@pytest.mark.parametrize("scale_rewards", ["group", "none"])
def test_advantages_match_trl(tiny_model_path, tmp_path, scale_rewards):
    rewards = [1.0, 0.0, 0.0, 0.5, 2.0, 2.0, 2.0, 2.0]  # a mixed group and a group with no signal

    def fixed_rewards(completions, **kwargs):
        return rewards[: len(completions)]

    trainer = make_trainer(
        tiny_model_path,
        tmp_path,
        reward_func=fixed_rewards,
        scale_rewards=scale_rewards,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=3,
    )
    trainer.model.train()
    trl_advantages = trainer._generate_and_score_completions([{"prompt": "What is 2 + 3?"}] * 8)["advantages"]

    ours = torch.tensor(group_advantages(rewards, group_size=4, scale_rewards=scale_rewards))
    torch.testing.assert_close(ours, trl_advantages, rtol=1e-6, atol=1e-6)
    assert ours[4:].abs().max() == 0  # identical rewards: no push either way
    assert ours[:4].sum().abs() < 1e-6 and ours[0] > 0 > ours[1]


def test_completion_logprobs_are_temperature_scaled_log_softmax(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    attention_mask = torch.ones_like(input_ids)
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits[0, -4:-1] / 0.5
        expected = torch.log_softmax(logits, -1).gather(-1, input_ids[0, -3:, None]).squeeze(-1)
        ours = completion_logprobs(model, input_ids, attention_mask, 3, 0.5)[0]
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)
