"""The `phalanx` command. Each area registers its own subcommands; this module only assembles them."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from phalanx.errors import UserFacingError

# Modules exposing `register(subparsers)`; each adds its own subcommand(s).
_COMMAND_MODULES = (
    "phalanx.devcluster.cli",
    "phalanx.operator.cli",
    "phalanx.worker.cli",
    "phalanx.demo",
    "phalanx.drill",
    "phalanx.bench.cli",
    "phalanx.images.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="phalanx", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in _COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except UserFacingError as error:
        print(f"phalanx: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
