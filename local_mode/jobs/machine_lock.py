"""One local job at a time on a machine.

The toolkit fixes torchrun's port at 7777, so two jobs at once would collide. A machine-wide lock
file serializes them (a waiting job shows ``Starting``), which is simpler and more robust than
giving each job its own network namespace. The lock goes with the process that holds it.
"""

from __future__ import annotations

import fcntl
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .job_status import JobEnded

LOCK_PATH = Path(tempfile.gettempdir()) / "sagemaker-local-mode.lock"


@contextmanager
def machine_lock(say: Callable[[str], None], stop_requested: Callable[[], bool]) -> Iterator[None]:
    """Hold the machine's local-mode lock; a job stopped while it waits ends Stopped."""
    with open(LOCK_PATH, "w") as lock_file:
        said = False
        while True:
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not said:
                    say("waiting for the local job already running to finish (one at a time: port 7777)")
                    said = True
                if stop_requested():
                    raise JobEnded("Stopped") from None
                time.sleep(0.2)
        yield  # closing the file releases the lock
