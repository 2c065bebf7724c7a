"""Code RL: GRPO on competitive-programming problems, rewarded by running the programs in a sandbox.

Two layouts; ``--judge_group`` picks one.

Torchrun ranks (default; gloo process group):
  rank 0       the learner: the GRPO loop of ``grpo.py`` (``grpo.train``) on this process alone
               (a single-learner context); its environment (``environments/code.py``) sends every
               step's programs and tests to the judges and waits for their verdicts, whose rates
               (``accepted_rate``, ..., ``test_pass_fraction``, ``judge_time``) join the step's metric line;
  ranks 1..N   judges: each runs a sandbox (``sandbox/``) with ``--judge_workers`` fork servers,
               receives its share of the programs, judges them, sends verdicts and rewards back.
With one process, rank 0 judges in its own sandbox.

A heterogeneous cluster (``--judge_group judge``; ``ResourceConfig.InstanceGroups``, e.g. GPU
learners ``learner`` x 1 ml.p5.48xlarge and CPU judges ``judge`` x 4 ml.c7i.16xlarge):
  learner group  torchrun over the group's hosts; every process is a learner of one GRPO loop
                 (DDP/FSDP, ``--strategy``; rank 0 logs, checkpoints and saves), and each sends its
                 own completions' programs to the judge hosts over TCP (``environments/remote_judge.py``);
  judge group    one process per host (send the hyperparameter
                 ``sagemaker_distribution_instance_groups=["learner"]``: the PyTorch estimator drops
                 ``distribution["instance_groups"]``, and without it the toolkit starts a torchrun on the
                 judge hosts too); each runs the self-test, then a judge service with as many sandbox
                 workers as the host has cores (``--judge_workers 0``) on port ``--judge_port`` + its
                 index in the group (distinct ports, so hosts that share one network, as in local
                 mode, never collide).
The programs of a scoring call are spread over the judges in chunks; a judge that fails or gives no
verdicts within ``--verdict_timeout`` has its chunk resent to the others, and the step completes
(with no judge left: a UserError). A judge host's entry process supervises its service: when the
service dies it is restarted on the same bound port (a judge host is many cores, and what killed the
service, e.g. memory pressure, rarely outlives it); after 5 restarts the host only waits for the
learners' stop. Either way it exits 0, because a host that exits non-zero fails the whole job.
At the end learner rank 0 tells the judges to stop and every host exits 0; a judge nobody calls for
``--judge_timeout`` seconds stops by itself.

Before anything is judged each judge runs the sandbox self-test (hostile programs: fork bombs,
sockets, kill, files outside the working directory, ...) and logs which confinement layers are on;
if any attack escapes, every rank stops with the reason (a judge host fails the job with it). In the
torchrun layout rank 0 tells the judges to stop at the end; every collective has a timeout
(``--judge_timeout``), so a failed rank never leaves the others hanging.

Networking: run the job with ``enable_network_isolation=True`` and the model as channel ``model``;
the sandbox blocks sockets anyway, because isolation still leaves the cluster's own hosts reachable
(which is also what lets learners reach judge hosts).

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
from environments import remote_judge
from environments.code import CodeEnvironment, local_judge
from sandbox import Limits, Sandbox, SandboxEscape, run_selftest

log = logging.getLogger("code_rl")
STOP = "stop"
UNSAFE = "The sandbox is not safe on this machine, so code RL will not train.\n"


@dataclass
class CodeRLArgs(grpo.GRPOArgs):
    help_group = "judging"  # the heading of these options in --help

    reward_mode: Literal["fraction", "all_or_nothing"] = option(
        "fraction",
        "fraction: reward = share of tests passed (all tests run); all_or_nothing: 1 only if every test "
        "passes, judging stops at the first failure",
    )
    max_tests: int = option(0, "judge at most this many tests per problem, in data order; 0 = all")
    time_limit: float = option(2.0, "CPU seconds per test")
    memory_limit_mb: int = option(512, "memory per test on top of the interpreter, in MiB")
    output_limit_mb: int = option(16, "largest output per test, in MiB")
    judge_workers: int = option(
        0,
        "sandbox workers (tests run at once) per judging process; 0 = this host's CPUs divided by the processes on it",
    )
    judge_timeout: float = option(
        3600.0,
        "seconds any rank waits for the others (a judge waits for rank 0 through "
        "generation and the update; with --judge_group learners wait for the "
        "judges' start, and a judge nobody calls stops) before failing",
    )
    self_test: bool = option(
        True, "attack the sandbox with hostile programs before judging and refuse to train if any escapes"
    )

    # A heterogeneous cluster: learner and judge instance groups.
    judge_group: str = option(
        "", "the instance group whose hosts judge; the other groups learn. Empty: torchrun ranks 1..N judge"
    )
    judge_port: int = option(29800, "TCP port of the first judge host's service; the i-th listens on this + i")
    verdict_timeout: float = option(
        600.0, "seconds a learner waits for one judge's verdicts before resending its programs to the other judges"
    )

    def validate(self, world_size: int) -> None:
        super().validate(world_size)
        if self.judge_model:
            raise UserError(
                f"--judge_model {self.judge_model!r}: code_rl.py's reward is its programs' tests; an LLM judge "
                "mixes with the GSM8K checker in grpo.py."
            )
        contract.require_at_least_one(self, "memory_limit_mb", "output_limit_mb")
        for name in ("time_limit", "judge_timeout", "verdict_timeout"):
            if getattr(self, name) <= 0:
                raise UserError(f"--{name} must be positive, got {getattr(self, name)} (seconds).")
        for name in ("max_tests", "judge_workers"):
            if getattr(self, name) < 0:
                raise UserError(f"--{name} cannot be negative, got {getattr(self, name)} (0 is the default).")


def parse_args(argv: list[str] | None = None) -> CodeRLArgs:
    return contract.HyperparameterParser(CodeRLArgs, description=__doc__, prog="code_rl.py").parse(argv)


def judge_addresses(args: CodeRLArgs) -> list[tuple[str, int]]:
    """(host, port) of every judge service of ``--judge_group``, after checking the cluster options."""
    groups = contract.instance_groups()
    if args.judge_group not in groups:
        raise UserError(
            f"--judge_group {args.judge_group!r} is not an instance group of this job "
            f"(groups: {', '.join(groups) or 'none: the job is not a heterogeneous cluster'}). "
            "Name the judges' group of the estimator's instance_groups, or leave --judge_group "
            "empty for torchrun judges."
        )
    if len(groups) < 2:
        raise UserError(
            f"--judge_group {args.judge_group!r} is the job's only instance group: add a learner "
            "group (instance_groups=[InstanceGroup('learner', ...), InstanceGroup('judge', ...)])."
        )
    hosts = groups[args.judge_group]
    if not 1024 <= args.judge_port <= 65535 - len(hosts):
        raise UserError(
            f"--judge_port {args.judge_port} must be in 1024..{65535 - len(hosts)} "
            f"(the {len(hosts)} judge hosts use it and the ports after it)."
        )
    return [(host, args.judge_port + index) for index, host in enumerate(hosts)]


def sandbox_workers(args: CodeRLArgs) -> int:
    return args.judge_workers or max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


def make_sandbox(args: CodeRLArgs) -> Sandbox:
    workers = sandbox_workers(args)
    limits = Limits(time_limit=args.time_limit, memory_mb=args.memory_limit_mb, output_bytes=args.output_limit_mb << 20)
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
        raise UserError(UNSAFE + "\n".join(failed))


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


def serve_judge_host(args: CodeRLArgs, port: int) -> None:
    """A host of ``--judge_group``: the self-test, then the judge service, supervised, until the
    learners' stop (see the module docstring for why a dead service is restarted)."""
    if int(os.environ.get("LOCAL_WORLD_SIZE", 1)) > 1:
        raise UserError(
            f"torchrun started {os.environ['LOCAL_WORLD_SIZE']} processes on judge host "
            f"{contract.current_host()}; a judge host runs one service. Add the hyperparameter "
            "sagemaker_distribution_instance_groups=['<learner group>'] so torchrun spans the learners only."
        )
    with make_sandbox(args) as sandbox:
        reason = self_test(args, sandbox)
        info = {"host": contract.current_host(), "workers": sandbox_workers(args), "sandbox": sandbox.describe()}
    if reason:
        raise UserError(UNSAFE + f"judge host {contract.current_host()}: {reason}")
    listener = remote_judge.listen(port)

    def service(listener) -> None:
        with make_sandbox(args) as sandbox:
            log.info("judge service pid %d on port %d: %s", os.getpid(), port, info["sandbox"])
            judged = remote_judge.serve(listener, local_judge(sandbox), info, idle_timeout=args.judge_timeout)
        log.info("judge: %d programs judged, stopping", judged)

    remote_judge.supervise(listener, service, idle_timeout=args.judge_timeout)


