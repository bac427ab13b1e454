"""The node agent of the local cluster: a kubelet that runs each pod's containers as local processes.

Modules with pure logic (no I/O): `envresolve`, `ipam`, `dnswire`, `dnstable`, `podstatus`, `volumes` (planning part),
`nodes` (object builders). The rest does I/O: `kube` (REST + watches), `runtime` (processes), `sandbox` (runs inside
the pod's namespaces), `podworker` (one pod's lifecycle), `simulated`, `provisioner`, `dnsserver`, `logserver`, `agent`.
"""
