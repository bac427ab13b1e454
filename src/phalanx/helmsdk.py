"""Helm's SDK (helm-python-sdk) on one cluster, its writes made under Helm's own field manager, `helm`.

The SDK's Go runtime names the field manager of its server-side applies after `argv[0]`, and it reads that at
each call from this process's own argument memory: `python` for a plain process, part of the title wherever
the title was set since (pytest-xdist sets its workers' to the running test's id), `helm` for Helm's own CLI.
A release applied under one name and upgraded under another fails the upgrade with a conflict on every field
it owns. So each call here runs with `argv[0]` reading `helm`, as the CLI's does: a release installed from
Phalanx's code and upgraded with the `helm` command, or the other way round, keeps one manager.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

FIELD_MANAGER = "helm"
"""The field manager of every write made here: the one Helm's CLI uses."""


def program_title_naming(manager: str, program: str) -> str | None:
    """A process title whose first `len(program)` characters, read as a path, end in `manager`; None when
    `program` (the original `argv[0]`) is too short to hold it."""
    if len(program) < len(manager):
        return None
    return "/" * (len(program) - len(manager)) + manager


@contextlib.contextmanager
def argv0_naming(manager: str) -> Iterator[None]:
    """Within the block, the Go runtime's `argv[0]` names `manager`; the process's title is put back after."""
    import setproctitle

    title = program_title_naming(manager, sys.orig_argv[0])
    if title is None:
        yield
        return
    before = setproctitle.getproctitle()
    setproctitle.setproctitle(title)
    try:
        yield
    finally:
        setproctitle.setproctitle(before)


def sdk() -> ModuleType:
    """Helm's SDK module (`helm_python`), its Go runtime started inside `argv0_naming`. The runtime fixes the
    length of its `argv[0]` when it starts: started under a longer title (pytest-xdist's, a test's id), every call
    would read `helm` and then the NUL bytes that pad the shorter title `argv0_naming` sets, a field manager the
    API server refuses. Import the SDK through here, never before it."""
    with argv0_naming(FIELD_MANAGER):
        import helm_python
    return helm_python


class Helm:
    """Install, upgrade, uninstall and list Helm releases in `namespace` of the cluster at `kubeconfig` (None:
    the one `KUBECONFIG` or `~/.kube/config` names, as for `helm`)."""

    def __init__(self, kubeconfig: Path | str | None, namespace: str) -> None:
        self.namespace = namespace
        path = None if kubeconfig is None else str(kubeconfig)
        self._config = sdk().Config(kubeconfig_path=path, namespace=namespace)

    def install(
        self, chart: Path | str, release: str, values: dict[str, Any] | None = None, **options: Any
    ) -> dict[str, Any]:
        with argv0_naming(FIELD_MANAGER):
            return self._config.install(str(chart), release, values, namespace=self.namespace, **options)

    def upgrade(
        self, chart: Path | str, release: str, values: dict[str, Any] | None = None, **options: Any
    ) -> dict[str, Any]:
        with argv0_naming(FIELD_MANAGER):
            return self._config.upgrade(str(chart), release, values, namespace=self.namespace, **options)

    def uninstall(self, release: str, **options: Any) -> dict[str, Any]:
        with argv0_naming(FIELD_MANAGER):
            return self._config.uninstall(release, **options)

    def releases(self, name_filter: str | None = None) -> list[dict[str, Any]]:
        with argv0_naming(FIELD_MANAGER):
            return self._config.list(name_filter=name_filter)
