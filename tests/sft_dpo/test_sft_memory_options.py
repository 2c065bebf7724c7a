"""The SFT options that trade memory for arithmetic leave the loss and the gradients as they were:
the chunked LM-head loss (common/lm_loss.py, --loss_chunk_tokens) against the full-logits loss of
sft.py, and activation checkpointing, full or selective (--activation_checkpointing).

Tolerance: in fp32 on CPU both compute each token's logits and cross-entropy with the same
operations; they differ in the order of summation only (the loss summed chunk by chunk, the head's
gradient accumulated chunk by chunk, the matrix products blocked over fewer rows). Each number is a
sum of at most a few thousand fp32 terms, so it moves by at most about 1e-5 of the size of those
terms: rtol 1e-5, and an absolute 1e-5 of the tensor's largest entry, since a gradient entry where
terms of both signs cancel keeps the rounding of terms as large as the largest entries (measured on
the tiny model: at most 4e-6 on entries up to 12, 3e-7 of the largest). A wrong shift, a dropped or
doubled chunk, or an ignored label counted would be off by 1e-2 of the largest entry or more.
"""

from __future__ import annotations

import functools

import pytest
import torch

VOCAB, HIDDEN = 50, 16


def assert_same(actual: torch.Tensor, expected: torch.Tensor, name: str = "") -> None:
    """Equal within the module docstring's tolerance: rtol 1e-5, atol 1e-5 of the largest entry."""
    atol = 1e-5 * expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=atol, msg=lambda m: f"{name}: {m}")


def _labels(batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    labels = torch.randint(0, VOCAB, (batch, length), generator=generator)
    labels[0, :5] = -100  # a prompt
    labels[1, -3:] = -100  # padding
    labels[:, 7] = -100
    return labels


@pytest.mark.parametrize("chunk_tokens", [1, 7, 16, 1000])  # 7 and 16 do not divide the 2 x 22 positions
def test_loss_and_gradients_equal_the_full_logits(chunk_tokens):
    import sft
    from common.lm_loss import chunked_token_loss_sum

    generator = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    hidden = torch.randn(2, 23, HIDDEN, generator=generator, requires_grad=True)
    labels = _labels(2, 23, generator)

    full_sum, full_count = sft.token_loss_sum(head(hidden), labels)
    full_sum.backward()
    full_grads = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None

    chunked_sum, chunked_count = chunked_token_loss_sum(hidden, head, labels, chunk_tokens)
    chunked_sum.backward()
    assert chunked_count.item() == full_count.item() == (labels[:, 1:] != -100).sum().item()
    assert_same(chunked_sum, full_sum)
    assert_same(hidden.grad, full_grads[0])
    assert_same(head.weight.grad, full_grads[1])
    assert hidden.grad[0, :4].abs().sum() == 0  # positions predicting prompt tokens get no gradient
    assert hidden.grad[0, 5].abs().sum() > 0


def test_no_targets_gives_zero_loss_and_zero_gradients_that_exist():
    from common.lm_loss import chunked_token_loss_sum

    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    hidden = torch.randn(1, 6, HIDDEN, requires_grad=True)
    loss_sum, count = chunked_token_loss_sum(hidden, head, torch.full((1, 6), -100), 4)
    loss_sum.backward()
    assert loss_sum.item() == 0 and count.item() == 0
    assert head.weight.grad is not None and head.weight.grad.abs().sum() == 0  # DDP waits for every gradient


CONVERSATIONS = [
    [
        {"role": "user", "content": "Ken has 3 apples and buys 4 more. How many?"},
        {"role": "assistant", "content": "3+4 = 7\n#### 7"},
        {"role": "user", "content": "And if he eats 2?"},
        {"role": "assistant", "content": "7-2 = 5\n#### 5"},
    ],
    [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}],
]


