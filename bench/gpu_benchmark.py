"""GPU benchmark: SFT throughput and MFU at a realistic size, GRPO step time against TRL, and the
memory plan of an 8 B full fine-tune checked against a measured run. No download: weights are
random from a configuration, token ids random (SFT) or from the tiny offline tokenizer (GRPO).

    python -m bench.gpu_benchmark                              # one H100/H200, < 10 minutes
    torchrun --nproc_per_node 8 -m bench.gpu_benchmark         # ml.p4de.24xlarge / ml.p5.48xlarge (SFT only)
    python -m bench.gpu_benchmark --smoke                      # CPU, tiny shapes, a couple of steps

The project is installed in the environment first (``pip install --no-deps -e .``, as the Makefile does).

1. SFT: a Qwen2.5-1.5B-shaped model, fp32 master weights, FSDP2 ``fully_shard`` per decoder layer
   with bf16 compute and activation checkpointing (``common.distributed.wrap_model(strategy="fsdp")``),
   AdamW and the loss of ``sft.py`` (``models.build_optimizer``, ``sft.batch_loss_sum``). Tokens/s
   over all GPUs and MFU = 6 x parameters x tokens/s (+ causal attention) / (GPUs x peak bf16
   FLOP/s); recomputation is not counted as useful work. Goal: MFU >= 40 % on H100/H200.
1b. The SFT options before and after, in this one process on this one card: Qwen2.5-0.5B-, 1.5B-
   and 3B-shaped models at micro-batches ``--options_micro_batches`` (2 and 4) x ``--seq_len``,
   each with today's defaults (full recomputation, whole logits), with ``--loss_chunk_tokens 2048``,
   and with that and ``--activation_checkpointing selective`` (``SFT_OPTIONS``): tokens/s, MFU, and
   the measured peak memory against ``bench.memory_plan``'s prediction for the same options.
2. GRPO (one process only): ``grpo.train`` against TRL's ``GRPOTrainer``, both sampling with
   transformers ``generate``, same model (Qwen2.5-0.5B-shaped, random, tiny tokenizer), prompts,
   group size and lengths; step time split into generation, reward and the rest, alternating
   runs. Goal: our step no slower than TRL's.
3. Memory: the per-GPU plan of a Llama-3.1-8B full fine-tune on 8 x A100 80 GB with FSDP2
   (``bench.memory_plan``), and the same arithmetic for a 2-layer Llama-3.1-8B-shaped model on this
   device, compared with ``torch.cuda.max_memory_allocated`` of one real step (one process).

Writes the tables to ``--out`` (default ``outputs/bench/gpu_benchmark.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from bench.memory_plan import GIB, LLAMA_3_1_8B, QWEN2_5_1_5B, ModelShape, format_plan, memory_plan
from bench.tables import Row, format_table, machine_description, median, peak_rss_mib

REPO_ROOT = Path(__file__).resolve().parent.parent

# Dense bf16 peak of one GPU, FLOP/s (NVIDIA data sheets, SXM parts).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}

QWEN2_5_0_5B_LAYOUT = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2
)
SMOKE_SHAPE = ModelShape(
    vocab_size=2048,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    tied_embeddings=True,
    qkv_bias=True,
)


def qwen2_config(shape: ModelShape, **overrides):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        tie_word_embeddings=shape.tied_embeddings,
        max_position_embeddings=32768,
        use_cache=False,
        **overrides,
    )


def llama_config(shape: ModelShape):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        tie_word_embeddings=shape.tied_embeddings,
        max_position_embeddings=131072,
        use_cache=False,
        rope_theta=500000.0,
    )


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """Model FLOPs of one trained token: 6 x (parameters but the embedding lookup) for the matrix
    products forward and backward, plus causal attention's 6 x layers x seq_len x hidden."""
    matmul_params = shape.total_params() - shape.vocab_size * shape.hidden_size * (0 if shape.tied_embeddings else 1)
    return 6 * matmul_params + 6 * shape.num_layers * seq_len * shape.hidden_size


def params_label(shape: ModelShape) -> str:
    count = shape.total_params()
    return f"{count / 1e9:.2f} B" if count >= 1e9 else f"{count / 1e6:.2f} M"


def memory_now(device: torch.device) -> float:
    """Peak memory in MiB: allocated by torch on GPU, the process's RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_mib()


def reset_peak(device: torch.device) -> None:
    import gc

    gc.collect()  # the previous run's model and optimizer, held by reference cycles
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# --------------------------------------------------------------------------- process group


def start_process_group():
    """FSDP2 needs a process group even for one process; torchrun's variables when present."""
    from common import distributed

    if "WORLD_SIZE" not in os.environ:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ.update(
            {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        )
    learners = distributed.setup()
    if not dist.is_initialized():
        backend = "nccl" if learners.device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, device_id=learners.device if backend == "nccl" else None)
    return learners


