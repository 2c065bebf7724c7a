"""Where a session step's time goes, for ``bench.time_to_quality``'s step profile (docs/BENCHMARKS.md).

With ``SAGEMAKER_LOCAL_SESSION_PROFILE_LOG`` set (read when the endpoint process starts), every phase of
an operation appends one JSON line to that file: ``{"phase": ..., "seconds": ..., "end": ...}`` and
what the phase counted (rows, tokens). Without it, ``phase`` costs one check of a module constant.
The phases: ``http:<Operation>`` (a request read, checked and answered, long-polls excluded),
``operation:<kind>`` (an operation run, on the session's thread), ``merge``, ``prefill``, ``decode``,
``sample_pass``, ``score_pass``, ``fb_forward``, ``fb_backward``, ``fb_outputs``, ``optim_step``, ``save_adapter``,
``save_s3``, ``load_adapter``.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

PROFILE_LOG = os.environ.get("SAGEMAKER_LOCAL_SESSION_PROFILE_LOG")
_WRITING = threading.Lock()


def record(name: str, seconds: float, **counts) -> None:
    if not PROFILE_LOG:
        return
    line = json.dumps({"phase": name, "seconds": round(seconds, 6), "end": round(time.time(), 6), **counts})
    with _WRITING, open(PROFILE_LOG, "a") as log:
        log.write(line + "\n")


@contextlib.contextmanager
def phase(name: str, **counts):
    """Times the block as phase ``name`` (when the profile log is on)."""
    if not PROFILE_LOG:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        record(name, time.perf_counter() - started, **counts)


@contextlib.contextmanager
def generation_passes(model):
    """Splits a sampling pass's model calls into ``prefill`` (a call that reads more than one new token
    a row: the prompts) and ``decode`` (one token a row), summed over the pass; their tokens are those
    the decoder read (a group's prompt once, when the pass shares it)."""
    if not PROFILE_LOG:
        yield
        return
    totals = {"prefill": [0.0, 0, 0], "decode": [0.0, 0, 0]}  # seconds, calls, tokens read
    started: list[float] = []
    decode_calls: list[float] = []  # each decode call's seconds: the k-th draws every live row's token k + 1

    def before(module, args, kwargs):
        started.append(time.perf_counter())

    read: list[tuple[int, int]] = []  # (rows, tokens a row) of the decoder's last call

    def decoder_input(module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is None:
            ids = args[0] if args else None
        read.append(tuple(ids.shape) if ids is not None else (0, 0))

    def after(module, args, kwargs, output):
        rows, width = read.pop() if read else (0, 0)
        kind = totals["prefill" if width > 1 else "decode"]
        seconds = time.perf_counter() - started.pop()
        kind[0] += seconds
        if width == 1:
            decode_calls.append(round(seconds, 4))
        kind[1] += 1
        kind[2] += rows * width

    model = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: the model generate runs
    hooks = [
        model.register_forward_pre_hook(before, with_kwargs=True),
        model.get_decoder().register_forward_pre_hook(decoder_input, with_kwargs=True),
        model.register_forward_hook(after, with_kwargs=True),
    ]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        for name, (seconds, calls, tokens) in totals.items():
            record(
                name, seconds, calls=calls, tokens=tokens, **({"per_call": decode_calls} if name == "decode" else {})
            )
