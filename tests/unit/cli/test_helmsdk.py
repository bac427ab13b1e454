"""Helm's SDK under Helm's own field manager: for each call the Go runtime's `argv[0]` (this process's argument
memory, which a process title overwrites) reads as a path ending in `helm`, and the title is put back after."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import setproctitle

from phalanx.helmsdk import argv0_naming, program_title_naming


def argv0_as_the_go_runtime_reads_it() -> str:
    """The first `len(argv[0])` bytes of this process's argument memory: what Go's os.Args[0] holds."""
    raw = Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
    return raw[: len(sys.orig_argv[0])].decode()


@pytest.mark.parametrize("program", ["/check/work/main/.venv/bin/python", "python", "helm"])
def test_a_title_reads_as_a_path_ending_in_the_manager_within_argv0s_length(program: str) -> None:
    title = program_title_naming("helm", program)
    assert title is not None and len(title) == len(program)
    assert Path(title).name == "helm"


def test_a_program_name_too_short_for_the_manager_is_left_alone() -> None:
    assert program_title_naming("helm", "py") is None


def test_argv0_names_helm_within_the_block_whatever_title_was_set_before() -> None:
    before = setproctitle.getproctitle()
    # As pytest-xdist does between tests: the title, and so argv[0]'s bytes, name the running test.
    running = "[pytest-xdist running] tests/chaos/test_operator_faults.py::test_a"
    setproctitle.setproctitle(running)
    try:
        with argv0_naming("helm"):
            assert Path(argv0_as_the_go_runtime_reads_it().rstrip("\0")).name == "helm"
        assert setproctitle.getproctitle() == running
    finally:
        setproctitle.setproctitle(before)
