"""Pod IP allocation from the cluster's loopback network 127.X.0.0/16.

The /16 is split: 127.X.0.1 is the DNS server, 127.X.0.2 - 127.X.127.255 are real pods (reachable: all of
127.0.0.0/8 is local on Linux), 127.X.128.0 - 127.X.255.254 are simulated pods (never reached).
"""

from __future__ import annotations

import ipaddress
import threading


def dns_ip(octet: int) -> str:
    return f"127.{octet}.0.1"


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


def real_pod_pool(octet: int) -> IpPool:
    return IpPool(f"127.{octet}.0.2", f"127.{octet}.127.255")


def simulated_pod_pool(octet: int) -> IpPool:
    return IpPool(f"127.{octet}.128.0", f"127.{octet}.255.254")
