"""fp32 against bf16 on this machine's CPU: the training jobs and the training sessions.

    python -m bench.cpu_precision [--models tiny smollm2] [--rounds 3] [--threads 1]

For each model:
  * **jobs** (``CPU_MIXED_PRECISION``, ``scripts/common/distributed.py``): a full-weight forward and
    backward of ``JOB_ROWS`` x ``JOB_LENGTH`` tokens under ``distributed.autocast``, and a rollout of
    ``JOB_ROWS * 6`` completions of ``JOB_NEW_TOKENS`` tokens through ``HFGenerator``, seconds;
  * **sessions** (``SAGEMAKER_LOCAL_SESSION_PRECISION``, the engine the endpoint runs, in-process):
    one cross-entropy ``forward_backward`` and one ``forward`` of ``DATUMS`` datums of ``LENGTH``
    tokens (a DPO or SFT step's micro-batch), LoRA on every linear layer, seconds. Session sampling
    is fp32 in both precisions (``Engine.computing`` says why), so it is not measured here.
Every figure is the median of ``rounds`` runs with its min-max spread and the load average (1 min)
over them. bf16 is faster only on a CPU that multiplies bfloat16 in hardware (the notes say whether
this one does: AVX512-BF16 or AMX); elsewhere PyTorch converts, and it is slower.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from bench.tables import Row, format_table, machine_description
from bench.training_sessions_sampling import RANK, installed

DATUMS, LENGTH = 8, 192
JOB_ROWS, JOB_LENGTH, JOB_NEW_TOKENS = 4, 200, 48
PRECISIONS = ("fp32", "bf16")


def engine_for(path: str, precision: str):
    from local_mode.session_service.engine import Engine

    engine = Engine(path, RANK, 2 * RANK, precision=precision)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained-looking adapter: B is zero at initialisation
        for _, param in engine.named_trainable:
            param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    return engine


def datums(vocab: int) -> list[dict]:
    rng = random.Random(0)
    out = []
    for _ in range(DATUMS):
        tokens = [rng.randrange(vocab) for _ in range(LENGTH + 1)]
        wire = {"dtype": "float32", "shape": [LENGTH]}
        out.append(
            {
                "modelInput": {"chunks": [{"tokens": tokens[:-1], "type": "encoded_text"}]},
                "lossFnInputs": {
                    "target_tokens": {"data": tokens[1:], "dtype": "int64", "shape": [LENGTH]},
                    "weights": {**wire, "data": [1.0] * LENGTH},
                },
            }
        )
    return out


def seconds(engine, batch: list[dict], backward: bool) -> float:
    started = time.perf_counter()
    engine.forward_backward("cross_entropy", batch, {}, backward=backward)
    elapsed = time.perf_counter() - started
    engine.optimizer.zero_grad(set_to_none=True)  # no step: every round sees the same weights
    return elapsed


def job_seconds(path: str, precision: str, rounds: int) -> dict[str, list[float]]:
    """Full-weight forward+backward and a rollout under the scripts' own ``distributed.autocast``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.fixtures import SCRIPTS_DIR

    if str(SCRIPTS_DIR) not in __import__("sys").path:
        __import__("sys").path.insert(0, str(SCRIPTS_DIR))
    from common import distributed, generation

    os.environ["CPU_MIXED_PRECISION"] = "bf16" if precision == "bf16" else "no"
    learners = distributed.single_learner("cpu")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    generator = generation.HFGenerator(model, tokenizer, learners, max_new_tokens=JOB_NEW_TOKENS, stop_ids=[])
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (JOB_ROWS, JOB_LENGTH), generator=torch.Generator().manual_seed(0))
    prompts = [row[:60].tolist() for row in ids]
    out = {"forward and backward": [], "rollout": []}
    for round_index in range(rounds + 1):  # the first round warms up
        started = time.perf_counter()
        with distributed.autocast(learners):
            loss = model(ids).logits.float().log_softmax(-1).mean()
        loss.backward()
        model.zero_grad(set_to_none=True)
        middle = time.perf_counter()
        torch.manual_seed(round_index)
        generator.generate(prompts, group_size=6)
        if round_index:
            out["forward and backward"].append(middle - started)
            out["rollout"].append(time.perf_counter() - middle)
    os.environ.pop("CPU_MIXED_PRECISION")
    return out


def measure(models: list[str], rounds: int = 3, threads: int = 1, log=print) -> list[Row]:
    from local_mode.jobs.hosts import native_bf16

    torch.set_num_threads(threads)
    hardware = "this CPU multiplies bf16 in hardware" if native_bf16() else "this CPU has no bf16 instructions"
    rows = []
    for name, path in installed(models, log):
        figures = {precision: {"forward_backward": [], "forward": []} for precision in PRECISIONS}
        loads = []
        for precision in PRECISIONS:
            engine = engine_for(path, precision)
            batch = datums(engine.model.config.vocab_size)
            seconds(engine, batch[:2], backward=True)  # warm-up: first-call allocations, kernel selection
            for round_index in range(rounds):
                load = os.getloadavg()[0]
                for way in ("forward_backward", "forward"):
                    figures[precision][way].append(seconds(engine, batch, backward=way == "forward_backward"))
                loads.append((load + os.getloadavg()[0]) / 2)
                log(
                    f"  precision {name} {precision}, round {round_index + 1}: forward_backward "
                    f"{figures[precision]['forward_backward'][-1]:.2f} s, forward "
                    f"{figures[precision]['forward'][-1]:.2f} s (load {loads[-1]:.1f})"
                )
            del engine
        load = os.getloadavg()[0]
        jobs = {precision: job_seconds(path, precision, rounds) for precision in PRECISIONS}
        loads.append((load + os.getloadavg()[0]) / 2)
        notes = f"median of {rounds}; {threads} thread(s); load {min(loads):.1f}-{max(loads):.1f}; {hardware}"
        for way, case in (
            ("forward and backward", f"{JOB_ROWS} x {JOB_LENGTH} tokens, all weights"),
            ("rollout", f"{JOB_ROWS * 6} completions x {JOB_NEW_TOKENS} tokens, HFGenerator"),
        ):
            bf16, fp32 = jobs["bf16"][way], jobs["fp32"][way]
            log(
                f"  precision {name} job {way}: bf16 {statistics.median(bf16):.2f} s, fp32 {statistics.median(fp32):.2f} s"
            )
            rows.append(
                Row(
                    "jobs: CPU_MIXED_PRECISION=bf16",
                    f"{name}, {way} of {case}",
                    statistics.median(bf16),
                    "s",
                    statistics.median(fp32),
                    "fp32",
                    notes=f"{notes}; spread {min(bf16):.3g}-{max(bf16):.3g} vs {min(fp32):.3g}-{max(fp32):.3g}",
                )
            )
        for way in ("forward_backward", "forward"):
            bf16, fp32 = figures["bf16"][way], figures["fp32"][way]
            rows.append(
                Row(
                    "sessions: precision bf16",
                    f"{name}, {way} of {DATUMS} x {LENGTH} tokens, LoRA r{RANK}",
                    statistics.median(bf16),
                    "s",
                    statistics.median(fp32),
                    "fp32",
                    notes=f"{notes}; spread {min(bf16):.3g}-{max(bf16):.3g} vs {min(fp32):.3g}-{max(fp32):.3g}",
                )
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the main job gives the service 1 or 2)")
    args = parser.parse_args()
    machine = machine_description(os.getloadavg(), threads=args.threads)
    print(format_table(measure(args.models, args.rounds, args.threads), "fp32 against bf16 (CPU)", machine))


if __name__ == "__main__":
    main()
