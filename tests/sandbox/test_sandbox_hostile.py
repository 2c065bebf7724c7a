"""Hostile programs, scaled so that they cannot hurt the machine even if a layer failed.

Each must be contained with the right verdict; afterwards the test process and the fork servers
are alive, no process of a worker uid and no orphan is left, nothing was written outside the
program's directory, no connection reached our listener, and the next test runs normally.
"""

import json
import os
import socket
import sys
import textwrap

import pytest
from sandbox import Sandbox, SandboxEscape, run_selftest
from sandbox.selftest import _leftover_processes

pytestmark = pytest.mark.usefixtures("readable_runtime")  # one cause, said once, where workers cannot read

ADD = "a, b = map(int, input().split())\nprint(a + b)\n"


def run(box, program, stdin="", expected="IMPOSSIBLE"):
    return box.run_test({"testtype": "stdin"}, program, {"input": stdin, "output": expected})


@pytest.fixture
def outside(tmp_path):
    """A directory the sandbox must not write to, a root-only secret, and a listener on 127.0.0.1."""
    os.chmod(tmp_path, 0o777)  # writable by anyone: only the sandbox may stop a write
    secret = tmp_path / "secret"
    secret.write_text("TOP-SECRET-VALUE")
    secret.chmod(0o600)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    yield {"dir": tmp_path, "secret": secret, "port": listener.getsockname()[1], "listener": listener}
    listener.close()


def assert_no_trace(box, outside):
    for pid in [os.getpid(), *box.server_pids]:
        os.kill(pid, 0)  # raises if the test process or a fork server was killed
    assert _leftover_processes(box.uids, box.server_pids) == []
    assert sorted(p.name for p in outside["dir"].iterdir()) == ["secret"], "a file was written outside"
    with pytest.raises(BlockingIOError):
        outside["listener"].accept()
    for worker in box._workers:  # every working directory is emptied after its test
        assert os.listdir(worker.workdir) == []
    assert run(box, ADD, "2 3\n", "5").verdict == "accepted", "the next test is affected"


HOSTILE = {
    "infinite loop": ("while True:\n    pass\n", {"time_limit"}),
    "sleep forever": ("import time\ntime.sleep(10**6)\n", {"time_limit"}),
    "fork bomb": ("import os\nwhile True:\n    os.fork()\n", {"sandbox_violation"}),
    "memory bomb": (
        "blocks = []\nwhile True:\n    blocks.append(bytearray(32 << 20))\n",
        {"memory_limit", "time_limit"},
    ),  # a busy machine may hit the clock first
    "one huge allocation": ("block = bytearray(1 << 30)\n", {"memory_limit"}),
    "300 MB print": (
        "import sys\nline = 'x' * (1 << 20)\nfor _ in range(300):\n    sys.stdout.write(line)\n",
        {"output_limit"},
    ),
    "file bomb": (
        "with open('big.bin', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))\n",
        {"sandbox_violation"},
    ),
    "write outside": ("open({dir!r} + '/escaped', 'w').write('x')\n", {"sandbox_violation"}),
    "read a root-only file": ("print(open({secret!r}).read())\n", {"runtime_error"}),
    "read the test process's environment": ("print(open('/proc/{pid}/environ').read())\n", {"runtime_error"}),
    "connect to 127.0.0.1": (
        "import ctypes, struct\nlibc = ctypes.CDLL(None)\nfd = libc.socket(2, 1, 0)\n"
        "address = struct.pack('=H', 2) + struct.pack('!H', {port}) + bytes([127, 0, 0, 1]) + bytes(8)\n"
        "print(libc.connect(fd, address, 16))\n",
        {"sandbox_violation"},
    ),
    "kill the parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", {"sandbox_violation"}),
    "kill(-1)": ("import os, signal\nos.kill(-1, signal.SIGKILL)\n", {"sandbox_violation"}),
    "double-fork daemon": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(60)\n    os._exit(0)\n",
        {"sandbox_violation"},
    ),
    "recursion bomb": (
        "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)\n",
        {"runtime_error", "memory_limit", "time_limit"},
    ),
    "sys.exit(0) before printing": ("import sys\nsys.exit(0)\nprint(5)\n", {"wrong_answer"}),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_is_contained(judge_sandbox, outside, name):
    template, verdicts = HOSTILE[name]
    program = template.format(
        dir=str(outside["dir"]), secret=str(outside["secret"]), port=outside["port"], pid=os.getpid()
    )
    outcome = run(judge_sandbox, program, "2 3\n", "5")
    assert outcome.verdict in verdicts, (outcome.verdict, outcome.detail)
    assert_no_trace(judge_sandbox, outside)


