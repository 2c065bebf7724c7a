"""Code RL on a SageMaker training session: the GRPO loop of ``grpo.py`` with the code environment, whose
judge runs the model's programs in the project's sandbox on this machine.

    .venv-sessions/bin/python -m session_loops.code_rl --run-mode local     # 16 steps (notebook 09 runs 12 in CI)
    .venv-sessions/bin/python -m session_loops.code_rl --run-mode sagemaker --base-model Qwen/Qwen3-4B --role arn:...

The training jobs' code RL (``scripts/code_rl.py``) has one process learn while the others judge. Here
the service learns and a pool of sandbox workers judges: ``grpo.train(..., overlap=True)`` sends step
k+1's sample requests before it judges step k, so the service samples while the workers run programs.
The price is staleness: step k+1's samples come from the weights before step k's update, one update old
when they are trained on. ``importance_sampling`` reweights each token by exp(logp - logp_sampler)
(``ppo`` clips that ratio to [0.8, 1.2]); every step logs ``clip_fraction`` and ``sampler_kl``.

Nothing else is new: the environment (``scripts/environments/code.py``: the program is the completion's
last fenced block, the reward the share of tests passed, ``format_reward`` 1 when there is a program) and
the sandbox (``scripts/sandbox``) are the jobs'. Each step's record carries the judge's verdict shares
(``accepted_rate``, ``wrong_answer_rate``, ..., ``no_code_rate``), ``pass_rate`` and ``judge_time``.

Measured in local mode (the tiny model after 20 steps of ``local_warm_start.py --task code``, 16 steps of
8 problems x 4 samples, learning rate 1e-3): the share of completions without a program falls from
0.72 (first quarter of the steps) to 0.29 (last quarter) with seed 0, 0.71 to 0.28 with seed 1, and the
reward rises from 0.14 to 0.36; ``sampler_kl`` stays under 0.004; none passes a test yet, as in notebook 4.
"""

from __future__ import annotations

import contextlib

from session_loops import common, grpo  # common first: it puts scripts/ (environments, sandbox) on the path


def offline_problems(n: int, seed: int = 0) -> list[dict]:
    """The project's easy code problems (sum of two numbers, largest of a list...), checked as the
    code environment checks any problem; the cloud runs use the set notebook 0 staged."""
    from environments.code import normalize_problem

    from helpers import offline_data

    return [normalize_problem(row) for row in offline_data.code_problem_records(n, seed=seed)]


def staged_problems(path) -> list[dict]:
    """Problems from a JSON Lines file in any layout the code environment reads (code_contests, APPS...)."""
    from environments.code import normalize_problem

    from helpers import offline_data

    return [normalize_problem(row) for row in offline_data.read_jsonl(path)]


@contextlib.contextmanager
def code_environment(judge_workers: int = 2, max_tests: int = 0, self_test: bool = True):
    """The code environment with a judge pool: ``judge_workers`` sandboxed fork servers on this machine,
    attacked with hostile programs first (``self_test``); they are stopped on the way out."""
    from environments.code import CodeEnvironment, local_judge
    from sandbox import Sandbox, run_selftest

    with Sandbox(workers=judge_workers) as sandbox:
        if self_test:
            run_selftest(sandbox, log=lambda line: None)  # raises SandboxEscape if an attack got out
        print(sandbox.describe())
        yield CodeEnvironment(judge=local_judge(sandbox), max_tests=max_tests)


def main() -> None:
    parser = common.session_arguments(__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--problems-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--format-reward-weight", type=float, default=0.5)
    parser.add_argument("--loss-fn", default="importance_sampling", choices=["importance_sampling", "ppo"])
    parser.add_argument(
        "--problems",
        default=None,
        help="a JSON Lines file of problems (code_contests, APPS...); default: the project's easy ones",
    )
    parser.add_argument("--judge-workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    service, run_mode = common.connect(args.run_mode, args.region, args.role)
    base_model = args.base_model
    if run_mode == "local" and base_model == common.LOCAL_BASE_MODEL:
        base_model = common.local_warm_start_model("code")
    base_model = common.choose_base_model(service, base_model)
    with (
        code_environment(args.judge_workers) as env,
        common.training_session(service, base_model, args.rank, args.alpha) as training_client,
    ):
        tokenizer = training_client.get_tokenizer()
        problems = staged_problems(args.problems) if args.problems else offline_problems(256, seed=args.seed)
        history = grpo.train(
            training_client,
            tokenizer,
            env,
            problems,
            args.steps,
            args.problems_per_step,
            args.group_size,
            args.learning_rate,
            loss_fn=args.loss_fn,
            format_reward_weight=args.format_reward_weight,
            overlap=True,
            seed=args.seed,
        )
        print(
            f"no_code_rate {history[0]['no_code_rate']:.3f} -> {history[-1]['no_code_rate']:.3f}; "
            f"pass_rate {history[0]['pass_rate']:.3f} -> {history[-1]['pass_rate']:.3f}"
        )
        print("billable tokens:", common.billable_tokens(training_client.training_session_name))


if __name__ == "__main__":
    main()