# --------------------------------------------------------------------------- 1. SFT throughput


def train_steps_fsdp(
    model,
    learners,
    micro_batch: int,
    seq_len: int,
    vocab_size: int,
    steps: int,
    gradient_accumulation: int = 1,
    loss_chunk_tokens: int = 0,
) -> list[float]:
    """``steps`` SFT optimizer steps on random tokens with sft.py's loss (``sft.batch_loss_sum``,
    whole or chunked) and optimizer; seconds each."""
    import sft
    from common import distributed, models

    optimizer = models.build_optimizer(model, lr=1e-5, weight_decay=0.0)
    generator = torch.Generator(device="cpu").manual_seed(learners.rank)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        for micro_step in range(gradient_accumulation):
            input_ids = torch.randint(0, vocab_size, (micro_batch, seq_len), generator=generator).to(learners.device)
            batch = {"input_ids": input_ids, "attention_mask": None, "labels": input_ids}
            with distributed.gradient_sync(model, micro_step == gradient_accumulation - 1):
                with distributed.autocast(learners):
                    loss_sum, count = sft.batch_loss_sum(model, batch, loss_chunk_tokens)
                (loss_sum / count / gradient_accumulation).backward()
                del loss_sum
        distributed.clip_grad_norm(model, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if learners.device.type == "cuda":
            torch.cuda.synchronize(learners.device)
        times.append(time.perf_counter() - started)
    return times


def measure_sft(
    learners,
    shape: ModelShape,
    micro_batch: int,
    seq_len: int,
    warmup: int,
    steps: int,
    recompute: str = "full",
    loss_chunk_tokens: int = 0,
) -> tuple[float, float | None, float]:
    """Tokens/s over all GPUs, MFU (None without a known peak) and peak memory in MiB of FSDP2 SFT
    steps of a random ``shape`` model with the given recomputation and loss chunking."""
    from common import distributed
    from transformers import Qwen2ForCausalLM

    reset_peak(learners.device)
    torch.manual_seed(0)
    with torch.device(learners.device):  # built where it trains: no 6 GB copy from the CPU
        model = Qwen2ForCausalLM(qwen2_config(shape))
    model.train()
    model = distributed.wrap_model(model, learners, "fsdp", activation_checkpointing=recompute)  # FSDP2 + bf16
    times = train_steps_fsdp(
        model, learners, micro_batch, seq_len, shape.vocab_size, warmup + steps, loss_chunk_tokens=loss_chunk_tokens
    )[warmup:]
    memory = memory_now(learners.device)
    del model
    step_time = median(times)
    tokens_per_s = learners.world_size * micro_batch * seq_len / step_time
    peak = peak_flops(learners.device)
    mfu = flops_per_token(shape, seq_len) * tokens_per_s / (learners.world_size * peak) if peak else None
    return tokens_per_s, mfu, memory


def sft_benchmark(
    learners, shape: ModelShape, micro_batch: int, seq_len: int, warmup: int, steps: int, log
) -> list[Row]:
    tokens_per_s, mfu, memory = measure_sft(learners, shape, micro_batch, seq_len, warmup, steps)
    step_time = learners.world_size * micro_batch * seq_len / tokens_per_s
    log(
        f"SFT {params_label(shape)}: {step_time:.3f} s/step, {tokens_per_s:.0f} tokens/s, "
        f"MFU {'-' if mfu is None else f'{100 * mfu:.1f} %'}, peak memory {memory:.0f} MiB"
    )
    case = (
        f"{params_label(shape)} params, {learners.world_size} x {learners.device.type}, "
        f"micro-batch {micro_batch} x {seq_len} tokens"
    )
    kind = "max allocated" if learners.device.type == "cuda" else "RSS"
    precision = "bf16 compute" if learners.device.type == "cuda" else "fp32 (CPU)"
    how = f"median of {steps} steps after {warmup} warm-up; FSDP2, {precision}, activation checkpointing"
    return [
        Row("sft throughput", case, tokens_per_s, "tokens/s", memory_mib=memory, memory_kind=kind, notes=how),
        Row(
            "sft MFU",
            case,
            None if mfu is None else 100 * mfu,
            "%",
            memory_kind=kind,
            notes="goal >= 40 % on H100/H200" if mfu is not None else "no bf16 peak known for this device",
        ),
    ]


# --------------------------------------------------------------------------- 1b. the SFT options, before and after

# Three sizes of the Qwen2.5 family (config.json of Qwen/Qwen2.5-0.5B and -3B; 1.5B in bench.memory_plan).
QWEN2_5_0_5B = ModelShape(151936, 896, 4864, 24, 14, 2, tied_embeddings=True, qkv_bias=True)
QWEN2_5_3B = ModelShape(151936, 2048, 11008, 36, 16, 2, tied_embeddings=True, qkv_bias=True)
# (label, recompute, loss_chunk_tokens): today's defaults first, then the new options alone and together.
SFT_OPTIONS = [
    ("before: full recompute, whole logits", "full", 0),
    ("after: full recompute, loss chunks of 2048", "full", 2048),
    ("after: selective recompute, loss chunks of 2048", "selective", 2048),
]


def sft_options_benchmark(
    learners, shapes: dict[str, ModelShape], micro_batches: list[int], seq_len: int, warmup: int, steps: int, log
) -> list[Row]:
    """Every shape x micro-batch x ``SFT_OPTIONS`` in this one process on this one card: tokens/s, MFU
    and peak memory, against the memory plan's prediction for the same options."""
    rows = []
    kind = "max allocated" if learners.device.type == "cuda" else "RSS"
    for name, shape in shapes.items():
        for micro_batch in micro_batches:
            for label, recompute, chunk in SFT_OPTIONS:
                case = f"{name}, micro-batch {micro_batch} x {seq_len}, {label}"
                plan = memory_plan(
                    shape, learners.world_size, micro_batch, seq_len, recompute=recompute, loss_chunk_tokens=chunk
                )
                try:
                    tokens_per_s, mfu, memory = measure_sft(
                        learners, shape, micro_batch, seq_len, warmup, steps, recompute, chunk
                    )
                except torch.OutOfMemoryError:
                    reset_peak(learners.device)
                    log(f"SFT {case}: out of memory (planned {plan['total'] / GIB:.1f} GiB)")
                    rows.append(
                        Row(
                            "sft options",
                            case,
                            None,
                            "tokens/s",
                            plan["total"] / GIB,
                            "plan GiB",
                            notes="out of memory",
                        )
                    )
                    continue
                log(
                    f"SFT {case}: {tokens_per_s:.0f} tokens/s, MFU {'-' if mfu is None else f'{100 * mfu:.1f} %'}, "
                    f"peak {memory / 1024:.2f} GiB, planned {plan['total'] / GIB:.2f} GiB"
                )
                rows.append(
                    Row(
                        "sft options",
                        case,
                        tokens_per_s,
                        "tokens/s",
                        memory_mib=memory,
                        memory_kind=kind,
                        notes=f"MFU {'-' if mfu is None else f'{100 * mfu:.1f} %'}",
                    )
                )
                rows.append(
                    Row(
                        "sft options: memory",
                        case,
                        memory / 1024,
                        "GiB",
                        plan["total"] / GIB,
                        "plan",
                        notes=f"measured {kind} / predicted",
                    )
                )
    return rows


# --------------------------------------------------------------------------- 3. memory plan check


def memory_check(learners, shape: ModelShape, micro_batch: int, seq_len: int, log) -> list[Row]:
    """Predict, then measure, one process's peak over two FSDP2 steps of ``shape`` (the second step
    has the optimizer's states)."""
    from common import distributed
    from transformers import LlamaForCausalLM

    plan = memory_plan(shape, world_size=learners.world_size, micro_batch=micro_batch, seq_len=seq_len)
    name = "Llama-3.1-8B" if shape.hidden_size == LLAMA_3_1_8B.hidden_size else "smoke"
    case = f"{shape.num_layers}-layer {name} shape ({params_label(shape)}), micro-batch {micro_batch} x {seq_len}"
    if learners.device.type != "cuda":
        log(f"memory plan check: predicted {plan['total'] / GIB:.2f} GiB; no CUDA device to measure on")
        return [
            Row(
                "memory plan check",
                case,
                None,
                "GiB",
                plan["total"] / GIB,
                "plan",
                notes="measured only on a CUDA device (torch.cuda.max_memory_allocated)",
            )
        ]
    reset_peak(learners.device)
    torch.manual_seed(0)
    with torch.device(learners.device):
        model = LlamaForCausalLM(llama_config(shape))
    model.train()
    model = distributed.wrap_model(model, learners, "fsdp")
    train_steps_fsdp(model, learners, micro_batch, seq_len, shape.vocab_size, steps=2)
    measured = torch.cuda.max_memory_allocated(learners.device)
    del model
    reset_peak(learners.device)
    log(f"memory plan check: predicted {plan['total'] / GIB:.2f} GiB, measured {measured / GIB:.2f} GiB")
    return [
        Row(
            "memory plan check",
            case,
            measured / GIB,
            "GiB",
            plan["total"] / GIB,
            "plan",
            memory_mib=measured / 2**20,
            memory_kind="max allocated",
            notes="ours = measured max_memory_allocated; ratio = measured / predicted",
        )
    ]


# --------------------------------------------------------------------------- 2. GRPO vs TRL


def build_grpo_model(out_dir: Path, smoke: bool) -> Path:
    """A random Qwen2 model with the tiny tokenizer (Qwen2.5-0.5B layout, or the smoke shape)."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from local_mode.tiny_model import tiny_model_dir

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    layout = (
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        if smoke
        else QWEN2_5_0_5B_LAYOUT
    )
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        **layout,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def grpo_benchmark(device: torch.device, smoke: bool, rounds: int, warmup: int, steps: int, log) -> list[Row]:
    from bench import train_steps
    from bench.fixtures import uniform_data_dir

    settings = dict(train_steps.SETTINGS["grpo"])
    if smoke:
        settings.update(prompts_per_step=2, group_size=2, micro_batch_size=4, max_new_tokens=8)
    else:
        settings.update(prompts_per_step=8, group_size=8, micro_batch_size=16, max_new_tokens=128)
    data = uniform_data_dir() / "gsm8k"
    runs = {"ours": [], "trl": []}
    with tempfile.TemporaryDirectory(prefix="gpu-bench-grpo-") as work:
        work = Path(work)
        model_path = build_grpo_model(work / "model", smoke)
        total = warmup + 1 + steps  # +1: the first step has no start mark
        for round_index in range(rounds):
            for impl in ("ours", "trl") if round_index % 2 == 0 else ("trl", "ours"):
                reset_peak(device)
                runner = train_steps.run_ours if impl == "ours" else train_steps.run_trl
                result = runner("grpo", model_path, data, total, work / f"{impl}-{round_index}", settings, str(device))
                for key in ("step_times", "gen_times", "reward_times"):
                    result[key] = result[key][warmup:]
                result["memory"] = memory_now(device)
                runs[impl].append(result)
                log(
                    f"GRPO {impl} round {round_index + 1}: {median(result['step_times']):.3f} s/step "
                    f"(generation {median(result['gen_times']):.3f} s), peak memory {result['memory']:.0f} MiB"
                )
    kind = "max allocated" if device.type == "cuda" else "RSS"
    case = (
        f"{'smoke' if smoke else 'Qwen2.5-0.5B layout'}, {settings['prompts_per_step']} prompts x "
        f"{settings['group_size']}, {settings['max_new_tokens']} new tokens, {device.type}"
    )
    rows = []
    parts = {}
    for impl in ("ours", "trl"):
        pooled = {
            key: [v for run in runs[impl] for v in run[key]] for key in ("step_times", "gen_times", "reward_times")
        }
        rest = [
            s - g - r
            for s, g, r in zip(pooled["step_times"], pooled["gen_times"], pooled["reward_times"], strict=False)
        ]
        parts[impl] = (
            median(pooled["step_times"]),
            median(pooled["gen_times"]),
            median(pooled["reward_times"]),
            median(rest),
            max(run["memory"] for run in runs[impl]),
        )
    how = f"median of {rounds}x{steps} steps after {warmup} warm-up, alternating; both with transformers generate"
    rows.append(
        Row(
            "grpo step",
            case,
            parts["ours"][0],
            "s/step",
            parts["trl"][0],
            "TRL GRPOTrainer",
            parts["ours"][4],
            parts["trl"][4],
            kind,
            notes=how,
        )
    )
    for index, part in ((1, "generation"), (2, "reward"), (3, "training (log-probs, loss, backward, step)")):
        rows.append(
            Row(
                f"grpo step: {part}", case, parts["ours"][index], "s/step", parts["trl"][index], "TRL", memory_kind=kind
            )
        )
    return rows


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and a couple of steps (runs on CPU)")
    parser.add_argument("--micro_batch", type=int, default=4, help="SFT sequences per GPU per step (default: 4)")
    parser.add_argument("--seq_len", type=int, default=2048, help="SFT sequence length (default: 2048)")
    parser.add_argument("--warmup", type=int, default=3, help="SFT steps not measured (default: 3)")
    parser.add_argument("--steps", type=int, default=10, help="SFT steps measured (default: 10)")
    parser.add_argument("--grpo_rounds", type=int, default=2, help="alternations of ours and TRL (default: 2)")
    parser.add_argument("--grpo_steps", type=int, default=3, help="GRPO steps measured per run (default: 3)")
    parser.add_argument(
        "--options_micro_batches",
        type=int,
        nargs="+",
        default=[2, 4],
        help="SFT options section: micro-batches tried at every size (default: 2 4)",
    )
    parser.add_argument("--options_steps", type=int, default=3, help="SFT options: steps measured per run (default: 3)")
    parser.add_argument("--plan_micro_batch", type=int, default=1, help="8 B plan: sequences per GPU (default: 1)")
    parser.add_argument("--plan_seq_len", type=int, default=4096, help="8 B plan: sequence length (default: 4096)")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["sft", "options", "grpo", "memory"], help="sections to leave out"
    )
    parser.add_argument("--out", default=str(REPO_ROOT / "outputs" / "bench" / "gpu_benchmark.md"))
    args = parser.parse_args(argv)
    if args.smoke:
        args.micro_batch, args.seq_len, args.warmup, args.steps = 2, 32, 1, 1
        args.grpo_rounds, args.grpo_steps = 1, 1
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    torchrun = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    is_main = int(os.environ.get("RANK", 0)) == 0
    log = print if is_main else (lambda *a, **k: None)
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
    machine = machine_description(os.getloadavg()) + (
        f"; {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    )

    rows: list[Row] = []
    # GRPO first, in this process before any process group exists (TRL's accelerate would see one).
    if "grpo" not in args.skip:
        if torchrun:
            log("GRPO: skipped under torchrun; run this script with plain python on one GPU for it")
        else:
            rows += grpo_benchmark(device, args.smoke, args.grpo_rounds, 0 if args.smoke else 1, args.grpo_steps, log)

    learners = start_process_group()
    sft_shape = SMOKE_SHAPE if args.smoke else QWEN2_5_1_5B
    if "sft" not in args.skip:
        rows += sft_benchmark(learners, sft_shape, args.micro_batch, args.seq_len, args.warmup, args.steps, log)
    if "options" not in args.skip:
        shapes = (
            {f"smoke {layers}-layer": SMOKE_SHAPE.replace(num_layers=layers) for layers in (1, 2, 3)}
            if args.smoke
            else {
                "Qwen2.5-0.5B shape": QWEN2_5_0_5B,
                "Qwen2.5-1.5B shape": QWEN2_5_1_5B,
                "Qwen2.5-3B shape": QWEN2_5_3B,
            }
        )
        micro_batches = [1, 2] if args.smoke else args.options_micro_batches
        rows += sft_options_benchmark(
            learners,
            shapes,
            micro_batches,
            args.seq_len,
            1 if args.smoke else 2,
            1 if args.smoke else args.options_steps,
            log,
        )
    plan_shape = LLAMA_3_1_8B if not args.smoke else SMOKE_SHAPE.replace(num_layers=8)
    plan = memory_plan(plan_shape, world_size=8, micro_batch=args.plan_micro_batch, seq_len=args.plan_seq_len)
    if "memory" not in args.skip and learners.world_size == 1:
        check_shape = LLAMA_3_1_8B.replace(num_layers=2) if not args.smoke else SMOKE_SHAPE
        rows += memory_check(
            learners, check_shape, args.plan_micro_batch, args.plan_seq_len if not args.smoke else 32, log
        )
    dist.barrier()
    dist.destroy_process_group()
    if not is_main:
        return Path(args.out)

    text = [
        f"# GPU benchmark{' (smoke run, tiny shapes)' if args.smoke else ''}",
        "",
        format_table(rows, "Measured", machine),
        "",
        format_plan(
            plan,
            f"{'Smoke shape' if args.smoke else 'Llama-3.1-8B'} full fine-tune on 8 x A100 80 GB "
            f"(ml.p4de.24xlarge): FSDP2, bf16 compute, fp32 master weights, activation "
            f"checkpointing, micro-batch {args.plan_micro_batch} x {args.plan_seq_len} tokens",
            80,
        ),
    ]
    bf16_plan = memory_plan(
        plan_shape, world_size=8, micro_batch=args.plan_micro_batch, seq_len=args.plan_seq_len, master_dtype="bf16"
    )
    text.append(f"\nWith bf16 master weights and AdamW states: {bf16_plan['total'] / GIB:.2f} GiB per GPU.\n")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text))
    (out.with_suffix(".json")).write_text(json.dumps([row.to_dict() for row in rows], indent=1))
    print("\n".join(text))
    print(f"written to {out}")
    return out


if __name__ == "__main__":
    main()
