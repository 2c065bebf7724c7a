"""Run a command at a lower CPU priority, one that holds under Linux's autogroup scheduling too:

    python tools/lower_priority.py 10 python -m ipykernel_launcher -f kernel.json

As ``nice -n 10`` does, and the command's session (which a kernel's launcher starts, see
``common.contract.hold_nice_value``) takes the nice value as well; the processes the command starts
inherit both, unless they start sessions of their own (the training scripts hold it themselves).
"""

from __future__ import annotations

import os
import sys

from common.contract import hold_nice_value


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        raise SystemExit("usage: python tools/lower_priority.py NICENESS COMMAND [ARGUMENT...]")
    os.nice(int(argv[0]))
    hold_nice_value()
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
