"""The images' hash locks (src/phalanx/images/lock.py, locks/): the committed locks match constraints.txt and
pyproject.toml, and a lock written from a real package index (served here over HTTP, as PEP 503 HTML and as
PEP 691 JSON) installs with pip's --require-hashes, and refuses a file that is not the one it was written from."""

from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import sys
import threading
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from phalanx.cli import main
from phalanx.errors import UserFacingError
from phalanx.images import lock
from phalanx.images import requirements as requirements_module
from phalanx.images.requirements import (
    ACCELERATOR_STACK,
    IMAGE_EXTRAS,
    image_requirements,
    normalized,
    parse_lock,
    render_lock,
    requirement_name,
)

ROOT = Path(__file__).resolve().parents[3]
LOCKS = ROOT / "locks"


@pytest.mark.parametrize(
    ("filename", "expected"),
    [
        ("kopf-1.45.2-py3-none-any.whl", True),
        ("aiohttp-3.14.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
        ("aiohttp-3.14.5-cp311-cp311-manylinux_2_17_aarch64.whl", True),
        ("cryptography-50.0.2-cp39-abi3-manylinux_2_28_x86_64.whl", True),
        ("cryptography-50.0.2-cp312-abi3-manylinux_2_28_x86_64.whl", True),  # for 3.14
        ("cryptography-50.0.2-cp315-abi3-manylinux_2_28_x86_64.whl", False),
        ("aiohttp-3.14.5-cp312-cp312-manylinux_2_17_x86_64.whl", False),
        ("aiohttp-3.14.5-cp314-cp314-manylinux_2_17_x86_64.whl", True),
        ("aiohttp-3.14.5-cp314-cp314t-manylinux_2_17_x86_64.whl", False),
        ("aiohttp-3.14.5-cp311-cp311-musllinux_1_2_x86_64.whl", False),
        ("aiohttp-3.14.5-cp311-cp311-win_amd64.whl", False),
        ("aiohttp-3.14.5-cp311-cp311-macosx_11_0_arm64.whl", False),
        ("six-1.17.0-py2.py3-none-any.whl", True),
        ("torch-2.13.0-1-cp311-cp311-manylinux_2_28_x86_64.whl", True),
        ("kopf-1.45.2.tar.gz", False),
    ],
)
def test_a_lock_admits_the_wheels_the_base_python_on_linux_may_pick(filename: str, expected: bool) -> None:
    assert lock.installable(filename) is expected


def committed(name: str) -> list:
    return parse_lock((LOCKS / name).read_text())


def constraint_pins() -> dict[str, str]:
    return {
        requirement_name(line): line.split("==", 1)[1]
        for line in lock.constraint_lines(ROOT / "constraints.txt")
        if "==" in line
    }


@pytest.mark.parametrize("name", sorted(path.name for path in LOCKS.glob("*.txt")))
def test_each_committed_lock_is_as_the_tool_writes_it_with_a_sha256_for_every_entry(name: str) -> None:
    text = (LOCKS / name).read_text()
    entries = parse_lock(text)
    assert entries
    assert text.startswith("# " + lock.HEADER.splitlines()[0])
    header = "\n".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    assert render_lock(header, entries) == text, "edited by hand: write it again with `make lock`"
    for entry in entries:
        assert entry.hashes and all(len(digest) == 64 and int(digest, 16) >= 0 for digest in entry.hashes)


def test_the_image_locks_hold_the_tested_versions_of_every_requirement_and_no_accelerator_stack() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = constraint_pins()
    bootstrap = {normalized(entry.name) for entry in committed("bootstrap.txt")}
    assert bootstrap >= {"pip", "setuptools", "wheel"}
    for image in IMAGE_EXTRAS:
        entries = committed(f"{image}.txt")
        names = {normalized(entry.name) for entry in entries}
        wanted = {requirement_name(line) for line in image_requirements(project, image)}
        assert wanted - {"torch"} <= names, wanted - names
        assert not [name for name in names if ACCELERATOR_STACK.match(name)]
        assert not names & bootstrap
        stale = {e.name: e.version for e in entries if pins.get(normalized(e.name), e.version) != e.version}
        assert not stale, f"constraints.txt moved on: `make lock` ({stale})"


def test_the_pypi_torch_lock_is_the_tested_torch_with_its_stack() -> None:
    entries = committed(f"torch-{lock.PYPI_TORCH}.txt")
    versions = {normalized(entry.name): entry.version for entry in entries}
    assert versions["torch"] == lock.pinned_torch(lock.constraint_lines(ROOT / "constraints.txt"))
    assert all(ACCELERATOR_STACK.match(name) for name in versions)
    pins = constraint_pins()
    assert all(pins.get(name, version) == version for name, version in versions.items())


def test_the_pinned_torch_loses_its_local_label() -> None:
    assert lock.pinned_torch(["numpy==2.4.6", "torch==2.13.0+cu130"]) == "2.13.0"
    with pytest.raises(UserFacingError, match="pins no torch"):
        lock.pinned_torch(["numpy==2.4.6"])


def wheel(folder: Path, name: str, version: str, tag: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal, valid wheel of an empty module."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": "",
        f"{dist_info}/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
        ),
        f"{dist_info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{dist_info}/RECORD,,\n"
    path = folder / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, content in {**files, f"{dist_info}/RECORD": record}.items():
            archive.writestr(member, content)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Index(http.server.ThreadingHTTPServer):
    """A package index of a folder of wheels: PEP 503 HTML, or PEP 691 JSON when the client asks for it."""

    def __init__(self, files: Path, json_listing: bool) -> None:
        self.files = files
        self.json_listing = json_listing
        super().__init__(("127.0.0.1", 0), IndexHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/simple"


class IndexHandler(http.server.BaseHTTPRequestHandler):
    server: Index

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        parts = [part for part in self.path.split("?")[0].split("/") if part]
        if parts[:1] == ["files"] and len(parts) == 2 and (self.server.files / parts[1]).is_file():
            return self.reply((self.server.files / parts[1]).read_bytes(), "application/octet-stream")
        if parts[:1] != ["simple"] or len(parts) != 2:
            return self.send_error(404)
        project = parts[1]
        listed = [
            p for p in sorted(self.server.files.glob("*.whl")) if normalized(p.name.split("-")[0]) == project
        ]
        if not listed:
            return self.send_error(404)
        if self.server.json_listing and "vnd.pypi.simple.v1+json" in self.headers.get("Accept", ""):
            files = [
                {"filename": p.name, "url": f"/files/{p.name}", "hashes": {"sha256": sha256(p)}}
                for p in listed
            ]
            body = json.dumps({"meta": {"api-version": "1.0"}, "name": project, "files": files})
            return self.reply(body.encode(), "application/vnd.pypi.simple.v1+json")
        links = "".join(f'<a href="/files/{p.name}#sha256={sha256(p)}">{p.name}</a>\n' for p in listed)
        self.reply(f"<html><body>\n{links}</body></html>".encode(), "text/html")

    def reply(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(params=["html", "json"])
def index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Index]:
    files = tmp_path / "files"
    files.mkdir()
    server = Index(files, json_listing=request.param == "json")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def pip_install_locked(lock_file: Path, index: Index, target: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--require-hashes", "--no-deps",
         "--only-binary", ":all:", "--index-url", index.url, "--target", str(target), "-r", str(lock_file)],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "PIP_NO_CACHE_DIR": "1"},
    )  # fmt: skip


