"""`phalanx image build`: the operator and worker images without a registry, cached under the image cache."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from phalanx.checkout import find_checkout
from phalanx.devcluster.binaries import cache_dir
from phalanx.errors import UserFacingError
from phalanx.images import base, build, containerd, lock, packages


def image_cache() -> Path:
    return cache_dir() / "images"


def default_wheels() -> Path | None:
    """The host's own wheel folder (pip's find-links), so that the build gets the same local wheels."""
    value = os.environ.get("PIP_FIND_LINKS", "").split()
    return Path(value[0]) if value and Path(value[0]).is_dir() else None


def register(subparsers: argparse._SubParsersAction) -> None:
    image = subparsers.add_parser("image", help="container images of the operator and the worker")
    commands = image.add_subparsers(dest="image_command", metavar="COMMAND", required=True)
    build_parser = commands.add_parser(
        "build",
        help="build them with buildah on a Debian base from this machine's mirror (no registry needed)",
    )
    build_parser.add_argument("--target", choices=("operator", "worker", "all"), default="all")
    build_parser.add_argument(
        "--torch",
        default=build.DEBIAN_TORCH,
        help="the worker's torch: debian (default: Debian's CPU build, from the mirror alone), pypi (PyPI's "
        "torch, its CUDA build), or PyTorch's wheel variant cpu (needs --wheels or --torch-index-url holding "
        "it) or a CUDA one such as cu126 (needs --torch-index-url); each wheel variant needs its lock "
        "(phalanx image lock)",
    )
    build_parser.add_argument(
        "--torch-index-url",
        default=os.environ.get("PHALANX_TORCH_INDEX_URL") or None,
        help="a package index holding torch for that variant (env PHALANX_TORCH_INDEX_URL)",
    )
    build_parser.add_argument(
        "--wheels",
        type=Path,
        default=default_wheels(),
        help="a folder of wheels offered to pip in the build (default: $PIP_FIND_LINKS if it is a folder)",
    )
    build_parser.add_argument(
        "--containerd-socket",
        type=Path,
        default=containerd.SOCKET,
        help="import the images into the containerd listening here, if it runs (default: %(default)s)",
    )
    build_parser.add_argument(
        "--no-import", action="store_true", help="only build and save the archives, import into no containerd"
    )
    build_parser.add_argument(
        "--context", type=Path, default=None, help="the Phalanx checkout (default: the one around the cwd)"
    )
    build_parser.set_defaults(handler=_build)
    lock_parser = commands.add_parser(
        "lock",
        help="write the hash locks the Dockerfile installs from (locks/) from constraints.txt and the index",
    )
    lock_parser.add_argument(
        "--torch-variant",
        default=None,
        help="write only locks/torch-<variant>.txt, for a variant of PyTorch's wheel index such as cpu or cu126 "
        "(needs --torch-index-url)",
    )
    lock_parser.add_argument(
        "--torch-index-url",
        default=None,
        help="the index that holds that variant's torch, or a folder of its wheels (as build's --wheels)",
    )
    lock_parser.add_argument(
        "--index-url",
        default=lock.PYPI,
        help="the package index for everything else (default: %(default)s); it must list sha256 hashes",
    )
    lock_parser.add_argument(
        "--context", type=Path, default=None, help="the Phalanx checkout (default: the one around the cwd)"
    )
    lock_parser.set_defaults(handler=_lock)


def resolve_context(given: Path | None) -> Path:
    """The checkout whose Dockerfile builds the images: checked before anything is installed or built."""
    context = given.resolve() if given else find_checkout(Path.cwd())
    if context is None or not (context / "Dockerfile").is_file():
        raise UserFacingError("no Phalanx checkout here: run it inside one or pass --context")
    return context


def check_wheels(wheels: Path | None) -> Path | None:
    if wheels is not None and not wheels.is_dir():
        raise UserFacingError(f"--wheels {wheels}: not a folder")
    return wheels.resolve() if wheels else None


def build_images(
    context: Path,
    target: str = "all",
    torch_variant: str = build.DEBIAN_TORCH,
    torch_index_url: str | None = None,
    wheels: Path | None = None,
) -> list[Path]:
    """Builds the targets and saves their archives (all cached: seconds when nothing changed).

    Shared by `phalanx image build` and `phalanx demo --real-nodes`, which imports them only once its node's
    containerd runs. Returns the archives.
    """
    packages.ensure()
    cache = image_cache()
    python_base = base.spec_for_this_host()
    archives = []
    for each in build.targets_named(target):
        debian_torch = each.stage == "worker" and torch_variant == build.DEBIAN_TORCH
        spec = base.with_debian_torch(python_base) if debian_torch else python_base
        options = build.BuildOptions(
            base_image=base.ensure_base(spec, cache),
            torch_variant=torch_variant,
            torch_index_url=torch_index_url,
            wheels=wheels,
        )
        archives.append(build.save_archive(build.build(each, options, context), cache))
    return archives


def import_images(archives: list[Path], socket: Path = containerd.SOCKET) -> None:
    for archive in archives:
        containerd.import_archive(archive, socket)


def _build(args: argparse.Namespace) -> int:
    started = time.monotonic()
    variant = build.check_torch_variant(args.torch)
    context = resolve_context(args.context)
    wheels = check_wheels(args.wheels)
    archives = build_images(context, args.target, variant, args.torch_index_url, wheels)
    if not args.no_import and args.containerd_socket.is_socket():
        import_images(archives, args.containerd_socket)
    else:
        reason = "not imported" if args.no_import else f"no containerd at {args.containerd_socket}"
        print(f"{reason}: the image archives are in {image_cache()}")
        for archive in archives:
            print(f"  {archive}")
    print(f"images ready in {time.monotonic() - started:.0f} s")
    return 0


def _lock(args: argparse.Namespace) -> int:
    context = resolve_context(args.context)
    if args.torch_variant is None:
        written = lock.write_locks(context, args.index_url)
    else:
        variant = build.check_torch_variant(args.torch_variant)
        if variant in (build.DEBIAN_TORCH, lock.PYPI_TORCH) or not args.torch_index_url:
            raise UserFacingError(
                "--torch-variant names a variant of PyTorch's wheel index (cpu, cu126, ...) and needs "
                "--torch-index-url; `phalanx image lock` alone writes the pypi one"
            )
        source = args.torch_index_url
        if lock.is_folder(source):
            source = str(check_wheels(Path(source)))
        written = [lock.write_torch_lock(context, variant, source, args.index_url)]
    for path in written:
        print(f"wrote {path.relative_to(context)}")
    return 0
