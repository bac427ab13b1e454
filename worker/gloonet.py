"""Which interface gloo's TCP transport binds, for pods whose address is on no interface.

Without `GLOO_SOCKET_IFNAME`, gloo resolves the host name and then looks for the interface that carries the
address (`Unable to find interface for: [...]` when none does). Pods of the local cluster have addresses that
are this host's without being any interface's: 127.X.Y.Z, or one of the /16 routed to the loopback device
(devcluster/podnetwork.py). Their training processes all run on this host, so loopback reaches every peer.
On a real node the pod's address is its interface's and nothing changes.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable

import psutil


def interface_addresses() -> set[str]:
    return {
        address.address
        for addresses in psutil.net_if_addrs().values()
        for address in addresses
        if address.family == socket.AF_INET
    }


def needs_loopback(
    pod_address: str, on_interfaces: Callable[[], Iterable[str]] = interface_addresses
) -> bool:
    """Whether gloo must be told to use loopback: the pod's address is a loopback one, or no interface's."""
    return pod_address.startswith("127.") or pod_address not in set(on_interfaces())
