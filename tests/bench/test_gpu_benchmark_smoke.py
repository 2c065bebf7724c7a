"""bench/gpu_benchmark.py --smoke runs end to end on CPU: GRPO ours vs TRL, FSDP2 SFT, the memory plan."""

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.tables import machine_facts

REPO = Path(__file__).resolve().parents[2]


def test_gpu_benchmark_smoke_on_cpu(tmp_path, tiny_model_path):
    out = tmp_path / "gpu.md"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    completed = subprocess.run(
        [sys.executable, "-m", "bench.gpu_benchmark", "--smoke", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]

    listed = json.loads(out.with_suffix(".json").read_text())
    rows = {(row["benchmark"]): row for row in listed}
    # the options section: 3 sizes x 2 micro-batches x 3 option sets, each measured and planned
    options = [row for row in listed if row["benchmark"] == "sft options"]
    planned = [row for row in listed if row["benchmark"] == "sft options: memory"]
    assert len(options) == len(planned) == 18
    assert all(row["ours"] > 0 and row["memory_mib"] > 0 for row in options)
    assert all(row["baseline"] > 0 for row in planned)  # the plan's prediction (CPU memory is RSS)
    assert any("before: full recompute, whole logits" in row["case"] for row in options)
    assert any("selective recompute, loss chunks of 2048" in row["case"] for row in options)
    assert rows["sft throughput"]["ours"] > 0
    assert rows["sft throughput"]["memory_mib"] > 0
    grpo = rows["grpo step"]
    assert grpo["ours"] > 0 and grpo["baseline"] > 0 and grpo["baseline_name"] == "TRL GRPOTrainer"
    assert grpo["memory_mib"] > 0 and grpo["baseline_memory_mib"] > 0
    for part in ("generation", "reward"):
        assert rows[f"grpo step: {part}"]["ours"] > 0 and rows[f"grpo step: {part}"]["baseline"] > 0
    assert rows["memory plan check"]["baseline"] > 0  # the prediction; measuring needs CUDA

    text = out.read_text()
    assert f"Machine: {machine_facts()['model']}" in text and "CPU flags" in text
    assert "| sft throughput |" in text and "| grpo step |" in text
    assert "full fine-tune on 8 x A100 80 GB" in text and "| **total** |" in text
