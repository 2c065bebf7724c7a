"""What a checkpoint costs the training loop: a synchronous save against a background one.

For each model (``tiny`` 1.3 M and ``small`` ~25 M parameters, full fine-tuning with AdamW, on
CPU) it times, over a few rounds, in this one process with one torch thread:

  copy    copying the model and optimizer state into tensors of their own (what the loop waits
          for when the write runs in the background: ``Checkpointer(background=True)``)
  save    a synchronous ``Checkpointer.save``: state, ``torch.save`` of three files, fsync,
          rename (what the loop waits for without the background write)
  size    the checkpoint folder on disk

    python -m bench.checkpoint_save            # both models
    python -m bench.checkpoint_save --models tiny
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.fixtures import SCRIPTS_DIR, model_dir
from bench.tables import median


def measure(name: str, rounds: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    if str(SCRIPTS_DIR) not in sys.path:
        sys.path.insert(0, str(SCRIPTS_DIR))
    from common.checkpoints import Checkpointer, _model_state, _optimizer_state
    from common.distributed import single_learner

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
    return {"model": name, "parameters": parameters, "size_mb": size / 1e6,
            "copy_s": median(copies), "save_s": median(saves)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print("| model | parameters | checkpoint MB | copy s (background) | save s (synchronous) | save / copy |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        row = measure(name, args.rounds)
        print(f"| {row['model']} | {row['parameters'] / 1e6:.1f} M | {row['size_mb']:.1f} | {row['copy_s']:.3f} "
              f"| {row['save_s']:.3f} | {row['save_s'] / row['copy_s']:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
