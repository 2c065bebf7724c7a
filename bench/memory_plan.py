"""Per-GPU memory of a full fine-tune with FSDP2, bf16 compute and activation checkpointing.

The arithmetic behind "does an 8 B model fit on 8 x A100 80 GB (ml.p4de.24xlarge)?", laid out
term by term for the setup of ``scripts/common/distributed.wrap_model(strategy="fsdp")``:
every decoder layer and the root (embeddings, final norm, LM head) is a ``fully_shard`` unit,
parameters are gathered in bf16 for compute, gradients reduced in fp32, each decoder layer
recomputed in the backward pass (``recompute``: full, selective or none) and the LM head's loss
taken whole or ``loss_chunk_tokens`` at a time (``scripts/common/lm_loss.py``).

Terms (bytes on one GPU; P parameters, W GPUs, b micro-batch, s sequence length, h hidden,
i intermediate, k = key/value width, V vocabulary, L layers, m = 4 for fp32 master weights, 2 bf16):

  params          P x m / W        master weights, sharded
  grads           P x m / W        sharded gradients in the parameters' dtype
  optimizer       P x 2m / W       AdamW exp_avg + exp_avg_sq
  optimizer_step  P x m / W        the temporary of PyTorch's foreach AdamW (the square root of
                                   exp_avg_sq, one state's size, for all parameters at once)
  gathered_layers 2 layers x (2 + 2 + 4) x layer params   bf16 weights of the layer being computed and
                                   of the one prefetched, their bf16 gradients and fp32 reduce copy
  gathered_root   root params x (2 + 2)   embeddings + head gathered in bf16, and their bf16
                                   gradient: the root unit stays gathered through forward and backward
  checkpoints     what each layer keeps for the backward pass: full L x b x s x h x 2 (its bf16
                  input); selective + L x b x s x 2 (4h + 2k + 2i) (its matrix products' and
                  attention's bf16 outputs); none L x ``layer_activation_bytes``
  recomputed_layer  2 x ``layer_activation_bytes``: one layer's activations while it is
                  recomputed, and their gradients (none: the gradients only)
  head_input      b x s x h x 16   the final norm's fp32 input and output, the bf16 hidden states,
                                   their gradient and the chunked loss's copy of the target rows
  logits          n x V x 14       n = b x s, or ``loss_chunk_tokens`` chunked: bf16 logits 2, the
                                   fp32 log-softmax 4 kept by cross-entropy, and the two fp32
                                   gradients 4 + 4 alive at once in its backward
  reference       DPO's / GRPO's frozen reference model in bf16 (``models.load_reference``), when
                  there is one: ``replicated`` (every GPU a whole copy, ``--strategy ddp``) P x 2;
                  ``sharded`` (``--strategy fsdp``) P x 2 / W + root params x 2, the root unit that
                  FSDP2 keeps gathered after a forward (with no backward it stays so). Its forward
                  runs outside the policy's, so its transient layers and logits are not counted.

The terms are not all alive at once. The peak is the largest of three moments (the ``phase:``
entries), each the sum of what lives then:

  loss            params + optimizer + gathered_root + checkpoints + head_input + logits
                  (+ grads when gradient accumulation left them from an earlier micro-batch)
  layers          params + optimizer + the grads of all layers but one (all grads with
                  accumulation) + gathered_root + gathered_layers + checkpoints + recomputed_layer
  optimizer step  params + grads + optimizer + optimizer_step
  (+ reference in each)

and ``total`` adds a ``margin`` of 5 % of that peak for what is not modelled (RoPE tables, masks,
the norms' small tensors, the allocator's rounding). Refitted on measured peaks of one H200
(``torch.cuda.max_memory_allocated``, docs/BENCHMARKS.md): a 2-layer Llama-3.1-8B shape at 1 x 4096
(27.8 GiB measured, the optimizer step's moment) and a Qwen2.5-1.5B shape at 4, 8 and 16 x 2048
(34.7, 51.7, 85.7 GiB, the loss's moment): without the margin it is 0.2 % under the first and
0.9-1.3 % over the others, with it 4.8-6.4 % over (``tests/bench/test_memory_plan_arithmetic.py``). The earlier plan summed every term as if
all lived at once and counted 16 bytes a logit: 42.9 GiB for the 27.8 measured.
Not counted: the CUDA context and allocator fragmentation (``max_memory_allocated`` does not see
them either; leave ~3-5 GiB), NCCL buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class ModelShape:
    """A Llama/Qwen2-style decoder: GQA attention, SwiGLU MLP, RMSNorm."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    tied_embeddings: bool = False
    qkv_bias: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_params(self) -> int:
        h, i, kv = self.hidden_size, self.intermediate_size, self.kv_width
        attention = h * h + 2 * h * kv + h * h  # q, k, v, o
        bias = (h + 2 * kv) if self.qkv_bias else 0
        mlp = 3 * h * i  # gate, up, down
        norms = 2 * h
        return attention + bias + mlp + norms

    def root_params(self) -> int:
        """Embeddings, final norm and (untied) LM head: the root ``fully_shard`` unit."""
        embeddings = self.vocab_size * self.hidden_size
        return embeddings * (1 if self.tied_embeddings else 2) + self.hidden_size

    def total_params(self) -> int:
        return self.num_layers * self.layer_params() + self.root_params()

    def replace(self, **changes) -> ModelShape:
        return ModelShape(**{**self.__dict__, **changes})


