"""Judge untrusted programs: a pool of fork servers, verdicts like a judge's, rewards.

    with Sandbox(workers=2) as sandbox:
        print(sandbox.describe())                      # which confinement layers are on
        result = sandbox.judge(problem, program)       # problem: {"testtype", "tests", ...}
        result.verdict, result.reward, result.passed, result.total

A problem follows the project's code schema: ``testtype`` "stdin" (tests feed ``input`` on stdin
and compare stdout with ``output``) or "functional" (``fn_name`` is called with the JSON argument
list ``input`` and its return value compared with the JSON value ``output``), optional
``float_tolerance``. Expected outputs never leave this process: the sandbox receives only the
program and one test's input.

A test's verdict, first match wins: ``judge_error`` (a layer failed to apply; the program did
not run), ``sandbox_violation`` (killed by seccomp), ``memory_limit`` (MemoryError),
``time_limit`` (CPU time over the limit or the wall clock over ``Limits.wall``),
``output_limit`` (output reached ``Limits.output_bytes``), ``runtime_error`` (non-zero exit,
signal, uncaught exception, syntax error), then ``accepted`` or ``wrong_answer`` from the checker.
A program's verdict is its first failing test's, ``no_code`` when the completion had no program.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import checker, confine

SERVER = Path(__file__).resolve().parent / "forkserver.py"
EXIT_MEMORY = 120  # the program raised MemoryError (forkserver.py)

ACCEPTED = "accepted"
VERDICTS = (
    "accepted",
    "wrong_answer",
    "time_limit",
    "memory_limit",
    "output_limit",
    "runtime_error",
    "sandbox_violation",
    "no_code",
    "judge_error",
)
REWARD_MODES = ("fraction", "all_or_nothing")
UID_BASE = 61000
# The uids are this machine's, whatever temporary folder a process has (a local-mode host has its own, as
# a container does): the locks that hand them out live at one path for the whole machine.
UID_LOCKS = Path("/tmp/sandbox-uid-locks")
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "RAYON_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
)

# The fork servers' whole environment: no credentials, no PYTHON*, one thread per numeric library.
SERVER_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    **{name: "1" for name in THREAD_VARIABLES},
}


@dataclass
class Limits:
    time_limit: float = 2.0  # CPU seconds per test
    wall_limit: float | None = None  # seconds per test, default 2 x time_limit + 1
    memory_mb: int = 512  # address space on top of the interpreter's own
    output_bytes: int = 16 << 20  # stdout (and a functional result) cap

    @property
    def wall(self) -> float:
        return self.wall_limit if self.wall_limit is not None else 2 * self.time_limit + 1


@dataclass
class TestOutcome:
    verdict: str
    wall: float = 0.0
    cpu: float = 0.0
    max_rss_kb: int = 0
    detail: str = ""


@dataclass
class Judgement:
    verdict: str  # the first failing test's verdict, or "accepted"
    reward: float
    passed: int
    total: int
    outcomes: list[TestOutcome] = field(default_factory=list)


class SandboxError(RuntimeError):
    """The sandbox itself failed (a worker died or could not start), not the judged program."""


# --------------------------------------------------------------------------- verdicts


def classify(answer: dict, stdout: bytes, result: bytes, test: dict, problem: dict, limits: Limits) -> TestOutcome:
    header_signal, code = answer["signal"], answer["exit_code"]
    outcome = TestOutcome("", answer["wall"], answer["cpu"], answer["max_rss_kb"])
    if not answer["confined"]:  # a layer failed to apply: the program never ran
        outcome.verdict, outcome.detail = "judge_error", answer.get("stderr", "")
    elif header_signal == signal.SIGSYS:
        outcome.verdict = "sandbox_violation"
    elif code == EXIT_MEMORY:  # the program ended on MemoryError, however long it took to get there
        outcome.verdict = "memory_limit"
    elif answer["timed_out"] or header_signal == signal.SIGXCPU or answer["cpu"] > limits.time_limit:
        outcome.verdict = "time_limit"
    elif header_signal == signal.SIGXFSZ or answer["stdout_bytes"] >= limits.output_bytes:
        outcome.verdict = "output_limit"
    elif code != 0:
        outcome.verdict = "runtime_error"
        outcome.detail = f"signal {signal.Signals(header_signal).name}" if header_signal else f"exit code {code}"
    elif problem.get("testtype") == "functional":
        if not result:
            outcome.verdict, outcome.detail = "runtime_error", "the function returned no JSON value"
        else:
            ok = checker.check_return_value(
                test["output"], result.decode("utf-8", "replace"), bool(problem.get("float_tolerance"))
            )
            outcome.verdict = ACCEPTED if ok else "wrong_answer"
    else:
        ok = checker.check_stdout(
            test["output"], stdout.decode("utf-8", "replace"), bool(problem.get("float_tolerance"))
        )
        outcome.verdict = ACCEPTED if ok else "wrong_answer"
    return outcome


# --------------------------------------------------------------------------- workers

_CLOSURE_SCRIPT = """
import json, sys, sysconfig
before = set(sys.modules)
for name in sys.argv[1:]:
    try:
        __import__(name)
    except ImportError:
        pass
