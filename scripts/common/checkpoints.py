"""Checkpoints that bound what a spot interruption costs, and the SIGTERM flag.

SageMaker syncs ``/opt/ml/checkpoints`` with ``checkpoint_s3_uri`` and, after a spot
interruption, restarts the job with the same files in place. A checkpoint is a folder. With DDP
or one process (rank 0 writes, the others wait)::

    <checkpoint_dir>/step_00000120/
        model.pt       model state dict (full, unsharded; trainable parameters only with LoRA)
        optimizer.pt   optimizer state dict
        state.pt       step, scheduler, RNG states of every rank (python, numpy, torch CPU/CUDA),
                       and the script's ``extra`` (data position, ...)
        manifest.json  written last: step and each file's size

It is written under a temporary name beside the folder (``.<folder>-staging/``, so that the sync to
S3 never uploads a half-written one) and renamed into it when complete. With FSDP2 (``--strategy fsdp``)
every rank writes its own shards with ``torch.distributed.checkpoint`` (DCP), nothing is gathered::

    <checkpoint_dir>/step_00000120/
        __0_0.distcp, __1_0.distcp, ...   each rank's shards of the model and optimizer state
        .metadata      DCP's index of the shards, written by rank 0 once every rank has written
        state.pt       as above
        manifest.json  written last, by rank 0 once DCP's save has finished on every rank:
                       ``"format": "sharded"`` and the size of each file (shard sizes from DCP's index)

Every rank writes into the folder itself (the shards of a multi-host job are on each host), so
the manifest is what makes it count. Rank 0 prunes (keeps the newest ``keep``) what it can check
whole: on one host or a shared file system, everything; with a disk per host, nothing until the
restarted job's S3 sync brings every host's files. Either way a folder named ``step_*`` with a matching manifest
is whole; loading walks from the newest and skips, with a warning, any folder whose manifest is
missing, whose sizes disagree or that fails to load. A sharded checkpoint loads into any number
of processes (DCP reshards: saved by 2, resumed by 3, or by one process without FSDP) and a
DDP-format one into FSDP (rank 0 reads it and broadcasts the shards).

What bounds the loss is how often checkpoints are written: ``CheckpointSchedule`` saves every N
steps and/or every M minutes (the time-based one bounds the loss in wall-clock time, whatever a
step costs). With ``background=True`` the training state is copied (to CPU memory) and written by
a thread while training goes on; the next save, or ``wait()``, waits for it. With FSDP that is
DCP's ``async_save`` on a process group of its own (gloo), so its collectives never interleave
with training's; the process group must outlive it, so call ``wait()`` before ``teardown()``.
A save after SIGTERM is the last one: it waits for the one in flight and is written before
``save`` returns.

The SIGTERM save does not run on SageMaker's PyTorch and Hugging Face images. Their entry point
is ``bash -m start_with_right_hostname.sh``: bash is the container's first process, has no
SIGTERM trap, and the kernel drops a signal that the first process of a PID namespace does not
handle. Nothing reaches the toolkit, torchrun or the script; SIGKILL follows 120 s later.
Nothing inside the job can change that: a wrapper as ``sagemaker_program``, the toolkit and
torchrun (which would pass SIGTERM to its workers) all run under that bash and are never signalled.
``SigtermFlag`` serves images whose entry point delivers SIGTERM to the script (and keeps the
toolkit alive while the script saves) and runs by hand or under torchrun, which passes SIGTERM to
its workers.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import logging
import os
import random
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from common.distributed import Learners, any_flag, barrier, is_fsdp, unwrap

log = logging.getLogger("common")

MANIFEST = "manifest.json"
PREFIX = "step_"
SHARDED = "sharded"  # the manifest's "format" of a DCP checkpoint

# Set by SigtermFlag's handler: a save after it is the last one and must be on disk when save returns.
_SIGTERM_RECEIVED = threading.Event()


# --------------------------------------------------------------------------- RNG


def rng_state() -> dict:
    """Every random number generator a training step may draw from."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and every GPU) alike on every learner."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# --------------------------------------------------------------------------- model/optimizer state


def _model_state(model, trainable_only: bool, copy: bool) -> dict:
    """The state to save, on CPU. ``copy``: tensors of their own, which training may not change
    while a thread writes them (``.cpu()`` of a CPU tensor is the live tensor itself). Tied weights
    (an embedding shared with the output layer) stay one tensor under their names, so ``torch.save``
    writes them once: copied apart they were 113 MB more a checkpoint for SmolLM2-135M."""
    module = unwrap(model)
    if trainable_only:
        tensors = {name: p for name, p in module.named_parameters() if p.requires_grad}
    else:
        tensors = module.state_dict()
    copies = {}
    state = {}
    for name, tensor in tensors.items():
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if key not in copies:
            copies[key] = _to_cpu(tensor, copy)
        state[name] = copies[key]
    return state


