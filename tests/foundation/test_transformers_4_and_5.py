"""A model folder written on transformers 5 (the notebook side, local mode, a job on the PyTorch
image) loads on the training image's transformers 4.56 as the same model: the same token ids and
chat template, the same RoPE base. Runs in the image environment (make test); the main
environment's Python (transformers 5) writes the folders."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import transformers

REPO = Path(__file__).resolve().parents[2]
MAIN_PYTHON = REPO / ".venv" / "bin" / "python"

if int(transformers.__version__.split(".")[0]) >= 5:
    pytest.skip("runs on transformers 4 (the image environment that make test builds)", allow_module_level=True)


SAMPLES = [
    "Natalia sold 48/2 = 24 clips in May.\n#### 72",
    "<|im_start|>user\ncafé naïve 日本語 🙂<|im_end|>\n",
    "def solve(a, b):\n    return a * b + a\n",
]
CHAT = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
# Qwen2.5-0.5B-Instruct's config.json with the sizes shrunk: what decides positions is kept.
QWEN2_5_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    sliding_window=32768,
    max_window_layers=21,
    use_sliding_window=False,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)

# Run by the main environment's Python: argv = repo, output folder, the inputs as JSON.
WRITE_ON_TRANSFORMERS_5 = """
import json, sys
from pathlib import Path
repo, out, inputs = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
import torch, transformers
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
from common.distributed import single_learner
from common.models import save_final_model
from local_mode.tiny_model import build_tiny_model

assert transformers.__version__.startswith("5."), transformers.__version__
tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(out / "tiny"))
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), **inputs["shape"]))
save_final_model(model, tokenizer, out / "saved", single_learner("cpu"))
model.save_pretrained(out / "plain")  # transformers 5's own files, nothing added
tokenizer.save_pretrained(out / "plain")
reloaded = Qwen2ForCausalLM.from_pretrained(out / "saved")
print(json.dumps({
    "ids": [tokenizer(text)["input_ids"] for text in inputs["samples"]],
    "chat": tokenizer.apply_chat_template(inputs["chat"], tokenize=False),
    "rope_theta": reloaded.config.rope_parameters["rope_theta"],
    "inv_freq": reloaded.model.rotary_emb.inv_freq.tolist(),
}))
"""


def test_this_environment_has_the_image_pins():
    """What the tests below run on is what requirements-image.txt says (the floors of the scripts)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    lines = [line.split("#", 1)[0].strip() for line in (REPO / "requirements-image.txt").read_text().splitlines()]
    pinned = [Requirement(line) for line in lines if "==" in line]
    assert {r.name for r in pinned} >= {"transformers", "datasets", "peft", "accelerate", "safetensors"}
    for requirement in pinned:
        assert requirement.specifier.contains(metadata.version(requirement.name)), requirement


@pytest.fixture(scope="module")
def written_on_5(tmp_path_factory) -> tuple[Path, dict]:
    assert MAIN_PYTHON.exists(), f"{MAIN_PYTHON} (transformers 5) writes the folders: build it with make .venv/.stamp"
    out = tmp_path_factory.mktemp("written-on-5")
    inputs = json.dumps({"shape": QWEN2_5_SHAPE, "samples": SAMPLES, "chat": CHAT})
    done = subprocess.run(
        [str(MAIN_PYTHON), "-c", WRITE_ON_TRANSFORMERS_5, str(REPO), str(out), inputs],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("folder", ["tiny", "saved"])
def test_the_tokenizer_gives_the_same_ids_and_chat_template(written_on_5, folder):
    """The tiny model as the notebook side stages it, and a job's final model saved on 5."""
    from common.models import load_tokenizer

    out, on_5 = written_on_5
    tokenizer = load_tokenizer(str(out / folder))
    assert [tokenizer(text)["input_ids"] for text in SAMPLES] == on_5["ids"]
    assert tokenizer.apply_chat_template(CHAT, tokenize=False) == on_5["chat"]
    assert list(tokenizer("2+2?")) == ["input_ids", "attention_mask"]  # generate() takes no token_type_ids


def test_a_qwen2_5_config_keeps_its_rope_base(written_on_5):
    from common.models import load_model

    out, on_5 = written_on_5
    model = load_model(str(out / "saved"), torch.device("cpu"))
    assert on_5["rope_theta"] == model.config.rope_theta == 1e6
    inv_freq = model.model.rotary_emb.inv_freq
    head_dim = QWEN2_5_SHAPE["hidden_size"] // QWEN2_5_SHAPE["num_attention_heads"]
    expected = 1.0 / 1e6 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    torch.testing.assert_close(inv_freq, expected)
    assert inv_freq.tolist() == pytest.approx(on_5["inv_freq"])  # the same positions in both versions


def test_a_folder_only_transformers_5_reads_is_a_user_error_that_names_the_fix(written_on_5):
    from common.contract import UserError
    from common.models import load_model, load_tokenizer

    out, _ = written_on_5
    plain = str(out / "plain")
    with pytest.raises(UserError, match=r"rope_theta 10000 instead of 1000000.0.*add_transformers_4_keys"):
        load_model(plain, torch.device("cpu"))
    with pytest.raises(UserError, match=r"extra_special_tokens.*save_final_model"):
        load_tokenizer(plain)
