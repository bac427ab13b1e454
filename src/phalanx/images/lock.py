"""`phalanx image lock`: the hash locks the Dockerfile installs from (locks/), written from constraints.txt.

The images install every Python distribution with `pip install --require-hashes --no-deps` from a lock, so a
package index (or anyone between it and the build) can serve nothing but the files the lock names. Each lock
holds the closure of what one stage installs, at the versions the tests run with (constraints.txt), and for
each version the sha256 of every wheel a CPython of the base image's version on Linux may pick (any
architecture), read from the index's own listing (PEP 691 JSON, or PEP 503 HTML with `#sha256=` links).
The base images have two Pythons: 3.11 (python:3.11-slim-bookworm) and 3.14 (Debian forky's, under the worker
of the `debian` torch variant); a lock serves both.

- `bootstrap.txt`: pip and the build requirements of pyproject.toml, which the venv of both images gets first;
- `operator.txt`, `worker.txt`: each image's closure, less the bootstrap and, for the worker, less the
  accelerator stack, which comes with the torch variant;
- `torch-<variant>.txt`: torch and its accelerator stack. `pypi` is PyPI's own build (CUDA); a variant of
  PyTorch's wheel index (`cpu`, `cu126`, ...) is written with `--torch-variant` and `--torch-index-url`.

The closure is pip's own resolution (`pip install --dry-run --report`) for each of those Pythons, made on this
machine: markers other than the Python version are evaluated for its platform (Linux).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from phalanx.errors import UserFacingError
from phalanx.images import base
from phalanx.images.requirements import (
    ACCELERATOR_STACK,
    IMAGE_EXTRAS,
    LOCKS,
    Locked,
    PipError,
    image_requirements,
    normalized,
    pip_would_install,
    render_lock,
    requirement_name,
)

PYPI = "https://pypi.org/simple"
TARGET_PYTHONS = ((3, 11), (3, 14))
"""The Pythons of the base images: the Dockerfile's python:3.11-slim-bookworm, and Debian forky's python3 that the
worker gets with Debian's torch (src/phalanx/images/base.py). A lock admits the wheels of either."""
PYPI_TORCH = "pypi"
"""The torch variant whose lock comes from PyPI alone: PyPI's own torch, its CUDA build."""
PIP_SOURCE_VARIABLES = (
    "PIP_FIND_LINKS",
    "PIP_NO_INDEX",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_CONSTRAINT",
)
"""pip settings of the environment that would resolve from somewhere other than the indexes named here."""
LISTING_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
WHEEL_LINK = re.compile(r"""<a\s[^>]*href=["']([^"']+)["'][^>]*>\s*([^<\s]+)\s*</a>""", re.IGNORECASE)


@dataclass(frozen=True)
class Resolved:
    name: str
    version: str


def resolve(
    requirements: list[str], constraints: list[str], indexes: list[str], python: tuple[int, int]
) -> list[Resolved]:
    """Every distribution pip would install for `requirements` on that Python from wheels alone, as if nothing
    were installed."""
    env = {key: value for key, value in os.environ.items() if key not in PIP_SOURCE_VARIABLES}
    urls = [source for source in indexes if not is_folder(source)]
    index_args = [
        *(["--index-url", urls[0]] if urls else ["--no-index"]),
        *(arg for url in urls[1:] for arg in ("--extra-index-url", url)),
        *(arg for folder in indexes if is_folder(folder) for arg in ("--find-links", folder)),
    ]
    options = ["--ignore-installed", "--python-version", "".join(map(str, python)), *index_args]
    try:
        installs = pip_would_install(requirements, constraints, options, env)
    except PipError as error:
        raise UserFacingError(f"pip could not resolve {' '.join(requirements)}:\n{error}") from None
    return [Resolved(name, version) for name, version in installs]


