"""Direct Preference Optimization (DPO) of a causal LM, in one plain loop.

Data: channel ``train`` (``SM_CHANNEL_TRAIN``) holding ``train.jsonl``, one preference a line,
and optionally channel ``test`` with ``test.jsonl``::

    {"prompt": "...", "chosen": "...", "rejected": "..."}

The test pairs are scored before the first step (logged as step 0) and at the end (``--eval_every``: also
in between): ``eval_loss``, ``eval_rewards_accuracies``, ``eval_rewards_margins`` and
``eval_likelihood_accuracy`` (the share of pairs where the model gives the chosen answer the higher
log-probability; at step 0 the starting model's), with its standard error, the reference's (the starting
model's) beside it and the paired change between the two on the same pairs (``evaluate``).

The prompt becomes a user turn of the tokenizer's chat template (with the generation prompt),
each answer an assistant turn (with its end-of-turn token); as in TRL, the completion starts
where the tokens of prompt and prompt + answer part (``common/preferences.py``: the tokenisation
and the loss, which the training-session loops use too).

The loss is DPO's sigmoid loss (Rafailov et al., 2023): with log-probabilities summed over the
completion tokens, for the policy being trained and a frozen reference model (the starting
model),

    loss = -log sigmoid(beta * ((logp_chosen - ref_logp_chosen) - (logp_rejected - ref_logp_rejected)))

averaged over the pairs of the global batch. The reference runs alongside the policy (sharded
like it with ``--strategy fsdp``), or, with ``--precompute_ref_log_probs true``, once over the data
before training and is then freed.
Logged as TRL logs them (``/`` written ``_``): ``loss rewards_chosen rewards_rejected
rewards_accuracies rewards_margins logps_chosen logps_rejected lr grad_norm``, where a
reward is ``beta * (logp - ref_logp)``.

Each optimizer step takes ``--batch_size`` pairs over all processes, cut into micro-batches of
``--per_device_batch_size`` pairs dealt to the processes (gradient accumulation for the rest).

Run by hand::

    SM_CHANNEL_TRAIN=data/preferences python scripts/dpo.py --model_name_or_path /path/to/model --max_steps 20
    torchrun --nproc_per_node 2 scripts/dpo.py ...

On SageMaker: ``entry_point="dpo.py", source_dir="scripts"``, ``fit({"train": "s3://.../preferences/"})``
and optionally channel ``model`` (e.g. the SFT job's model.tar.gz). Checkpoints, resume after
SIGTERM / spot interruptions and the final model in ``SM_MODEL_DIR`` work as in ``sft.py``.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

import torch
from common import checkpoints, contract, data, distributed, models, stats
from common.contract import UserError, option
from common.preferences import dpo_loss, tokenize_pair  # torch alone: the training sessions import them too
from common.training_run import TrainingRun
from transformers import get_cosine_schedule_with_warmup

log = logging.getLogger("dpo")

FIELDS = ("prompt", "chosen", "rejected")


@dataclass
class DPOArgs(contract.TrainingArgs):
    learning_rate: float = 5e-7  # the common options' defaults for DPO (their help is TrainingArgs')
    max_steps: int = 100
    beta: float = option(0.1, "strength of the pull towards the reference model")
    batch_size: int = option(16, "preference pairs per optimizer step, over all processes")
    per_device_batch_size: int = option(2, "pairs per forward pass on one process; the rest is gradient accumulation")
    max_prompt_length: int = option(512, "keep at most this many prompt tokens, the last ones")
    max_length: int = option(1024, "truncate prompt + answer to this many tokens")
    reference_model_name_or_path: str = option(
        "", "the frozen reference model; empty = the starting model (default: empty)"
    )
    precompute_ref_log_probs: bool = option(
        False,
        "compute the reference log-probs once before training and free "
        "the reference model (saves memory and time per step)",
    )
    eval_every: int = option(0, "with a 'test' channel: evaluate every N steps; 0 = at the end only")
    warmup_steps: int = option(10, "linear warm-up steps")
    weight_decay: float = option(0.0, "AdamW weight decay on matrices (not on biases and norms)")
    max_grad_norm: float = option(1.0, "clip the gradients' global norm; 0 = no clipping")
    gradient_checkpointing: bool = option(
        False, "recompute activations in the backward pass to save memory; always on with --strategy fsdp"
    )

    def validate(self, world_size: int) -> None:
        super().validate(world_size)
        contract.require_at_least_one(self, "batch_size", "per_device_batch_size", "max_prompt_length", "max_length")
        if self.max_prompt_length >= self.max_length:
            raise UserError(
                f"--max_prompt_length ({self.max_prompt_length}) must be below --max_length ({self.max_length})."
            )
        if self.beta <= 0:
            raise UserError(f"--beta must be positive, got {self.beta}.")
        contract.require_whole_micro_batches(self, world_size)


def parse_args(argv: list[str] | None = None) -> DPOArgs:
    return contract.HyperparameterParser(DPOArgs, description=__doc__, prog="dpo.py").parse(argv)


# --------------------------------------------------------------------------- data


def load_pairs(tokenizer, args: DPOArgs) -> tuple[list[dict], list[dict]]:
    """The tokenised preference pairs of channel ``train`` and of channel ``test`` ([] without one)."""

    def encode(row: dict) -> dict:
        return tokenize_pair(tokenizer, row, args.max_prompt_length, args.max_length)

    train_file, examples = data.read_channel("train", FIELDS, encode)
    log.info("%d preference pairs from %s", len(examples), train_file)
    if not contract.has_channel("test"):
        return examples, []
    return examples, data.read_channel("test", FIELDS, encode)[1]


def longest_sequence(example: dict) -> int:
    """Tokens of the longer of the pair's two rows (prompt + chosen, prompt + rejected)."""
    return len(example["prompt_ids"]) + max(len(example["chosen_ids"]), len(example["rejected_ids"]))


