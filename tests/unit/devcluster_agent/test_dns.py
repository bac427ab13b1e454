"""DNS wire format, cluster name resolution, and the server answering over UDP and TCP."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from phalanx.devcluster.agent import dnsserver, dnswire
from phalanx.devcluster.agent.dnsserver import DnsServer, answer, query
from phalanx.devcluster.agent.dnstable import DnsTable


def pod(name: str, ip: str, labels: dict[str, str], ready: bool = True, **spec: str) -> dict:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels},
        "spec": spec,
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def service(name: str, selector: dict[str, str] | None, **spec: object) -> dict:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"selector": selector, **spec}}


@pytest.fixture
def table() -> DnsTable:
    table = DnsTable()
    table.set_pod(pod("w0", "127.3.0.2", {"job": "a"}, hostname="w0", subdomain="grp"), True)
    table.set_pod(pod("w1", "127.3.0.3", {"job": "a"}, ready=False), True)
    table.set_pod(pod("x", "127.3.0.4", {"job": "b"}), True)
    table.set_service(service("grp", {"job": "a"}, clusterIP="None"), True)
    table.set_service(service("all", {"job": "a"}, publishNotReadyAddresses=True), True)
    table.set_service(service("manual", None), True)
    table.set_endpoints(
        {
            "metadata": {"name": "manual", "namespace": "ns"},
            "subsets": [{"addresses": [{"ip": "127.3.9.9"}]}],
        },
        True,
    )
    return table


def test_encode_decode_roundtrip() -> None:
    packet = dnswire.encode_query(77, "Svc.NS.svc.cluster.local.", dnswire.TYPE_A)
    decoded = dnswire.decode_query(packet)
    assert decoded.id == 77
    assert decoded.questions == (
        dnswire.Question("svc.ns.svc.cluster.local", dnswire.TYPE_A, dnswire.CLASS_IN),
    )
    response = dnswire.encode_response(decoded, dnswire.RCODE_OK, ["127.1.2.3", "127.1.2.4"])
    assert struct.unpack("!H", response[:2])[0] == 77
    assert dnswire.decode_response(response) == (0, ["127.1.2.3", "127.1.2.4"])


def test_compressed_names_are_read_and_loops_rejected() -> None:
    header = struct.pack("!HHHHHH", 1, 0, 1, 0, 0, 0)
    looping = header + b"\xc0\x0c" + struct.pack("!HH", 1, 1)
    with pytest.raises(dnswire.DnsFormatError):
        dnswire.decode_query(looping)
    with pytest.raises(dnswire.DnsFormatError):
        dnswire.decode_query(b"\x00\x01")


def test_services_resolve_to_ready_selected_pods(table: DnsTable) -> None:
    assert table.lookup("grp.ns.svc.cluster.local").addresses == ("127.3.0.2",)
    assert table.lookup("all.ns.svc.cluster.local").addresses == ("127.3.0.2", "127.3.0.3")
    assert table.lookup("manual.ns.svc.cluster.local").addresses == ("127.3.9.9",)
    assert table.lookup("kubernetes.default.svc.cluster.local").addresses == ("127.0.0.1",)


def test_pod_hostnames_and_pod_address_names(table: DnsTable) -> None:
    assert table.lookup("w0.grp.ns.svc.cluster.local").addresses == ("127.3.0.2",)
    assert not table.lookup("w9.grp.ns.svc.cluster.local").exists
    assert table.lookup("127-3-0-4.ns.pod.cluster.local").addresses == ("127.3.0.4",)


def test_unknown_cluster_names_do_not_exist_and_outside_names_are_not_ours(table: DnsTable) -> None:
    assert not table.lookup("nope.ns.svc.cluster.local").exists
    assert not table.lookup("grp.ns.cluster.local").exists
    assert table.lookup("www.example.org") is None


def test_table_follows_deletions_and_readiness(table: DnsTable) -> None:
    table.set_pod(pod("w1", "127.3.0.3", {"job": "a"}, ready=True), True)
    assert table.lookup("grp.ns.svc.cluster.local").addresses == ("127.3.0.2", "127.3.0.3")
    table.set_pod(pod("w0", "127.3.0.2", {"job": "a"}), False)
    assert table.lookup("grp.ns.svc.cluster.local").addresses == ("127.3.0.3",)
    table.set_service(service("grp", {"job": "a"}), False)
    assert not table.lookup("grp.ns.svc.cluster.local").exists


def test_answer_rcodes(table: DnsTable) -> None:
    def ask(name: str, qtype: int = dnswire.TYPE_A) -> tuple[int, list[str]]:
        response = answer(table, dnswire.encode_query(5, name, qtype))
        assert response is not None
        return dnswire.decode_response(response)

    assert ask("grp.ns.svc.cluster.local") == (dnswire.RCODE_OK, ["127.3.0.2"])
    assert ask("grp.ns.svc.cluster.local", dnswire.TYPE_AAAA) == (dnswire.RCODE_OK, [])
    assert ask("nope.ns.svc.cluster.local") == (dnswire.RCODE_NXDOMAIN, [])
    assert ask("example.com") == (dnswire.RCODE_REFUSED, [])
    assert answer(table, b"\x00") is None


def test_server_answers_over_udp_and_tcp(table: DnsTable) -> None:
    server = DnsServer(table, "127.0.0.1", 0)
    server.start()
    try:
        host, port = server.address
        assert query(host, port, "w0.grp.ns.svc.cluster.local") == (0, ["127.3.0.2"])
        with socket.create_connection((host, port), timeout=5) as conn:
            packet = dnswire.encode_query(9, "manual.ns.svc.cluster.local")
            conn.sendall(struct.pack("!H", len(packet)) + packet)
            (length,) = struct.unpack("!H", conn.recv(2))
            data = b""
            while len(data) < length:
                data += conn.recv(length - len(data))
        assert dnswire.decode_response(data) == (0, ["127.3.9.9"])
    finally:
        server.stop()


def test_for_a_real_nodes_pods_a_service_is_its_cluster_ip_and_headless_its_pods() -> None:
    table = DnsTable(cluster_ips=True)
    table.set_pod(pod("w0", "10.244.0.5", {"job": "a"}, hostname="w0", subdomain="grp"), True)
    table.set_service(service("web", {"job": "a"}, clusterIP="10.96.7.7"), True)
    table.set_service(service("grp", {"job": "a"}, clusterIP="None"), True)
    kubernetes = service("kubernetes", None, clusterIP="10.96.0.1")
    kubernetes["metadata"]["namespace"] = "default"
    table.set_service(kubernetes, True)
    assert table.lookup("web.ns.svc.cluster.local").addresses == ("10.96.7.7",)
    assert table.lookup("grp.ns.svc.cluster.local").addresses == ("10.244.0.5",)
    assert table.lookup("w0.grp.ns.svc.cluster.local").addresses == ("10.244.0.5",)
    assert table.lookup("kubernetes.default.svc.cluster.local").addresses == ("10.96.0.1",)
    assert DnsTable().lookup("kubernetes.default.svc.cluster.local").addresses == ("127.0.0.1",)


def test_outside_names_go_to_the_upstream_resolver_or_fail_as_servfail(
    table: DnsTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    upstream.bind(("127.0.0.1", 0))
    upstream.settimeout(5)
    packet = dnswire.encode_query(9, "www.example.org", dnswire.TYPE_A)
    canned = dnswire.encode_response(dnswire.decode_query(packet), dnswire.RCODE_OK, ["192.0.2.80"])

    def serve_once() -> None:
        data, client = upstream.recvfrom(4096)
        upstream.sendto(canned if data == packet else b"", client)

    threading.Thread(target=serve_once, daemon=True).start()
    try:
        assert answer(table, packet, upstream.getsockname()) == canned
    finally:
        upstream.close()
    assert dnswire.decode_response(answer(table, packet) or b"")[0] == dnswire.RCODE_REFUSED
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    monkeypatch.setattr(dnsserver, "UPSTREAM_TIMEOUT_SECONDS", 0.2)
    try:
        failed = answer(table, packet, silent.getsockname())
    finally:
        silent.close()
    assert dnswire.decode_response(failed or b"")[0] == dnswire.RCODE_SERVFAIL
