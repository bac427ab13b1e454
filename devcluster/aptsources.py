"""The Debian mirror this machine already uses, read from its own apt sources.

The control plane (and the real node's kubelet) build from Debian's `kubernetes` source package, fetched
with `apt-get source` from a private sources list. Its mirror must be the one the machine is configured for:
many machines reach only their own mirror or a proxy, so no mirror is ever written into the project.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

SUITE = "bookworm"
"""The Debian release whose `kubernetes` source package the build pins (1.20.5+really1.20.2)."""
SOURCES_DIR = Path("/etc/apt/sources.list.d")
SOURCES_LIST = Path("/etc/apt/sources.list")
MIRROR_ENV = "PHALANX_DEBIAN_MIRROR"
"""Set to a mirror's URI (for example a local proxy) to use it instead of the one in apt's sources."""


def _deb822_stanzas(text: str) -> Iterable[dict[str, str]]:
    """Stanzas of a deb822 `.sources` file as field -> value (comments dropped, fields case-insensitive)."""
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        current = ""
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line[0].isspace() and current:
                fields[current] += " " + line.strip()
                continue
            name, _, value = line.partition(":")
            current = name.strip().lower()
            fields[current] = value.strip()
        if fields:
            yield fields


def _main_archive(suites: Iterable[str], enabled: bool = True) -> bool:
    """True for the release's main archive (not its security archive, which has no source of this)."""
    return enabled and SUITE in suites


def mirror_from_deb822(text: str) -> str | None:
    for fields in _deb822_stanzas(text):
        types = fields.get("types", "").split()
        enabled = fields.get("enabled", "yes").lower() not in ("no", "false", "0")
        uris = fields.get("uris", "").split()
        listed = "deb" in types or "deb-src" in types
        if listed and uris and _main_archive(fields.get("suites", "").split(), enabled):
            return uris[0]
    return None


def mirror_from_one_line(text: str) -> str | None:
    """`deb [options] URI SUITE COMPONENT...` lines of a `.list` file."""
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] in ("deb", "deb-src") and _main_archive([words[2]]):
            return words[1]
    return None


def debian_mirror(sources_dir: Path = SOURCES_DIR, sources_list: Path = SOURCES_LIST) -> str | None:
    """The URI of the Debian archive that apt on this machine uses for the pinned release, if any."""
    override = os.environ.get(MIRROR_ENV, "").strip()
    if override:
        return override
    candidates = sorted(sources_dir.glob("*.sources")) if sources_dir.is_dir() else []
    for path in candidates:
        found = mirror_from_deb822(path.read_text(errors="replace"))
        if found:
            return found
    lists = [sources_list, *(sorted(sources_dir.glob("*.list")) if sources_dir.is_dir() else [])]
    for path in lists:
        if path.is_file():
            found = mirror_from_one_line(path.read_text(errors="replace"))
            if found:
                return found
    return None
