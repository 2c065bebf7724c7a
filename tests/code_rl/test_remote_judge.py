"""The judge transport of the heterogeneous layout (``environments/remote_judge.py``), without a job:
judge services with an echoing judge (no sandbox), so failover is checked in seconds.

- programs are spread over the judges and come back in order;
- a judge that answers with an error, or not within ``verdict_timeout``, has its chunk resent;
- a supervised service SIGKILLed in the middle of a request: its chunk is judged by the other judge,
  the supervisor restarts the service, the next call uses it again, and the stop ends the host with 0;
- no judge left: a UserError; and the cluster options of ``code_rl.py`` refuse bad values.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from common.contract import UserError
from environments import remote_judge

pytestmark = pytest.mark.timeout(60)
HERE = Path(__file__).resolve().parent


def start_judge(name, behaviour=None):
    """A judge service in a thread of this process; returns its (host, port)."""

    def judge(items, reward_mode):
        if behaviour:
            behaviour(items)
        return [{"verdict": "accepted", "reward": 1.0, "program": program, "judge": name} for _, program in items]

    listener = remote_judge.listen(0)
    info = {"host": name, "workers": 1, "sandbox": f"echo {name}"}
    threading.Thread(target=remote_judge.serve, args=(listener, judge, info, 30.0), daemon=True).start()
    return ("127.0.0.1", listener.getsockname()[1])


def items(n, program=lambda i: f"p{i}"):
    return [({"tests": []}, program(i)) for i in range(n)]


def test_programs_are_spread_over_the_judges_and_come_back_in_order():
    judges = remote_judge.RemoteJudges([start_judge("a"), start_judge("b")], verdict_timeout=10)
    judges.wait_until_ready(10)
    results = judges(items(9), "fraction")
    assert [r["program"] for r in results] == [f"p{i}" for i in range(9)]
    assert {r["judge"] for r in results} == {"a", "b"}
    judges.stop()


def test_a_failing_or_silent_judge_has_its_chunk_resent():
    def fails(_):
        raise RuntimeError("the sandbox is gone")

    def hangs(_):
        time.sleep(3)

    addresses = [start_judge("fails", fails), start_judge("hangs", hangs), start_judge("good")]
    judges = remote_judge.RemoteJudges(addresses, verdict_timeout=0.5)
    judges.wait_until_ready(10)
    started = time.monotonic()
    results = judges(items(12), "fraction")
    assert [r["program"] for r in results] == [f"p{i}" for i in range(12)]
    assert {r["judge"] for r in results} == {"good"}
    assert time.monotonic() - started < 2.5  # the silent judge cost one timeout, not its sleep
    assert [str(j) for j in judges.live] == [f"127.0.0.1:{addresses[2][1]}"]


def test_a_learner_that_hangs_up_before_its_verdicts_leaves_no_traceback(capfd):
    # what a learner's verdict_timeout does to a slow judge: the judge answers a closed connection
    address = start_judge("slow", lambda _: time.sleep(1))
    body = json.dumps({"items": [[{"tests": []}, "p0"]], "reward_mode": "fraction"}).encode()
    with socket.create_connection(address) as connection:
        connection.sendall(b"POST /judge HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(2)  # the judge has answered by now, to nobody
    assert "Traceback" not in capfd.readouterr().err
    judges = remote_judge.RemoteJudges([address], verdict_timeout=10)  # and it still judges
    assert [r["program"] for r in judges(items(2), "fraction")] == ["p0", "p1"]


def test_no_judge_left_is_a_user_error():
    def fails(_):
        raise RuntimeError("broken")

    judges = remote_judge.RemoteJudges([start_judge("x", fails), start_judge("y", fails)], verdict_timeout=5)
    with pytest.raises(UserError, match="Every judge is gone .* programs of this step have no verdict"):
        judges(items(4), "fraction")


def test_a_judge_that_never_starts_is_named():
    judges = remote_judge.RemoteJudges([("127.0.0.1", 1)], verdict_timeout=5)
    with pytest.raises(UserError, match="Judge 127.0.0.1:1 did not answer within 1 s"):
        judges.wait_until_ready(1)


class Host:
    """supervised_judge.py in a process of its own, its stdout read line by line."""

    def __init__(self, name):
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "supervised_judge.py"), name],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines = []
        self.port = int(self.expect("PORT ").split()[1])

    def expect(self, prefix, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            self.lines.append(line)
            if line.startswith(prefix):
                return line
            if not line:
                break
        raise AssertionError(f"no line {prefix!r} in:\n{''.join(self.lines)}")


def test_a_killed_service_is_replaced_by_the_others_then_restarted(tmp_path):
    host = Host("supervised")
    try:
        service = int(host.expect("SERVICE ").split()[1])
        other = start_judge("other")
        judges = remote_judge.RemoteJudges([("127.0.0.1", host.port), other], verdict_timeout=30)
        judges.wait_until_ready(10)
        slow = items(4, program=lambda i: "slow")
        answer = {}
        call = threading.Thread(target=lambda: answer.update(results=judges(slow, "fraction")))
        call.start()
        host.expect("JUDGING ")  # the service holds a chunk now
        os.kill(service, signal.SIGKILL)
        call.join(timeout=20)
        assert [r["judge"] for r in answer["results"]] == ["other"] * 4  # every program got its verdict
        assert [j.port for j in judges.live] == [other[1]]

        restarted = int(host.expect("SERVICE ").split()[1])
        assert restarted != service
        assert "died (killed by signal 9); restarting it (1 of 5)" in "".join(host.lines)
        results = judges(items(8), "fraction")  # the restarted service rejoins
        assert {r["judge"] for r in results} == {"supervised", "other"}
        judges.stop()
        host.expect("SUPERVISOR DONE")
        assert host.process.wait(timeout=10) == 0
    finally:
        host.process.kill()
        host.process.wait()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"judge_group": "judges"}, "'judges' is not an instance group of this job \\(groups: learner, judge\\)"),
        ({"judge_port": 80}, "--judge_port 80 must be in 1024..65533"),
    ],
)
def test_bad_cluster_options_are_user_errors(monkeypatch, change, message):
    import code_rl

    monkeypatch.setenv(
        "SM_INSTANCE_GROUPS_DICT", '{"learner": {"hosts": ["algo-1"]}, "judge": {"hosts": ["algo-2", "algo-3"]}}'
    )
    args = code_rl.parse_args(["--judge_group", "judge"])
    for key, value in change.items():
        setattr(args, key, value)
    with pytest.raises(UserError, match=message):
        code_rl.judge_addresses(args)


def test_a_verdict_timeout_of_zero_is_refused():
    import code_rl

    with pytest.raises(UserError, match="--verdict_timeout must be positive, got 0"):
        code_rl.parse_args(["--judge_group", "judge", "--verdict_timeout", "0"]).validate(1)


def test_judge_addresses_give_each_judge_host_its_port(monkeypatch):
    import code_rl

    monkeypatch.setenv(
        "SM_INSTANCE_GROUPS_DICT", '{"learner": {"hosts": ["algo-1"]}, "judge": {"hosts": ["algo-2", "algo-3"]}}'
    )
    args = code_rl.parse_args(["--judge_group", "judge", "--judge_port", "30000"])
    assert code_rl.judge_addresses(args) == [("algo-2", 30000), ("algo-3", 30001)]
    monkeypatch.setenv("SM_INSTANCE_GROUPS_DICT", '{"homogeneousCluster": {"hosts": ["algo-1"]}}')
    with pytest.raises(UserError, match="only instance group"):
        code_rl.judge_addresses(code_rl.parse_args(["--judge_group", "homogeneousCluster"]))
