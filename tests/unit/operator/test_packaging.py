"""Examples are valid TrainingJobs; the Dockerfile stays in step with the Python install; `phalanx crd`; the
shipped files are found in the installed package and the checkout around the working directory is found."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from phalanx import assets
from phalanx.checkout import find_checkout
from phalanx.cli import main
from phalanx.operator import crd
from phalanx.operator.validation import check

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def test_there_are_the_two_examples() -> None:
    assert {path.name for path in EXAMPLES} >= {"tinygpt.yaml", "tinygpt-elastic-topology.yaml"}


def example_job(path: Path) -> dict[str, Any]:
    (job,) = [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] == "TrainingJob"]
    return job


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_examples_are_valid_training_jobs_with_a_preflight_on_shared_storage(path: Path) -> None:
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    job = example_job(path)
    assert job["apiVersion"] == "phalanx.dev/v1alpha1"
    spec, issues = check(job["spec"], job["metadata"]["name"])
    assert issues == []
    assert spec is not None and spec.replicas >= 2 and spec.spares >= 1
    assert spec.preflight.enabled
    (claim,) = [doc for doc in documents if doc["kind"] == "PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == spec.checkpoint.claim_name
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_elastic_example_has_bounds_and_pack_topology() -> None:
    job = example_job(ROOT / "examples" / "tinygpt-elastic-topology.yaml")
    spec, _ = check(job["spec"], job["metadata"]["name"])
    assert spec is not None and spec.topology is not None
    assert spec.topology.policy == "Pack"
    assert spec.effective_min_replicas < spec.replicas < spec.effective_max_replicas


def dockerfile_stages() -> dict[str, str]:
    """Each stage of the Dockerfile by name, with its instructions."""
    text = (ROOT / "Dockerfile").read_text()
    return dict(re.findall(r"^FROM \S+ AS ([\w-]+)\n(.*?)(?=^FROM |\Z)", text, re.MULTILINE | re.DOTALL))


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower() for requirement in requirements}


def test_dependencies_are_split_so_the_operator_gets_no_torch_and_the_worker_no_kopf() -> None:
    project = pyproject()["project"]
    core = requirement_names(project["dependencies"])
    extras = {name: requirement_names(reqs) for name, reqs in project["optional-dependencies"].items()}
    assert "torch" not in core | extras["operator"] and "kopf" not in core | extras["worker"]
    assert "torch" in extras["worker"] and "kopf" in extras["operator"]
    (torch,) = [r for r in project["optional-dependencies"]["worker"] if r.startswith("torch")]
    assert ">=" in torch and "<" in torch and "==" not in torch, torch


def test_the_worker_extras_torch_range_is_the_one_the_launcher_supports() -> None:
    from phalanx.worker.torch_support import SUPPORTED_TORCH

    (torch,) = [r for r in pyproject()["project"]["optional-dependencies"]["worker"] if r.startswith("torch")]
    declared = sorted(torch.removeprefix("torch").split(","))
    assert declared == sorted(SUPPORTED_TORCH.split(",")), (torch, SUPPORTED_TORCH)


def test_dockerfile_builds_a_torch_free_operator_and_a_kopf_free_worker_from_pyproject() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = dockerfile_stages()
    assert list(stages)[-1] == "operator", "the default target is the operator"
    requirements = stages["requirements"]
    assert "COPY pyproject.toml src/phalanx/images/requirements.py ./" in requirements
    assert "COPY locks ./locks" in requirements
    assert "RUN python requirements.py /requirements" in requirements
    for image in ("operator", "worker"):
        deps = stages[f"{image}-deps"]
        assert "COPY --from=requirements /requirements /tmp/requirements" in deps
        # Only what the lock names, each file checked against its hash; then every requirement met, no index.
        assert f"python /tmp/requirements/requirements.py --for {image} /tmp/requirements" in deps
        assert f"{LOCKED_INSTALL} -r /tmp/requirements/{image}.lock" in deps
        assert f"pip install --no-index --dry-run --quiet -r /tmp/requirements/{image}.in" in deps
        assert len(re.findall(r"pip install (?!--no-deps /tmp/wheel)", deps)) == deps.count("pip install --")
        # Each image is its dependencies' stage plus the Phalanx wheel: the large venv is never copied.
        assert re.search(rf"^FROM {image}-deps AS {image}$", text, re.MULTILINE)
        assert "COPY --from=phalanx-wheel /wheel /tmp/wheel" in stages[image]
        assert "pip install --no-deps /tmp/wheel/*.whl" in stages[image]
        assert re.search(r"^USER 10001", stages[image], re.MULTILINE)
    # Every pip install of a dependency is a locked one: no resolver, no unhashed file.
    installs = re.findall(r"pip install ([^\n]*)", text)
    unlocked = [line for line in installs if "--require-hashes" not in line and "--no-index" not in line]
    assert unlocked == ["--no-deps /tmp/wheel/*.whl && rm -rf /tmp/wheel \\"] * 2, unlocked
    assert f"bin/{LOCKED_INSTALL} -r /tmp/bootstrap.txt" in stages["runtime"]
    # Phalanx itself builds once, after the dependencies: every folder pyproject maps is copied into it.
    wheel = stages["phalanx-wheel"]
    assert "pip wheel --no-deps" in wheel
    for folder in pyproject()["tool"]["setuptools"]["package-dir"].values():
        assert f"COPY {folder.split('/')[0]} " in wheel, folder
    # Only the worker gets torch: the variant asked for, from an index and wheels the caller names.
    assert "ARG TORCH_VARIANT=cpu\n" in stages["worker-deps"]
    assert "ARG TORCH_INDEX_URL=\n" in stages["worker-deps"]
    assert "TORCH" not in stages["operator-deps"]
    # No package index or registry is named: a local base replaces the public one through BASE_IMAGE.
    assert re.search(r"\w+://", text) is None
    assert re.findall(r"^FROM \S+", text, re.MULTILINE).count("FROM ${BASE_IMAGE}") == 1


LOCKED_INSTALL = "pip install --require-hashes --no-deps --only-binary :all:"


def test_the_base_image_is_pinned_by_digest_to_the_python_the_locks_are_for() -> None:
    from phalanx.images.lock import TARGET_PYTHONS

    (base,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    name, _, digest = base.partition("@")
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), base
    assert name == f"python:{'.'.join(map(str, TARGET_PYTHONS[0]))}-slim-bookworm"


def run_requirements_stage(folder: Path) -> Path:
    """The requirements stage's script, run here on the checkout's pyproject.toml and locks."""
    stage = dockerfile_stages()["requirements"]
    for source, target in re.findall(r"^COPY (.*) (\S+)$", stage, re.M):
        for name in source.split():
            destination = folder / target / Path(name).name if target == "./" else folder / target
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, destination)
            else:
                destination.write_text((ROOT / name).read_text())
    (script,) = re.findall(r"^RUN (.*)$", stage, re.M)
    subprocess.run(
        ["sh", "-c", script.replace("/requirements", "./out")],
        cwd=folder,
        check=True,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
    )
    return folder / "out"


def test_the_requirements_are_the_extras_and_the_locks(tmp_path: Path) -> None:
    out = run_requirements_stage(tmp_path)
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    assert (out / "operator.in").read_text().split() == project["dependencies"] + extras["operator"]
    assert (out / "worker.in").read_text().split() == project["dependencies"] + extras["worker"] + extras[
        "s3"
    ]
    for lock in (ROOT / "locks").glob("*.txt"):
        assert (out / "locks" / lock.name).read_text() == lock.read_text()


def test_the_worker_takes_torch_from_its_variants_lock_or_the_base_and_checks_what_it_got() -> None:
    deps = dockerfile_stages()["worker-deps"]
    assert 'lock="/tmp/requirements/locks/torch-${TORCH_VARIANT}.txt"' in deps
    assert '[ -f "$lock" ] || { echo "no lock of torch variant ${TORCH_VARIANT} in locks/' in deps
    assert f'{LOCKED_INSTALL} ${{WHEELS:+--find-links "$WHEELS"}}' in deps
    # Debian's torch is the one the base has, seen through the venv; the locks lose what the base provides.
    assert 'if [ "$TORCH_VARIANT" = debian ]; then' in deps
    assert '[ "$TORCH_VARIANT" = debian ] && echo --system-site-packages' in dockerfile_stages()["runtime"]
    assert "grep -iE '^nvidia-'" in deps


def test_phalanx_crd_prints_the_generated_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == crd.render_crd()


def test_phalanx_crd_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "charts").mkdir()
    assert main(["crd", "--write", "--root", str(tmp_path)]) == 0
    for relative in crd.CRD_PATHS:
        assert (tmp_path / relative).read_text() == crd.render_crd()
    assert main(["crd", "--write", "--root", str(tmp_path / "nowhere")]) == 2


def fake_checkout(folder: Path, project: str = "phalanx") -> Path:
    (folder / "operator").mkdir(parents=True)
    (folder / "operator" / "api.py").write_text("")
    (folder / "charts").mkdir()
    (folder / "pyproject.toml").write_text(f'[project]\nname = "{project}"\n')
    return folder


def test_the_checkout_is_found_from_the_working_directory_up(tmp_path: Path) -> None:
    assert find_checkout(ROOT / "operator") == ROOT
    checkout = fake_checkout(tmp_path / "checkout")
    (checkout / "docs" / "deep").mkdir(parents=True)
    assert find_checkout(checkout / "docs" / "deep") == checkout.resolve()
    assert find_checkout(tmp_path) is None
    assert find_checkout(fake_checkout(tmp_path / "other", project="not-phalanx")) is None


def test_phalanx_crd_write_defaults_to_the_checkout_it_runs_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    checkout = fake_checkout(tmp_path / "checkout")
    (checkout / "docs").mkdir()
    monkeypatch.chdir(checkout / "docs")
    assert main(["crd", "--write"]) == 0
    for relative in crd.CRD_PATHS:
        assert (checkout / relative).read_text() == crd.render_crd()
    monkeypatch.chdir(tmp_path)
    assert main(["crd", "--write"]) == 2
    assert "run it inside one or pass --root" in capsys.readouterr().err


def test_the_shipped_files_come_from_the_installed_package(monkeypatch: pytest.MonkeyPatch) -> None:
    # Installed editable, the package's files are this checkout's, whatever the working directory.
    monkeypatch.chdir("/")
    for path, original in (
        (assets.crds_dir() / crd.CRD_FILE, ROOT / "crds" / crd.CRD_FILE),
        (
            assets.chart_dir() / "templates" / "deployment.yaml",
            ROOT / "charts/phalanx/templates/deployment.yaml",
        ),
        (assets.example("tinygpt.yaml"), ROOT / "examples" / "tinygpt.yaml"),
    ):
        assert path.is_absolute() and path.read_text() == original.read_text()
    assert {p.name for p in assets.crds_dir().glob("*.yaml")} == {
        p.name for p in (ROOT / "crds").glob("*.yaml")
    }
    # Helm gets plain files, not the editable install's links (it warns about each link it follows).
    assert not [path for path in assets.chart_dir().rglob("*") if path.is_symlink()]


def test_operator_is_never_the_top_level_module_from_the_checkout() -> None:
    # -S: the standard library's operator is not loaded at startup, so a top-level operator/ package would win.
    result = subprocess.run(
        [sys.executable, "-S", "-c", "import operator, sysconfig; print(operator.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert Path(result.stdout.strip()).parent == Path(sysconfig.get_paths()["stdlib"])


def test_the_operator_process_never_loads_torch() -> None:
    # `phalanx operator run` builds every command's parser; torch would add ~250 MB to the operator's memory.
    probe = (
        "import sys\n"
        "from phalanx.cli import build_parser\n"
        "build_parser()\n"
        "import phalanx.operator.main, phalanx.operator.handlers\n"
        "print(sorted(name for name in sys.modules if name == 'torch' or name.startswith('torch.'))[:3])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout
