"""One reconcile of one job: observe through `kube`, decide with `reconcile`, act through `kube`.

This is the imperative shell around the pure state machine. It applies an Outcome in the order
that makes a crash at any point safe (see reconcile.py): status, events, deletes, creates.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from megatron_operator.cluster.kube import Conflict, Kube, Rejected
from megatron_operator.cluster.metrics import Metrics
from megatron_operator.cluster.workloads import Queues
from megatron_operator.core.observe import parse_time, pod_view
from megatron_operator.core.reconcile import Outcome, Settings, World, reconcile

log = logging.getLogger(__name__)

# Node name → when it became NotReady (None while Ready); absent: no such node.
NodeLookup = Callable[[str], "tuple[bool, datetime | None]"]


API_RETRY_SECONDS = 5.0


def _api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "").get("message", ""))[:300]
    except (TypeError, ValueError, AttributeError):
        return str(exc.body or "")[:300]


def _now() -> datetime:
    return datetime.now(UTC)


class Controller:
    def __init__(
        self,
        kube: Kube,
        metrics: Metrics,
        settings: Settings | None = None,
        queues: Queues | None = None,
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.settings = settings or Settings()
        self.queues = queues  # None: the operator runs without Kueue

    def reconcile_job(self, namespace: str, name: str, nodes: NodeLookup | None = None) -> float:
        """Reconcile once; returns the seconds until the next reconcile is due."""
        started = time.perf_counter()
        try:
            return self._reconcile(namespace, name, nodes)
        except Conflict as exc:
            log.info("conflict, observing again: %s", exc)
            return 0.2
        except ApiException as exc:
            # The API said no (a terminating namespace, a quota, a webhook): not a bug of ours,
            # so a one-line warning, and the next reconcile tries again.
            log.warning(
                "%s/%s: the API refused a call (%s %s): %s; retrying in %gs",
                namespace,
                name,
                exc.status,
                exc.reason,
                _api_message(exc),
                API_RETRY_SECONDS,
            )
            return API_RETRY_SECONDS
        finally:
            self.metrics.reconcile.observe(time.perf_counter() - started)

    def _reconcile(self, namespace: str, name: str, nodes: NodeLookup | None) -> float:
        job = self.kube.get_job(namespace, name)
        if job is None:
            self.metrics.forget(namespace, name)
            return self.settings.resync_seconds
        if job["metadata"].get("deletionTimestamp"):
            return self.settings.resync_seconds  # the delete handler takes it from here
        raw_pods = self.kube.list_pods(namespace, name)
        pods = [pod_view(p) for p in raw_pods]
        raw_status = job.get("status")
        status: dict[str, Any] = raw_status if isinstance(raw_status, dict) else {}
        # The accepted spec lives in the ConfigMap, which exists once an attempt was launched.
        accepted = self.kube.accepted_spec(namespace, name) if "launchedAttempt" in status else None
        not_ready: dict[str, datetime] = {}
        known: set[str] | None = None
        if nodes is not None:
            known = set()
            for node in {p.node for p in pods if p.node}:
                exists, since = nodes(node)
                if exists:
                    known.add(node)
                if since is not None:
                    not_ready[node] = since
        world = World(
            job=job,
            pods=pods,
            now=_now(),
            not_ready_nodes=not_ready,
            known_nodes=frozenset(known) if known is not None else None,
            accepted_spec=accepted,
            queue=self.queues.observe(job) if self.queues is not None else None,
        )
        out = reconcile(world, self.settings)
        try:
            self._apply(job, out)
        except Rejected as exc:
            # Our own status write above moved the resourceVersion: read the job again, and
            # let the state machine fail it with the apiserver's reason.
            log.warning("%s/%s: the apiserver rejected its objects: %s", namespace, name, exc)
            fresh = self.kube.get_job(namespace, name)
            if fresh is None:
                return self.settings.resync_seconds
            out = reconcile(replace(world, job=fresh, rejection=str(exc)), self.settings)
            self._apply(fresh, out)
        return out.requeue_after

    def _apply(self, job: dict[str, object], out: Outcome) -> None:
        meta = job["metadata"]
        assert isinstance(meta, Mapping)
        namespace, name = str(meta["namespace"]), str(meta["name"])
        if out.status != job.get("status"):
            self.kube.replace_status(dict(job), out.status)
        now = _now()
        for event in out.events:  # posted in the background: events never hold up a reconcile
            self.kube.pool.submit(
                self.kube.event, dict(job), event.type, event.reason, event.message, now
            )
        if out.workload is not None and self.queues is not None:
            self.queues.act(namespace, out.workload, now)
        self.metrics.observe_status(namespace, name, out.status)
        if out.restart_reason is not None:
            self.metrics.restarts.labels(namespace, name, out.restart_reason).inc()
        if out.entered_running and out.status.get("restartAttempt") == 0:
            created = parse_time(meta.get("creationTimestamp"))
            if created is not None:
                self.metrics.time_to_running.observe((now - created).total_seconds())
        if out.delete_pods:
            log.info("%s/%s: deleting %d pods", namespace, name, len(out.delete_pods))
            self.kube.delete_pods(namespace, out.delete_pods)
        if out.create:
            pods = out.create_pods
            self.kube.ensure_children([o for o in out.create if o["kind"] != "Pod"])
            made = self.kube.create_pods(pods)
            attempt = out.status.get("restartAttempt")
            log.info("%s/%s: attempt %s: created %d pods", namespace, name, attempt, made)
        if out.delete_job:
            log.info("%s/%s: ttlSecondsAfterFinished passed: deleting the job", namespace, name)
            self.kube.delete_job(namespace, name)
