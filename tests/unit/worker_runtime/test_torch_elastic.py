"""torch's elastic internals behind one module: the supported versions, the rule that nothing else in the
worker imports them, and every internal the module reaches, pinned on the installed torch (an upgrade that
moves one fails here, not in a recovery)."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from packaging.requirements import Requirement
from packaging.version import Version

from phalanx.worker import rendezvous, torch_elastic
from phalanx.worker.torch_support import (
    SUPPORTED_TORCH,
    UnsupportedTorchError,
    is_supported,
    release_of,
    require_supported,
)

ROOT = Path(__file__).resolve().parents[3]
WORKER = ROOT / "worker"
ELASTIC = "torch.distributed.elastic"


# ------------------------------------------------------------------------------------ the versions


@pytest.mark.parametrize(
    "version",
    [
        "2.7.0",
        "2.7.1",
        "2.8.0+cu128",
        "2.13.0",
        "2.13.0+cpu",
        "2.13.1",
        "2.14.1+debian",
        "2.7.0rc1",
        "2.14.0.dev20260101",
    ],
)
def test_releases_in_the_range_are_supported(version: str) -> None:
    assert is_supported(version)
    require_supported(version)


@pytest.mark.parametrize(
    "version",
    [
        "2.6.0",
        "2.6.0+cpu",
        "1.13.1",
        "2.15.0",
        "2.15.0+cpu",
        "2.15.0a0+git1234abc",  # a nightly of 2.15 carries 2.15's internals
        "2.15.0.dev20260301+cpu",
        "3.0.0",
        "",
        "unknown",
    ],
)
def test_releases_outside_the_range_are_not(version: str) -> None:
    assert not is_supported(version)
    with pytest.raises(UnsupportedTorchError) as raised:
        require_supported(version)
    message = str(raised.value)
    assert f"torch {version} is not supported" in message
    assert SUPPORTED_TORCH in message


def test_only_major_and_minor_count() -> None:
    assert release_of("2.13.0+cpu") == (2, 13)
    assert release_of("2.15.0a0+git1234abc") == (2, 15)
    assert release_of("10.2") == (10, 2)
    assert release_of("two") is None
    assert SUPPORTED_TORCH == ">=2.7,<2.15"


def test_the_installed_torch_is_supported() -> None:
    assert is_supported(torch.__version__)


def test_every_torch_the_project_allows_is_supported() -> None:
    """pyproject.toml's torch requirement stays within the range the launcher accepts."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(line) for line in project["dependencies"]]
    for extra in project.get("optional-dependencies", {}).values():
        requirements += [Requirement(line) for line in extra]
    torch_requirements = [requirement for requirement in requirements if requirement.name == "torch"]
    assert torch_requirements, "pyproject.toml names no torch requirement"
    for requirement in torch_requirements:
        allowed = [
            version
            for minor in range(0, 30)
            for version in (f"2.{minor}.0", f"2.{minor}.1")
            if requirement.specifier.contains(Version(version))
        ]
        assert allowed, f"{requirement} allows no torch 2.x release"
        assert all(is_supported(version) for version in allowed), (requirement, allowed)


# ---------------------------------------------------------------------------- nothing else imports it


