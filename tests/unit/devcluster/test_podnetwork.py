"""Which /16 the local cluster's pods get, and the route that makes it this host's (devcluster/podnetwork.py).
The commands are recorded here, not run: the e2e tests run them (tests/e2e/test_devcluster.py)."""

from __future__ import annotations

from phalanx.devcluster import podnetwork


class Commands:
    def __init__(self, status: int = 0) -> None:
        self.status = status
        self.seen: list[list[str]] = []

    def __call__(self, argv: list[str]) -> int:
        self.seen.append(argv)
        return self.status


def test_a_new_cluster_routes_the_first_free_network_to_this_host() -> None:
    run = Commands()
    assert (
        podnetwork.choose_prefix("", run, allowed=True, in_use=lambda prefix: prefix == "198.18") == "198.19"
    )
    assert run.seen == [["ip", "route", "replace", "local", "198.19.0.0/16", "dev", "lo"]]


def test_a_restarted_cluster_keeps_its_network_unless_another_cluster_serves_it() -> None:
    assert podnetwork.choose_prefix("198.19", Commands(), allowed=True, in_use=lambda _: False) == "198.19"
    taken = podnetwork.choose_prefix("198.19", Commands(), allowed=True, in_use=lambda p: p == "198.19")
    assert taken == "198.18"


def test_loopback_addresses_when_no_route_can_be_made() -> None:
    run = Commands()
    assert podnetwork.choose_prefix("", run, allowed=False) == ""
    assert run.seen == []
    assert podnetwork.choose_prefix("", Commands(status=2), allowed=True, in_use=lambda _: False) == ""
    assert podnetwork.choose_prefix("", Commands(), allowed=True, in_use=lambda _: True) == ""


def test_routing_is_allowed_to_root_with_ip_unless_refused(monkeypatch) -> None:
    monkeypatch.setattr(podnetwork.os, "geteuid", lambda: 0)
    monkeypatch.setattr(podnetwork.shutil, "which", lambda name: f"/usr/sbin/{name}")
    assert podnetwork.may_route({})
    assert not podnetwork.may_route({podnetwork.LOOPBACK_ENV: "1"})
    monkeypatch.setattr(podnetwork.os, "geteuid", lambda: 1000)
    assert not podnetwork.may_route({})


def test_a_stopped_clusters_route_goes_unless_another_cluster_took_the_network() -> None:
    run = Commands()
    podnetwork.release("198.18", run, in_use=lambda _: False)
    assert run.seen == [["ip", "route", "del", "local", "198.18.0.0/16", "dev", "lo"]]
    kept = Commands()
    podnetwork.release("198.18", kept, in_use=lambda _: True)
    podnetwork.release("127.100", kept, in_use=lambda _: False)
    assert kept.seen == []


def test_addresses_of_a_network() -> None:
    assert podnetwork.network("198.18") == "198.18.0.0/16"
    assert podnetwork.dns_address(podnetwork.loopback_prefix(100)) == "127.100.0.1"
    assert podnetwork.is_routed("198.19") and not podnetwork.is_routed("127.100")