# Llama-3.1-8B (meta-llama/Llama-3.1-8B config.json) and Qwen2.5-1.5B (Qwen/Qwen2.5-1.5B config.json).
LLAMA_3_1_8B = ModelShape(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    tied_embeddings=False,
)
QWEN2_5_1_5B = ModelShape(
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_layers=28,
    num_heads=12,
    num_kv_heads=2,
    tied_embeddings=True,
    qkv_bias=True,
)

LOGIT_BYTES = 14  # per logit at the loss's peak: bf16 logits 2 + fp32 log-softmax 4 + two fp32 gradients 4 + 4
HEAD_INPUT_BYTES = 16  # per token and hidden unit: the final norm's fp32 tensors, the hidden states, their gradient
MARGIN = 0.05  # of the peak, for what the terms leave out
RECOMPUTE = ("full", "selective", "none")


def layer_activation_bytes(shape: ModelShape, tokens: int) -> int:
    """Bytes one decoder layer keeps for its backward pass (bf16 compute, fused attention with no
    s x s matrix): per token, two RMSNorms ~10 h each (fp32 input and product, bf16 output), q, k, v
    and attention output 2 h each (k, v counted at full width: repeated for GQA), o_proj input 2 h,
    and the SwiGLU's gate, up, silu(gate) and product 2 i each: 30 h + 8 i."""
    return tokens * (30 * shape.hidden_size + 8 * shape.intermediate_size)


def selective_saved_bytes(shape: ModelShape, tokens: int) -> int:
    """What selective checkpointing keeps of one layer besides its input: the bf16 outputs of the
    matrix products (q, o, down: h; k, v: k; gate, up: i) and of attention (h)."""
    return tokens * 2 * (4 * shape.hidden_size + 2 * shape.kv_width + 2 * shape.intermediate_size)


