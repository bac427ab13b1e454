"""Kueue's controller as a host process of the local cluster, as the control plane's own processes run.

`up` installs Kueue's CRDs (server-side apply), starts the controller with the cluster's admin kubeconfig and
a Configuration written into the state dir (`kueue/`), waits until it is ready, then registers its webhooks
and waits until the API server gets answers from them. `down` removes the webhooks first (without the process
they would refuse every object they intercept) and stops it. Its log is `logs/kueue.log`.

The controller reads its metrics certificate from the fixed path /etc/kueue/metrics/certs when its internal
certificate management is off (cmd/kueue/main.go). It runs in a mount namespace of its own whose /etc is an
overlay of the host's /etc with that folder added; nothing is written to the host's /etc.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from phalanx.devcluster import binaries, controlplane, processes
from phalanx.devcluster.kueue import build, manifests
from phalanx.devcluster.pki import ensure_pki
from phalanx.errors import UserFacingError

COMPONENT = "kueue"
"""Its name for the pid and log files beside the control plane's."""
READY_TIMEOUT_SECONDS = 180.0
"""As for the control plane's processes: a loaded 2-core machine is slow to start a Go controller."""
FIELD_MANAGER = "phalanx-dev"
METRICS_CERTS = Path("kueue/metrics/certs")
"""Where, under /etc, the controller reads its metrics certificate."""
PROBE = {
    "apiVersion": f"{manifests.GROUP}/v1beta2",
    "kind": "ResourceFlavor",
    "metadata": {"name": "phalanx-webhook-probe"},
}
"""Created with a server-side dry run: its admission goes through Kueue's mutating and validating webhooks."""


def home(layout: controlplane.Layout) -> Path:
    return layout.root / COMPONENT


def running(layout: controlplane.Layout) -> processes.PidRecord | None:
    record = processes.read_pid_file(layout.pid_file(COMPONENT))
    return record if record is not None and record.alive() else None


def require_built(cache: Path) -> Path:
    """The bin folder of the pinned Kueue build."""
    bin_dir = build.folders(cache).bin
    if not (bin_dir / build.BINARY).is_file() or not (bin_dir / build.MANIFESTS).is_dir():
        raise UserFacingError(
            f"Kueue {build.VERSION} is not built (looked in {bin_dir}): run `phalanx dev install` once "
            "(about 4 minutes on 2 cores)"
        )
    return bin_dir


def private_etc_argv(upper: Path, work: Path, argv: list[str], as_root: bool) -> list[str]:
    """`argv` in a mount namespace of its own whose /etc is the host's with `upper` laid over it. Without
    root, a user namespace maps the user to root inside it (overlayfs allows that since Linux 5.11)."""
    script = 'mount -t overlay phalanx-kueue-etc -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && shift 2 && exec "$@"'
    user = [] if as_root else ["--user", "--map-root-user"]
    return [
        "unshare", *user, "--mount", "--propagation", "private", "--",
        "sh", "-c", script, "kueue-etc", str(upper), str(work), *argv,
    ]  # fmt: skip


