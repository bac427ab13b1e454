"""`phalanx drill`: rehearse a failure on a running TrainingJob and report how Phalanx recovered.

Works on any cluster the kubeconfig points at: the failure is injected through the Kubernetes API only, and
only into a job that opted in (`spec.drills.allowed: true`):

- `--kill-worker [POD]`: delete an active worker pod (the named one, else the first) with grace period 0;
- `--hang-worker [POD]`: freeze the training processes of an active worker (the named one, else the first)
  while its launcher keeps renewing the heartbeat: the drill writes `phalanx.dev/drill-hang=<pod>/<uid>` on
  the TrainingJob, the pod's launcher stops its trainers (SIGSTOP), sees them stopped and reports it in its
  heartbeat (`TrainerStopped`). The annotation is removed afterwards, also on timeout or Ctrl-C;
- `--kill-rendezvous`: delete the job's rendezvous pod with grace period 0;
- `--crash-node [NODE]`: cordon the node of a worker (or the named node) and mark it
  `phalanx.dev/drill-crash=<namespace>/<job>`: the operator treats it as lost for this job only (its workers
  there are deleted at once and recovered as for a real node loss) while other workloads on it keep running.
  The mark and the cordon are removed afterwards, also on timeout or Ctrl-C.

It then waits for the incident the operator records for that failure and prints the time to detect and to
resume (from the moment of injection), the operator's own recovery time and the steps lost.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from phalanx.errors import UserFacingError
from phalanx.operator import api, names
from phalanx.operator.status import DRILL_CRASH_ANNOTATION
from phalanx.operator.timeutil import parse_time
from phalanx.worker.drillhook import DRILL_HANG_ANNOTATION, hang_target

KILL_WORKER, HANG_WORKER, KILL_RENDEZVOUS, CRASH_NODE = (
    "kill-worker",
    "hang-worker",
    "kill-rendezvous",
    "crash-node",
)


# ---------------------------------------------------------------------------------------------- pure parts


def refusal(job: dict[str, Any]) -> str | None:
    """Why a drill may not run against `job`, or None."""
    name = job["metadata"]["name"]
    if not ((job.get("spec") or {}).get("drills") or {}).get("allowed"):
        return f"TrainingJob {name} does not allow drills (set spec.drills.allowed: true to opt in)"
    state = (job.get("status") or {}).get("state")
    if state != "Running":
        return f"TrainingJob {name} is {state or 'not started'}, not Running: nothing to recover"
    return None


def running_workers(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The job's active worker pods that run, in name order (spares and the rendezvous excluded)."""
    workers = [
        pod
        for pod in pods
        if (pod["metadata"].get("labels") or {}).get(names.LABEL_ROLE) == names.ROLE_WORKER
        and not pod["metadata"].get("deletionTimestamp")
        and (pod.get("status") or {}).get("phase") == "Running"
    ]
    return sorted(workers, key=lambda pod: pod["metadata"]["name"])


def choose_worker(pods: list[dict[str, Any]], wanted: str | None) -> dict[str, Any]:
    """The worker to strike: the named one (it must be an active, running worker), else the first."""
    workers = running_workers(pods)
    if wanted is not None:
        for pod in workers:
            if pod["metadata"]["name"] == wanted:
                return pod
        names = ", ".join(pod["metadata"]["name"] for pod in workers) or "none"
        raise UserFacingError(f"{wanted} is not a running worker of the job (running workers: {names})")
    if not workers:
        raise UserFacingError("the job has no running worker")
    return workers[0]


def choose_node(pods: list[dict[str, Any]], wanted: str | None) -> str:
    """The node to take away: the named one (it must host a running worker of the job), else the first
    worker's."""
    nodes = [pod["spec"].get("nodeName") for pod in running_workers(pods) if pod["spec"].get("nodeName")]
    if wanted is not None:
        if wanted not in nodes:
            raise UserFacingError(
                f"node {wanted} runs no worker of the job (nodes: {', '.join(nodes) or 'none'})"
            )
        return wanted
    if not nodes:
        raise UserFacingError("the job has no running worker on a node")
    return nodes[0]


