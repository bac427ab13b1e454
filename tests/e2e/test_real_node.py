"""A real node beside the agent's: containerd + kubelet + kube-proxy on this host, pods in real containers.

One cluster for the module, started the way users start it (`phalanx dev up --real-nodes 1`), with no agent
node so that every pod lands on the real node. Checked: Services through kube-proxy (ClusterIP and headless),
cluster DNS for Service names, pod hostnames and `kubernetes.default`, `kubectl logs` and `exec`, the
container runtime's defaults (/dev/shm 64 MiB, the image's user), `up` idempotent and restarting a killed
kubelet or containerd without losing a pod, and `down` leaving the host as it found it. Then Phalanx as
users meet it first: the operator from its image through Helm, `phalanx demo --real-nodes` through a SIGKILLed
container, the example through `kubectl delete pod`, and a user's mistakes (memory limit, shared memory, a
volume the non-root worker cannot write) named in the job's status.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from phalanx import demo
from phalanx.devcluster import controlplane, processes
from phalanx.devcluster.realnode import host, images
from phalanx.devcluster.realnode import node as real_node
from phalanx.helmsdk import Helm

from .conftest import assert_demo_succeeded, pod_security_labels, wait_for

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


OPERATOR_NAMESPACE = "phalanx-system"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CHART = Path(__file__).resolve().parents[2] / "charts" / "phalanx"


def job_status(real: RealNodeCluster, namespace: str) -> dict:
    return json.loads(real.kubectl("get", "tj", "tinygpt", "-n", namespace, "-o", "json")).get("status") or {}


def active_workers(real: RealNodeCluster, namespace: str) -> list[dict]:
    found = json.loads(
        real.kubectl("get", "pods", "-n", namespace, "-l", "phalanx.dev/role=worker", "-o", "json")
    )
    return [
        pod
        for pod in found["items"]
        if pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")
    ]


@pytest.fixture(scope="module")
def operator_pod(real: RealNodeCluster) -> str:
    """What a platform team does first: build the images and `helm install` the chart. The operator's pod."""
    build = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "image", "build"],
        capture_output=True, text=True, timeout=1500, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert "imported into containerd" in build.stdout

    helm = Helm(real.kubeconfig, OPERATOR_NAMESPACE)
    # One replica: these tests read the acting operator's logs and files (two replicas' takeover is tested on the
    # agent's nodes, tests/e2e/test_operator_ha.py).
    helm.install(
        CHART, "phalanx", values={"reconcileIntervalSeconds": 2, "replicaCount": 1}, create_namespace=True
    )
    operator = wait_for(
        lambda: [
            pod
            for pod in json.loads(real.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "json"))[
                "items"
            ]
            if any(
                c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", [])
            )
        ],
        180,
        message=lambda: real.kubectl("get", "pods", "-A", "-o", "wide"),
    )[0]
    return str(operator["metadata"]["name"])


