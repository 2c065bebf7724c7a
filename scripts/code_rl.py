"""Code RL: GRPO on competitive-programming problems, rewarded by running the programs in a sandbox.

Roles (torchrun, gloo process group):
  rank 0       the learner: the GRPO loop of ``grpo.py`` (``grpo.train``) on this process alone
               (a single-learner context); its environment (``environments/code.py``) sends every
               step's programs and tests to the judges and waits for their verdicts, whose rates
               (``accepted_rate``, ..., ``pass_rate``, ``judge_time``) join the step's metric line;
  ranks 1..N   judges: each runs a sandbox (``sandbox/``) with ``--judge_workers`` fork servers,
               receives its share of the programs, judges them, sends verdicts and rewards back.
With one process, rank 0 judges in its own sandbox.

Before anything is judged each judge runs the sandbox self-test (hostile programs: fork bombs,
sockets, kill, files outside the working directory, ...) and logs which confinement layers are on;
if any attack escapes, every rank stops with the reason. At the end rank 0 tells the judges to stop;
every collective has a timeout (``--judge_timeout``), so a failed rank never leaves the others hanging.

Networking: run the job with ``enable_network_isolation=True`` and the model as channel ``model``;
the sandbox blocks sockets anyway, because isolation still leaves the cluster's own hosts reachable.

Data: channel ``train`` with ``train.jsonl``, one problem a line, in the project's code schema or a
public layout (code_contests, APPS/TACO, LiveCodeBench): see ``environments/code.py``.

Run by hand (CPU, tiny model, 1 learner + 1 judge):
    SM_CHANNEL_TRAIN=data/code torchrun --nproc_per_node 2 code_rl.py --model_name_or_path /path/to/model
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import grpo
import torch.distributed as dist
from common import contract, distributed
from common.contract import UserError, option
from environments.code import CodeEnvironment, local_judge
from sandbox import Limits, Sandbox, SandboxEscape, run_selftest

log = logging.getLogger("code_rl")
STOP = "stop"


@dataclass
class CodeRLArgs(grpo.GRPOArgs):
    help_group = "judging"  # the heading of these options in --help

    reward_mode: Literal["fraction", "all_or_nothing"] = option(
        "fraction", "fraction: reward = share of tests passed (all tests run); all_or_nothing: 1 only if every test "
                    "passes, judging stops at the first failure")
    max_tests: int = option(0, "judge at most this many tests per problem, in data order; 0 = all")
    time_limit: float = option(2.0, "CPU seconds per test")
    memory_limit_mb: int = option(512, "memory per test on top of the interpreter, in MiB")
    output_limit_mb: int = option(16, "largest output per test, in MiB")
    judge_workers: int = option(0, "sandbox workers (tests run at once) per judging process; 0 = this host's CPUs "
                                   "divided by the processes on it")
    judge_timeout: float = option(3600.0, "seconds any rank waits for the others (a judge waits for rank 0 through "
                                          "generation and the update) before failing")
    self_test: bool = option(True, "attack the sandbox with hostile programs before judging and refuse to train if "
                                   "any escapes")

    def validate(self, world_size: int) -> None:
        super().validate(world_size)
        contract.require_at_least_one(self, "memory_limit_mb", "output_limit_mb")
        for name in ("time_limit", "judge_timeout"):
            if getattr(self, name) <= 0:
                raise UserError(f"--{name} must be positive, got {getattr(self, name)} (seconds).")
        for name in ("max_tests", "judge_workers"):
            if getattr(self, name) < 0:
                raise UserError(f"--{name} cannot be negative, got {getattr(self, name)} (0 is the default).")


def parse_args(argv: list[str] | None = None) -> CodeRLArgs:
    return contract.HyperparameterParser(CodeRLArgs, description=__doc__, prog="code_rl.py").parse(argv)


def make_sandbox(args: CodeRLArgs) -> Sandbox:
    workers = args.judge_workers or max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    limits = Limits(time_limit=args.time_limit, memory_mb=args.memory_limit_mb,
                    output_bytes=args.output_limit_mb << 20)
    # Judges on one host take disjoint uids (claimed through lock files); the base keeps them apart at a glance.
    return Sandbox(workers=workers, limits=limits, uid_base=61000 + 256 * int(os.environ.get("LOCAL_RANK", 0)))


def self_test(args: CodeRLArgs, sandbox: Sandbox) -> str | None:
    """The sandbox self-test on this rank: None when it held, else the reason."""
    if not args.self_test:
        log.info("%s", sandbox.describe())
        log.warning("sandbox self-test skipped (--self_test false)")
        return None
    try:
        run_selftest(sandbox, log=log.info)
    except SandboxEscape as escape:
        return str(escape)
    log.info("sandbox self-test passed: every hostile program was contained")
    return None


def agree_on_self_tests(own: str | None, world_size: int) -> None:
    """Every rank learns every judge's self-test result; all stop together if one failed."""
    results = [None] * world_size
    dist.all_gather_object(results, own)
    failed = [f"rank {rank}: {reason}" for rank, reason in enumerate(results) if reason]
    if failed:
        raise UserError("The sandbox is not safe on this machine, so code RL will not train.\n" + "\n".join(failed))


