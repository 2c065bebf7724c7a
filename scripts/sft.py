"""Supervised fine-tuning of a causal LM on chat conversations, in one plain loop.

Data: channel ``train`` (``SM_CHANNEL_TRAIN``) holding ``train.jsonl``, one conversation a line
(and optionally channel ``test`` with ``test.jsonl``, scored as ``eval_loss``)::

    {"messages": [{"role": "system", "content": "..."},      # optional
                  {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "..."}, ...]}

Each conversation is rendered with the tokenizer's chat template and the loss is taken on the
assistant tokens only (the assistant's text and its end-of-turn token). A tokenizer without a
chat template gets this plain one (``common.models.PLAIN_CHAT_TEMPLATE``)::

    ### User:
    <content>

    ### Assistant:
    <content><eos>

Each optimizer step takes ``--batch_size`` conversations (the global batch, whatever the number
of processes), sorted by length and cut into micro-batches of ``--per_device_batch_size``
dealt to the processes; gradients accumulate over a process's micro-batches. The loss is the
mean over all assistant tokens of the global batch, so one process and eight give the same
step. AdamW, linear warm-up then cosine decay, gradient clipping; optional LoRA (``--lora_r``).

Run by hand (the tiny model and data come from ``python -m helpers.tiny_model`` and
``helpers.offline_data.write_all``)::

    SM_CHANNEL_TRAIN=data/chat python scripts/sft.py --model_name_or_path /path/to/model --max_steps 20
    torchrun --nproc_per_node 2 scripts/sft.py ...          # same global batch, two processes

On SageMaker: ``entry_point="sft.py", source_dir="scripts"``, hyperparameters as below, the data
as ``fit({"train": "s3://.../chat/"})`` and optionally the weights as channel ``model`` (a
``save_pretrained`` folder or a job's ``model.tar.gz``).
Checkpoints go to ``--checkpoint_dir`` (``/opt/ml/checkpoints``) every ``--checkpoint_every``
steps and/or ``--checkpoint_every_minutes``, and on SIGTERM where it reaches the script (not in
SageMaker's PyTorch/Hugging Face images: ``common/checkpoints.py``); a restarted job resumes from
the newest one. The final model goes to
``SM_MODEL_DIR`` (LoRA merged), metrics to stdout and ``$SM_OUTPUT_DATA_DIR/metrics.jsonl``:
``loss lr grad_norm tokens epoch`` (+ ``eval_loss`` at the end and every ``--eval_every`` steps
when a ``test`` channel is given). With a ``test`` channel the job also scores the starting model, at
step 0, and every evaluation gives the held-out loss per answer token of each test conversation:
``eval_conversation_loss`` (their mean) with ``_se`` (its standard error over conversations), and the
change from the starting model on the same conversations, ``eval_conversation_loss_change`` with ``_se``
(paired), beside the starting model's ``eval_conversation_loss_before`` with ``_se``.
At step 0 and at the last step the model also answers the test prompts whose reference answer teaches a
format (a final ``#### <number>`` line, one fenced program: ``environments/taught_format.py``), greedily,
at most ``--answer_max_tokens`` tokens: ``eval_format_share`` with ``_se`` is the share of answers in that
format over ``eval_format_conversations``, ``eval_format_share_change`` with ``_se`` the paired change from
the starting model's ``eval_format_share_before``, and ``eval_distinct_answers`` and
``eval_most_common_share`` (each also ``_before``) say whether the answers collapsed into one.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from common import checkpoints, contract, data, distributed, generation, lm_loss, models, stats
from common.contract import UserError, option
from common.lm_loss import IGNORE_INDEX  # label of positions that carry no loss (prompt, padding)
from common.training_run import TrainingRun
from environments import taught_format
from transformers import get_cosine_schedule_with_warmup

log = logging.getLogger("sft")

ROLES = ("system", "user", "assistant")
# Held-out prompts per generate call and learner: the answers are short, and one call steps them all at once.
ANSWER_BATCH_SIZE = 32


@dataclass
class SFTArgs(contract.TrainingArgs):
    learning_rate: float = 2e-5  # the common options' defaults for SFT (their help is TrainingArgs')
    max_steps: int = 100
    batch_size: int = option(16, "conversations per optimizer step, over all processes")
    per_device_batch_size: int = option(
        4, "conversations per forward pass on one process; the rest is gradient accumulation"
    )
    max_length: int = option(2048, "truncate conversations to this many tokens")
    warmup_steps: int = option(10, "linear warm-up steps")
    weight_decay: float = option(0.0, "AdamW weight decay on matrices (not on biases and norms)")
    max_grad_norm: float = option(1.0, "clip the gradients' global norm; 0 = no clipping")
    gradient_checkpointing: bool = option(
        False, "recompute activations in the backward pass to save memory; always on with --strategy fsdp"
    )
    activation_checkpointing: Literal["full", "selective"] = option(
        "full",
        "where activations are recomputed (with --strategy fsdp or --gradient_checkpointing): full = "
        "each decoder layer from its input; selective = keep the outputs of its matrix products and "
        "attention too and recompute only the elementwise ops and norms (more memory, little recomputation)",
    )
    loss_chunk_tokens: int = option(
        0,
        "compute the LM head and its cross-entropy this many target tokens at a time, recomputing "
        "each chunk in the backward pass, so the full logits (tokens x vocabulary, several fp32 "
        "copies) never exist at once; 0 = all tokens at once",
    )
    eval_every: int = option(0, "with a 'test' channel: eval_loss every N steps; 0 = at the end only")
    answer_max_tokens: int = option(
        256,
        "with a 'test' channel: at step 0 and at the last step, greedy answers of at most this many tokens to "
        "the test prompts, checked for the format their reference answer teaches (the offline set's references "
        "take at most 42 SmolLM2 tokens); 0 = no answers",
    )
    lora_r: int = option(0, "LoRA rank; 0 trains all weights")
    lora_alpha: int = option(32, "LoRA scaling numerator")
    lora_dropout: float = option(0.05, "dropout on LoRA inputs")
    lora_target_modules: str = option("all-linear", "comma-separated module names to adapt, or all-linear")

    def validate(self, world_size: int) -> None:
        super().validate(world_size)
        contract.require_at_least_one(self, "batch_size", "per_device_batch_size", "max_length")
        if self.answer_max_tokens < 0:
            raise UserError(
                f"--answer_max_tokens {self.answer_max_tokens} cannot be negative: give 0 (no held-out answers) "
                f"or the most tokens an answer may take, such as 256."
            )
        if self.loss_chunk_tokens < 0:
            raise UserError(
                f"--loss_chunk_tokens {self.loss_chunk_tokens} cannot be negative: give 0 (the whole "
                f"micro-batch at once) or a number of tokens such as 1024."
            )
        if self.lora_r and self.strategy == "fsdp":
            raise UserError(
                "--lora_r with --strategy fsdp is not supported: LoRA keeps memory small, use --strategy ddp."
            )
        contract.require_whole_micro_batches(self, world_size)


def parse_args(argv: list[str] | None = None) -> SFTArgs:
    return contract.HyperparameterParser(SFTArgs, description=__doc__, prog="sft.py").parse(argv)


# --------------------------------------------------------------------------- data


def check_conversation(row: dict) -> None:
    """Raise ValueError naming the bad message (read_jsonl adds the file and line)."""
    messages = row["messages"]
    if not isinstance(messages, list):
        raise ValueError("field 'messages' must be a list of {role, content} objects")
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ValueError(f"messages[{number}] needs a 'role' among {ROLES}")
        content = message.get("content")
        if not isinstance(content, str) or not content.strip():
            raise ValueError(f"messages[{number}] ({message['role']}): field 'content' is missing or empty")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("the conversation has no assistant message to learn from")


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def tokenize_conversation(tokenizer, messages: list[dict], max_length: int) -> dict:
    """Token ids of the whole conversation and labels that keep only assistant tokens.

    An assistant turn's characters are those between the rendering of the conversation before
    it (with the generation prompt) and the rendering up to and including it; tokens starting
    inside such a span are targets.
    """
    text = render(tokenizer, messages)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:index], add_generation_prompt=True)
        through = render(tokenizer, messages[: index + 1]).rstrip()
        if not (text.startswith(before) and text.startswith(through)):
            raise UserError(
                "The tokenizer's chat template renders earlier turns differently once later turns "
                "follow, so assistant tokens cannot be located; use a model whose template does not."
            )
        spans.append((len(before), len(through)))
    encoded = tokenizer(
        text, add_special_tokens=False, return_offsets_mapping=True, truncation=True, max_length=max_length
    )
    input_ids = encoded["input_ids"]
    labels = [
        token if any(start <= begin < end for start, end in spans) else IGNORE_INDEX
        for token, (begin, _) in zip(input_ids, encoded["offset_mapping"], strict=True)
    ]
    return {
        "input_ids": input_ids,
        "labels": labels,
        "num_targets": sum(1 for label in labels[1:] if label != IGNORE_INDEX),
    }


def load_examples(tokenizer, max_length: int) -> tuple[list[dict], list[dict]]:
    """The tokenised conversations of channel ``train`` and of channel ``test`` ([] without one)."""

    def encode(row: dict) -> dict:
        return tokenize_conversation(tokenizer, row["messages"], max_length)

    train_file, examples = data.read_channel("train", ["messages"], encode, check=check_conversation)
    log.info(
        "%d conversations from %s, %d assistant tokens",
        len(examples),
        train_file,
        sum(e["num_targets"] for e in examples),
    )
    if not contract.has_channel("test"):
        return examples, []

    def encode_test(row: dict) -> dict:
        example = encode(row)
        messages = row["messages"]
        if messages[-1]["role"] == "assistant":  # the reference answer; the prompt is what comes before it
            example["reference"] = messages[-1]["content"]
            example["prompt_ids"] = data.prompt_token_ids(tokenizer, messages[:-1])
        return example

    return examples, data.read_channel("test", ["messages"], encode_test, check=check_conversation)[1]


def collate(examples: list[dict], pad_token_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Right-pad a micro-batch; padding is masked out of attention and loss."""
    input_ids, attention_mask = data.pad_rows(
        [e["input_ids"] for e in examples], pad_token_id, left=False, device=device
    )
    labels, _ = data.pad_rows([e["labels"] for e in examples], IGNORE_INDEX, left=False, device=device)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of next-token cross-entropies over target positions, and how many there are.
    Position t predicts token t+1, so logits drop the last position and labels the first."""
    shifted_logits = logits[:, :-1, :].float()
    shifted_labels = labels[:, 1:]
    loss_sum = F.cross_entropy(
        shifted_logits.reshape(-1, shifted_logits.size(-1)),
        shifted_labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return loss_sum, (shifted_labels != IGNORE_INDEX).sum()


def batch_loss_sum(model, batch: dict[str, torch.Tensor], loss_chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_loss_sum`` of the model on a micro-batch: from the full logits, or with
    ``loss_chunk_tokens`` the head and loss a chunk at a time (``common/lm_loss.py``, same value)."""
    if loss_chunk_tokens:
        hidden = lm_loss.final_hidden_states(model, batch["input_ids"], batch["attention_mask"])
        return lm_loss.chunked_token_loss_sum(hidden, lm_loss.output_head(model), batch["labels"], loss_chunk_tokens)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return token_loss_sum(logits, batch["labels"])


