"""Prometheus endpoint of one worker pod, served by the launcher from the pod's status record."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from phalanx.worker.heartbeat import PHASES, PodStatus


class PodMetrics:
    """Gauges mirror the latest PodStatus; counters count the launcher's own events."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        gauge = lambda name, doc: Gauge(name, doc, registry=self.registry)  # noqa: E731
        self.step = gauge("phalanx_worker_step", "Last training step completed by this pod.")
        self.step_seconds = gauge("phalanx_worker_step_seconds", "Duration of the last training step.")
        self.compute_seconds = gauge(
            "phalanx_worker_compute_seconds",
            "Own busy time of the pod's busiest rank in the last step, without waiting for peers.",
        )
        self.loss = gauge("phalanx_worker_loss", "Training loss at the last step.")
        self.samples_per_second = gauge("phalanx_worker_samples_per_second", "Global samples per second.")
        self.grad_norm = gauge("phalanx_worker_grad_norm", "Gradient norm at the last step.")
        self.checkpoint_step = gauge("phalanx_worker_checkpoint_step", "Step of the last checkpoint saved.")
        self.checkpoint_stall_seconds = gauge(
            "phalanx_worker_checkpoint_stall_seconds",
            "Time training was blocked by the last checkpoint save.",
        )
        self.checkpoint_save_seconds = gauge(
            "phalanx_worker_checkpoint_save_seconds",
            "Median time training was blocked by the recent durable checkpoint saves.",
        )
        self.checkpoint_interval = gauge(
            "phalanx_worker_checkpoint_interval_steps", "Steps between durable checkpoint saves in force."
        )
        self.world_size = gauge("phalanx_worker_world_size", "Training processes in the current group.")
        self.rendezvous_seconds = gauge(
            "phalanx_worker_rendezvous_seconds", "Duration of the last rendezvous of this launcher."
        )
        self.phase = Gauge(
            "phalanx_worker_phase", "1 for the pod's current phase.", ["phase"], registry=self.registry
        )
        self.restarts = Counter(
            "phalanx_worker_group_restarts_total",
            "Worker-group restarts by this launcher, by cause.",
            ["cause"],
            registry=self.registry,
        )

    def update(self, status: PodStatus) -> None:
        pairs = (
            (self.step, status.step),
            (self.step_seconds, status.step_seconds),
            (self.compute_seconds, status.compute_seconds),
            (self.loss, status.loss),
            (self.samples_per_second, status.samples_per_second),
            (self.grad_norm, status.grad_norm),
            (self.checkpoint_step, status.checkpoint_step),
            (self.checkpoint_stall_seconds, status.checkpoint_stall_seconds),
            (self.checkpoint_save_seconds, status.checkpoint_save_seconds),
            (self.checkpoint_interval, status.checkpoint_interval),
            (self.world_size, status.world_size),
        )
        for gauge, value in pairs:
            if value is not None:
                gauge.set(value)
        for phase in PHASES:
            self.phase.labels(phase=phase).set(1 if phase == status.phase else 0)

    def serve(self, port: int, address: str) -> None:
        start_http_server(port, addr=address, registry=self.registry)