def sequence_tokens(example: dict) -> int:
    """Tokens of both of the pair's rows: what a step trains on."""
    return 2 * len(example["prompt_ids"]) + len(example["chosen_ids"]) + len(example["rejected_ids"])


def collate_pairs(examples: list[dict], pad_token_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Rows 0..B-1 are prompt + chosen, rows B..2B-1 prompt + rejected, right-padded; the
    completion mask marks the answer tokens."""
    sequences, masks = [], []
    for answer in ("chosen_ids", "rejected_ids"):
        for example in examples:
            sequences.append(example["prompt_ids"] + example[answer])
            masks.append([0] * len(example["prompt_ids"]) + [1] * len(example[answer]))
    input_ids, attention_mask = data.pad_rows(sequences, pad_token_id, left=False, device=device)
    completion_mask, _ = data.pad_rows(masks, 0, left=False, device=device)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": completion_mask}


# --------------------------------------------------------------------------- loss


def completion_logps(logits: torch.Tensor, input_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Per row, the sum over completion tokens of log p(token | the tokens before it)."""
    token_logps = torch.log_softmax(logits[:, :-1, :].float(), dim=-1)
    token_logps = token_logps.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (token_logps * completion_mask[:, 1:]).sum(dim=-1)


PAIR_METRICS = (  # a step's metrics: means over its pairs of these sums (TRL's names, "/" written "_")
    "loss",
    "rewards_chosen",
    "rewards_rejected",
    "rewards_accuracies",
    "rewards_margins",
    "logps_chosen",
    "logps_rejected",
)


def pair_sums(losses, chosen_rewards, rejected_rewards, chosen_logps, rejected_logps) -> dict[str, float]:
    """The ``PAIR_METRICS`` sums over a micro-batch's pairs, where a reward is beta * (logp - ref_logp)."""
    return {
        "loss": losses.sum().item(),
        "rewards_chosen": chosen_rewards.sum().item(),
        "rewards_rejected": rejected_rewards.sum().item(),
        "rewards_accuracies": (chosen_rewards > rejected_rewards).float().sum().item(),
        "rewards_margins": (chosen_rewards - rejected_rewards).sum().item(),
        "logps_chosen": chosen_logps.sum().item(),
        "logps_rejected": rejected_logps.sum().item(),
    }


# --------------------------------------------------------------------------- reference model


def load_reference(args: DPOArgs, model_path: str, learners):
    """The frozen reference: the starting model unless ``--reference_model_name_or_path`` names another."""
    reference_path = model_path
    if args.reference_model_name_or_path:
        reference_path = models.resolve_model_path(
            args.reference_model_name_or_path, "--reference_model_name_or_path", use_channel=False
        )
    return models.load_reference(reference_path, learners, args.strategy)


def reference_logps_of(reference, batch: dict, learners) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) log-probs of the frozen reference for a collated batch."""
    with torch.no_grad(), distributed.autocast(learners):
        logits = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return completion_logps(logits, batch["input_ids"], batch["completion_mask"]).chunk(2)


def reference_logps_for(indices: list[int], batch: dict, reference, ref_table, learners):
    """(chosen, rejected) reference log-probs: looked up when precomputed, else computed now."""
    if ref_table is not None:
        chosen = torch.tensor([ref_table[i][0] for i in indices], device=learners.device)
        rejected = torch.tensor([ref_table[i][1] for i in indices], device=learners.device)
        return chosen, rejected
    return reference_logps_of(reference, batch, learners)


def precompute_reference_logps(reference, examples: list[dict], learners, batch_size: int, pad_token_id: int):
    """[(chosen, rejected)] reference log-probs of every pair; each learner does its share."""
    mine = {}
    my_indices = list(range(learners.rank, len(examples), learners.world_size))
    my_batches = [my_indices[start : start + batch_size] for start in range(0, len(my_indices), batch_size)]
    # A sharded reference's forward is a collective: every learner runs as many as learner 0, which
    # has the most pairs; the others repeat a batch they do not count.
    rounds = -(-len(range(0, len(examples), learners.world_size)) // batch_size)
    for round_index in range(rounds):
        counted = round_index < len(my_batches)
        indices = my_batches[round_index] if counted else [0]
        batch = collate_pairs([examples[i] for i in indices], pad_token_id, learners.device)
        chosen, rejected = reference_logps_of(reference, batch, learners)
        if counted:
            mine.update({i: (c, r) for i, c, r in zip(indices, chosen.tolist(), rejected.tolist(), strict=True)})
    if learners.distributed:
        everyone = [None] * learners.world_size
        torch.distributed.all_gather_object(everyone, mine)
        mine = {i: value for part in everyone for i, value in part.items()}
    return [mine[i] for i in range(len(examples))]


def reference_tables(args: DPOArgs, reference, resumed: dict | None, examples, test_examples, learners, pad_token_id):
    """(train, test) tables of reference log-probs, or (None, None) when the reference runs alongside the
    policy: those a resumed checkpoint saved, else, with ``--precompute_ref_log_probs``, computed now."""
    if resumed is not None and resumed.get("ref_logps") is not None:
        return resumed["ref_logps"], resumed.get("test_ref_logps")
    if not args.precompute_ref_log_probs:
        return None, None
    log.info("computing reference log-probs of %d pairs", len(examples) + len(test_examples))
    batch_size = args.per_device_batch_size
    train_table = precompute_reference_logps(reference, examples, learners, batch_size, pad_token_id)
    return train_table, precompute_reference_logps(reference, test_examples, learners, batch_size, pad_token_id)


def evaluate(model, reference, ref_table, examples: list[dict], learners, args: DPOArgs, pad_token_id: int) -> dict:
    """The held-out pairs at the current weights (the learners share the work), means over the pairs:

    - ``eval_loss``, ``eval_rewards_accuracies``, ``eval_rewards_margins``: DPO's loss, its implicit reward
      accuracy (0 before the first step, where every reward is 0) and reward margin;
    - ``eval_likelihood_accuracy`` with ``_se``: the share of pairs where the policy gives the chosen answer
      the higher log-probability, which needs no reference and so means something before training too;
    - ``eval_reference_likelihood_accuracy`` with ``_se``: the same share under the reference (the starting
      model, unless ``--reference_model_name_or_path`` names another), and ``eval_likelihood_accuracy_change``
      with ``_se``: the policy's minus the reference's on the same pairs, a paired change; ``eval_pairs``."""
    model.eval()
    # one row a pair: loss, reward margin, chosen more likely under the policy, and under the reference
    per_pair = torch.zeros(len(examples), 4, dtype=torch.float64)
    with torch.no_grad():
        for indices, counted in data.evaluation_batches(len(examples), learners, args.per_device_batch_size):
            batch = collate_pairs([examples[i] for i in indices], pad_token_id, learners.device)
            ref_chosen, ref_rejected = reference_logps_for(indices, batch, reference, ref_table, learners)
            with distributed.autocast(learners):
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            chosen, rejected = completion_logps(logits, batch["input_ids"], batch["completion_mask"]).chunk(2)
            losses, chosen_rewards, rejected_rewards = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, args.beta)
            if counted:
                rows = [losses, chosen_rewards - rejected_rewards, chosen > rejected, ref_chosen > ref_rejected]
                per_pair[indices] = torch.stack([row.double().cpu() for row in rows], dim=1)
    model.train()
    loss, margin, policy_prefers_chosen, reference_prefers_chosen = distributed.all_reduce_sum(per_pair, learners).T
    accuracy, accuracy_se = stats.mean_and_standard_error(policy_prefers_chosen.tolist())
    reference_accuracy, reference_accuracy_se = stats.mean_and_standard_error(reference_prefers_chosen.tolist())
    change, change_se = stats.paired_change(reference_prefers_chosen.tolist(), policy_prefers_chosen.tolist())
    return {
        "eval_loss": loss.mean().item(),
        "eval_rewards_accuracies": (margin > 0).double().mean().item(),
        "eval_rewards_margins": margin.mean().item(),
        "eval_likelihood_accuracy": accuracy,
        "eval_likelihood_accuracy_se": accuracy_se,
        "eval_reference_likelihood_accuracy": reference_accuracy,
        "eval_reference_likelihood_accuracy_se": reference_accuracy_se,
        "eval_likelihood_accuracy_change": change,
        "eval_likelihood_accuracy_change_se": change_se,
        "eval_pairs": len(examples),
    }


# --------------------------------------------------------------------------- training


def train(args: DPOArgs, learners: distributed.Learners) -> bool:
    """Train with DPO on channel ``train`` and save the model. Returns False if stopped by SIGTERM (a
    checkpoint was saved and the run resumes from it), True when training finished."""
    args.validate(learners.world_size)
    checkpoints.seed_everything(args.seed)

    # ---- data
    model_path, tokenizer = models.starting_model(args.model_name_or_path, learners)
    examples, test_examples = load_pairs(tokenizer, args)

    # ---- policy, frozen reference, optimizer, schedule, batch order
    model = models.load_model(model_path, models.load_device(learners, args.strategy))
    model.config.use_cache = False  # no generation cache while training
    model = models.prepare_for_training(model, learners, args.strategy, args.gradient_checkpointing)
    reference = load_reference(args, model_path, learners)
    optimizer = models.build_optimizer(model, args.learning_rate, args.weight_decay)
    scheduler = get_cosine_schedule_with_warmup(optimizer, min(args.warmup_steps, args.max_steps), args.max_steps)
    batch_order = data.BatchOrder(len(examples), args.batch_size, args.seed)

    # ---- resume after a spot interruption or a restart, from the newest whole checkpoint; reference
    # log-probs computed once (--precompute_ref_log_probs) resume with it, and the reference is freed
    run = TrainingRun(args, learners, model, optimizer, scheduler, batch_order)
    ref_table, test_ref_table = reference_tables(
        args, reference, run.resumed, examples, test_examples, learners, tokenizer.pad_token_id
    )
    if args.precompute_ref_log_probs:
        reference = None  # not needed any more: frees its memory
    logger = run.start()

    # ---- the held-out pairs before the first step: the base model's preferences, to compare the end with
    if test_examples and run.start_step == 0:
        logger.log(0, evaluate(model, reference, test_ref_table, test_examples, learners, args, tokenizer.pad_token_id))

    for step in range(run.start_step + 1, args.max_steps + 1):
        # ---- the global batch, longest first so micro-batches hold similar lengths (less padding)
        global_batch = sorted(batch_order.next(), key=lambda i: -longest_sequence(examples[i]))
        my_micro_batches = data.shard_batch(global_batch, learners, args.per_device_batch_size)

        # ---- forward and backward over this learner's micro-batches (gradient accumulation)
        sums = dict.fromkeys(PAIR_METRICS, 0.0)
        for micro_step, indices in enumerate(my_micro_batches):
            batch = collate_pairs([examples[i] for i in indices], tokenizer.pad_token_id, learners.device)
            ref_chosen, ref_rejected = reference_logps_for(indices, batch, reference, ref_table, learners)
            last_micro_step = micro_step == len(my_micro_batches) - 1
            with distributed.gradient_sync(model, last_micro_step):  # all-reduce once, after the last
                with distributed.autocast(learners):
                    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                chosen_logps, rejected_logps = completion_logps(
                    logits, batch["input_ids"], batch["completion_mask"]
                ).chunk(2)
                losses, chosen_rewards, rejected_rewards = dpo_loss(
                    chosen_logps, rejected_logps, ref_chosen, ref_rejected, args.beta
                )
                # DDP/FSDP average gradients over processes; times world_size / batch_size makes the
                # result the gradient of the mean loss over the global batch's pairs.
                (losses.sum() * learners.world_size / args.batch_size).backward()
            micro_batch_sums = pair_sums(losses, chosen_rewards, rejected_rewards, chosen_logps, rejected_logps)
            sums = {name: sums[name] + micro_batch_sums[name] for name in PAIR_METRICS}

        # ---- clip, step
        grad_norm = distributed.clip_grad_norm(model, args.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        # ---- log (and evaluate): means over the global batch's pairs
        logger.add_tokens(sum(sequence_tokens(examples[i]) for i in global_batch))
        evaluate_now = bool(test_examples) and run.evaluates_at(step, args.eval_every)
        if run.logs_at(step, evaluate_now):
            totals = distributed.reduce_sums(sums, learners)
            record = {name: total / args.batch_size for name, total in totals.items()}
            record.update(lr=scheduler.get_last_lr()[0], grad_norm=grad_norm, epoch=batch_order.epoch)
            if evaluate_now:
                record.update(
                    evaluate(model, reference, test_ref_table, test_examples, learners, args, tokenizer.pad_token_id)
                )
            logger.log(step, record)

        # ---- checkpoints by steps/minutes; on SIGTERM save and stop (the restarted job resumes here)
        saved = {} if ref_table is None else {"ref_logps": ref_table, "test_ref_logps": test_ref_table}
        if run.end_step(step, **saved):
            return False

    run.finish(tokenizer)
    return True


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with distributed.started() as learners:
        train(args, learners)


if __name__ == "__main__":
    contract.run_main(lambda: main(sys.argv[1:]))
