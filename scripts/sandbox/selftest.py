"""Attack the sandbox with hostile programs before anything relies on it.

``run_selftest(sandbox)`` runs each attack below in the started sandbox and checks, beyond the
verdict, that the attack had no effect: the trainer and the fork servers are alive, no process of
a worker uid and no adopted orphan is left, nothing was written outside the working directory, no
connection reached a listener of the trainer, no secret was read. If any attack escapes it raises
``SandboxEscape`` naming the attack and the layers that should have stopped it and are off.

    python -m sandbox.selftest          # from scripts/: prints the layers and every attack's verdict
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import tempfile
import textwrap
from dataclasses import dataclass

from .judge import ACCEPTED, SERVER_ENV, Limits, Sandbox, classify

SELFTEST_LIMITS = Limits(time_limit=0.5, wall_limit=1.0, memory_mb=256, output_bytes=4 << 20)
# What a test may see: the fork servers' environment, HOME and TMPDIR (its working directory, set by
# forkserver.py) and LC_CTYPE (which Python's locale coercion may set).
ALLOWED_ENVIRONMENT = {*SERVER_ENV, "HOME", "TMPDIR", "LC_CTYPE"}


class SandboxEscape(RuntimeError):
    """A hostile program got out: training must not start."""


@dataclass
class Attack:
    name: str
    program: str
    verdicts: tuple[str, ...]  # acceptable verdicts
    layers: tuple[str, ...]  # what stops it; at least one must be on for the attack to run
    input: str = ""


def attacks(marker_dir: str, secret_file: str, port: int, trainer_pid: int) -> list[Attack]:
    outside = os.path.join(marker_dir, "escaped.txt")
    return [
        Attack("infinite loop", "while True:\n    pass\n", ("time_limit",), ("rlimits",)),
        Attack("sleep forever", "import time\ntime.sleep(10**6)\n", ("time_limit",), ("rlimits",)),
        Attack(
            "fork bomb",
            "import os\nwhile True:\n    os.fork()\n",
            ("sandbox_violation", "runtime_error", "time_limit"),
            ("seccomp", "uid"),
        ),
        Attack(
            "memory bomb",
            "blocks = []\nwhile True:\n    blocks.append(bytearray(32 << 20))\n",
            ("memory_limit", "time_limit"),
            ("rlimits",),
        ),  # a slow machine may hit the clock first
        Attack(
            "300 MB print",
            "import sys\nline = 'x' * (1 << 20)\nfor _ in range(300):\n    sys.stdout.write(line)\n",
            ("output_limit",),
            ("rlimits",),
        ),
        Attack(
            "file bomb",
            "with open('big.bin', 'wb') as f:\n    for _ in range(300):\n        f.write(b'x' * (1 << 20))\n",
            ("sandbox_violation", "output_limit", "runtime_error"),
            ("seccomp", "rlimits"),
        ),
        Attack(
            "write outside the working directory",
            f"with open({outside!r}, 'w') as f:\n    f.write('ESCAPED')\n",
            ("sandbox_violation", "runtime_error"),
            ("seccomp", "landlock", "uid"),
        ),
        Attack(
            "environment", "import os, json\nprint(json.dumps(dict(os.environ)))\n", ("wrong_answer",), ("rlimits",)
        ),
        Attack(
            "read a root-only file",
            f"print('ESCAPED', open({secret_file!r}).read())\n",
            ("runtime_error",),
            ("uid", "landlock"),
        ),
        Attack(
            "read the trainer's environment",
            f"print('ESCAPED', open('/proc/{trainer_pid}/environ', 'rb').read()[:50])\n",
            ("runtime_error",),
            ("uid", "landlock"),
        ),
        # Through libc, as a native extension would: the socket module need not be importable.
        Attack(
            "connect to a listener on 127.0.0.1",
            "import ctypes, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "fd = libc.socket(2, 1, 0)\n"
            f"address = struct.pack('=H', 2) + struct.pack('!H', {port}) + bytes([127, 0, 0, 1]) + bytes(8)\n"
            "if fd >= 0 and libc.connect(fd, address, 16) == 0:\n"
            "    libc.send(fd, b'ESCAPED', 7, 0)\n    print('ESCAPED')\n",
            ("sandbox_violation", "wrong_answer"),
            ("seccomp", "landlock"),
        ),
        Attack(
            "kill the parent",
            "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('ESCAPED')\n",
            ("sandbox_violation", "runtime_error"),
            ("seccomp", "uid"),
        ),
        # Returning from kill(-1) proves nothing; what matters is that everyone outside survives.
        Attack(
            "kill(-1)",
            "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
            ("sandbox_violation", "runtime_error", "wrong_answer"),
            ("seccomp", "uid"),
        ),
        Attack(
            "ptrace the parent",
            "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "if libc.ptrace(16, os.getppid(), 0, 0) == 0:\n    print('ESCAPED')\n",
            ("sandbox_violation", "wrong_answer"),
            ("seccomp", "uid"),
        ),
        Attack(
            "double-fork daemon",
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        time.sleep(60)\n    os._exit(0)\n",
            ("sandbox_violation", "wrong_answer"),
            ("seccomp", "uid", "subreaper"),
        ),
        Attack(
            "recursion bomb",
            "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)\n",
            ("runtime_error", "memory_limit", "time_limit"),
            ("rlimits",),
        ),
        Attack("sys.exit(0) before printing", "import sys\nsys.exit(0)\nprint(3)\n", ("wrong_answer",), ("rlimits",)),
    ]


LEGIT = [
    ("numpy", "import numpy as np\nprint(int(np.arange(10).sum()))\n", "", "45"),
    (
        "thread with a big stack",
        textwrap.dedent("""\
        import sys, threading
        sys.setrecursionlimit(200000)
        threading.stack_size(128 << 20)
        def depth(n):
            return 0 if n == 0 else 1 + depth(n - 1)
        def main():
            print(depth(50000))
        t = threading.Thread(target=main)
        t.start()
        t.join()
        """),
        "",
        "50000",
    ),
    (
        "read all of stdin",
        "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n",
        " ".join(["1"] * 200000),
        "200000",
    ),
    # Modules no fork server preloads: read from the interpreter's and numpy's folders in the test.
    (
        "the standard library and numpy.linalg",
        textwrap.dedent("""\
        from graphlib import TopologicalSorter
        import numpy.linalg
        order = list(TopologicalSorter({"b": {"a"}, "c": {"b"}}).static_order())
        print("".join(order), int(round(numpy.linalg.det(numpy.eye(3) * 2))))
        """),
        "",
        "abc 8",
    ),
]


def _leftover_processes(uids: list[int], server_pids: list[int]) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                status = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            continue
        uid = int(status.get("Uid", "-1").split()[0])
        ppid = int(status.get("PPid", "0").strip())
        if uid in uids or ppid in server_pids:
            found.append(f"pid {entry} ({status.get('Name', '?').strip()}, uid {uid}, ppid {ppid})")
    return found


def run_selftest(sandbox: Sandbox, log=print) -> list[tuple[str, str, bool]]:
    """Run every attack and legitimate program; raise SandboxEscape when anything got out."""
    layers = sandbox.active_layers()
    log(sandbox.describe())
    marker_dir = tempfile.mkdtemp(prefix="sandbox-selftest-")
    secret = secrets.token_hex(16)
    secret_file = os.path.join(marker_dir, "secret")
    with open(secret_file, "w") as handle:
        handle.write(secret)
    os.chmod(secret_file, 0o600)
    os.chmod(marker_dir, 0o733 if os.geteuid() == 0 else 0o700)  # writable, so only the sandbox stops a write
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    results, failures = [], []
    if sandbox.layout_problem:  # the cause, first: legitimate programs will fail for it
        log(f"sandbox self-test: {sandbox.layout_problem}")
        failures.append(sandbox.layout_problem)
    try:
        for attack in attacks(marker_dir, secret_file, port, os.getpid()):
            if not any(layers.get(layer) for layer in attack.layers):
                failures.append(
                    f"{attack.name}: not attempted, every layer that stops it is off ({', '.join(attack.layers)})"
                )
                continue
            answer, stdout, stderr, result = sandbox.run_one(attack.program, attack.input, limits=SELFTEST_LIMITS)
            answer["stderr"] = stderr.decode("utf-8", "replace")
            outcome = classify(
                answer, stdout, result, {"output": "IMPOSSIBLE-EXPECTED-OUTPUT"}, {"testtype": "stdin"}, SELFTEST_LIMITS
            )
            problems = []
            if outcome.verdict not in attack.verdicts:
                problems.append(
                    f"verdict {outcome.verdict} ({answer['stderr'][-200:]!r}), expected one of {attack.verdicts}"
                )
            if b"ESCAPED" in stdout or secret.encode() in stdout:
                problems.append(f"the program reported success: {stdout[:200]!r}")
            if attack.name == "environment":
                try:
                    leaked = set(json.loads(stdout)) - ALLOWED_ENVIRONMENT
                except ValueError:
                    leaked = {"<unreadable output>"}
                if leaked:
                    problems.append(f"environment variables reached the program: {sorted(leaked)}")
            if os.path.exists(os.path.join(marker_dir, "escaped.txt")):
                problems.append("a file was written outside the working directory")
                os.unlink(os.path.join(marker_dir, "escaped.txt"))
            try:
                connection, _ = listener.accept()
                connection.close()
                problems.append("a connection reached the trainer's listener")
            except BlockingIOError:
                pass
            for pid in [os.getpid(), *sandbox.server_pids]:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    problems.append(f"process {pid} (trainer or fork server) was killed")
            leftovers = _leftover_processes(sandbox.uids, sandbox.server_pids)
            if leftovers:
                problems.append("processes left behind: " + ", ".join(leftovers))
            ok = not problems
            results.append((attack.name, outcome.verdict, ok))
            log(f"sandbox self-test: {attack.name}: {outcome.verdict} {'contained' if ok else 'ESCAPED'}")
            if not ok:
                missing = [layer for layer in attack.layers if not layers.get(layer)]
                failures.append(
                    f"{attack.name}: {'; '.join(problems)}"
                    + (f" (layers off: {', '.join(missing)})" if missing else "")
                )
        for name, program, stdin, expected in LEGIT:
            outcome = sandbox.run_test(
                {"testtype": "stdin", "tests": []}, program, {"input": stdin, "output": expected}, SELFTEST_LIMITS
            )
            results.append((name, outcome.verdict, outcome.verdict == ACCEPTED))
            log(f"sandbox self-test: legitimate {name}: {outcome.verdict}")
            if outcome.verdict != ACCEPTED:
                failures.append(f"legitimate program '{name}' failed: {outcome.verdict} {outcome.detail[-300:]}")
    finally:
        listener.close()
        for name in os.listdir(marker_dir):
            os.unlink(os.path.join(marker_dir, name))
        os.rmdir(marker_dir)
    if failures:
        raise SandboxEscape(
            "sandbox self-test failed, refusing to train:\n  " + "\n  ".join(failures) + "\n" + sandbox.describe()
        )
    return results


if __name__ == "__main__":
    with Sandbox(workers=1) as box:
        run_selftest(box)