def test_the_operator_runs_from_its_image_as_the_chart_says(real: RealNodeCluster, operator_pod: str) -> None:
    """Non-root, read-only root file system, probes the kubelet calls."""
    name = operator_pod
    assert real.kubectl("exec", "-n", OPERATOR_NAMESPACE, name, "--", "id", "-u").strip() == "10001"
    touched = subprocess.run(
        [str(real.state_dir / "bin" / "kubectl"), f"--kubeconfig={real.kubeconfig}", "exec", "-n",
         OPERATOR_NAMESPACE, name, "--", "touch", "/opt/phalanx/x"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert touched.returncode != 0 and "Read-only file system" in touched.stderr
    wait_for(
        lambda: "kube-probe" in real.kubectl("logs", "-n", OPERATOR_NAMESPACE, name),
        60,
        message="the kubelet's probes in the operator's log",
    )


@pytest.mark.real_training
def test_the_demo_trains_through_a_sigkilled_container(
    real: RealNodeCluster, operator_pod: str, tmp_path: Path
) -> None:
    """`phalanx demo --real-nodes` on the module's cluster (its `up` finds it running; the images are cached):
    a worker's container SIGKILLed through containerd, as the OOM killer or a crash would, the spare takes over."""
    result = subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "demo", "--real-nodes", "--state-dir", str(real.state_dir),
         "--report", str(tmp_path)],
        capture_output=True, text=True, timeout=2400, check=False,
    )  # fmt: skip
    summary = assert_demo_succeeded(result, tmp_path)

    # The kill was a real one: SIGKILL to the worker's container on the real node, not the agent's annotation.
    assert summary["kill_method"] == demo.CONTAINER_KILL, summary
    container = summary["killed_container"]
    assert re.fullmatch(r"[0-9a-f]{64}", container or ""), container
    assert "SIGKILL to its container's task through ctr" in result.stdout
    assert int((summary["restarts"] or {}).get("total") or 0) >= 1, summary["restarts"]
    # The hot spare took the killed worker's place.
    events = real.kubectl("get", "events", "-n", demo.DEMO_NAMESPACE, "-o", "jsonpath={.items[*].reason}")
    assert "SparePromoted" in events.split(), events
    # Whatever pods of the job are left ran on the real node: there is no other.
    pods = json.loads(real.kubectl("get", "pods", "-n", demo.DEMO_NAMESPACE, "-o", "json"))["items"]
    assert {pod["spec"].get("nodeName") for pod in pods} <= {real_node.NODE_NAME}
    # containerd no longer runs the killed container's task (gone, or stopped by the SIGKILL).
    tasks = subprocess.run(
        ["ctr", "--namespace", "k8s.io", "tasks", "ls"], capture_output=True, text=True, check=True
    ).stdout
    assert not any(line.split()[:1] == [container] and "RUNNING" in line for line in tasks.splitlines())


@pytest.mark.real_training
def test_the_example_trains_through_a_deleted_pod_whose_sigterm_save_lands(
    real: RealNodeCluster, operator_pod: str
) -> None:
    """`kubectl apply` of the example, as users do, with the operator from its image."""
    namespace = "tinygpt"
    real.kubectl("create", "namespace", namespace)
    # Pod Security `restricted` enforced on real containers: the operator's defaults and the image's
    # non-root user meet it, with nothing in the example's template about security.
    restricted = [f"{key}={value}" for key, value in pod_security_labels("restricted").items()]
    real.kubectl("label", "namespace", namespace, *restricted)
    example = (EXAMPLES / "tinygpt.yaml").read_text()
    # Long enough to be deleted on the way: about 0.1 s per step.
    example = example.replace('args: ["--steps", "300", "--print-every", "25"]',
                              'args: ["--steps", "250", "--print-every", "25", "--step-delay", "0.1"]')  # fmt: skip
    example = example.replace("keep: 3", "keep: 100")  # every checkpoint stays, the emergency save too
    assert "--step-delay" in example and "keep: 100" in example
    real.kubectl("apply", "-n", namespace, "-f", "-", input=example)

    def step() -> int:
        return int(job_status(real, namespace).get("step") or 0)

    wait_for(
        lambda: step() >= 80,
        300,
        message=lambda: (
            real.kubectl("get", "tj,pods", "-n", namespace)
            + real.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp")
        ),
    )
    # `kubectl logs` and `exec` reach a worker's container, whose /dev/shm is the operator's memory-backed
    # volume, not the runtime's 64 MiB.
    worker = active_workers(real, namespace)[0]["metadata"]["name"]
    assert "step" in real.kubectl("logs", "-n", namespace, worker, "--tail=50")
    shm = real.kubectl("exec", "-n", namespace, worker, "--", "df", "-m", "/dev/shm").splitlines()[-1].split()
    assert int(shm[1]) > 64, shm

    # A worker deleted with kubectl: the kubelet's SIGTERM, and the launcher's save inside the grace period.
    deleted = active_workers(real, namespace)[0]["metadata"]["name"]
    real.kubectl("delete", "pod", deleted, "-n", namespace, "--wait=false")
    wait_for(
        lambda: int((job_status(real, namespace).get("restarts") or {}).get("total") or 0) >= 1,
        120,
        message=lambda: real.kubectl("get", "tj,pods", "-n", namespace),
    )
    wait_for(
        lambda: any(
            c["type"] == "Succeeded" and c["status"] == "True"
            for c in job_status(real, namespace).get("conditions", [])
        ),
        600,
        interval=2,
        message=lambda: real.kubectl("get", "tj,pods", "-n", namespace),
    )
    real.kubectl("wait", "--for=condition=Succeeded", "tj/tinygpt", "-n", namespace, "--timeout=30s")

    final = job_status(real, namespace)
    causes = final["restarts"]["byCause"]
    assert sum(causes.values()) == 1, causes
    assert "PodDeleted" in causes, causes
    events = real.kubectl("get", "events", "-n", namespace, "-o", "jsonpath={.items[*].reason}").split()
    assert "SparePromoted" in events
    # The emergency save on SIGTERM is a durable checkpoint off the 50-step interval, on the claim's volume.
    claim = json.loads(real.kubectl("get", "pvc", "tinygpt-checkpoints", "-n", namespace, "-o", "json"))
    volume = json.loads(real.kubectl("get", "pv", claim["spec"]["volumeName"], "-o", "json"))
    # The job's own folder on the claim: `<namespace>/<job>`.
    folder = Path(volume["spec"]["hostPath"]["path"]) / namespace / "tinygpt"
    saved = sorted(int(p.name.split("-")[1]) for p in folder.glob("step-*"))
    off_interval = [step for step in saved if step % 50]
    assert off_interval, f"no emergency save on SIGTERM among the durable checkpoints {saved}"
    assert int(final["step"]) == 250


