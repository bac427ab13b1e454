"""Debian's Prometheus and promtool, unpacked into Phalanx's cache: what the chart's alert rules are tested
with (`promtool test rules`) and what scrapes the local cluster in the monitoring e2e test.

`apt-get download prometheus` fetches the package of the machine's Debian release (no root, nothing
installed, no service started); its two binaries are unpacked into `~/.cache/phalanx/prometheus-<version>/`.
A second call finds them there.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from phalanx.devcluster.binaries import cache_dir
from phalanx.errors import UserFacingError

PACKAGE = "prometheus"
BINARIES = ("prometheus", "promtool")


@dataclass(frozen=True)
class PrometheusBinaries:
    prometheus: Path
    promtool: Path
    version: str
    """The Debian package's version (e.g. `2.42.0+ds-5+deb12u1`)."""


def cached() -> PrometheusBinaries | None:
    """The unpacked binaries of the newest version in the cache, if any."""
    found = sorted(cache_dir().glob(f"{PACKAGE}-*/bin/promtool"))
    if not found:
        return None
    root = found[-1].parent
    return PrometheusBinaries(
        root / "prometheus", root / "promtool", root.parent.name.removeprefix(f"{PACKAGE}-")
    )


def install() -> PrometheusBinaries:
    """Debian's Prometheus and promtool from the cache, fetched and unpacked there the first time."""
    have = cached()
    if have is not None:
        return have
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise UserFacingError(f"fetching Debian's Prometheus needs `{tool}` (a Debian or Ubuntu machine)")
    with tempfile.TemporaryDirectory(prefix="phalanx-prometheus-") as scratch:
        fetched = subprocess.run(
            ["apt-get", "download", PACKAGE], cwd=scratch, capture_output=True, text=True, check=False
        )
        packages = list(Path(scratch).glob(f"{PACKAGE}_*.deb"))
        if fetched.returncode != 0 or not packages:
            detail = (fetched.stderr or fetched.stdout).strip().splitlines()[-1:] or ["no package file"]
            raise UserFacingError(
                f"`apt-get download {PACKAGE}` failed: {detail[0]} (try `apt-get update` first)"
            )
        (package,) = packages
        version = _package_version(package.name)
        unpacked = Path(scratch) / "unpacked"
        subprocess.run(["dpkg-deb", "-x", str(package), str(unpacked)], check=True, capture_output=True)
        target = cache_dir() / f"{PACKAGE}-{version}"
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        staging.chmod(0o755)
        (staging / "bin").mkdir()
        for name in BINARIES:
            shutil.copy2(unpacked / "usr" / "bin" / name, staging / "bin" / name)
        try:
            staging.rename(target)  # complete or absent: an interrupted fetch leaves no half of it
        except OSError:
            shutil.rmtree(staging)  # another process (a second test worker) unpacked it first
    have = cached()
    assert have is not None
    return have


def _package_version(file_name: str) -> str:
    """`prometheus_2.42.0+ds-5+deb12u1_amd64.deb` -> `2.42.0+ds-5+deb12u1` (an epoch's `:` is `%3a` there)."""
    match = re.fullmatch(rf"{PACKAGE}_(.+)_[a-z0-9]+\.deb", file_name)
    if match is None:
        raise UserFacingError(f"unexpected package file name {file_name!r}")
    return match.group(1).replace("%3a", ":")
