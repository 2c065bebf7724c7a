"""Run by test_sharded_checkpoints under ``torchrun --nproc_per_node N`` (or plain ``python`` for
one process): FSDP2 checkpoints written by DCP, each rank its own shards.

    save ROOT          train 3 steps, background save, train on while it is written
    resume ROOT STEP...  a fresh model resumes; its full state must equal the one saved at STEP
    sigterm ROOT       background saves every 3 steps; SIGTERM while step 6 is being written
    kill ROOT          SIGKILL while step 4 is being written (step 3 is whole)

Every mode that saves writes ``expected_<step>.pt`` (rank 0): the full model, optimizer and
scheduler state at that step, gathered before the save, for ``resume`` to compare against.
The disk is made slow (each rank's write waits first) so a save is still in flight when the
signal comes.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time
from pathlib import Path

import torch
from common.checkpoints import MANIFEST, Checkpointer, SigtermFlag, seed_everything
from common.contract import gloo_threads, run_main
from common.distributed import barrier, setup, teardown, wrap_model
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from two_process_checkpoints import TinyNet


def build(learners, seed: int):
    torch.manual_seed(seed)
    strategy = "fsdp" if learners.distributed else "ddp"  # one process: the plain model
    model = wrap_model(TinyNet(), learners, strategy, activation_checkpointing=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def train_step(model, optimizer, scheduler, learners):
    x = torch.randn(4, 8) + learners.rank
    model(x).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def full_state(model, optimizer, scheduler) -> dict:
    """Whole tensors on every rank, whatever the sharding: what must survive a checkpoint."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return {"model": model_state, "optimizer": optimizer_state, "scheduler": scheduler.state_dict()}


def assert_equal(got, want, where="state"):
    if isinstance(want, torch.Tensor):
        assert torch.equal(got, want), f"{where} differs"
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            assert_equal(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: length"
        for index, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_equal(a, b, f"{where}[{index}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def slow_disk(seconds: float) -> None:
    original = FileSystemWriter.write_data

    def write_data(self, plan, planner):
        time.sleep(seconds)
        return original(self, plan, planner)

    FileSystemWriter.write_data = write_data


def record_expected(root: Path, step: int, model, optimizer, scheduler, learners) -> None:
    state = full_state(model, optimizer, scheduler)
    if learners.is_main:
        torch.save(state, root / f"expected_{step}.pt")


def save(root: Path, learners) -> None:
    slow_disk(0.5)
    seed_everything(10 + learners.rank)
    model, optimizer, scheduler = build(learners, seed=0)
    checkpointer = Checkpointer(root / "checkpoints", learners, background=True)
    for _ in range(3):
        train_step(model, optimizer, scheduler, learners)
    record_expected(root, 3, model, optimizer, scheduler, learners)
    checkpointer.save(3, model, optimizer, scheduler, extra={"data": 3})
    in_flight = not (root / "checkpoints" / "step_00000003" / MANIFEST).exists()
    for _ in range(2):  # in place on the live tensors while the shards are written
        train_step(model, optimizer, scheduler, learners)
    checkpointer.wait()
    print(f"rank {learners.rank}: saved step 3 (in flight while training: {in_flight})", flush=True)


def resume(root: Path, steps: list[int], learners) -> None:
    """Resume from the newest, expecting ``steps[0]``; then take its manifest away (a torn folder
    now) and resume again, expecting ``steps[1]``, and so on."""
    for index, step in enumerate(steps):
        seed_everything(99)
        model, optimizer, scheduler = build(learners, seed=1)
        resumed = Checkpointer(root / "checkpoints", learners).load_latest(model, optimizer, scheduler)
        assert resumed is not None and resumed["step"] == step, resumed
        want = torch.load(root / f"expected_{step}.pt", weights_only=False)
        assert_equal(full_state(model, optimizer, scheduler), want)
        print(
            f"rank {learners.rank} of {learners.world_size}: resumed step {step}, state equals the saved one",
            flush=True,
        )
        if index + 1 < len(steps):
            barrier(learners)
            if learners.is_main:
                (root / "checkpoints" / f"step_{step:08d}" / MANIFEST).unlink()
            barrier(learners)


def sigterm(root: Path, learners) -> None:
    slow_disk(1.0)
    seed_everything(10 + learners.rank)
    model, optimizer, scheduler = build(learners, seed=0)
    checkpointer = Checkpointer(root / "checkpoints", learners, keep=2, background=True)
    flag = SigtermFlag()
    for step in range(1, 100):
        train_step(model, optimizer, scheduler, learners)
        stop = flag.should_stop(learners)
        if stop or step % 3 == 0:
            record_expected(root, step, model, optimizer, scheduler, learners)
            checkpointer.save(step, model, optimizer, scheduler)
        if stop:
            whole = sorted(folder.name for folder in checkpointer.complete_checkpoints())
            print(f"rank {learners.rank}: stopped by SIGTERM after step {step}; whole: {whole}", flush=True)
            return
        if step == 6:
            writing = not (root / "checkpoints" / "step_00000006" / MANIFEST).exists()
            print(f"rank {learners.rank}: SIGTERM while step 6 is written: {writing}", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)


def kill(root: Path, learners) -> None:
    seed_everything(10 + learners.rank)
    model, optimizer, scheduler = build(learners, seed=0)
    checkpointer = Checkpointer(root / "checkpoints", learners, background=True)
    for step in range(1, 5):
        train_step(model, optimizer, scheduler, learners)
        if step == 3:
            record_expected(root, step, model, optimizer, scheduler, learners)
            checkpointer.save(step, model, optimizer, scheduler)
            checkpointer.wait()
            slow_disk(1.0)
    checkpointer.save(4, model, optimizer, scheduler)
    time.sleep(0.5)  # the shards are being written
    print(f"rank {learners.rank}: killed while step 4 is written", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    mode, root = sys.argv[1], Path(sys.argv[2])
    learners = setup()
    # Reached only if the interpreter's own teardown runs while gloo's threads do (the abort at exit).
    atexit.register(
        lambda: gloo_threads() and print(f"rank {learners.rank}: exit with gloo threads running", flush=True)
    )
    if mode == "resume":
        resume(root, [int(step) for step in sys.argv[3:]], learners)
    else:
        {"save": save, "sigterm": sigterm, "kill": kill}[mode](root, learners)
    teardown()


if __name__ == "__main__":
    run_main(main)  # as the scripts end
