"""One reconcile of one job: observe through `kube`, decide with `reconcile`, act through `kube`.

This is the imperative shell around the pure state machine. It applies an Outcome in the order
that makes a crash at any point safe (see reconcile.py): status, events, deletes, creates.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from megatron_operator.api.defaults import OPERATOR_SOURCE
from megatron_operator.api.managedby import Manager, manager_of_job
from megatron_operator.cluster.errors import ApiError, ErrorKind, classify
from megatron_operator.cluster.events import EventLimiter
from megatron_operator.cluster.guard import BugGuard
from megatron_operator.cluster.kube import ChildConflict, Conflict, Kube, Rejected
from megatron_operator.cluster.metrics import Metrics
from megatron_operator.cluster.ratelimit import ProgressLimiter
from megatron_operator.cluster.watch import PodCache
from megatron_operator.cluster.workloads import Queues
from megatron_operator.core.backoff import Backoff
from megatron_operator.core.defaults import Layer
from megatron_operator.core.multikueue import reconcile_dispatched
from megatron_operator.core.names import progress_lease_name
from megatron_operator.core.observe import PodView, lease_view, parse_time, pod_view
from megatron_operator.core.reconcile import Outcome, Settings, World, reconcile

log = logging.getLogger(__name__)

# Node name → when it became NotReady (None while Ready); absent: no such node.
NodeLookup = Callable[[str], "tuple[bool, datetime | None]"]
# The state machine (core.reconcile.reconcile); a test may hand in a double.
Decide = Callable[[World, Settings], Outcome]


# Consecutive transient failures (429, 5xx, no answer) before the job's owner is told.
TRANSIENT_BEFORE_CONDITION = 3
API_BACKOFF = Backoff(base=1.0, factor=2.0, cap=120.0, jitter=0.5)
# How long a create or delete we made is trusted while the pod cache has not shown it yet
# (a controller's "expectations"): a reconcile in between would otherwise repeat 1,024 calls.
EXPECT_SECONDS = 30.0


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Expectations:
    """A job's own recent creates and deletes, trusted for EXPECT_SECONDS while the pod cache
    has not shown them yet (a controller's "expectations"): a reconcile in between would
    otherwise repeat a gang's 1,024 calls."""

    deleted: dict[str, float] = field(default_factory=dict)  # pod uid → when (monotonic)
    created: dict[str, float] = field(default_factory=dict)  # pod name → when

    def forget(self, clock: float) -> None:
        """Drop what the cache must show by now (or never will: a failed call is retried)."""
        cutoff = clock - EXPECT_SECONDS
        self.deleted = {k: t for k, t in self.deleted.items() if t >= cutoff}
        self.created = {k: t for k, t in self.created.items() if t >= cutoff}

    def deleted_now(self, uids: Iterable[str | None]) -> None:
        clock = time.monotonic()
        self.deleted.update({u: clock for u in uids if u})

    def created_now(self, names: Iterable[str]) -> None:
        clock = time.monotonic()
        self.created.update({n: clock for n in names})

    def seen(self, pods: Iterable[PodView]) -> None:
        """The cache shows these pods: our creates of them are met. Kept, a create of a pod
        seen and then gone again (a spare deleted as it started) would wait out EXPECT_SECONDS
        before its pod is made again. One still deleting is an older pod of that name."""
        for x in pods:
            if not x.deleting:
                self.created.pop(x.name, None)


class Controller:
    def __init__(
        self,
        kube: Kube,
        metrics: Metrics,
        settings: Settings | None = None,
        backoff: Backoff = API_BACKOFF,
        queues: Queues | None = None,
        decide: Decide = reconcile,
        job_defaults: Mapping[str, Any] | None = None,
    ) -> None:
        self.kube = kube
        # The operator's own defaults (--job-defaults), under every namespace's MegatronJobDefaults.
        self.job_defaults = dict(job_defaults or {})
        self.decide = decide
        self.metrics = metrics
        self.settings = settings or Settings()
        self.backoff = backoff
        self.random = random.Random()
        # Per job: consecutive API failures, and the refusal shown on it (cleared by success).
        self.failures: dict[tuple[str, str], int] = {}
        self.refusals: dict[tuple[str, str], str] = {}
        self.queues = queues  # None: the operator runs without Kueue
        self.pods: PodCache | None = None  # the pod watches' cache; None: LIST every time
        # Per job, our own recent calls the cache may not show yet. One job reconciles in one
        # thread at a time, so each job's table is only ever touched by one thread.
        self.expected: dict[tuple[str, str], Expectations] = {}
        self.guard = BugGuard(metrics)  # exceptions of ours: backoff, metric, no pod touched
        self.progress = ProgressLimiter()  # progress copies into the status, per job
        self.events = EventLimiter()  # events aggregated and rate-limited, per job

    def reconcile_job(
        self, namespace: str, name: str, nodes: NodeLookup | None = None, uid: str | None = None
    ) -> float:
        """Reconcile once; returns the seconds until the next reconcile is due, or infinity
        when the job (with this uid, when given) no longer exists."""
        key = (namespace, name)
        started = time.perf_counter()
        try:
            delay = self._reconcile(namespace, name, nodes, uid)
            self.failures.pop(key, None)
            self.guard.succeeded(key)
            return delay
        except Conflict as exc:
            log.info("conflict, observing again: %s", exc)
            return 0.2
        except Exception as exc:
            err = classify(exc)
            if err is None:
                return self._bug(namespace, name, exc)
            return self._failed(namespace, name, err)
        finally:
            self.metrics.reconcile.observe(time.perf_counter() - started)

    def forget(self, namespace: str, name: str) -> None:
        """Drop what is kept about a deleted job (its metrics series too)."""
        key = (namespace, name)
        self.metrics.forget(namespace, name)
        for table in (self.expected, self.failures, self.refusals):
            table.pop(key, None)
        self.guard.forget(key)
        self.progress.forget(key)
        self.events.forget(key)

    def _bug(self, namespace: str, name: str, exc: Exception) -> float:
        """An exception of ours: back off and retry, loudly, and leave the job's pods alone
        (cluster/guard.py). A new error is also posted on the job as one Warning event."""
        delay, new = self.guard.failed((namespace, name), exc)
        if new:
            message = (
                f"the operator failed to reconcile this job ({type(exc).__name__}: {exc}); "
                f"its pods are left as they are, and it retries in {delay:.0f}s"
            )
            self._background(self._warn, namespace, name, "ReconcileError", message)
        return delay

    def _warn(self, namespace: str, name: str, reason: str, message: str) -> None:
        try:
            job = self.kube.get_job(namespace, name)
            if job is not None:
                self._post(job, "Warning", reason, message, _now())
        except Exception as exc:  # an event is best effort
            log.warning("%s/%s: could not post the %s event: %s", namespace, name, reason, exc)

    def _event(self, job: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Post an event in the background, aggregated and rate-limited (cluster/events.py)."""
        self._background(self._post, dict(job), type_, reason, message, _now())

    def _background(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self.kube.pool.submit(fn, *args)
        except RuntimeError:
            # The pool is shut down: the operator is stopping while a reconcile finishes. Its
            # event is dropped; what it reports is in the status, written before.
            log.info("stopping: an event was not posted")

    def _post(
        self, job: dict[str, Any], type_: str, reason: str, message: str, now: datetime
    ) -> None:
        meta = job["metadata"]
        key = (str(meta["namespace"]), str(meta["name"]))
        action, name, count = self.events.decide(key, type_, reason, message[:1024])
        if action == "count" and name is not None:
            self.kube.bump_event(key[0], name, count, now)
        elif action == "post":
            made = self.kube.event(job, type_, reason, message, now)
            if made is not None:
                self.events.posted(key, type_, reason, message[:1024], made)
        else:
            self.metrics.events_dropped.inc()

    def _failed(self, namespace: str, name: str, err: ApiError) -> float:
        """Back off (exponential, jittered, capped); a refusal that will not pass by itself
        goes on the job as a condition and an event, with the apiserver's message."""
        key = (namespace, name)
        self.metrics.api_errors.labels(str(err.kind)).inc()
        if err.kind == ErrorKind.CONFLICT:
            return 0.2
        failures = self.failures.get(key, 0) + 1
        self.failures[key] = failures
        delay = self.backoff.delay(failures, self.random.random(), err.retry_after or 0.0)
        log.warning(
            "%s/%s: the API refused a call (%s); retry %d in %.1fs",
            namespace,
            name,
            err,
            failures,
            delay,
        )
        if err.persistent or failures >= TRANSIENT_BEFORE_CONDITION:
            message = f"the apiserver refused the job's objects ({err})"
            if self.refusals.get(key) != message:
                self.refusals[key] = message
                self._show_refusal(namespace, name)
        return delay

    def _show_refusal(self, namespace: str, name: str) -> None:
        """Write the refusal condition now (status and events only, no other action)."""
        try:
            job = self.kube.get_job(namespace, name)
            if job is None:
                return
            # The real pods: the status written here must be the one a full reconcile would
            # write (an empty pod list would read as every pod gone).
            pods = [pod_view(p) for p in self.kube.list_pods(namespace, name, slim=True)]
            world = self._world(job, pods, None, self.kube.accepted_spec(namespace, name))
            out = self.decide(world, self.settings)
            self._write_status(job, out)
        except Exception as exc:  # best effort: the next reconcile tries again
            log.warning("%s/%s: could not report the refusal: %s", namespace, name, exc)

    def _pods(self, namespace: str, name: str) -> list[PodView]:
        """The job's pods: from the watch cache once it has listed them, else a LIST."""
        cached = self.pods.pods(namespace, name) if self.pods is not None else None
        if cached is not None:
            return cached
        return [pod_view(p) for p in self.kube.list_pods(namespace, name, slim=True)]

    def _world(
        self,
        job: dict[str, Any],
        pods: list[PodView],
        nodes: NodeLookup | None,
        accepted: Mapping[str, Any] | None,
    ) -> World:
        meta = job["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
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
        return World(
            job=job,
            pods=pods,
            now=_now(),
            not_ready_nodes=not_ready,
            known_nodes=frozenset(known) if known is not None else None,
            accepted_spec=accepted,
            refusal=self.refusals.get((namespace, name)),
            lease=lease_view(
                self.kube.get_lease(namespace, progress_lease_name(name)),
                meta.get("uid"),
            ),
            queue=self.queues.observe(job) if self.queues is not None else None,
            progress_not_before=self.progress.not_before((namespace, name)),
            defaults=self._defaults(job),
        )

    def _defaults(self, job: Mapping[str, Any]) -> tuple[Layer, ...] | None:
        """The defaults in the job's scope, only while it has recorded none and not started
        (one LIST per new job: core/reconcile.py records them in status.defaults)."""
        status = job.get("status")
        if isinstance(status, Mapping) and ("defaults" in status or "startTime" in status):
            return None
        namespace = str(job["metadata"]["namespace"])
        layers = [Layer(OPERATOR_SOURCE, self.job_defaults)] if self.job_defaults else []
        for obj in self.kube.list_job_defaults(namespace):
            spec = obj.get("spec")
            name = str((obj.get("metadata") or {}).get("name", ""))
            layers.append(Layer(f"{namespace}/{name}", spec if isinstance(spec, Mapping) else {}))
        return tuple(layers)

    def _reconcile(
        self, namespace: str, name: str, nodes: NodeLookup | None, uid: str | None
    ) -> float:
        job = self.kube.get_job(namespace, name)
        if job is None:
            self.forget(namespace, name)
            return math.inf
        if uid is not None and job["metadata"].get("uid") != uid:
            return math.inf  # deleted and re-created: the new job has its own loop
        if job["metadata"].get("deletionTimestamp"):
            return self.settings.resync_seconds  # the delete handler takes it from here
        if manager_of_job(job) is not Manager.OPERATOR:
            return self._run_elsewhere(job)
        pods = self._pods(namespace, name)
        expect = self.expected.get((namespace, name))
        if expect is not None:
            expect.seen(pods)
        raw_status = job.get("status")
        status: dict[str, Any] = raw_status if isinstance(raw_status, dict) else {}
        # The accepted spec lives in the ConfigMap, which exists once an attempt was launched.
        accepted = self.kube.accepted_spec(namespace, name) if "launchedAttempt" in status else None
        world = self._world(job, pods, nodes, accepted)
        out = self.decide(world, self.settings)
        if out.status.get("progress") not in (None, status.get("progress")):
            self.progress.copied((namespace, name), world.now)
        try:
            self._apply(job, out)
        except (Rejected, ChildConflict) as exc:
            # Our own status write above moved the resourceVersion: read the job again, and
            # let the state machine fail or hold it with the apiserver's reason or the conflict.
            log.warning("%s/%s: its objects cannot be created: %s", namespace, name, exc)
            fresh = self.kube.get_job(namespace, name)
            if fresh is None:
                return self.settings.resync_seconds
            if isinstance(exc, Rejected):
                world = replace(world, job=fresh, rejection=str(exc))
            else:
                world = replace(world, job=fresh, conflict=str(exc))
            out = self.decide(world, self.settings)
            self._apply(fresh, out)
        wrote = bool(out.create) or bool(out.delete_pods) or bool(out.force_delete)
        if wrote and self.refusals.pop((namespace, name), None) is not None:
            return min(out.requeue_after, 0.2)  # the next reconcile clears the condition
        return out.requeue_after

    def _run_elsewhere(self, job: dict[str, Any]) -> float:
        """A job whose spec.managedBy names another controller: no child, no pod. For
        MultiKueue only its Workload (core/multikueue.py); for anyone else nothing at all, and
        its loop ends (managedBy is immutable)."""
        meta = job["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        if manager_of_job(job) is not Manager.MULTIKUEUE or self.queues is None:
            log.info(
                "%s/%s: spec.managedBy names another controller; leaving it alone", namespace, name
            )
            return math.inf
        world = World(job=job, pods=[], now=_now(), queue=self.queues.observe(job))
        out = reconcile_dispatched(world, self.settings)
        self._write_status(job, out)
        if out.workload is not None:
            self.queues.act(namespace, out.workload, _now())
        if out.delete_job:
            log.info("%s/%s: ttlSecondsAfterFinished passed: deleting the job", namespace, name)
            self.kube.delete_job(namespace, name, job["metadata"].get("uid"))
        return out.requeue_after

    def _write_status(self, job: dict[str, Any], out: Outcome) -> None:
        meta = job["metadata"]
        if out.status != job.get("status"):
            self.kube.replace_status(dict(job), out.status)
        for event in out.events:  # posted in the background: events never hold up a reconcile
            self._event(job, str(event.type), event.reason, event.message)
        spec = job.get("spec")
        self.metrics.observe_status(
            str(meta["namespace"]),
            str(meta["name"]),
            out.status,
            spec if isinstance(spec, dict) else None,
        )

    def _apply(self, job: dict[str, Any], out: Outcome) -> None:
        meta = job["metadata"]
        assert isinstance(meta, Mapping)
        namespace, name = str(meta["namespace"]), str(meta["name"])
        self._write_status(job, out)
        now = _now()
        if out.workload is not None and self.queues is not None:
            self.queues.act(namespace, out.workload, now)
        if out.restart_reason is not None:
            rung = str(out.restart_rung or "")
            self.metrics.restarts.labels(namespace, name, out.restart_reason, rung).inc()
        if out.entered_running and out.status.get("restartAttempt") == 0:
            created = parse_time(meta.get("creationTimestamp"))
            if created is not None:
                self.metrics.time_to_running.observe((now - created).total_seconds())
        expect = self.expected.setdefault((namespace, name), Expectations())
        expect.forget(time.monotonic())
        deletes = [n for n in out.delete_pods if out.delete_uids.get(n) not in expect.deleted]
        if deletes:
            log.info("%s/%s: deleting %d pods", namespace, name, len(deletes))
            self.kube.delete_pods(namespace, deletes, out.delete_uids, job=name)
            expect.deleted_now(out.delete_uids.get(n) for n in deletes)
        if out.force_delete:  # already deleting, on a lost node: never held back
            log.warning(
                "%s/%s: force-deleting %d pods on lost nodes: %s",
                namespace,
                name,
                len(out.force_delete),
                ", ".join(out.force_delete[:5]),
            )
            self.kube.delete_pods(
                namespace, out.force_delete, out.delete_uids, force=True, job=name
            )
        # Rendered one at a time by the create calls (core/render.Pods), never all at once.
        pods = out.pods.without(expect.created) if out.pods is not None else None
        others = out.create
        uid = meta.get("uid")
        if others and not out.create_pods:  # an in-place release refreshes the config alone
            self.kube.ensure_children(others, uid)
        if pods:  # the other children go with them (get-or-create); not again for cached pods
            self.kube.ensure_children(others, uid)
            made = self.kube.create_pods(pods, uid)
            expect.created_now(pods.names)
            attempt = out.status.get("restartAttempt")
            log.info("%s/%s: attempt %s: created %d pods", namespace, name, attempt, made)
        if out.delete_job:
            log.info("%s/%s: ttlSecondsAfterFinished passed: deleting the job", namespace, name)
            self.kube.delete_job(namespace, name, meta.get("uid"))