@dataclass(frozen=True)
class Target:
    """What the drill struck, to find the incident the operator records for it."""

    drill: str
    pod: str | None = None
    uid: str | None = None
    node: str | None = None


def find_incident(
    incidents: list[dict[str, Any]], target: Target, injected: datetime
) -> dict[str, Any] | None:
    """The incident recorded for the drill: about the struck pod (or a pod on the struck node), detected at
    or after the injection (the operator stamps detection to the second, hence the one-second slack)."""
    for incident in incidents:
        detected = parse_time(incident.get("detectedAt"))
        if detected is None or (injected - detected).total_seconds() > 1.0:
            continue
        if target.node is not None:
            if incident.get("node") == target.node and incident.get("cause") == "NodeLost":
                return incident
        elif incident.get("worker") == target.pod:
            return incident
    return None


@dataclass(frozen=True)
class Figures:
    """What a drill measured, all from the job's status."""

    drill: str
    target: str
    cause: str | None
    action: str | None
    seconds_to_detect: float | None
    """From the injection to the operator's detection (to the second: the API stamps it so)."""
    seconds_to_resume: float | None
    """From the injection to the first completed step after the recovery."""
    seconds_to_recover: float | None
    """The operator's own figure: from when the failure happened to the first step after it."""
    steps_lost: int | None


def figures(target: Target, incident: dict[str, Any], injected: datetime) -> Figures:
    def since_injection(field: str) -> float | None:
        moment = parse_time(incident.get(field))
        return None if moment is None else round(max((moment - injected).total_seconds(), 0.0), 2)

    return Figures(
        drill=target.drill,
        target=target.node or target.pod or "",
        cause=incident.get("cause"),
        action=incident.get("action"),
        seconds_to_detect=since_injection("detectedAt"),
        seconds_to_resume=since_injection("resumedAt"),
        seconds_to_recover=incident.get("secondsToRecover"),
        steps_lost=incident.get("stepsLost"),
    )


def render(result: Figures) -> str:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} s"

    return "\n".join(
        [
            f"drill {result.drill} on {result.target}: {result.cause} -> {result.action}",
            f"  detected after   {seconds(result.seconds_to_detect)}",
            f"  resumed after    {seconds(result.seconds_to_resume)}",
            f"  recovery (operator, from the failure) {seconds(result.seconds_to_recover)}",
            f"  steps lost       {'-' if result.steps_lost is None else result.steps_lost}",
        ]
    )


# ------------------------------------------------------------------------------------------ cluster calls


class Cluster:
    """The few API calls a drill makes, through the user's kubeconfig (or in-cluster credentials)."""

    def __init__(self) -> None:
        import kubernetes

        try:
            kubernetes.config.load_kube_config()
        except (kubernetes.config.ConfigException, OSError):
            kubernetes.config.load_incluster_config()
        self.core = kubernetes.client.CoreV1Api()
        self.custom = kubernetes.client.CustomObjectsApi()

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        from kubernetes.client.rest import ApiException

        try:
            found = self.custom.get_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, name
            )
        except ApiException as error:
            if error.status == 404:
                raise UserFacingError(f"TrainingJob {namespace}/{name} not found") from None
            raise
        if not isinstance(found, dict):  # the client types custom objects as `object`; they are parsed JSON
            raise TypeError(f"TrainingJob {namespace}/{name}: not a JSON object")
        return found

    def pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        listed = self.core.list_namespaced_pod(namespace, label_selector=f"{names.LABEL_JOB_NAME}={job}")
        return [self.core.api_client.sanitize_for_serialization(pod) for pod in listed.items]

    def delete_pod(self, namespace: str, name: str) -> None:
        self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def annotate_job(self, namespace: str, name: str, key: str, value: str | None) -> None:
        """Set (or, with None, remove) one annotation of the TrainingJob."""
        self.custom.patch_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"metadata": {"annotations": {key: value}}}
        )

    def mark_node(self, node: str, job_key: str) -> bool:
        """Cordon the node and mark it for the job; returns whether it was cordoned already."""
        spec = self.core.read_node(node).spec
        cordoned = bool(spec is not None and spec.unschedulable)
        patch = {
            "metadata": {"annotations": {DRILL_CRASH_ANNOTATION: job_key}},
            "spec": {"unschedulable": True},
        }
        self.core.patch_node(node, patch)
        return cordoned

    def unmark_node(self, node: str, keep_cordoned: bool) -> None:
        """Remove the drill's mark and its cordon (a cordon that was there before the drill stays)."""
        patch = {
            "metadata": {"annotations": {DRILL_CRASH_ANNOTATION: None}},
            "spec": {"unschedulable": keep_cordoned},
        }
        self.core.patch_node(node, patch)


