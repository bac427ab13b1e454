"""`phalanx operator run` and `phalanx crd`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from phalanx.checkout import find_checkout
from phalanx.errors import UserFacingError
from phalanx.operator import crd, podschema
from phalanx.operator.settings import settings_from


def _run(args: argparse.Namespace) -> int:
    from phalanx.operator import main  # kopf is imported only when the operator really runs

    overrides = {
        "namespaces": args.namespace or None,
        "peering": args.peering,
        "priority": args.priority,
        "metrics_port": args.metrics_port,
        "liveness_port": args.liveness_port,
        "bind_host": args.bind_host,
        "log_level": args.log_level,
    }
    return main.run(settings_from(os.environ, overrides))


def _checkout_root(args: argparse.Namespace) -> Path:
    root = Path(args.root) if args.root else find_checkout(Path.cwd())
    if root is None:
        raise UserFacingError(
            "--write and --pod-schema update files of a Phalanx checkout: run it inside one or pass --root "
            "(without either the CRD is printed)"
        )
    if not (root / "charts").is_dir():
        raise UserFacingError(f"{root} is not a Phalanx checkout (no charts/): pass --root")
    return root


def _crd(args: argparse.Namespace) -> int:
    if args.pod_schema:
        openapi = Path(args.pod_schema)
        if not openapi.is_file():
            raise UserFacingError(
                f"{openapi} is not there: pass the core API's OpenAPI v3 document, {podschema.OPENAPI_FILE} of "
                "the k8s.io/kubernetes module (under ~/.cache/phalanx/go/mod after `phalanx dev install`)"
            )
        print(f"wrote {podschema.write(openapi, _checkout_root(args) / 'operator' / podschema.SCHEMA_FILE)}")
        podschema.load.cache_clear()
    if args.apply:
        from phalanx import assets
        from phalanx.operator import crdapply

        for line in crdapply.apply_to_cluster(assets.crds_dir()):
            print(line)
        return 0
    if args.write or args.pod_schema:
        for path in crd.write_crd(_checkout_root(args)):
            print(f"wrote {path}")
        return 0
    sys.stdout.write(crd.render_crd())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    operator = subparsers.add_parser("operator", help="the TrainingJob operator")
    commands = operator.add_subparsers(dest="operator_command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run", help="run the operator (settings from PHALANX_OPERATOR_* variables, overridden by these flags)"
    )
    run.add_argument("--namespace", action="append", help="watch this namespace (repeatable; default: all)")
    run.add_argument("--peering", help="peering name shared by the operator's replicas (default: standalone)")
    run.add_argument("--priority", type=int, help="peering priority of this replica")
    run.add_argument("--metrics-port", type=int, help="Prometheus port (0: off)")
    run.add_argument("--liveness-port", type=int, help="liveness endpoint port (0: off)")
    run.add_argument("--bind-host", help="address of the metrics and liveness endpoints")
    run.add_argument("--log-level", help="Python log level")
    run.set_defaults(handler=_run)

    generate = subparsers.add_parser("crd", help="print the TrainingJob CRD generated from the API model")
    generate.add_argument("--write", action="store_true", help="write it into crds/ and charts/phalanx/crds/")
    generate.add_argument(
        "--root", help="repository root for --write (default: the checkout around the working directory)"
    )
    generate.add_argument(
        "--apply",
        action="store_true",
        help="install or upgrade the CRDs on the cluster your kubeconfig points at (server-side apply, then wait "
        "until served): run it before `helm upgrade`, which never upgrades a chart's CRDs",
    )
    generate.add_argument(
        "--pod-schema",
        metavar="OPENAPI_JSON",
        help="regenerate the embedded PodTemplateSpec schema (operator/podtemplatespec.json) from a Kubernetes "
        "release's OpenAPI v3 document of the core API (api/openapi-spec/v3/api__v1_openapi.json), and the CRD",
    )
    generate.set_defaults(handler=_crd)
