"""Copies of API objects: JSON-shaped data (dicts, lists, strings, numbers) copied without `copy.deepcopy`'s
bookkeeping, which makes building a 12,500-pod gang's pods several times slower."""

from __future__ import annotations

import copy
from typing import Any, TypeVar

T = TypeVar("T")


def plain_copy(value: T) -> T:
    """A deep copy of `value`: dicts, lists and tuples copied level by level, strings, numbers, booleans and None
    shared (immutable), anything else by `copy.deepcopy`."""
    copied: T = _copy(value)
    return copied


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_copy(item) for item in value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return copy.deepcopy(value)
