"""A pod's volumes on a machine where pods cannot have private mounts (`unshare` refused, as in some CI
sandboxes): every pod then sees the machine's one filesystem.

A mount there cannot put a pod's volume at its `mountPath` for that pod alone: a symlink at `/steplog` or at the
service-account folder would be shared by every pod, pointing at whichever pod made it first, and dangling once
that pod is gone (every later pod then lost its API credentials). Instead each container is told where its
volumes really are:
- every mount path in its command, arguments, environment and working directory is rewritten to the volume's
  folder on the machine (longest mount path first, whole path segments only);
- its service-account volume becomes a kubeconfig of its own, named by `KUBECONFIG`, which Phalanx's clients
  prefer (`phalanx.kubecredentials`), with the pod's own token and CA.
Programs that open a mount path they were not told about still miss it; on a machine with namespaces nothing
here is used.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from phalanx.devcluster.agent.volumes import SERVICE_ACCOUNT_DIR, Mount


def _normalized(path: str) -> str:
    return path.rstrip("/") or "/"


def rewriter(mounts: Sequence[Mount]) -> Callable[[str], str]:
    """A function of text that replaces each mount path appearing in it as a whole path (at its start or after a
    space, quote, `=` or `:`, and followed by `/` or the end of that path) with the volume's folder on the
    machine; the longest mount path wins."""
    sources = {_normalized(m.target): m.source for m in mounts if _normalized(m.target) != "/"}
    if not sources:
        return lambda text: text
    pattern = re.compile(
        r"(?<![^\s'\"=:,])("
        + "|".join(re.escape(target) for target in sorted(sources, key=len, reverse=True))
        + r")(?=/|$|[\s'\":,;)])"
    )
    return lambda text: pattern.sub(lambda match: sources[match.group(1)], text)


def rewrite(text: str, mounts: Sequence[Mount]) -> str:
    """`text` with its mount paths replaced (see `rewriter`)."""
    return rewriter(mounts)(text)


def rewrite_container(
    argv: Sequence[str], env: Mapping[str, str], working_dir: str | None, mounts: Sequence[Mount]
) -> tuple[list[str], dict[str, str], str | None]:
    """The container's command line, environment and working directory with its mount paths rewritten."""
    rewritten = rewriter(mounts)
    return (
        [rewritten(arg) for arg in argv],
        {name: rewritten(value) for name, value in env.items()},
        rewritten(working_dir) if working_dir else working_dir,
    )


def service_account_mount(mounts: Sequence[Mount]) -> Mount | None:
    """The mount that would put the pod's service account at its standard path."""
    for mount in mounts:
        if _normalized(mount.target) == SERVICE_ACCOUNT_DIR:
            return mount
    return None


def kubeconfig(account: Path, server_host: str, server_port: str) -> str:
    """A kubeconfig (JSON) for the API server as seen from the pod, acting as the pod's service account: its
    token (inline, and as `tokenFile`, which the kubernetes client re-reads) and the cluster CA."""
    host = f"[{server_host}]" if ":" in server_host else server_host
    namespace_file = account / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.exists() else "default"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "in-cluster",
                "cluster": {
                    "server": f"https://{host}:{server_port}",
                    "certificate-authority": str(account / "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": "service-account",
                "user": {
                    "token": (account / "token").read_text().strip(),
                    "tokenFile": str(account / "token"),
                },
            }
        ],
        "contexts": [
            {
                "name": "in-cluster",
                "context": {"cluster": "in-cluster", "user": "service-account", "namespace": namespace},
            }
        ],
        "current-context": "in-cluster",
    }
    return json.dumps(config, indent=2)
