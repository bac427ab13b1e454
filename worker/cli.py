"""`phalanx worker ...`: the launcher, the rendezvous store and the restart hook from the phalanx command.

Torch-free at import: every `phalanx` command (the operator's too) builds this parser, and the launcher's
modules load torch only when a command needs them."""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--rdzv-endpoint", help="host:port of the rendezvous store (env PHALANX_RDZV_ENDPOINT)")
    add(
        "--rdzv-protocol",
        dest="rdzv_protocol",
        choices=["c10d", "rounds"],
        help="c10d: torch's rendezvous; rounds: rounds decided in the store (env PHALANX_RDZV_PROTOCOL)",
    )
    add("--rdzv-id", dest="run_id", help="rendezvous id (env PHALANX_JOB_UID)")
    add("--nnodes", help="N or MIN:MAX launchers (env PHALANX_MIN_NODES, PHALANX_MAX_NODES)")
    add("--max-nodes-file", help="file with the desired active nodes, polled (env PHALANX_MAX_NODES_FILE)")
    add("--job-file", help="JSON file standing in for the TrainingJob, read on change (env PHALANX_JOB_FILE)")
    add("--nproc-per-node", type=int, help="training processes per launcher (env PHALANX_NPROC_PER_NODE)")
    add("--role", choices=["worker", "spare"], help="spare: join as a standby (env PHALANX_ROLE)")
    add("--max-restarts", type=int, help="restart budget after failures (default 1000)")
    add("--max-failures-without-progress", type=int, help="consecutive step-less failures before exit 1")
    add("--join-timeout", type=float, help="seconds for a rendezvous round to form (default 120)")
    add("--last-call-timeout", type=float, help="seconds to wait for more nodes after min (default 1)")
    add("--keepalive-interval", type=float, help="seconds between rendezvous keep-alives (default 1)")
    add("--keepalive-timeout", type=float, help="seconds until a silent node is dropped (default 5)")
    add("--store-timeout", type=float, help="seconds one store operation may take (default 15)")
    add("--monitor-interval", type=float, help="seconds between checks of the workers (default 0.2)")
    add("--shutdown-grace", type=float, help="seconds workers get to save after SIGTERM (default 30)")
    add("--local-addr", help="address this node advertises (env POD_IP, default 127.0.0.1)")
    add("--metrics-port", type=int, help="Prometheus port, 0 off (env PHALANX_METRICS_PORT)")
    add("--heartbeat-interval", type=float, help="seconds between Lease renewals")
    add("--collective-timeout", type=float, help="seconds a rank may sit in one collective")
    add(
        "--no-warm-start",
        dest="warm_start",
        action="store_const",
        const=False,
        help="start every training process cold (env PHALANX_WARM_START=false)",
    )
    add(
        "--no-live-regroup",
        dest="live_regroup",
        action="store_const",
        const=False,
        help="restart the training processes at every regroup (env PHALANX_LIVE_REGROUP=false)",
    )
    add("--verbose", action="store_true", help="show torchrun's own logs")
    add("command", nargs=argparse.REMAINDER, help="-- then the training command")


def _launch(args: argparse.Namespace) -> int:
    from phalanx.errors import UserFacingError
    from phalanx.worker.torch_support import UnsupportedTorchError

    try:
        from phalanx.worker.launch import launch_from_args
    except UnsupportedTorchError as error:
        # `phalanx` reports it in one line with exit code 2, the launcher's own code for a bad setup.
        raise UserFacingError(str(error)) from None
    return launch_from_args(args)


def _rendezvous(args: argparse.Namespace) -> int:
    from phalanx.worker.rendezvous import main

    return main(["--host", args.host, "--port", str(args.port)])


def _restart_group(args: argparse.Namespace) -> int:
    from phalanx.errors import UserFacingError
    from phalanx.worker.rendezvous import connect, request_restart

    host, _, port = args.endpoint.rpartition(":")
    try:
        store = connect(host, int(port), timeout=args.timeout)
    except Exception as error:
        raise UserFacingError(f"cannot reach the rendezvous store {args.endpoint}: {error}") from None
    print(f"restart epoch is now {request_restart(store)}")
    return 0


def register(subparsers: Any) -> None:
    worker = subparsers.add_parser("worker", help="run training under the Phalanx launcher")
    commands = worker.add_subparsers(dest="worker_command", metavar="COMMAND", required=True)

    launch = commands.add_parser("launch", help="run a training command under the elastic launcher")
    add_arguments(launch)
    launch.set_defaults(handler=_launch)

    store = commands.add_parser("rendezvous", help="serve a job's rendezvous store")
    store.add_argument("--host", default="0.0.0.0")
    store.add_argument("--port", type=int, default=29400)
    store.set_defaults(handler=_rendezvous)

    restart = commands.add_parser("restart-group", help="make every launcher of a job re-rendezvous now")
    restart.add_argument("endpoint", help="host:port of the job's rendezvous store")
    restart.add_argument("--timeout", type=float, default=5.0)
    restart.set_defaults(handler=_restart_group)
