"""One pod on a real node, from binding to deletion: a thread that runs its containers as processes.

Restart backoff: 1 s after the first exit, doubling up to 10 s; reset once a run lasted 10 s.
"""

from __future__ import annotations

import logging
import re
import shutil
import signal
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from phalanx.devcluster.agent import podstatus, sharedfs, volumes
from phalanx.devcluster.agent.context import FREEZE_ANNOTATION, KILL_ANNOTATION, AgentContext
from phalanx.devcluster.agent.envresolve import (
    ContainerConfigError,
    EnvContext,
    InvalidSpecError,
    command_line,
    resolve_env,
)
from phalanx.devcluster.agent.kube import ApiError, with_retry
from phalanx.devcluster.agent.nodes import HOST_IP, capacity
from phalanx.devcluster.agent.podstatus import ContainerRecord, PodRecord, Terminated
from phalanx.devcluster.agent.runtime import CONTAINER_MARKER, ContainerProcess
from phalanx.worker.termination import MAX_BYTES as TERMINATION_MESSAGE_BYTES
from phalanx.worker.termination import TERMINATION_LOG_ENV

log = logging.getLogger(__name__)

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 10.0
BACKOFF_RESET_AFTER = 10.0
CONFIG_RETRY = 2.0
MAX_LOG_FILES = 2
LOST_MESSAGE = "the process was lost when the node agent restarted"


def resource_version(obj: Mapping[str, Any]) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def volume_env_name(volume: str) -> str:
    return "PHALANX_VOLUME_" + re.sub(r"[^A-Za-z0-9]", "_", volume).upper()


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def terminated_from_api(state: Mapping[str, Any] | None) -> Terminated | None:
    if not state or "terminated" not in state:
        return None
    t = state["terminated"]
    return Terminated(
        exit_code=int(t.get("exitCode", 0)),
        reason=t.get("reason", ""),
        started_at=parse_time(t.get("startedAt")),
        finished_at=parse_time(t.get("finishedAt")) or podstatus.now(),
        message=t.get("message", ""),
        container_id=t.get("containerID", ""),
    )


def adopt_records(records: list[ContainerRecord], statuses: list[Mapping[str, Any]] | None) -> None:
    """Carry a previous agent's view over: restart counts, finished runs; runs it left are now dead (killed)."""
    by_name = {s["name"]: s for s in statuses or []}
    for record in records:
        status = by_name.get(record.name)
        if not status:
            continue
        record.restart_count = int(status.get("restartCount", 0))
        record.last_terminated = terminated_from_api(status.get("lastState"))
        state = status.get("state") or {}
        record.container_id = status.get("containerID", "")
        if "terminated" in state:
            record.terminated = terminated_from_api(state)
            record.running_since = record.terminated.started_at if record.terminated else None
        elif "running" in state:
            started = parse_time(state["running"].get("startedAt"))
            record.running_since = started or podstatus.now()
            record.terminated = Terminated(
                137,
                "Error",
                started,
                podstatus.now(),
                LOST_MESSAGE,
                container_id=record.container_id,
            )


