"""Run under torchrun by test_code_rl_script.py: rank 0 sends programs, ranks 1..N judge them.
Two cases, named by the argument::

    torchrun --standalone --nproc_per_node 3 remote_judge_job.py judge    # judges with sandboxes
    torchrun --standalone --nproc_per_node 2 remote_judge_job.py broken   # rank 1's sandbox never started
"""

import json
import sys
from datetime import timedelta

import code_rl
import torch.distributed as dist
from sandbox import Limits, Sandbox

ADD = {"testtype": "stdin", "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "2 2\n", "output": "4\n"}]}
SOLVE = {"testtype": "functional", "fn_name": "solve", "tests": [{"input": "[2, 3]", "output": "8"}]}
ITEMS = [
    (ADD, "a, b = map(int, input().split())\nprint(a + b)\n"),
    (ADD, "print(3)\n"),
    (ADD, "while True:\n    pass\n"),
    (SOLVE, "def solve(a, b):\n    return a * b + a\n"),
    (ADD, "import os\nos.fork()\n"),
    (SOLVE, "def other(a, b):\n    return 0\n"),
]


def main() -> None:
    mode = sys.argv[1]
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        judge = code_rl.RemoteJudge(world_size)
        try:
            print("RESULTS " + json.dumps(judge(ITEMS, "fraction")), flush=True)
        except RuntimeError as error:
            print(f"JUDGING FAILED: {error}", flush=True)
        judge.stop()
    else:
        sandbox = Sandbox(workers=1, limits=Limits(time_limit=0.5, wall_limit=1.0))
        if mode != "broken":
            sandbox.start()
        try:
            code_rl.serve_as_judge(sandbox)
        finally:
            sandbox.close()
        print("JUDGES STOPPED", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
