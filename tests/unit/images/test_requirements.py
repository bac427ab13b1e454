"""What the Dockerfile's requirements stage writes (src/phalanx/images/requirements.py, run there on its own)."""

from __future__ import annotations

import subprocess
import tomllib
import venv
from pathlib import Path

import pytest

from phalanx.images import requirements

ROOT = Path(__file__).resolve().parents[3]
PINS = [
    "# pins",
    "numpy==2.4.6",
    "torch==2.13.0+cu130",
    "triton==3.5.0",
    "nvidia-cublas==13.0.0",
    "cuda-bindings==13.0.0",
    "Typing_Extensions==4.16.0",
    "pydantic==2.14.4",
    "",
]


def test_the_accelerator_stack_is_never_pinned_and_the_rest_is() -> None:
    assert requirements.image_constraints(PINS, provided=set()) == [
        "numpy==2.4.6",
        "Typing_Extensions==4.16.0",
        "pydantic==2.14.4",
    ]


def test_what_the_base_provides_keeps_the_bases_version() -> None:
    # Debian's torch was built against Debian's numpy: a pin of another one would shadow it in the venv.
    provided = {"numpy", "typing-extensions"}
    assert requirements.image_constraints(PINS, provided) == ["pydantic==2.14.4"]


def test_the_pinned_torch_loses_its_local_label() -> None:
    assert requirements.pinned_torch(PINS) == "2.13.0"
    with pytest.raises(SystemExit, match="pins no torch"):
        requirements.pinned_torch(["numpy==2.4.6"])


def test_each_image_gets_the_core_and_its_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    worker = requirements.image_requirements(project, "worker")
    operator = requirements.image_requirements(project, "operator")
    assert worker[: len(project["dependencies"])] == project["dependencies"]
    assert any(line.startswith("torch") for line in worker) and any(
        line.startswith("s3fs") for line in worker
    )
    assert not any(line.startswith("kopf") for line in worker)
    assert any(line.startswith("kopf") for line in operator) and not any("torch" in line for line in operator)


def run_in(python: Path, tmp_path: Path) -> dict[str, str]:
    out = tmp_path / "out"
    for name in ("pyproject.toml", "constraints.txt"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    script = Path(requirements.__file__)
    subprocess.run([str(python), str(script), str(out)], cwd=tmp_path, check=True, timeout=60)
    return {path.name: path.read_text() for path in out.iterdir()}


@pytest.mark.parametrize("system_site_packages", [False, True])
def test_run_on_its_own_in_a_venv_it_drops_only_what_the_venv_sees_from_outside(
    tmp_path: Path, system_site_packages: bool
) -> None:
    # A venv over this environment's interpreter, as the Dockerfile makes one over its base's Python.
    venv.EnvBuilder(system_site_packages=system_site_packages, with_pip=False).create(tmp_path / "venv")
    written = run_in(tmp_path / "venv" / "bin" / "python", tmp_path)
    pinned = requirements.image_constraints((ROOT / "constraints.txt").read_text().splitlines(), set())
    assert sorted(written) == ["constraints.txt", "operator.txt", "torch-version", "worker.txt"]
    assert written["torch-version"].strip() == requirements.pinned_torch(
        (ROOT / "constraints.txt").read_text().splitlines()
    )
    kept = written["constraints.txt"].splitlines()
    if not system_site_packages:
        assert kept == pinned
        return
    # What the base interpreter has installed around it is left to the base: its pins are dropped, no other.
    seen = subprocess.run(
        [str(tmp_path / "venv" / "bin" / "python"), "-c",
         "import importlib.metadata as m; print('\\n'.join(d.metadata['Name'] for d in m.distributions()))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    provided = {requirements.normalized(name) for name in seen}
    assert provided, "the base interpreter has no distribution of its own to test with"
    dropped = [line for line in pinned if line not in kept]
    assert dropped and all(requirements.requirement_name(line) in provided for line in dropped)