def elastic_imports(source: str) -> list[int]:
    """Lines of `source` that import torch.distributed.elastic or anything under it."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        if any(name == ELASTIC or name.startswith(ELASTIC + ".") for name in names):
            lines.append(node.lineno)
    return lines


def test_the_scan_finds_every_form_of_import() -> None:
    assert elastic_imports("import torch.distributed.elastic.rendezvous as r") == [1]
    assert elastic_imports("from torch.distributed import elastic") == [1]
    assert elastic_imports("def f():\n    from torch.distributed.elastic.agent import api") == [2]
    assert elastic_imports("import torch.distributed as dist\nfrom torch.distributed import Store") == []


def test_no_worker_module_but_the_compat_one_imports_torch_elastic() -> None:
    compat = WORKER / "torch_elastic.py"
    assert elastic_imports(compat.read_text()), "the compat module itself no longer imports torch's internals"
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted(WORKER.rglob("*.py"))
        if path != compat
        for line in elastic_imports(path.read_text())
    ]
    assert offenders == [], (
        f"import torch's elastic internals through phalanx.worker.torch_elastic: {offenders}"
    )


# ------------------------------------------------------------------- the internals, on this torch


@pytest.fixture
def store() -> Iterator[dist.Store]:
    server = rendezvous.serve("127.0.0.1", 0)
    yield rendezvous.connect("127.0.0.1", server.port, timeout=5)
    del server


def handler_on(
    store: dist.Store,
    handler_class: type[torch_elastic.DynamicRendezvousHandler] = torch_elastic.DynamicRendezvousHandler,
) -> torch_elastic.DynamicRendezvousHandler:
    return handler_class.from_backend(
        run_id="job",
        store=store,
        backend=torch_elastic.C10dRendezvousBackend(store, "job"),
        min_nodes=1,
        max_nodes=2,
        local_addr="127.0.0.1",
        timeout=torch_elastic.RendezvousTimeout(join=timedelta(seconds=5)),
        keep_alive_interval=1,  # type: ignore[arg-type]  # torch annotates it as int, uses it as seconds
        keep_alive_max_attempt=3,
    )


def test_the_handler_internals_are_where_the_launcher_reaches(store: dist.Store) -> None:
    handler = handler_on(store)
    node = torch_elastic.node_of(handler)
    assert (node.addr, node.local_id) == ("127.0.0.1", 0)
    holder = torch_elastic.state_holder(handler)
    holder.sync()
    state = torch_elastic.round_state(handler)
    assert (state.round, state.complete, state.participants, state.wait_list) == (0, False, {}, set())
    assert state.redundancy_list == set() and state.closed is False
    assert torch_elastic.state_backend(handler).get_state() is None  # nothing written yet


def test_a_swapped_store_is_the_one_the_handler_reads(store: dist.Store) -> None:
    handler = handler_on(store)
    other_server = rendezvous.serve("127.0.0.1", 0)
    other = rendezvous.connect("127.0.0.1", other_server.port, timeout=5)
    torch_elastic.C10dRendezvousBackend(other, "job").set_state(b"not torch's")
    backend = torch_elastic.C10dRendezvousBackend(other, "job")
    torch_elastic.swap_store(handler, other, backend)
    assert torch_elastic.state_backend(handler) is backend
    assert handler._store is other
    assert torch_elastic.state_holder(handler)._token is None


def test_replaced_settings_reach_every_part_that_reads_them(store: dist.Store) -> None:
    handler = handler_on(store)
    settings = torch_elastic.handler_settings(handler)
    assert isinstance(settings, torch_elastic.RendezvousSettings) and settings.max_nodes == 2
    marker = object()
    torch_elastic.replace_handler_settings(handler, marker)
    assert torch_elastic.handler_settings(handler) is marker
    assert handler._op_executor._settings is marker  # type: ignore[attr-defined]
    assert torch_elastic.state_holder(handler)._settings is marker
    torch_elastic.stop_keep_alives(handler)  # torch's own call, found where the launcher reaches for it


def test_the_join_the_launcher_guards_is_where_it_reaches(
    store: dist.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # worker/rendezvous.py's freshest-state rule wraps the executor's run and answers torch's join actions.
    generator = torch_elastic.dynamic_rendezvous._NodeDescGenerator()
    monkeypatch.setattr(torch_elastic.DynamicRendezvousHandler, "_node_desc_generator", generator)
    handler = handler_on(store)
    run = inspect.signature(handler._op_executor.run)
    assert list(run.parameters)[:2] == ["state_handler", "deadline"]
    dynamic = torch_elastic.dynamic_rendezvous
    assert {"ADD_TO_PARTICIPANTS", "KEEP_ALIVE", "SYNC"} <= set(dynamic._Action.__members__)
    assert callable(dynamic._should_keep_alive) and callable(dynamic._RendezvousJoinOp())
    asked: list[tuple[int, int]] = []

    class Asked(Exception):
        pass

    def guard(state: object, max_nodes: int) -> bool:
        asked.append((len(state.participants), max_nodes))  # type: ignore[attr-defined]
        raise Asked

    torch_elastic.guard_joins(handler, guard)
    with pytest.raises(Asked):
        handler.next_rendezvous()  # an open round: before adding itself, it asks
    assert asked == [(0, 2)]


def test_the_rendezvous_still_polls_through_the_module_delay() -> None:
    delay = torch_elastic.sync_delay()
    assert delay is not None
    executor = inspect.getsource(torch_elastic.dynamic_rendezvous._DistributedRendezvousOpExecutor.run)
    assert "_delay(seconds=1)" in executor


def test_the_state_cache_is_the_holders_and_a_zero_cache_reads_the_store_each_time(store: dist.Store) -> None:
    handler = handler_on(store)
    holder = torch_elastic.state_holder(handler)
    assert holder._cache_duration == 1  # torch's default: a second of stale reads
    torch_elastic.set_state_cache(handler, 0.0)
    holder.sync()
    reads = []
    backend = torch_elastic.state_backend(handler)
    original = backend.get_state
    backend.get_state = lambda: reads.append(1) or original()  # type: ignore[method-assign]
    holder.sync()
    holder.sync()
    assert len(reads) == 2


def test_the_agent_starts_processes_through_the_replaceable_factory() -> None:
    factory = torch_elastic.subprocess_handler_factory()
    assert callable(factory)
    assert "get_subprocess_handler(" in inspect.getsource(torch_elastic._multiprocessing_api)
    assert callable(torch_elastic.SubprocessHandler._popen)
    assert "local_rank_id" in inspect.getsource(torch_elastic.SubprocessHandler.__init__)


def test_the_agent_tells_training_processes_to_use_the_launchers_store_by_the_handler_s_word(
    store: dist.Store,
) -> None:
    """worker/attemptstore.py: the launcher hosts the training processes' store, and torch's agent passes the
    handler's `use_agent_store` on as TORCHELASTIC_USE_AGENT_STORE (so no training rank hosts one)."""
    handler = handler_on(store, torch_elastic.LauncherStoreHandler)
    assert isinstance(handler, torch_elastic.LauncherStoreHandler) and handler.use_agent_store is True
    start = inspect.getsource(torch_elastic.LocalElasticAgent._start_workers)
    assert "spec.rdzv_handler.use_agent_store" in start and '"TORCHELASTIC_USE_AGENT_STORE"' in start
    # env:// makes every rank a client under that word (2.14 adds: when MASTER_ADDR/PORT name the store).
    env_rendezvous = inspect.getsource(importlib.import_module("torch.distributed.rendezvous"))
    assert "_torchelastic_use_agent_store()" in env_rendezvous and "is_master=False" in env_rendezvous


