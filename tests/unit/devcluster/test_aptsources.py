"""The Debian mirror comes from the machine's own apt sources, never from the project."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.devcluster import aptsources

MIRROR = "http://mirror.invalid/debian"
SECURITY = "http://mirror.invalid/debian-security"

DEB822 = f"""Types: deb
# a comment inside the stanza
URIs: {SECURITY}
Suites: bookworm-security
Components: main

Types: deb
URIs: {MIRROR}
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


@pytest.fixture(autouse=True)
def no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(aptsources.MIRROR_ENV, raising=False)


def test_deb822_main_archive_is_found_and_the_security_archive_skipped() -> None:
    assert aptsources.mirror_from_deb822(DEB822) == MIRROR


def test_disabled_stanzas_and_other_releases_are_skipped() -> None:
    text = "Types: deb\nURIs: http://old.invalid/debian\nSuites: bullseye\n\nEnabled: no\nTypes: deb\nURIs: x\nSuites: bookworm\n"
    assert aptsources.mirror_from_deb822(text) is None
    assert aptsources.mirror_from_deb822(text + "\n" + DEB822) == MIRROR


def test_one_line_format_with_options_and_comments() -> None:
    text = f"# deb http://commented.invalid bookworm main\ndeb {SECURITY} bookworm-security main\ndeb [arch=amd64 signed-by=/k.gpg] {MIRROR} bookworm main\n"
    assert aptsources.mirror_from_one_line(text) == MIRROR


def test_sources_directory_then_sources_list_then_nothing(tmp_path: Path) -> None:
    sources_dir = tmp_path / "sources.list.d"
    sources_dir.mkdir()
    sources_list = tmp_path / "sources.list"
    assert aptsources.debian_mirror(sources_dir, sources_list) is None
    sources_list.write_text("deb http://list.invalid/debian bookworm main\n")
    assert aptsources.debian_mirror(sources_dir, sources_list) == "http://list.invalid/debian"
    (sources_dir / "debian.sources").write_text(DEB822)
    assert aptsources.debian_mirror(sources_dir, sources_list) == MIRROR


def test_the_environment_overrides_the_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(aptsources.MIRROR_ENV, "http://proxy.invalid/debian")
    assert aptsources.debian_mirror(tmp_path, tmp_path / "none") == "http://proxy.invalid/debian"


def test_the_build_script_names_no_mirror_of_its_own() -> None:
    script = Path(aptsources.__file__).with_name("build_kubernetes.sh").read_text()
    assert "URIs: $PHALANX_DEBIAN_MIRROR" in script
    assert "debian.org" not in script
