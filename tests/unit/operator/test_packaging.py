"""Examples are valid TrainingJobs; the Dockerfile stays in step with the Python install; `phalanx crd`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

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


def test_dockerfile_is_multi_stage_non_root_and_installs_from_pyproject() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.MULTILINE)) >= 2
    assert re.search(r"^USER 10001", text, re.MULTILINE)
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert "COPY pyproject.toml" in text and "pip install --no-deps ." in text
    # The image can write checkpoints to object storage.
    assert "['optional-dependencies']['s3']" in text
    # Every top-level package folder that pyproject maps must be copied into the build.
    pyproject = (ROOT / "pyproject.toml").read_text()
    for folder in set(re.findall(r'^"phalanx[.\w]*" = "([\w/]+)"', pyproject, re.MULTILINE)):
        top = folder.split("/")[0]
        assert f"COPY {top} " in text, top


def test_phalanx_crd_prints_the_generated_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == crd.render_crd()


def test_phalanx_crd_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "charts").mkdir()
    assert main(["crd", "--write", "--root", str(tmp_path)]) == 0
    for relative in crd.CRD_PATHS:
        assert (tmp_path / relative).read_text() == crd.render_crd()
    assert main(["crd", "--write", "--root", str(tmp_path / "nowhere")]) == 2


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