roots = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})
def stdlib(module):
    path = getattr(module, "__file__", None) or ""
    return path.startswith(roots) and "-packages" not in path
print(json.dumps(sorted(n for n, m in list(sys.modules.items()) if n not in before and stdlib(m))))
"""


def stdlib_modules_needed_by(packages: tuple[str, ...], env: dict) -> list[str]:
    """The standard-library modules that importing ``packages`` pulls in (found in a subprocess).

    The fork server preloads them, so a test importing numpy only reads numpy's own files.
    """
    done = subprocess.run(
        [sys.executable, "-I", "-B", "-c", _CLOSURE_SCRIPT, *packages],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return json.loads(done.stdout) if done.returncode == 0 else []


def layout_problem(uid: int, hidden: list[str], unreadable: list[str], landlock: bool) -> str | None:
    """One line saying which folders the worker uid cannot read and the command that fixes it."""
    # A folder covers what lies beneath it (numpy/ and numpy/__init__.py: one fix).
    unreadable = [
        path for path in unreadable if not any(path.startswith(other.rstrip(os.sep) + os.sep) for other in unreadable)
    ]
    if not unreadable:
        return None
    if not landlock:  # no Landlock: hidden folders stay hidden rather than open to a climb through ``..``
        unreached = [path for path in unreadable if path in hidden]
        private = sorted({folder for path in unreached for folder in confine.private_folders(path)})
        if private:
            return (
                f"sandbox uid {uid} cannot reach {', '.join(unreached)}: a folder above is private, and "
                f"without Landlock the sandbox opens no view into it; "
                f"fix: chmod o+x {' '.join(map(shlex.quote, private))} (or turn Landlock on)"
            )
    return (
        f"sandbox uid {uid} cannot read {', '.join(unreadable)}, so judged programs cannot import "
        f"from there; fix: chmod -R o+rX {' '.join(map(shlex.quote, unreadable))}"
    )


def _write_frame(fd: int, header: dict) -> None:
    """A request to a fork server: 4-byte big-endian length, then JSON (see forkserver.py)."""
    encoded = json.dumps(header).encode()
    view = memoryview(len(encoded).to_bytes(4, "big") + encoded)
    while view:
        view = view[os.write(fd, view) :]


def _claim_uid(start: int) -> tuple[int, int]:
    """A uid no other sandbox on this machine uses: held through a lock file for our lifetime."""
    UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    for uid in range(start, start + 4096):
        fd = os.open(UID_LOCKS / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return uid, fd
        except BlockingIOError:
            os.close(fd)
    raise SandboxError(f"no free sandbox uid in {start}..{start + 4095} (see {UID_LOCKS})")


class Worker:
    """One fork server process and the pipes to it."""

    def __init__(
        self,
        index: int,
        uid: int | None,
        workdir: str,
        use_seccomp: bool,
        use_landlock: bool,
        preload: list[str],
        packages: tuple[str, ...],
    ):
        self.index, self.uid, self.workdir = index, uid, workdir
        self.config = {
            "uid": uid,
            "workdir": workdir,
            "max_threads": 64,
            "seccomp": use_seccomp,
            "landlock_abi": confine.landlock_abi() if use_landlock else 0,
            "preload": preload,
            "packages": list(packages),
        }
        self.process: subprocess.Popen | None = None
        self.ready: dict = {}

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-B", str(SERVER), json.dumps(self.config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=SERVER_ENV,
            cwd="/",
            close_fds=True,
        )
        self.ready = self._read_answer(timeout=120.0)[0]
        if not self.ready.get("ready"):
            raise SandboxError(f"sandbox worker {self.index} did not start: {self.ready}")

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            _write_frame(self.process.stdin.fileno(), {"stop": True})
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            self.process.kill()
            self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            pipe.close()
        self.process = None

    def _read_exact(self, n: int, deadline: float) -> bytes:
        fd, chunks, left = self.process.stdout.fileno(), [], n
        while left:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise SandboxError(f"sandbox worker {self.index} did not answer in time")
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise SandboxError(f"sandbox worker {self.index} exited (code {self.process.poll()})")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _read_answer(self, timeout: float) -> tuple[dict, bytes, bytes, bytes]:
        deadline = time.monotonic() + timeout
        header = json.loads(self._read_exact(int.from_bytes(self._read_exact(4, deadline), "big"), deadline))
        payloads = [
            self._read_exact(header.get(key, 0), deadline) for key in ("stdout_len", "stderr_len", "result_len")
        ]
        return header, *payloads

    def run(self, request: dict) -> tuple[dict, bytes, bytes, bytes]:
        if self.process is None or self.process.poll() is not None:
            self.stop()  # the server died since the last test: start a fresh one
            self.start()
        try:
            _write_frame(self.process.stdin.fileno(), request)
            # The server enforces the wall limit itself; this bound only catches a dead server.
            return self._read_answer(timeout=request["wall_limit"] + 30.0)
        except (OSError, SandboxError, ValueError) as error:
            self.stop()  # the next test starts a fresh server
            raise SandboxError(f"sandbox worker {self.index} failed during a test: {error}") from error


class Sandbox:
    """A pool of ``workers`` fork servers judging programs in parallel."""

    def __init__(
        self,
        workers: int = 2,
        limits: Limits | None = None,
        seccomp: bool = True,
        landlock: bool = True,
        drop_uid: bool = True,
        uid_base: int = UID_BASE,
        preload_packages: tuple[str, ...] = ("numpy",),
    ):
        self.limits = limits or Limits()
        self._preload_packages = preload_packages
        self.layers = confine.probe_layers(uid_base if drop_uid else None)
        if not drop_uid:
            self.layers["uid"] = (False, "turned off (drop_uid=False)")
        if not seccomp:
            self.layers["seccomp"] = (False, "turned off (seccomp=False)")
        if not landlock:
            self.layers["landlock"] = (False, "turned off (landlock=False)")
        self._use = {name: on for name, (on, _) in self.layers.items()}
        self._uid_base = uid_base
        self._n_workers = workers
        self._workers: list[Worker] = []
        self._uid_locks: list[int] = []
        self._idle: queue.Queue[Worker] = queue.Queue()
        self._pool: ThreadPoolExecutor | None = None
        self._root = ""
        self._lock = threading.Lock()
        # One line when the worker uids cannot read the interpreter or an allowed package, with the fix.
        self.layout_problem: str | None = None

    # ------------------------------------------------------------------ life cycle
    def start(self) -> Sandbox:
        self._root = tempfile.mkdtemp(prefix="sandbox-")
        os.chmod(self._root, 0o711)
        preload = stdlib_modules_needed_by(self._preload_packages, SERVER_ENV)
        try:
            for index in range(self._n_workers):
                uid = None
                if self._use["uid"]:
                    uid, lock = _claim_uid(self._uid_base if not self._uid_locks else self._workers[-1].uid + 1)
                    self._uid_locks.append(lock)
                worker = Worker(
                    index,
                    uid,
                    os.path.join(self._root, f"w{index}"),
                    self._use["seccomp"],
                    self._use["landlock"],
                    preload,
                    self._preload_packages,
                )
                worker.start()
                self._workers.append(worker)
                self._idle.put(worker)
        except BaseException:
            self.close()
            raise
        self.layers["subreaper"] = (
            all(w.ready["subreaper"] for w in self._workers),
            "fork servers adopt and sweep orphans",
        )
        for layer in ("seccomp", "landlock"):  # what the servers managed to build, not just the probe
            if self._use[layer] and not all(w.ready[layer] for w in self._workers):
                problems = "; ".join(p for w in self._workers for p in w.ready["problems"])
                self.layers[layer] = (False, f"the fork server could not set it up: {problems}")
        if self._use["uid"]:
            first = self._workers[0].ready
            if first["views"]:
                on, detail = self.layers["uid"]
                self.layers["uid"] = (
                    on,
                    f"{detail}; {', '.join(first['views'])} hidden from other users: "
                    f"read through views, confined by Landlock",
                )
            self.layout_problem = layout_problem(
                self._workers[0].uid, first["hidden"], first["unreadable"], first["landlock"]
            )
        self._pool = ThreadPoolExecutor(max_workers=self._n_workers, thread_name_prefix="sandbox")
        return self

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for worker in self._workers:
            worker.stop()
        self._workers = []
        for fd in self._uid_locks:
            os.close(fd)
        self._uid_locks = []
        if self._root:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = ""

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def uids(self) -> list[int]:
        return [w.uid for w in self._workers if w.uid is not None]

    @property
    def server_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process is not None]

    def active_layers(self) -> dict[str, bool]:
        return {name: on for name, (on, _) in self.layers.items()}

    def describe(self) -> str:
        return f"sandbox: {self._n_workers} workers; " + confine.describe_layers(self.layers)

    # ------------------------------------------------------------------ running
    def run_one(
        self,
        program: str,
        test_input: str,
        testtype: str = "stdin",
        fn_name: str | None = None,
        limits: Limits | None = None,
    ) -> tuple[dict, bytes, bytes, bytes]:
        """Run one program on one input in the next free worker: (status, stdout, stderr, result)."""
        limits = limits or self.limits
        request = {
            "program": program,
            "input": test_input,
            "mode": testtype,
            "fn_name": fn_name,
            "time_limit": limits.time_limit,
            "wall_limit": limits.wall,
            "memory_mb": limits.memory_mb,
            "output_bytes": limits.output_bytes,
        }
        worker = self._idle.get()
        try:
            return worker.run(request)
        finally:
            self._idle.put(worker)

    def run_test(self, problem: dict, program: str, test: dict, limits: Limits | None = None) -> TestOutcome:
        limits = limits or self.limits
        for attempt in range(2):  # a fork server that failed is replaced; the test gets one more try
            try:
                answer, stdout, stderr, result = self.run_one(
                    program, test["input"], problem.get("testtype", "stdin"), problem.get("fn_name"), limits
                )
                break
            except SandboxError as exc:
                if attempt:
                    return TestOutcome("judge_error", detail=str(exc))
        answer["stderr"] = stderr.decode("utf-8", "replace")
        outcome = classify(answer, stdout, result, test, problem, limits)
        if outcome.verdict == "runtime_error" and stderr:
            outcome.detail = stderr.decode("utf-8", "replace")[-400:]
        return outcome

    def _run_tests(self, problem: dict, program: str, tests: list[dict], stop_at_failure: bool) -> list[TestOutcome]:
        outcomes = []
        for test in tests:
            outcomes.append(self.run_test(problem, program, test))
            if stop_at_failure and outcomes[-1].verdict != ACCEPTED:
                break
        return outcomes

    def judge(self, problem: dict, program: str, reward_mode: str = "fraction") -> Judgement:
        return self.judge_many([(problem, program)], reward_mode)[0]

    def judge_many(self, items: list[tuple[dict, str]], reward_mode: str = "fraction") -> list[Judgement]:
        """Judge (problem, program) pairs on all workers at once.

        ``fraction``: every test runs, reward = passed / total. ``all_or_nothing``: tests run in
        order and stop at the first failure, reward 1 only when all pass.
        """
        if reward_mode not in REWARD_MODES:
            raise ValueError(f"reward mode {reward_mode!r} is not one of {REWARD_MODES}")
        if self._pool is None:
            raise SandboxError("the sandbox is not started: use `with Sandbox(...) as sandbox:` or .start()")
        if reward_mode == "fraction":  # one unit per test spreads a single program over every worker
            units = [(i, [test], False) for i, (problem, _) in enumerate(items) for test in problem["tests"]]
        else:
            units = [(i, items[i][0]["tests"], True) for i in range(len(items))]
        futures = [
            (i, self._pool.submit(self._run_tests, items[i][0], items[i][1], tests, stop)) for i, tests, stop in units
        ]
        per_item: list[list[TestOutcome]] = [[] for _ in items]
        for i, future in futures:
            per_item[i].extend(future.result())
        judgements = []
        for (problem, _), outcomes in zip(items, per_item, strict=True):
            total = len(problem["tests"])
            passed = sum(o.verdict == ACCEPTED for o in outcomes)
            failed = [o.verdict for o in outcomes if o.verdict != ACCEPTED]
            verdict = failed[0] if failed else (ACCEPTED if total else "judge_error")
            if reward_mode == "fraction":
                reward = passed / total if total else 0.0
            else:
                reward = 1.0 if total and passed == total else 0.0
            judgements.append(Judgement(verdict, reward, passed, total, outcomes))
        return judgements
