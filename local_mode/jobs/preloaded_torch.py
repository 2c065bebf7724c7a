"""A warm process that forks training hosts with PyTorch already imported.

The PyTorch container's entry point imports ``torch`` before it starts the user script (to set
``SM_DLC_TORCH_VERSION``); on a laptop that import is most of a host's start-up time. This server
imports torch (and boto3) once, then forks one child per host on request. Each child does what
``unshare ... train`` would do: new session, optional mount/UTS namespaces with the private
/etc/hosts and the tree at /opt/ml, the host's environment, then the toolkit's own
``sagemaker_training.trainer.train()`` (the ``train`` command of the training image).

``sagemaker_training`` reads ``SAGEMAKER_BASE_DIR`` when it is imported, so it is preloaded only
with ``--preload-toolkit`` (mount namespaces: every host sees the literal /opt/ml); otherwise
each child imports it after its environment is set.

Protocol (JSON lines): stdin ``{"id", "env", "cwd", "output", "namespace": null | [hosts_file,
tree, hostname]}``; stdout ``{"id", "pid"}`` when forked and ``{"exited": pid, "code": n}``.
Run by path (``python -u preloaded_torch.py``) so that nothing else is imported before the fork.
"""

import ctypes
import errno
import json
import os
import select
import signal
import socket
import sys
import time
import traceback

import psutil

try:  # what the toolkit imports first; safe before the host's environment is set
    import boto3  # noqa: F401
    import torch  # noqa: F401  the slow import this process exists for
except ImportError:
    pass  # the host imports (or misses) them itself, as it would without this server

if "--preload-toolkit" in sys.argv:
    # Only when every host sees its tree at the literal /opt/ml (mount namespaces): the toolkit's
    # environment module fixes its paths from SAGEMAKER_BASE_DIR when it is imported.
    try:
        import sagemaker_pytorch_container.training  # noqa: F401
    except ImportError:
        pass

CLONE_NEWNS, CLONE_NEWUTS = 0x00020000, 0x04000000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1


def _enter_namespaces(hosts_file: str, tree: str, hostname: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"{what}: {os.strerror(error)}")

    check(libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    check(libc.mount(hosts_file.encode(), b"/etc/hosts", None, MS_BIND, None), "bind /etc/hosts")
    check(libc.mount(tree.encode(), b"/opt/ml", None, MS_BIND, None), "bind /opt/ml")
    socket.sethostname(hostname)


def _open_output(path: str) -> int:
    """The FIFO the runner reads; waits (60 s at most) for the runner to open its end."""
    deadline = time.monotonic() + 60
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.set_blocking(fd, True)
            return fd
        except OSError as error:
            if error.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _run_host(request: dict) -> None:
    """In the forked child: become the host, run the toolkit, never return."""
    code = 1
    try:
        # A process group of its own, for stopping it with whatever it starts; not a session, which
        # Linux's autogroup scheduling would make a CPU group of its own, out of its notebook's priority.
        os.setpgid(0, 0)
        # If this server is killed outright, the toolkit process goes with it.
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        output = _open_output(request["output"])
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        if request["namespace"]:
            _enter_namespaces(*request["namespace"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["train"]
        from sagemaker_training import trainer

        trainer.train()  # exits through sys.exit with the job's code
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _stop_children(children: set[int]) -> None:
    """SIGTERM every host's process tree, SIGKILL what is left after a few seconds."""
    tree = []
    for pid in children:
        try:
            parent = psutil.Process(pid)
            tree += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for member in tree:
        try:
            member.terminate()
        except psutil.NoSuchProcess:
            pass
    for member in psutil.wait_procs(tree, timeout=5)[1]:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass


def _reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()  # nothing may sit in the buffer when a child is forked


def main() -> None:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin = sys.stdin.fileno()
    pending = b""
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([stdin, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                children.discard(pid)
                _reply({"exited": pid, "code": os.waitstatus_to_exitcode(status)})
        if stdin in ready:
            chunk = os.read(stdin, 65536)
            if not chunk:
                _stop_children(children)  # the kernel that started us is gone: so are its jobs
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _run_host(request)
                children.add(pid)
                _reply({"id": request["id"], "pid": pid})


if __name__ == "__main__":
    main()
