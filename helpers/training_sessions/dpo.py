"""DPO on a SageMaker training session: the preference loss the service does not have, through
``logprob_loss.py`` (forward, the loss and its gradient here, ``cross_entropy`` with weights ``-dL/dlogp``).

A pair becomes two datums, prompt + chosen and prompt + rejected, tokenised as ``scripts/dpo.py`` does
(``common.preferences.tokenize_pair``) and shifted as every session datum is (``datum_tools.supervised_datum``):
weight 1 on the answer's tokens, 0 on the prompt's. Those weights are the mask that sums each answer's
log-probabilities; the weights the service trains with are the gradient's, computed per step.

The loss is ``common.preferences.dpo_loss``, the very function ``scripts/dpo.py`` trains with, averaged
over the batch's pairs as the job does. The reference log-probabilities are the session's own before its
first update (``reference_logps``): a new LoRA adapter starts with B = 0, so those weights are the base model's.
The step itself is in notebook 12, where the reader edits it.
"""

from __future__ import annotations

import torch
from common import stats
from common.preferences import dpo_loss, tokenize_pair  # scripts/common: the job's loss, imported

from helpers.training_sessions import datum_tools, logprob_loss


def pair_datums(tokenizer, rows: list[dict], max_prompt_length: int, max_length: int) -> list:
    """``[chosen_0, rejected_0, chosen_1, rejected_1, ...]``: two datums a pair, answers weighted 1."""
    datums = []
    for row in rows:
        pair = tokenize_pair(tokenizer, row, max_prompt_length, max_length)
        datums += [
            datum_tools.supervised_datum(pair["prompt_ids"], pair[answer]) for answer in ("chosen_ids", "rejected_ids")
        ]
    return datums


def answer_masks(datums) -> list[torch.Tensor]:
    """Each datum's answer mask (its weights: 1 on the answer's target tokens)."""
    return [torch.tensor(datum_tools.values(d.loss_fn_inputs["weights"]), dtype=torch.float64) for d in datums]


def pair_logps(logprobs: list[torch.Tensor], masks: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected): each answer's log-probability, summed over its tokens, as ``dpo.py``'s
    ``completion_logps`` sums them."""
    sums = torch.stack([(lp * mask).sum() for lp, mask in zip(logprobs, masks, strict=True)])
    return sums[0::2], sums[1::2]


def reference_logps(training_client, datums) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) log-probabilities of every pair at the session's current weights: before the
    first ``optim_step``, the base model's."""
    return pair_logps(logprob_loss.token_logprobs(training_client, datums), answer_masks(datums))


def dpo_objective(masks, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, beta: float):
    """The loss ``logprob_loss`` differentiates: ``dpo_loss`` averaged over the pairs, with the metrics
    ``dpo.py`` logs (means over the pairs)."""

    def loss_fn(logprobs: list[torch.Tensor]):
        chosen, rejected = pair_logps(logprobs, masks)
        losses, chosen_rewards, rejected_rewards = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta)
        return losses.mean(), {
            "loss": float(losses.detach().mean()),
            "rewards_accuracies": float((chosen_rewards > rejected_rewards).double().mean()),
            "rewards_margins": float((chosen_rewards - rejected_rewards).mean()),
            "rewards_chosen": float(chosen_rewards.mean()),
            "rewards_rejected": float(rejected_rewards.mean()),
        }

    return loss_fn


def evaluate(training_client, datums, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, beta: float) -> dict:
    """Held-out pairs at the current weights, one forward pass, with standard errors over the pairs:

    - ``reward_accuracy``: share of pairs whose implicit reward ``beta * (logp - ref_logp)`` is higher for
      the chosen answer (DPO's accuracy; 0 before training, where every reward is 0);
    - ``margin``: mean of reward chosen - reward rejected;
    - ``likelihood_accuracy``: share of pairs where the model gives the chosen answer the higher
      log-probability (needs no reference, so it means something before training too); ``chosen_more_likely``
      says it of each pair, for the paired change (``likelihood_change``)."""
    chosen, rejected = pair_logps(logprob_loss.token_logprobs(training_client, datums), answer_masks(datums))
    _, chosen_rewards, rejected_rewards = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta)
    margins = chosen_rewards - rejected_rewards
    chosen_more_likely = (chosen > rejected).int().tolist()
    reward_accuracy, reward_accuracy_se = stats.mean_and_standard_error((margins > 0).int().tolist())
    margin, margin_se = stats.mean_and_standard_error(margins.tolist())
    likelihood_accuracy, likelihood_accuracy_se = stats.mean_and_standard_error(chosen_more_likely)
    return {
        "pairs": len(margins),
        "reward_accuracy": reward_accuracy,
        "reward_accuracy_se": reward_accuracy_se,
        "margin": margin,
        "margin_se": margin_se,
        "likelihood_accuracy": likelihood_accuracy,
        "likelihood_accuracy_se": likelihood_accuracy_se,
        "chosen_more_likely": chosen_more_likely,
    }


def likelihood_change(before: dict, after: dict) -> dict:
    """The held-out likelihood accuracy's paired change from ``before`` to ``after`` (two ``evaluate`` results
    on the same pairs) and its standard error, under the names notebook 12 records them."""
    change, error = stats.paired_change(before["chosen_more_likely"], after["chosen_more_likely"])
    return {"held_out_change": change, "held_out_change_se": error}
