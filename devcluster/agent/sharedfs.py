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
from collections.abc import Mapping, Sequence
from pathlib import Path

from phalanx.devcluster.agent.volumes import SERVICE_ACCOUNT_DIR, Mount


def _normalized(path: str) -> str:
    return path.rstrip("/") or "/"


def rewrite(text: str, mounts: Sequence[Mount]) -> str:
    """`text` with each mount path that appears in it as a whole path (at its start or after a space, quote,
    `=` or `:`, and followed by `/` or the end of that path) replaced by the volume's folder on the machine."""
    targets = sorted(
        {_normalized(m.target): m.source for m in mounts if _normalized(m.target) != "/"}.items(),
        key=lambda item: len(item[0]),
        reverse=True,
    )
    if not targets:
        return text
    pattern = re.compile(
        r"(?<![^\s'\"=:,])(" + "|".join(re.escape(target) for target, _ in targets) + r")(?=/|$|[\s'\":,;)])"
    )
    sources = dict(targets)
    return pattern.sub(lambda match: sources[match.group(1)], text)


def rewrite_container(
    argv: Sequence[str], env: Mapping[str, str], working_dir: str | None, mounts: Sequence[Mount]
) -> tuple[list[str], dict[str, str], str | None]:
    """The container's command line, environment and working directory with its mount paths rewritten."""
    return (
        [rewrite(arg, mounts) for arg in argv],
        {name: rewrite(value, mounts) for name, value in env.items()},
        rewrite(working_dir, mounts) if working_dir else working_dir,
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
