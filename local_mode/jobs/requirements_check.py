"""Is a source directory's requirements.txt already satisfied by this Python environment?

On SageMaker the toolkit runs `pip install -r requirements.txt` inside the container. Local mode
runs in the user's own environment and never changes it: it checks instead and names what is
missing.
"""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement


def missing_requirements(text: str) -> list[str]:
    """The requirement lines (as written) that the current environment does not satisfy."""
    missing = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#") or line.startswith("-"):
            continue  # blank, comment, or a pip option such as --extra-index-url
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            missing.append(f"{line} (not a requirement local mode can check)")
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(line)
            continue
        if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
            missing.append(f"{line} (found {installed})")
    return missing
