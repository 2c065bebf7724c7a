"""Reading JSON Lines with errors that point at the bad row, chat prompts as token ids, a reproducible
batch order and padding.

Importing this module needs no torch (only the functions that build tensors import it): the training
sessions' environment, which has the SageMaker SDK v3 and no torch, reads and validates its data with
the same loaders as the job scripts (``environments.gsm8k``, ``environments.code``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from common.contract import UserError, channel_file

if TYPE_CHECKING:
    import torch

    from common.distributed import Learners

Example = TypeVar("Example")


def _is_empty(value) -> bool:
    return (
        value is None
        or (isinstance(value, (str, list, dict)) and len(value) == 0)
        or (isinstance(value, str) and not value.strip())
    )


def read_jsonl(path: str | Path, fields: Sequence[str], check: Callable[[dict], None] | None = None) -> list[dict]:
    """Rows of ``path``: every row a JSON object with each of ``fields`` present and non-empty;
    ``check(row)`` may raise ``ValueError("...")`` for anything else. Errors are ``UserError``
    naming the file, the line number and the field."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"Data file {path} does not exist.")
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise UserError(f"{where}: not valid JSON ({error.msg} at column {error.colno}).") from None
            if not isinstance(row, dict):
                raise UserError(
                    f"{where}: expected a JSON object with fields {list(fields)}, got {type(row).__name__}."
                )
            for field in fields:
                if field not in row:
                    raise UserError(f"{where}: field '{field}' is missing (each row needs {list(fields)}).")
                if _is_empty(row[field]):
                    raise UserError(f"{where}: field '{field}' is empty.")
            if check is not None:
                try:
                    check(row)
                except ValueError as error:
                    raise UserError(f"{where}: {error}") from None
            rows.append(row)
    if not rows:
        raise UserError(f"Data file {path} has no rows.")
    return rows


def read_channel(
    name: str, fields: Sequence[str], encode: Callable[[dict], Example], check: Callable[[dict], None] | None = None
) -> tuple[Path, list[Example]]:
    """Input channel ``name``'s ``<name>.jsonl`` (``contract.channel_file``) read with ``read_jsonl``,
    every row passed through ``encode`` (a tokeniser): the file and the encoded rows."""
    path = channel_file(name, f"{name}.jsonl")
    return path, [encode(row) for row in read_jsonl(path, fields, check=check)]


def prompt_token_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Chat ``messages`` rendered with the chat template, ready for the assistant's answer."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class BatchOrder:
    """Endless, reproducible global batches of example indices: each epoch is a fresh permutation
    seeded by (seed, epoch); ``state_dict()`` holds the position, so a resumed run sees exactly the
    batches an uninterrupted one would."""

    def __init__(self, num_examples: int, batch_size: int, seed: int):
        if num_examples < 1:
            raise UserError("The data set is empty.")
        self.num_examples = num_examples
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.position = 0  # next index into this epoch's permutation

    def _permutation(self, epoch: int) -> list[int]:
        import torch

        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_examples, generator=generator).tolist()

    def next(self) -> list[int]:
        """The next ``batch_size`` indices (running into the next epoch when this one ends)."""
        batch = []
        while len(batch) < self.batch_size:
            order = self._permutation(self.epoch)
            take = order[self.position : self.position + self.batch_size - len(batch)]
            batch += take
            self.position += len(take)
            if self.position >= self.num_examples:
                self.epoch, self.position = self.epoch + 1, 0
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "num_examples": self.num_examples}

    def load_state_dict(self, state: dict) -> None:
        if state["num_examples"] != self.num_examples:
            raise UserError(
                f"The checkpoint was made with {state['num_examples']} training examples, the data now has "
                f"{self.num_examples}: use a new --checkpoint_dir (or checkpoint_s3_uri) for new data."
            )
        self.epoch, self.position = state["epoch"], state["position"]


def shard_batch(indices: list[int], learners: Learners, micro_batch_size: int) -> list[list[int]]:
    """Cut a global batch into micro-batches of ``micro_batch_size`` and deal them round-robin:
    learner ``r`` gets micro-batches r, r + world_size, ... (so every learner does the same number
    of accumulation steps when ``len(indices)`` is a multiple of world_size * micro_batch_size)."""
    chunks = [indices[i : i + micro_batch_size] for i in range(0, len(indices), micro_batch_size)]
    return chunks[learners.rank :: learners.world_size]


def evaluation_batches(num_examples: int, learners: Learners, micro_batch_size: int) -> list[tuple[list[int], bool]]:
    """This learner's micro-batches of examples 0..num_examples-1, as ``(indices, counted)``.

    Learners whose share runs out first repeat their first batch with ``counted=False``, so all
    run the same number of forward passes (with FSDP each forward gathers parameters together).
    """
    chunks = [list(range(i, min(i + micro_batch_size, num_examples))) for i in range(0, num_examples, micro_batch_size)]
    rounds = -(-len(chunks) // learners.world_size)  # ceil
    batches = []
    for round_index in range(rounds):
        position = round_index * learners.world_size + learners.rank
        counted = position < len(chunks)
        batches.append((chunks[position] if counted else chunks[0], counted))
    return batches


def pad_rows(rows: list[list[int]], value: int, left: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A (rows, longest) tensor padded with ``value`` on the left or right, and its 0/1 mask."""
    import torch

    width = max(len(row) for row in rows)
    ids, mask = [], []
    for row in rows:
        padding = [value] * (width - len(row))
        ids.append(padding + row if left else row + padding)
        mask.append([0] * len(padding) + [1] * len(row) if left else [1] * len(row) + [0] * len(padding))
    return torch.tensor(ids, device=device), torch.tensor(mask, device=device)
