"""The code judge on other hosts: judge services on CPU hosts, and the learners' client (stdlib only).

Used by ``code_rl.py`` on a heterogeneous cluster (``--judge_group``). It sits next to
``code.py`` because it is that environment's ``judge(items, reward_mode)`` carried over the
network, and nothing in it needs torch or the training loop (a training session's loop may use it too).

Protocol: HTTP/1.0 with JSON bodies, one request per connection (no pickles: a judge host only
ever parses JSON from the network).
    GET  /ready   -> {"host", "workers", "sandbox"}             the service is up, its self-test held
    POST /judge   {"reward_mode", "items": [[problem, program], ...]} -> {"verdicts": [...]}
    POST /stop    -> {"judged"}                                 the service exits 0 after answering

Judge host (``listen``, ``supervise``, ``serve``): the entry process binds the port and runs the
service in a forked child that serves on the same listening socket. When the child dies (killed,
out of memory) the port stays bound, connections wait in its backlog, and the supervisor starts a
new child at once: a judge host is many cores, and the cause (a worker killed under memory
pressure, a crashed fork server) is usually gone with the process. After ``MAX_RESTARTS`` the
supervisor stops restarting and answers every judging request with 503 until the learners' stop,
then exits 0: the job goes on with the other judges, as SageMaker (and local mode) fail the whole
job when any host exits non-zero.

Learner (``RemoteJudges``): each scoring call cuts the programs into chunks (about
``CHUNKS_PER_JUDGE`` per live judge, so a faster judge takes more and a failure resends little),
keeps one chunk in flight per judge, and resends the chunk of a judge that fails or does not answer
within ``verdict_timeout`` to the others. A lost judge is asked ``/ready`` again at the next call
and rejoins if it answers. When no judge is left, ``UserError``.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import multiprocessing
import socket
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from common.contract import UserError

log = logging.getLogger("remote_judge")

MAX_RESTARTS = 5
CHUNKS_PER_JUDGE = 2
PROBE_TIMEOUT = 5.0  # seconds for /ready and /stop; judging has its own timeout


# --------------------------------------------------------------------------- judge host


def listen(port: int) -> socket.socket:
    """The judge's listening socket on every interface (the learners connect by host name)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", port))
    except OSError as error:
        listener.close()
        raise UserError(
            f"The judge cannot listen on port {port}: {error}. Choose another --judge_port "
            "(each judge host uses --judge_port + its index in the judge group)."
        ) from error
    listener.listen(128)
    return listener


class _Server(ThreadingHTTPServer):
    """An HTTP server on an already listening socket; one thread per request (learners in parallel)."""

    def __init__(self, listener: socket.socket, judge, info: dict):
        super().__init__(listener.getsockname(), _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = listener
        self.judge, self.info = judge, info
        self.judged, self.stopped, self.last_contact = 0, False, time.monotonic()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format, *args):  # noqa: A002 - http.server's name; one line per request is noise
        pass

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        try:
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            # the learner hung up first (its verdict_timeout passed, and it resent the chunk elsewhere):
            # nobody is left to answer, which is no error of this service's
            log.info("the learner hung up before its answer (%s %s)", self.command, self.path)

    def do_GET(self):  # noqa: N802 - http.server's name
        self.server.last_contact = time.monotonic()
        if self.path != "/ready":
            return self._answer(404, {"error": f"unknown path {self.path}"})
        if self.server.judge is None:
            return self._answer(503, {"error": "this judge service is out of order"})
        self._answer(200, self.server.info)

    def do_POST(self):  # noqa: N802 - http.server's name
        self.server.last_contact = time.monotonic()
        if self.path == "/stop":
            self._answer(200, {"judged": self.server.judged})
            self.server.stopped = True
            return
        if self.path != "/judge":
            return self._answer(404, {"error": f"unknown path {self.path}"})
        if self.server.judge is None:
            return self._answer(503, {"error": "this judge service died too often and is out of order"})
        try:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            items = [(problem, program) for problem, program in request["items"]]
            verdicts = self.server.judge(items, request["reward_mode"])
        except Exception as error:  # noqa: BLE001 - the learner resends elsewhere; it must hear why
            log.exception("judging failed")
            return self._answer(500, {"error": f"{type(error).__name__}: {error}"})
        self.server.judged += len(items)
        self.server.last_contact = time.monotonic()  # a long request is no silence
        self._answer(200, {"verdicts": verdicts})


def serve(listener: socket.socket, judge, info: dict, idle_timeout: float) -> int:
    """Answer requests until ``/stop`` or until nobody has called for ``idle_timeout`` seconds
    (the learners are gone without a word). ``judge=None`` answers 503 to judging. Returns the
    number of programs judged."""
    server = _Server(listener, judge, info)
    server.timeout = 1.0  # handle_request returns at least this often to look at the clock
    while not server.stopped:
        server.handle_request()
        if time.monotonic() - server.last_contact > idle_timeout:
            log.warning("judge: no learner called for %.0f s; stopping", idle_timeout)
            break
    return server.judged


