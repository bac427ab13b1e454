"""`phalanx demo`: the whole product on one machine, in one command.

Brings up the local cluster, installs the operator with its Helm chart, applies the tiny-GPT example,
kills one worker mid-training, waits for the job to finish and prints a short report (steps, time, restarts,
recovery, final loss, logs and a loss plot).

By default every pod runs on the node agent's nodes (processes: cheap, no root), which kill a worker through
their fault injection. `--real-nodes` runs on a real node instead (containerd, kubelet and kube-proxy on this
host, as root): the operator and worker images are built first (cached: several minutes the first time,
seconds after) and the worker's container is killed for real, SIGKILL to its task through containerd's `ctr`.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from phalanx import assets
from phalanx.devcluster import controlplane
from phalanx.devcluster.realnode import host
from phalanx.devcluster.realnode import node as real_node
from phalanx.errors import UserFacingError
from phalanx.helmsdk import Helm
from phalanx.images import cli as images_cli
from phalanx.images import containerd
from phalanx.operator import names

DEMO_NAMESPACE = "phalanx-demo"
OPERATOR_NAMESPACE = "phalanx-system"
RELEASE = "phalanx"
AGENT_KILL = "agent"
CONTAINER_KILL = "container"
KILL_DESCRIPTIONS = {
    AGENT_KILL: "its processes killed by the node agent's fault injection",
    CONTAINER_KILL: "SIGKILL to its container's task through ctr",
}
"""How the demo kills a worker (summary.json's `kill_method`), as the output words it."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="local cluster + operator + a TrainingJob trained through a failure"
    )
    parser.add_argument("--state-dir", type=Path, default=controlplane.default_state_dir())
    parser.add_argument(
        "--nodes", type=int, default=None, help="the node agent's nodes (default: 4, none with --real-nodes)"
    )
    parser.add_argument(
        "--real-nodes",
        action="store_true",
        help="run on a real node (containerd, kubelet, kube-proxy on this host; root): the images are built "
        "first (several minutes the first time, seconds after) and a worker's container is SIGKILLed",
    )
    parser.add_argument(
        "--wheels",
        type=Path,
        default=images_cli.default_wheels(),
        help="--real-nodes: a folder of wheels for the worker image's build (default: $PIP_FIND_LINKS if a folder)",
    )
    parser.add_argument(
        "--context",
        type=Path,
        default=None,
        help="--real-nodes: the Phalanx checkout the images are built from (default: the one around the cwd)",
    )
    parser.add_argument(
        "--example", type=Path, default=None, help="TrainingJob manifest (default: the shipped tinygpt.yaml)"
    )
    parser.add_argument(
        "--chart", type=Path, default=None, help="the operator's Helm chart (default: the shipped one)"
    )
    parser.add_argument(
        "--kill-at-fraction", type=float, default=0.35, help="kill a worker at this share of the steps"
    )
    parser.add_argument("--timeout", type=float, default=1200, help="seconds to wait for the job to finish")
    parser.add_argument(
        "--report", type=Path, default=None, help="where to write the report (default: state dir)"
    )
    parser.set_defaults(handler=run)


