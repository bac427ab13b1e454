"""Pod IP allocation."""

from __future__ import annotations

import pytest

from phalanx.devcluster.agent.ipam import IpPool, real_pod_pool, simulated_pod_pool
from phalanx.devcluster.podnetwork import dns_address


def test_real_pool_skips_network_and_dns_addresses() -> None:
    pool = real_pod_pool("127.42")
    assert pool.allocate("a") == "127.42.0.2"
    assert pool.allocate("b") == "127.42.0.3"
    assert "127.42.0.1" not in pool
    assert dns_address("127.42") == "127.42.0.1"


def test_same_key_same_address_and_release_frees_it() -> None:
    pool = IpPool("10.0.0.1", "10.0.0.2")
    first = pool.allocate("a")
    assert pool.allocate("a") == first
    second = pool.allocate("b")
    assert {first, second} == {"10.0.0.1", "10.0.0.2"}
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.allocate("c")
    pool.release("a")
    assert pool.allocate("c") == first
    assert pool.in_use() == 2


def test_preferred_address_is_kept_when_free() -> None:
    pool = real_pod_pool("127.7")
    assert pool.allocate("old", preferred="127.7.3.4") == "127.7.3.4"
    assert pool.allocate("other", preferred="127.7.3.4") != "127.7.3.4"
    assert pool.allocate("outside", preferred="10.1.1.1").startswith("127.7.")


def test_addresses_are_unique_across_many_pods() -> None:
    pool = real_pod_pool("127.9")
    addresses = [pool.allocate(str(i)) for i in range(3000)]
    assert len(set(addresses)) == 3000


def test_real_and_simulated_ranges_do_not_overlap() -> None:
    real, simulated = real_pod_pool("127.5"), simulated_pod_pool("127.5")
    assert "127.5.127.255" in real and "127.5.127.255" not in simulated
    assert "127.5.128.0" in simulated and "127.5.128.0" not in real
    assert simulated.allocate("x") == "127.5.128.0"