def rendezvous_pod(pods: list[dict[str, Any]]) -> str:
    for pod in pods:
        if (pod["metadata"].get("labels") or {}).get(names.LABEL_ROLE) == names.ROLE_RENDEZVOUS:
            return pod["metadata"]["name"]
    raise UserFacingError("the job has no rendezvous pod")


def run_drill(args: argparse.Namespace) -> int:
    cluster = Cluster()
    namespace, name = args.namespace, args.job
    job = cluster.job(namespace, name)
    reason = refusal(job)
    if reason is not None:
        raise UserFacingError(f"drill refused: {reason}")
    pods = cluster.pods(namespace, name)
    if args.kill_rendezvous:
        target = Target(KILL_RENDEZVOUS, pod=rendezvous_pod(pods))
    elif args.crash_node is not None:
        target = Target(CRASH_NODE, node=choose_node(pods, args.crash_node or None))
    elif args.hang_worker is not None:
        victim = choose_worker(pods, args.hang_worker or None)["metadata"]
        target = Target(HANG_WORKER, pod=victim["name"], uid=victim.get("uid"))
    else:
        target = Target(KILL_WORKER, pod=choose_worker(pods, args.kill_worker or None)["metadata"]["name"])
    injected = datetime.now(UTC)
    was_cordoned: bool | None = None
    try:
        if target.node is not None:
            was_cordoned = cluster.mark_node(target.node, f"{namespace}/{name}")
        elif target.drill == HANG_WORKER:
            cluster.annotate_job(
                namespace, name, DRILL_HANG_ANNOTATION, hang_target(target.pod or "", target.uid or "")
            )
        else:
            cluster.delete_pod(namespace, target.pod or "")
        result = _wait_for_recovery(cluster, namespace, name, target, injected, args.timeout)
    finally:
        if target.drill == HANG_WORKER:
            cluster.annotate_job(namespace, name, DRILL_HANG_ANNOTATION, None)
        if was_cordoned is not None and target.node is not None:
            cluster.unmark_node(target.node, keep_cordoned=was_cordoned)
            if not args.json:
                state = "left cordoned as before" if was_cordoned else "uncordoned"
                print(f"node {target.node}: drill mark removed, {state}")
    if result is None:
        raise UserFacingError(
            f"no recovery from the {target.drill} drill within {args.timeout:g} s "
            f"(see kubectl describe trainingjob {name} -n {namespace})"
        )
    print(json.dumps(asdict(result)) if args.json else render(result))
    return 0


def _wait_for_recovery(
    cluster: Cluster, namespace: str, name: str, target: Target, injected: datetime, timeout: float
) -> Figures | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = cluster.job(namespace, name).get("status") or {}
        incident = find_incident(status.get("incidents") or [], target, injected)
        if incident is not None and (
            incident.get("resumedAt") or status.get("state") in ("Failed", "Succeeded")
        ):
            return figures(target, incident, injected)
        time.sleep(1.0)
    return None


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "drill",
        help="rehearse a failure on a TrainingJob that allows drills and report the recovery",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("job", help="the TrainingJob's name")
    parser.add_argument("-n", "--namespace", default="default")
    strike = parser.add_mutually_exclusive_group(required=True)
    strike.add_argument("--kill-worker", nargs="?", const="", metavar="POD", help="delete a worker pod")
    strike.add_argument(
        "--hang-worker", nargs="?", const="", metavar="POD", help="freeze a worker's training processes"
    )
    strike.add_argument("--kill-rendezvous", action="store_true", help="delete the rendezvous pod")
    strike.add_argument(
        "--crash-node", nargs="?", const="", metavar="NODE", help="take a worker's node away from the job"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the recovery")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.set_defaults(handler=run_drill)
