"""The FSDP2 memory plan against numbers worked out by hand, Llama-3.1-8B's published size, and the
peaks measured on an H200."""

import pytest

from bench.memory_plan import GIB, LLAMA_3_1_8B, QWEN2_5_1_5B, ModelShape, memory_plan

TOY = ModelShape(
    vocab_size=10, hidden_size=4, intermediate_size=8, num_layers=3, num_heads=2, num_kv_heads=1, tied_embeddings=True
)


def test_toy_shape_counts_every_matrix_once():
    # head_dim 2, kv width 2: q 4x4=16, k 4x2=8, v 8, o 16, gate/up/down 3x4x8=96, two norms 8 -> 152
    assert TOY.layer_params() == 152
    # tied: one 10x4 embedding + final norm 4
    assert TOY.root_params() == 44
    assert TOY.total_params() == 3 * 152 + 44
    untied_with_bias = TOY.replace(tied_embeddings=False, qkv_bias=True)
    assert untied_with_bias.layer_params() == 152 + 4 + 2 + 2
    assert untied_with_bias.root_params() == 84


def test_published_parameter_counts():
    assert LLAMA_3_1_8B.layer_params() == 218_112_000
    assert LLAMA_3_1_8B.total_params() == 8_030_261_248  # meta-llama/Llama-3.1-8B
    assert QWEN2_5_1_5B.total_params() == 1_543_714_304  # Qwen/Qwen2.5-1.5B


def test_llama_8b_on_eight_a100s_term_by_term():
    plan = memory_plan(LLAMA_3_1_8B, world_size=8, micro_batch=1, seq_len=4096)
    assert plan["params"] == 4_015_130_624  # 8_030_261_248 x 4 B / 8
    assert plan["grads"] == plan["optimizer_step"] == 4_015_130_624
    assert plan["optimizer"] == 8_030_261_248  # two fp32 states
    assert plan["gathered_layers"] == 2 * 218_112_000 * 8  # two layers x (2 + 2 + 4) B
    assert plan["gathered_root"] == 1_050_677_248 * 4  # 2 x 128256 x 4096 + 4096, bf16 weights and grads
    assert plan["checkpoints"] == 32 * 4096 * 4096 * 2
    assert plan["recomputed_layer"] == 2 * 4096 * (30 * 4096 + 8 * 14336)
    assert plan["head_input"] == 4096 * 4096 * 16
    assert plan["logits"] == 4096 * 128256 * 14
    # the three moments: 4_015_130_624 + 8_030_261_248 = 12_045_391_872 always there
    assert plan["phase: loss"] == 12_045_391_872 + 4_202_708_992 + 1_073_741_824 + 268_435_456 + 7_354_712_064
    layer_grads = 31 * 218_112_000 * 4 // 8  # every layer's sharded gradient but the one computing
    assert plan["phase: layers"] == (
        12_045_391_872 + layer_grads + 4_202_708_992 + 3_489_792_000 + 1_073_741_824 + 1_946_157_056
    )
    assert plan["phase: optimizer step"] == 12_045_391_872 + 2 * 4_015_130_624
    peak = plan["phase: layers"]  # 26_138_527_744, the largest
    assert plan["margin"] == int(0.05 * peak) and plan["total"] == peak + int(0.05 * peak) == 27_445_454_131
    assert plan["total"] / GIB < 80  # fits an A100 80 GB with room for the CUDA context


# Peaks measured on one H200 (torch.cuda.max_memory_allocated, MiB; docs/BENCHMARKS.md): FSDP2 on one
# process, fp32 master weights, bf16 compute, full recomputation, the whole logits, one micro-batch a step.
MEASURED_ON_H200 = [
    (LLAMA_3_1_8B.replace(num_layers=2), 1, 4096, 28426),
    (QWEN2_5_1_5B, 4, 2048, 35577),
    (QWEN2_5_1_5B, 8, 2048, 52962),
    (QWEN2_5_1_5B, 16, 2048, 87717),
]


@pytest.mark.parametrize("shape, micro_batch, seq_len, measured_mib", MEASURED_ON_H200)
def test_the_plan_errs_above_the_measured_peaks_by_less_than_15_percent(shape, micro_batch, seq_len, measured_mib):
    plan = memory_plan(shape, world_size=1, micro_batch=micro_batch, seq_len=seq_len)
    ratio = plan["total"] / (measured_mib * 2**20)
    assert 1.0 < ratio < 1.15, f"predicted / measured = {ratio:.3f}"


def test_the_chunked_loss_and_recomputation_change_only_their_terms():
    base = memory_plan(QWEN2_5_1_5B, world_size=1, micro_batch=4, seq_len=2048)
    chunked = memory_plan(QWEN2_5_1_5B, world_size=1, micro_batch=4, seq_len=2048, loss_chunk_tokens=1024)
    assert base["logits"] == 8192 * 151936 * 14 and chunked["logits"] == 1024 * 151936 * 14
    assert memory_plan(QWEN2_5_1_5B, 1, 1, 512, loss_chunk_tokens=1024)["logits"] == 512 * 151936 * 14  # no bigger
    assert base["phase: loss"] - chunked["phase: loss"] == 7168 * 151936 * 14
    assert chunked["total"] < base["total"] * 0.9  # 1.5 B at 4 x 2048: the logits were the peak
    selective = memory_plan(QWEN2_5_1_5B, 1, 4, 2048, recompute="selective")
    none = memory_plan(QWEN2_5_1_5B, 1, 4, 2048, recompute="none")
    # selective keeps q, o, down, attention (4 x 1536), k, v (2 x 256), gate, up (2 x 8960) in bf16
    assert selective["checkpoints"] - base["checkpoints"] == 28 * 8192 * 2 * (4 * 1536 + 2 * 256 + 2 * 8960)
    assert none["checkpoints"] == 28 * 8192 * (30 * 1536 + 8 * 8960)
    assert none["recomputed_layer"] * 2 == base["recomputed_layer"] == selective["recomputed_layer"]
    for plan in (chunked, selective, none):
        for name in ("params", "grads", "optimizer", "optimizer_step", "gathered_layers", "gathered_root"):
            assert plan[name] == base[name]