def conversation_loss_sums(model, batch: dict[str, torch.Tensor], loss_chunk_tokens: int) -> torch.Tensor:
    """Each row's sum of next-token cross-entropies over its target positions, and how many there are:
    shape (rows, 2), from one forward of the micro-batch (FSDP's learners must run as many as each other)."""
    labels = batch["labels"]
    if loss_chunk_tokens:
        hidden = lm_loss.final_hidden_states(model, batch["input_ids"], batch["attention_mask"])
        head = lm_loss.output_head(model)
        rows = [
            lm_loss.chunked_token_loss_sum(hidden[r : r + 1], head, labels[r : r + 1], loss_chunk_tokens)
            for r in range(labels.size(0))
        ]
        return torch.tensor([[float(loss), float(count)] for loss, count in rows], dtype=torch.float64)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    shifted_labels = labels[:, 1:]
    losses = F.cross_entropy(
        logits[:, :-1, :].float().transpose(1, 2), shifted_labels, ignore_index=IGNORE_INDEX, reduction="none"
    )
    return torch.stack([losses.sum(1), (shifted_labels != IGNORE_INDEX).sum(1)], dim=1).double().cpu()


def evaluate(
    model, examples: list[dict], learners, micro_batch_size: int, pad_token_id: int, loss_chunk_tokens: int = 0
) -> torch.Tensor:
    """Each test conversation's loss sum over its assistant tokens and their number, shape (conversations,
    2): the learners share the work and each gets the whole table."""
    model.eval()
    table = torch.zeros(len(examples), 2, dtype=torch.float64)
    with torch.no_grad():
        for indices, counted in data.evaluation_batches(len(examples), learners, micro_batch_size):
            batch = collate([examples[i] for i in indices], pad_token_id, learners.device)
            with distributed.autocast(learners):
                sums = conversation_loss_sums(model, batch, loss_chunk_tokens)
            if counted:
                table[indices] = sums
    model.train()
    return distributed.all_reduce_sum(table, learners).cpu()