def test_the_agent_hooks_the_launcher_overrides_exist() -> None:
    for hook in torch_elastic.AGENT_HOOKS:
        assert callable(getattr(torch_elastic.LocalElasticAgent, hook, None)), hook
    sources = "".join(inspect.getsource(cls.__init__) for cls in torch_elastic.LocalElasticAgent.__mro__[:2])
    for attribute in ("_pcontext", "_worker_group", "_remaining_restarts"):
        assert f"self.{attribute}" in sources, attribute


# --------------------------------------------------------------------------- an unsupported torch


def test_the_launcher_refuses_an_unsupported_torch_in_one_line() -> None:
    pretend = "import runpy, torch; torch.__version__ = '2.6.0+cpu'; "
    run = "runpy.run_module('phalanx.worker.launch', run_name='__main__', alter_sys=True)"
    finished = subprocess.run(
        [sys.executable, "-c", pretend + run, "--", "true"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert finished.returncode == 2, finished.stderr  # LauncherExit.BAD_CONFIG
    lines = finished.stderr.strip().splitlines()
    assert len(lines) == 1, finished.stderr
    assert "torch 2.6.0+cpu is not supported" in lines[0] and SUPPORTED_TORCH in lines[0]


def test_phalanx_worker_launch_reports_it_as_a_user_facing_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from phalanx.cli import main

    monkeypatch.setattr(torch, "__version__", "2.15.0a0+git1234abc")
    for module in ("phalanx.worker.launch", "phalanx.worker.torch_elastic"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    assert main(["worker", "launch", "--", "true"]) == 2
    assert "torch 2.15.0a0+git1234abc is not supported" in capsys.readouterr().err
