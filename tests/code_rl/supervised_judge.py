"""A judge host without a sandbox, for test_remote_judge.py: the supervisor of ``remote_judge`` runs
a service whose judge echoes the programs (``slow`` ones after a pause).

    python supervised_judge.py NAME    # prints "PORT <port>", then "SERVICE <pid>" per (re)start,
                                       # and "JUDGING <n>" when a request arrives
"""

import logging
import os
import sys
import time

from environments import remote_judge


def echo_judge(name: str):
    def judge(items, reward_mode):
        print(f"JUDGING {len(items)}", flush=True)
        if any(program == "slow" for _, program in items):
            time.sleep(2.0)
        return [{"verdict": "accepted", "reward": 1.0, "program": program, "judge": name} for _, program in items]

    return judge


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
    name = sys.argv[1]
    listener = remote_judge.listen(0)
    print(f"PORT {listener.getsockname()[1]}", flush=True)

    def service(listener) -> None:
        print(f"SERVICE {os.getpid()}", flush=True)
        remote_judge.serve(listener, echo_judge(name), {"host": name, "workers": 1, "sandbox": "echo"}, 60.0)

    remote_judge.supervise(listener, service, idle_timeout=60.0)
    print("SUPERVISOR DONE", flush=True)


if __name__ == "__main__":
    main()
