"""`phalanx image build`'s pure parts: the buildah and mmdebstrap arguments, the base's cache key, the
package check, the tags the chart and the examples name."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from phalanx import __version__
from phalanx.cli import main
from phalanx.errors import UserFacingError
from phalanx.images import base, build, containerd, packages

ROOT = Path(__file__).resolve().parents[3]
MIRROR = "http://mirror.invalid/debian"
SPEC = base.BaseSpec(mirror=MIRROR, ca_bundle_sha256="ab" * 32, ca_bundle=Path("/host/ca.crt"))


def options(**changes: object) -> build.BuildOptions:
    return replace(build.BuildOptions(base_image="localhost/phalanx-base:key"), **changes)  # type: ignore[arg-type]


def flag_values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg == flag]


def test_the_cache_key_is_stable_and_changes_with_every_input() -> None:
    assert SPEC.cache_key() == base.BaseSpec(mirror=MIRROR, ca_bundle_sha256="ab" * 32).cache_key()
    assert (
        len(
            {SPEC.cache_key()}
            | {
                replace(SPEC, **change).cache_key()
                for change in (
                    {"mirror": "http://other.invalid/debian"},
                    {"ca_bundle_sha256": "cd" * 32},
                    {"suite": "trixie"},
                    {"packages": (*base.PACKAGES, "curl")},
                    {"env": (("USE_LIBUV", "0"),)},
                    {"recipe": base.RECIPE_VERSION + 1},
                )
            }
        )
        == 7
    )
    assert SPEC.image == f"localhost/phalanx-base:{SPEC.cache_key()}"


def test_mmdebstrap_makes_a_minbase_with_python_from_the_given_mirror_and_the_hosts_ca_bundle() -> None:
    args = base.mmdebstrap_args(replace(SPEC, mirror=MIRROR + "/"), Path("/cache/base.tar"))
    assert args[:2] == ["mmdebstrap", "--variant=minbase"]
    assert "--include=python3,python3-venv,ca-certificates" in args
    assert args[-4:] == [
        "bookworm",
        "/cache/base.tar",
        f"deb {MIRROR} bookworm main",
        f"deb {MIRROR} bookworm-updates main",
    ]
    hooks = [arg.removeprefix("--customize-hook=") for arg in args if arg.startswith("--customize-hook=")]
    assert "upload /host/ca.crt /etc/ssl/certs/ca-certificates.crt" in hooks
    assert any("/usr/local/bin/python" in hook for hook in hooks)
    no_bundle = base.mmdebstrap_args(replace(SPEC, ca_bundle_sha256=""), Path("/b.tar"))
    assert not any("upload" in arg for arg in no_bundle)
    # Documentation is left out, each package's copyright file kept; a stable release's Release files are
    # checked for expiry as apt always does.
    assert "--dpkgopt=path-exclude=/usr/share/doc/*" in args
    assert "--dpkgopt=path-include=/usr/share/doc/*/copyright" in args
    assert not any("Check-Valid-Until" in arg for arg in args)


def test_the_debian_torch_base_adds_debians_torch_from_the_release_that_has_one_in_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(base.aptsources, "debian_mirror", lambda: MIRROR)
    python = base.spec_for_this_host()
    torch = base.with_debian_torch(python)
    assert (python.flavour, python.suite, python.env) == ("python", "bookworm", ())
    assert (torch.flavour, torch.suite) == ("torch", "forky")
    assert torch.packages == (*base.PACKAGES, "python3-torch")
    # Debian's torch has no libuv: its TCPStores and the rendezvous's must use the other transport.
    assert torch.env == (("USE_LIBUV", "0"),)
    assert python.cache_key() != torch.cache_key()
    args = base.mmdebstrap_args(torch, Path("/cache/base.tar"))
    assert "--include=python3,python3-venv,ca-certificates,python3-torch" in args
    # A testing release has no -updates suite, and a mirror's snapshot of it may be older than the week its
    # Release file is valid for.
    assert args[-3:] == ["forky", "/cache/base.tar", f"deb {MIRROR} forky main"]
    assert '--aptopt=Acquire::Check-Valid-Until "false"' in args


def test_the_two_bases_keep_apart_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    def mmdebstrap(args: list[str], what: str) -> str:
        if args[0] == "mmdebstrap":
            made.append(next(arg for arg in args if arg.endswith(".partial.tar")))
            Path(made[-1]).write_text("rootfs")
        return "container"

    monkeypatch.setattr(base, "image_exists", lambda name: False)
    monkeypatch.setattr(base, "_run", mmdebstrap)
    monkeypatch.setattr(base.subprocess, "run", lambda *a, **k: None)
    python = replace(SPEC, ca_bundle_sha256="")
    torch = base.with_debian_torch(python)
    for spec in (python, torch, python):
        base.ensure_base(spec, tmp_path)
    assert len(made) == 2
    assert sorted(p.name for p in tmp_path.glob("base-*.tar")) == sorted(
        [f"base-python-{python.cache_key()}.tar", f"base-torch-{torch.cache_key()}.tar"]
    )


def test_the_hosts_ca_bundle_is_the_one_pip_is_told_to_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "proxy-ca.crt"
    bundle.write_text("cert")
    for variable in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        monkeypatch.delenv(variable, raising=False)
    assert base.host_ca_bundle() == base.DEFAULT_CA_BUNDLE
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.crt"))
    assert base.host_ca_bundle() == base.DEFAULT_CA_BUNDLE
    monkeypatch.setenv("PIP_CERT", str(bundle))
    assert base.host_ca_bundle() == bundle


def test_without_a_mirror_in_apt_sources_the_error_says_how_to_name_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(base.aptsources, "debian_mirror", lambda: None)
    with pytest.raises(UserFacingError, match="PHALANX_DEBIAN_MIRROR"):
        base.spec_for_this_host()


def test_the_tags_are_the_ones_the_chart_and_the_examples_name() -> None:
    chart = yaml.safe_load((ROOT / "charts/phalanx/values.yaml").read_text())
    app_version = yaml.safe_load((ROOT / "charts/phalanx/Chart.yaml").read_text())["appVersion"]
    assert build.TARGETS["operator"].tag("cpu") == f"{chart['image']['repository']}:{app_version}"
    for example in (ROOT / "examples").glob("tinygpt*.yaml"):
        assert f"image: {build.TARGETS['worker'].tag('cpu')}" in example.read_text()
    assert build.TARGETS["worker"].tag("cu126") == f"phalanx-worker:{__version__}-cu126"
    assert build.TARGETS["operator"].tag("cu126") == f"phalanx:{__version__}"
    assert [t.stage for t in build.targets_named("all")] == ["operator", "worker"]


def test_bud_builds_one_target_with_cached_layers_on_the_local_base_never_pulling() -> None:
    args = build.bud_args(build.TARGETS["operator"], options(), Path("/repo"))
    assert args[:5] == ["buildah", "bud", "--layers", "--force-rm", "--pull=false"]
    # runc runs the steps: crun (buildah's other runtime) refuses hosts with cgroups in hybrid mode.
    assert "--runtime=runc" in args
    assert flag_values(args, "--build-arg") == ["BASE_IMAGE=localhost/phalanx-base:key"]
    assert flag_values(args, "--target") == ["operator"]
    assert flag_values(args, "--tag") == [f"phalanx:{__version__}"]
    assert flag_values(args, "--file") == ["/repo/Dockerfile"]
    assert args[-1] == "/repo"
    # The operator has no torch: the worker's options never reach its build.
    assert args == build.bud_args(
        build.TARGETS["operator"],
        options(torch_index_url="http://i.invalid", wheels=Path("/w")),
        Path("/repo"),
    )


def test_the_worker_gets_its_torch_variant_index_and_wheel_folder() -> None:
    args = build.bud_args(build.TARGETS["worker"], options(), Path("/repo"))
    assert "TORCH_VARIANT=debian" in flag_values(args, "--build-arg")
    assert flag_values(args, "--tag") == [f"phalanx-worker:{__version__}"]
    assert "--volume" not in args and not any("TORCH_INDEX_URL" in a for a in args)
    args = build.bud_args(
        build.TARGETS["worker"],
        options(torch_variant="cu126", torch_index_url="http://i.invalid/cu126", wheels=Path("/opt/w")),
        Path("/repo"),
    )
    assert flag_values(args, "--build-arg") == [
        "BASE_IMAGE=localhost/phalanx-base:key",
        "TORCH_VARIANT=cu126",
        "TORCH_INDEX_URL=http://i.invalid/cu126",
        "WHEELS=/wheels",
    ]
    assert flag_values(args, "--volume") == ["/opt/w:/wheels:ro"]
    assert flag_values(args, "--tag") == [f"phalanx-worker:{__version__}-cu126"]


@pytest.mark.parametrize("variant", ["debian", "cpu", "cu118", "cu126", "cu130"])
def test_torch_variants_are_debian_cpu_or_cuda(variant: str) -> None:
    assert build.check_torch_variant(variant) == variant
    # Both CPU variants make the image the examples name; a CUDA one has its own tag.
    cuda = variant.startswith("cu")
    assert build.TARGETS["worker"].tag(variant).endswith(f"-{variant}") == cuda


@pytest.mark.parametrize("variant", ["cuda", "gpu", "cu12", "rocm6.2", "cpu ", "", "ubuntu"])
def test_other_torch_variants_are_refused(variant: str) -> None:
    with pytest.raises(UserFacingError, match="expected debian, pypi, cpu or a CUDA variant"):
        build.check_torch_variant(variant)


def test_archives_are_named_after_the_tag_in_the_cache() -> None:
    assert build.archive_path(Path("/c"), "phalanx-worker:0.1.0") == Path("/c/phalanx-worker-0.1.0.tar")


def test_the_import_goes_to_the_namespace_the_kubelet_reads() -> None:
    assert containerd.import_command(Path("/c/phalanx-0.1.0.tar")) == [
        "ctr",
        "--address",
        "/run/containerd/containerd.sock",
        "--namespace",
        "k8s.io",
        "images",
        "import",
        "/c/phalanx-0.1.0.tar",
    ]


def test_missing_packages_are_listed_in_one_line_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert packages.missing(installed=lambda name: name != "mmdebstrap") == ["mmdebstrap"]
    assert packages.missing(installed=lambda name: True) == []
    monkeypatch.setattr(packages, "missing", lambda names=packages.REQUIRED: list(names))
    monkeypatch.setattr(packages, "can_install", lambda: False)
    monkeypatch.setattr(packages.shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(UserFacingError) as raised:
        packages.ensure()
    message = str(raised.value)
    assert "\n" not in message
    assert "apt-get install buildah mmdebstrap runc" in message


def test_without_root_the_user_mapping_tools_are_needed_too() -> None:
    assert packages.required(is_root=True) == ("buildah", "mmdebstrap", "runc")
    assert packages.required(is_root=False) == ("buildah", "mmdebstrap", "runc", "uidmap")


def test_a_host_without_dpkg_is_told_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packages.shutil, "which", lambda name: None)
    with pytest.raises(UserFacingError, match="needs the Debian packages buildah mmdebstrap runc"):
        packages.ensure()


def test_bad_input_is_one_line_before_anything_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def never(*args: object) -> None:
        raise AssertionError("nothing may be installed or built on bad input")

    monkeypatch.setattr(packages, "ensure", never)
    assert main(["image", "build", "--torch", "cuda"]) == 2
    assert "expected debian, pypi, cpu or a CUDA variant" in capsys.readouterr().err
    assert main(["image", "build", "--wheels", str(tmp_path / "none")]) == 2
    assert "not a folder" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    assert main(["image", "build"]) == 2
    assert "no Phalanx checkout here" in capsys.readouterr().err
