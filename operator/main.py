"""Runs the operator: metrics endpoint, kopf with our handlers, peering and scope from the settings."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import signal
import socket
import threading
from datetime import timedelta

import kopf

from phalanx.operator import (
    builders,
    handlers,
    kopftoggles,
    leadership,
    logformat,
    nodeview,
    policy,
    validation,
    viewclock,
)
from phalanx.operator.kube import Kube, load_client
from phalanx.operator.metrics import OperatorMetrics
from phalanx.operator.settings import OperatorSettings
from phalanx.operator.throttle import CreationThrottle

LOGGER = logging.getLogger(__name__)

NODE_LIST_LOG_SECONDS = 10.0
"""How often the operator says it still waits for its first list of nodes."""


def peering_priority(settings: OperatorSettings) -> int:
    """The configured priority, else a random one so identical replicas never tie (a tie pauses all)."""
    if settings.priority is not None:
        return settings.priority
    return secrets.randbelow(1_000_000) + 1


def run(settings: OperatorSettings) -> int:
    """Run until interrupted; returns the exit code."""
    logformat.configure(settings.log_level, settings.log_format)
    kopftoggles.install()  # kopf's own start-up wait is quadratic in the objects it lists (kopftoggles.py)
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
        step_report_seconds=settings.step_report_seconds,
        pacing=policy.ReplacementPacing(
            free_per_hour=settings.free_replacements_per_hour,
            backoff_seconds=settings.replacement_backoff_seconds,
            max_backoff_seconds=settings.replacement_max_backoff_seconds,
            cap_per_hour=settings.max_replacements_per_hour,
        ),
        creations=CreationThrottle(settings.create_backoff_seconds, settings.create_max_backoff_seconds),
    )
    elector = None
    metrics.leader.set(1)
    if settings.leader_election:
        elector = elect(settings, kube, metrics)
        if elector is None:  # stopped while standing by
            return 0
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
    nodes = nodeview.for_cluster(kube).start()
    reconciler.nodes = nodes
    # A bound node missing from the view reads as deleted: no handler may run before every node was listed.
    while not nodes.synced.wait(NODE_LIST_LOG_SECONDS):
        LOGGER.info("waiting for the first list of the cluster's nodes")
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

    try:
        stalled = asyncio.run(operate())
    finally:
        if elector is not None:
            elector.stop()
            elector.release()
    if stalled:
        # Its container restarts it, with every watch started afresh.
        LOGGER.error("stopped: the pod watch had stopped delivering")
        return 1
    return 0


def elect(
    settings: OperatorSettings, kube: Kube, metrics: OperatorMetrics
) -> leadership.LeaderElector | None:
    """Stand by until this replica holds the operator's Lease (answering liveness probes meanwhile); every write
    of `kube` is fenced by it from then on. None: SIGTERM or SIGINT came first."""
    elector = leadership.LeaderElector(
        functools.partial(kube.request, fenced=False),
        settings.leader_election_namespace or settings.view_namespace or "default",
        settings.leader_election_name,
        settings.leader_identity or socket.gethostname(),
        leadership.LeaseTiming(
            settings.lease_duration_seconds,
            settings.lease_renew_deadline_seconds,
            settings.lease_retry_seconds,
        ),
        on_lost=_exit_lost,
    )
    kube.fence = elector.fence
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    health = (
        leadership.StandbyHealth(settings.bind_host, settings.liveness_port)
        if settings.liveness_port
        else None
    )
    LOGGER.info(
        "standing by for the operator's Lease %s/%s as %s", elector.namespace, elector.name, elector.identity
    )
    metrics.leader.set(0)
    elector.start()
    try:
        while not elector.leading.wait(0.2):
            if stop.is_set():
                elector.stop()
                return None
    finally:
        if health is not None:
            health.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stop.is_set():
        elector.stop()
        elector.release()
        return None
    metrics.leader.set(1)
    return elector


def _exit_lost(holder: str) -> None:
    """Another replica holds the Lease: leave now, before any further write, and come back as a standby."""
    LOGGER.error("exiting: another replica (%s) leads now", holder)
    logging.shutdown()
    os._exit(1)