def wheel_tags(filename: str) -> tuple[str, str, list[tuple[str, str, str]]] | None:
    """(name, version, [(interpreter, abi, platform)]) of a wheel's file name; None for anything else."""
    if not filename.endswith(".whl"):
        return None
    parts = filename[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        return None
    name, version, interpreters, abis, platforms = parts[0], parts[1], *parts[-3:]
    tags = [
        (interpreter, abi, platform)
        for interpreter in interpreters.split(".")
        for abi in abis.split(".")
        for platform in platforms.split(".")
    ]
    return name, version, tags


def installable(filename: str, pythons: tuple[tuple[int, int], ...] = TARGET_PYTHONS) -> bool:
    """Whether pip on one of those CPythons on Linux with glibc (any architecture) may pick this wheel."""
    parsed = wheel_tags(filename)
    return parsed is not None and any(fits(*tag, python) for python in pythons for tag in parsed[2])


def fits(interpreter: str, abi: str, platform: str, python: tuple[int, int]) -> bool:
    """Whether one tag of a wheel fits that CPython on Linux with glibc."""
    major, minor = python
    cpython = f"cp{major}{minor}"
    if not (platform == "any" or platform.startswith(("manylinux", "linux_"))):
        return False
    if abi == cpython:
        return interpreter == cpython
    if abi == "abi3":
        found = re.fullmatch(rf"cp{major}(\d+)", interpreter)
        return found is not None and int(found.group(1)) <= minor
    return abi == "none" and interpreter in (f"py{major}", f"py{major}{minor}", cpython)


def same_version(left: str, right: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(left) == Version(right)
    except InvalidVersion:
        return left == right


def https_context() -> ssl.SSLContext:
    """TLS that trusts what the host's pip trusts (a TLS proxy's CA)."""
    bundle = base.host_ca_bundle()
    return ssl.create_default_context(cafile=str(bundle) if bundle.is_file() else None)


def is_folder(source: str) -> bool:
    """A source of wheels is an index's URL or a local folder of wheels (as `phalanx image build --wheels`)."""
    return "://" not in source


def listed_files(index: str, name: str) -> list[tuple[str, str]]:
    """(file name, sha256) of every file the index lists for the project; files listed without a sha256 are left
    out, so they can never be locked. A folder's wheels are hashed here."""
    if is_folder(index):
        return [
            (path.name, hashlib.sha256(path.read_bytes()).hexdigest())
            for path in sorted(Path(index).glob("*.whl"))
            if normalized(path.name.split("-")[0]) == normalized(name)
        ]
    url = f"{index.rstrip('/')}/{normalized(name)}/"
    request = urllib.request.Request(url, headers={"Accept": LISTING_ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=60, context=https_context()) as response:
            kind = response.headers.get_content_type()
            body = response.read().decode()
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return []
        raise UserFacingError(f"{url}: {error}") from error
    except (urllib.error.URLError, TimeoutError) as error:
        raise UserFacingError(f"{url}: {error}") from error
    if kind.endswith("json"):
        return [
            (entry["filename"], entry["hashes"]["sha256"])
            for entry in json.loads(body)["files"]
            if entry.get("hashes", {}).get("sha256")
        ]
    found = []
    for href, filename in WHEEL_LINK.findall(body):
        fragment = urllib.parse.urlparse(href).fragment
        if fragment.startswith("sha256="):
            found.append((urllib.parse.unquote(filename), fragment.removeprefix("sha256=")))
    return found


def lock_entry(resolved: Resolved, indexes: list[str]) -> Locked:
    """The resolved version with the hash of every wheel of it that the target Python may pick, from the first
    index that has one."""
    for index in indexes:
        hashes = sorted(
            {
                digest
                for filename, digest in listed_files(index, resolved.name)
                if installable(filename) and same_version(filename.split("-")[1], resolved.version)
            }
        )
        if hashes:
            return Locked(resolved.name, resolved.version, tuple(hashes))
    pythons = " or ".join(".".join(map(str, python)) for python in TARGET_PYTHONS)
    raise UserFacingError(
        f"{resolved.name}=={resolved.version}: none of {', '.join(indexes)} lists a wheel of it for CPython "
        f"{pythons} on Linux with its sha256"
    )


def locked(
    requirements: list[str],
    constraints: list[str],
    indexes: list[str],
    keep: Callable[[str], bool] | None = None,
) -> list[Locked]:
    """The resolution of `requirements` for every target Python, each distribution that `keep` (a name predicate)
    accepts, hashed. The versions are one for all Pythons (constraints.txt pins them)."""
    versions: dict[str, Resolved] = {}
    for python in TARGET_PYTHONS:
        for each in resolve(requirements, constraints, indexes, python):
            seen = versions.setdefault(normalized(each.name), each)
            if not same_version(seen.version, each.version):
                raise UserFacingError(
                    f"{each.name}: pip chose {seen.version} and {each.version} for different Pythons; pin it "
                    "in constraints.txt"
                )
    chosen = [each for name, each in versions.items() if keep is None or keep(name)]
    return [lock_entry(each, indexes) for each in chosen]


def pinned(entries: list[Locked]) -> list[str]:
    return [f"{entry.name}=={entry.version}" for entry in entries]


def pinned_torch(constraints: list[str]) -> str:
    """constraints.txt's torch without its local label: `torch==2.13.0+cu130` gives `2.13.0`."""
    for line in constraints:
        if requirement_name(line) == "torch" and "==" in line:
            return line.split("==", 1)[1].split("+", 1)[0].strip()
    raise UserFacingError("constraints.txt pins no torch")


def constraint_lines(path: Path) -> list[str]:
    return [
        line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]


HEADER = (
    "Written by `phalanx image lock` (src/phalanx/images/lock.py) from pyproject.toml and constraints.txt:\n"
    "do not edit. The Dockerfile installs it with pip's --require-hashes --no-deps.\n"
)


def write_locks(checkout: Path, index: str = PYPI) -> list[Path]:
    """bootstrap.txt, operator.txt, worker.txt and torch-pypi.txt, from `index` (PyPI by default)."""
    pyproject = tomllib.loads((checkout / "pyproject.toml").read_text())
    constraints = constraint_lines(checkout / "constraints.txt")
    folder = checkout / LOCKS
    folder.mkdir(exist_ok=True)
    written = []

    def write(name: str, what: str, entries: list[Locked]) -> None:
        path = folder / name
        path.write_text(render_lock(HEADER + what, entries))
        written.append(path)

    bootstrap = locked(["pip", *pyproject["build-system"]["requires"]], [], [index])
    write("bootstrap.txt", "pip and Phalanx's build requirements, newest when written.", bootstrap)
    bootstrap_names = {normalized(entry.name) for entry in bootstrap}
    for image in IMAGE_EXTRAS:
        entries = locked(
            image_requirements(pyproject["project"], image),
            [*constraints, *pinned(bootstrap)],
            [index],
            keep=lambda name: name not in bootstrap_names and not ACCELERATOR_STACK.match(name),
        )
        write(f"{image}.txt", f"The {image} image's requirements, less the bootstrap and torch.", entries)
    write(f"torch-{PYPI_TORCH}.txt", *torch_lock(PYPI_TORCH, constraints, [index]))
    return written


def torch_lock(variant: str, constraints: list[str], indexes: list[str]) -> tuple[str, list[Locked]]:
    """torch of constraints.txt's version in that variant, and its accelerator stack."""
    version = pinned_torch(constraints)
    requirement = f"torch=={version}" if variant == PYPI_TORCH else f"torch=={version}+{variant}"
    # PyPI's torch is the one the tests run with: its stack keeps constraints.txt's versions. Another index has
    # its own builds of that stack, which the variant's torch chooses.
    others = [line for line in constraints if variant == PYPI_TORCH or not ACCELERATOR_STACK.match(line)]
    entries = locked([requirement], others, indexes, keep=lambda name: bool(ACCELERATOR_STACK.match(name)))
    return f"torch {variant}: {requirement} and its accelerator stack, from {', '.join(indexes)}.", entries


def write_torch_lock(checkout: Path, variant: str, torch_index: str, index: str = PYPI) -> Path:
    """torch-<variant>.txt from the variant's index (PyTorch's), with PyPI for what that index lacks."""
    constraints = constraint_lines(checkout / "constraints.txt")
    what, entries = torch_lock(variant, constraints, [torch_index, index])
    path = checkout / LOCKS / f"torch-{variant}.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text(render_lock(HEADER + what, entries))
    return path
