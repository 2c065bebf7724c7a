"""The FSDP2 memory plan against numbers worked out by hand (and Llama-3.1-8B's published size)."""

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
    assert plan["grads"] == 4_015_130_624
    assert plan["optimizer"] == 8_030_261_248  # two fp32 states
    assert plan["gathered_layers"] == 2 * 218_112_000 * 8  # two layers x (2 + 2 + 4) B
    assert plan["gathered_root"] == 1_050_677_248 * 8  # 2 x 128256 x 4096 + 4096
    assert plan["checkpoints"] == 32 * 4096 * 4096 * 2
    assert plan["recomputed_layer"] == 2 * 4096 * (30 * 4096 + 8 * 14336)
    assert plan["logits"] == 4096 * 128256 * 16
    terms = sum(value for name, value in plan.items() if name != "total")
    # 8_030_261_248 + 8_030_261_248 + 3_489_792_000 + 8_405_417_984 + 1_073_741_824 + 1_946_157_056 + 8_405_385_216
    assert plan["total"] == terms == 39_381_016_576
    assert plan["total"] / GIB < 80  # fits an A100 80 GB with room for the CUDA context


def test_bf16_masters_halve_the_sharded_state_only():
    fp32 = memory_plan(LLAMA_3_1_8B, world_size=8, micro_batch=2, seq_len=2048)
    bf16 = memory_plan(LLAMA_3_1_8B, world_size=8, micro_batch=2, seq_len=2048, master_dtype="bf16")
    for name in ("params", "grads", "optimizer"):
        assert bf16[name] * 2 == fp32[name]
    for name in ("gathered_layers", "gathered_root", "checkpoints", "recomputed_layer", "logits"):
        assert bf16[name] == fp32[name]


def test_more_gpus_shrink_only_the_sharded_terms():
    one = memory_plan(TOY, world_size=1, micro_batch=1, seq_len=16)
    four = memory_plan(TOY, world_size=4, micro_batch=1, seq_len=16)
    assert one["params"] == TOY.total_params() * 4
    assert four["params"] == TOY.total_params() * 4 // 4
    assert one["checkpoints"] == four["checkpoints"] == 3 * 16 * 4 * 2
    assert one["logits"] == 16 * 10 * 16


@pytest.mark.parametrize("bad", [dict(master_dtype="fp16"), dict(world_size=0), dict(seq_len=0)])
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
        assert plan["total"] == base["total"] + plan["reference"]
        assert {name: value for name, value in plan.items() if name not in ("reference", "total")} == {
            name: value for name, value in base.items() if name != "total"
        }
    assert round(sharded["total"] / GIB, 2) == 40.50 and round(replicated["total"] / GIB, 2) == 51.63
    # sharding pays off as GPUs are added; a whole copy does not shrink
    on_two = memory_plan(TOY, world_size=2, micro_batch=1, seq_len=16, reference="sharded")["reference"]
    on_four = memory_plan(TOY, world_size=4, micro_batch=1, seq_len=16, reference="sharded")["reference"]
    assert (on_two, on_four) == (TOY.total_params() * 2 // 2 + 44 * 2, TOY.total_params() * 2 // 4 + 44 * 2)
    with pytest.raises(ValueError, match="reference must be"):
        memory_plan(TOY, world_size=1, micro_batch=1, seq_len=16, reference="frozen")
