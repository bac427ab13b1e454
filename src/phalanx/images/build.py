"""The Dockerfile's targets built with buildah on a local base, and saved as docker-archive tars."""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from phalanx import __version__
from phalanx.errors import UserFacingError

DEBIAN_TORCH = "debian"
"""The worker's torch variant that needs no wheel: Debian's CPU build (`python3-torch`) on the Debian-torch base."""
TORCH_VARIANT = re.compile(r"^(debian|pypi|cpu|cu\d{3})$")
"""The worker's torch variants: `debian`, PyPI's torch (`pypi`, its CUDA build), or PyTorch's wheels: `cpu`, or a
CUDA one such as `cu126` (each needs its lock, locks/torch-<variant>.txt)."""
CPU_VARIANTS = (DEBIAN_TORCH, "cpu")
WHEELS_MOUNT = "/wheels"
RUNTIME = "runc"
"""The OCI runtime buildah runs the Dockerfile's steps with, as the real node runs containers: buildah's other
runtime, crun, refuses a host whose cgroups are in hybrid mode."""


@dataclass(frozen=True)
class Target:
    stage: str
    """The Dockerfile stage (`--target`)."""
    repository: str
    """The image name the chart (operator) and the examples (worker) use."""

    def tag(self, torch_variant: str) -> str:
        suffix = "" if self.stage != "worker" or torch_variant in CPU_VARIANTS else f"-{torch_variant}"
        return f"{self.repository}:{__version__}{suffix}"


TARGETS = {"operator": Target("operator", "phalanx"), "worker": Target("worker", "phalanx-worker")}


def targets_named(name: str) -> list[Target]:
    return list(TARGETS.values()) if name == "all" else [TARGETS[name]]


def check_torch_variant(variant: str) -> str:
    if not TORCH_VARIANT.match(variant):
        raise UserFacingError(
            f"--torch {variant!r}: expected debian, pypi, cpu or a CUDA variant such as cu126"
        )
    return variant


@dataclass(frozen=True)
class BuildOptions:
    base_image: str
    torch_variant: str = DEBIAN_TORCH
    torch_index_url: str | None = None
    wheels: Path | None = None


def bud_args(target: Target, options: BuildOptions, context: Path) -> list[str]:
    """`buildah bud` for one target: layers cached, the local base never pulled, the host's network."""
    args = [
        "buildah",
        "bud",
        "--layers",
        # A failed step leaves no working container behind.
        "--force-rm",
        "--pull=false",
        f"--runtime={RUNTIME}",
        # pip reaches the package index exactly as the host does (its proxy, its resolver).
        "--network=host",
        "--build-arg",
        f"BASE_IMAGE={options.base_image}",
        "--target",
        target.stage,
        "--tag",
        target.tag(options.torch_variant),
        "--file",
        str(context / "Dockerfile"),
    ]
    if target.stage == "worker":
        args += ["--build-arg", f"TORCH_VARIANT={options.torch_variant}"]
        if options.torch_index_url:
            args += ["--build-arg", f"TORCH_INDEX_URL={options.torch_index_url}"]
        if options.wheels:
            args += [
                "--volume",
                f"{options.wheels}:{WHEELS_MOUNT}:ro",
                "--build-arg",
                f"WHEELS={WHEELS_MOUNT}",
            ]
    return [*args, str(context)]


def archive_path(cache: Path, tag: str) -> Path:
    return cache / (tag.replace(":", "-") + ".tar")


def image_id(name: str) -> str:
    result = subprocess.run(
        ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", name],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def build(target: Target, options: BuildOptions, context: Path) -> str:
    """Build one target; buildah's own output goes to the terminal. Returns the tag."""
    tag = target.tag(options.torch_variant)
    started = time.monotonic()
    print(f"{tag}: buildah bud --target {target.stage}", flush=True)
    result = subprocess.run(bud_args(target, options, context), check=False)
    if result.returncode != 0:
        raise UserFacingError(
            f"building {tag} failed (buildah exit {result.returncode}): see its output above"
        )
    print(f"{tag}: built in {time.monotonic() - started:.0f} s", flush=True)
    return tag


def save_archive(tag: str, cache: Path) -> Path:
    """A docker-archive tar of the image named `tag` as pods name it; rewritten only when the image changed."""
    archive = archive_path(cache, tag)
    stamp = archive.with_suffix(".id")
    current = image_id(tag)
    if archive.is_file() and stamp.is_file() and stamp.read_text().strip() == current:
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    archive.unlink(missing_ok=True)
    result = subprocess.run(
        ["buildah", "push", "--quiet", tag, f"docker-archive:{archive}:{tag}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise UserFacingError(f"saving {tag} to {archive} failed: {result.stderr.strip()}")
    stamp.write_text(current + "\n")
    print(f"{tag}: saved to {archive} in {time.monotonic() - started:.0f} s", flush=True)
    return archive