def small_job(name: str, claim: str, args: list[str], memory_limit: str, spec: str = "") -> str:
    """One worker of tinygpt from the worker image: what a user's first job on a real cluster looks like."""
    return f"""
apiVersion: phalanx.dev/v1alpha1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  replicas: 1
  checkpoint: {{claimName: {claim}, path: /checkpoints, intervalSteps: 50}}
  failurePolicy: {{maxRestarts: 1}}
  gang: {{scheduleTimeoutSeconds: 120}}
{spec}
  template:
    spec:
      containers:
      - name: trainer
        image: phalanx-worker:0.1.0
        command: [python, -m, phalanx.worker.examples.tinygpt]
        args: {json.dumps(args)}
        resources: {{requests: {{cpu: 100m, memory: 256Mi}}, limits: {{memory: {memory_limit}}}}}
"""


CLAIM = """
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: checkpoints}
spec: {accessModes: [ReadWriteMany], resources: {requests: {storage: 1Gi}}}
"""


def root_owned_claim(namespace: str, directory: Path) -> str:
    """A volume made by root and left 0755, as many are: the non-root worker cannot write to it."""
    return f"""
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {namespace}-root-owned}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  hostPath: {{path: {directory}, type: Directory}}
  claimRef: {{namespace: {namespace}, name: checkpoints}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: checkpoints}}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: ""
  volumeName: {namespace}-root-owned
  resources: {{requests: {{storage: 1Gi}}}}
"""


def failed_condition(real: RealNodeCluster, namespace: str, name: str) -> dict | None:
    status = json.loads(real.kubectl("get", "tj", name, "-n", namespace, "-o", "json")).get("status") or {}
    return next(
        (c for c in status.get("conditions", []) if c["type"] == "Failed" and c["status"] == "True"), None
    )