def supervise(listener: socket.socket, service: Callable[[socket.socket], None], idle_timeout: float) -> None:
    """Run ``service(listener)`` in a forked child until it exits 0 (told to stop); restart it when it
    dies, ``MAX_RESTARTS`` times, then answer 503 until the learners' stop (see the module docstring)."""
    context = multiprocessing.get_context("fork")  # the child inherits the bound socket
    for attempt in range(MAX_RESTARTS + 1):
        child = context.Process(target=service, args=(listener,), name="judge-service")
        child.start()
        child.join()
        if child.exitcode == 0:
            return
        how = f"killed by signal {-child.exitcode}" if child.exitcode < 0 else f"exit code {child.exitcode}"
        if attempt < MAX_RESTARTS:
            log.warning(
                "judge service pid %d died (%s); restarting it (%d of %d)", child.pid, how, attempt + 1, MAX_RESTARTS
            )
    log.error(
        "judge service died %d times; this host judges no more and waits for the learners' stop", MAX_RESTARTS + 1
    )
    serve(listener, None, {}, idle_timeout)


# --------------------------------------------------------------------------- learner


class JudgeUnavailable(Exception):
    """A judge did not answer, or answered with an error: its programs go to the others."""


class JudgeHost:
    """One judge service, by host name and port."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.workers = 0

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    def request(self, method: str, path: str, body: dict | None, timeout: float) -> dict:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = json.loads(response.read() or b"{}")
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise JudgeUnavailable(f"{type(error).__name__}: {error}") from error
        finally:
            connection.close()
        if response.status != 200:
            raise JudgeUnavailable(f"HTTP {response.status}: {answer.get('error', '')}")
        return answer

    def judge(self, items: list[tuple[dict, str]], reward_mode: str, timeout: float) -> list[dict]:
        verdicts = self.request("POST", "/judge", {"reward_mode": reward_mode, "items": items}, timeout)["verdicts"]
        if len(verdicts) != len(items):
            raise JudgeUnavailable(f"{len(verdicts)} verdicts for {len(items)} programs")
        return verdicts


class RemoteJudges:
    """A ``Judge`` (``environments/code.py``) over judge services on other hosts, with failover."""

    def __init__(self, addresses: list[tuple[str, int]], verdict_timeout: float):
        if not addresses:
            raise UserError("No judge hosts: the judge instance group has no hosts.")
        self.judges = [JudgeHost(host, port) for host, port in addresses]
        self.live = list(self.judges)
        self.verdict_timeout = verdict_timeout
        self.pool = ThreadPoolExecutor(max_workers=len(self.judges), thread_name_prefix="judge-client")

    def wait_until_ready(self, timeout: float) -> None:
        """Wait for every judge to answer ``/ready`` (they run the sandbox self-test first)."""
        deadline = time.monotonic() + timeout
        for judge in self.judges:
            while True:
                try:
                    info = judge.request("GET", "/ready", None, PROBE_TIMEOUT)
                    break
                except JudgeUnavailable as error:
                    if time.monotonic() > deadline:
                        raise UserError(
                            f"Judge {judge} did not answer within {timeout:.0f} s (--judge_timeout): "
                            f"{error}. Its log says why (self-test, port, start-up)."
                        ) from error
                    time.sleep(1.0)
            judge.workers = info["workers"]
            log.info("judge %s ready: %s", judge, info["sandbox"])

    def __call__(self, items: list[tuple[dict, str]], reward_mode: str) -> list[dict]:
        self._rejoin()
        results: list[dict | None] = [None] * len(items)
        size = max(1, math.ceil(len(items) / (CHUNKS_PER_JUDGE * max(len(self.live), 1))))
        pending = deque(range(start, min(start + size, len(items))) for start in range(0, len(items), size))
        idle, running = list(self.live), {}
        while pending or running:
            while pending and idle:
                judge, chunk = idle.pop(), pending.popleft()
                future = self.pool.submit(judge.judge, [items[i] for i in chunk], reward_mode, self.verdict_timeout)
                running[future] = (judge, chunk)
            if not running:
                raise UserError(
                    f"Every judge is gone ({', '.join(map(str, self.judges))}); "
                    f"{sum(map(len, pending))} programs of this step have no verdict. "
                    "The judge hosts' logs say why."
                )
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                judge, chunk = running.pop(future)
                try:
                    verdicts = future.result()
                except JudgeUnavailable as error:
                    self.live.remove(judge)
                    log.warning(
                        "judge %s failed (%s): its %d programs go to the %d other judge(s)",
                        judge,
                        error,
                        len(chunk),
                        len(self.live),
                    )
                    pending.appendleft(chunk)
                    continue
                for index, verdict in zip(chunk, verdicts, strict=True):
                    results[index] = verdict
                idle.append(judge)
        return results

    def _rejoin(self) -> None:
        """Judges lost in an earlier call that answer ``/ready`` again (their service was restarted)."""
        lost = [judge for judge in self.judges if judge not in self.live]
        for judge, answered in zip(lost, self.pool.map(self._ready, lost), strict=True):
            if answered:
                log.info("judge %s is back", judge)
                self.live.append(judge)

    @staticmethod
    def _ready(judge: JudgeHost) -> bool:
        try:
            judge.request("GET", "/ready", None, PROBE_TIMEOUT)
            return True
        except JudgeUnavailable:
            return False

    def stop(self) -> None:
        """Tell every judge service to stop (their hosts then exit 0); a judge that does not answer is
        logged, not raised: the learners' work is done."""
        for judge in self.judges:
            try:
                answer = judge.request("POST", "/stop", {}, PROBE_TIMEOUT * 6)
                log.info("judge %s stopped after %d programs", judge, answer["judged"])
            except JudgeUnavailable as error:
                log.warning("judge %s did not take the stop: %s", judge, error)
        self.pool.shutdown(wait=False)