def _optimizer_state(model, optimizer, copy: bool) -> dict:
    state = optimizer.state_dict()  # references the live moment estimates
    return _copy_tensors(state) if copy else state


def _to_cpu(tensor: torch.Tensor, copy: bool) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=copy)


def _copy_tensors(value):
    """``value`` with every tensor replaced by a CPU copy (dicts and lists walked)."""
    if isinstance(value, torch.Tensor):
        return _to_cpu(value, copy=True)
    if isinstance(value, dict):
        return {key: _copy_tensors(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_tensors(item) for item in value)
    return value


def _load_model_state(model, state: dict, trainable_only: bool) -> None:
    if is_fsdp(model):  # a DDP-format checkpoint: rank 0 read it, the others get their shards from it
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        return
    result = unwrap(model).load_state_dict(state, strict=not trainable_only)
    if trainable_only and result.unexpected_keys:
        raise ValueError(f"checkpoint has parameters this model lacks: {result.unexpected_keys[:5]}")


def _load_optimizer_state(model, optimizer, state: dict) -> None:
    if is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(
            model,
            optimizer,
            optim_state_dict=state,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )
        return
    optimizer.load_state_dict(state)


def _gather_objects(obj, learners: Learners) -> list:
    if not learners.distributed:
        return [obj]
    gathered = [None] * learners.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def _fsync_save(obj, path: Path) -> None:
    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


# --------------------------------------------------------------------------- sharded (DCP) state


def _sharded_state(model, optimizer) -> dict:
    """Model and optimizer state as DCP saves and loads it: with FSDP2 each rank's own shards
    (DTensors, nothing gathered); for a DDP or plain model the whole state. The same call gives
    the tensors a load fills in place (with a fresh optimizer, DCP creates its state first).
    Every parameter is in it (the scripts refuse LoRA with FSDP, so nothing here is frozen)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def _load_sharded(folder: Path, model, optimizer) -> None:
    """Fill ``model`` and ``optimizer`` from the DCP checkpoint in ``folder``, whatever number of
    processes wrote it (every rank calls it; one process without a process group may too)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _sharded_state(model, optimizer)
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _shard_sizes(metadata) -> dict[str, int]:
    """Each shard file's size from DCP's index (``FileSystemWriter`` writes the items of a file
    back to back), so rank 0 can list files other hosts wrote."""
    sizes: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), info.offset + info.length)
    return sizes


# --------------------------------------------------------------------------- checkpointer


