"""Prometheus scrapes: filtering, counter deltas, the apiserver's request counts by verb and resource."""

from __future__ import annotations

from phalanx.bench import prom

BEFORE = """# HELP apiserver_request_total Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",resource="pods",subresource="",verb="POST"} 10
apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST"} 10
apiserver_request_total{code="200",resource="leases",subresource="",verb="PATCH"} 100
apiserver_request_total{code="200",resource="pods",subresource="",verb="LIST"} 5
# HELP etcd_object_counts Number of stored objects.
# TYPE etcd_object_counts gauge
etcd_object_counts{resource="pods"} 42
"""

AFTER = """# HELP apiserver_request_total Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",resource="pods",subresource="",verb="POST"} 25
apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST"} 22
apiserver_request_total{code="200",resource="leases",subresource="",verb="PATCH"} 160
apiserver_request_total{code="200",resource="pods",subresource="",verb="LIST"} 9
apiserver_request_total{code="429",resource="pods",subresource="",verb="POST"} 2
apiserver_request_total{code="409",resource="trainingjobs",subresource="status",verb="PUT"} 3
# HELP etcd_object_counts Number of stored objects.
# TYPE etcd_object_counts gauge
etcd_object_counts{resource="pods"} 57
"""


def test_parse_keeps_only_the_families_asked_for() -> None:
    everything = prom.parse(BEFORE)
    assert prom.total(everything, "etcd_object_counts") == 42
    only = prom.parse(BEFORE, prom.REQUESTS)
    assert prom.total(only, "etcd_object_counts") == 0
    assert prom.total(only, "apiserver_request_total", verb="POST") == 20


def test_request_deltas_writes_and_errors() -> None:
    rows = prom.request_deltas(prom.parse(BEFORE), prom.parse(AFTER))
    by_key = {(row.verb, row.resource, row.subresource, row.code): row.count for row in rows}
    assert by_key[("POST", "pods", "", "201")] == 15
    assert by_key[("PATCH", "leases", "", "200")] == 60
    assert by_key[("POST", "pods", "", "429")] == 2
    # reads are no writes; a resource filter leaves the heartbeats' leases out
    assert prom.writes(rows) == 15 + 12 + 60 + 2 + 3
    assert prom.writes(rows, lambda row: row.resource != "leases") == 15 + 12 + 2 + 3
    assert prom.errors(rows) == {"429": 2}
    assert prom.by_resource(rows, lambda row: row.code == "409") == {"PUT trainingjobs/status": 3}


def test_a_counter_that_restarted_counts_from_zero() -> None:
    before = prom.parse('x_total{a="1"} 50\n')
    after = prom.parse('x_total{a="1"} 7\n')
    assert prom.delta(before, after, "x_total") == {(("a", "1"),): 7}
