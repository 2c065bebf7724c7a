"""``python -m local_mode.llm_server`` stops the ``transformers serve`` it started when it is stopped itself,
as notebook 14's judge stops it (SIGTERM to its process group): the server runs in a session of its own,
so nothing else would reach it."""

import subprocess
import sys

import psutil

from local_mode.os_utils import stop_process_group


def test_stopping_the_wrapper_stops_its_server(tiny_model_path):
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "local_mode.llm_server", str(tiny_model_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert wrapper.stdout.readline().startswith("OPENAI_BASE_URL=")  # it answers
        (server,) = psutil.Process(wrapper.pid).children()
        assert "serve" in " ".join(server.cmdline())
    finally:
        stop_process_group(wrapper.pid, 15)
    wrapper.wait(30)
    assert wrapper.returncode == 0  # left through serve()'s stop, not killed
    _, alive = psutil.wait_procs([server], timeout=30)
    for orphan in alive:  # not left behind by a failing run either
        orphan.kill()
    assert not alive, f"transformers serve (pid {server.pid}) outlived the wrapper"
