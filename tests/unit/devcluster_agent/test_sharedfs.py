"""A pod's volumes without mount namespaces: mount paths rewritten to the pod's own folders, the service account
as a kubeconfig of the pod's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phalanx import kubecredentials
from phalanx.devcluster import controlplane
from phalanx.devcluster.agent import sharedfs
from phalanx.devcluster.agent.volumes import SERVICE_ACCOUNT_DIR, Mount
from phalanx.errors import UserFacingError

MOUNTS = [
    Mount("/state/pods/u1/volumes/steplog", "/steplog", False),
    Mount("/state/pods/u1/volumes/ckpt", "/ckpt/", False),
    Mount("/state/pods/u1/volumes/inner", "/ckpt/local", False),
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/steplog", "/state/pods/u1/volumes/steplog"),
        ("/steplog/steps.jsonl", "/state/pods/u1/volumes/steplog/steps.jsonl"),
        ("--log-file=/steplog/a", "--log-file=/state/pods/u1/volumes/steplog/a"),
        (
            "echo hi > /steplog/x; cat '/ckpt/y'",
            "echo hi > /state/pods/u1/volumes/steplog/x; cat '/state/pods/u1/volumes/ckpt/y'",
        ),
        # The longest mount path wins: a volume mounted inside another.
        ("/ckpt/local/step-1", "/state/pods/u1/volumes/inner/step-1"),
        ("/ckpt/other", "/state/pods/u1/volumes/ckpt/other"),
        # Whole path segments only.
        ("/steplogs/x", "/steplogs/x"),
        ("/var/steplog", "/var/steplog"),
        ("s3://bucket/ckpt/x", "s3://bucket/ckpt/x"),
        ("/usr/bin:/steplog/bin", "/usr/bin:/state/pods/u1/volumes/steplog/bin"),
    ],
)
def test_mount_paths_become_the_pods_own_folders(text: str, expected: str) -> None:
    assert sharedfs.rewrite(text, MOUNTS) == expected


def test_command_environment_and_working_dir_are_rewritten_and_nothing_else() -> None:
    argv, env, working_dir = sharedfs.rewrite_container(
        ["python", "train.py", "--dir", "/ckpt"],
        {"PHALANX_CHECKPOINT_DIR": "/ckpt/local", "PATH": "/usr/bin", "NAME": "steplog"},
        "/steplog",
        MOUNTS,
    )
    assert argv == ["python", "train.py", "--dir", "/state/pods/u1/volumes/ckpt"]
    assert env == {
        "PHALANX_CHECKPOINT_DIR": "/state/pods/u1/volumes/inner",
        "PATH": "/usr/bin",
        "NAME": "steplog",
    }
    assert working_dir == "/state/pods/u1/volumes/steplog"
    assert sharedfs.rewrite_container(["a"], {}, None, []) == (["a"], {}, None)


def test_a_pods_service_account_becomes_its_own_kubeconfig(tmp_path: Path) -> None:
    account = tmp_path / "token-volume"
    account.mkdir()
    (account / "token").write_text("the-pods-token\n")
    (account / "ca.crt").write_text("CA")
    (account / "namespace").write_text("team-a")
    mounts = [*MOUNTS, Mount(str(account), SERVICE_ACCOUNT_DIR + "/", True)]
    assert sharedfs.service_account_mount(mounts) == mounts[-1]
    assert sharedfs.service_account_mount(MOUNTS) is None
    config = json.loads(sharedfs.kubeconfig(account, "10.96.0.1", "443"))
    (cluster,) = config["clusters"]
    assert cluster["cluster"] == {
        "server": "https://10.96.0.1:443",
        "certificate-authority": str(account / "ca.crt"),
    }
    (user,) = config["users"]
    assert user["user"] == {"token": "the-pods-token", "tokenFile": str(account / "token")}
    (context,) = config["contexts"]
    assert context["context"]["namespace"] == "team-a"
    assert config["current-context"] == context["name"]
    assert json.loads(sharedfs.kubeconfig(account, "fd00::1", "6443"))["clusters"][0]["cluster"][
        "server"
    ] == ("https://[fd00::1]:6443")


def test_a_named_kubeconfig_wins_over_the_service_account() -> None:
    assert (
        kubecredentials.source({"KUBECONFIG": "/k", "KUBERNETES_SERVICE_HOST": "10.96.0.1"}) == "kubeconfig"
    )
    assert kubecredentials.source({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) == "in-cluster"
    assert kubecredentials.source({}) == "default-kubeconfig"


@pytest.mark.parametrize(
    ("value", "flag"), [("off", ["--no-namespaces"]), ("ON", ["--namespaces"]), ("", []), (None, [])]
)
def test_the_agents_namespaces_follow_the_environment(value: str | None, flag: list[str]) -> None:
    env = {} if value is None else {controlplane.POD_NAMESPACES_ENV: value}
    assert controlplane.pod_namespaces_flag(env) == flag


def test_a_misspelt_namespaces_setting_is_refused() -> None:
    with pytest.raises(UserFacingError, match="PHALANX_DEV_POD_NAMESPACES"):
        controlplane.pod_namespaces_flag({controlplane.POD_NAMESPACES_ENV: "maybe"})