def test_a_lock_written_from_an_index_installs_only_the_files_it_was_written_from(
    index: Index, tmp_path: Path
) -> None:
    files = index.files
    app = wheel(files, "demo_app", "1.0", "py3-none-any", requires=("demo-dep>=1",))
    dep = wheel(files, "demo_dep", "2.0", "py3-none-any")
    wheel(files, "demo_dep", "1.5", "py3-none-any")  # resolved away by the constraint
    wheel(files, "demo_dep", "2.0", "cp312-cp312-manylinux_2_17_x86_64")  # another Python's: not admitted
    entries = lock.locked(["demo-app"], ["demo-dep==2.0"], [index.url])
    assert {(normalized(e.name), e.version, e.hashes) for e in entries} == {
        ("demo-app", "1.0", (sha256(app),)),
        ("demo-dep", "2.0", (sha256(dep),)),
    }
    lock_file = tmp_path / "demo.txt"
    lock_file.write_text(render_lock(lock.HEADER, entries))
    installed = pip_install_locked(lock_file, index, tmp_path / "good")
    assert installed.returncode == 0, installed.stderr
    assert (tmp_path / "good" / "demo_dep.py").is_file()
    # The index (or anyone on its way) serves another file under the same name: pip refuses it.
    dep.unlink()
    wheel(files, "demo_dep", "2.0", "py3-none-any", requires=("evil",))
    refused = pip_install_locked(lock_file, index, tmp_path / "bad")
    assert refused.returncode != 0
    assert "DO NOT MATCH THE HASHES" in refused.stderr, refused.stderr


