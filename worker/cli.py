"""`phalanx worker ...`: the launcher, the rendezvous store and the restart hook from the phalanx command."""

from __future__ import annotations

import argparse
from typing import Any


def _launch(args: argparse.Namespace) -> int:
    from phalanx.worker.launch import launch_from_args

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
    from phalanx.worker.launch import add_arguments

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
