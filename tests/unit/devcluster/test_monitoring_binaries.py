"""Debian's Prometheus in the cache: the package file's version, and an unpacked copy found again."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.devcluster import monitoring
from phalanx.errors import UserFacingError


def test_the_version_comes_from_the_package_file_name() -> None:
    assert monitoring._package_version("prometheus_2.42.0+ds-5+deb12u1_amd64.deb") == "2.42.0+ds-5+deb12u1"
    assert monitoring._package_version("prometheus_1%3a2.53.3+ds1-1_arm64.deb") == "1:2.53.3+ds1-1"
    with pytest.raises(UserFacingError):
        monitoring._package_version("promtool.tar.gz")


def test_an_unpacked_copy_is_found_without_fetching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHALANX_CACHE_DIR", str(tmp_path))
    assert monitoring.cached() is None
    for version in ("2.42.0+ds-5", "2.53.3+ds1-1"):
        (tmp_path / f"prometheus-{version}" / "bin").mkdir(parents=True)
        for name in monitoring.BINARIES:
            (tmp_path / f"prometheus-{version}" / "bin" / name).write_text("")
    monkeypatch.setattr(monitoring.subprocess, "run", lambda *a, **k: pytest.fail("fetched again"))
    found = monitoring.install()
    assert found.version == "2.53.3+ds1-1" and found.promtool.parent.parent.name == "prometheus-2.53.3+ds1-1"
