"""Fork server: one clean, pre-warmed interpreter per worker that forks a confined child per test.

Started by ``judge.Sandbox`` as ``python -I -B forkserver.py '<config json>'`` with an environment
holding only ``PATH``, ``LANG`` and ``*_NUM_THREADS=1``. It reads requests on stdin and answers on
stdout, one at a time (framing below). For each request it:

1. makes a private working directory owned by the worker's uid, and memory files for stdin,
   stdout, stderr and (functional tests) the return value;
2. forks a child that becomes a new session, puts those files on descriptors 0-3, closes every
   other descriptor, sets the rlimits, drops to the worker's uid, restricts itself with Landlock
   and seccomp, and then runs the program with ``exec`` in a fresh ``__main__`` namespace;
3. waits up to the wall-clock limit, kills the process group, then every process of the worker's
   uid and every process the server has adopted as subreaper, and reaps them all;
4. answers with the exit status, times, peak memory and the captured output, and removes the
   working directory.

What a child inherits from the server, and why each is harmless:
- Memory: the interpreter with the preloaded modules, this server's code and the current request
  (the program and this test's input; never the expected output, never another test). A program
  can find these through ``gc``; it learns nothing it does not already have.
- Module state: preloaded modules are copies; a program changing them changes only its own copy.
  ``random`` is reseeded from the OS in every child, so tests do not share a random sequence; the
  str hash seed is per worker (fixed when the server started), not per test.
- Descriptors: only 0-3 survive, and the views (``O_PATH`` descriptors on import folders the worker
  uid cannot reach, opened only under Landlock; imports go through ``/proc/self/fd/N``). The
  server's request and answer pipes are closed, so a program cannot forge an answer.
- Environment: the server's own (no credentials) plus HOME and TMPDIR set to the working directory.
- Signal handlers are reset to the defaults (SIGXFSZ kills, as it does for a C program).
- The working directory is the worker's own, the same path every test, emptied after each one.
- The address-space layout is the server's (fork does not re-randomise it). A program can read and
  write its own memory through ctypes anyway; nothing outside its process is mapped.
- Kernel-side: a new session and process group, the worker uid, its own rlimits; the Landlock
  ruleset and the seccomp filter are compiled once in the server and only enforced in the child
  (the ruleset's descriptor is closed before the program runs).
- Not run: ``atexit`` handlers the program registers (the child ends with ``os._exit`` after
  flushing its output and joining its non-daemon threads).

Framing, both directions: 4-byte big-endian header length, a JSON header, then raw payload bytes
whose lengths the header gives (answers only: stdout, stderr, result). No pickle anywhere.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import select
import shutil
import signal
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import confine  # noqa: E402

del sys.path[0]  # the program must not find the sandbox's own sources on its path

EXIT_MEMORY = 120  # the program raised MemoryError
EXIT_SETUP_FAILED = 121  # a confinement layer failed to apply: the test is not run
# Imported once by the server so that a test finds them ready instead of reading them again.
PRELOAD = [
    "abc",
    "array",
    "base64",
    "bisect",
    "calendar",
    "cmath",
    "collections",
    "collections.abc",
    "contextlib",
    "copy",
    "dataclasses",
    "datetime",
    "decimal",
    "enum",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "io",
    "itertools",
    "json",
    "math",
    "numbers",
    "operator",
    "queue",
    "random",
    "re",
    "statistics",
    "string",
    "struct",
    "textwrap",
    "threading",
    "time",
    "traceback",
    "typing",
    "unicodedata",
]


# --------------------------------------------------------------------------- framing


def read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_frame(fd: int) -> dict:
    (length,) = struct.unpack(">I", read_exact(fd, 4))
    return json.loads(read_exact(fd, length))


def write_frame(fd: int, header: dict, *payloads: bytes) -> None:
    encoded = json.dumps(header).encode()
    write_all(fd, struct.pack(">I", len(encoded)) + encoded + b"".join(payloads))


# --------------------------------------------------------------------------- the child


def _vm_size_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _confine_child(
    request: dict,
    config: dict,
    files: list[int],
    confined_fd: int,
    landlock_fd: int | None,
    seccomp_bpf: bytes | None,
    interpreter_bytes: int,
    views: dict[str, int],
) -> None:
    os.setsid()
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)
    if landlock_fd is not None:
        # Before the uid drop, and before the descriptor is closed below.
        confine.landlock_enforce(landlock_fd)
    for target, fd in enumerate(files):
        os.dup2(fd, target)
    start = len(files)
    for keep in sorted({confined_fd, *views.values()}):
        os.closerange(start, keep)
        start = keep + 1
    os.closerange(start, 1 << 16)
    workdir = config["workdir"]
    os.chdir(workdir)
    os.umask(0o077)
    os.environ["HOME"] = os.environ["TMPDIR"] = workdir
    uid = config["uid"]
    confine.apply_rlimits(
        cpu_seconds=max(1, int(request["time_limit"] + 0.999)),
        # The interpreter is already mapped; the program's budget comes on top of it.
        address_space_bytes=interpreter_bytes + request["memory_mb"] * (1 << 20),
        output_bytes=request["output_bytes"],
        open_files=64,
        processes=config["max_threads"] if uid is not None else None,
    )
    if uid is not None:
        confine.drop_to_uid(uid)
        confine.import_through_views(views)
    confine.set_parent_death_signal(signal.SIGKILL)  # after setuid, which clears it
    confine.set_not_dumpable()
    if seccomp_bpf is not None:
        confine.load_seccomp_program(seccomp_bpf, config["pid_offsets"], os.getpid())
    # Every layer is on: say so on a pipe the program never sees (an exit code it could fake).
    os.write(confined_fd, b"1")
    os.close(confined_fd)


def _run_program(request: dict) -> int:
    """Run the program as ``__main__``; returns the exit code."""
    import builtins
    import random
    import threading
    import traceback
    import types

    random.seed()
    sys.argv = ["solution.py"]
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", closefd=False)
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    main.__dict__["__file__"] = "solution.py"
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(request["program"], "solution.py", "exec"), main.__dict__)
        if request["mode"] == "functional":
            code = _call_function(main.__dict__, request)
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except MemoryError:
        print("MemoryError", file=sys.stderr)
        code = EXIT_MEMORY
    except BaseException:  # the program's own failure: a runtime error with its traceback
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = code or 1
    return code


def _call_function(namespace: dict, request: dict) -> int:
    name = request["fn_name"]
    solution_class = namespace.get("Solution")
    if isinstance(solution_class, type) and hasattr(solution_class, name):
        function = getattr(solution_class(), name)  # LeetCode style: class Solution: def name(self, ...)
    elif callable(namespace.get(name)):
        function = namespace[name]
    else:
        print(f"no function named {name!r} (nor a class Solution with that method)", file=sys.stderr)
        return 1
    arguments = json.loads(request["input"])
    if not isinstance(arguments, list):
        arguments = [arguments]
    result = json.dumps(function(*arguments))
    sys.stdout.flush()
    write_all(3, result.encode())
    return 0


# --------------------------------------------------------------------------- the server


def _direct_children() -> list[int]:
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(x) for x in handle.read().split()]
    except OSError:  # kernel without CONFIG_PROC_CHILDREN: scan every process's parent
        children = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as handle:
                        if int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                            children.append(int(entry))
                except (OSError, ValueError, IndexError):
                    pass
        return children


def sweep(uid: int | None, group: int) -> int:
    """Kill and reap everything the test left: its group, its uid, every adopted orphan."""
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None:
        # kill(-1) as the worker uid reaches exactly that uid's processes. The saved uid stays 0,
        # so the server takes root back right after.
        os.setresuid(uid, uid, 0)
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finally:
            os.setresuid(0, 0, 0)
    reaped, deadline = 0, time.monotonic() + 5.0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid:
            reaped += 1
            continue
        for child in _direct_children():  # orphans adopted as subreaper, still running
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            return reaped
        time.sleep(0.001)


def _read_file(fd: int, limit: int) -> bytes:
    size = os.fstat(fd).st_size
    return os.pread(fd, min(size, limit), 0) if size else b""


CPU_CHECK_SECONDS = 0.02
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """CPU time of all of the process's threads so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND  # utime + stime