class Checkpointer:
    """Saves and restores the full training state under ``directory`` (see the module docstring)."""

    def __init__(
        self,
        directory: str | Path,
        learners: Learners,
        keep: int = 2,
        trainable_only: bool = False,
        background: bool = False,
    ):
        self.directory = Path(directory)
        self.learners = learners
        self.keep = max(1, keep)
        self.trainable_only = trainable_only
        self.background = background
        self.last_saved_step: int | None = None
        self._writer: threading.Thread | None = None
        self._write_error: BaseException | None = None
        self._sharded_group = None  # the process group of DCP's background saves, made on first use
        # A checkpoint is written beside the folder and renamed into it when whole: the sync of the folder
        # to S3 then never uploads one half-written, which S3 would keep (1.7 GB for SmolLM2-135M).
        self.staging = self.directory.parent / f".{self.directory.name}-staging"
        if learners.is_main:
            self.directory.mkdir(parents=True, exist_ok=True)
            # What an earlier run left while writing (inside the folder: where it was staged before)
            for leftover in [*self.staging.glob(".tmp-*"), *self.directory.glob(".tmp-*")]:
                shutil.rmtree(leftover, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.staging.rmdir()  # gone if empty
        barrier(learners)

    # ---------------------------------------------------------------- saving

    def save(self, step: int, model, optimizer, scheduler=None, extra: dict | None = None) -> Path | None:
        """Write a checkpoint of ``step`` (every rank must call it). Returns the folder on rank 0.
        A step this checkpointer has just saved is not written again (SIGTERM right after a
        periodic save: the time before the instance goes is short). In the background the folder
        appears when the write is done; a write still running is waited for first."""
        if step == self.last_saved_step:
            return self.directory / f"{PREFIX}{step:08d}" if self.learners.is_main else None
        self.wait()
        if is_fsdp(model):
            return self._save_sharded(step, model, optimizer, scheduler, extra)
        started = time.perf_counter()
        rng_states = _gather_objects(rng_state(), self.learners)
        final = None
        if self.learners.is_main:  # DDP replicas are equal: rank 0 writes
            model_state = _model_state(model, self.trainable_only, copy=self.background)
            optimizer_state = _optimizer_state(model, optimizer, copy=self.background)
            final = self.directory / f"{PREFIX}{step:08d}"
            state = self._training_state(step, scheduler, extra, rng_states)
            if self.background:
                copied = time.perf_counter() - started
                # Not a daemon: the interpreter waits for it before a clean exit (SIGTERM, last step).
                self._writer = threading.Thread(
                    target=self._write_in_background,
                    name="checkpoint-writer",
                    args=(final, model_state, optimizer_state, state, started, copied),
                )
                self._writer.start()
            else:
                self._write(final, model_state, optimizer_state, state)
                log.info("checkpoint step %d saved to %s in %.1fs", step, final, time.perf_counter() - started)
        barrier(self.learners)
        self.last_saved_step = step
        return final

    def _training_state(self, step: int, scheduler, extra: dict | None, rng_states: list) -> dict:
        return {
            "step": step,
            "scheduler": copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None,
            "rng": rng_states,
            "world_size": self.learners.world_size,
            "extra": extra or {},
        }

    def _save_sharded(self, step: int, model, optimizer, scheduler, extra: dict | None) -> Path | None:
        """FSDP2: every rank writes its shards with DCP into ``step_*``; rank 0 writes the manifest
        once DCP has finished on every rank (its ``.metadata`` is written after every rank's shards)."""
        import torch.distributed.checkpoint as dcp

        started = time.perf_counter()
        rng_states = _gather_objects(rng_state(), self.learners)
        final = self.directory / f"{PREFIX}{step:08d}"
        if self.learners.is_main:
            shutil.rmtree(final, ignore_errors=True)  # a torn or older run's folder of the same step
            final.mkdir(parents=True)
            _fsync_save(self._training_state(step, scheduler, extra, rng_states), final / "state.pt")
        barrier(self.learners)
        shards = _sharded_state(model, optimizer)
        # After SIGTERM the script exits next: that save must be on disk when it returns. Agreed by all
        # ranks, or the write's collectives would run in a thread on one rank and inline on another.
        if self.background and not any_flag(_SIGTERM_RECEIVED.is_set(), self.learners):
            if self._sharded_group is None and self.learners.distributed:
                # DCP's planning and completion are collectives in the writer thread: on a group of their
                # own they cannot interleave with training's (and async_save needs a CPU backend).
                self._sharded_group = dist.new_group(backend="gloo")
            future = dcp.async_save(shards, checkpoint_id=str(final), process_group=self._sharded_group)
            copied = time.perf_counter() - started
            # Not a daemon: the interpreter waits for it before a clean exit.
            self._writer = threading.Thread(
                target=self._finish_sharded_in_background,
                name="checkpoint-writer",
                args=(future, step, final, started, copied),
            )
            self._writer.start()
        else:
            metadata = dcp.save(shards, checkpoint_id=str(final))
            if self.learners.is_main:
                self._write_sharded_manifest(final, step, metadata)
                log.info(
                    "checkpoint step %d saved to %s in %.1fs (sharded)", step, final, time.perf_counter() - started
                )
        barrier(self.learners)
        self.last_saved_step = step
        return final if self.learners.is_main else None

    def _finish_sharded_in_background(self, future, step: int, final: Path, started: float, copied: float) -> None:
        try:
            metadata = future.result()
            if self.learners.is_main:
                self._write_sharded_manifest(final, step, metadata)
                log.info(
                    "checkpoint step %d saved to %s in %.1fs (sharded; training waited %.2fs for the copy)",
                    step,
                    final,
                    time.perf_counter() - started,
                    copied,
                )
        except BaseException as error:  # noqa: BLE001 - reported by the next save or wait()
            log.error("checkpoint step %d could not be written: %r", step, error)
            self._write_error = error

    def _write_sharded_manifest(self, final: Path, step: int, metadata) -> None:
        files = _shard_sizes(metadata)
        for name in (".metadata", "state.pt"):
            files[name] = (final / name).stat().st_size
        manifest = {
            "step": step,
            "format": SHARDED,
            "files": files,
            "world_size": self.learners.world_size,
            "time": time.time(),
        }
        staging = final / f".tmp-{MANIFEST}"
        with open(staging, "w") as handle:
            handle.write(json.dumps(manifest, indent=1))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, final / MANIFEST)
        self._prune()

    def wait(self) -> None:
        """Until the background write is on disk; its error, if it failed, is raised here."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._write_error is not None:
            error, self._write_error = self._write_error, None
            raise RuntimeError(f"writing a checkpoint under {self.directory} failed: {error!r}") from error

    def _write_in_background(self, final: Path, model_state, optimizer_state, state, started, copied) -> None:
        try:
            self._write(final, model_state, optimizer_state, state)
            log.info(
                "checkpoint step %d saved to %s in %.1fs (training waited %.2fs for the copy)",
                state["step"],
                final,
                time.perf_counter() - started,
                copied,
            )
        except BaseException as error:  # noqa: BLE001 - reported by the next save or wait()
            log.error("checkpoint step %d could not be written: %r", state["step"], error)
            self._write_error = error

    def _write(self, final: Path, model_state, optimizer_state, state: dict) -> None:
        staging = self.staging / f".tmp-{final.name}-{os.getpid()}"
        try:
            staging.parent.mkdir(exist_ok=True)
        except OSError:  # the folder's parent cannot be written: stage inside it, as the sync may then see
            staging = self.directory / staging.name
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        _fsync_save(model_state, staging / "model.pt")
        _fsync_save(optimizer_state, staging / "optimizer.pt")
        _fsync_save(state, staging / "state.pt")
        files = {p.name: p.stat().st_size for p in sorted(staging.iterdir())}
        manifest = {"step": state["step"], "files": files, "world_size": state["world_size"], "time": time.time()}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if final.exists():  # a torn or older run's folder of the same step
            shutil.rmtree(final)
        try:
            os.replace(staging, final)
        except OSError as error:  # beside it, but on another file system: a copy, the manifest last
            if error.errno != errno.EXDEV:
                raise
            shutil.copytree(staging, final, ignore=shutil.ignore_patterns(MANIFEST))
            shutil.copy2(staging / MANIFEST, final / MANIFEST)
            shutil.rmtree(staging)
        if staging.parent == self.staging:
            with contextlib.suppress(OSError):
                self.staging.rmdir()  # empty unless another process stages there
        self._prune()

    def _prune(self) -> None:
        """Keep the newest ``keep`` whole checkpoints; drop older ones and torn ones older than the newest."""
        complete = self.complete_checkpoints()
        for old in complete[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for folder in self.directory.glob(f"{PREFIX}*"):
            if folder not in complete and complete and folder.name < complete[-1].name:
                shutil.rmtree(folder, ignore_errors=True)

    # ---------------------------------------------------------------- loading

    def _format(self, folder: Path) -> str:
        """``sharded`` (DCP, written with FSDP) or ``full`` (DDP and one process)."""
        return json.loads((folder / MANIFEST).read_text()).get("format", "full")

    def _is_complete(self, folder: Path) -> bool:
        manifest_path = folder / MANIFEST
        if not manifest_path.is_file():
            return False
        try:
            manifest = json.loads(manifest_path.read_text())
            return all(
                (folder / name).is_file() and (folder / name).stat().st_size == size
                for name, size in manifest["files"].items()
            )
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def complete_checkpoints(self) -> list[Path]:
        """Whole checkpoints, oldest first."""
        if not self.directory.is_dir():
            return []
        folders = sorted(p for p in self.directory.iterdir() if p.is_dir() and p.name.startswith(PREFIX))
        return [p for p in folders if self._is_complete(p)]

    def _candidates(self) -> list[Path]:
        """Newest first; torn ones are reported and left out."""
        if not self.directory.is_dir():
            return []
        folders = sorted(
            (p for p in self.directory.iterdir() if p.is_dir() and p.name.startswith(PREFIX)), reverse=True
        )
        good = []
        for folder in folders:
            if self._is_complete(folder):
                good.append(folder)
            else:
                log.warning("skipping incomplete checkpoint %s (no manifest or file sizes differ)", folder)
        return good

    def load_latest(self, model, optimizer, scheduler=None) -> dict | None:
        """Restore the newest whole checkpoint into ``model``/``optimizer``/``scheduler`` and the RNGs.

        Returns ``{"step": step, "extra": extra}`` or None when there is nothing to resume from.
        Every rank must call it (all ranks see the same files: one host, or SageMaker's S3 sync).
        """
        for folder in self._candidates():
            if self._format(folder) == SHARDED:
                try:
                    state = torch.load(folder / "state.pt", map_location="cpu", weights_only=False)
                    _load_sharded(folder, model, optimizer)
                except Exception as error:  # noqa: BLE001 - DCP raises on every rank alike: try the previous one
                    log.warning("skipping unreadable checkpoint %s: %s", folder, error)
                    continue
                return self._restore_training_state(folder, state, scheduler)
            try:
                state = torch.load(folder / "state.pt", map_location="cpu", weights_only=False)
                load_full = self.learners.is_main or not is_fsdp(model)
                model_state = (
                    torch.load(folder / "model.pt", map_location="cpu", weights_only=False) if load_full else {}
                )
                optimizer_state = (
                    torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=False) if load_full else {}
                )
            except Exception as error:  # noqa: BLE001 - a damaged file means: try the previous one
                log.warning("skipping unreadable checkpoint %s: %s", folder, error)
                continue
            _load_model_state(model, model_state, self.trainable_only)
            _load_optimizer_state(model, optimizer, optimizer_state)
            return self._restore_training_state(folder, state, scheduler)
        return None

    def _restore_training_state(self, folder: Path, state: dict, scheduler) -> dict:
        if scheduler is not None and state["scheduler"] is not None:
            scheduler.load_state_dict(state["scheduler"])
        rng = state["rng"]
        if len(rng) == self.learners.world_size:
            set_rng_state(rng[self.learners.rank])
        else:
            log.warning(
                "checkpoint was written by %d processes, now %d: random state not restored",
                len(rng),
                self.learners.world_size,
            )
        log.info("resumed from %s (step %d)", folder, state["step"])
        return {"step": state["step"], "extra": state["extra"]}


# --------------------------------------------------------------------------- when to save


class CheckpointSchedule:
    """When the loop saves: every ``every_steps`` steps and/or once ``every_minutes`` have passed
    since the last save (or the start); 0 turns either off (``TrainingArgs.validate`` refuses
    negative values). Time bounds the loss in wall-clock terms, which is what an interruption
    costs, whatever a step takes.

    ``due`` is called once per step by every learner; with the time-based rule on, the learners
    agree through one all-reduce (their clocks are not read at the same instant).
    """

    def __init__(self, every_steps: int = 0, every_minutes: float = 0.0, clock=time.monotonic):
        self.every_steps = every_steps
        self.every_seconds = every_minutes * 60.0
        self.clock = clock
        self.last_save = clock()

    def due(self, step: int, learners: Learners) -> bool:
        by_steps = bool(self.every_steps) and step % self.every_steps == 0
        by_time = False
        if self.every_seconds:
            by_time = any_flag(self.clock() - self.last_save >= self.every_seconds, learners)
        if by_steps or by_time:
            self.last_save = self.clock()
        return by_steps or by_time


def save_at_step_end(
    step: int, checkpointer: Checkpointer, schedule: CheckpointSchedule, sigterm: SigtermFlag, *state, extra=None
) -> bool:
    """The end of a training step, on every learner: save ``state`` (model, optimizer, scheduler)
    when ``schedule`` says so or SIGTERM came. True when the loop must stop: SIGTERM came, and the
    checkpoint a restarted job resumes from is written."""
    stop = sigterm.should_stop(checkpointer.learners)
    if stop or schedule.due(step, checkpointer.learners):
        checkpointer.save(step, *state, extra=extra)
    if stop:
        log.warning("stopped by SIGTERM after step %d; the checkpoint resumes from here", step)
    return stop


# --------------------------------------------------------------------------- SIGTERM


class SigtermFlag:
    """Set by SIGTERM; the loop checks it once per step, saves and exits cleanly.

    It fires only where SIGTERM reaches the script: by hand, under torchrun (which passes it to its
    workers), or in an image whose entry point delivers it to the script and keeps the toolkit
    alive. SageMaker's PyTorch and Hugging Face images drop it (see the module docstring), so
    there the schedule's checkpoints are what a restarted job resumes from."""

    def __init__(self):
        self.received = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        self.received = True
        _SIGTERM_RECEIVED.set()
        log.warning("SIGTERM received: saving a checkpoint after this step, then exiting")

    def should_stop(self, learners: Learners) -> bool:
        """True on every learner once any of them got SIGTERM."""
        return any_flag(self.received, learners)