class Kube:
    """The few kubectl calls the demo makes, against the local cluster."""

    def __init__(self, layout: controlplane.Layout) -> None:
        self.layout = layout

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [str(self.layout.bin / "kubectl"), f"--kubeconfig={self.layout.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise UserFacingError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def json(self, *args: str) -> dict[str, Any]:
        return json.loads(self("get", *args, "-o", "json"))


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def wait(what: str, predicate: Any, timeout: float, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise UserFacingError(f"timed out after {timeout:.0f} s waiting for {what}")


def install_operator(layout: controlplane.Layout, chart: Path) -> None:
    if importlib.util.find_spec("helm_python") is None:
        raise UserFacingError("`phalanx demo` needs the demo extra: pip install 'phalanx[demo]'")

    helm = Helm(layout.kubeconfig, OPERATOR_NAMESPACE)
    installed = {release["name"] for release in helm.releases(name_filter=f"^{RELEASE}$")}
    if RELEASE in installed:
        helm.upgrade(chart, RELEASE)
        say(f"upgraded Helm release {RELEASE!r} in {OPERATOR_NAMESPACE}")
    else:
        helm.install(chart, RELEASE, create_namespace=True)
        say(f"installed Helm release {RELEASE!r} into {OPERATOR_NAMESPACE}")


def condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in job.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def is_true(job: dict[str, Any], kind: str) -> bool:
    found = condition(job, kind)
    return bool(found and found["status"] == "True")


def sample_losses(kube: Kube, samples: dict[int, float]) -> int:
    """Adds the (step, loss) pairs the workers' heartbeat Leases carry right now; returns the newest step
    rank 0's Lease carries (0 before its first step).

    The Leases are the live figure: the job's status writes a step that moved alone only every
    `stepReportSeconds` (30 s by default), longer than the demo's whole run may be."""
    leases = kube.json("leases", "-n", DEMO_NAMESPACE).get("items", [])
    newest = 0
    for lease in leases:
        annotations = lease["metadata"].get("annotations") or {}
        step, loss = annotations.get("phalanx.dev/step"), annotations.get("phalanx.dev/loss")
        if annotations.get("phalanx.dev/rank") != "0" or step is None or loss is None:
            continue
        try:
            samples[int(step)] = float(loss)
        except ValueError:
            continue
        newest = max(newest, int(step))
    return newest


def plot_loss(records: list[dict[str, Any]], kill_step: int | None, path: Path) -> Path | None:
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    losses = [r["loss"] for r in records]
    figure, axis = plt.subplots(figsize=(7, 3.5))
    axis.plot(steps, losses, linewidth=1)
    if kill_step is not None:
        axis.axvline(kill_step, color="red", linestyle="--", label=f"worker killed (step {kill_step})")
        axis.legend()
    axis.set_xlabel("step")
    axis.set_ylabel("training loss")
    axis.set_title("tiny GPT under Phalanx")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _seconds_between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    parse = lambda text: datetime.fromisoformat(text.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def agent_nodes(args: argparse.Namespace) -> int:
    """4 by default; none beside a real node unless asked, so that every pod runs in a real container there."""
    if args.nodes is not None:
        return int(args.nodes)
    return 0 if args.real_nodes else 4


def real_node_conflict(
    config: controlplane.ClusterConfig | None, all_running: bool, state_dir: Path
) -> str | None:
    """Why a real-node demo cannot use the cluster already in `state_dir`, if it cannot.

    `up` leaves a running cluster as it is, so one started without a real node (an earlier `phalanx demo`)
    would quietly train on the agent's nodes; better to say so before the image build.
    """
    if config is None or config.real_nodes or not all_running:
        return None
    return (
        f"the cluster in {state_dir} runs without a real node: stop it first "
        f"(`phalanx dev down --state-dir {state_dir}`) or pass another --state-dir"
    )


def prepare_real_node(args: argparse.Namespace) -> list[Path]:
    """Checks what a real node and the image build need, cheapest first, then builds the images (cached).

    Every check is one line (UserFacingError) raised before any daemon starts: `up` itself would only find
    a missing piece after the control plane is up, and tear it down again.
    """
    host.require_root()
    context = images_cli.resolve_context(args.context)
    wheels = images_cli.check_wheels(args.wheels)
    layout = controlplane.Layout(args.state_dir.resolve())
    all_running = len(controlplane.running_components(layout)) == len(controlplane.COMPONENT_ORDER)
    conflict = real_node_conflict(layout.load_config(), all_running, layout.root)
    if conflict:
        raise UserFacingError(conflict)
    real_node.require_host()
    say("building the operator and worker images (several minutes the first time, seconds after)")
    return images_cli.build_images(context, wheels=wheels)


def start_cluster(args: argparse.Namespace) -> controlplane.Layout:
    """The local cluster, and with --real-nodes its real node holding the freshly built images."""
    if not args.real_nodes:
        say("bringing up the local cluster")
        return controlplane.up(args.state_dir, nodes=agent_nodes(args))
    archives = prepare_real_node(args)
    say("bringing up the local cluster with a real node")
    layout = controlplane.up(args.state_dir, nodes=agent_nodes(args), real_nodes=1)
    images_cli.import_images(archives)
    return layout


@dataclass(frozen=True)
class Kill:
    method: str
    """AGENT_KILL or CONTAINER_KILL."""
    container: str | None = None
    """The containerd id of the killed container (CONTAINER_KILL)."""


def kill_method(pod: dict[str, Any]) -> str:
    """How the victim dies for real: the agent's nodes run pods as processes and take its kill annotation;
    the real node runs containers, which its kubelet never kills on an annotation: only containerd can."""
    return CONTAINER_KILL if (pod.get("spec") or {}).get("nodeName") == real_node.NODE_NAME else AGENT_KILL


def container_id(pod: dict[str, Any], name: str = names.TRAINER_CONTAINER) -> str:
    """The containerd id of the pod's training container (`spec.trainerContainer`, `name`), from its status
    (`containerd://<id>`)."""
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or []}
    runtime, _, found = ((statuses.get(name) or {}).get("containerID") or "").partition("://")
    if runtime != "containerd" or not found:
        raise UserFacingError(
            f"pod {pod['metadata']['name']} has no containerd container {name!r} to kill (status: {runtime or 'none'})"
        )
    return found


def ctr_kill_command(container: str) -> list[str]:
    """SIGKILL to the container's task, as the OOM killer or a crash would: no SIGTERM, no grace period."""
    return [
        "ctr", "--address", str(containerd.SOCKET), "--namespace", containerd.NAMESPACE,
        "tasks", "kill", "--signal", "SIGKILL", container,
    ]  # fmt: skip


def kill_container(container: str) -> None:
    command = ctr_kill_command(container)
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    except OSError as error:
        raise UserFacingError(f"`{' '.join(command)}` could not run: {error}") from None
    if result.returncode != 0:
        raise UserFacingError(f"`{' '.join(command)}` failed: {result.stderr.strip()}")


def kill_worker(kube: Kube, pod: dict[str, Any], trainer: str = names.TRAINER_CONTAINER) -> Kill:
    method, name = kill_method(pod), pod["metadata"]["name"]
    if method == AGENT_KILL:
        kube("annotate", "pod", name, "-n", DEMO_NAMESPACE, "phalanx.dev/kill=demo", "--overwrite")
        return Kill(method)
    container = container_id(pod, trainer)
    kill_container(container)
    return Kill(method, container)


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    example = args.example or assets.example("tinygpt.yaml")
    chart = args.chart or assets.chart_dir()
    layout = start_cluster(args)
    kube = Kube(layout)
    kube("apply", "-f", str(assets.crds_dir()))
    install_operator(layout, chart)
    wait(
        "the operator pod to be Ready",
        lambda: "True" in kube(
            "get", "pods", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/name=phalanx",
            "-o", "jsonpath={.items[*].status.conditions[?(@.type=='Ready')].status}", check=False,
        ),
        180,
    )  # fmt: skip
    say("operator running")

    manifest = list(yaml.safe_load_all(example.read_text()))
    job_manifest = next(doc for doc in manifest if doc and doc.get("kind") == "TrainingJob")
    name = job_manifest["metadata"]["name"]
    kube("create", "namespace", DEMO_NAMESPACE, check=False)
    kube("delete", "trainingjob", name, "-n", DEMO_NAMESPACE, "--ignore-not-found", "--wait=true")
    for claim in (doc for doc in manifest if doc and doc.get("kind") == "PersistentVolumeClaim"):
        # A fresh run: checkpoints (and the preflight's verdict) of an earlier demo must not be resumed.
        kube(
            "delete",
            "pvc",
            claim["metadata"]["name"],
            "-n",
            DEMO_NAMESPACE,
            "--ignore-not-found",
            "--wait=true",
        )
    kube("apply", "-n", DEMO_NAMESPACE, "-f", str(example))
    say(f"applied {example.name if args.example is None else example}")

    total_steps = _total_steps(job_manifest)
    kill_step = max(1, int(total_steps * args.kill_at_fraction))
    losses: dict[int, float] = {}

    live_step = 0

    def reached_kill_step() -> bool:
        nonlocal live_step
        job = kube.json("trainingjob", name, "-n", DEMO_NAMESPACE)
        live_step = max(sample_losses(kube, losses), job.get("status", {}).get("step") or 0)
        return live_step >= kill_step or is_true(job, "Succeeded")

    wait(f"training to reach step {kill_step}", reached_kill_step, args.timeout, interval=0.5)
    workers = kube.json(
        "pods", "-n", DEMO_NAMESPACE, "-l", f"phalanx.dev/job-name={name},phalanx.dev/role=worker"
    )
    if not workers["items"]:
        raise UserFacingError(f"no worker pod of {name} to kill: `kubectl get pods -n {DEMO_NAMESPACE}`")
    victim_pod = max(workers["items"], key=lambda pod: str(pod["metadata"]["name"]))
    victim = victim_pod["metadata"]["name"]
    # The Leases lag the training processes by up to a heartbeat: the killed group's own step comes later,
    # with the incident.
    step_seen_at_kill = max(live_step, sample_losses(kube, losses))
    trainer = job_manifest["spec"].get("trainerContainer") or names.TRAINER_CONTAINER
    kill = kill_worker(kube, victim_pod, trainer)
    killed_at = time.monotonic()
    say(
        f"killed worker {victim} ({KILL_DESCRIPTIONS[kill.method]}; its heartbeats said step {step_seen_at_kill})"
    )

    resumed_after = None
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        job = kube.json("trainingjob", name, "-n", DEMO_NAMESPACE)
        sample_losses(kube, losses)
        incident = kill_incident(job, victim)
        if resumed_after is None and incident is not None and incident.get("resumedAt"):
            resumed_after = time.monotonic() - killed_at
            say(
                f"training resumed at step {incident.get('resumeStep')}, {resumed_after:.1f} s after the kill "
                f"(the group was at step {incident.get('detectedStep')} when it was killed)"
            )
        if is_true(job, "Succeeded") or is_true(job, "Failed"):
            break
        time.sleep(0.5)
    else:
        raise UserFacingError(f"the TrainingJob did not finish within {args.timeout:.0f} s")
    step_at_kill = killed_step(kill_incident(job, victim), step_seen_at_kill)

    records = [{"step": step, "loss": loss} for step, loss in sorted(losses.items())]
    report_dir = args.report or layout.root / "demo"
    report_dir.mkdir(parents=True, exist_ok=True)
    plot = plot_loss(records, step_at_kill, report_dir / "loss.png")
    status = job.get("status", {})
    incidents = status.get("incidents", [])
    summary = {
        "job": f"{DEMO_NAMESPACE}/{name}",
        "result": "Succeeded"
        if is_true(job, "Succeeded")
        else f"Failed: {(condition(job, 'Failed') or {}).get('message')}",
        "steps": status.get("step"),
        "training_seconds": _seconds_between(status.get("startTime"), status.get("completionTime")),
        "restarts": status.get("restarts", {}),
        "preflight": status.get("preflight"),
        "killed_worker": victim,
        "killed_at_step": step_at_kill,
        "kill_method": kill.method,
        "killed_container": kill.container,
        "seconds_until_progress_after_kill": round(resumed_after, 1) if resumed_after else None,
        "incidents": incidents,
        "first_loss": records[0]["loss"] if records else None,
        "final_loss": records[-1]["loss"] if records else None,
        "loss_plot": str(plot) if plot else None,
        "cluster_logs": str(layout.logs),
        "demo_seconds": round(time.monotonic() - started, 1),
    }
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(_format_summary(summary, layout))
    return 0 if is_true(job, "Succeeded") else 1


def kill_incident(job: dict[str, Any], victim: str) -> dict[str, Any] | None:
    """The job's incident for the demo's kill of `victim`: the first one recorded for that worker."""
    incidents = (job.get("status") or {}).get("incidents") or []
    return next((incident for incident in incidents if incident.get("worker") == victim), None)


def killed_step(incident: dict[str, Any] | None, seen_step: int | None) -> int | None:
    """The step the killed group had reached: the incident's `detectedStep` (the group's own, from its
    heartbeats), else the step the demo saw when it killed the worker."""
    detected = (incident or {}).get("detectedStep")
    return int(detected) if detected is not None else seen_step


def _total_steps(job_manifest: dict[str, Any]) -> int:
    containers = job_manifest["spec"]["template"]["spec"]["containers"]
    command = [
        str(part)
        for container in containers
        for part in container.get("command", []) + container.get("args", [])
    ]
    for flag, value in itertools.pairwise(command):
        if flag == "--steps":
            return int(value)
    return 300


def _preflight_line(preflight: dict[str, Any] | None) -> str:
    if not preflight:
        return "off"
    return f"{preflight.get('state')}: {preflight.get('message') or preflight.get('reason') or ''}"


def _format_summary(summary: dict[str, Any], layout: controlplane.Layout) -> str:
    restarts = summary["restarts"] or {}
    by_cause = (
        ", ".join(f"{cause}: {count}" for cause, count in (restarts.get("byCause") or {}).items()) or "none"
    )
    recoveries = [
        i.get("secondsToRecover") for i in summary["incidents"] if i.get("secondsToRecover") is not None
    ]
    lines = [
        "",
        "=== Phalanx demo ===",
        f"job                {summary['job']}: {summary['result']}",
        f"steps              {summary['steps']} in {summary['training_seconds']} s of training",
        f"preflight          {_preflight_line(summary.get('preflight'))}",
        f"injected failure   killed {summary['killed_worker']} at step {summary['killed_at_step']} "
        f"({KILL_DESCRIPTIONS[summary.get('kill_method') or AGENT_KILL]})",
        f"restarts           {restarts.get('total', 0)} ({by_cause})",
        f"recovery           {', '.join(f'{s:.1f} s' for s in recoveries) if recoveries else 'n/a'} (operator), "
        f"progress again {summary['seconds_until_progress_after_kill']} s after the kill",
        f"loss               {summary['first_loss']} -> {summary['final_loss']}",
        f"loss plot          {summary['loss_plot']}",
        f"logs               kubectl logs -n {DEMO_NAMESPACE} -l phalanx.dev/job-name; cluster: {summary['cluster_logs']}",
        f"use the cluster    export KUBECONFIG={layout.kubeconfig}; export PATH={layout.bin}:$PATH",
        f"demo took          {summary['demo_seconds']} s",
    ]
    return "\n".join(lines)