def held_out_metrics(table: torch.Tensor, before: list[float] | None) -> tuple[dict, list[float]]:
    """The metrics of one evaluation (``evaluate``'s table), and each conversation's loss per answer token.
    ``eval_loss`` weighs every answer token alike; ``eval_conversation_loss`` every conversation alike, so
    its standard error is over conversations, and its change from ``before`` (the starting model's losses
    of the same conversations) is paired. Conversations left without an answer token count in neither."""
    answered = table[:, 1] > 0
    per_conversation = (table[answered, 0] / table[answered, 1]).tolist()
    record = {"eval_loss": table[:, 0].sum().item() / max(table[:, 1].sum().item(), 1)}
    if not per_conversation:
        return record, per_conversation
    loss, loss_se = stats.mean_and_standard_error(per_conversation)
    record |= {
        "eval_conversation_loss": loss,
        "eval_conversation_loss_se": loss_se,
        "eval_conversations": len(per_conversation),
    }
    if before:
        record["eval_conversation_loss_before"], record["eval_conversation_loss_before_se"] = (
            stats.mean_and_standard_error(before)
        )
        change, change_se = stats.paired_change(before, per_conversation)
        record.update(eval_conversation_loss_change=change, eval_conversation_loss_change_se=change_se)
    return record, per_conversation


