"""The session server gives freed memory back to the system after each operation.

glibc keeps what a thread frees in that thread's arena; the server answers each request on a thread
of its own, so a real model's activations, KV caches and merged samplers stayed in the process after
they were freed (an idle SmolLM2 server held 12 GB, and the machine ran out of memory beside a job).
"""

import ctypes
import sys
import threading

import psutil
import pytest
import torch

from local_mode.session_service import engine as engine_module

PROMPT = [5, 6, 7, 8]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_freed_blocks_of_a_thread_go_back_to_the_system():
    """A thread fills its arena with small blocks and frees all but every 64th (the survivors keep the
    arena from shrinking by itself, as live tensors do in the server): the pages between them stay
    in the process until ``return_freed_memory``."""
    process = psutil.Process()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    kept = []

    def fragment():
        blocks = [libc.malloc(64 * 1024) for _ in range(4096)]  # 256 MB, below the mmap threshold
        for block in blocks:
            ctypes.memset(block, 1, 64 * 1024)  # touched: resident
        for index, block in enumerate(blocks):
            (kept.append if index % 64 == 0 else libc.free)(block)

    worker = threading.Thread(target=fragment)
    worker.start()
    worker.join()
    try:
        held = process.memory_info().rss
        engine_module.return_freed_memory()
        returned = held - process.memory_info().rss
        assert returned > 128 * 2**20, f"only {returned / 2**20:.0f} MB of ~252 MB freed went back"
    finally:
        for block in kept:
            libc.free(block)


def test_every_operation_returns_what_it_freed(tiny_model_path, one_thread, monkeypatch):
    """forward_backward, a sampling pass and a new merged sampler each hand their memory back."""
    calls = []
    monkeypatch.setattr(engine_module, "return_freed_memory", lambda collect=False: calls.append(collect))
    torch.manual_seed(0)
    engine = engine_module.Engine(str(tiny_model_path), rank=4, alpha=8)
    datum = {
        "modelInput": {"chunks": [{"tokens": PROMPT, "type": "encoded_text"}]},
        "lossFnInputs": {
            "target_tokens": {"data": [6, 7, 8, 9], "dtype": "int64"},
            "weights": {"data": [1.0] * 4, "dtype": "float32"},
        },
    }
    engine.forward_backward("cross_entropy", [datum], {}, backward=True)
    assert calls == [False]
    saved = {name: tensor.clone() for name, tensor in engine.adapter_state().items()}
    peft_state = {name.replace(".default", ""): tensor for name, tensor in saved.items()}
    engine.sample(PROMPT, 2, {"maxTokens": 4, "temperature": 1.0, "seed": 1}, adapter=peft_state)
    # the saved adapter's merged copy (after the previous one's memory is collected), then the pass
    assert calls == [False, True, False]
