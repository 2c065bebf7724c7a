"""The confinement layers a judged program runs under, and probes saying which ones work here.

Each layer stands on its own so that one missing layer never opens the sandbox by itself:

- ``rlimits``   CPU seconds, address space, output file size, open files, processes, no core files.
- ``uid``       when started as root: a per-worker unprivileged uid (file permissions apply, the
                program cannot signal or trace anything else, RLIMIT_NPROC applies again). Import
                folders the uid cannot reach (a runtime under /root or ``mktemp -d``) are read
                through views (``open_views``), under Landlock only; see README.md.
- ``landlock``  (Linux 5.13+) reads only from the Python installation and the system libraries,
                writes only in the private working directory, no TCP (ABI 4+), no signals or
                abstract unix sockets outside the sandbox (ABI 6+).
- ``seccomp``   (libseccomp.so.2 through pyseccomp) kills the process on: sockets other than
                AF_UNIX and any connect/bind/listen/accept, fork/vfork/clone without CLONE_THREAD,
                signals to other processes, setsid/setpgid, ptrace, namespaces, mounts, bpf,
                SysV IPC, memfd, io_uring, opening files for writing and changing the file tree.
                Seccomp cannot see paths, so it forbids file writes everywhere; the program's
                output goes to descriptors opened before the filter.
- ``subreaper``  the fork server adopts orphans (PR_SET_CHILD_SUBREAPER) and sweeps them after
                every test, so nothing outlives a test even in a container without an init.

What each layer leaves to the others (so the self-test asks for at least one layer per attack):
seccomp cannot see paths (Landlock and the uid confine reads); Landlock does not cover UDP or
fork (seccomp does); the uid alone leaves world-writable directories and UDP open; rlimits
bound time, memory and output but not what a program touches. Namespaces are not used: a
SageMaker container (unprivileged, default seccomp profile) cannot create them.

Everything here is standard library plus ``pyseccomp`` (ctypes over libseccomp); it runs both in
the fork server (per test, in the forked child) and in the training process (for the probes).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import resource
import sys

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36

# Landlock syscall numbers are the same on x86_64 and aarch64 (the unified syscall table).
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1

# Filesystem rights by ABI version (linux/landlock.h).
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
FS_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | (1 << 14) | (1 << 15)  # + TRUNCATE, IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2


def set_parent_death_signal(signal_number: int) -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal_number, 0, 0, 0)


def become_subreaper() -> bool:
    """Adopt orphaned descendants so they can be killed and reaped (no zombies without an init)."""
    return _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def set_no_new_privs() -> None:
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def set_not_dumpable() -> None:
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


# --------------------------------------------------------------------------- rlimits, uid


def apply_rlimits(
    cpu_seconds: int, address_space_bytes: int, output_bytes: int, open_files: int, processes: int | None
) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (address_space_bytes, address_space_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (output_bytes, output_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if processes is not None:
        # Counts every thread of the uid; only meaningful once the uid is private to the worker.
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def drop_to_uid(uid: int) -> None:
    """Become ``uid``/``uid`` with no supplementary groups and no capabilities left (needs root)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