def _model_batch(tiny_model_path, lora: bool):
    import sft
    from common.models import load_model, load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_path))
    examples = [sft.tokenize_conversation(tokenizer, c, 4096) for c in CONVERSATIONS]
    batch = sft.collate(examples, tokenizer.pad_token_id, torch.device("cpu"))
    torch.manual_seed(0)
    model = load_model(str(tiny_model_path), torch.device("cpu"), trainable=not lora)
    if lora:
        from peft import LoraConfig, get_peft_model

        # the head adapted too, so the chunked loss must go through peft's layer, not lm_head.weight
        config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "lm_head"])
        model = get_peft_model(model, config)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:  # B starts at zero: give the adapters an effect to differentiate
                torch.nn.init.normal_(parameter, std=0.02)
    model.train()
    return model, batch


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_script_loss_through_the_model_is_unchanged(tiny_model_path, lora):
    import sft

    model, batch = _model_batch(tiny_model_path, lora)
    assert (batch["attention_mask"] == 0).any() and (batch["labels"] == -100).any()
    results = []
    for chunk_tokens in (0, 5):
        model.zero_grad(set_to_none=True)
        loss_sum, count = sft.batch_loss_sum(model, batch, chunk_tokens)
        loss_sum.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss_sum.detach(), count, grads))
    (full, full_count, full_grads), (chunked, chunked_count, chunked_grads) = results
    assert chunked_count == full_count
    assert_same(chunked, full)
    assert full_grads.keys() == chunked_grads.keys() and full_grads
    if lora:
        assert any("lm_head" in name and "lora" in name for name in full_grads)
    for name in full_grads:
        assert_same(chunked_grads[name], full_grads[name], name)


