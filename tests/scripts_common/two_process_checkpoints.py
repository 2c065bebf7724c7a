"""Run by test_common_checkpoints under ``torchrun --nproc_per_node 2``: for DDP and FSDP2, train
6 steps straight, then 3 steps + checkpoint + 2 lost steps + restore + 3 steps, and compare."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from common.checkpoints import Checkpointer, seed_everything
from common.distributed import setup, teardown, wrap_model


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.tanh(self.linear(x))


class TinyNet(torch.nn.Module):
    _no_split_modules = ["Block"]  # what FSDP shards, as in Hugging Face models

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(Block(), Block())
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.blocks(x))


def fresh(learners, strategy, seed):
    torch.manual_seed(seed)
    model = wrap_model(TinyNet(), learners, strategy, activation_checkpointing=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer


def step(model, optimizer, learners):
    x = torch.randn(4, 8) + learners.rank  # per-rank data from each rank's own RNG
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def full_parameters(model):
    return [p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone() for p in model.parameters()]


def main(root: Path) -> None:
    learners = setup()
    for strategy in ("ddp", "fsdp"):
        seed_everything(10 + learners.rank)
        model, optimizer = fresh(learners, strategy, seed=0)
        for _ in range(6):
            step(model, optimizer, learners)
        expected = full_parameters(model)

        seed_everything(10 + learners.rank)
        model, optimizer = fresh(learners, strategy, seed=0)
        checkpointer = Checkpointer(root / strategy, learners, keep=1)
        for _ in range(3):
            step(model, optimizer, learners)
        checkpointer.save(3, model, optimizer, extra={"strategy": strategy})
        for _ in range(2):
            step(model, optimizer, learners)

        seed_everything(99)
        model, optimizer = fresh(learners, strategy, seed=1)
        resumed = Checkpointer(root / strategy, learners).load_latest(model, optimizer)
        assert resumed == {"step": 3, "extra": {"strategy": strategy}}, resumed
        for _ in range(3):
            step(model, optimizer, learners)
        got = full_parameters(model)
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), f"{strategy} differs"
        print(f"rank {learners.rank} {strategy}: resumed run equals uninterrupted run", flush=True)
    teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
