"""Gloo is sent to loopback exactly when the pod's address is on no interface (worker/gloonet.py)."""

from __future__ import annotations

from phalanx.worker import gloonet


def test_an_address_on_an_interface_keeps_gloos_own_choice() -> None:
    assert not gloonet.needs_loopback("10.244.0.7", lambda: ["127.0.0.1", "10.244.0.7"])


def test_local_cluster_addresses_use_loopback() -> None:
    on_interfaces = ["127.0.0.1", "192.0.2.2"]
    assert gloonet.needs_loopback("127.100.0.5", lambda: on_interfaces)
    assert gloonet.needs_loopback("198.18.0.9", lambda: on_interfaces)  # routed to lo, no interface's


def test_this_hosts_interface_addresses_are_read() -> None:
    assert "127.0.0.1" in gloonet.interface_addresses()
