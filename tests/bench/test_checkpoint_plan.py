"""The checkpoint section of the memory plan against numbers worked out by hand."""

import pytest

from bench.memory_plan import LLAMA_3_1_8B, checkpoint_plan


def test_llama_8b_checkpoint_over_eight_ranks():
    plan = checkpoint_plan(LLAMA_3_1_8B, world_size=8, disk_gb_per_s=2.0, writer_gb_per_s=1.0)
    assert plan["state_bytes"] == 96_363_134_976  # 8_030_261_248 x 4 B x (weights + two AdamW states)
    assert plan["sharded_bytes_per_rank"] == 12_045_391_872  # an eighth each
    assert plan["gathered_rank0_bytes"] == 96_363_134_976
    # sharded: the disk is the bound (96.4 GB at 2 GB/s), not one rank's 12 GB at 1 GB/s
    assert plan["sharded_save_s"] == pytest.approx(48.18, abs=0.01)
    # gathered: one writer streams everything
    assert plan["gathered_save_s"] == pytest.approx(96.36, abs=0.01)


def test_a_fast_disk_leaves_the_single_writer_as_the_bound():
    plan = checkpoint_plan(LLAMA_3_1_8B, world_size=8, master_dtype="bf16", disk_gb_per_s=16.0, writer_gb_per_s=1.0)
    assert plan["state_bytes"] == 48_181_567_488
    assert plan["sharded_save_s"] == pytest.approx(6.02, abs=0.01)  # 6.02 GB per rank at 1 GB/s
    assert plan["gathered_save_s"] == pytest.approx(48.18, abs=0.01)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="master_dtype"):
        checkpoint_plan(LLAMA_3_1_8B, 8, master_dtype="fp16")
    with pytest.raises(ValueError, match="bandwidths positive"):
        checkpoint_plan(LLAMA_3_1_8B, 8, disk_gb_per_s=0)
