"""The local cluster behaves like a real one: kubectl against the real control plane, pods as processes."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from phalanx.devcluster import controlplane, podnetwork

from .conftest import RESTRICTED_CONTAINER, Cluster, wait_for
from .test_operator import endpoint_warnings, service_addresses

pytestmark = pytest.mark.e2e


def python_container(name: str, script: str, **extra: object) -> dict:
    return {
        "name": name,
        "image": "python:3.11",
        "command": ["python", "-c", textwrap.dedent(script)],
        # The test namespaces enforce Pod Security `restricted` (tests/conftest.py).
        "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
        **extra,
    }


def pod_phase(cluster: Cluster, namespace: str, name: str) -> str:
    return cluster.core.read_namespaced_pod(name, namespace).status.phase


def pods_of(cluster: Cluster, namespace: str, selector: str) -> list:
    return cluster.core.list_namespaced_pod(namespace, label_selector=selector).items


@pytest.mark.compat
def test_http_between_pods_by_ip_and_dns(cluster: Cluster, namespace: str) -> None:
    server = python_container(
        "web",
        """
        import http.server, os
        class Hello(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = ("hello from " + os.environ["POD_NAME"]).encode()
                self.send_response(200); self.end_headers(); self.wfile.write(body)
        http.server.HTTPServer((os.environ["POD_IP"], 8080), Hello).serve_forever()
        """,
        env=[
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        ports=[{"containerPort": 8080}],
    )
    cluster.apply(
        [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [server]}},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 8080, "targetPort": 8080}]},
            },
        ],
        namespace,
    )
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=90s", timeout=100)
    (web_pod,) = pods_of(cluster, namespace, "app=web")
    assert web_pod.status.phase == "Running"
    config = controlplane.Layout(cluster.state_dir).load_config()
    assert config is not None
    assert web_pod.status.pod_ip.startswith(f"{config.pod_network_prefix}.")
    if os.geteuid() == 0:  # the control plane routes a /16 of 198.18.0.0/15 to this host for the pods
        assert podnetwork.is_routed(config.pod_network_prefix), config
        # Such addresses go into Endpoints (loopback ones are refused, with FailedToUpdateEndpoint Warnings).
        wait_for(
            lambda: service_addresses(cluster, namespace, "web") == {web_pod.status.pod_ip},
            30,
            message="the Service's endpoint",
        )
        assert endpoint_warnings(cluster, namespace) == []
    ready = {c.type: c.status for c in web_pod.status.conditions}
    assert ready["Ready"] == "True"

    client_script = f"""
        import sys, time, urllib.request
        targets = ["http://{web_pod.status.pod_ip}:8080/", "http://web:8080/",
                   "http://web.{namespace}.svc.cluster.local:8080/"]
        for url in targets:
            for attempt in range(40):
                try:
                    body = urllib.request.urlopen(url, timeout=2).read().decode()
                    break
                except OSError as error:
                    time.sleep(0.5)
            else:
                sys.exit(f"cannot reach {{url}}")
            assert body == "hello from {web_pod.metadata.name}", body
            print("ok", url)
    """
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "client"},
            "spec": {"restartPolicy": "Never", "containers": [python_container("client", client_script)]},
        },
        namespace,
    )
    wait_for(
        lambda: pod_phase(cluster, namespace, "client") in ("Succeeded", "Failed"), 90, message="client pod"
    )
    logs = cluster.kubectl("logs", "client", "-n", namespace).stdout
    assert pod_phase(cluster, namespace, "client") == "Succeeded", logs
    assert logs.count("ok http://") == 3


def job(name: str, exit_code: int) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        python_container("main", f"import sys; print('exiting'); sys.exit({exit_code})")
                    ],
                }
            },
        },
    }


def test_job_pods_succeed_and_fail_with_exit_code(cluster: Cluster, namespace: str) -> None:
    cluster.apply([job("good", 0), job("bad", 3)], namespace)
    cluster.kubectl(
        "wait", "--for=condition=complete", "job/good", "-n", namespace, "--timeout=90s", timeout=100
    )
    cluster.kubectl(
        "wait", "--for=condition=failed", "job/bad", "-n", namespace, "--timeout=90s", timeout=100
    )
    (good,) = pods_of(cluster, namespace, "job-name=good")
    (bad,) = pods_of(cluster, namespace, "job-name=bad")
    assert good.status.phase == "Succeeded"
    assert good.status.container_statuses[0].state.terminated.exit_code == 0
    assert good.status.container_statuses[0].state.terminated.reason == "Completed"
    assert bad.status.phase == "Failed"
    assert bad.status.container_statuses[0].state.terminated.exit_code == 3
    assert bad.status.container_statuses[0].state.terminated.reason == "Error"


@pytest.mark.pod_security(
    "privileged", reason="the pod tells the test it got SIGTERM through a file in a hostPath volume"
)
def test_delete_pod_sends_sigterm_within_grace_period(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    marker = tmp_path / "terminated"
    script = """
        import signal, sys, time, pathlib
        def on_term(signum, frame):
            pathlib.Path("/out/terminated").write_text("SIGTERM")
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        print("waiting", flush=True)
        while True:
            time.sleep(0.1)
    """
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sleeper"},
            "spec": {
                "terminationGracePeriodSeconds": 20,
                "containers": [
                    python_container("main", script, volumeMounts=[{"name": "out", "mountPath": "/out"}])
                ],
                "volumes": [{"name": "out", "hostPath": {"path": str(tmp_path)}}],
            },
        },
        namespace,
    )
    cluster.kubectl(
        "wait", "--for=condition=Ready", "pod/sleeper", "-n", namespace, "--timeout=60s", timeout=70
    )
    wait_for(
        lambda: "waiting" in cluster.kubectl("logs", "sleeper", "-n", namespace).stdout,
        30,
        message="log line",
    )
    started = time.monotonic()
    cluster.kubectl("delete", "pod", "sleeper", "-n", namespace, "--wait=true", "--timeout=60s", timeout=70)
    assert time.monotonic() - started < 20, "the pod outlived its grace period"
    assert marker.read_text() == "SIGTERM"


def test_deleting_a_deployment_collects_its_replicaset_and_pods(cluster: Cluster, namespace: str) -> None:
    cluster.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "idle"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "idle"}},
                "template": {
                    "metadata": {"labels": {"app": "idle"}},
                    "spec": {
                        "containers": [python_container("main", "import time\nwhile True: time.sleep(1)")]
                    },
                },
            },
        },
        namespace,
    )
    cluster.kubectl("rollout", "status", "deployment/idle", "-n", namespace, "--timeout=90s", timeout=100)
    assert len(cluster.get_json("replicasets", "-n", namespace)["items"]) == 1
    cluster.kubectl("delete", "deployment", "idle", "-n", namespace)
    wait_for(
        lambda: (
            not cluster.get_json("replicasets", "-n", namespace)["items"]
            and not cluster.get_json("pods", "-n", namespace)["items"]
        ),
        60,
        message="garbage collection of the ReplicaSet and its pods",
    )


def _processes_with_marker(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in process.info["cmdline"] or []):
                found.append(process)
        except psutil.Error:
            continue
    return found


def test_crashed_node_goes_not_ready_and_its_processes_die(cluster: Cluster, namespace: str) -> None:
    node = "node-3"
    marker = f"crash-marker-{namespace}"
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "victim"},
            "spec": {
                "nodeName": node,
                "containers": [
                    python_container("main", f"import time\nwhile True: time.sleep(1)  # {marker}")
                ],
            },
        },
        namespace,
    )
    cluster.kubectl(
        "wait", "--for=condition=Ready", "pod/victim", "-n", namespace, "--timeout=60s", timeout=70
    )
    # Ready comes as the container is spawned: its sandbox sets up the pod's mounts first, then execs the command
    # (devcluster/agent/sandbox.py), which on a loaded machine can be a moment later.
    wait_for(lambda: bool(_processes_with_marker(marker)), 30, message="the pod's process to run")
    cluster.kubectl("annotate", "node", node, "phalanx.dev/crash=true", "--overwrite")
    try:
        wait_for(
            lambda: not _processes_with_marker(marker), 20, message="the crashed node's processes to die"
        )

        def node_not_ready() -> bool:
            node_obj = cluster.core.read_node(node)
            ready = next(c for c in node_obj.status.conditions if c.type == "Ready")
            return ready.status != "True"

        wait_for(node_not_ready, 60, message=f"{node} to be marked NotReady by the node-lifecycle controller")
    finally:
        cluster.kubectl("annotate", "node", node, "phalanx.dev/crash-", "--overwrite")
    cluster.wait_node_healthy(node)
    cluster.kubectl("delete", "pod", "victim", "-n", namespace, "--grace-period=0", "--force", check=False)


def test_kubectl_logs_returns_container_output(cluster: Cluster, namespace: str) -> None:
    script = """
        import sys, time
        for i in range(3):
            print(f"line {i}", flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        time.sleep(3600)
    """
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "talker"},
            "spec": {
                "containers": [
                    python_container("main", script),
                    python_container("side", "print('side car')\nimport time\ntime.sleep(3600)"),
                ]
            },
        },
        namespace,
    )
    cluster.kubectl(
        "wait", "--for=condition=Ready", "pod/talker", "-n", namespace, "--timeout=60s", timeout=70
    )
    wait_for(
        lambda: "to stderr" in cluster.kubectl("logs", "talker", "-c", "main", "-n", namespace).stdout, 30
    )
    logs = cluster.kubectl("logs", "talker", "-c", "main", "-n", namespace).stdout
    assert logs.splitlines()[:3] == ["line 0", "line 1", "line 2"]
    assert cluster.kubectl("logs", "talker", "-c", "side", "-n", namespace).stdout.strip() == "side car"
    assert (
        cluster.kubectl("logs", "talker", "-c", "main", "--tail=1", "-n", namespace).stdout.strip()
        == "to stderr"
    )
    follower = subprocess.Popen(
        [
            str(cluster.kubectl_path),
            f"--kubeconfig={cluster.kubeconfig}",
            "logs",
            "-f",
            "talker",
            "-c",
            "main",
            "-n",
            namespace,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first = follower.stdout.readline()  # type: ignore[union-attr]
        assert first.strip() == "line 0"
        assert follower.poll() is None, "`kubectl logs -f` should keep following a running container"
    finally:
        follower.kill()
        follower.wait()


def test_pvc_data_outlives_its_pod(cluster: Cluster, namespace: str) -> None:
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
        namespace,
    )

    def pod(name: str, script: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    python_container("main", script, volumeMounts=[{"name": "data", "mountPath": "/data"}])
                ],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            },
        }

    cluster.apply(pod("writer", "open('/data/checkpoint.txt', 'w').write('step-42')"), namespace)
    wait_for(
        lambda: pod_phase(cluster, namespace, "writer") == "Succeeded", 90, message="writer pod to succeed"
    )
    cluster.kubectl("delete", "pod", "writer", "-n", namespace)
    cluster.apply(pod("reader", "print(open('/data/checkpoint.txt').read())"), namespace)
    wait_for(
        lambda: pod_phase(cluster, namespace, "reader") == "Succeeded", 90, message="reader pod to succeed"
    )
    assert cluster.kubectl("logs", "reader", "-n", namespace).stdout.strip() == "step-42"
    assert cluster.get_json("pvc", "data", "-n", namespace)["status"]["phase"] == "Bound"


def test_fault_injection_kill_and_freeze(cluster: Cluster, namespace: str) -> None:
    script = """
        import time
        n = 0
        while True:
            n += 1
            print(n, flush=True)
            time.sleep(0.2)
    """
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "counter"},
            "spec": {"restartPolicy": "Always", "containers": [python_container("main", script)]},
        },
        namespace,
    )
    cluster.kubectl(
        "wait", "--for=condition=Ready", "pod/counter", "-n", namespace, "--timeout=60s", timeout=70
    )

    def line_count() -> int:
        return len(cluster.kubectl("logs", "counter", "-n", namespace).stdout.splitlines())

    cluster.kubectl("annotate", "pod", "counter", "-n", namespace, "phalanx.dev/freeze=true", "--overwrite")
    time.sleep(1.5)
    frozen_at = line_count()
    time.sleep(2)
    assert line_count() == frozen_at, "a frozen pod must not make progress"
    cluster.kubectl("annotate", "pod", "counter", "-n", namespace, "phalanx.dev/freeze=false", "--overwrite")
    wait_for(lambda: line_count() > frozen_at, 20, message="the thawed pod to make progress again")

    cluster.kubectl("annotate", "pod", "counter", "-n", namespace, "phalanx.dev/kill=now", "--overwrite")

    def restarted() -> bool:
        status = cluster.core.read_namespaced_pod("counter", namespace).status.container_statuses[0]
        return status.restart_count >= 1 and status.last_state.terminated is not None

    wait_for(restarted, 40, message="the killed container to be restarted")
    status = cluster.core.read_namespaced_pod("counter", namespace).status.container_statuses[0]
    assert status.last_state.terminated.exit_code == 137
    annotations = cluster.core.read_namespaced_pod("counter", namespace).metadata.annotations or {}
    assert "phalanx.dev/kill" not in annotations


def test_thousand_pods_on_simulated_nodes(cluster: Cluster, namespace: str, record_property) -> None:
    replicas = 1000
    cluster.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "fleet"},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "fleet"}},
                "template": {
                    "metadata": {"labels": {"app": "fleet"}},
                    "spec": {
                        "nodeSelector": {"phalanx.dev/simulated": "true"},
                        "tolerations": [
                            {"key": "phalanx.dev/simulated", "operator": "Exists", "effect": "NoSchedule"}
                        ],
                        "containers": [
                            {
                                "name": "main",
                                "image": "busybox",
                                "command": ["sleep", "infinity"],
                                "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}},
                                "securityContext": RESTRICTED_CONTAINER,
                            }
                        ],
                    },
                },
            },
        },
        namespace,
    )
    started = time.monotonic()

    def running() -> bool:
        pods = cluster.core.list_namespaced_pod(namespace, label_selector="app=fleet").items
        return sum(p.status.phase == "Running" for p in pods) == replicas

    wait_for(running, 600, interval=2, message=f"{replicas} pods Running on simulated nodes")
    elapsed = time.monotonic() - started
    record_property("thousand_pods_running_seconds", round(elapsed, 1))
    print(f"{replicas} pods Running on simulated nodes in {elapsed:.1f} s", file=sys.stderr)
    cluster.kubectl("delete", "deployment", "fleet", "-n", namespace, "--wait=false")


def test_down_leaves_no_process_or_port(tmp_path: Path) -> None:
    try:
        _down_leaves_no_process_or_port(tmp_path)
    finally:
        # A failure above must not leave a second cluster running beside the session's for the rest of it.
        controlplane.down(tmp_path / "small", quiet=True)


def _down_leaves_no_process_or_port(tmp_path: Path) -> None:
    layout = controlplane.up(tmp_path / "small", nodes=1, simulated_nodes=0, quiet=True)
    kubectl = [str(layout.bin / "kubectl"), f"--kubeconfig={layout.kubeconfig}"]
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "lingerer", "namespace": "default"},
        "spec": {
            "containers": [
                python_container("main", "import time\nwhile True: time.sleep(1)  # lingerer-marker")
            ]
        },
    }
    subprocess.run(
        [*kubectl, "apply", "-f", "-"], input=json.dumps(manifest), text=True, check=True, capture_output=True
    )
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Ready", "pod/lingerer", "--timeout=60s"],
        check=True,
        capture_output=True,
    )
    config = layout.load_config()
    assert config is not None
    pids = [json.loads(p.read_text())["pid"] for p in layout.pids.glob("*.pid")]
    assert len(pids) == len(controlplane.COMPONENT_ORDER)
    # Ready as soon as the container's process started: on a busy machine its exec into python may lag a moment.
    wait_for(lambda: _processes_with_marker("lingerer-marker"), 15, message="the pod's own process")

    assert controlplane.up(tmp_path / "small", nodes=1, simulated_nodes=0, quiet=True) == layout  # idempotent
    assert sorted(json.loads(p.read_text())["pid"] for p in layout.pids.glob("*.pid")) == sorted(pids)

    controlplane.down(tmp_path / "small", quiet=True)
    assert not [
        pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
    assert not _processes_with_marker("lingerer-marker")
    assert not _processes_with_marker(str(layout.root))
    ports = {
        config.etcd_port,
        config.etcd_peer_port,
        config.api_port,
        config.scheduler_port,
        config.controller_manager_port,
    }
    listening = {c.laddr.port for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN}
    assert not ports & listening
    dns_address = podnetwork.dns_address(config.pod_network_prefix)
    assert not [c for c in psutil.net_connections("inet") if c.laddr and c.laddr.ip == dns_address]
    if config.pod_prefix:  # its route went with it
        local_routes = subprocess.run(
            ["ip", "route", "show", "table", "local"], capture_output=True, text=True
        )
        assert podnetwork.network(config.pod_prefix) not in local_routes.stdout, local_routes.stdout


def test_each_pod_has_its_own_dev_shm_kept_across_container_restarts(
    cluster: Cluster, namespace: str
) -> None:
    script = """
        import os, pathlib, sys, time
        marker = pathlib.Path("/dev/shm/snapshot")
        others = sorted(p.name for p in pathlib.Path("/dev/shm").iterdir())
        print("saw", others, "restart" if marker.exists() else "first", flush=True)
        if not marker.exists():
            marker.write_text(os.environ["HOSTNAME"])
            sys.exit(1)  # crash once: the restarted container must still find its snapshot
        assert marker.read_text() == os.environ["HOSTNAME"]
        time.sleep(3600)
    """

    def pod(name: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"restartPolicy": "OnFailure", "containers": [python_container("main", script)]},
        }

    cluster.apply([pod("shm-a"), pod("shm-b")], namespace)
    for name in ("shm-a", "shm-b"):
        cluster.kubectl(
            "wait", "--for=condition=Ready", f"pod/{name}", "-n", namespace, "--timeout=60s", timeout=70
        )
        wait_for(
            lambda name=name: "restart" in cluster.kubectl("logs", name, "-n", namespace).stdout,
            40,
            message=f"{name} restarted with its /dev/shm intact",
        )
        logs = cluster.kubectl("logs", name, "-n", namespace).stdout
        assert "saw ['snapshot'] restart" in logs, logs
        assert (
            cluster.core.read_namespaced_pod(name, namespace).status.container_statuses[0].restart_count == 1
        )


def test_pods_without_private_namespaces_each_see_their_own_volumes_and_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where `unshare` is refused (some CI sandboxes), pods share the machine's filesystem. Two pods, one after
    the other, mount different folders at the same path and act as their own service accounts: each writes to
    its own folder and reads itself through the API server, also after the first pod is gone (a shared link
    at the mount path used to leave every later pod with the first one's dangling credentials)."""
    monkeypatch.setenv(controlplane.POD_NAMESPACES_ENV, "off")
    mount_path = f"/phalanx-test-{uuid.uuid4().hex[:8]}"  # a path no earlier run can have left behind
    layout = controlplane.up(tmp_path / "shared", nodes=1, simulated_nodes=0, quiet=True)
    kubectl = [str(layout.bin / "kubectl"), f"--kubeconfig={layout.kubeconfig}"]

    def apply(manifest: dict) -> None:
        subprocess.run(
            [*kubectl, "apply", "-f", "-"],
            input=json.dumps(manifest),
            text=True,
            check=True,
            capture_output=True,
        )

    try:
        rbac = {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": "read-pods", "namespace": "default"},
                    "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": "read-pods", "namespace": "default"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-pods"},
                    "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "default"}],
                },
            ],
        }
        apply(rbac)

        def account_ready() -> bool:
            found = subprocess.run(
                [*kubectl, "get", "serviceaccount", "default", "-o", "json"], capture_output=True, text=True
            )
            secrets = json.loads(found.stdout).get("secrets") if found.returncode == 0 else None
            # 1.20 admits pods of an account only once its token Secret exists; later releases make none.
            return found.returncode == 0 and controlplane.service_account_ready(
                secrets, layout.kubernetes_version
            )

        wait_for(account_ready, 60, message="the default ServiceAccount")
        script = """
            import os, kubernetes
            from phalanx import kubecredentials
            assert kubecredentials.load() == "kubeconfig", os.environ.get("KUBECONFIG")
            me = kubernetes.client.CoreV1Api().read_namespaced_pod(os.environ["HOSTNAME"], "default")
            with open("MOUNT/uid", "w") as out:
                out.write(me.metadata.uid)
        """.replace("MOUNT", mount_path)
        uids = {}
        for name in ("first", "second"):
            folder = tmp_path / name
            folder.mkdir()
            apply(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            python_container(
                                "main", script, volumeMounts=[{"name": "out", "mountPath": mount_path}]
                            )
                        ],
                        "volumes": [{"name": "out", "hostPath": {"path": str(folder)}}],
                    },
                }
            )
            wait_for(
                lambda name=name: (
                    subprocess.run(
                        [*kubectl, "get", "pod", name, "-o", "jsonpath={.status.phase}"],
                        capture_output=True,
                        text=True,
                    ).stdout
                    in ("Succeeded", "Failed")
                ),
                90,
                message=f"pod {name} to end",
            )
            pod = json.loads(
                subprocess.run(
                    [*kubectl, "get", "pod", name, "-o", "json"], capture_output=True, text=True, check=True
                ).stdout
            )
            logs = subprocess.run([*kubectl, "logs", name], capture_output=True, text=True).stdout
            assert pod["status"]["phase"] == "Succeeded", logs
            uids[name] = pod["metadata"]["uid"]
            subprocess.run([*kubectl, "delete", "pod", name, "--wait=true"], check=True, capture_output=True)
        assert {name: (tmp_path / name / "uid").read_text() for name in uids} == uids
        assert not Path(mount_path).exists(), "a mount path was made on the machine, shared by every pod"
    finally:
        controlplane.down(tmp_path / "shared", quiet=True)
