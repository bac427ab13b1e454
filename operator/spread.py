"""Periods spread by key, so that many objects started together do not come due together.

A thousand jobs created in one minute and each re-checked every `seconds` would otherwise be re-checked in the
same minute again, one burst of API calls every period. Each key gets its own period, the same every time (a
pure function of the key, so a restarted operator keeps it), between `seconds` and `seconds * (1 + share)`.
"""

from __future__ import annotations

import zlib

SHARE = 0.5
"""A key's period is `seconds` times 1 to 1 + SHARE."""


def period_of(seconds: float, key: str, share: float = SHARE) -> float:
    """`key`'s own period: `seconds` stretched by a fraction of `share` fixed by the key."""
    return seconds * (1 + share * zlib.crc32(key.encode()) / 2**32)
