"""`phalanx image build` without a registry or a wheel folder: both images build on local Debian bases, hold
exactly what they should (Debian's CPU torch and no CUDA packages, no kopf in the worker, no torch in the
operator, the standard library's `operator`), run as uid 10001, and are saved as archives pods can use.

On a fresh machine the first build (Debian base, every dependency) takes a few minutes; later runs reuse the
cache under ~/.cache/phalanx and buildah's layers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx import __version__
from phalanx.images import build
from phalanx.images.cli import image_cache
from phalanx.images.requirements import normalized, parse_lock
from phalanx.operator import crd

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = f"phalanx:{__version__}"
WORKER = f"phalanx-worker:{__version__}"
BUILD_TIMEOUT = 1500

pytestmark = [pytest.mark.image, pytest.mark.timeout(BUILD_TIMEOUT + 300)]


def phalanx_image_build(*args: str) -> subprocess.CompletedProcess[str]:
    # --no-import: a containerd on this machine belongs to a node, not to this test.
    return subprocess.run(
        [sys.executable, "-m", "phalanx.cli", "image", "build", "--no-import", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )


@pytest.fixture(scope="module")
def built() -> str:
    result = phalanx_image_build()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout


@pytest.fixture(scope="module")
def worker(built: str) -> Iterator[str]:
    yield from working_container(WORKER)


@pytest.fixture(scope="module")
def operator(built: str) -> Iterator[str]:
    yield from working_container(OPERATOR)


def working_container(image: str) -> Iterator[str]:
    container = subprocess.run(
        ["buildah", "from", "--pull=false", image], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        yield container
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)


def run_in(container: str, *command: str) -> str:
    """The command's output, run as the image runs it (its user, environment and working directory)."""
    result = subprocess.run(
        ["buildah", "run", f"--runtime={build.RUNTIME}", container, "--", *command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, (command, result.stdout, result.stderr)
    return result.stdout.strip()


PROBE = (
    "import importlib.metadata as m, importlib.util as u, operator, os, sysconfig\n"
    "print(os.getuid(), os.getgid())\n"
    "print(os.path.dirname(operator.__file__) == sysconfig.get_paths()['stdlib'])\n"
    "print(sorted(d.metadata['Name'].lower() for d in m.distributions() if d.metadata['Name'].lower().startswith('nvidia')))\n"
    "print([name for name in ('torch', 'kopf') if u.find_spec(name)])\n"
)


def probe(container: str) -> list[str]:
    return run_in(container, "python", "-c", PROBE).splitlines()


def test_the_worker_has_exactly_the_cpu_torch_no_cuda_packages_and_no_kopf(worker: str) -> None:
    uid, stdlib_operator, nvidia, present = probe(worker)
    assert uid == "10001 10001"
    assert stdlib_operator == "True"
    assert nvidia == "[]"
    assert present == "['torch']"
    version = run_in(worker, "python", "-c", "import torch; print(torch.__version__)")
    assert version.endswith("+debian"), version
    assert "usage:" in run_in(worker, "python", "-m", "phalanx.worker.launch", "--help")


def test_the_workers_stores_work_with_the_transport_its_torch_has(worker: str) -> None:
    # Debian's torch has no libuv: the image says so (USE_LIBUV=0) and the rendezvous store serves on it.
    script = (
        "import os, torch.distributed as d\n"
        "from phalanx.worker import rendezvous\n"
        "server = rendezvous.serve('127.0.0.1', 0)\n"
        "client = rendezvous.connect('127.0.0.1', server.port, timeout=10)\n"
        "client.set('k', 'v')\n"
        "print(os.environ['USE_LIBUV'], server.get('k').decode(), d.is_gloo_available())\n"
    )
    assert run_in(worker, "python", "-c", script) == "0 v True"


def test_the_operator_prints_the_crd_and_has_no_torch(operator: str) -> None:
    uid, stdlib_operator, nvidia, present = probe(operator)
    assert uid == "10001 10001"
    assert stdlib_operator == "True"
    assert nvidia == "[]"
    assert present == "['kopf']"
    assert run_in(operator, "phalanx", "crd") == crd.render_crd().strip()


def test_the_images_are_saved_as_archives_named_as_pods_name_them(built: str) -> None:
    for tag in (OPERATOR, WORKER):
        archive = build.archive_path(image_cache(), tag)
        assert str(archive) in built
        with tarfile.open(archive) as tar:
            member = tar.extractfile("manifest.json")
            assert member is not None
            (manifest,) = json.load(member)
        # A pod's `image: phalanx:0.1.0` is a short name: the kubelet's containerd looks it up under the
        # default registry's `library/` path, the name the archive carries besides buildah's `localhost/` one.
        assert any(name.endswith(f"/library/{tag}") for name in manifest["RepoTags"]), manifest["RepoTags"]


def test_a_torch_variant_without_a_lock_fails_the_build_instead_of_pulling_anything(built: str) -> None:
    # No lock of torch+cu126 is committed: pip is never asked for it, let alone for any other torch.
    assert not (ROOT / "locks" / "torch-cu126.txt").exists()
    result = phalanx_image_build("--target", "worker", "--torch", "cu126")
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-4000:]
    assert "no lock of torch variant cu126 in locks/" in output
    assert "phalanx image lock --torch-variant cu126 --torch-index-url" in output
    assert "building phalanx-worker:" in output and "failed" in output
    assert "Downloading nvidia" not in output and "Downloading torch" not in output


VENV_DISTRIBUTIONS = (
    "import importlib.metadata as m, pathlib, sys\n"
    "for d in m.distributions():\n"
    "    if pathlib.Path(str(d.locate_file(''))).resolve().is_relative_to(pathlib.Path(sys.prefix).resolve()):\n"
    "        print(d.metadata['Name'], d.version)\n"
)


@pytest.mark.parametrize("image", ["operator", "worker"])
def test_every_distribution_in_the_images_venv_is_a_locked_one(
    image: str, operator: str, worker: str
) -> None:
    # Installed with --require-hashes from the locks: so every version in the venv is the lock's, and nothing
    # came in beside them but Phalanx's own wheel.
    locked = {}
    for name in ("bootstrap.txt", f"{image}.txt"):
        locked.update(
            {normalized(e.name): e.version for e in parse_lock((ROOT / "locks" / name).read_text())}
        )
    container = operator if image == "operator" else worker
    found = dict(line.split() for line in run_in(container, "python", "-c", VENV_DISTRIBUTIONS).splitlines())
    found = {normalized(name): version for name, version in found.items()}
    assert found.pop("phalanx") == __version__
    assert {name: version for name, version in found.items() if locked.get(name) != version} == {}
    # The worker's venv sees Debian's torch and what it was built against: the lock gave way to those.
    if image == "worker":
        assert "torch" not in found and "numpy" not in found
    else:
        assert set(found) == set(locked)
