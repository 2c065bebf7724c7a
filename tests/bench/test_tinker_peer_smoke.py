"""bench.tinker_peer runs on tiny shapes: our session service and SkyRL's Tinker API server get the same
datums and sampling requests through the same client program, and the rows compare the two."""

import pytest

from bench import tinker_peer


@pytest.mark.skipif(
    tinker_peer.peer_missing() is not None,
    reason=f"{tinker_peer.peer_missing()}: the Tinker-compatible peer is a benchmark-only environment",
)
def test_peer_comparison_on_tiny_shapes(monkeypatch, tiny_model_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = tinker_peer.measure(steps=1, in_flight=[1, 2])

    step, one, two = rows
    assert step.unit == "s/step" and step.ours > 0 and step.baseline > 0
    assert step.baseline_name.startswith("SkyRL")
    for row, count in ((one, 1), (two, 2)):
        assert row.case.startswith(f"{count} request(s) in flight")
        assert row.unit == "tokens/s" and row.ours > 0 and row.baseline > 0
        assert row.ratio == pytest.approx(row.ours / row.baseline)


def test_peer_model_is_qwen3_with_the_tiny_tokenizer(tiny_model_path):
    import json

    from transformers import AutoTokenizer

    folder = tinker_peer.qwen3_model_dir()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]  # a layout SkyRL's JAX backend implements
    assert (
        AutoTokenizer.from_pretrained(folder).get_vocab() == AutoTokenizer.from_pretrained(tiny_model_path).get_vocab()
    )
