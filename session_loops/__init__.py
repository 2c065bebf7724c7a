"""The training-session side's building blocks: connecting, datums, records, plots and evaluation.

Importing this package puts ``scripts/`` on ``sys.path`` (the one place that does it): the session
loops score with the very environments the job scripts use (``environments.gsm8k``, the code judge)
and share their maths (``common.advantages``), imported as the scripts import them in their container.
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _folder in (REPO / "scripts", REPO):  # scripts/: environments and common; the repo: helpers.offline_data
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