def _kubectl(
    config: controlplane.ClusterConfig,
    layout: controlplane.Layout,
    *args: str,
    input: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [config.binaries["kubectl"], f"--kubeconfig={layout.kubeconfig}", *args],
        input=input,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def _apply(
    config: controlplane.ClusterConfig, layout: controlplane.Layout, objects: list[dict[str, Any]]
) -> None:
    result = _kubectl(
        config,
        layout,
        "apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}", "-f", "-",
        input=yaml.safe_dump_all(objects),
    )  # fmt: skip
    if result.returncode != 0:
        raise UserFacingError(
            f"installing Kueue's objects failed: {result.stderr.strip() or result.stdout.strip()}"
        )


def _explain(layout: controlplane.Layout, what: str) -> str:
    log = layout.log_file(COMPONENT)
    lines = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
    return f"Kueue {what}. Last lines of {log}:\n" + "\n".join(lines)


def _wait(
    layout: controlplane.Layout,
    record: processes.PidRecord,
    check: Callable[[], bool],
    what: str,
    deadline: float,
) -> None:
    while time.monotonic() < deadline:
        if not record.alive():
            raise UserFacingError(_explain(layout, f"exited before {what}"))
        if check():
            return
        time.sleep(0.5)
    raise UserFacingError(
        _explain(layout, f"did not become ready: {what} took longer than {READY_TIMEOUT_SECONDS:.0f} s")
    )


def up(layout: controlplane.Layout, say: Callable[[str], None] = lambda _: None) -> processes.PidRecord:
    """Starts Kueue on the running cluster in `layout` (idempotent) and waits until its webhooks answer."""
    config = layout.load_config()
    if config is None:
        raise UserFacingError(f"no cluster in {layout.root}: `phalanx dev up` first")
    record = running(layout)
    if record is not None:
        say(f"  {COMPONENT:<24} already running (pid {record.pid})")
        return record
    started = time.monotonic()
    bin_dir = require_built(binaries.cache_dir())
    pki = ensure_pki(layout.pki)
    cert_dir = pki.ensure_kueue_serving_cert()
    ca_bundle = pki.apiserver_cert.read_bytes()
    used: set[int] = set()
    ports = manifests.Ports(*(controlplane.free_port(used) for _ in range(3)))
    folder = home(layout)
    folder.mkdir(parents=True, exist_ok=True)

    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": manifests.NAMESPACE}}
    crds = manifests.crds(bin_dir / build.MANIFESTS / "crd", ports.webhook, ca_bundle)
    _apply(config, layout, [namespace, *crds])
    names = [f"crd/{crd['metadata']['name']}" for crd in crds]
    established = _kubectl(
        config, layout, "wait", "--for=condition=Established", "--timeout=120s", *names, timeout=150
    )
    if established.returncode != 0:
        raise UserFacingError(f"Kueue's CRDs were not established: {established.stderr.strip()}")

    config_file = folder / "config.yaml"
    config_file.write_text(yaml.safe_dump(manifests.configuration(ports, cert_dir), sort_keys=False))
    upper, work = folder / "etc", folder / "etc-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    metrics_certs = upper / METRICS_CERTS
    metrics_certs.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key"):
        shutil.copyfile(cert_dir / name, metrics_certs / name)
    argv = [str(bin_dir / build.BINARY), f"--config={config_file}"]
    record = processes.start_daemon(
        private_etc_argv(upper, work, argv, as_root=os.geteuid() == 0),
        pid_file=layout.pid_file(COMPONENT),
        log_file=layout.log_file(COMPONENT),
        env={**os.environ, "KUBECONFIG": str(layout.kubeconfig)},
    )
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    try:
        ready = f"http://127.0.0.1:{ports.health}/readyz"
        _wait(layout, record, lambda: controlplane.http_ok(ready), "its readiness probe", deadline)
        webhooks = (bin_dir / build.MANIFESTS / "webhooks.yaml").read_text()
        _apply(config, layout, manifests.webhook_configurations(webhooks, ports.webhook, ca_bundle))

        def webhooks_answer() -> bool:
            probe = _kubectl(
                config, layout, "create", "--dry-run=server", "-f", "-", input=json.dumps(PROBE), timeout=30
            )
            return probe.returncode == 0

        _wait(layout, record, webhooks_answer, "its webhooks answering the API server", deadline)
    except BaseException:
        down(layout)
        raise
    say(
        f"  {COMPONENT:<24} ready in {time.monotonic() - started:.1f} s (pid {record.pid}, Kueue {build.VERSION}, "
        f"log {layout.log_file(COMPONENT)})"
    )
    return record


def remove_webhooks(layout: controlplane.Layout) -> None:
    """Deletes Kueue's webhook configurations, if the API server answers (a cluster being stopped may not)."""
    config = layout.load_config()
    bin_dir = build.folders(binaries.cache_dir()).bin
    webhooks = bin_dir / build.MANIFESTS / "webhooks.yaml"
    if config is None or not webhooks.is_file():
        return
    names = [
        f"{kind.lower()}/{name}" for kind, name in manifests.webhook_configuration_names(webhooks.read_text())
    ]
    with contextlib.suppress(subprocess.TimeoutExpired):
        _kubectl(config, layout, "delete", "--ignore-not-found", "--wait=false", *names, timeout=20)


def down(layout: controlplane.Layout, say: Callable[[str], None] = lambda _: None) -> None:
    """Stops Kueue, its webhooks removed first. Its CRDs and objects stay, as a Deployment's removal would
    leave them."""
    record = processes.read_pid_file(layout.pid_file(COMPONENT))
    if record is None:  # never started here, or stopped already
        return
    remove_webhooks(layout)
    process = record.process()
    if process is not None:
        processes.stop_processes([process], 10.0)
        say(f"  stopped {COMPONENT} (pid {process.pid})")
    layout.pid_file(COMPONENT).unlink(missing_ok=True)