def learn_with_remote_judges(args: CodeRLArgs, addresses: list[tuple[str, int]]) -> None:
    """A host of a learner group: the GRPO loop over its torchrun world, judged by the judge hosts."""
    judges = remote_judge.RemoteJudges(addresses, verdict_timeout=args.verdict_timeout)
    with distributed.started() as learners:
        judges.wait_until_ready(args.judge_timeout)
        env = CodeEnvironment(judges, args.reward_mode, args.max_tests)
        try:
            grpo.train(args, env, learners)
        finally:
            if learners.is_main:  # also after a failure, so the judge hosts exit now
                judges.stop()


def main() -> None:
    args = parse_args()
    if args.judge_group:
        addresses = judge_addresses(args)
        if contract.current_instance_group() == args.judge_group:
            args.validate(1)  # before the sandbox starts; the learners' batch checks run in grpo.train
            index = contract.instance_groups()[args.judge_group].index(contract.current_host())
            serve_judge_host(args, addresses[index][1])
        else:
            learn_with_remote_judges(args, addresses)
        return

    world_size = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    learner = distributed.single_learner()  # rank 0 trains alone; no gradient is shared with the judges
    args.validate(learner.world_size)  # on every rank, before a sandbox starts (grpo.train checks again)

    if world_size == 1:
        with make_sandbox(args) as sandbox:
            reason = self_test(args, sandbox)
            if reason:
                raise UserError(UNSAFE + reason)
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
