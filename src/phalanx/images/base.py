"""The base images, made by mmdebstrap from the machine's own Debian mirror (no registry needed).

- The Python base: Debian bookworm with Python 3.11. It stands in for the Dockerfile's public
  `python:3.11-slim-bookworm` (passed as BASE_IMAGE): the operator's base, and the worker's when torch comes
  from a wheel.
- The Debian-torch base: Debian's own CPU build of torch (`python3-torch`) with its Python. PyPI serves torch
  for Linux only as its CUDA build of several GB, so this is how a CPU worker image is made from the
  registries alone (the worker's torch variant `debian`).

Each rootfs tar is cached under the image cache and rebuilt only when an input changes: the mirror, the
release, the packages, the CA bundle or this recipe.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from phalanx.devcluster import aptsources
from phalanx.errors import UserFacingError
from phalanx.progress import SilenceReporter

PACKAGES = ("python3", "python3-venv", "ca-certificates")
"""What the Dockerfile needs of its base: `python -m venv` with pip, and TLS for the package index."""
TORCH_SUITE = "forky"
"""The Debian release whose `python3-torch` lies in the worker's supported torch range (worker/torch_support.py):
forky has 2.14, trixie only 2.6. Forky is Debian's testing release and moves: the image build checks the
torch it got against that range."""
TORCH_PACKAGES = (*PACKAGES, "python3-torch")
TORCH_ENV = (("USE_LIBUV", "0"),)
"""Debian builds torch without libuv, the default transport of torch's TCPStore: torch's own launcher and
Phalanx's rendezvous (worker/rendezvous.py) both read USE_LIBUV to choose the other one."""
EXCLUDED_PATHS = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")
"""Left out of the image (a few hundred MB with torch's dependencies); each package's copyright file stays."""
RECIPE_VERSION = 2
"""Bump when the way the base is made changes, so cached bases are rebuilt."""
IMAGE_NAME = "localhost/phalanx-base"
DEFAULT_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def host_ca_bundle() -> Path:
    """The CA bundle the host's pip trusts: pip inside the build must trust the same ones (a TLS proxy's CA)."""
    for variable in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        value = os.environ.get(variable, "").strip()
        if value and Path(value).is_file():
            return Path(value)
    return DEFAULT_CA_BUNDLE


@dataclass(frozen=True)
class BaseSpec:
    mirror: str
    ca_bundle_sha256: str
    suite: str = aptsources.SUITE
    packages: tuple[str, ...] = PACKAGES
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables the image sets (as the public images set theirs)."""
    recipe: int = RECIPE_VERSION
    ca_bundle: Path = field(default=DEFAULT_CA_BUNDLE, compare=False)

    @property
    def flavour(self) -> str:
        """Names the rootfs tar, so that the two bases never evict each other from the cache."""
        return "torch" if "python3-torch" in self.packages else "python"

    def cache_key(self) -> str:
        """Stable over runs and hosts with the same inputs; the CA bundle counts by content, not path."""
        inputs = asdict(self)
        inputs.pop("ca_bundle")
        blob = json.dumps(inputs, sort_keys=True, default=list).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def image(self) -> str:
        return f"{IMAGE_NAME}:{self.cache_key()}"


def spec_for_this_host() -> BaseSpec:
    """The Python base from this machine's mirror."""
    mirror = aptsources.debian_mirror()
    if not mirror:
        raise UserFacingError(
            f"no Debian {aptsources.SUITE} mirror in this machine's apt sources: set "
            f"{aptsources.MIRROR_ENV} to the URI of one"
        )
    bundle = host_ca_bundle()
    digest = hashlib.sha256(bundle.read_bytes()).hexdigest() if bundle.is_file() else ""
    return BaseSpec(mirror=mirror, ca_bundle_sha256=digest, ca_bundle=bundle)


def with_debian_torch(spec: BaseSpec) -> BaseSpec:
    """The Debian-torch base from the same mirror and CA bundle as the Python base `spec`."""
    return replace(spec, suite=TORCH_SUITE, packages=TORCH_PACKAGES, env=TORCH_ENV)


def mmdebstrap_args(spec: BaseSpec, rootfs_tar: Path) -> list[str]:
    hooks = [
        # The Dockerfile runs `python`, as the public image has it.
        'ln -sf /usr/bin/python3 "$1/usr/local/bin/python"',
    ]
    if spec.ca_bundle_sha256:
        hooks.append(f"upload {spec.ca_bundle} /etc/ssl/certs/ca-certificates.crt")
    mirror = spec.mirror.rstrip("/")
    sources = [f"deb {mirror} {spec.suite} main"]
    options = [
        *(f"--dpkgopt=path-exclude={path}" for path in EXCLUDED_PATHS),
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    ]
    if spec.suite == TORCH_SUITE:
        # A testing release's Release file is valid for a week only, and the mirrors these machines reach may
        # serve a snapshot older than that; its signature is still checked. Testing has no -updates suite.
        options.append('--aptopt=Acquire::Check-Valid-Until "false"')
    else:
        sources.append(f"deb {mirror} {spec.suite}-updates main")
    return [
        "mmdebstrap",
        "--variant=minbase",
        "--quiet",
        f"--include={','.join(spec.packages)}",
        *options,
        *(f"--customize-hook={hook}" for hook in hooks),
        spec.suite,
        str(rootfs_tar),
        *sources,
    ]


def image_exists(name: str) -> bool:
    result = subprocess.run(["buildah", "inspect", "--type", "image", name], capture_output=True, check=False)
    return result.returncode == 0


def _run(args: list[str], what: str) -> str:
    with SilenceReporter(f"base image: {what}"):
        result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise UserFacingError(f"{what} failed: {' | '.join(detail)}")
    return result.stdout.strip()


def ensure_base(spec: BaseSpec, cache: Path) -> str:
    """The base image's name, made now only if its rootfs or image is not there yet."""
    if image_exists(spec.image):
        return spec.image
    cache.mkdir(parents=True, exist_ok=True)
    rootfs = cache / f"base-{spec.flavour}-{spec.cache_key()}.tar"
    if not rootfs.is_file():
        started = time.monotonic()
        print(
            f"base image ({spec.flavour}): mmdebstrap {spec.suite} with {', '.join(spec.packages)} from "
            f"{spec.mirror} (once, 1-3 minutes)",
            flush=True,
        )
        partial = rootfs.with_suffix(".partial.tar")
        _run(mmdebstrap_args(spec, partial), "mmdebstrap")
        partial.rename(rootfs)
        # A base made from other inputs is stale now: keep only the current one.
        for stale in cache.glob(f"base-{spec.flavour}-*.tar"):
            if stale != rootfs:
                stale.unlink(missing_ok=True)
        print(f"base image ({spec.flavour}): rootfs in {time.monotonic() - started:.0f} s", flush=True)
    container = _run(["buildah", "from", "scratch"], "buildah from scratch")
    try:
        _run(["buildah", "add", "--quiet", container, str(rootfs), "/"], "buildah add")
        _run(
            [
                "buildah",
                "config",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env",
                "LANG=C.UTF-8",
                *(arg for name, value in spec.env for arg in ("--env", f"{name}={value}")),
                "--cmd",
                '["python3"]',
                container,
            ],
            "buildah config",
        )
        _run(["buildah", "commit", "--quiet", container, spec.image], "buildah commit")
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    return spec.image
