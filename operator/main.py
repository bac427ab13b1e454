"""Runs the operator: metrics endpoint, kopf with our handlers, peering and scope from the settings."""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
from datetime import timedelta

import kopf

from phalanx.operator import builders, handlers, logformat, policy, validation, viewclock
from phalanx.operator.kube import Kube, load_client
from phalanx.operator.metrics import OperatorMetrics
from phalanx.operator.settings import OperatorSettings
from phalanx.operator.throttle import CreationThrottle


def peering_priority(settings: OperatorSettings) -> int:
    """The configured priority, else a random one so identical replicas never tie (a tie pauses all)."""
    if settings.priority is not None:
        return settings.priority
    return secrets.randbelow(1_000_000) + 1


def run(settings: OperatorSettings) -> int:
    """Run until interrupted; returns the exit code."""
    logformat.configure(settings.log_level, settings.log_format)
    if settings.log_level.upper() != "DEBUG":
        # kopf logs every successful timer run per job; at many jobs that drowns what matters.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    metrics = OperatorMetrics()
    if settings.metrics_port:
        metrics.serve(settings.bind_host, settings.metrics_port)
    kube = Kube(
        load_client(settings.api_concurrency + settings.max_workers), settings.recheck_children_seconds
    )
    reconciler = handlers.JobReconciler(
        kube,
        metrics,
        settings.api_concurrency,
        timedelta(seconds=settings.clock_skew_seconds),
        max_gang_pods=settings.max_gang_pods,
        admission=validation.Admission(
            settings.host_path_prefix,
            frozenset(settings.worker_service_accounts),
            heartbeat_writes_per_second=settings.heartbeat_writes_per_second,
            min_gang_timeout_seconds=settings.min_gang_timeout_seconds,
        ),
        network_policy=(
            builders.NetworkPolicySettings(settings.metrics_namespace) if settings.network_policy else None
        ),
        create_batch=settings.create_batch,
        worker_lease_role=settings.worker_lease_role or None,
        pacing=policy.ReplacementPacing(
            free_per_hour=settings.free_replacements_per_hour,
            backoff_seconds=settings.replacement_backoff_seconds,
            max_backoff_seconds=settings.replacement_max_backoff_seconds,
            cap_per_hour=settings.max_replacements_per_hour,
        ),
        creations=CreationThrottle(settings.create_backoff_seconds, settings.create_max_backoff_seconds),
    )
    view = viewclock.OperatorView(settings.view_namespaces, settings.clusterwide, settings.view_lag_seconds)
    reconciler.view = view
    if view.namespaces:
        canary = viewclock.CanaryWriter(
            view,
            kube.renew_lease,
            holder=socket.gethostname(),
            operator_name=settings.peering or "phalanx",
            interval_seconds=settings.view_interval_seconds,
        )
        canary.start()
    registry = kopf.OperatorRegistry()
    handlers.register(registry, settings, reconciler)

    async def operate() -> bool:
        """Run kopf until a signal or a stalled watch stops it; whether the watch had stalled."""
        try:
            await kopf.operator(
                registry=registry,
                clusterwide=settings.clusterwide,
                namespaces=list(settings.namespaces),
                standalone=not settings.peering,
                peering_name=settings.peering or None,
                priority=peering_priority(settings),
                liveness_endpoint=settings.liveness_endpoint,
                stop_flag=reconciler.watch_stalled,
            )
        finally:
            stalled = reconciler.watch_stalled.is_set()
            # kopf waits for a threading.Event stop flag on a thread of the loop's executor, which the loop's
            # shutdown then waits for: left unset after a SIGTERM, the operator would never exit and its pod
            # would be killed at the end of its grace period (every rolling update and uninstall slower by it).
            reconciler.watch_stalled.set()
        return stalled

    if asyncio.run(operate()):
        # Its container restarts it, with every watch started afresh.
        logging.getLogger(__name__).error("stopped: the pod watch had stopped delivering")
        return 1
    return 0
