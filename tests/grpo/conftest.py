"""The training scripts import their siblings as top-level modules (``environments``, ``common``),
as they do in the container where the code folder is the working directory."""

from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