def test_a_version_no_index_lists_with_a_hash_cannot_be_locked(index: Index) -> None:
    wheel(index.files, "demo_app", "1.0", "cp312-cp312-manylinux_2_17_x86_64")
    with pytest.raises(UserFacingError, match=r"pip could not resolve demo-app"):
        lock.locked(["demo-app"], [], [index.url])
    with pytest.raises(UserFacingError, match=r"none of .* lists a wheel of it for CPython 3\.11 or 3\.14"):
        lock.lock_entry(lock.Resolved("demo_app", "1.0"), [index.url])


@pytest.mark.parametrize(
    ("app_needs", "installed"), [("demo-dep>=2", {"demo-app", "demo-dep"}), ("demo-dep>=1", {"demo-app"})]
)
def test_what_the_base_provides_stands_unless_the_image_needs_another_version(
    index: Index, tmp_path: Path, app_needs: str, installed: set[str]
) -> None:
    # The base has demo-dep 1.0 outside the venv (here: on PYTHONPATH, as Debian's packages are on the
    # system site-packages); the lock has 2.0. pip's resolver decides whether the base's version will do.
    wheel(index.files, "demo_app", "1.0", "py3-none-any", requires=(app_needs,))
    wheel(index.files, "demo_dep", "2.0", "py3-none-any")
    base_dep = wheel(tmp_path, "demo_dep", "1.0", "py3-none-any")
    base = tmp_path / "base"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "--no-deps",
         "--target", str(base), str(base_dep)],
        check=True, capture_output=True,
    )  # fmt: skip
    folder = tmp_path / "requirements"
    (folder / "locks").mkdir(parents=True)
    (folder / "demo.in").write_text("demo-app\n")
    entries = lock.locked(["demo-app"], [], [index.url])
    (folder / "locks" / "demo.txt").write_text(render_lock(lock.HEADER, entries))
    script = Path(requirements_module.__file__)
    subprocess.run(
        [sys.executable, str(script), "--for", "demo", str(folder)],
        check=True, capture_output=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(base), "PIP_INDEX_URL": index.url,
             "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )  # fmt: skip
    chosen = parse_lock((folder / "demo.lock").read_text())
    assert {normalized(entry.name) for entry in chosen} == installed
    assert all(entry in entries for entry in chosen)


@pytest.mark.parametrize(
    "args",
    [
        ["--torch-variant", "cpu"],
        ["--torch-variant", "debian", "--torch-index-url", "http://127.0.0.1:9/simple"],
        ["--torch-variant", "pypi", "--torch-index-url", "http://127.0.0.1:9/simple"],
    ],
)
def test_lock_says_in_one_line_which_torch_variants_it_writes_from_which_index(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["image", "lock", "--context", str(ROOT), *args]) == 2
    assert "--torch-variant names a variant of PyTorch's wheel index" in capsys.readouterr().err
    assert main(["image", "lock", "--context", str(ROOT), "--torch-variant", "rocm"]) == 2
    assert "expected debian, pypi, cpu or a CUDA variant" in capsys.readouterr().err


def test_a_torch_variant_is_locked_from_its_own_source_with_only_its_build(
    index: Index, tmp_path: Path
) -> None:
    # A folder of PyTorch's wheels (as `phalanx image build --wheels` takes), beside the package index.
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "constraints.txt").write_text("# pins\ntorch==2.13.0\ndemo-dep==2.0\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    cpu = wheel(wheels, "torch", "2.13.0+cpu", "py3-none-any", requires=("demo-dep",))
    wheel(wheels, "torch", "2.13.0+cu126", "py3-none-any")
    wheel(index.files, "demo_dep", "2.0", "py3-none-any")
    path = lock.write_torch_lock(checkout, "cpu", str(wheels), index.url)
    assert path == checkout / "locks" / "torch-cpu.txt"
    # Only the accelerator stack: torch's other requirements are the worker lock's.
    (entry,) = parse_lock(path.read_text())
    assert (entry.name, entry.version, entry.hashes) == ("torch", "2.13.0+cpu", (sha256(cpu),))
