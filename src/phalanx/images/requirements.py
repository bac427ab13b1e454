"""The images' requirements, read from pyproject.toml and constraints.txt before Phalanx is installed.

The Dockerfile runs this file on its own (standard library only): `python requirements.py OUT_DIR`. It writes
- `operator.txt` and `worker.txt`: the core's requirements plus each image's extras;
- `constraints.txt`: constraints.txt's pins, less the accelerator stack (it comes with the torch variant) and
  less every distribution the interpreter already has outside its venv. With Debian's torch (the `debian`
  variant) the venv sees the base's packages: torch and what it was built against (numpy, ...). A pin of
  another version would shadow them, so the base's own versions stand;
- `torch-version`: the pinned torch's public version, to which a PyPI variant adds its label (`+cpu`).
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ACCELERATOR_STACK = re.compile(r"^(torch|triton|nvidia-|cuda-)", re.IGNORECASE)
IMAGE_EXTRAS = {"operator": ("operator",), "worker": ("worker", "s3")}
"""Each image's extras of pyproject.toml, besides the core's requirements."""


def normalized(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str:
    return normalized(re.split(r"[\s=<>!~;\[]", line.strip(), maxsplit=1)[0])


def image_requirements(project: dict, image: str) -> list[str]:
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *(line for extra in IMAGE_EXTRAS[image] for line in extras[extra])]


def image_constraints(pins: list[str], provided: set[str]) -> list[str]:
    """The pins pip gets: none for the accelerator stack or for what the base already provides."""
    return [
        line
        for line in pins
        if line.strip()
        and not line.lstrip().startswith("#")
        and not ACCELERATOR_STACK.match(line.strip())
        and requirement_name(line) not in provided
    ]


def pinned_torch(pins: list[str]) -> str:
    """constraints.txt's torch without its local label: `torch==2.13.0+cu130` gives `2.13.0`."""
    for line in pins:
        if requirement_name(line) == "torch" and "==" in line:
            return line.split("==", 1)[1].split("+", 1)[0].strip()
    raise SystemExit("constraints.txt pins no torch")


def provided_by_the_base() -> set[str]:
    """Distributions outside this interpreter's prefix: a venv made with --system-site-packages sees them."""
    if sys.prefix == sys.base_prefix:
        return set()
    prefix = Path(sys.prefix).resolve()
    found = set()
    for distribution in metadata.distributions():
        location = Path(str(distribution.locate_file(""))).resolve()
        if not location.is_relative_to(prefix):
            found.add(normalized(distribution.metadata["Name"]))
    return found


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    pins = Path("constraints.txt").read_text().splitlines()
    for image in IMAGE_EXTRAS:
        (out / f"{image}.txt").write_text("\n".join(image_requirements(project, image)) + "\n")
    (out / "constraints.txt").write_text("\n".join(image_constraints(pins, provided_by_the_base())) + "\n")
    (out / "torch-version").write_text(pinned_torch(pins) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