# --------------------------------------------------------------------------- landlock


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none (old kernel, or disabled at boot)."""
    version = _libc.syscall(
        SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION)
    )
    return max(int(version), 0)


def _fs_rights(abi: int) -> int:
    return FS_RIGHTS_BY_ABI[max(v for v in FS_RIGHTS_BY_ABI if v <= abi)]


def runtime_read_paths() -> list[str]:
    """What a Python program needs to read: the interpreter, its libraries, a few system files."""
    candidates = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        *[p for p in sys.path if p],
        "/usr/lib",
        "/usr/lib64",
        "/usr/local/lib",
        "/lib",
        "/lib64",
        "/usr/share/zoneinfo",
        "/etc/ld.so.cache",
        "/etc/localtime",
        "/dev/null",
        "/dev/zero",
        "/dev/urandom",
        "/sys/devices/system/cpu",
        "/proc/cpuinfo",
    ]
    paths = []
    for path in candidates:
        real = os.path.realpath(path)
        if os.path.exists(real) and real not in paths and real != "/":
            paths.append(real)
    return paths


def landlock_ruleset(abi: int, read_paths: list[str], write_dir: str) -> int:
    """A ruleset fd: read the runtime, read and write ``write_dir``, no TCP, scoped signals.

    Built once by the fork server; each child only enforces it (``landlock_enforce``).
    """
    fs_rights = _fs_rights(abi)
    attr = _RulesetAttr(
        handled_access_fs=fs_rights,
        handled_access_net=(NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0,
        scoped=(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0,
    )
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    read_rights = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    for path, rights in [(path, read_rights) for path in read_paths] + [(write_dir, fs_rights)]:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            if not os.path.isdir(path):
                rights &= FS_FILE_ONLY
            rule = _PathBeneathAttr(allowed_access=rights & fs_rights, parent_fd=fd)
            if (
                _libc.syscall(
                    SYS_LANDLOCK_ADD_RULE,
                    ctypes.c_int(ruleset),
                    ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                    ctypes.byref(rule),
                    ctypes.c_uint32(0),
                )
                != 0
            ):
                os.close(ruleset)
                raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
        finally:
            os.close(fd)
    return ruleset


def landlock_enforce(ruleset: int) -> None:
    """Restrict this process (and threads it starts later) for the rest of its life."""
    set_no_new_privs()
    if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")


# --------------------------------------------------------------------------- seccomp


def seccomp_module():
    """``pyseccomp`` when it and libseccomp.so.2 load, else the reason why not (a string)."""
    try:
        import pyseccomp
    except ImportError as exc:
        return f"the pyseccomp package is missing ({exc}); pip install pyseccomp"
    except (OSError, RuntimeError) as exc:
        return (
            f"libseccomp.so.2 could not be loaded ({exc}); install it in the image "
            f"(Debian/Ubuntu: apt-get install libseccomp2)"
        )
    return pyseccomp


# Killed outright: nothing a contest solution needs, everything an escape does.
DENIED_SYSCALLS = [
    # processes, sessions, tracing
    "fork",
    "vfork",
    "setsid",
    "setpgid",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_open",
    "pidfd_send_signal",
    "pidfd_getfd",
    "tkill",
    "kcmp",
    # networking beyond a socketpair
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    "sendmsg",
    "sendmmsg",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # namespaces, mounts, kernel objects
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "open_by_handle_at",
    "name_to_handle_at",
    "fsopen",
    "fsmount",
    "fsconfig",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    # memory that outlives the process or escapes RLIMIT_AS
    "shmget",
    "shmat",
    "msgget",
    "semget",
    "mq_open",
    "memfd_create",
    # changing the file tree (seccomp cannot see paths, so nowhere)
    "creat",
    "rename",
    "renameat",
    "renameat2",
    "unlink",
    "unlinkat",
    "mkdir",
    "mkdirat",
    "rmdir",
    "link",
    "linkat",
    "symlink",
    "symlinkat",
    "chmod",
    "fchmod",
    "fchmodat",
    "chown",
    "fchown",
    "lchown",
    "fchownat",
    "mknod",
    "mknodat",
    "truncate",
    "utime",
    "utimes",
    "utimensat",
    "futimesat",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
]
AF_UNIX = 1
CLONE_THREAD = 0x00010000
OPEN_WRITE_FLAGS = [os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_APPEND]


# The filter is compiled once per fork server with this stand-in for the child's pid, which
# every child patches into its copy of the program before loading it.
PID_PLACEHOLDER = 0x7A5E1D0F
SECCOMP_SET_MODE_FILTER = 1
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def seccomp_program(pyseccomp) -> bytes:
    """The filter as classic BPF (8-byte instructions), with ``PID_PLACEHOLDER`` for the pid."""
    kill = pyseccomp.KILL_PROCESS
    arg = pyseccomp.Arg
    f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            f.add_rule(kill, name)
        except (OSError, RuntimeError, ValueError):
            pass  # a syscall this architecture does not have (e.g. fork on aarch64)
    f.add_rule(kill, "socket", arg(0, pyseccomp.NE, AF_UNIX))
    f.add_rule(kill, "socketpair", arg(0, pyseccomp.NE, AF_UNIX))
    f.add_rule(kill, "sendto", arg(4, pyseccomp.NE, 0))  # sendto with a destination address
    # Threads are clone(CLONE_THREAD|...); anything else is a new process.
    f.add_rule(kill, "clone", arg(0, pyseccomp.MASKED_EQ, CLONE_THREAD, 0))
    # clone3 and openat2 pass their flags in a struct seccomp cannot read: ENOSYS makes glibc fall
    # back to clone/openat, which the rules above do see.
    f.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "openat2")
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        f.add_rule(kill, name, arg(0, pyseccomp.NE, PID_PLACEHOLDER))
    for flag in OPEN_WRITE_FLAGS:
        f.add_rule(kill, "open", arg(1, pyseccomp.MASKED_EQ, flag, flag))
        f.add_rule(kill, "openat", arg(2, pyseccomp.MASKED_EQ, flag, flag))
    fd = os.memfd_create("seccomp-bpf")
    try:
        with os.fdopen(os.dup(fd), "wb") as handle:
            f.export_bpf(handle)
        program = os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)
    if not program or len(program) % 8 or not placeholder_offsets(program):
        raise RuntimeError("libseccomp produced a filter this sandbox cannot patch")
    return program


def placeholder_offsets(program: bytes) -> list[int]:
    """Where the pid goes: the byte offsets of the ``k`` fields holding ``PID_PLACEHOLDER``."""
    return [
        i + 4
        for i in range(0, len(program), 8)
        if int.from_bytes(program[i + 4 : i + 8], sys.byteorder) == PID_PLACEHOLDER
    ]


def load_seccomp_program(program: bytes, offsets: list[int], own_pid: int) -> None:
    """Patch the pid into the compiled filter at ``offsets`` and load it into this process."""
    patched = bytearray(program)
    pid = own_pid.to_bytes(4, sys.byteorder)
    for offset in offsets:
        patched[offset : offset + 4] = pid
    buffer = (ctypes.c_char * len(patched)).from_buffer(patched)
    fprog = _SockFprog(len(patched) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    set_no_new_privs()
    number = SYS_SECCOMP[os.uname().machine]
    if _libc.syscall(number, ctypes.c_uint(SECCOMP_SET_MODE_FILTER), ctypes.c_uint(0), ctypes.byref(fprog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER) failed")


# --------------------------------------------------------------------------- views

# Where a fork server keeps its views (below RLIMIT_NOFILE's 64, above the child's 0-3).
VIEW_FD_BASE = 10


def _readable(path: str) -> bool:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        return True
    except OSError:
        return False


def view_path(views: dict[str, int], path: str) -> str:
    """``path`` as seen through the view of the folder holding it (``/proc/self/fd/N/...``)."""
    for root, fd in sorted(views.items(), key=lambda item: len(item[0]), reverse=True):
        if path == root or path.startswith(root.rstrip(os.sep) + os.sep):
            return f"/proc/self/fd/{fd}{path[len(root) :]}"
    return path


def open_views(uid: int, roots: list[str], must_read: list[str]) -> tuple[dict[str, int], list[str]]:
    """Views of the ``roots`` that ``uid`` cannot reach, and what it cannot read even through them.

    A view is a descriptor on the folder, opened here as root. ``/proc/self/fd/N`` starts a path
    lookup at that folder, so the folders above it are not searched (a private home, a
    ``mktemp -d`` folder), while every file below keeps its own mode. A child that becomes ``uid``
    checks each root by its path and ``must_read`` (roots and package files) through the views:
    the truth for this uid, not a guess from mode bits.
    """
    fds = {}
    for root in roots:
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        fds[root] = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, VIEW_FD_BASE)
        os.close(fd)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            drop_to_uid(uid)
            hidden = [root for root in roots if not _readable(root)]
            views = {root: fds[root] for root in hidden}
            unreadable = [path for path in must_read if not _readable(view_path(views, path))]
            os.write(write_end, json.dumps([hidden, unreadable]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    answer = b""
    while chunk := os.read(read_end, 1 << 16):
        answer += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    if not answer:
        raise OSError(f"could not check what uid {uid} can read (the checking child failed)")
    hidden, unreadable = json.loads(answer)
    for root, fd in fds.items():
        if root not in hidden:
            os.close(fd)
    return {root: fds[root] for root in hidden}, unreadable


def import_through_views(views: dict[str, int]) -> None:
    """In the child: imports from a viewed folder (sys.path, a package's __path__) go through its view."""
    if not views:
        return
    hooks = list(sys.path_hooks)

    def through_view(path: str):
        seen = view_path(views, path)
        if seen == path:
            raise ImportError(f"{path} is read directly")  # the next hook takes it
        for hook in hooks:
            try:
                return hook(seen)
            except ImportError:
                continue
        raise ImportError(f"no importer for {seen}")

    sys.path_hooks.insert(0, through_view)
    sys.path_importer_cache.clear()  # the server's finders look at the paths themselves


def private_folders(path: str) -> list[str]:
    """The folders on the way to ``path`` that other users cannot enter."""
    parts = os.path.abspath(path).split(os.sep)
    folders = [os.sep.join(parts[:i]) for i in range(2, len(parts) + 1)]
    return [f for f in folders if os.path.isdir(f) and not os.stat(f).st_mode & 0o001]


# --------------------------------------------------------------------------- probes


def probe_layers(uid: int | None) -> dict[str, tuple[bool, str]]:
    """Which layers this machine offers: {layer: (available, detail)}. Starts no process."""
    layers: dict[str, tuple[bool, str]] = {}
    layers["rlimits"] = (True, "cpu, address space, file size, open files, core=0")
    if os.geteuid() == 0 and uid is not None:
        layers["uid"] = (True, f"root drops to per-worker uids from {uid}")
    else:
        layers["uid"] = (
            False,
            "not root: programs keep the trainer's uid (file permissions of "
            "that uid apply; signals and ptrace rest on seccomp/landlock)",
        )
    abi = landlock_abi()
    if abi:
        extras = (["tcp"] if abi >= 4 else []) + (["signals", "abstract sockets"] if abi >= 6 else [])
        layers["landlock"] = (True, f"ABI {abi}: filesystem" + "".join(f", {x}" for x in extras))
    else:
        layers["landlock"] = (
            False,
            "kernel has no Landlock (needs Linux 5.13+ with CONFIG_SECURITY_LANDLOCK and lsm=landlock)",
        )
    module = seccomp_module()
    if isinstance(module, str):
        layers["seccomp"] = (False, module)
    else:
        layers["seccomp"] = (True, f"libseccomp API level {module.get_api()}")
    return layers


def describe_layers(layers: dict[str, tuple[bool, str]]) -> str:
    return "; ".join(f"{name}={'on' if on else 'OFF'} ({detail})" for name, (on, detail) in layers.items())
