"""Finds the Phalanx checkout a command runs in, for the commands that write into one (`phalanx crd --write`).

The checkout is looked for from the working directory up, never from where the code is installed: a wheel
has no checkout, and an editable install's files may sit elsewhere.
"""

from __future__ import annotations

import tomllib
from pathlib import Path


def is_checkout(folder: Path) -> bool:
    """`folder` holds Phalanx's sources: a pyproject.toml of the `phalanx` project, the API model, the chart."""
    pyproject = folder / "pyproject.toml"
    if not (
        pyproject.is_file() and (folder / "operator" / "api.py").is_file() and (folder / "charts").is_dir()
    ):
        return False
    try:
        project = tomllib.loads(pyproject.read_text()).get("project", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return project.get("name") == "phalanx"


def find_checkout(start: Path) -> Path | None:
    """The nearest Phalanx checkout at or above `start`, or None outside of one."""
    start = start.resolve()
    return next((folder for folder in (start, *start.parents) if is_checkout(folder)), None)
