"""The base image: Debian bookworm with Python 3.11, made by mmdebstrap from the machine's own Debian mirror.

It stands in for the Dockerfile's public `python:3.11-slim-bookworm` (passed as BASE_IMAGE) where no registry
can be reached. Its rootfs tar is cached under the image cache and rebuilt only when an input changes: the
mirror, the release, the packages, the CA bundle or this recipe.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from phalanx.devcluster import aptsources
from phalanx.errors import UserFacingError

PACKAGES = ("python3", "python3-venv", "ca-certificates")
"""What the Dockerfile needs of its base: `python -m venv` with pip, and TLS for the package index."""
RECIPE_VERSION = 1
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
    recipe: int = RECIPE_VERSION
    ca_bundle: Path = field(default=DEFAULT_CA_BUNDLE, compare=False)

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
    mirror = aptsources.debian_mirror()
    if not mirror:
        raise UserFacingError(
            f"no Debian {aptsources.SUITE} mirror in this machine's apt sources: set "
            f"{aptsources.MIRROR_ENV} to the URI of one"
        )
    bundle = host_ca_bundle()
    digest = hashlib.sha256(bundle.read_bytes()).hexdigest() if bundle.is_file() else ""
    return BaseSpec(mirror=mirror, ca_bundle_sha256=digest, ca_bundle=bundle)


def mmdebstrap_args(spec: BaseSpec, rootfs_tar: Path) -> list[str]:
    hooks = [
        # The Dockerfile runs `python`, as the public image has it.
        'ln -sf /usr/bin/python3 "$1/usr/local/bin/python"',
    ]
    if spec.ca_bundle_sha256:
        hooks.append(f"upload {spec.ca_bundle} /etc/ssl/certs/ca-certificates.crt")
    mirror = spec.mirror.rstrip("/")
    return [
        "mmdebstrap",
        "--variant=minbase",
        "--quiet",
        f"--include={','.join(spec.packages)}",
        *(f"--customize-hook={hook}" for hook in hooks),
        spec.suite,
        str(rootfs_tar),
        f"deb {mirror} {spec.suite} main",
        f"deb {mirror} {spec.suite}-updates main",
    ]


def image_exists(name: str) -> bool:
    result = subprocess.run(["buildah", "inspect", "--type", "image", name], capture_output=True, check=False)
    return result.returncode == 0


def _run(args: list[str], what: str) -> str:
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
    rootfs = cache / f"base-{spec.cache_key()}.tar"
    if not rootfs.is_file():
        started = time.monotonic()
        print(f"base image: mmdebstrap {spec.suite} from {spec.mirror} (once, 1-2 minutes)", flush=True)
        partial = rootfs.with_suffix(".partial.tar")
        _run(mmdebstrap_args(spec, partial), "mmdebstrap")
        partial.rename(rootfs)
        # A base made from other inputs is stale now: keep only the current one.
        for stale in cache.glob("base-*.tar"):
            if stale != rootfs:
                stale.unlink(missing_ok=True)
        print(f"base image: rootfs in {time.monotonic() - started:.0f} s", flush=True)
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
