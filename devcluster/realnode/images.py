"""Images the real node needs with no registry: the pause image built from source, archives imported.

The pause image is one static binary (`build/pause/linux/pause.c` of the same Kubernetes sources the
binaries are built from: Debian's source package for 1.20, the `k8s.io/kubernetes` module in Go's module
cache for a release built from Go modules), so it is written as a docker-archive by hand: no image builder
is needed for it.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path

from phalanx.devcluster import binaries, gobuild
from phalanx.devcluster.realnode import config
from phalanx.errors import UserFacingError
from phalanx.images.cli import image_cache

PAUSE_SOURCE = "kubernetes-1.20.2/build/pause/linux/pause.c"
PAUSE_VERSION = "3.2"
"""1.20's pause release (its build/pause/Makefile's TAG)."""
PAUSE_USER = "65535:65535"
BUSYBOX_IMAGE = "localhost/busybox:phalanx"
"""A one-binary image (Debian's static busybox: sh, wget, nslookup, httpd) for checking a real node's
network, DNS and kubelet features without building a full image."""
BUSYBOX_BINARY = Path("/bin/busybox")


def images_dir() -> Path:
    return image_cache()


Files = dict[str, tuple[bytes | None, int]]
"""Path in the image -> (content, mode); None content: a directory."""


def _tar_bytes(files: Files) -> bytes:
    """A deterministic tar (fixed times and owners) of the files."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = mode, 0
            if content is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def docker_archive(tag: str, files: Files, entrypoint: list[str], user: str) -> bytes:
    """A one-layer image in the docker-archive format that `ctr images import` reads."""
    layer = _tar_bytes(files)
    layer_digest = hashlib.sha256(layer).hexdigest()
    image_config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "User": user, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(image_config).hexdigest() + ".json"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [tag], "Layers": [f"{layer_digest}/layer.tar"]}]
    ).encode()
    return _tar_bytes(
        {
            "manifest.json": (manifest, 0o644),
            config_name: (image_config, 0o644),
            f"{layer_digest}/layer.tar": (layer, 0o644),
        }
    )


def makefile_tag(makefile: str) -> str:
    """The pause release a build/pause/Makefile builds: its `TAG ?= 3.10.2` line."""
    match = re.search(r"^TAG\s*\??=\s*(\S+)\s*$", makefile, re.MULTILINE)
    if match is None:
        raise UserFacingError("build/pause/Makefile names no TAG: cannot tell which pause release it builds")
    return match.group(1)


def module_pause_dir(kubernetes_version: str) -> Path:
    """build/pause of a release built from Go modules, in the module cache its build left."""
    modules = gobuild.GoPaths(binaries.cache_dir() / "go").modules
    return modules / "k8s.io" / f"kubernetes@v{kubernetes_version}" / "build" / "pause"


def pause_version(kubernetes_version: str) -> str:
    if binaries.is_legacy(kubernetes_version):
        return PAUSE_VERSION
    makefile = module_pause_dir(kubernetes_version) / "Makefile"
    if not makefile.exists():
        raise UserFacingError(
            f"the k8s.io/kubernetes module v{kubernetes_version} is not in Go's module cache ({makefile} is "
            f"missing): run `{binaries.install_command(kubernetes_version)}` first"
        )
    return makefile_tag(makefile.read_text())


def pause_reference(kubernetes_version: str) -> str:
    return config.pause_image(pause_version(kubernetes_version))


def pause_archive(kubernetes_version: str = binaries.KUBERNETES_VERSION) -> Path:
    """The pause image's archive in the cache, built once per pause release."""
    version = pause_version(kubernetes_version)
    target = images_dir() / f"pause-{version}.tar"
    if target.exists():
        return target
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        source = (
            _legacy_pause_source(work)
            if binaries.is_legacy(kubernetes_version)
            else module_pause_dir(kubernetes_version) / "linux" / "pause.c"
        )
        binary = work / "pause"
        compiled = subprocess.run(
            # As build/pause/Makefile compiles it: pause.c stringifies VERSION itself.
            ["gcc", "-Os", "-static", f"-DVERSION=v{version}", "-o", str(binary), str(source)],
            capture_output=True,
            text=True,
            check=False,
        )
        if compiled.returncode != 0:
            raise UserFacingError(f"compiling the pause image failed: {compiled.stderr.strip()[-400:]}")
        subprocess.run(["strip", str(binary)], capture_output=True, check=False)
        archive = docker_archive(
            config.pause_image(version), {"pause": (binary.read_bytes(), 0o755)}, ["/pause"], PAUSE_USER
        )
    _write_atomically(target, archive)
    return target


def _legacy_pause_source(work: Path) -> Path:
    sources = sorted((binaries.cache_dir() / "build").glob("kubernetes_*.orig.tar.gz"))
    if not sources:
        raise UserFacingError(
            "the Kubernetes source package is not in the cache: run `phalanx dev install --real-node` first"
        )
    subprocess.run(["tar", "xzf", str(sources[-1]), "-C", str(work), PAUSE_SOURCE], check=True)
    return work / PAUSE_SOURCE


def busybox_archive() -> Path:
    target = images_dir() / "busybox-phalanx.tar"
    if target.exists():
        return target
    if not BUSYBOX_BINARY.exists():
        raise UserFacingError(f"{BUSYBOX_BINARY} is missing: `apt-get install busybox-static`")
    archive = docker_archive(
        BUSYBOX_IMAGE,
        {"bin/busybox": (BUSYBOX_BINARY.read_bytes(), 0o755), "tmp": (None, 0o1777)},
        ["/bin/busybox"],
        "65534:65534",
    )
    _write_atomically(target, archive)
    return target


def _write_atomically(target: Path, content: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(content)
    partial.replace(target)