def test_a_users_mistakes_on_a_real_node_are_named_in_the_job(
    real: RealNodeCluster, operator_pod: str, tmp_path: Path
) -> None:
    """Three first-day mistakes at once, each in its own namespace, each told in the job's status in words:
    a trainer that outgrows its memory limit (the kernel's OOM kill), shared memory too small for the
    in-memory snapshot, and a checkpoint volume the non-root worker cannot write."""
    grow = ["--steps", "200", "--step-delay", "0.05", "--print-every", "5"]
    locked = tmp_path / "root-owned"
    locked.mkdir(mode=0o755)
    os.chown(locked, 0, 0)
    jobs = {
        # 1 GiB more state at step 3 in a container limited to 768 MiB.
        "oom": CLAIM + "---" + small_job(
            "oom", "checkpoints", [*grow, "--grow-state-at-step", "3", "--grow-state-mb", "1024"], "768Mi",
            spec="  sharedMemory: {sizeLimit: 64Mi}\n  preflight: {enabled: false}",
        ),
        # 32 MiB more state at step 2 with 16 MiB of /dev/shm: the snapshot's slot cannot be claimed.
        "shm": CLAIM + "---" + small_job(
            "shm", "checkpoints", [*grow, "--grow-state-at-step", "2", "--grow-state-mb", "32"], "1Gi",
            spec="  sharedMemory: {sizeLimit: 16Mi}\n  preflight: {enabled: false}",
        ),
        # The preflight's storage check, before any training.
        "locked": root_owned_claim("locked", locked) + "---" + small_job(
            "locked", "checkpoints", grow, "1Gi", spec="  preflight: {enabled: true, steps: 10}"
        ),
    }  # fmt: skip
    for namespace, manifest in jobs.items():
        real.kubectl("create", "namespace", namespace)
        real.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)

    def incidents(namespace: str) -> list[dict]:
        status = json.loads(real.kubectl("get", "tj", namespace, "-n", namespace, "-o", "json")).get("status")
        return (status or {}).get("incidents") or []

    # 1. OOM: the container ends OOMKilled and the failure policy's default-oom rule replaces it, counted.
    oom = wait_for(
        lambda: [i for i in incidents("oom") if "OOMKilled" in (i.get("message") or "")],
        240,
        message=lambda: real.kubectl("get", "tj,pods", "-n", "oom", "-o", "wide") + str(incidents("oom")),
    )[0]
    print("OOM incident:", oom["message"])  # shown with -rA
    assert oom["rule"] == "default-oom" and oom["action"] == "ReplaceWorker", oom
    assert "killed for memory" in oom["message"] and "768 MiB" in oom["message"], oom
    pods = json.loads(real.kubectl("get", "pods", "-n", "oom", "-o", "json"))["items"]
    reasons = [
        (c.get("state", {}).get("terminated") or {}).get("reason")
        for pod in pods
        for c in pod["status"].get("containerStatuses", [])
    ]
    assert "OOMKilled" in reasons or oom["worker"] not in {p["metadata"]["name"] for p in pods}, reasons

    # 2. Shared memory: the job fails at once (no restart can help), the condition says which field to raise.
    shm = wait_for(
        lambda: failed_condition(real, "shm", "shm"),
        240,
        message=lambda: real.kubectl("get", "tj,pods", "-n", "shm") + str(incidents("shm")),
    )
    print("shared memory:", shm["message"])
    assert "does not fit" in shm["message"] and "spec.sharedMemory.sizeLimit" in shm["message"], shm
    assert not [i for i in incidents("shm") if i.get("action") == "ReplaceWorker"], incidents("shm")

    # 3. A root-owned volume: the preflight names the user, the owner and what to set.
    locked_failed = wait_for(
        lambda: failed_condition(real, "locked", "locked"),
        240,
        message=lambda: real.kubectl("get", "tj,pods", "-n", "locked") + str(incidents("locked")),
    )
    message = locked_failed["message"]
    print("root-owned volume:", message)
    assert "Permission denied" in message and "uid 10001" in message, message
    assert "belongs to uid 0" in message and "fsGroup" in message, message
    for namespace in jobs:
        real.kubectl("delete", "namespace", namespace, "--wait=false")
    real.kubectl("delete", "pv", "locked-root-owned", "--wait=false")
