"""Checkpoints: atomic, complete, restorable bit for bit, pruned; SIGTERM sets a flag."""

from __future__ import annotations

import json
import logging
import os
import random
import signal

import numpy as np
import pytest
import torch


def _training_state(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return model, optimizer, scheduler


def _step(model, optimizer, scheduler):
    x = torch.randn(16, 4)  # draws from the torch RNG, which the checkpoint must restore
    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean() + 0.01 * random.random() + 0.01 * np.random.rand()
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def test_resume_restores_everything_bit_for_bit(tmp_path):
    from common.checkpoints import Checkpointer, seed_everything
    from common.distributed import single_learner

    learners = single_learner("cpu")
    seed_everything(1)
    model, optimizer, scheduler = _training_state()
    for _ in range(6):
        _step(model, optimizer, scheduler)
    expected = [p.detach().clone() for p in model.parameters()]

    seed_everything(1)
    model, optimizer, scheduler = _training_state()
    checkpointer = Checkpointer(tmp_path, learners, keep=2)
    for _ in range(3):
        _step(model, optimizer, scheduler)
    checkpointer.save(3, model, optimizer, scheduler, extra={"position": 3})
    for _ in range(2):  # progress that the "crash" loses
        _step(model, optimizer, scheduler)

    seed_everything(99)  # a fresh process: other RNG state, fresh model
    model, optimizer, scheduler = _training_state(seed=5)
    resumed = Checkpointer(tmp_path, learners).load_latest(model, optimizer, scheduler)
    assert resumed == {"step": 3, "extra": {"position": 3}}
    assert scheduler.last_epoch == 3
    for _ in range(3):
        _step(model, optimizer, scheduler)
    for got, want in zip(model.parameters(), expected, strict=True):
        assert torch.equal(got, want)


def test_layout_pruning_and_torn_checkpoints(tmp_path, caplog):
    from common.checkpoints import Checkpointer
    from common.distributed import single_learner

    learners = single_learner("cpu")
    model, optimizer, scheduler = _training_state()
    (tmp_path / ".tmp-step_00000009-123").mkdir()  # left by a process killed while writing
    checkpointer = Checkpointer(tmp_path, learners, keep=2)
    assert not (tmp_path / ".tmp-step_00000009-123").exists()
    for step in (1, 2, 3):
        _step(model, optimizer, scheduler)
        checkpointer.save(step, model, optimizer, scheduler)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002", "step_00000003"]
    manifest = json.loads((tmp_path / "step_00000003" / "manifest.json").read_text())
    assert manifest["step"] == 3 and set(manifest["files"]) == {"model.pt", "optimizer.pt", "state.pt"}
    written = (tmp_path / "step_00000003" / "manifest.json").stat().st_mtime_ns
    checkpointer.save(3, model, optimizer, scheduler)  # SIGTERM right after the periodic save: not again
    assert (tmp_path / "step_00000003" / "manifest.json").stat().st_mtime_ns == written

    # Newest torn (a file cut short), next one without a manifest, next one unreadable: fall back to step 2.
    with open(tmp_path / "step_00000003" / "optimizer.pt", "r+b") as handle:
        handle.truncate(10)
    (tmp_path / "step_00000005").mkdir()
    (tmp_path / "step_00000005" / "model.pt").write_bytes(b"partial")
    with caplog.at_level(logging.WARNING):
        resumed = Checkpointer(tmp_path, learners).load_latest(model, optimizer, scheduler)
    assert resumed["step"] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("step_00000003" in w for w in warnings) and any("step_00000005" in w for w in warnings)

    for name in ("model.pt",):  # complete by size but not loadable -> also skipped
        path = tmp_path / "step_00000002" / name
        path.write_bytes(b"x" * path.stat().st_size)
    assert Checkpointer(tmp_path, learners).load_latest(model, optimizer, scheduler) is None
    assert Checkpointer(tmp_path / "nothing-here", learners).load_latest(model, optimizer, scheduler) is None

    # The next save clears torn checkpoints older than itself (a newer torn one would be replaced).
    Checkpointer(tmp_path, learners).save(6, model, optimizer, scheduler)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_00000002", "step_00000006"]  # 2: whole by size


def test_sigterm_sets_a_flag_instead_of_killing(tmp_path):
    from common.checkpoints import SigtermFlag
    from common.distributed import single_learner

    previous = signal.getsignal(signal.SIGTERM)
    try:
        flag = SigtermFlag()
        assert not flag.should_stop(single_learner("cpu"))
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.received and flag.should_stop(single_learner("cpu"))
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_single_learner_context(clean_env):
    from common.distributed import setup, single_learner

    learners = single_learner("cpu")
    assert (learners.rank, learners.world_size, learners.is_main, learners.distributed) == (0, 1, True, False)
    assert learners.device == torch.device("cpu")
    assert setup() == learners  # a plain `python script.py` is one learner


@pytest.mark.slow  # tests/sft_dpo covers the same path through sft.py (SIGTERM, resume) in the default run
def test_checkpoints_under_two_processes_ddp_and_fsdp(tmp_path):
    """DDP: rank 0 writes, every rank restores; FSDP2: every rank writes and restores its shards
    (tests/scripts_common/test_sharded_checkpoints.py covers the rest); bit for bit."""
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "PYTHONPATH": str(here.parents[1] / "scripts"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(here / "two_process_checkpoints.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for strategy in ("ddp", "fsdp"):
        for rank in (0, 1):
            assert f"rank {rank} {strategy}: resumed run equals uninterrupted run" in result.stdout


def test_background_save_writes_the_state_of_its_step_while_training_goes_on(tmp_path):
    """The thread writes a copy: the steps taken while it writes do not leak into the checkpoint,
    and it restores bit for bit like a synchronous save of the same step."""
    from common.checkpoints import Checkpointer
    from common.distributed import single_learner

    learners = single_learner("cpu")
    model, optimizer, scheduler = _training_state()
    for _ in range(3):
        _step(model, optimizer, scheduler)
    at_step_3 = {name: t.clone() for name, t in model.state_dict().items()}
    moments_at_3 = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    background = Checkpointer(tmp_path / "background", learners, background=True)
    background.save(3, model, optimizer, scheduler)
    Checkpointer(tmp_path / "synchronous", learners).save(3, model, optimizer, scheduler)
    for _ in range(2):  # in place on the live tensors, while the thread may still be writing
        _step(model, optimizer, scheduler)
    background.wait()

    for folder in ("background", "synchronous"):
        fresh, fresh_optimizer, fresh_scheduler = _training_state(seed=5)
        resumed = Checkpointer(tmp_path / folder, learners).load_latest(fresh, fresh_optimizer, fresh_scheduler)
        assert resumed["step"] == 3 and fresh_scheduler.last_epoch == 3
        for name, tensor in fresh.state_dict().items():
            assert torch.equal(tensor, at_step_3[name]), (folder, name)
        assert torch.equal(fresh_optimizer.state_dict()["state"][0]["exp_avg"], moments_at_3)

    # A failed write is not silent: the next save (or wait) raises it.
    failing = Checkpointer(tmp_path / "failing", learners, background=True)
    failing.directory = tmp_path / "a-file"  # where the folder should be, a file: the write fails
    failing.directory.write_text("")
    failing.save(4, model, optimizer, scheduler)
    with pytest.raises(RuntimeError, match="writing a checkpoint"):
        failing.wait()


def test_time_based_schedule_with_a_fake_clock():
    from common.checkpoints import CheckpointSchedule
    from common.distributed import single_learner

    learners = single_learner("cpu")
    now = [1000.0]
    schedule = CheckpointSchedule(every_steps=0, every_minutes=10, clock=lambda: now[0])
    seconds_per_step = 170.0  # a slow step: ten minutes is between the 3rd and 4th step
    due = []
    for step in range(1, 13):
        now[0] += seconds_per_step
        if schedule.due(step, learners):
            due.append(step)
    assert due == [4, 8, 12]  # 680 s, 1360 s, 2040 s: the first step past each 10 minutes since the last save
    # Whatever an interruption hits, it loses less than the interval plus one step.
    assert max(b - a for a, b in zip([0, *due], due, strict=False)) * seconds_per_step < 600 + seconds_per_step

    both = CheckpointSchedule(every_steps=5, every_minutes=1, clock=lambda: now[0])
    now[0] += 30
    assert not both.due(1, learners)
    assert both.due(5, learners)  # by steps; the clock starts again from this save
    now[0] += 59
    assert not both.due(6, learners)
    now[0] += 1
    assert both.due(7, learners)  # by time
    assert [s for s in range(1, 30) if CheckpointSchedule(0, 0).due(s, learners)] == []  # both off
    # negative values are refused by TrainingArgs.validate (test_common_contract.py)


def test_a_checkpoint_is_staged_outside_the_synced_folder(tmp_path, monkeypatch):
    """The sync to S3 watches the checkpoint folder: a checkpoint written there under a temporary name was
    uploaded half-written, and S3 kept that copy. It is written beside the folder and renamed in, whole."""
    from common import checkpoints
    from common.distributed import single_learner

    folder = tmp_path / "checkpoints"
    (tmp_path / ".checkpoints-staging" / ".tmp-step_00000007-1").mkdir(parents=True)  # a killed run's
    seen_while_writing = []
    real_save = checkpoints._fsync_save

    def save_and_look(obj, path):
        real_save(obj, path)
        seen_while_writing.append(sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")))
        assert not path.is_relative_to(folder)

    monkeypatch.setattr(checkpoints, "_fsync_save", save_and_look)
    model, optimizer, scheduler = _training_state()
    checkpointer = checkpoints.Checkpointer(folder, single_learner("cpu"), background=True)
    assert not (tmp_path / ".checkpoints-staging").exists()  # the leftover went, and its folder with it
    _step(model, optimizer, scheduler)
    checkpointer.save(1, model, optimizer, scheduler)
    checkpointer.wait()
    assert seen_while_writing == [[], [], []]  # model, optimizer, state: nothing in the synced folder yet
    assert sorted(p.name for p in (folder / "step_00000001").iterdir()) == [
        "manifest.json", "model.pt", "optimizer.pt", "state.pt"
    ]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]


def test_tied_weights_are_saved_once(tmp_path):
    """An embedding tied to the output layer is one tensor under two names; copied for a background write
    it must stay one, or every checkpoint holds it twice."""
    from common import checkpoints

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(1000, 64)
            self.head = torch.nn.Linear(64, 1000, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    for copy in (False, True):
        state = checkpoints._model_state(model, trainable_only=False, copy=copy)
        assert state["head.weight"] is state["embed.weight"]
        assert copy == (state["embed.weight"].data_ptr() != model.embed.weight.data_ptr())
    torch.save(checkpoints._model_state(model, trainable_only=False, copy=True), tmp_path / "model.pt")
    assert (tmp_path / "model.pt").stat().st_size < 1000 * 64 * 4 * 1.2  # once, not twice
