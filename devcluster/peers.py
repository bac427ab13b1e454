"""Runs the peers' controllers (JobSet, Kubeflow Trainer v2) as host processes against a local cluster.

`PeerControllers(...).start()` builds each controller from its pinned Go module (`peerbuild.MODULE_BUILDS`, into
the Phalanx cache folder), installs its CRDs from the module's own manifests, starts the binary with the
cluster's admin kubeconfig and a configuration file (`peerconfig`), waits for its readiness probe, then
registers its webhooks as `url:` clientConfigs to the host process (certificate made here) and applies its
runtimes (Kubeflow's `torch-distributed` ClusterTrainingRuntime). `stop()` undoes all of it in reverse order:
runtimes, webhooks, the processes, the CRDs, the scratch folder. Objects of the CRDs' kinds must be gone first
(the bench deletes their namespaces while the controllers still run, so their finalizers are released).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from phalanx.devcluster import gobuild, peerbuild, peerconfig
from phalanx.devcluster.controlplane import free_port
from phalanx.devcluster.pki import ensure_serving_cert
from phalanx.errors import UserFacingError

READY_TIMEOUT = 180.0
"""Seconds a controller may take to answer its readiness probe (its caches sync against the apiserver)."""
STOP_GRACE = 15.0

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
"""`kubectl(*args, input=..., check=...)`, as `phalanx.bench.cluster.BenchCluster.kubectl`."""


def module_dir(build: peerbuild.ModuleBuild, cache: Path) -> Path:
    """The module's source in Go's module cache (the build downloaded it; fetched again if cleared since)."""
    go = gobuild.GoPaths(cache / "go")
    folder = go.modules / f"{peerconfig.module_cache_path(build.module)}@{build.version}"
    if not folder.is_dir():
        env = gobuild.go_env(go, dict(os.environ))
        result = subprocess.run(
            ["go", "mod", "download", "-json", f"{build.module}@{build.version}"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0 or not folder.is_dir():
            raise UserFacingError(
                f"fetching {build.module} {build.version} failed: {result.stdout.strip()[-300:]}; clear "
                f"{go.modules} and run `{peerbuild.AGAIN}` again"
            )
    return folder


def load_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc, dict)]


@dataclass
class Running:
    """One started controller."""

    files: peerconfig.ControllerFiles
    process: subprocess.Popen[bytes]
    log: Path
    probe_port: int
    webhooks: list[dict[str, Any]] = field(default_factory=list)

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class PeerControllers:
    """The controllers named (in start order: `jobset` before `kubeflow-trainer`, which runs on it)."""

    names: tuple[str, ...]
    kubectl: Kubectl
    kubeconfig: Path
    workdir: Path
    cache: Path
    log: Callable[[str], None] = print
    running: list[Running] = field(default_factory=list)
    crds: list[str] = field(default_factory=list)
    applied: list[dict[str, Any]] = field(default_factory=list)

    def versions(self) -> dict[str, str]:
        return {name: peerconfig.CONTROLLERS[name].build.version for name in self.names}

    def start(self) -> PeerControllers:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cert, key = ensure_serving_cert(self.workdir / "certs")
        try:
            for name in self.names:
                self._start_one(peerconfig.CONTROLLERS[name], cert, key)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_one(self, files: peerconfig.ControllerFiles, cert: Path, key: Path) -> None:
        build = files.build
        started = time.monotonic()
        binary = peerbuild.build_module(build, self.cache)
        source = module_dir(build, self.cache)
        crds = [peerconfig.plain_crd(doc) for path in files.crds for doc in load_documents(source / path)]
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(crds))
        names = [crd["metadata"]["name"] for crd in crds]
        self.crds += names
        self._wait_established(names)
        ports: set[int] = set()
        webhook_port, probe_port = free_port(ports), free_port(ports)
        home = self.workdir / build.name
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        if build.name == "jobset":
            config = peerconfig.jobset_configuration(webhook_port, probe_port, str(cert.parent))
        else:
            config = peerconfig.trainer_configuration(webhook_port, probe_port)
            # controller-runtime's default certificate folder is under os.TempDir(), which reads TMPDIR.
            serving = home / "tmp" / "k8s-webhook-server" / "serving-certs"
            serving.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cert, serving / "tls.crt")
            shutil.copyfile(key, serving / "tls.key")
            env["TMPDIR"] = str(home / "tmp")
        config_file = home / "config.yaml"
        config_file.write_text(yaml.safe_dump(config))
        log = home / "controller.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                [str(binary), f"--config={config_file}"],
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=home,
                start_new_session=True,
            )
        running = Running(files, process, log, probe_port)
        self.running.append(running)
        self._wait_ready(running)
        patches = [
            (patch, yaml.safe_load((source / patch.path).read_text())) for patch in files.webhook_patches
        ]
        running.webhooks = peerconfig.host_webhooks(
            load_documents(source / files.webhooks),
            patches,
            files.name_prefix,
            webhook_port,
            cert.read_bytes(),
        )
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(running.webhooks))
        for path in files.runtimes:
            documents = load_documents(source / path)
            self._apply_when_served(documents)
            self.applied += documents
        self.log(
            f"{build.module} {build.version}: controller ready in {time.monotonic() - started:.0f} s "
            f"(pid {process.pid}, webhooks on 127.0.0.1:{webhook_port}, log {log})"
        )

    def _wait_established(self, names: list[str], timeout: float = 60.0) -> None:
        """`kubectl wait` refuses a CRD whose status has no conditions yet: poll instead."""
        deadline = time.monotonic() + timeout
        query = '{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Established")].status}{"\\n"}{end}'
        while True:
            result = self.kubectl("get", "crd", "-o", f"jsonpath={query}", check=False)
            established = {
                line.partition("=")[0] for line in result.stdout.splitlines() if line.endswith("=True")
            }
            if established >= set(names):
                return
            if time.monotonic() > deadline:
                raise UserFacingError(
                    f"the CRDs {', '.join(sorted(set(names) - established))} were not established"
                )
            time.sleep(0.5)

    def _wait_ready(self, running: Running) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        url = f"http://127.0.0.1:{running.probe_port}/readyz"
        while time.monotonic() < deadline:
            if running.process.poll() is not None:
                raise UserFacingError(
                    f"{running.files.build.module} {running.files.build.version} exited with "
                    f"{running.process.returncode} before it was ready; its last lines:\n{running.tail()}"
                )
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
            time.sleep(0.5)
        raise UserFacingError(
            f"{running.files.build.module} {running.files.build.version} was not ready within "
            f"{READY_TIMEOUT:.0f} s; its last lines:\n{running.tail()}"
        )

    def _apply_when_served(self, documents: list[dict[str, Any]]) -> None:
        """Apply objects its own webhook validates: the apiserver may call it before the webhook configuration
        has reached its informers, so a refusal is retried for a while."""
        text = yaml.safe_dump_all(documents)
        deadline = time.monotonic() + 60
        while True:
            result = self.kubectl("apply", "-f", "-", input=text, check=False)
            if result.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise UserFacingError(f"applying the runtimes failed: {result.stderr.strip()}")
            time.sleep(1.0)

    def stop(self) -> None:
        """Remove everything `start` made; never raises (what failed is logged)."""
        for document in reversed(self.applied):
            self._delete(document["kind"], document["metadata"]["name"])
        self.applied.clear()
        for running in reversed(self.running):
            for webhook in running.webhooks:
                self._delete(webhook["kind"], webhook["metadata"]["name"])
        for running in reversed(self.running):
            _terminate(running.process)
        self.running.clear()
        for name in reversed(self.crds):
            self._delete("customresourcedefinition", name)
        self.crds.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _delete(self, kind: str, name: str) -> None:
        with contextlib.suppress(Exception):
            result = self.kubectl(
                "delete", kind, name, "--ignore-not-found", "--wait=true", "--timeout=120s", check=False
            )
            if result.returncode != 0:
                self.log(f"deleting {kind}/{name} failed: {result.stderr.strip()}")

    def describe(self) -> dict[str, Any]:
        return {
            name: {"module": f"{peerconfig.CONTROLLERS[name].build.module}", "version": version}
            for name, version in self.versions().items()
        }

    def __enter__(self) -> PeerControllers:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _terminate(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
