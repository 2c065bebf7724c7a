"""Each sandbox runs its programs under uids of its own, claimed through lock files. The uids are this
machine's, so the claims must be too: a local-mode host has a temporary folder of its own (as a container
has), and two judge hosts with their locks in their own folders once drew the same uid."""

import os
import subprocess
import sys

from sandbox import judge


def test_a_uid_claimed_here_is_skipped_by_a_process_with_another_temporary_folder(tmp_path):
    uid, lock = judge._claim_uid(judge.UID_BASE + 3000)
    try:
        claim = f"from sandbox import judge; print(judge._claim_uid({uid})[0])"
        drawn = subprocess.run(
            [sys.executable, "-c", claim],
            env={**os.environ, "TMPDIR": str(tmp_path)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert int(drawn) > uid  # the lock this process holds is the one the other process found
    finally:
        os.close(lock)
