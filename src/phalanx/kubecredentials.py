"""Which credentials a Phalanx process uses to reach the API server, in the order client-go's loading rules
give: a kubeconfig named by `KUBECONFIG` first (named on purpose, so it wins), then the pod's service account,
then `~/.kube/config`.

Every Phalanx process that talks to the API server (the operator, kopf's login, the workers' heartbeats, the
drill) loads its credentials here, so they all agree on which identity they act as.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def source(env: Mapping[str, str]) -> str:
    """`kubeconfig` (named by `KUBECONFIG`), `in-cluster` (a pod's service account) or `default-kubeconfig`."""
    if env.get("KUBECONFIG"):
        return "kubeconfig"
    if env.get("KUBERNETES_SERVICE_HOST"):
        return "in-cluster"
    return "default-kubeconfig"


def load() -> str:
    """Configure the kubernetes client's default configuration; returns which source it used."""
    from kubernetes import config

    chosen = source(os.environ)
    if chosen == "in-cluster":
        try:
            config.load_incluster_config()
            return chosen
        except config.ConfigException:
            chosen = "default-kubeconfig"  # a service host without a token: not really a pod
    config.load_kube_config()
    return chosen
