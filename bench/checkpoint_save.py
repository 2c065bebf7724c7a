"""What a checkpoint costs the training loop: a synchronous save against a background one, and
FSDP's sharded checkpoint against gathering the full state on rank 0.

For each model (``tiny`` 1.3 M and ``small`` ~25 M parameters, full fine-tuning with AdamW, on
CPU) it times, over a few rounds, in this one process with one torch thread:

  copy    copying the model and optimizer state into tensors of their own (what the loop waits
          for when the write runs in the background: ``Checkpointer(background=True)``)
  save    a synchronous ``Checkpointer.save``: state, ``torch.save`` of three files, fsync,
          rename (what the loop waits for without the background write)
  size    the checkpoint folder on disk

``--sharded`` runs FSDP2 over 2 processes (torchrun, gloo, one torch thread each) on a stack of
MLP blocks of about 100 M parameters (AdamW: 1.2 GB of state), one process launch per way of
saving so each rank-0 peak RSS is its own:

  gathered    the full state gathered to rank 0 (``full_state_dict=True, cpu_offload=True``), which
              writes it alone (what FSDP checkpoints did before they were sharded)
  sharded     ``Checkpointer.save``: every rank writes its shards with DCP
  background  ``Checkpointer(background=True).save``: DCP's ``async_save``; the loop waits for the
              copy of its shards only, ``written`` is when the checkpoint is whole

    python -m bench.checkpoint_save            # both models
    python -m bench.checkpoint_save --models tiny
    python -m bench.checkpoint_save --sharded  # FSDP2, 2 processes, ~100 M parameters
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.fixtures import model_dir
from bench.tables import machine_description, median


def measure(name: str, rounds: int) -> dict:
    import torch
    from common.checkpoints import Checkpointer, _model_state, _optimizer_state
    from common.distributed import single_learner
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir(name))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (2, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()  # the moment estimates exist, as in any checkpoint after step 1
    learners = single_learner("cpu")
    copies, saves = [], []
    with tempfile.TemporaryDirectory(prefix="checkpoint-bench-") as folder:
        checkpointer = Checkpointer(Path(folder), learners, keep=1)
        for step in range(1, rounds + 1):
            started = time.perf_counter()
            _model_state(model, False, copy=True)
            _optimizer_state(model, optimizer, copy=True)
            copies.append(time.perf_counter() - started)
            started = time.perf_counter()
            saved = checkpointer.save(step, model, optimizer)
            saves.append(time.perf_counter() - started)
        size = sum(p.stat().st_size for p in saved.iterdir())
        shutil.rmtree(saved)
    parameters = sum(p.numel() for p in model.parameters())
    return {
        "model": name,
        "parameters": parameters,
        "size_mb": size / 1e6,
        "copy_s": median(copies),
        "save_s": median(saves),
    }


SHARDED_MODES = ("gathered", "sharded", "background")
BLOCKS, WIDTH = 12, 1024  # 12 x (1024 x 4096 up + 4096 x 1024 down) = 100.7 M parameters


def _mlp_stack():
    """About 100 M parameters in blocks FSDP2 shards one by one (``_no_split_modules``)."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
            self.down = torch.nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    class Stack(torch.nn.Module):
        _no_split_modules = ["Block"]

        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.Sequential(*(Block() for _ in range(BLOCKS)))

        def forward(self, x):
            return self.blocks(x)

    return Stack()


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def sharded_worker(mode: str, rounds: int, result_path: Path) -> None:
    """One rank of ``--sharded``: build, train a step, save ``rounds`` times the ``mode`` way."""
    import os

    import torch
    import torch.distributed as dist
    from common.checkpoints import Checkpointer
    from common.distributed import barrier, setup, teardown, wrap_model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    torch.set_num_threads(1)
    learners = setup()
    torch.manual_seed(0)
    model = wrap_model(_mlp_stack(), learners, "fsdp", activation_checkpointing=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, WIDTH)).pow(2).mean().backward()
    optimizer.step()  # the moment estimates exist, as in any checkpoint after step 1
    rss_before = _peak_rss_mb()
    waits, written = [], []
    with tempfile.TemporaryDirectory(prefix="checkpoint-bench-") as scratch:
        scratch = Path(scratch)
        folders = [None] * learners.world_size
        dist.all_gather_object(folders, str(scratch))  # rank 0's folder: one checkpoint directory for all
        root = Path(folders[0])
        checkpointer = Checkpointer(root / "checkpoints", learners, keep=1, background=mode == "background")
        for step in range(1, rounds + 1):
            barrier(learners)
            started = time.perf_counter()
            if mode == "gathered":
                model_state, optimizer_state = get_state_dict(
                    model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
                )
                if learners.is_main:
                    for name, state in (("model.pt", model_state), ("optimizer.pt", optimizer_state)):
                        with open(root / name, "wb") as handle:
                            torch.save(state, handle)
                            handle.flush()
                            os.fsync(handle.fileno())
                del model_state, optimizer_state
                barrier(learners)
                waits.append(time.perf_counter() - started)
            else:
                checkpointer.save(step, model, optimizer)
                waits.append(time.perf_counter() - started)
                checkpointer.wait()
                barrier(learners)
            written.append(time.perf_counter() - started)
        if mode == "gathered":
            rank0_bytes = sum((root / name).stat().st_size for name in ("model.pt", "optimizer.pt"))
        else:
            rank0_bytes = (checkpointer.complete_checkpoints()[-1] / "__0_0.distcp").stat().st_size
        barrier(learners)
    if learners.is_main:
        parameters = sum(p.numel() for p in model.parameters())  # FSDP2 DTensors: the global count
        result_path.write_text(
            json.dumps(
                {
                    "mode": mode,
                    "processes": learners.world_size,
                    "parameters": parameters,
                    "wait_s": median(waits),
                    "written_s": median(written),
                    "rank0_mb": rank0_bytes / 1e6,
                    "rss_before_mb": rss_before,
                    "rss_peak_mb": _peak_rss_mb(),
                }
            )
        )
    teardown()


