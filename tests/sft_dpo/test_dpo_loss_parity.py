"""DPO's loss and logged rewards agree with TRL's DPOTrainer on identical inputs."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def trl_trainer(tiny_model_path, tmp_path_factory):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from local_mode.offline_data import preference_records

    rows = preference_records(4, seed=3)
    # TRL's conversational format: what dpo.py builds from {"prompt", "chosen", "rejected"} strings.
    dataset = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": r["prompt"]}],
                "chosen": [{"role": "assistant", "content": r["chosen"]}],
                "rejected": [{"role": "assistant", "content": r["rejected"]}],
            }
            for r in rows
        ]
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():  # move the policy away from the reference so rewards are not all zero
        for parameter in policy.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    config = DPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl")),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        beta=0.3,
        per_device_train_batch_size=4,
        max_length=None,
    )
    trainer = DPOTrainer(
        model=policy, ref_model=reference, args=config, train_dataset=dataset, processing_class=tokenizer
    )
    return trainer, rows, tokenizer


def test_dpo_tokenization_matches_trl(trl_trainer):
    import dpo

    trainer, rows, tokenizer = trl_trainer
    for row, tokenized in zip(rows, trainer.train_dataset, strict=True):
        ours = dpo.tokenize_pair(tokenizer, row, max_prompt_length=10_000, max_length=20_000)
        assert ours["prompt_ids"] == tokenized["prompt_ids"]
        assert ours["chosen_ids"] == tokenized["chosen_ids"]
        assert ours["rejected_ids"] == tokenized["rejected_ids"]


def test_dpo_loss_and_rewards_match_trl(trl_trainer, tiny_model_path):
    import dpo
    from common.distributed import single_learner
    from transformers import AutoModelForCausalLM

    trainer, rows, tokenizer = trl_trainer
    collator = trainer.data_collator
    inputs = collator([trainer.train_dataset[i] for i in range(len(rows))])
    trainer.model.train()
    trl_loss = trainer._compute_loss(trainer.model, inputs, return_outputs=False)
    trl_metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}

    # Our code, on a separate copy of the same policy weights and on the same token ids.
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    policy.load_state_dict(trainer.model.state_dict())
    learners = single_learner("cpu")
    examples = [dpo.tokenize_pair(tokenizer, row, 10_000, 20_000) for row in rows]
    batch = dpo.collate_pairs(examples, tokenizer.pad_token_id, learners.device)
    assert torch.equal(batch["input_ids"], inputs["input_ids"])
    assert torch.equal(batch["completion_mask"], inputs["completion_mask"])
    ref_chosen, ref_rejected = dpo.reference_logps_of(trainer.ref_model, batch, learners)
    logits = policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    chosen, rejected = dpo.completion_logps(logits, batch["input_ids"], batch["completion_mask"]).chunk(2)
    losses, chosen_rewards, rejected_rewards = dpo.dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.3)

    assert abs(losses.mean().item() - 0.6931) > 1e-3, "policy and reference must differ for a meaningful check"
    torch.testing.assert_close(losses.mean(), trl_loss.detach(), rtol=1e-5, atol=1e-7)
    ours = {
        "rewards/chosen": chosen_rewards.mean().item(),
        "rewards/rejected": rejected_rewards.mean().item(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean().item(),
        "logps/chosen": chosen.mean().item(),
        "logps/rejected": rejected.mean().item(),
    }
    # Rewards are beta * (differences of log-probs of size ~|logps|): each log-prob agrees to 1e-5
    # relative, so a reward or margin agrees to 1e-5 * beta * |logps| in absolute terms.
    reward_tolerance = 1e-5 * 0.3 * max(abs(ours["logps/chosen"]), abs(ours["logps/rejected"]))
    for name, value in ours.items():
        tolerance = reward_tolerance if name.startswith("rewards/") and name != "rewards/accuracies" else 0.0
        assert value == pytest.approx(trl_metrics[name], rel=1e-5, abs=tolerance), name
