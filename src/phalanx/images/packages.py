"""The Debian packages the image build runs: checked with dpkg, installed with apt-get when allowed."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence

from phalanx.errors import UserFacingError

REQUIRED = ("buildah", "mmdebstrap", "runc")
"""buildah builds and stores the images, running the Dockerfile's steps with runc; mmdebstrap makes the
Debian base."""
ROOTLESS = ("uidmap",)
"""Without root, buildah and mmdebstrap map users through newuidmap/newgidmap."""


def required(is_root: bool) -> tuple[str, ...]:
    return REQUIRED if is_root else REQUIRED + ROOTLESS


def is_installed(package: str) -> bool:
    result = subprocess.run(
        ["dpkg-query", "--show", "--showformat=${Status}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0 and result.stdout.strip().endswith(" installed")


def missing(packages: Sequence[str] = REQUIRED, installed: Callable[[str], bool] = is_installed) -> list[str]:
    return [package for package in packages if not installed(package)]


def install_hint(packages: Sequence[str]) -> str:
    return f"the image build needs the Debian packages {' '.join(packages)}: install them with `apt-get install {' '.join(packages)}` (as root)"


def can_install() -> bool:
    """apt-get may install only for root on a Debian-like host."""
    return (
        os.geteuid() == 0 and shutil.which("apt-get") is not None and shutil.which("dpkg-query") is not None
    )


def ensure(packages: Sequence[str] | None = None) -> None:
    """Install what is missing, or stop with one line saying what to install."""
    if packages is None:
        packages = required(os.geteuid() == 0)
    if shutil.which("dpkg-query") is None:
        raise UserFacingError(install_hint(packages))
    needed = missing(packages)
    if not needed:
        return
    if not can_install():
        raise UserFacingError(install_hint(needed))
    print(f"installing {' '.join(needed)} (apt-get)", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    steps = (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *needed])
    for step in steps:
        result = subprocess.run(step, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [""]
            raise UserFacingError(f"`{' '.join(step)}` failed ({tail[0]}); {install_hint(needed)}")
    still = missing(needed)
    if still:
        raise UserFacingError(install_hint(still))