def test_gradient_accumulation_keeps_the_gradients_through_the_step():
    one = memory_plan(TOY, world_size=1, micro_batch=1, seq_len=16)
    four = memory_plan(TOY, world_size=1, micro_batch=1, seq_len=16, gradient_accumulation=4)
    assert four["phase: loss"] - one["phase: loss"] == TOY.total_params() * 4
    assert four["phase: layers"] - one["phase: layers"] == TOY.total_params() * 4 - 2 * TOY.layer_params() * 4
    assert four["phase: optimizer step"] == one["phase: optimizer step"]


def test_bf16_masters_halve_the_sharded_state_only():
    fp32 = memory_plan(LLAMA_3_1_8B, world_size=8, micro_batch=2, seq_len=2048)
    bf16 = memory_plan(LLAMA_3_1_8B, world_size=8, micro_batch=2, seq_len=2048, master_dtype="bf16")
    for name in ("params", "grads", "optimizer", "optimizer_step"):
        assert bf16[name] * 2 == fp32[name]
    for name in ("gathered_layers", "gathered_root", "checkpoints", "recomputed_layer", "head_input", "logits"):
        assert bf16[name] == fp32[name]


def test_more_gpus_shrink_only_the_sharded_terms():
    one = memory_plan(TOY, world_size=1, micro_batch=1, seq_len=16)
    four = memory_plan(TOY, world_size=4, micro_batch=1, seq_len=16)
    assert one["params"] == TOY.total_params() * 4
    assert four["params"] == TOY.total_params() * 4 // 4
    assert one["checkpoints"] == four["checkpoints"] == 3 * 16 * 4 * 2
    assert one["logits"] == 16 * 10 * 14


@pytest.mark.parametrize(
    "bad",
    [
        dict(master_dtype="fp16"),
        dict(world_size=0),
        dict(seq_len=0),
        dict(recompute="some"),
        dict(loss_chunk_tokens=-1),
        dict(gradient_accumulation=0),
    ],
)
def test_bad_settings_are_refused(bad):
    settings = dict(world_size=8, micro_batch=1, seq_len=4096) | bad
    with pytest.raises(ValueError):
        memory_plan(LLAMA_3_1_8B, **settings)


def test_plans_side_by_side_in_gib():
    from bench.memory_plan import format_plans

    one = memory_plan(TOY, world_size=1, micro_batch=1, seq_len=16)
    text = format_plans({"a": one, "b": one}, capacity_gib=80)
    lines = text.splitlines()
    assert lines[0] == "| term | a | b |"
    assert lines[2] == "| params | 0.00 | 0.00 |"
    assert lines[-2].startswith("| **total** |") and lines[-1] == "| share of 80 GiB | 0 % | 0 % |"
    assert len(lines) == 2 + len(one) + 1


def test_reference_model_sharded_or_replicated():
    base = memory_plan(LLAMA_3_1_8B, world_size=8, micro_batch=1, seq_len=4096)
    sharded = memory_plan(LLAMA_3_1_8B, world_size=8, micro_batch=1, seq_len=4096, reference="sharded")
    replicated = memory_plan(LLAMA_3_1_8B, world_size=8, micro_batch=1, seq_len=4096, reference="replicated")
    assert "reference" not in base
    assert replicated["reference"] == 16_060_522_496  # 8_030_261_248 bf16 weights on every GPU
    # an eighth of them, and the root unit (2 x 128256 x 4096 + 4096 params) gathered in bf16
    assert sharded["reference"] == 2_007_565_312 + 2_101_354_496
    for plan in (sharded, replicated):
        for phase in ("phase: loss", "phase: layers", "phase: optimizer step"):
            assert plan[phase] == base[phase] + plan["reference"]
        terms = [name for name in base if not name.startswith("phase") and name not in ("margin", "total")]
        assert {name: plan[name] for name in terms} == {name: base[name] for name in terms}
    # the layers' moment (26_138_527_744, as above) plus the reference, and 5 % on top
    assert sharded["total"] == 30_247_447_552 + int(0.05 * 30_247_447_552)  # 29.58 GiB
    assert replicated["total"] == 42_199_050_240 + int(0.05 * 42_199_050_240)  # 41.27 GiB
    # sharding pays off as GPUs are added; a whole copy does not shrink
    on_two = memory_plan(TOY, world_size=2, micro_batch=1, seq_len=16, reference="sharded")["reference"]
    on_four = memory_plan(TOY, world_size=4, micro_batch=1, seq_len=16, reference="sharded")["reference"]
    assert (on_two, on_four) == (TOY.total_params() * 2 // 2 + 44 * 2, TOY.total_params() * 2 // 4 + 44 * 2)
    with pytest.raises(ValueError, match="reference must be"):
        memory_plan(TOY, world_size=1, micro_batch=1, seq_len=16, reference="frozen")
