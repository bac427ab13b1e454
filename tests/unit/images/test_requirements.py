"""What the Dockerfile's requirements stage writes (src/phalanx/images/requirements.py, run there on its own)."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
import venv
from pathlib import Path

import pytest

from phalanx.images import requirements

ROOT = Path(__file__).resolve().parents[3]
LOCK = """# Written by a test.
# Two lines of header.
numpy==2.4.6 \\
    --hash=sha256:{a} \\
    --hash=sha256:{b}
pydantic==2.14.4 \\
    --hash=sha256:{a}
Typing_Extensions==4.16.0 \\
    --hash=sha256:{c}
""".format(a="a" * 64, b="b" * 64, c="c" * 64)


def test_a_lock_reads_back_as_it_is_written() -> None:
    entries = requirements.parse_lock(LOCK)
    assert [(entry.name, entry.version, len(entry.hashes)) for entry in entries] == [
        ("numpy", "2.4.6", 2),
        ("pydantic", "2.14.4", 1),
        ("Typing_Extensions", "4.16.0", 1),
    ]
    rendered = requirements.render_lock("Written by a test.\nTwo lines of header.", entries)
    assert requirements.parse_lock(rendered) == entries
    assert rendered.startswith("# Written by a test.\n# Two lines of header.\nnumpy==2.4.6 \\\n")


@pytest.mark.parametrize(
    "line", ["numpy>=2", "numpy==2.4.6", "numpy==2.4.6 --hash=sha256:aa --no-deps", "-r other.txt"]
)
def test_anything_but_an_exact_hashed_pin_is_not_a_lock(line: str) -> None:
    with pytest.raises(ValueError, match="not a locked requirement"):
        requirements.parse_lock(line)


def test_what_the_base_provides_keeps_the_bases_version() -> None:
    # Debian's torch was built against Debian's numpy: a locked numpy would shadow it in the venv.
    kept = requirements.parse_lock(requirements.without_provided(LOCK, {"numpy", "typing-extensions"}))
    assert [entry.name for entry in kept] == ["pydantic"]
    assert requirements.without_provided(LOCK, set()).splitlines()[2:] == LOCK.splitlines()[2:]


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
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    shutil.copytree(ROOT / requirements.LOCKS, tmp_path / requirements.LOCKS)
    script = Path(requirements.__file__)
    subprocess.run([str(python), str(script), str(out)], cwd=tmp_path, check=True, timeout=60)
    return {str(path.relative_to(out)): path.read_text() for path in out.rglob("*") if path.is_file()}


def test_run_on_its_own_it_writes_the_requirements_and_copies_the_locks_and_itself(tmp_path: Path) -> None:
    # A venv over this environment's interpreter with no pip, as the Dockerfile's requirements stage has only
    # the standard library to count on.
    venv.EnvBuilder(with_pip=False).create(tmp_path / "venv")
    written = run_in(tmp_path / "venv" / "bin" / "python", tmp_path)
    locks = sorted(path.name for path in (ROOT / requirements.LOCKS).glob("*.txt"))
    expected = ["operator.in", "requirements.py", "worker.in", *(f"locks/{name}" for name in locks)]
    assert sorted(written) == sorted(expected)
    assert all(written[f"locks/{name}"] == (ROOT / "locks" / name).read_text() for name in locks)
    assert written["requirements.py"] == Path(requirements.__file__).read_text()