def answers_to(model, tokenizer, examples: list[dict], learners, max_new_tokens: int) -> list[str]:
    """Greedy answers to the prompts of ``examples``: the learners share the work and each gets them all.

    A learner answers its share alone (``generation.sample_requests``, which drops finished answers from the
    batch as it goes: a third less time than keeping them, with SmolLM2 on a CPU), except with FSDP across
    processes, whose every forward gathers weights with the other learners: there ``generate`` steps in time
    with them (``HFGenerator``)."""
    in_step = learners.world_size > 1 and distributed.is_fsdp(model)
    stop_ids = generation.default_stop_ids(distributed.unwrap(model), tokenizer)
    generator = generation.HFGenerator(model, tokenizer, learners, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
    mine = {}
    for indices, counted in data.evaluation_batches(len(examples), learners, ANSWER_BATCH_SIZE):
        prompts = [examples[i]["prompt_ids"] for i in indices]
        if in_step:
            _, texts = generator.generate(prompts, greedy=True)
        else:
            requests = [generation.SampleRequest(p, 1, max_new_tokens, temperature=0.0) for p in prompts]
            model.eval()
            try:
                with distributed.autocast(learners):
                    samples = generation.sample_requests(distributed.unwrap(model), tokenizer, requests, stop_ids)
            finally:
                model.train()
            texts = [tokenizer.decode(s[0].tokens, skip_special_tokens=True) for s in samples]
        if counted:
            mine.update(zip(indices, texts, strict=True))
    answered = distributed.merge_dicts(mine, learners)
    return [answered[i] for i in range(len(examples))]


def format_metrics(evaluation: dict, before: dict | None) -> dict:
    """The metrics of one ``taught_format.format_evaluation``, with the paired change from ``before`` (the
    starting model's evaluation of the same prompts), as ``held_out_metrics`` does for the loss."""
    diversity = evaluation["answer_diversity"]
    record = {
        "eval_format_share": evaluation["share"],
        "eval_format_share_se": evaluation["standard_error"],
        "eval_format_conversations": evaluation["conversations"],
        "eval_distinct_answers": diversity["distinct_answers"],
        "eval_most_common_share": diversity["most_common_share"],
    }
    if before:
        change, change_se = stats.paired_change(before["per_conversation"], evaluation["per_conversation"])
        record |= {
            "eval_format_share_before": before["share"],
            "eval_format_share_before_se": before["standard_error"],
            "eval_format_share_change": change,
            "eval_format_share_change_se": change_se,
            "eval_distinct_answers_before": before["answer_diversity"]["distinct_answers"],
            "eval_most_common_share_before": before["answer_diversity"]["most_common_share"],
        }
    return record


# --------------------------------------------------------------------------- model


def build_model(args: SFTArgs, model_path: str, learners: distributed.Learners):
    """The model to train: full fine-tuning, or frozen base + LoRA adapters; wrapped for DDP/FSDP."""
    if args.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        base = models.load_model(model_path, learners.device, trainable=False)
        targets = (
            args.lora_target_modules
            if args.lora_target_modules == "all-linear"
            else [name.strip() for name in args.lora_target_modules.split(",")]
        )
        config = LoraConfig(
            r=args.lora_r,
            lora_alpha=args.lora_alpha,
            lora_dropout=args.lora_dropout,
            target_modules=targets,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, config)
    else:
        model = models.load_model(model_path, models.load_device(learners, args.strategy))
    model.config.use_cache = False  # no generation cache while training
    return models.prepare_for_training(
        model, learners, args.strategy, args.gradient_checkpointing, args.activation_checkpointing
    )


# --------------------------------------------------------------------------- training


def train(args: SFTArgs, learners: distributed.Learners) -> bool:
    """Fine-tune on channel ``train`` and save the model. Returns False if stopped by SIGTERM (a
    checkpoint was saved and the run resumes from it), True when training finished."""
    args.validate(learners.world_size)
    accumulation_steps = args.batch_size // (args.per_device_batch_size * learners.world_size)
    checkpoints.seed_everything(args.seed)

    # ---- data
    model_path, tokenizer = models.starting_model(args.model_name_or_path, learners)  # plain template if none
    examples, test_examples = load_examples(tokenizer, args.max_length)
    # the test conversations whose reference answer teaches a format: their prompts are answered
    answered_examples = [e for e in test_examples if taught_format.taught_format(e.get("reference", "")) is not None]
    if not args.answer_max_tokens:
        answered_examples = []

    def format_evaluation() -> dict:
        answers = answers_to(model, tokenizer, answered_examples, learners, args.answer_max_tokens)
        return taught_format.format_evaluation([e["reference"] for e in answered_examples], answers)

    # ---- model, optimizer, schedule, batch order
    model = build_model(args, model_path, learners)
    optimizer = models.build_optimizer(model, args.learning_rate, args.weight_decay)
    scheduler = get_cosine_schedule_with_warmup(optimizer, min(args.warmup_steps, args.max_steps), args.max_steps)
    batch_order = data.BatchOrder(len(examples), args.batch_size, args.seed)

    # ---- resume after a spot interruption or a restart, from the newest whole checkpoint
    run = TrainingRun(args, learners, model, optimizer, scheduler, batch_order, trainable_only=args.lora_r > 0)
    logger = run.start()
    # ---- the starting model on the test set (step 0), kept in every checkpoint for the paired change
    held_out_before = run.resumed.get("held_out_before") if run.resumed else None
    format_before = run.resumed.get("format_before") if run.resumed else None
    if test_examples and run.start_step == 0:
        table = evaluate(
            model, test_examples, learners, args.per_device_batch_size, tokenizer.pad_token_id, args.loss_chunk_tokens
        )
        record, held_out_before = held_out_metrics(table, None)
        if answered_examples:
            format_before = format_evaluation()
            record |= format_metrics(format_before, None)
        logger.log(0, record)
    log.info(
        "training steps %d..%d: %d conversations a step, %d micro-batches of %d on each of %d processes",
        run.start_step + 1,
        args.max_steps,
        args.batch_size,
        accumulation_steps,
        args.per_device_batch_size,
        learners.world_size,
    )

    for step in range(run.start_step + 1, args.max_steps + 1):
        # ---- the global batch, longest first so micro-batches hold similar lengths (less padding)
        global_batch = sorted(batch_order.next(), key=lambda i: -len(examples[i]["input_ids"]))
        num_targets = max(sum(examples[i]["num_targets"] for i in global_batch), 1)
        my_micro_batches = data.shard_batch(global_batch, learners, args.per_device_batch_size)

        # ---- forward and backward over this learner's micro-batches (gradient accumulation)
        local_loss_sum = 0.0
        for micro_step, indices in enumerate(my_micro_batches):
            batch = collate([examples[i] for i in indices], tokenizer.pad_token_id, learners.device)
            last_micro_step = micro_step == len(my_micro_batches) - 1
            with distributed.gradient_sync(model, last_micro_step):  # all-reduce once, after the last
                with distributed.autocast(learners):  # the loss itself computes in fp32
                    loss_sum, _ = batch_loss_sum(model, batch, args.loss_chunk_tokens)
                # DDP/FSDP average gradients over processes; times world_size / num_targets makes the
                # result the gradient of the mean loss over every assistant token of the global batch.
                (loss_sum * learners.world_size / num_targets).backward()
            local_loss_sum += loss_sum.item()

        # ---- clip, step
        grad_norm = distributed.clip_grad_norm(model, args.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        # ---- log (and evaluate)
        logger.add_tokens(sum(len(examples[i]["input_ids"]) for i in global_batch))
        evaluate_now = bool(test_examples) and run.evaluates_at(step, args.eval_every)
        if run.logs_at(step, evaluate_now):
            loss = distributed.all_reduce_sum(local_loss_sum, learners).item() / num_targets
            record = {
                "loss": loss,
                "lr": scheduler.get_last_lr()[0],
                "grad_norm": grad_norm,
                "tokens": num_targets,
                "epoch": batch_order.epoch,
            }
            if evaluate_now:
                table = evaluate(
                    model,
                    test_examples,
                    learners,
                    args.per_device_batch_size,
                    tokenizer.pad_token_id,
                    args.loss_chunk_tokens,
                )
                record.update(held_out_metrics(table, held_out_before)[0])
                if answered_examples and step == args.max_steps:
                    record |= format_metrics(format_evaluation(), format_before)
            logger.log(step, record)

        # ---- checkpoints by steps/minutes; on SIGTERM save and stop (the restarted job resumes here)
        if run.end_step(step, held_out_before=held_out_before, format_before=format_before):
            return False

    run.finish(tokenizer)
    return True


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with distributed.started() as learners:
        train(args, learners)


if __name__ == "__main__":
    contract.run_main(lambda: main(sys.argv[1:]))
