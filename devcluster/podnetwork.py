"""The local cluster's pod network: one /16 of this host's own addresses, its first address the cluster DNS.

Addresses in 127.0.0.0/8 are this host's on any Linux machine, without privileges, but Kubernetes refuses
loopback addresses in Endpoints and EndpointSlices: every Service of such pods got `FailedToUpdateEndpoint`
Warnings and no endpoints. As root, the cluster takes a /16 of 198.18.0.0/15 instead (RFC 2544's benchmarking
range: part of no real network, and valid in Endpoints) and makes all of it this host's with one route,
`ip route replace local <network> dev lo`, as the kernel does for 127.0.0.0/8. Pods bind and reach those
addresses exactly as they did 127.X ones. Without root, without `ip`, or with both /16s taken by running
clusters, pods keep 127.X.0.0/16 (and their Services get no endpoints).
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping

ROUTED_PREFIXES = ("198.18", "198.19")
"""The first two octets of the /16s a cluster may route to this host."""
LOOPBACK_ENV = "PHALANX_DEV_LOOPBACK_POD_NETWORK"
"""Set to 1 to keep pods in 127.X.0.0/16 (no route is added, Services get no endpoints)."""

Runner = Callable[[list[str]], int]
"""Runs a command and returns its exit status."""


def _run(argv: list[str]) -> int:
    return subprocess.run(argv, capture_output=True, check=False).returncode


def loopback_prefix(octet: int) -> str:
    return f"127.{octet}"


def network(prefix: str) -> str:
    return f"{prefix}.0.0/16"


def dns_address(prefix: str) -> str:
    return f"{prefix}.0.1"


def is_routed(prefix: str) -> bool:
    return prefix in ROUTED_PREFIXES


def dns_address_in_use(prefix: str) -> bool:
    """Whether a running cluster serves DNS on the network's first address (without the route nobody can)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind((dns_address(prefix), 53))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


def may_route(env: Mapping[str, str] = os.environ) -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and env.get(LOOPBACK_ENV) != "1"


def route(prefix: str, run: Runner = _run) -> bool:
    """Make every address of the network this host's (idempotent)."""
    return run(["ip", "route", "replace", "local", network(prefix), "dev", "lo"]) == 0


def unroute(prefix: str, run: Runner = _run) -> None:
    run(["ip", "route", "del", "local", network(prefix), "dev", "lo"])


def choose_prefix(
    previous: str,
    run: Runner = _run,
    allowed: bool | None = None,
    in_use: Callable[[str], bool] = dns_address_in_use,
) -> str:
    """The routed prefix for a cluster starting now: the one it had before when no other cluster took it, else
    the first one free; "" when none can be routed (the cluster's pods then use 127.X)."""
    if not (may_route() if allowed is None else allowed):
        return ""
    candidates = [previous] if is_routed(previous) else []
    candidates += [prefix for prefix in ROUTED_PREFIXES if prefix != previous]
    for prefix in candidates:
        if in_use(prefix):
            continue
        return prefix if route(prefix, run) else ""
    return ""


def release(prefix: str, run: Runner = _run, in_use: Callable[[str], bool] = dns_address_in_use) -> None:
    """Remove a stopped cluster's route, unless another cluster serves the network now."""
    if is_routed(prefix) and not in_use(prefix):
        unroute(prefix, run)