def _wait(pid: int, started: float, cpu_limit: float, wall_limit: float) -> bool:
    """Wait for the child to end; True if it ran past the CPU or the wall-clock limit.

    RLIMIT_CPU only counts whole seconds, so the CPU limit is also checked here every 20 ms.
    """
    watcher = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(watcher, select.POLLIN)
        while True:
            left = wall_limit - (time.monotonic() - started)
            if left <= 0:
                return True
            if poller.poll(int(min(left, CPU_CHECK_SECONDS) * 1000) + 1):
                return False
            if _cpu_seconds(pid) > cpu_limit:
                return True
    finally:
        os.close(watcher)


def _empty(directory: str) -> None:
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            os.unlink(entry.path)


def run_test(
    request: dict, config: dict, landlock_fd: int | None, seccomp_bpf: bytes | None, views: dict[str, int]
) -> tuple[dict, bytes, bytes, bytes]:
    files = [os.memfd_create(name, os.MFD_CLOEXEC) for name in ("stdin", "stdout", "stderr", "result")]
    try:
        write_all(files[0], request["input"].encode())
        os.lseek(files[0], 0, os.SEEK_SET)
        interpreter_bytes = _vm_size_bytes()  # the child starts with the server's address space
        confined_read, confined_write = os.pipe()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            code = EXIT_SETUP_FAILED
            try:
                try:
                    _confine_child(
                        request, config, files, confined_write, landlock_fd, seccomp_bpf, interpreter_bytes, views
                    )
                except BaseException as exc:
                    import traceback

                    os.write(2, f"sandbox set-up failed: {exc!r}\n{traceback.format_exc()}".encode())
                    os._exit(EXIT_SETUP_FAILED)
                code = _run_program(request)
            finally:
                os._exit(code)
        os.close(confined_write)
        timed_out = _wait(pid, started, request["time_limit"], request["wall_limit"])
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        wall = time.monotonic() - started
        leftovers = sweep(config["uid"], pid)
        confined = os.read(confined_read, 1) == b"1"  # the child has exited: never blocks
        os.close(confined_read)
        header = {
            "confined": confined,
            "exit_code": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "timed_out": timed_out,
            "wall": round(wall, 4),
            "cpu": round(usage.ru_utime + usage.ru_stime, 4),
            "max_rss_kb": usage.ru_maxrss,
            "leftover_processes": leftovers,
        }
        limit = request["output_bytes"]
        stdout, stderr, result = (
            _read_file(files[1], limit),
            _read_file(files[2], 1 << 16),
            _read_file(files[3], limit),
        )
        header["stdout_bytes"] = os.fstat(files[1]).st_size
        return header, stdout, stderr, result
    finally:
        for fd in files:
            os.close(fd)
        _empty(config["workdir"])  # the next test starts in an empty directory


