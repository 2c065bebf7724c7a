"""The training scripts import their siblings as top-level modules (``environments``, ``common``),
as they do in the container where the code folder is the working directory."""

import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))