def measure_sharded(mode: str, rounds: int, processes: int = 2) -> dict:
    import os
    import subprocess

    from bench.fixtures import REPO_ROOT

    torchrun = str(Path(sys.executable).parent / "torchrun")
    with tempfile.TemporaryDirectory(prefix="checkpoint-bench-") as folder:
        result = Path(folder) / "result.json"
        command = [
            torchrun,
            "--standalone",
            "--nproc_per_node",
            str(processes),
            "-m",
            "bench.checkpoint_save",
            "--worker",
            mode,
            "--rounds",
            str(rounds),
            "--result",
            str(result),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        run = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800)
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
        return json.loads(result.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sharded", action="store_true", help="FSDP2 over 2 processes: gathered vs sharded")
    parser.add_argument("--worker", choices=SHARDED_MODES, help=argparse.SUPPRESS)  # one rank, under torchrun
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        sharded_worker(args.worker, args.rounds, args.result)
        return
    # One torch thread in every process it times (each rank's, and this one's).
    print(f"Machine: {machine_description(os.getloadavg(), threads=1)}\n", flush=True)
    if args.sharded:
        print(
            "| FSDP2 checkpoint | processes | parameters | training waits s | whole after s | rank-0 MB written "
            "| rank-0 peak RSS MB (before saving) |"
        )
        print("|---|---|---|---|---|---|---|")
        for mode in SHARDED_MODES:
            row = measure_sharded(mode, min(args.rounds, 3))
            print(
                f"| {row['mode']} | {row['processes']} | {row['parameters'] / 1e6:.1f} M | {row['wait_s']:.2f} "
                f"| {row['written_s']:.2f} | {row['rank0_mb']:.0f} | {row['rss_peak_mb']:.0f} "
                f"({row['rss_before_mb']:.0f}) |",
                flush=True,
            )
        return
    print("| model | parameters | checkpoint MB | copy s (background) | save s (synchronous) | save / copy |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        row = measure(name, args.rounds)
        print(
            f"| {row['model']} | {row['parameters'] / 1e6:.1f} M | {row['size_mb']:.1f} | {row['copy_s']:.3f} "
            f"| {row['save_s']:.3f} | {row['save_s'] / row['copy_s']:.1f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
