"""A real node beside the agent's: containerd + kubelet + kube-proxy on this host, pods in real containers.

One cluster for the module, started the way users start it (`phalanx dev up --real-nodes 1`), with no agent
node so that every pod lands on the real node. Checked: Services through kube-proxy (ClusterIP and headless),
cluster DNS for Service names, pod hostnames and `kubernetes.default`, `kubectl logs` and `exec`, the
container runtime's defaults (/dev/shm 64 MiB, the image's user), `up` idempotent and restarting a killed
kubelet or containerd without losing a pod, and `down` leaving the host as it found it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from phalanx.devcluster import controlplane, processes
from phalanx.devcluster.realnode import host, images
from phalanx.devcluster.realnode import node as real_node

from .conftest import wait_for

pytestmark = [pytest.mark.realnode, pytest.mark.slow]

BUSYBOX = images.BUSYBOX_IMAGE
WEB = f"""
apiVersion: v1
kind: Pod
metadata: {{name: web-0, labels: {{app: web}}}}
spec:
  hostname: web-0
  subdomain: web-headless
  containers:
  - name: web
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: [/bin/busybox, sh, -c, "mkdir -p /tmp/www && echo hello-from-web > /tmp/www/index.html && exec /bin/busybox httpd -f -v -p 8080 -h /tmp/www"]
    readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: web}}
spec: {{selector: {{app: web}}, ports: [{{port: 80, targetPort: 8080}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: web-headless}}
spec: {{clusterIP: None, selector: {{app: web}}, ports: [{{port: 8080}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: client}}
spec:
  containers:
  - name: client
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: [/bin/busybox, sleep, "3600"]
"""


class RealNodeCluster:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.kubeconfig = state_dir / "kubeconfig"

    def phalanx_dev(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "phalanx.cli", "dev", *args, "--state-dir", str(self.state_dir)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [str(self.state_dir / "bin" / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}{result.stdout}")
        return result.stdout

    def exec_client(self, *command: str) -> str:
        result = subprocess.run(
            [str(self.state_dir / "bin" / "kubectl"), f"--kubeconfig={self.kubeconfig}", "exec", "client", "--",
             "/bin/busybox", *command],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        return result.stdout + result.stderr

    def pods(self) -> dict[str, dict]:
        found = json.loads(self.kubectl("get", "pods", "-o", "json"))
        return {pod["metadata"]["name"]: pod for pod in found["items"]}

    def all_ready(self) -> bool:
        pods = self.pods()
        return len(pods) == 2 and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
            for pod in pods.values()
        )

    def daemon(self, name: str) -> processes.PidRecord:
        return real_node.running(real_node.settings_for(self.state_dir, ""))[name]


def host_sysctls() -> dict[str, str | None]:
    return {name: host.read_sysctl(name) for name in host.SYSCTLS}


def node_footprint() -> dict[str, object]:
    """What a real node leaves on the host while it runs: none of it may remain after `down`."""
    mounts = host.node_mounts(Path("/proc/mounts").read_text())
    saved = subprocess.run(["iptables-save"], capture_output=True, text=True, check=False).stdout
    chains = [line for line in saved.splitlines() if "KUBE-" in line or "CNI-" in line]
    bridge = subprocess.run(["ip", "link", "show", "cni0"], capture_output=True, check=False).returncode == 0
    daemons = [
        p.info["name"]
        for p in psutil.process_iter(["name"])
        if p.info["name"] in ("containerd", "kubelet", "kube-proxy")
        or "containerd-shim" in (p.info["name"] or "")
    ]
    state = [str(path) for path in host.STATE_DIRS if path.exists()]
    return {"mounts": mounts, "chains": chains[:5], "bridge": bridge, "daemons": daemons, "state": state}


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNodeCluster]:
    assert os.geteuid() == 0, "a real node needs root (containerd, kubelet, iptables)"
    before = host_sysctls()
    cluster = RealNodeCluster(tmp_path_factory.mktemp("real-node"))
    started = cluster.phalanx_dev("up", "--nodes", "0", "--real-nodes", "1")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield cluster
    finally:
        stopped = cluster.phalanx_dev("down")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert node_footprint() == {"mounts": [], "chains": [], "bridge": False, "daemons": [], "state": []}
        assert host_sysctls() == before


def test_services_dns_logs_and_exec_work_in_real_containers(real: RealNodeCluster) -> None:
    real.kubectl("apply", "-f", "-", input=WEB)
    wait_for(real.all_ready, timeout=120, message=lambda: real.kubectl("get", "pods", "-o", "wide"))
    pods = real.pods()
    assert pods["client"]["spec"]["nodeName"] == real_node.NODE_NAME
    assert pods["web-0"]["status"]["podIP"].startswith("10.244.")
    cluster_ip = real.kubectl("get", "service", "web", "-o", "jsonpath={.spec.clusterIP}")

    def resolves(name: str, address: str) -> bool:
        return f"Address: {address}" in real.exec_client("nslookup", name)

    web_ip = pods["web-0"]["status"]["podIP"]
    # The DNS and kube-proxy follow the API asynchronously (as on any cluster): retry for a few seconds.
    wait_for(
        lambda: resolves("web.default.svc.cluster.local", cluster_ip), 20, message="web -> its ClusterIP"
    )
    wait_for(
        lambda: resolves("web-headless.default.svc.cluster.local", web_ip), 20, message="headless -> pod"
    )
    wait_for(lambda: resolves("kubernetes.default.svc.cluster.local", "10.96.0.1"), 20, message="kubernetes")
    for url in ("http://web/", "http://web-headless:8080/", "http://web-0.web-headless:8080/"):
        wait_for(lambda url=url: "hello-from-web" in real.exec_client("wget", "-qO-", url), 20, message=url)
    assert "response:200" in real.kubectl("logs", "web-0")
    assert "uid=65534" in real.exec_client("id")  # the image's user, not root
    shm = real.exec_client("df", "-m", "/dev/shm").splitlines()[-1].split()
    assert shm[1] == "64"  # the runtime's default /dev/shm: 64 MiB


def test_up_again_restarts_a_killed_kubelet_and_containerd_and_loses_no_pod(real: RealNodeCluster) -> None:
    wait_for(real.all_ready, timeout=120, message="the pods of the previous test")
    before = {name: pod["metadata"]["uid"] for name, pod in real.pods().items()}
    again = real.phalanx_dev("up", "--nodes", "0", "--real-nodes", "1")
    assert again.returncode == 0 and "already running" in again.stdout, again.stdout + again.stderr
    for daemon in ("kubelet", "containerd"):
        killed = real.daemon(daemon)
        os.kill(killed.pid, signal.SIGKILL)
        wait_for(lambda killed=killed: not killed.alive(), 10, message=f"{daemon} gone")
        restarted = real.phalanx_dev("up", "--nodes", "0", "--real-nodes", "1")
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        assert real.daemon(daemon) != killed
    wait_for(real.all_ready, timeout=120, message=lambda: real.kubectl("get", "pods", "-o", "wide"))
    after = real.pods()
    assert {name: pod["metadata"]["uid"] for name, pod in after.items()} == before
    assert all(pod["status"]["containerStatuses"][0]["restartCount"] == 0 for pod in after.values())
    wait_for(lambda: "hello-from-web" in real.exec_client("wget", "-qO-", "http://web/"), 20, message="web")


def test_a_second_real_node_is_refused_with_a_clear_reason(tmp_path: Path) -> None:
    layout = controlplane.Layout(tmp_path)
    with pytest.raises(Exception, match="at most 1"):
        controlplane.up(layout.root, nodes=0, real_nodes=2, quiet=True)