def memory_plan(
    shape: ModelShape,
    world_size: int,
    micro_batch: int,
    seq_len: int,
    master_dtype: str = "fp32",
    prefetched_layers: int = 2,
    reference: str = "none",
    recompute: str = "full",
    loss_chunk_tokens: int = 0,
    gradient_accumulation: int = 1,
) -> dict[str, int]:
    """Bytes per GPU for each term of the module docstring, each moment's sum (``phase: ...``), the
    ``margin`` and the ``total``; ``reference``: none (SFT, GRPO with beta 0), sharded or replicated
    (a ``reference`` term is added); ``recompute`` and ``loss_chunk_tokens`` as the SFT options."""
    if master_dtype not in ("fp32", "bf16"):
        raise ValueError(f"master_dtype must be fp32 or bf16, got {master_dtype!r}")
    if reference not in ("none", "sharded", "replicated"):
        raise ValueError(f"reference must be none, sharded or replicated, got {reference!r}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    if world_size < 1 or micro_batch < 1 or seq_len < 1 or gradient_accumulation < 1 or loss_chunk_tokens < 0:
        raise ValueError(
            "world_size, micro_batch, seq_len and gradient_accumulation must be at least 1, loss_chunk_tokens at least 0"
        )
    master = 4 if master_dtype == "fp32" else 2
    params = shape.total_params()
    tokens = micro_batch * seq_len
    layer_activations = layer_activation_bytes(shape, tokens)
    gathered_unit = 2 + 2 + 4  # bf16 weights, bf16 gradients, fp32 copy for the reduce-scatter
    kept_inputs = shape.num_layers * tokens * shape.hidden_size * 2
    checkpoints = {
        "full": kept_inputs,
        "selective": kept_inputs + shape.num_layers * selective_saved_bytes(shape, tokens),
        "none": shape.num_layers * layer_activations,
    }[recompute]
    terms = {
        "params": params * master // world_size,
        "grads": params * master // world_size,
        "optimizer": 2 * params * master // world_size,
        "optimizer_step": params * master // world_size,
        "gathered_layers": min(prefetched_layers, shape.num_layers) * shape.layer_params() * gathered_unit,
        "gathered_root": shape.root_params() * (2 + 2),
        "checkpoints": checkpoints,
        "recomputed_layer": layer_activations * (1 if recompute == "none" else 2),
        "head_input": tokens * shape.hidden_size * HEAD_INPUT_BYTES,
        "logits": min(tokens, loss_chunk_tokens or tokens) * shape.vocab_size * LOGIT_BYTES,
    }
    if reference == "replicated":
        terms["reference"] = params * 2
    elif reference == "sharded":
        terms["reference"] = params * 2 // world_size + shape.root_params() * 2
    accumulating = gradient_accumulation > 1
    layer_grads = (
        terms["grads"] if accumulating else (shape.num_layers - 1) * shape.layer_params() * master // world_size
    )
    always = terms["params"] + terms["optimizer"] + terms.get("reference", 0)
    phases = {
        "phase: loss": always
        + (terms["grads"] if accumulating else 0)
        + terms["gathered_root"]
        + terms["checkpoints"]
        + terms["head_input"]
        + terms["logits"],
        "phase: layers": always
        + layer_grads
        + terms["gathered_root"]
        + terms["gathered_layers"]
        + terms["checkpoints"]
        + terms["recomputed_layer"],
        "phase: optimizer step": always + terms["grads"] + terms["optimizer_step"],
    }
    peak = max(phases.values())
    margin = int(peak * MARGIN)
    return {**terms, **phases, "margin": margin, "total": peak + margin}


def format_plan(plan: dict[str, int], title: str, capacity_gib: float | None = None) -> str:
    """The plan as a Markdown table in GiB, with the share of ``capacity_gib`` used."""
    lines = [f"### {title}", "", "| term | GiB per GPU |", "|---|---|"]
    for name, value in plan.items():
        label = f"**{name}**" if name == "total" else name
        lines.append(f"| {label} | {value / GIB:.2f} |")
    if capacity_gib:
        lines.append(f"| share of {capacity_gib:.0f} GiB | {100 * plan['total'] / GIB / capacity_gib:.0f} % |")
    return "\n".join(lines) + "\n"


def format_plans(plans: dict[str, dict[str, int]], capacity_gib: float | None = None) -> str:
    """Several plans side by side, one column each (GiB per GPU)."""
    labels = list(plans)
    lines = ["| term | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for name in next(iter(plans.values())):
        cells = [f"{plans[label][name] / GIB:.2f}" for label in labels]
        label = f"**{name}**" if name == "total" else name
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if capacity_gib:
        shares = [f"{100 * plans[label]['total'] / GIB / capacity_gib:.0f} %" for label in labels]
        lines.append(f"| share of {capacity_gib:.0f} GiB | " + " | ".join(shares) + " |")
    return "\n".join(lines) + "\n"


# Checkpoints: what each rank writes, and how long it takes. AdamW keeps two states per parameter
# in the parameters' dtype, so a checkpoint is P x master x 3 bytes however it is split up.
# Sharded (DCP, ``Checkpointer`` with FSDP) every rank writes its 1/W; gathered, rank 0 holds it
# all in host memory and writes it alone. The time is bounded by the disk (all writers share it)
# and by one process's write stream (serialisation, fsync), stated as assumptions. Not counted: the
# gather itself (the whole state through rank 0's GPU to its host memory) before a gathered write.
DISK_GB_PER_S = 2.0  # assumed: the instance's local NVMe volume under /opt/ml/checkpoints
WRITER_GB_PER_S = 1.0  # assumed: one process writing with torch.save / DCP's FileSystemWriter
SIGTERM_WINDOW_S = 120  # SIGTERM to SIGKILL in a spot interruption


def checkpoint_plan(
    shape: ModelShape,
    world_size: int,
    master_dtype: str = "fp32",
    disk_gb_per_s: float = DISK_GB_PER_S,
    writer_gb_per_s: float = WRITER_GB_PER_S,
) -> dict:
    """Bytes written per rank and expected save time, sharded against gathered to rank 0."""
    if master_dtype not in ("fp32", "bf16"):
        raise ValueError(f"master_dtype must be fp32 or bf16, got {master_dtype!r}")
    if world_size < 1 or disk_gb_per_s <= 0 or writer_gb_per_s <= 0:
        raise ValueError("world_size must be at least 1 and the bandwidths positive")
    master = 4 if master_dtype == "fp32" else 2
    state = 3 * shape.total_params() * master  # weights + exp_avg + exp_avg_sq
    per_rank = -(-state // world_size)
    disk, writer = disk_gb_per_s * 1e9, writer_gb_per_s * 1e9
    return {
        "state_bytes": state,
        "sharded_bytes_per_rank": per_rank,
        "gathered_rank0_bytes": state,
        "sharded_save_s": max(state / disk, per_rank / writer),
        "gathered_save_s": max(state / disk, state / writer),
    }


def format_checkpoint_plan(plan: dict, title: str, disk_gb_per_s: float, writer_gb_per_s: float) -> str:
    lines = [
        f"### {title}",
        "",
        f"Disk {disk_gb_per_s:g} GB/s shared by the writers, one writer {writer_gb_per_s:g} GB/s (assumed); "
        f"a spot interruption leaves {SIGTERM_WINDOW_S} s between SIGTERM and SIGKILL.",
        "",
        "| checkpoint | GB written by rank 0 | GB per other rank | rank-0 host memory for it, GB | expected save s |",
        "|---|---|---|---|---|",
    ]
    sharded, gathered = plan["sharded_bytes_per_rank"], plan["gathered_rank0_bytes"]
    lines.append(
        f"| sharded (DCP, each rank its shards) | {sharded / 1e9:.1f} | {sharded / 1e9:.1f} "
        f"| {sharded / 1e9:.1f} (staging copy, background only) | {plan['sharded_save_s']:.0f} |"
    )
    lines.append(
        f"| gathered to rank 0 | {gathered / 1e9:.1f} | 0 | {gathered / 1e9:.1f} | {plan['gathered_save_s']:.0f} |"
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world_size", type=int, default=8)
    parser.add_argument("--micro_batch", type=int, default=1)
    parser.add_argument("--seq_len", type=int, default=4096)
    parser.add_argument("--master_dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--disk_gb_per_s", type=float, default=DISK_GB_PER_S)
    parser.add_argument("--writer_gb_per_s", type=float, default=WRITER_GB_PER_S)
    parser.add_argument(
        "--reference",
        choices=["none", "sharded", "replicated"],
        default="none",
        help="DPO's or GRPO's frozen reference model: none, sharded (--strategy fsdp) or replicated",
    )
    args = parser.parse_args()
    plan = memory_plan(
        LLAMA_3_1_8B, args.world_size, args.micro_batch, args.seq_len, args.master_dtype, reference=args.reference
    )
    print(
        format_plan(
            plan,
            f"Llama-3.1-8B full fine-tune, FSDP2 over {args.world_size} GPUs, micro-batch "
            f"{args.micro_batch} x {args.seq_len} tokens, {args.master_dtype} master weights",
            80,
        )
    )
    variants = {
        f"{dtype} masters, {batch} x {length}": memory_plan(LLAMA_3_1_8B, args.world_size, batch, length, dtype)
        for dtype, batch, length in (
            ("fp32", 1, 4096),
            ("bf16", 1, 4096),
            ("fp32", 2, 4096),
            ("fp32", 1, 8192),
            ("fp32", 2, 8192),
        )
    }
    print(f"Variants over {args.world_size} GPUs (GiB per GPU):\n")
    print(format_plans(variants, 80))
    checkpoint = checkpoint_plan(
        LLAMA_3_1_8B, args.world_size, args.master_dtype, args.disk_gb_per_s, args.writer_gb_per_s
    )
    print(
        format_checkpoint_plan(
            checkpoint,
            f"Llama-3.1-8B checkpoint (model + AdamW, {args.master_dtype}) over {args.world_size} ranks",
            args.disk_gb_per_s,
            args.writer_gb_per_s,
        )
    )
    references = {
        f"reference {kind}": memory_plan(
            LLAMA_3_1_8B, args.world_size, args.micro_batch, args.seq_len, args.master_dtype, reference=kind
        )
        for kind in ("sharded", "replicated")
    }
    print(f"DPO / GRPO with a reference model over {args.world_size} GPUs (GiB per GPU):\n")
    print(format_plans(references, 80))


if __name__ == "__main__":
    main()
