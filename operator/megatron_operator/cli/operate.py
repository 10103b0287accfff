"""`mjob operator`: run the operator in the foreground against the current kubeconfig."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from megatron_operator.cli.common import EXIT_INVALID, CliError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "operator",
        help="run the operator in the foreground (cluster-wide unless --namespace is given)",
    )
    p.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch only this namespace (repeatable); default: all namespaces",
    )
    p.add_argument("--metrics-port", type=int, default=8080, help="Prometheus port (0: off)")
    p.add_argument("--workers", type=int, default=32, help="concurrent API calls for pod gangs")
    p.add_argument(
        "--node-lost-grace-seconds",
        type=float,
        default=30.0,
        help="how long a node may be NotReady before its pods count as lost",
    )
    p.add_argument(
        "--network-policy",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="give each job a NetworkPolicy admitting only its own pods (needs a network plugin "
        "that enforces NetworkPolicies, and the RBAC to create them); default: off",
    )
    p.add_argument("--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_operator)


def cmd_operator(args: argparse.Namespace) -> int:
    if args.metrics_port < 0 or args.workers < 1:
        raise CliError("--metrics-port must be ≥ 0 and --workers ≥ 1", EXIT_INVALID)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # kopf logs every handler call at INFO: one line per pod event is noise at 1,000 pods.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # Imported here: kopf and the Kubernetes client take a second to import, and only this
    # sub-command needs them.
    from megatron_operator.cluster import handlers
    from megatron_operator.cluster.controller import Controller
    from megatron_operator.cluster.kube import Kube
    from megatron_operator.cluster.metrics import Metrics
    from megatron_operator.core.reconcile import Settings

    metrics = Metrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    settings = Settings(
        node_lost_grace_seconds=args.node_lost_grace_seconds, network_policy=args.network_policy
    )
    controller = Controller(Kube.connect(workers=args.workers), metrics, settings)
    handlers.run(handlers.Runtime(controller=controller, namespaces=tuple(args.namespace)))
    return 0