class RemoteJudge:
    """Rank 0's judge: scatter (problem, program) pairs over ranks 1..N, gather their verdicts."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def __call__(self, items: list[tuple[dict, str]], reward_mode: str) -> list[dict]:
        judges = self.world_size - 1
        shares = [[] for _ in range(self.world_size)]
        for index, item in enumerate(items):  # round robin: a group's programs spread over all judges
            shares[1 + index % judges].append((index, item))
        received = [None]
        dist.scatter_object_list(received, [{"reward_mode": reward_mode, "items": share} for share in shares], src=0)
        gathered = [None] * self.world_size
        dist.gather_object(None, gathered, dst=0)
        results: list[dict | None] = [None] * len(items)
        for rank, answer in enumerate(gathered[1:], start=1):
            if "error" in answer:
                raise RuntimeError(f"judge rank {rank} failed: {answer['error']}")
            for index, result in answer["results"]:
                results[index] = result
        return results

    def stop(self) -> None:
        dist.scatter_object_list([None], [STOP] * self.world_size, src=0)


def serve_as_judge(sandbox: Sandbox) -> None:
    """Ranks 1..N: judge what rank 0 sends until it says stop."""
    judge = local_judge(sandbox)
    judged = 0
    while True:
        received = [None]
        dist.scatter_object_list(received, None, src=0)
        message = received[0]
        if message == STOP:
            log.info("judge: %d programs judged, stopping", judged)
            return
        try:
            indices = [index for index, _ in message["items"]]
            verdicts = judge([item for _, item in message["items"]], message["reward_mode"]) if indices else []
            answer = {"results": list(zip(indices, verdicts, strict=True))}
            judged += len(indices)
        except Exception as error:  # noqa: BLE001 - rank 0 must hear about it instead of waiting
            log.exception("judging failed")
            answer = {"error": f"{type(error).__name__}: {error}"}
        dist.gather_object(answer, None, dst=0)


def main() -> None:
    args = parse_args()
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    learner = distributed.single_learner()  # rank 0 trains alone; no gradient is shared with the judges
    args.validate(learner.world_size)  # on every rank, before a sandbox starts (grpo.train checks again)

    if world_size == 1:
        with make_sandbox(args) as sandbox:
            reason = self_test(args, sandbox)
            if reason:
                raise UserError("The sandbox is not safe on this machine, so code RL will not train.\n" + reason)
            env = CodeEnvironment(local_judge(sandbox), args.reward_mode, args.max_tests)
            grpo.train(args, env, learner)
        return

    # Objects only (programs, verdicts) travel between ranks: gloo on CPU, whatever the devices.
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.judge_timeout))
    try:
        if rank == 0:
            agree_on_self_tests(None, world_size)
            judge = RemoteJudge(world_size)
            env = CodeEnvironment(judge, args.reward_mode, args.max_tests)
            try:
                grpo.train(args, env, learner)
            finally:
                try:
                    judge.stop()  # also after a failure, so judges exit now instead of at the timeout
                except Exception:  # noqa: BLE001 - the judges are gone already; keep the first error
                    log.exception("could not tell the judges to stop")
        else:
            with make_sandbox(args) as sandbox:
                agree_on_self_tests(self_test(args, sandbox), world_size)
                serve_as_judge(sandbox)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    contract.run_main(main)
