"""`mjob operator`: run the operator in the foreground against the current kubeconfig."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import uuid
from typing import TYPE_CHECKING, Any

from megatron_operator.cli.common import EXIT_INVALID, CliError

if TYPE_CHECKING:  # imported lazily at run time: kopf and the client take a second to import
    from megatron_operator.cluster.kube import Kube
    from megatron_operator.cluster.workloads import Queues


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
    p.add_argument(
        "--metrics-bind-address",
        default="127.0.0.1",
        metavar="ADDR",
        help="address of the metrics port (default 127.0.0.1; 0.0.0.0 for all, which needs "
        "--metrics-auth kubernetes: the metrics name every tenant's jobs)",
    )
    p.add_argument(
        "--metrics-auth",
        choices=("auto", "kubernetes", "none"),
        default="auto",
        help="who may read /metrics: kubernetes (the caller's bearer token, through TokenReview "
        "and SubjectAccessReview on the non-resource URL /metrics), none (loopback only), or "
        "auto (kubernetes unless bound to loopback)",
    )
    p.add_argument(
        "--metrics-cert-dir",
        default=None,
        metavar="DIR",
        help="serve /metrics over HTTPS with DIR/tls.crt and DIR/tls.key",
    )
    p.add_argument(
        "--health-port", type=int, default=8081, help="port of /readyz and /livez (0: off)"
    )
    p.add_argument("--workers", type=int, default=32, help="concurrent API calls for pod gangs")
    p.add_argument(
        "--node-lost-grace-seconds",
        type=float,
        default=30.0,
        help="how long a node may be NotReady before its pods count as lost",
    )
    p.add_argument(
        "--leader-elect",
        action="store_true",
        help="run as one of several replicas: lead through a Lease, or stand by",
    )
    p.add_argument(
        "--leader-election-namespace",
        default=None,
        metavar="NS",
        help="namespace of the leader Lease (default: $POD_NAMESPACE)",
    )
    p.add_argument(
        "--leader-election-id",
        default="megatron-operator",
        metavar="NAME",
        help="name of the leader Lease",
    )
    p.add_argument(
        "--network-policy",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="give each job a NetworkPolicy admitting only its own pods (needs a network plugin "
        "that enforces NetworkPolicies, and the RBAC to create them); default: off",
    )
    p.add_argument(
        "--kueue",
        choices=("auto", "on", "off"),
        default="auto",
        help="queue jobs labelled kueue.x-k8s.io/queue-name through Kueue: auto (when the "
        "cluster serves Kueue's Workload API, checked once at start), on (required), off",
    )
    p.add_argument(
        "--claim-key-file",
        default=None,
        metavar="PATH",
        help="a secret key (32 bytes or more) sealing the checkpoint claims the operator retains "
        "after a job: a job re-created with the same name reuses only a claim whose seal checks "
        "out; without it, a retained claim is recognised by its labels",
    )
    p.add_argument(
        "--require-queue-label",
        action="store_true",
        help="hold every job that names no Kueue LocalQueue (label kueue.x-k8s.io/queue-name), "
        "so that nothing runs outside a queue's quota",
    )
    p.add_argument(
        "--job-defaults",
        default=None,
        metavar="FILE",
        help="defaults every job inherits (a MegatronJobDefaults spec, YAML or JSON: trainer "
        "image, env, tolerations, pod identity, ServiceAccount annotations, ...), under each "
        "namespace's MegatronJobDefaults and the job's own spec",
    )
    p.add_argument("--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_operator)


def _loopback(address: str) -> bool:
    return address in ("localhost", "::1") or address.startswith("127.")


def cmd_operator(args: argparse.Namespace) -> int:
    ports = (args.metrics_port, args.health_port)
    if not all(0 <= p <= 65535 for p in ports) or args.workers < 1:
        raise CliError(
            "--metrics-port and --health-port must be 0-65535 and --workers ≥ 1", EXIT_INVALID
        )
    if args.metrics_port and args.metrics_port == args.health_port:
        raise CliError("--metrics-port and --health-port must differ", EXIT_INVALID)
    metrics_auth = args.metrics_auth
    if metrics_auth == "auto":
        metrics_auth = "none" if _loopback(args.metrics_bind_address) else "kubernetes"
    if metrics_auth == "none" and not _loopback(args.metrics_bind_address):
        raise CliError(
            f"--metrics-auth none on {args.metrics_bind_address or 'every address'}: /metrics "
            "names every tenant's jobs, their loss and throughput; bind it to 127.0.0.1 or use "
            "--metrics-auth kubernetes",
            EXIT_INVALID,
        )
    lease_namespace = args.leader_election_namespace or os.environ.get("POD_NAMESPACE")
    if args.leader_elect and not lease_namespace:
        raise CliError(
            "--leader-elect needs --leader-election-namespace or $POD_NAMESPACE "
            "(the chart sets it from the downward API)",
            EXIT_INVALID,
        )
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # kopf logs every handler call at INFO: one line per pod event is noise at 1,000 pods.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # Imported here: kopf and the Kubernetes client take a second to import, and only this
    # sub-command needs them.
    from megatron_operator.cluster import handlers, health
    from megatron_operator.cluster.controller import Controller
    from megatron_operator.cluster.kube import Kube
    from megatron_operator.cluster.leader import LeaderElector
    from megatron_operator.cluster.metrics import Metrics
    from megatron_operator.core.reconcile import Settings

    job_defaults = _job_defaults(args.job_defaults) if args.job_defaults else None
    claim_key = _claim_key(args.claim_key_file) if args.claim_key_file else None
    kube = Kube.connect(workers=args.workers)
    kube.claim_key = claim_key
    if claim_key is None:
        logging.getLogger(__name__).warning(
            "no --claim-key-file: a retained checkpoint claim is reused by its labels, which "
            "anyone who may create claims in the namespace can set (the chart gives a key)"
        )
    queues = _queues(kube, args.kueue, tuple(args.namespace))
    metrics = Metrics()
    if args.require_queue_label and queues is None:
        raise CliError(
            "--require-queue-label needs the Kueue integration (--kueue on, the chart's "
            "kueue.enabled=true): without it every job would wait",
            EXIT_INVALID,
        )
    settings = Settings(
        node_lost_grace_seconds=args.node_lost_grace_seconds,
        network_policy=args.network_policy,
        without_kueue=queues is None,
        require_queue=args.require_queue_label,
        own_namespace=os.environ.get("POD_NAMESPACE") or None,  # in a pod (the chart sets it)
    )
    controller = Controller(kube, metrics, settings, queues=queues, job_defaults=job_defaults)
    runtime = handlers.Runtime(controller=controller, namespaces=tuple(args.namespace))
    if args.health_port:
        health.serve_health(args.health_port, runtime.health)
    if args.metrics_port:
        from megatron_operator.cluster.authn import TokenAuthorizer

        health.serve_metrics(
            args.metrics_port,
            metrics.registry,
            args.metrics_bind_address,
            TokenAuthorizer(kube.client) if metrics_auth == "kubernetes" else None,
            health.tls_context(args.metrics_cert_dir) if args.metrics_cert_dir else None,
        )
    if args.leader_elect:
        identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        runtime.elector = LeaderElector(
            kube.client, str(lease_namespace), args.leader_election_id, identity
        )
    if not handlers.run(runtime):
        logging.getLogger(__name__).error("lost the leader Lease: exiting to stand by again")
        return 1
    return 0


def _job_defaults(path: str) -> dict[str, Any]:
    """The --job-defaults file, validated as a MegatronJobDefaults spec."""
    from megatron_operator.api import SpecError
    from megatron_operator.cli.common import read_defaults

    try:
        return read_defaults([path])
    except SpecError as exc:
        problems = "; ".join(str(e) for e in exc.errors)
        raise CliError(f"--job-defaults {path}: {problems}", EXIT_INVALID) from None


def _claim_key(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            key = f.read().strip()
    except OSError as exc:
        raise CliError(f"--claim-key-file: cannot read {path}: {exc}", EXIT_INVALID) from None
    if len(key) < 32:
        raise CliError(
            f"--claim-key-file: {path} holds {len(key)} bytes; use 32 or more random bytes",
            EXIT_INVALID,
        )
    return key


def _queues(kube: Kube, mode: str, namespaces: tuple[str, ...]) -> Queues | None:
    """The Kueue integration (cluster.workloads.Queues), or None: `--kueue off`, or `auto` on a
    cluster that does not serve Kueue's v1beta2 Workloads (then a job naming a LocalQueue waits,
    its Admitted condition saying why: it never runs outside the queue's quota)."""
    from megatron_operator.cluster.workloads import Queues, kueue_installed, kueue_permitted

    log = logging.getLogger("megatron_operator.kueue")
    if mode == "off":
        log.info("Kueue integration off (--kueue off): jobs naming a LocalQueue wait")
        return None
    try:
        installed = kueue_installed(kube)
    except Exception as exc:  # unreachable apiserver, refused discovery: say so, no traceback
        raise CliError(
            f"--kueue {mode}: could not ask the apiserver whether Kueue is installed: {exc}",
            EXIT_INVALID,
        ) from None
    if installed:
        # Installed is not enough: without the rights (the chart's kueue.enabled=false) every
        # Workload call would be refused. `auto` then stays off and says why; `on` refuses.
        missing = kueue_permitted(kube, namespaces)
        if missing and mode == "on":
            raise CliError(
                f"--kueue on: the operator may not {', '.join(missing)}; grant Kueue's RBAC "
                "(the chart's kueue.enabled=true) or run with --kueue off",
                EXIT_INVALID,
            )
        if missing:
            log.warning(
                "Kueue is installed but the operator may not %s (--kueue auto): jobs naming a "
                "LocalQueue wait; grant the RBAC (the chart's kueue.enabled=true) to queue them",
                ", ".join(missing),
            )
            return None
        log.info("Kueue integration on: jobs labelled kueue.x-k8s.io/queue-name are queued")
        return Queues(kube)
    if mode == "on":
        raise CliError(
            "--kueue on: this cluster does not serve kueue.x-k8s.io/v1beta2 Workloads; install "
            "Kueue 0.16 or newer, or run with --kueue auto|off",
            EXIT_INVALID,
        )
    log.info("Kueue is not installed (--kueue auto): jobs naming a LocalQueue wait")
    return None
