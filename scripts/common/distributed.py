"""Who trains together, and how the model is shared between them.

``torchrun`` (started by the SageMaker toolkit when the estimator has
``distribution={"torch_distributed": {"enabled": True}}``) sets ``RANK``, ``LOCAL_RANK`` and
``WORLD_SIZE`` for every process; a plain ``python script.py`` is one learner.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger("common")


@dataclass(frozen=True)
class Learners:
    """The processes that train one model together (one per GPU, or one per CPU process)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0 prints metrics, writes checkpoints and saves the final model."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when gradients must be averaged over processes."""
        return self.world_size > 1


def single_learner(device: torch.device | str | None = None) -> Learners:
    """One learner on ``device`` (default: this process's GPU if any, else CPU)."""
    if device is None:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    return Learners(rank=0, world_size=1, local_rank=0, device=torch.device(device))


# Instance families with EFA, and the settings the toolkit does not always make.
# FI_EFA_USE_DEVICE_RDMA: GPUDirect RDMA (p4d/p4de/p5); FI_PROVIDER=efa: use EFA, not TCP, in libfabric;
# FI_EFA_FORK_SAFE: data-loader workers fork after libfabric has registered memory.
_EFA_SETTINGS = {
    "ml.p4d.": {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"},
    "ml.p4de.": {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"},
    "ml.p5": {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"},
}


def configure_efa() -> dict[str, str]:
    """Set EFA variables for the instance type in ``SM_CURRENT_INSTANCE_TYPE`` (never overriding
    what is already set) and log them. Returns what was set."""
    instance = os.environ.get("SM_CURRENT_INSTANCE_TYPE", "")
    applied = {}
    for prefix, settings in _EFA_SETTINGS.items():
        if instance.startswith(prefix):
            for key, value in settings.items():
                if key not in os.environ:
                    os.environ[key] = value
                    applied[key] = value
            log.info("EFA settings for %s: %s", instance, " ".join(f"{k}={os.environ[k]}" for k in settings))
    return applied


def setup() -> Learners:
    """Start this process's part of the job and return who trains together."""
    configure_efa()
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        device = torch.device(f"cuda:{local_rank}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        cpu_mixed_precision()  # a bad value stops the job here, with the fix
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
        log.info("rank %d/%d (local %d) on %s, backend %s", rank, world_size, local_rank, device, backend)
    if rank == 0:
        from common import contract

        log.info(
            "host %s of %s, instance %s, %d GPUs per host, %d learners in all",
            contract.current_host(),
            contract.hosts(),
            contract.instance_type(),
            contract.num_gpus(),
            world_size,
        )
    return Learners(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


@contextlib.contextmanager
def started():
    """``with distributed.started() as learners:``: ``setup()``, and ``teardown()`` however the block ends."""
    try:
        yield setup()
    finally:
        teardown()


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# Selective activation checkpointing keeps what these operators return (the matrix products of the
# projections and the MLP, and attention) and recomputes the rest of a layer (norms, RoPE, SiLU, the
# elementwise products): almost all of the recomputation's arithmetic is saved, for the memory of
# those outputs. (PyTorch's selective checkpointing API, as in torchtitan's "op" policy.)
_SAVED_BY_SELECTIVE = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}
RECOMPUTE = ("full", "selective", "none")


def _keep_matrix_products(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _SAVED_BY_SELECTIVE else CheckpointPolicy.PREFER_RECOMPUTE


def enable_activation_checkpointing(model: torch.nn.Module, recompute: str = "full") -> None:
    """Recompute each decoder layer's activations in the backward pass instead of keeping them.

    full:      keep only each layer's input; the whole layer runs again in the backward pass.
    selective: keep the outputs of its matrix products and attention as well; only the cheap
               elementwise operations run again (more memory than full, far less than none).
    none:      keep everything (nothing is enabled).
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    if recompute == "none":
        return
    options = {"use_reentrant": False}
    if recompute == "selective":
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        options["context_fn"] = functools.partial(create_selective_checkpoint_contexts, _keep_matrix_products)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


def wrap_model(model: torch.nn.Module, learners: Learners, strategy: str, activation_checkpointing: bool | str = True):
    """Share ``model`` (already on ``learners.device``) between the learners.

    ddp:  every learner holds the whole model; gradients are averaged by DDP.
    fsdp: FSDP2 shards each decoder layer's parameters, gradients and optimizer state over the
          learners; on GPU the layers compute in bf16 and reduce gradients in fp32, and activation
          checkpointing recomputes activations in the backward pass (memory for 8B models on 8 GPUs):
          ``activation_checkpointing`` full (or True), selective, or none (or False), as in
          ``enable_activation_checkpointing``.
    Build the optimizer from the returned model's parameters.
    """
    if strategy == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        recompute = {True: "full", False: "none"}.get(activation_checkpointing, activation_checkpointing)
        if hasattr(model, "gradient_checkpointing_enable"):
            enable_activation_checkpointing(model, recompute)
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if learners.device.type == "cuda"
            else MixedPrecisionPolicy()
        )
        for layer in decoder_layers(model):
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model
    if strategy != "ddp":
        raise ValueError(f"unknown strategy {strategy!r}: use ddp or fsdp")
    if not learners.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [learners.device.index] if learners.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks (the unit FSDP shards), found by the model's own
    ``_no_split_modules`` class names (Qwen2DecoderLayer, LlamaDecoderLayer, ...)."""
    names = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"cannot find decoder layers to shard in {type(model).__name__}")
    return layers


def is_fsdp(model: torch.nn.Module) -> bool:
    """Whether ``model`` is sharded with FSDP2 (``--strategy fsdp``)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model under DistributedDataParallel (FSDP2 keeps the original module)."""
    return model.module if hasattr(model, "no_sync") and hasattr(model, "module") else model


@contextlib.contextmanager
def gradient_sync(model: torch.nn.Module, enabled: bool):
    """With DDP, inside ``gradient_sync(model, False)`` backward only accumulates local gradients;
    the last micro-step of an accumulation runs with ``True`` and averages them over learners.

    FSDP2 reduce-scatters on every micro-step regardless: skipping it would keep a whole
    unsharded gradient on every GPU, the memory sharding is there to save.
    """
    if hasattr(model, "no_sync") and not enabled:  # DDP
        with model.no_sync():
            yield
    else:
        yield


# On CPU the scripts compute in exact fp32 (the tests' figures, the same on every machine), unless this
# names bf16: then as on GPU, the products in bf16 and the weights, gradients and optimizer state fp32.
# On a CPU with bf16 instructions (AVX512-BF16, AMX) SmolLM2's forward and backward ran 2.6x faster and
# a rollout 1.7x on one thread (``python -m bench.cpu_precision``); on others PyTorch converts, and it is
# slower. Local mode's hosts inherit it from the machine: the main job's real-model profile sets it for
# code RL's jobs where the CPU has them.
CPU_PRECISION_VARIABLE = "CPU_MIXED_PRECISION"


def cpu_mixed_precision() -> str:
    """``no`` (exact fp32, the default) or ``bf16``, from ``CPU_MIXED_PRECISION``."""
    value = os.environ.get(CPU_PRECISION_VARIABLE, "") or "no"
    if value not in ("no", "bf16"):
        from common.contract import UserError

        raise UserError(f"{CPU_PRECISION_VARIABLE}={value!r}: use no (exact fp32, the default) or bf16.")
    return value


def autocast(learners: Learners):
    """bf16 compute with fp32 master weights on GPU; on CPU exact fp32, or bf16 as on GPU where
    ``CPU_MIXED_PRECISION=bf16``."""
    if learners.device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if cpu_mixed_precision() == "bf16":
        _say_cpu_bf16()
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@functools.cache
def _say_cpu_bf16() -> None:
    log.info("CPU_MIXED_PRECISION=bf16: the model computes in bf16, its weights stay fp32")


def all_reduce_sum(value: float | torch.Tensor, learners: Learners) -> torch.Tensor:
    """Sum of ``value`` over learners (a float64 tensor on the learners' device)."""
    tensor = torch.as_tensor(value, dtype=torch.float64, device=learners.device).clone()
    if learners.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def reduce_sums(sums: dict[str, float | torch.Tensor], learners: Learners) -> dict[str, float]:
    """Each named value summed over the learners, in one all-reduce of them stacked (float64).
    Every learner must pass the same names."""
    names = sorted(sums)  # the same order on every learner, whatever order each built its dict in
    stacked = torch.tensor([float(sums[name]) for name in names], dtype=torch.float64)
    totals = dict(zip(names, all_reduce_sum(stacked, learners).tolist(), strict=True))
    return {name: totals[name] for name in sums}


def merge_dicts(values: dict, learners: Learners) -> dict:
    """The union of every learner's ``values`` (picklable; keys each learner owns alone), on every learner."""
    if not learners.distributed:
        return dict(values)
    gathered: list[dict | None] = [None] * learners.world_size
    dist.all_gather_object(gathered, values)
    return {key: value for part in gathered for key, value in part.items()}


def any_flag(flag: bool, learners: Learners) -> bool:
    """True on every learner if ``flag`` is true on any (all stop at the same step)."""
    return bool(all_reduce_sum(1.0 if flag else 0.0, learners).item() > 0)


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Clip the gradients' global norm to ``max_norm`` (0 = no clipping); returns the norm before
    clipping as a float (FSDP2 returns a DTensor, made whole here)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def barrier(learners: Learners) -> None:
    if learners.distributed:
        dist.barrier()
