"""Loading pickles from outside the process through an allow-list.

A pickle can name any importable callable and have it called while it loads: whoever writes the bytes (a
checkpoint file, a peer's snapshot, the rendezvous store) runs code in the process that loads them. Every
pickle Phalanx reads from outside the process goes through `loads` here, which resolves only the globals of
an allow-list and refuses the rest with `RefusedPickle`, naming the global and the way to allow it.

Checkpoints (`CHECKPOINT`): Python's plain values, OrderedDict, datetime, torch's dtypes, devices and sizes,
NumPy's arrays, scalars and dtypes, and Phalanx's own tensor references. A training state holding other types
(a dataclass of the user's, say) needs them allowed by `allow_checkpoint_types`, or by torch's own
`torch.serialization.add_safe_globals`, which is honoured too.
"""

from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Global = tuple[str, str]


class RefusedPickle(pickle.UnpicklingError, ValueError):
    """A pickle named a global outside the allow-list (or was not a pickle at all). A ValueError too: the
    bytes are bad data, as a wrong magic number or a short file is."""


@dataclass
class AllowList:
    """The globals a pickle may name: exact `(module, name)` pairs, or a per-module predicate."""

    what: str
    """What is being loaded, for the refusal's message (e.g. "checkpoint")."""
    exact: set[Global] = field(default_factory=set)
    """Allowed `(module, qualified name)` pairs."""
    by_module: dict[str, Callable[[str], bool]] = field(default_factory=dict)
    """Modules some of whose names are allowed, by a test of the name (e.g. torch's dtypes)."""
    extra: Callable[[], Iterable[Global]] | None = None
    """More allowed pairs, read at each load (the user's additions)."""
    hint: str = ""
    """How a user allows another type, appended to the refusal."""

    def allows(self, module: str, name: str) -> bool:
        if (module, name) in self.exact:
            return True
        test = self.by_module.get(module)
        if test is not None and test(name):
            return True
        return self.extra is not None and (module, name) in set(self.extra())


def global_of(obj: Any) -> Global:
    """The `(module, qualified name)` under which pickle names a class or function."""
    return (obj.__module__, obj.__qualname__)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, allowed: AllowList) -> None:
        super().__init__(io.BytesIO(data))
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if not self._allowed.allows(module, name):
            hint = f" ({self._allowed.hint})" if self._allowed.hint else ""
            raise RefusedPickle(f"{self._allowed.what} names {module}.{name}, which is not allowed{hint}")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle(f"{self._allowed.what} holds a persistent reference, which is not allowed")


def loads(data: bytes, allowed: AllowList) -> Any:
    """Unpickle `data`, resolving only the globals `allowed` permits."""
    try:
        return _Unpickler(data, allowed).load()
    except RefusedPickle:
        raise
    except Exception as error:  # truncated or foreign bytes fail in many ways
        raise RefusedPickle(f"{allowed.what} is not a readable pickle: {error}") from error


# --------------------------------------------------------------------------------------------- checkpoints

_user_types: list[Any] = []
_user_lock = threading.Lock()


def allow_checkpoint_types(*types: Any) -> None:
    """Allow more classes (or functions) in checkpoints and snapshots than Python's and torch's plain
    values: call it before the first restore, in every process that restores, with the types the training
    state holds. Only allow types whose construction from pickled data runs no code of the data's choosing
    (plain data classes do not)."""
    with _user_lock:
        _user_types.extend(types)


def _extra_checkpoint_types() -> list[Global]:
    with _user_lock:
        extra = [global_of(obj) for obj in _user_types]
    try:
        from torch.serialization import get_safe_globals
    except ImportError:  # pragma: no cover - torch older than 2.4
        return extra
    for entry in get_safe_globals():
        if isinstance(entry, tuple):  # (object, "module.name"): the name pickles use for it
            module, _, name = entry[1].rpartition(".")
            extra.append((module, name))
        else:
            extra.append(global_of(entry))
    return extra


def _is_torch_dtype(name: str) -> bool:
    import torch

    return isinstance(getattr(torch, name, None), torch.dtype)


_NUMPY_ARRAYS = {
    (module, name)
    for package in ("numpy._core", "numpy.core")
    for module, name in (
        (f"{package}.multiarray", "_reconstruct"),
        (f"{package}.multiarray", "scalar"),
        (f"{package}.numeric", "_frombuffer"),
    )
}

CHECKPOINT = AllowList(
    what="checkpoint",
    exact={
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "complex"),
        ("builtins", "slice"),
        ("builtins", "range"),
        ("builtins", "bytearray"),
        ("collections", "OrderedDict"),
        ("datetime", "datetime"),
        ("datetime", "date"),
        ("datetime", "time"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
        ("torch", "device"),
        ("torch", "Size"),
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
        ("phalanx.worker.checkpoint.payload", "TensorRef"),
        ("phalanx.worker.checkpoint.payload", "_Mapping"),
        *_NUMPY_ARRAYS,
    },
    by_module={"torch": _is_torch_dtype},
    extra=_extra_checkpoint_types,
    hint="allow it with phalanx.worker.allow_checkpoint_types, or torch.serialization.add_safe_globals",
)
"""What a checkpoint, a snapshot or a peer's buffer may hold."""


def load_checkpoint_bytes(data: bytes) -> Any:
    """Unpickle a checkpoint's (or a snapshot's) pickled part through `CHECKPOINT`."""
    return loads(data, CHECKPOINT)


def dump_checked(obj: Any) -> bytes:
    """Pickle `obj` and prove it loads through `CHECKPOINT`: a state that could not be restored is refused
    when it is saved, not found out at the restore that needed it."""
    data = pickle.dumps(obj, protocol=5)
    load_checkpoint_bytes(data)
    return data


# ------------------------------------------------------------------------------------- rendezvous state

RENDEZVOUS_STATE = AllowList(
    what="the rendezvous store's state",
    exact={
        ("torch.distributed.elastic.rendezvous.dynamic_rendezvous", "_RendezvousState"),
        ("torch.distributed.elastic.rendezvous.dynamic_rendezvous", "_NodeDesc"),
        ("datetime", "datetime"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
    },
)
"""What torch's dynamic rendezvous keeps in the store: its round state, node names and times."""
