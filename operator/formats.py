"""Formats of values that the API server or the kubelet would refuse later than apply time: quantities and
container paths. Each comes as a pattern for the CRD (Go's RE2 and Python's `re` read it alike) and a check
for the model, so the API server refuses what it can and the operator refuses the same values, naming the
field, when an object bypassed the schema or carries them inside the free-form pod template.
"""

from __future__ import annotations

import decimal
import re
from decimal import Decimal
from typing import Any

_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY_PATTERN = rf"^\+?{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$"
"""A non-negative `resource.Quantity`: Kubernetes' own pattern for quantities less the minus sign (no size
limit, request or limit may be negative) and less decimal exponents, which its pattern lets through but its
parser refuses (`1e1.5`)."""
QUANTITY_EXAMPLE = "a quantity such as `8Gi`, `512Mi`, `500m` or `2`"

_SEGMENT = r"([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)"
ABSOLUTE_PATH_PATTERN = rf"^(/{_SEGMENT})+$"
"""An absolute, normalised path below the root: segments joined by single slashes, none of them `.` or
`..`, and no trailing slash. `/` itself is refused: a checkpoint folder there would have the checkpoint
manager prune the container's root (RE2 has no look-ahead, hence the three kinds of segment)."""

RELATIVE_FOLDER_PATTERN = rf"^(\.|{_SEGMENT}(/{_SEGMENT})*)$"
"""A normalised relative folder: segments joined by single slashes, none of them `.` or `..`, no leading or
trailing slash; or `.` alone, the base folder itself."""


DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A DNS-1123 label, as container names are (at most 63 characters)."""

_SUFFIXES: dict[str, Decimal] = {
    **{
        suffix: Decimal(1024) ** power
        for power, suffix in enumerate(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
    },
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(QUANTITY_PATTERN)
_INT32_MAX = 2**31 - 1


def quantity_text(value: Any) -> str:
    """The text of a quantity given as a string or a number (JSON numbers are quantities too)."""
    if isinstance(value, bool):
        raise ValueError(f"must be {QUANTITY_EXAMPLE}, got {value!r}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return value
    raise ValueError(f"must be {QUANTITY_EXAMPLE}, got {value!r}")


def parse_quantity(value: Any) -> Decimal:
    """The amount of a non-negative quantity; ValueError, with a message for the user, for anything the
    API server would refuse (or a negative amount)."""
    text = quantity_text(value)
    if _QUANTITY.fullmatch(text) is None:
        raise ValueError(f"must be {QUANTITY_EXAMPLE}, got {value!r}")
    number = re.match(rf"\+?{_NUMBER}", text)
    assert number is not None
    digits, suffix = number.group(0).lstrip("+"), text[number.end() :]
    amount = Decimal(digits if not digits.endswith(".") else digits[:-1] or "0")
    if suffix[:1] in ("e", "E"):
        exponent = int(suffix[1:])
        # Go keeps the exponent as an int32, wrapping a larger one into some other number: refused here.
        if abs(exponent) > _INT32_MAX:
            raise ValueError(f"must be {QUANTITY_EXAMPLE}, got {value!r} (exponent out of range)")
        with decimal.localcontext() as context:
            context.Emax, context.Emin = decimal.MAX_EMAX, decimal.MIN_EMIN
            return amount.scaleb(exponent)
    return amount * _SUFFIXES[suffix]


def check_quantity(value: Any) -> str:
    """The quantity as text, for a pydantic validator: ValueError when it is not a non-negative quantity."""
    parse_quantity(value)
    return quantity_text(value)


def _matching(pattern: str, value: str, rule: str) -> str:
    """`value` when it matches `pattern` whole, else a ValueError saying `rule` and what was given."""
    if re.fullmatch(pattern, value) is None:
        raise ValueError(f"{rule}; got {value!r}")
    return value


def check_relative_folder(value: str) -> str:
    """`value` when it is a normalised relative folder, or `.` (`RELATIVE_FOLDER_PATTERN`)."""
    return _matching(
        RELATIVE_FOLDER_PATTERN,
        value,
        "must be a relative, normalised folder such as `team/run-7` (or `.`): not starting or ending with `/`, "
        "without `.` or `..` segments or `//`",
    )


def check_absolute_path(value: str) -> str:
    """`value` when it is an absolute, normalised path below the root (`ABSOLUTE_PATH_PATTERN`)."""
    return _matching(
        ABSOLUTE_PATH_PATTERN,
        value,
        "must be an absolute, normalised path such as `/checkpoints`: starting with `/`, without `.` or `..` "
        "segments, `//` or a trailing `/`, and not `/` itself",
    )
