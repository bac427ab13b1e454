"""`phalanx crd --apply`: a forced server-side apply of each CRD, then a wait until the API server serves it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phalanx import assets
from phalanx.errors import UserFacingError
from phalanx.operator import crdapply


def test_the_shipped_crds_are_what_is_applied() -> None:
    names = [document["metadata"]["name"] for document in crdapply.crd_documents(assets.crds_dir())]
    assert "trainingjobs.phalanx.dev" in names and len(names) == len(set(names))


def test_each_crd_is_applied_server_side_then_waited_for(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: things.x.dev}\n"
        "spec: {versions: [{name: v1, served: true}]}\n---\nkind: ConfigMap\nmetadata: {name: other}\n"
    )
    calls: list[tuple[str, str, str | None]] = []
    answers = iter([{}, {}, {"type": "Established", "status": "True"}])

    def call(method: str, path: str, body: Any, content_type: str | None) -> dict[str, Any]:
        calls.append((method, path, content_type))
        condition = next(answers)
        return {
            "metadata": {"name": "things.x.dev", "generation": 3},
            "spec": {"versions": [{"name": "v1", "served": True}, {"name": "v0", "served": False}]},
            "status": {"conditions": [condition] if condition else []},
        }

    said = crdapply.apply(crdapply.crd_documents(tmp_path), call, sleep=lambda _: None)
    assert said == ["applied things.x.dev (serving v1; generation 3)"]
    assert calls[0] == (
        "PATCH",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/things.x.dev?fieldManager=phalanx&force=true",
        "application/apply-patch+yaml",
    )
    assert [method for method, _, _ in calls[1:]] == ["GET", "GET"]


def test_a_crd_never_established_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("kind: CustomResourceDefinition\nmetadata: {name: things.x.dev}\n")
    moments = iter([0.0, 30.0, 61.0, 62.0])

    def call(method: str, path: str, body: Any, content_type: str | None) -> dict[str, Any]:
        return {"metadata": {"name": "things.x.dev", "generation": 1}, "spec": {"versions": []}}

    with pytest.raises(UserFacingError, match="not Established after 60 s"):
        crdapply.apply(
            crdapply.crd_documents(tmp_path), call, clock=lambda: next(moments), sleep=lambda _: None
        )
    with pytest.raises(UserFacingError, match="no CustomResourceDefinition"):
        crdapply.crd_documents(tmp_path / "missing")
