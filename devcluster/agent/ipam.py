"""Pod IP allocation from the cluster's pod network P.0.0/16, all of it this host's addresses (P is 127.X, or a
/16 the control plane routed to this host: devcluster/podnetwork.py).

The /16 is split: P.0.1 is the DNS server, P.0.2 - P.127.255 are real pods (reachable: local addresses),
P.128.0 - P.255.254 are simulated pods (never reached).
"""

from __future__ import annotations

import ipaddress
import threading


class IpPool:
    """Hands out unique addresses of a range to keys (pod uids); thread-safe."""

    def __init__(self, first: str, last: str) -> None:
        self._first = int(ipaddress.IPv4Address(first))
        self._last = int(ipaddress.IPv4Address(last))
        self._by_key: dict[str, int] = {}
        self._used: set[int] = set()
        self._cursor = self._first
        self._lock = threading.Lock()

    def __contains__(self, ip: str) -> bool:
        try:
            value = int(ipaddress.IPv4Address(ip))
        except ValueError:
            return False
        return self._first <= value <= self._last

    def allocate(self, key: str, preferred: str | None = None) -> str:
        """The key's address: its existing one, else `preferred` when free and in range, else the next free one."""
        with self._lock:
            if key in self._by_key:
                return str(ipaddress.IPv4Address(self._by_key[key]))
            if preferred and preferred in self:
                value = int(ipaddress.IPv4Address(preferred))
                if value not in self._used:
                    return self._take(key, value)
            size = self._last - self._first + 1
            for _ in range(size):
                value = self._cursor
                self._cursor = self._first if self._cursor >= self._last else self._cursor + 1
                if value not in self._used:
                    return self._take(key, value)
            raise RuntimeError("pod IP range exhausted")

    def _take(self, key: str, value: int) -> str:
        self._by_key[key] = value
        self._used.add(value)
        return str(ipaddress.IPv4Address(value))

    def release(self, key: str) -> None:
        with self._lock:
            value = self._by_key.pop(key, None)
            if value is not None:
                self._used.discard(value)

    def in_use(self) -> int:
        with self._lock:
            return len(self._used)


def real_pod_pool(prefix: str) -> IpPool:
    return IpPool(f"{prefix}.0.2", f"{prefix}.127.255")


def simulated_pod_pool(prefix: str) -> IpPool:
    return IpPool(f"{prefix}.128.0", f"{prefix}.255.254")
