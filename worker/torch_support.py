"""Which torch versions the worker runs on, decided from the version string alone (torch-free).

torch is a version range, not one exact version, but the launcher builds on torch internals that any
release may move (worker/torch_elastic.py lists them). The range is where they are known to be:
- the lower bound is the oldest torch that has everything the worker uses: process-based async saves of
  distributed checkpoints (`AsyncCheckpointerType.PROCESS`, worker/checkpoint/sharded.py) came with 2.7;
  the rendezvous and agent internals the launcher reaches are older;
- the upper bound is the first release not tested: internals change without notice, so a new torch is
  supported once the unit tests that pin them (tests/unit/worker_runtime/test_torch_elastic.py) pass on it.

Only the release's major.minor counts: `2.14.1+debian` is 2.14, and a pre-release or nightly such as
`2.15.0a0+git1234abc` is already 2.15 (it carries that release's internals), so it falls outside `<2.15`.
"""

from __future__ import annotations

import re

MIN_TORCH = (2, 7)
"""The oldest supported torch release (major, minor)."""
FIRST_UNSUPPORTED_TORCH = (2, 15)
"""The first torch release (major, minor) not known to work: the range's exclusive upper bound."""
SUPPORTED_TORCH = (
    f">={MIN_TORCH[0]}.{MIN_TORCH[1]},<{FIRST_UNSUPPORTED_TORCH[0]}.{FIRST_UNSUPPORTED_TORCH[1]}"
)
"""The supported range as a version specifier (what pyproject.toml's torch requirement must stay within)."""

_RELEASE = re.compile(r"^\s*v?(\d+)\.(\d+)")


class UnsupportedTorchError(RuntimeError):
    """The installed torch lies outside the supported range (a bad setup, not a failure of the run)."""


def release_of(version: str) -> tuple[int, int] | None:
    """The (major, minor) release a torch version string belongs to; None when it names none."""
    match = _RELEASE.match(version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def is_supported(version: str) -> bool:
    release = release_of(version)
    return release is not None and MIN_TORCH <= release < FIRST_UNSUPPORTED_TORCH


def require_supported(version: str) -> None:
    """Raise UnsupportedTorchError, naming `version` and the supported range, unless it is supported."""
    if not is_supported(version):
        raise UnsupportedTorchError(
            f"torch {version} is not supported by Phalanx's launcher: it needs torch {SUPPORTED_TORCH} "
            "(install a torch in that range)"
        )