def _largest_tensor_bytes(run) -> int:
    """The largest tensor any operation returned while ``run()`` ran, forward and backward, in bytes
    (the bytes of the storage it lives in)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Largest(TorchDispatchMode):
        size = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    self.size = max(self.size, leaf.untyped_storage().nbytes())
            return out

    with Largest() as largest:
        run()
    return largest.size


def test_peak_memory_of_the_loss_is_a_chunk_of_logits_not_all_of_them():
    """4 x 256 positions, a 4096-entry vocabulary: the full logits are 16 MiB per fp32 copy, and
    the full-logits loss makes several; the chunked loss's largest tensor is one chunk's logits."""
    import sft
    from common.lm_loss import chunked_token_loss_sum

    generator = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(64, 4096, bias=False)
    hidden = torch.randn(4, 256, 64, generator=generator, requires_grad=True)
    labels = torch.randint(0, 4096, (4, 256), generator=generator)
    logit_copy = 4 * 255 * 4096 * 4

    def full():
        sft.token_loss_sum(head(hidden), labels)[0].backward()

    def chunked():
        chunked_token_loss_sum(hidden, head, labels, 128)[0].backward()

    full_peak, chunked_peak = _largest_tensor_bytes(full), _largest_tensor_bytes(chunked)
    print(f"largest tensor: full logits {full_peak / 2**20:.2f} MiB, chunks of 128 {chunked_peak / 2**20:.2f} MiB")
    assert full_peak >= logit_copy  # the measurement sees the full fp32 logits where they exist
    assert chunked_peak == 128 * 4096 * 4  # one chunk's fp32 logits: 128 of the 1020 positions


# --------------------------------------------------------------------------- activation checkpointing
# Activation checkpointing, full or selective, and the chunked loss under FSDP2: the loss and every
# gradient as without them.
#
# Tolerance: recomputation runs the same operations on the same inputs, so on CPU in fp32 the
# figures agree to rounding (rtol 1e-5, an absolute 1e-5 of the tensor's largest entry: the summation
# order of the chunked loss, as above). Dropout is on (0.1 on attention) so a
# recomputation that drew other random numbers would differ by far more.


def _model_and_batch(tiny_model_path):
    import sft
    from common.models import load_model, load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_path))
    examples = [sft.tokenize_conversation(tokenizer, c, 4096) for c in CONVERSATIONS]
    batch = sft.collate(examples, tokenizer.pad_token_id, torch.device("cpu"))
    model = load_model(str(tiny_model_path), torch.device("cpu"))
    model.config.attention_dropout = 0.1
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.1
    model.config.use_cache = False
    model.train()
    return model, batch


def _loss_and_grads(model, batch, chunk_tokens: int = 0):
    import sft

    model.zero_grad(set_to_none=True)
    torch.manual_seed(3)  # the same dropout masks in every run
    loss_sum, _ = sft.batch_loss_sum(model, batch, chunk_tokens)
    loss_sum.backward()
    return loss_sum.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_checkpointing_leaves_loss_and_gradients_unchanged(tiny_model_path, recompute):
    from common import distributed

    model, batch = _model_and_batch(tiny_model_path)
    reference_loss, reference = _loss_and_grads(model, batch)
    distributed.enable_activation_checkpointing(model, recompute)
    layers = distributed.decoder_layers(model)
    assert all(layer.gradient_checkpointing for layer in layers)
    loss, grads = _loss_and_grads(model, batch)
    assert_same(loss, reference_loss)
    assert grads.keys() == reference.keys()
    for name in reference:
        assert_same(grads[name], reference[name], name)


def test_selective_checkpointing_keeps_the_matrix_products_and_recomputes_the_rest():
    """What each policy keeps, counted in the arithmetic run: full reruns the layer's matrix products
    in the backward pass, selective none of them (only the elementwise ones)."""
    from common import distributed
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
    from torch.utils.flop_counter import FlopCounterMode

    weights = [torch.randn(32, 32, requires_grad=True) for _ in range(2)]

    def layer(x):
        return torch.nn.functional.silu(x @ weights[0]) @ weights[1]

    def forward_backward_flops(**options) -> int:
        x = torch.randn(8, 32, requires_grad=True)
        with FlopCounterMode(display=False) as counter:
            checkpoint(layer, x, use_reentrant=False, **options).sum().backward()
        return counter.get_total_flops()

    plain = 3 * 2 * (2 * 8 * 32 * 32)  # two products, forward and twice backward
    selective = functools.partial(create_selective_checkpoint_contexts, distributed._keep_matrix_products)
    # full reruns the first product (the SiLU's input, which its backward needs; the second product's
    # output nothing saves, and recomputation stops once every saved tensor is back)
    assert forward_backward_flops() == plain + 2 * 8 * 32 * 32
    assert forward_backward_flops(context_fn=selective) == plain


def test_unknown_recompute_is_refused():
    from common import distributed

    with pytest.raises(ValueError, match="recompute must be one of"):
        distributed.enable_activation_checkpointing(torch.nn.Linear(2, 2), "some")


def test_the_chunked_loss_under_fsdp2_on_one_process(tiny_model_path, tmp_path):
    """FSDP2 (one process, gloo) runs the model through its root unit's hooks; the chunked loss takes
    the hidden states and the head from inside it and must give the same gradients."""
    import torch.distributed as dist
    from common import distributed

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        learners = distributed.single_learner("cpu")
        results = []
        for chunk_tokens in (0, 5):
            model, batch = _model_and_batch(tiny_model_path)
            model = distributed.wrap_model(model, learners, "fsdp", activation_checkpointing="selective")
            loss, grads = _loss_and_grads(model, batch, chunk_tokens)
            results.append((loss, {name: grad.full_tensor() for name, grad in grads.items()}))
        (full_loss, full_grads), (chunked_loss, chunked_grads) = results
        assert_same(chunked_loss, full_loss)
        assert chunked_grads.keys() == full_grads.keys() and "model.embed_tokens.weight" in full_grads
        for name in full_grads:
            assert_same(chunked_grads[name], full_grads[name], name)
    finally:
        dist.destroy_process_group()


def test_the_options_parse_and_a_negative_chunk_is_refused_with_the_fix():
    import sft
    from common.contract import UserError

    args = sft.parse_args(["--loss_chunk_tokens", "1024", "--activation_checkpointing", "selective"])
    assert (args.loss_chunk_tokens, args.activation_checkpointing) == (1024, "selective")
    defaults = sft.parse_args([])
    assert (defaults.loss_chunk_tokens, defaults.activation_checkpointing) == (0, "full")  # as before
    with pytest.raises(UserError, match="--loss_chunk_tokens -1 cannot be negative: give 0"):
        sft.parse_args(["--loss_chunk_tokens", "-1"]).validate(world_size=1)
    with pytest.raises(UserError, match="Bad hyperparameter"):
        sft.parse_args(["--activation_checkpointing", "some"])