class PodWorker:
    def __init__(self, ctx: AgentContext, pod: dict[str, Any]) -> None:
        self.ctx = ctx
        self.latest = pod
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.node: str = pod["spec"]["nodeName"]
        spec = pod["spec"]
        self.record = PodRecord(
            restart_policy=spec.get("restartPolicy", "Always"),
            init_containers=podstatus.records_from_spec(spec.get("initContainers") or []),
            containers=podstatus.records_from_spec(spec.get("containers") or []),
            host_ip=HOST_IP,
        )
        self.processes: dict[str, ContainerProcess] = {}
        self.previous_logs: dict[str, list[Any]] = {}
        self.next_start: dict[str, float] = {}
        self.backoff: dict[str, float] = {}
        self.volume_paths: dict[str, str] | None = None
        self.prepare_after = 0.0
        self.frozen = False
        self.gone = False
        self.finished = threading.Event()
        self.done = threading.Event()
        self.wake = threading.Event()
        self.last_published: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self.dir = volumes.pod_dir(ctx.state_dir, self.uid)
        self.shm_dir = volumes.pod_shm_dir(ctx.state_dir, self.uid)
        self._adopt(pod)
        self.thread = threading.Thread(
            target=self._run, name=f"pod-{self.namespace}/{self.name}", daemon=True
        )

    # ---- inputs from the dispatcher -------------------------------------------------------------------------
    def update(self, pod: dict[str, Any]) -> None:
        with self._lock:
            if resource_version(pod) >= resource_version(self.latest):
                self.latest = pod
        self.wake.set()

    def vanish(self) -> None:
        self.gone = True
        self.wake.set()

    def start(self) -> None:
        self.thread.start()

    # ---- helpers ------------------------------------------------------------------------------------------
    def _adopt(self, pod: Mapping[str, Any]) -> None:
        status = pod.get("status") or {}
        adopt_records(self.record.init_containers, status.get("initContainerStatuses"))
        adopt_records(self.record.containers, status.get("containerStatuses"))
        self.record.start_time = parse_time(status.get("startTime"))
        if status.get("phase") in ("Succeeded", "Failed"):
            self.record.failure_reason = status.get("reason") or ""
            self.record.failure_message = status.get("message") or ""
            self.record.pod_ip = status.get("podIP") or ""
            self._terminal_from_server = status["phase"]
        else:
            self._terminal_from_server = ""
            if status.get("podIP") and not (pod.get("spec") or {}).get("hostNetwork"):
                self.record.pod_ip = self.ctx.real_ips.allocate(self.uid, preferred=status["podIP"])
            for record in self._all_records():
                lost = record.terminated
                if lost is not None and lost.message.startswith(LOST_MESSAGE):
                    record.running_since = lost.started_at
                    self._record_exit(record, lost)

    def _all_records(self) -> list[ContainerRecord]:
        return self.record.init_containers + self.record.containers

    def _spec_of(self, name: str) -> Mapping[str, Any]:
        spec = self.latest["spec"]
        return next(c for c in (spec.get("initContainers") or []) + spec["containers"] if c["name"] == name)

    def _record_of(self, name: str) -> ContainerRecord:
        return next(r for r in self._all_records() if r.name == name)

    def log_files(self, container: str) -> list[Any]:
        """Log files of a container, oldest first (at most the previous and the current run)."""
        return list(self.previous_logs.get(container, []))

    def current_process(self, container: str) -> ContainerProcess | None:
        return self.processes.get(container)

    def terminal(self) -> bool:
        if self._terminal_from_server:
            return True
        return podstatus.phase(self.record) in ("Succeeded", "Failed")

    # ---- the loop -----------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                self.wake.clear()
                with self._lock:
                    pod = self.latest
                if self.ctx.stop.is_set():
                    self._stop_processes(grace=3.0)
                    return
                if self.gone:
                    self._stop_processes(grace=2.0)
                    self.cleanup()
                    return
                if self.ctx.heartbeats.is_crashed(self.node):
                    self._reap()
                    for process in self.processes.values():
                        process.signal(signal.SIGKILL)
                    self.wake.wait(0.5)
                    continue
                if pod["metadata"].get("deletionTimestamp"):
                    self._terminate(pod)
                    return
                self._reap()
                if self.record.failure_reason and self.processes:
                    self._stop_processes(grace=float(pod["spec"].get("terminationGracePeriodSeconds", 30)))
                self._apply_faults(pod)
                self._step(pod)
                self._publish(pod)
                if self.terminal() and not self.processes:
                    self.ctx.real_ips.release(self.uid)
                    self.finished.set()
                    self._wait_for_deletion()
                    return
                self.wake.wait(1.0)
        except Exception:
            log.exception("pod %s/%s: worker failed", self.namespace, self.name)
            self._stop_processes(grace=0.0)
        finally:
            self.done.set()

    def _wait_for_deletion(self) -> None:
        """A finished pod only waits for its deletion (no processes, no status writes)."""
        while not self.ctx.stop.is_set():
            if self.gone:
                self.cleanup()
                return
            with self._lock:
                pod = self.latest
            if pod["metadata"].get("deletionTimestamp") and not self.ctx.heartbeats.is_crashed(self.node):
                self.cleanup()
                self._delete_object()
                return
            self.wake.wait(5.0)
            self.wake.clear()

    # ---- container lifecycle ------------------------------------------------------------------------------
    def _reap(self) -> None:
        for name, process in list(self.processes.items()):
            code = process.poll()
            if code is None:
                continue
            del self.processes[name]
            record = self._record_of(name)
            self._record_exit(
                record,
                Terminated(
                    code,
                    podstatus.exit_reason(code),
                    record.running_since,
                    podstatus.now(),
                    message=self._termination_message(name, record.restart_count),
                    container_id=record.container_id,
                ),
            )

    def _termination_log(self, container: str, restart: int) -> Path:
        return self.dir / "termination" / f"{container}-{restart}"

    def _termination_message(self, container: str, restart: int) -> str:
        """What the container wrote to its termination log, cut as the kubelet cuts it."""
        try:
            return (
                self._termination_log(container, restart)
                .read_bytes()[:TERMINATION_MESSAGE_BYTES]
                .decode(errors="replace")
            )
        except OSError:
            return ""

    def _record_exit(self, record: ContainerRecord, terminated: Terminated) -> None:
        """A run ended: keep it as the state, or as lastState with a backoff when the restart policy restarts it."""
        record.terminated = terminated
        code = terminated.exit_code
        is_init = any(r is record for r in self.record.init_containers)
        policy = self.record.restart_policy
        restart = (policy == "Always" and not is_init) or (policy != "Never" and code != 0)
        if restart:
            started = terminated.started_at
            ran = (terminated.finished_at - started).total_seconds() if started else 0.0
            delay = (
                BACKOFF_FIRST if ran >= BACKOFF_RESET_AFTER else self.backoff.get(record.name, BACKOFF_FIRST)
            )
            self.backoff[record.name] = min(delay * 2, BACKOFF_MAX)
            self.next_start[record.name] = time.monotonic() + delay
            record.last_terminated = terminated
            record.terminated = None
            record.running_since = None
            record.waiting_reason = "CrashLoopBackOff"
            record.waiting_message = (
                f"back-off {delay:.0f}s restarting failed container={record.name} pod={self.name}"
            )
        log.info(
            "pod %s/%s container %s exited with %s%s",
            self.namespace,
            self.name,
            record.name,
            code,
            " (restarting)" if restart else "",
        )

    def _fail(self, reason: str, message: str, record: ContainerRecord | None = None) -> None:
        self.record.failure_reason = reason
        self.record.failure_message = message
        if record is not None:
            record.terminated = Terminated(128, "CreateContainerError", None, podstatus.now(), message)
        log.warning("pod %s/%s failed: %s", self.namespace, self.name, message)

    def _prepare(self, pod: dict[str, Any]) -> bool:
        if self.volume_paths is not None:
            return True
        if time.monotonic() < self.prepare_after:
            return False
        host_network = bool(pod["spec"].get("hostNetwork"))
        if not self.record.pod_ip:
            self.record.pod_ip = HOST_IP if host_network else self.ctx.real_ips.allocate(self.uid)
        if self.record.start_time is None:
            self.record.start_time = podstatus.now()
        try:
            context = volumes.PodVolumeContext(
                self.ctx.state_dir,
                self.ctx.config_map,
                self.ctx.secret,
                self.ctx.claim,
                self.ctx.persistent_volume,
                self.ctx.service_account_token,
            )
            paths = volumes.materialize(pod, context, self.record.pod_ip, HOST_IP)
        except ContainerConfigError as error:
            self.record.pending_message = str(error)
            for record in self._all_records():
                if not record.container_id:
                    record.waiting_reason, record.waiting_message = "ContainerCreating", str(error)
            self.prepare_after = time.monotonic() + CONFIG_RETRY
            return False
        etc = self.dir / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(volumes.render_hosts(pod, self.record.pod_ip))
        (etc / "resolv.conf").write_text(volumes.render_resolv(self.namespace, self.ctx.dns_ip))
        self.record.pending_message = ""
        self.volume_paths = paths
        return True

    def _step(self, pod: dict[str, Any]) -> None:
        if self.terminal() or not self._prepare(pod):
            return
        for record in self.record.init_containers:
            if record.terminated is not None and record.terminated.exit_code == 0:
                continue
            if not record.running and record.terminated is None:
                self._maybe_start(pod, record)
            return  # init containers run one at a time, and all before the regular ones
        for record in self.record.containers:
            if not record.running and record.terminated is None:
                self._maybe_start(pod, record)

    def _outside_namespaces(
        self,
        container: str,
        argv: list[str],
        env: dict[str, str],
        working_dir: str | None,
        mounts: list[volumes.Mount],
    ) -> tuple[list[str], dict[str, str], str | None, list[volumes.Mount]]:
        """A container on the machine's shared filesystem (sharedfs): its mount paths rewritten to its own
        volumes, and its service account as a kubeconfig of its own instead of a shared mount."""
        account = sharedfs.service_account_mount(mounts)
        if account is not None:
            mounts = [mount for mount in mounts if mount is not account]
            host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
            if host and port and "KUBECONFIG" not in env:
                path = self.dir / "run" / f"{container}.kubeconfig"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(sharedfs.kubeconfig(Path(account.source), host, port))
                env["KUBECONFIG"] = str(path)
        argv, env, working_dir = sharedfs.rewrite_container(argv, env, working_dir, mounts)
        return argv, env, working_dir, mounts

    def _maybe_start(self, pod: dict[str, Any], record: ContainerRecord) -> None:
        if time.monotonic() < self.next_start.get(record.name, 0.0) or self.record.failure_reason:
            return
        container = self._spec_of(record.name)
        try:
            env_context = EnvContext(
                pod=pod,
                pod_ip=self.record.pod_ip,
                host_ip=HOST_IP,
                config_maps=self.ctx.config_map_data,
                secrets=self.ctx.secret_data,
                node_allocatable=capacity(self.ctx.nodes[self.node], self.ctx.config),
                service_env=self.ctx.service_environment(),
            )
            env = {
                **self.ctx.base_environment(),
                "HOSTNAME": volumes.pod_hostname(pod),
                **resolve_env(container, env_context),
            }
            argv = command_line(container, env)
            mounts = volumes.container_mounts(container, self.volume_paths or {})
        except ContainerConfigError as error:
            record.waiting_reason, record.waiting_message = "CreateContainerConfigError", str(error)
            self.next_start[record.name] = time.monotonic() + CONFIG_RETRY
            return
        except InvalidSpecError as error:
            self._fail("InvalidSpec", str(error), record)
            return
        for mount in container.get("volumeMounts") or []:
            env.setdefault(volume_env_name(mount["name"]), (self.volume_paths or {})[mount["name"]])
        self.shm_dir.mkdir(parents=True, exist_ok=True)
        working_dir = container.get("workingDir")
        if not self.ctx.namespaced:
            # Without a mount namespace /dev/shm is the machine's: point shared-memory users at the pod's own.
            env.setdefault("PHALANX_SNAPSHOT_DIR", str(self.shm_dir))
            argv, env, working_dir, mounts = self._outside_namespaces(
                record.name, argv, env, working_dir, mounts
            )
        restart = record.restart_count + (
            1 if record.last_terminated is not None and record.container_id else 0
        )
        container_id = f"phalanx://{self.uid}/{record.name}/{restart}"
        env[CONTAINER_MARKER] = container_id
        # The kubelet mounts a termination-log file into each container; the agent names one instead.
        termination_log = self._termination_log(record.name, restart)
        termination_log.parent.mkdir(parents=True, exist_ok=True)
        termination_log.unlink(missing_ok=True)
        env[TERMINATION_LOG_ENV] = str(termination_log)
        spec = {
            "container": record.name,
            "argv": argv,
            "env": env,
            "working_dir": working_dir,
            "hostname": volumes.pod_hostname(pod),
            "mounts": [{"source": m.source, "target": m.target, "read_only": m.read_only} for m in mounts],
            "hosts_file": str(self.dir / "etc" / "hosts"),
            "resolv_file": str(self.dir / "etc" / "resolv.conf"),
            "shm_dir": str(self.shm_dir),
            "namespaced": self.ctx.namespaced,
        }
        log_path = self.dir / "logs" / record.name / f"{restart}.log"
        try:
            process = ContainerProcess(spec, self.dir / "run", log_path, self.ctx.namespaced, self.wake.set)
        except OSError as error:
            record.waiting_reason, record.waiting_message = "RunContainerError", str(error)
            self.next_start[record.name] = time.monotonic() + CONFIG_RETRY
            return
        history = self.previous_logs.setdefault(record.name, [])
        history.append(process)
        for old in history[:-MAX_LOG_FILES]:
            old.log_path.unlink(missing_ok=True)
        del history[:-MAX_LOG_FILES]
        self.processes[record.name] = process
        record.restart_count = restart
        record.container_id = container_id
        record.running_since = podstatus.now()
        record.terminated = None
        record.waiting_reason, record.waiting_message = "ContainerCreating", ""
        if self.frozen:
            process.signal(signal.SIGSTOP)
        log.info(
            "pod %s/%s container %s started (pid %d, restart %d)",
            self.namespace,
            self.name,
            record.name,
            process.pid,
            restart,
        )

    def container_processes(self) -> list[ContainerProcess]:
        """The containers running now (read from another thread: a copy)."""
        return list(self.processes.values())

    def _apply_faults(self, pod: dict[str, Any]) -> None:
        annotations = pod["metadata"].get("annotations") or {}
        if KILL_ANNOTATION in annotations:
            for process in self.processes.values():
                process.signal(signal.SIGKILL)
            log.info("pod %s/%s: killed on request (%s)", self.namespace, self.name, KILL_ANNOTATION)
            try:
                updated = self.ctx.kube.merge_patch(
                    f"/api/v1/namespaces/{self.namespace}/pods/{self.name}",
                    {"metadata": {"annotations": {KILL_ANNOTATION: None}}},
                )
                self.update(updated)
            except ApiError as error:
                log.warning(
                    "pod %s/%s: could not remove %s: %s", self.namespace, self.name, KILL_ANNOTATION, error
                )
            for process in self.processes.values():
                process.wait(2.0)
            self._reap()
        want_frozen = annotations.get(FREEZE_ANNOTATION, "").lower() == "true"
        if want_frozen != self.frozen:
            for process in self.processes.values():
                process.signal(signal.SIGSTOP if want_frozen else signal.SIGCONT)
            self.frozen = want_frozen
            log.info("pod %s/%s %s", self.namespace, self.name, "frozen" if want_frozen else "thawed")

    # ---- status -------------------------------------------------------------------------------------------
    def _publish(self, pod: dict[str, Any]) -> None:
        desired = podstatus.build_status(pod, self.record, podstatus.now())
        current = pod.get("status") or {}
        ready_now = {c["type"]: c.get("status") for c in current.get("conditions") or []}.get("Ready")
        ready_wanted = {c["type"]: c["status"] for c in desired["conditions"]}["Ready"]
        if (
            desired == self.last_published
            and current.get("phase") == desired["phase"]
            and ready_now == ready_wanted
        ):
            return
        try:
            updated = with_retry(
                lambda: self.ctx.kube.merge_patch(
                    f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status", {"status": desired}
                ),
                f"status of {self.namespace}/{self.name}",
                self.ctx.stop,
            )
        except ApiError as error:
            if error.status == 404:
                self.gone = True
                return
            log.warning("pod %s/%s: status write failed: %s", self.namespace, self.name, error)
            return
        except Exception as error:
            log.warning("pod %s/%s: status write failed: %s", self.namespace, self.name, error)
            return
        self.last_published = desired
        self.update(updated)

    # ---- stopping -----------------------------------------------------------------------------------------
    def _stop_processes(self, grace: float) -> None:
        """SIGTERM every container's process group, wait up to `grace` seconds, then SIGKILL."""
        if not self.processes:
            return
        for process in self.processes.values():
            process.signal(signal.SIGCONT)
            process.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes.values():
            process.wait(max(0.0, deadline - time.monotonic()))
        for process in self.processes.values():
            process.signal(signal.SIGKILL)
            process.wait(5.0)
        self._reap_all()

    def _reap_all(self) -> None:
        saved_policy = self.record.restart_policy
        self.record.restart_policy = "Never"  # stopping: nothing restarts
        try:
            self._reap()
        finally:
            self.record.restart_policy = saved_policy

    def _terminate(self, pod: dict[str, Any]) -> None:
        """Graceful deletion: stop the containers within the grace period, clean up, delete with grace 0."""
        meta, spec = pod["metadata"], pod["spec"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        log.info("pod %s/%s: terminating (grace %ss)", self.namespace, self.name, grace)
        self._stop_processes(float(grace))
        self.cleanup()
        self._delete_object()

    def _delete_object(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        }
        try:
            with_retry(
                lambda: self.ctx.kube.delete(f"/api/v1/namespaces/{self.namespace}/pods/{self.name}", body),
                f"delete {self.namespace}/{self.name}",
                self.ctx.stop,
            )
        except ApiError as error:
            if error.status not in (404, 409):
                log.warning("pod %s/%s: final delete failed: %s", self.namespace, self.name, error)
        except Exception as error:
            log.warning("pod %s/%s: final delete failed: %s", self.namespace, self.name, error)

    def cleanup(self) -> None:
        """Release the pod's IP and remove its directory (emptyDirs, logs); persistent volumes are kept."""
        self.ctx.real_ips.release(self.uid)
        with self.ctx.registry_lock:
            if self.ctx.registry.get((self.namespace, self.name)) is self:
                del self.ctx.registry[(self.namespace, self.name)]
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.shm_dir, ignore_errors=True)
        for directory in volumes.memory_volume_dirs(self.ctx.state_dir, self.uid):
            shutil.rmtree(directory, ignore_errors=True)
