"""`phalanx dev ...`: a local Kubernetes cluster for trying and testing Phalanx."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

from phalanx.devcluster import binaries, controlplane
from phalanx.devcluster.kueue import build as kueue_build


def register(subparsers: argparse._SubParsersAction) -> None:
    dev = subparsers.add_parser("dev", help="a local cluster: real control plane, pods run as processes")
    commands = dev.add_subparsers(dest="dev_command", metavar="COMMAND", required=True)

    def with_state_dir(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument(
            "--state-dir",
            type=Path,
            default=controlplane.default_state_dir(),
            help="where the cluster keeps its data, logs and kubeconfig (default: %(default)s; env PHALANX_DEV_STATE_DIR)",
        )
        return parser

    up = with_state_dir(commands.add_parser("up", help="start the cluster (idempotent)"))
    up.add_argument("--nodes", type=int, default=4, help="nodes whose pods run as local processes")
    up.add_argument(
        "--simulated-nodes", type=int, default=0, help="nodes whose pods only pretend to run (scale tests)"
    )
    up.add_argument(
        "--gpus-per-node", type=int, default=0, help="advertise nvidia.com/gpu capacity on each node"
    )
    up.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        choices=(0, 1),
        help="a real node beside them: containerd, kubelet and kube-proxy on this host, pods in containers "
        "(needs root and `phalanx dev install --real-node`)",
    )
    up.add_argument(
        "--kueue",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"run Kueue {kueue_build.VERSION}'s controller with the cluster (remembered: --no-kueue stops it; "
        "built by `phalanx dev install`)",
    )
    up.set_defaults(handler=_up)

    down = with_state_dir(commands.add_parser("down", help="stop everything the cluster started"))
    down.add_argument(
        "--purge", action="store_true", help="also delete the state dir (etcd data, volumes, logs)"
    )
    down.set_defaults(handler=_down)

    status = with_state_dir(commands.add_parser("status", help="say what runs"))
    status.set_defaults(handler=lambda a: controlplane.status(a.state_dir))

    install = commands.add_parser(
        "install",
        help="find or build Kubernetes and etcd from their Go modules (once, about 10 minutes on 2 cores, every "
        "binary a real node needs included), and Kueue's controller (about 4 more); PHALANX_KUBE_VERSION "
        "picks another Kubernetes release",
    )
    install.add_argument("--force", action="store_true", help="build even if binaries are found")
    install.add_argument(
        "--real-node",
        action="store_true",
        help="also kubelet and kube-proxy, for a real node (always built from Go modules; for Debian's 1.20.2 "
        "about 12 more minutes the first time)",
    )
    install.set_defaults(handler=_install)

    kubectl = with_state_dir(commands.add_parser("kubectl", help="run the cluster's kubectl against it"))
    kubectl.add_argument("args", nargs=argparse.REMAINDER)
    kubectl.set_defaults(handler=_kubectl)


def _up(args: argparse.Namespace) -> int:
    controlplane.up(
        args.state_dir,
        args.nodes,
        args.simulated_nodes,
        args.gpus_per_node,
        real_nodes=args.real_nodes,
        kueue=args.kueue,
    )
    return 0


def _down(args: argparse.Namespace) -> int:
    controlplane.down(args.state_dir, purge=args.purge)
    return 0


def _install(args: argparse.Namespace) -> int:
    binaries.install(force=args.force, real_node=args.real_node)
    print(f"[phalanx install] Kueue {kueue_build.VERSION} (the pinned release) from Go modules", flush=True)
    kueue_build.build(binaries.cache_dir(), force=args.force)
    return 0


def _kubectl(args: argparse.Namespace) -> int:
    layout = controlplane.Layout(args.state_dir.resolve())
    env = {**os.environ, "KUBECONFIG": str(layout.kubeconfig)}
    argv = [a for a in args.args if a != "--"]
    return subprocess.call([str(layout.bin / "kubectl"), *argv], env=env)
