"""Phalanx installs as an ordinary package: a wheel built from this checkout, installed with its core
dependencies into a fresh virtual environment outside the checkout, runs its commands there with no checkout
around (the CRD, the chart and the examples come from the package), and never shadows the standard library's
`operator`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from phalanx.operator import crd

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@dataclass
class Installed:
    wheel: Path
    python: Path
    phalanx: Path
    workdir: Path
    """An empty folder outside the checkout, the working directory of every command."""

    def run(self, *args: str | Path, expect: int = 0) -> subprocess.CompletedProcess[str]:
        # No PYTHONPATH or virtual environment of the test run may leak into the installed one.
        env = {key: value for key, value in os.environ.items() if key not in {"PYTHONPATH", "VIRTUAL_ENV"}}
        env["PHALANX_DEV_STATE_DIR"] = str(self.workdir / "dev-state")
        result = subprocess.run(
            [str(arg) for arg in args], cwd=self.workdir, env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == expect, (
            f"{args}: exit {result.returncode}\n{result.stdout}{result.stderr}"
        )
        return result


def build_wheel(out: Path) -> Path:
    # From a copy of what pyproject maps (and nothing else), so that the build never writes into the checkout.
    source = out / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "results")
    for top in {folder.split("/")[0] for folder in mapping.values()}:
        shutil.copytree(ROOT / top, source / top, ignore=ignore)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            ".",
        ],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("phalanx-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("install")
    assert not base.resolve().is_relative_to(ROOT)
    wheel = build_wheel(base)
    environment = base / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    # The core dependencies only, from the package index (pip's cache makes it quick after the first run).
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    workdir = base / "elsewhere"
    workdir.mkdir()
    yield Installed(wheel=wheel, python=python, phalanx=environment / "bin" / "phalanx", workdir=workdir)


def test_the_wheel_holds_only_the_phalanx_package_with_its_files(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"phalanx", "phalanx-0.1.0.dist-info"}, tops
    assert not [name for name in names if name.endswith(".pth")]
    for shipped in (
        f"phalanx/crds/{crd.CRD_FILE}",
        "phalanx/charts/phalanx/Chart.yaml",
        "phalanx/charts/phalanx/templates/deployment.yaml",
        f"phalanx/charts/phalanx/crds/{crd.CRD_FILE}",
        "phalanx/examples/tinygpt.yaml",
        "phalanx/devcluster/build_kubernetes.sh",
        "phalanx/operator/api.py",
        "phalanx/worker/launch.py",
    ):
        assert shipped in names, shipped


def test_phalanx_crd_prints_the_checkouts_crd(installed: Installed) -> None:
    printed = installed.run(installed.phalanx, "crd").stdout
    assert printed == (ROOT / "crds" / crd.CRD_FILE).read_text()


def test_phalanx_crd_write_needs_a_checkout_or_root(installed: Installed, tmp_path: Path) -> None:
    refused = installed.run(installed.phalanx, "crd", "--write", expect=2)
    assert "pass --root" in refused.stderr
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "charts", copy / "charts")
    (copy / "crds").mkdir()
    for relative in crd.CRD_PATHS:
        (copy / relative).unlink(missing_ok=True)
    installed.run(installed.phalanx, "crd", "--write", "--root", copy)
    for relative in crd.CRD_PATHS:
        assert (copy / relative).read_text() == (ROOT / relative).read_text(), relative


def test_the_other_commands_run_without_a_checkout_torch_or_kopf(installed: Installed) -> None:
    status = installed.run(installed.phalanx, "dev", "status", expect=1)
    assert "no cluster in" in status.stdout
    demo = installed.run(installed.phalanx, "demo", "--help").stdout
    assert "--example" in demo and "--chart" in demo
    assert "checkpoint-stall" in installed.run(installed.phalanx, "bench", "--help").stdout
    installed.run(installed.phalanx, "--help")


def test_the_shipped_files_and_the_standard_library_come_from_the_environment(installed: Installed) -> None:
    probe = (
        "import importlib.util, operator, sysconfig\n"
        "from pathlib import Path\n"
        "import phalanx.operator.api\n"
        "from phalanx import assets\n"
        "print(Path(operator.__file__).parent == Path(sysconfig.get_paths()['stdlib']))\n"
        "print([name for name in ('torch', 'kopf') if importlib.util.find_spec(name)])\n"
        "print(assets.chart_dir() / 'Chart.yaml')\n"
        "print(assets.example('tinygpt.yaml'))\n"
    )
    standard, heavy, chart, example = installed.run(installed.python, "-c", probe).stdout.split("\n")[:4]
    assert standard == "True"
    assert heavy == "[]", "the core dependencies pull torch or kopf"
    site = installed.python.parent.parent.resolve()
    for path in (Path(chart), Path(example)):
        assert path.resolve().is_relative_to(site) and path.is_file(), path
    # Without site (-S) the standard library's operator is not loaded at startup: even run from inside the
    # installed package, `operator` is still the standard library's.
    package = Path(chart).parent.parent.parent
    result = subprocess.run(
        [installed.python, "-S", "-c", "import operator; print(operator.__file__)"],
        cwd=package,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert not Path(result.stdout.strip()).resolve().is_relative_to(package.resolve())