def test_environment_holds_no_secret(judge_sandbox, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")  # set in the trainer after the servers started
    answer, stdout, _, _ = judge_sandbox.run_one("import os, json\nprint(json.dumps(dict(os.environ)))\n", "")
    environment = json.loads(stdout)
    assert "AWS_SECRET_ACCESS_KEY" not in environment
    assert not any(key.startswith(("AWS_", "SM_", "PYTHON", "MASTER_")) for key in environment)
    assert environment["OMP_NUM_THREADS"] == "1"


LEGIT = {
    "numpy": ("import numpy as np\nprint(int(np.arange(10).sum()))\n", "", "45"),
    "thread with a big stack": (
        textwrap.dedent("""\
        import sys, threading
        sys.setrecursionlimit(100000)
        threading.stack_size(128 << 20)
        def depth(n):
            return 0 if n == 0 else 1 + depth(n - 1)
        result = []
        t = threading.Thread(target=lambda: result.append(depth(30000)))
        t.start()
        t.join()
        print(result[0])
        """),
        "",
        "30000",
    ),
    "read all of stdin": (
        "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))\n",
        "1 " * 300000,
        "300000",
    ),
    "large output under the cap": (
        "print('\\n'.join(map(str, range(300000))))\n",
        "",
        "\n".join(map(str, range(300000))),
    ),
    "non-daemon thread finishes after the main program": (
        "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.1), print(7))).start()\n",
        "",
        "7",
    ),
}


@pytest.mark.parametrize("name", list(LEGIT))
def test_legitimate_program_is_accepted(judge_sandbox, name):
    program, stdin, expected = LEGIT[name]
    outcome = run(judge_sandbox, program, stdin, expected)
    assert outcome.verdict == "accepted", outcome.detail


def test_runtime_error_and_syntax_error(judge_sandbox):
    assert run(judge_sandbox, "raise ValueError('boom')\n").verdict == "runtime_error"
    # The sandbox's own failure is told on a pipe the program never sees, not by an exit code.
    assert run(judge_sandbox, "import os\nos._exit(121)\n").verdict == "runtime_error"
    syntax = run(judge_sandbox, "def f(:\n")
    assert syntax.verdict == "runtime_error" and "SyntaxError" in syntax.detail


def test_selftest_passes_with_every_layer_and_logs_them():
    lines = []
    with Sandbox(workers=2) as box:
        results = run_selftest(box, log=lines.append)
        layers = box.active_layers()
    assert all(contained for _, _, contained in results)
    assert {"infinite loop", "fork bomb", "kill(-1)", "connect to a listener on 127.0.0.1"} <= {
        n for n, _, _ in results
    }
    assert "seccomp=on" in lines[0] and "landlock=" in lines[0] and "uid=" in lines[0]
    assert layers["seccomp"] and layers["rlimits"]


def test_selftest_holds_when_one_layer_is_missing():
    # Without seccomp the other layers (uid, Landlock, rlimits, the sweep) must still contain every attack.
    with Sandbox(workers=2, seccomp=False) as box:
        if not (box.active_layers()["uid"] and box.active_layers()["landlock"]):
            pytest.skip("needs root and Landlock to stand in for seccomp")
        run_selftest(box, log=lambda line: None)


def test_selftest_refuses_and_names_the_missing_layers():
    with Sandbox(workers=2, seccomp=False, landlock=False) as box:
        with pytest.raises(SandboxEscape) as failure:
            run_selftest(box, log=lambda line: None)
    message = str(failure.value)
    assert "refusing to train" in message
    assert "connect to a listener on 127.0.0.1" in message and "seccomp, landlock" in message


def test_a_dead_fork_server_is_replaced():
    with Sandbox(workers=1) as box:
        os.kill(box.server_pids[0], 9)
        outcome = run(box, ADD, "2 3\n", "5")
        assert outcome.verdict == "accepted", outcome.detail
        assert len(box.server_pids) == 1


def test_a_missing_seccomp_library_is_reported_with_the_fix(monkeypatch):
    from sandbox import confine

    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # import fails as without the package
    available, detail = confine.probe_layers(61000)["seccomp"]
    assert not available and "pip install pyseccomp" in detail
