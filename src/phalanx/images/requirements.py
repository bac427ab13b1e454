"""The images' requirements and hash locks, read from pyproject.toml and locks/ before Phalanx is installed.

The Dockerfile runs this file on its own (standard library and pip only), in two steps:
- `python requirements.py OUT_DIR` (the requirements stage) writes `operator.in` and `worker.in`, the core's
  requirements plus each image's extras; copies the hash locks of locks/ (src/phalanx/images/lock.py writes
  them) to `OUT_DIR/locks/`; and copies itself there for the next step.
- `python requirements.py --for IMAGE OUT_DIR` (each image's dependencies stage) writes `OUT_DIR/IMAGE.lock`:
  what that image installs. Usually its whole lock. A venv made with --system-site-packages (Debian's torch, the
  `debian` variant) sees the base's packages: torch and what it was built against (numpy, ...). Another
  version of those would shadow them, so the lock loses them and the base's own versions stand, except where
  the image's requirements are not met by the base's version (pip's resolver decides, with the rest of the lock
  as constraints): those keep the lock's version.

A lock is a pip requirements file of `name==version` entries, each with the `--hash` of every file pip may pick;
pip installs it with `--require-hashes --no-deps`, so nothing outside it is ever fetched.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ACCELERATOR_STACK = re.compile(r"^(torch|triton|nvidia-|cuda-)", re.IGNORECASE)
IMAGE_EXTRAS = {"operator": ("operator",), "worker": ("worker", "s3")}
"""Each image's extras of pyproject.toml, besides the core's requirements."""
LOCKS = "locks"
"""The checkout's folder of hash locks, copied into the requirements stage."""


def normalized(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str:
    return normalized(re.split(r"[\s=<>!~;\[]", line.strip(), maxsplit=1)[0])


def image_requirements(project: dict, image: str) -> list[str]:
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *(line for extra in IMAGE_EXTRAS[image] for line in extras[extra])]


@dataclass(frozen=True)
class Locked:
    """One entry of a lock: a distribution at one version, and the sha256 of each of its files pip may pick."""

    name: str
    version: str
    hashes: tuple[str, ...]

    def render(self) -> str:
        lines = [f"{self.name}=={self.version}", *(f"    --hash=sha256:{digest}" for digest in self.hashes)]
        return " \\\n".join(lines)


def parse_lock(text: str) -> list[Locked]:
    """The entries of a lock as render_lock writes it; comments and blank lines are skipped."""
    joined = re.sub(r"\\\n", " ", text)
    entries = []
    for line in joined.splitlines():
        words = [] if line.lstrip().startswith("#") else line.split()
        if not words:
            continue
        name, _, version = words[0].partition("==")
        hashes = tuple(
            word.removeprefix("--hash=sha256:") for word in words[1:] if word.startswith("--hash=")
        )
        if not version or not hashes or len(hashes) != len(words) - 1:
            raise ValueError(f"not a locked requirement: {line.strip()!r}")
        entries.append(Locked(name, version, hashes))
    return entries


def render_lock(header: str, entries: list[Locked]) -> str:
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    body = "\n".join(entry.render() for entry in sorted(entries, key=lambda entry: normalized(entry.name)))
    return comment + body + ("\n" if entries else "")


def without_provided(text: str, provided: set[str]) -> str:
    """The lock less what the base already provides, its header kept."""
    header = "\n".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    kept = [entry for entry in parse_lock(text) if normalized(entry.name) not in provided]
    return render_lock(header, kept)


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


class PipError(Exception):
    """pip could not resolve the requirements; the message is what it said."""


def pip_would_install(
    requirements: list[str],
    constraints: list[str],
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> list[tuple[str, str]]:
    """(name, version) of every distribution `pip install --dry-run --only-binary :all:` would install for
    `requirements` under `constraints` (pip's own resolution, from its `--report`); nothing is installed."""
    with tempfile.TemporaryDirectory(prefix="phalanx-pip-") as scratch:
        folder = Path(scratch)
        (folder / "requirements.txt").write_text("\n".join(requirements) + "\n")
        (folder / "constraints.txt").write_text("\n".join(constraints) + "\n")
        report = folder / "report.json"
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--only-binary", ":all:",
             "--disable-pip-version-check", "--report", str(report), *options,
             "-c", str(folder / "constraints.txt"), "-r", str(folder / "requirements.txt")],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise PipError(result.stderr.strip())
        installs = json.loads(report.read_text())["install"]
    return [(item["metadata"]["name"], item["metadata"]["version"]) for item in installs]


def needed_from_the_lock(requirements: Path, kept: list[Locked], provided: set[str]) -> set[str]:
    """The distributions the base provides that pip would still install for `requirements`, with `kept` (the
    lock less what the base provides) as constraints: a version of the base that the requirements refuse.
    Only names come of it (nothing is installed): the constraints go without their hashes, or pip would want
    one for every distribution, the base's too."""
    wanted = [line for line in requirements.read_text().splitlines() if line.strip()]
    pins = [f"{entry.name}=={entry.version}" for entry in kept]
    return {normalized(name) for name, _ in pip_would_install(wanted, pins)} & provided


def lock_for(image: str, folder: Path, provided: set[str]) -> str:
    """What the image installs: its lock, less what the base provides and the image's requirements accept."""
    text = (folder / LOCKS / f"{image}.txt").read_text()
    if not provided:
        return text
    kept = [entry for entry in parse_lock(text) if normalized(entry.name) not in provided]
    needed = needed_from_the_lock(folder / f"{image}.in", kept, provided)
    if needed:
        print(
            f"the base's {', '.join(sorted(needed))} do not meet the {image} image's requirements: locked ones"
        )
    return without_provided(text, provided - needed)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--for"]:
        image, folder = argv[1], Path(argv[2])
        (folder / f"{image}.lock").write_text(lock_for(image, folder, provided_by_the_base()))
        return 0
    out = Path(argv[0])
    (out / LOCKS).mkdir(parents=True, exist_ok=True)
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    for image in IMAGE_EXTRAS:
        (out / f"{image}.in").write_text("\n".join(image_requirements(project, image)) + "\n")
    for lock in sorted(Path(LOCKS).glob("*.txt")):
        shutil.copyfile(lock, out / LOCKS / lock.name)
    shutil.copyfile(__file__, out / Path(__file__).name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