def _runtime_views(config: dict, landlock: bool) -> tuple[dict[str, int], list[str], list[str]]:
    """Views for the import folders the worker uid cannot reach; what it still cannot read.

    Returns (views, hidden roots, unreadable paths). A view lets the program climb with ``..`` to
    the folders above it, so views are opened only under Landlock, which confines every read to the
    runtime; without it a hidden root stays hidden and is reported instead.
    """
    if config["uid"] is None:
        return {}, [], []
    roots = [path for path in dict.fromkeys(sys.path) if path and os.path.isdir(path)]
    must_read = list(roots)
    for name in config["packages"]:  # the allowed packages: their folder and first file
        spec = importlib.util.find_spec(name)
        if spec is not None:
            must_read += [*(spec.submodule_search_locations or []), *([spec.origin] if spec.has_location else [])]
    views, unreadable = confine.open_views(config["uid"], roots, must_read)
    hidden = sorted(views)
    if not landlock:
        for fd in views.values():
            os.close(fd)
        views = {}
        unreadable = sorted(set(unreadable) | set(hidden))
    return views, hidden, unreadable


def main() -> None:
    config = json.loads(sys.argv[1])
    confine.set_parent_death_signal(signal.SIGKILL)  # never outlive the judge that started us
    config["subreaper"] = confine.become_subreaper()
    read_paths = confine.runtime_read_paths()
    for name in PRELOAD + config["preload"]:
        try:
            __import__(name)
        except ImportError:
            pass
    # One private working directory per worker, emptied after every test.
    os.makedirs(config["workdir"], mode=0o700, exist_ok=True)
    os.chmod(config["workdir"], 0o700)
    _empty(config["workdir"])
    if config["uid"] is not None:
        os.chown(config["workdir"], config["uid"], config["uid"])
    # Both filters are compiled once here; a child only patches its pid in and loads them.
    seccomp_bpf, landlock_fd, problems = None, None, []
    if config["seccomp"]:
        module = confine.seccomp_module()
        if isinstance(module, str):
            problems.append(module)
        else:
            seccomp_bpf = confine.seccomp_program(module)
            config["pid_offsets"] = confine.placeholder_offsets(seccomp_bpf)
    if config["landlock_abi"]:
        landlock_fd = confine.landlock_ruleset(config["landlock_abi"], read_paths, config["workdir"])
    views, hidden, unreadable = _runtime_views(config, landlock_fd is not None)
    requests, answers = 0, 1
    # Hand the pipes to high descriptors so that the child's dup2 onto 0-3 never needs them.
    requests, answers = os.dup(requests), os.dup(answers)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    gc.collect()
    gc.freeze()  # the collector in a child then leaves the server's objects (and their pages) alone
    write_frame(
        answers,
        {
            "ready": True,
            "pid": os.getpid(),
            "subreaper": config["subreaper"],
            "seccomp": seccomp_bpf is not None,
            "landlock": landlock_fd is not None,
            "problems": problems,
            "preloaded": sorted(set(PRELOAD) & set(sys.modules)),
            "views": sorted(views),
            "hidden": hidden,
            "unreadable": unreadable,
        },
    )
    while True:
        try:
            request = read_frame(requests)
        except EOFError:
            return
        if request.get("stop"):
            return
        header, stdout, stderr, result = run_test(request, config, landlock_fd, seccomp_bpf, views)
        header.update(stdout_len=len(stdout), stderr_len=len(stderr), result_len=len(result))
        write_frame(answers, header, stdout, stderr, result)


if __name__ == "__main__":
    main()
