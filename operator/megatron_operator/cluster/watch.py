"""Light watches of pods, progress Leases and nodes, feeding wake-ups to the job loops, and the
pod cache the reconciles read.

kopf runs every event through its full handler pipeline (a few milliseconds of Python each). A
1,024-pod gang produces ~4,000 pod events in seconds (created, bound, running, ...), and a big
cluster's nodes report in constantly; through kopf that starved the threads creating the pods.
Here a thread reads the raw watch stream, pulls out only the job name (pods) or the readiness
(nodes), and wakes the right job loop. The MegatronJobs themselves stay with kopf.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from megatron_operator.cluster.kube import Kube
from megatron_operator.core.backoff import Backoff
from megatron_operator.core.names import LABEL_JOB_NAME
from megatron_operator.core.observe import PodView, node_not_ready_since, pod_view

log = logging.getLogger(__name__)
WATCH_SECONDS = 300  # server-side timeout of one watch call; then it reconnects
WATCH_BACKOFF = Backoff(base=0.5, factor=2.0, cap=30.0, jitter=0.5)


class Watcher(threading.Thread):
    """List, then watch one kind forever (reconnecting from the last resourceVersion), calling
    `handle` with (event type, object) for every object listed and every event.

    `synced` is set once the initial list has been handled, as an informer's HasSynced: until
    then the cache is incomplete, and nothing may be concluded from what it lacks (a node the
    list has not delivered yet is not a lost node)."""

    def __init__(
        self,
        name: str,
        start_watch: Callable[[str | None], Any],
        handle: Callable[[str, dict[str, Any]], None],
        list_all: Callable[[], tuple[list[dict[str, Any]], str | None]] | None = None,
        on_synced: Callable[[], None] | None = None,
        replace: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.start_watch = start_watch
        self.handle = handle
        self.list_all = list_all
        self.on_synced = on_synced
        # A cache behind `handle` takes a (re)list whole: objects deleted while the watch was
        # down must go, and readers must never see it half filled.
        self.replace = replace
        self.stopping = threading.Event()
        self.synced = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        version: str | None = None
        failures = 0
        while not self.stopping.is_set():
            try:
                if version is None and self.list_all is not None:
                    version = self._list()
                version = self._stream(version)
                failures = 0
            except ApiException as exc:
                if exc.status == 410:  # our resourceVersion is too old: start over
                    version = None
                    continue
                failures += 1
                self._pause(failures, f"watch failed ({exc.status} {exc.reason})")
            except Exception as exc:  # network errors, a restarted apiserver: keep watching
                failures += 1
                self._pause(failures, f"watch interrupted ({exc})")

    def _pause(self, failures: int, why: str) -> None:
        """Back off (exponential, jittered, capped): a watch refused by RBAC must not hammer
        the apiserver every second, and many watches must not reconnect in step."""
        delay = WATCH_BACKOFF.delay(failures, random.random())
        level = logging.WARNING if failures <= 3 or failures % 10 == 0 else logging.DEBUG
        log.log(level, "%s: %s; retry %d in %.1fs", self.name, why, failures, delay)
        self.stopping.wait(delay)

    def _list(self) -> str | None:
        items, version = self.list_all() if self.list_all is not None else ([], None)
        if self.replace is not None:
            self.replace(items)
        else:
            for obj in items:
                self.handle("ADDED", obj)
        if not self.synced.is_set():
            self.synced.set()
            if self.on_synced is not None:
                self.on_synced()
        return version

    def _stream(self, version: str | None) -> str | None:
        resp = self.start_watch(version)
        buffer = b""
        try:
            for chunk in resp.stream(amt=None, decode_content=True):
                if self.stopping.is_set():
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        version = self._event(line) or version
        finally:
            resp.release_conn()
        if self.list_all is None:
            self.synced.set()  # a full watch period passed: whatever came is the state
        return version

    def _event(self, line: bytes) -> str | None:
        event = json.loads(line)
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            raise ApiException(status=code, reason=obj.get("reason"))
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if self.list_all is None:
                self.synced.set()
        elif kind in ("ADDED", "MODIFIED", "DELETED"):
            self.handle(kind, obj)
        return str(version) if version else None


def _state(exists: bool, not_ready_since: datetime | None) -> str:
    if not exists:
        return "absent"
    return "ready" if not_ready_since is None else "not-ready"


class NodeReadiness:
    """Node name → since when it is NotReady (None while Ready), from a node watch."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.on_change = on_change
        self.lock = threading.Lock()
        self.nodes: dict[str, datetime | None] = {}
        self.listed = False  # the initial list is in: from now on, changes wake the jobs

    def synced(self) -> None:
        """The initial list is in: wake every job once (not once per listed node)."""
        self.listed = True
        self.on_change()

    def handle(self, kind: str, node: dict[str, Any]) -> None:
        name = (node.get("metadata") or {}).get("name")
        if not name:
            return
        since = None if kind == "DELETED" else node_not_ready_since(node, datetime.now(UTC))
        with self.lock:
            before = _state(name in self.nodes, self.nodes.get(name))
            if kind == "DELETED":
                self.nodes.pop(name, None)
            else:
                self.nodes[name] = since
            after = _state(kind != "DELETED", since)
        # Heartbeats arrive all the time; only readiness changes matter.
        if before != after and self.listed:
            self.on_change()

    def lookup(self, node: str) -> tuple[bool, datetime | None]:
        with self.lock:
            if node not in self.nodes:
                return False, None
            return True, self.nodes[node]


def _job_of(obj: dict[str, Any]) -> tuple[str, str, str] | None:
    """(namespace, job, name) of an object carrying our job label."""
    meta = obj.get("metadata") or {}
    job = (meta.get("labels") or {}).get(LABEL_JOB_NAME)
    namespace, name = meta.get("namespace"), meta.get("name")
    if job and namespace and name:
        return str(namespace), str(job), str(name)
    return None


class PodCache:
    """Every pod with our job label, as the pod watches deliver them (PodViews, not whole pods):
    an informer's store. A reconcile reads its job's pods here instead of LISTing them: during a
    1,024-pod gang restart a job reconciles several times a second, and each LIST made the
    apiserver serialise, and this process parse, megabytes of pods on the same 2 cores.

    What it returns may lag the apiserver by the watch's delay, like any informer; the state
    machine is level-triggered and our creates and deletes are idempotent (a 409 on create is
    ours or a conflict; a delete carries the pod's uid), so a lag costs a repeated call, never a
    wrong one. Before a scope's first list is in, `pods` answers None and the caller LISTs: a
    pod missing from an incomplete cache would read as deleted."""

    def __init__(self, wake: Callable[[str, str], None]) -> None:
        self.wake = wake
        self.lock = threading.Lock()
        self.jobs: dict[tuple[str, str], dict[str, PodView]] = {}
        self.owner: dict[tuple[str, str], str] = {}  # (namespace, pod) → the job it is filed under
        self.listed: set[str | None] = set()  # scopes listed: a namespace, or None for all

    def handle(self, kind: str, obj: dict[str, Any]) -> None:
        key = _job_of(obj)
        if key is None:
            return
        namespace, job, name = key
        with self.lock:
            # A relabelled pod moves: it must not stay filed under its former job.
            before = self.owner.pop((namespace, name), None)
            if before is not None:
                self._drop(namespace, before, name)
            if kind != "DELETED":
                self.jobs.setdefault((namespace, job), {})[name] = pod_view(obj)
                self.owner[(namespace, name)] = job
        if before is not None and before != job:
            self.wake(namespace, before)
        self.wake(namespace, job)

    def _drop(self, namespace: str, job: str, name: str) -> None:
        pods = self.jobs.get((namespace, job))
        if pods is not None:
            pods.pop(name, None)
            if not pods:
                del self.jobs[(namespace, job)]

    def replace(self, scope: str | None, items: list[dict[str, Any]]) -> None:
        """A (re)list of one scope: swap its contents at once, then wake every job it touched."""
        fresh: dict[tuple[str, str], dict[str, PodView]] = {}
        for obj in items:
            key = _job_of(obj)
            if key is not None:
                fresh.setdefault(key[:2], {})[key[2]] = pod_view(obj)
        with self.lock:
            old = [k for k in self.jobs if scope is None or k[0] == scope]
            for k in old:
                for name in self.jobs.pop(k):
                    self.owner.pop((k[0], name), None)
            self.jobs.update(fresh)
            for (namespace, job), pods in fresh.items():
                for name in pods:
                    self.owner[(namespace, name)] = job
            self.listed.add(scope)
        for namespace, job in {*old, *fresh}:
            self.wake(namespace, job)

    def pods(self, namespace: str, job: str) -> list[PodView] | None:
        with self.lock:
            if None not in self.listed and namespace not in self.listed:
                return None
            return list(self.jobs.get((namespace, job), {}).values())


def _job_watchers(
    kind: str,
    start: Callable[[str | None, str | None, int], Any],
    list_all: Callable[[str | None], tuple[list[dict[str, Any]], str | None]],
    namespaces: list[str],
    wake: Callable[[str, str], None],
    cache: PodCache | None = None,
) -> list[Watcher]:
    """One watch per namespace (or one cluster-wide) of the objects carrying our job label."""

    def handle(event: str, obj: dict[str, Any]) -> None:
        key = _job_of(obj)
        if key is not None:
            wake(key[0], key[1])

    def watcher(name: str, namespace: str | None) -> Watcher:
        # Listed first, like the nodes: `synced` then means every existing object was seen,
        # which the readiness probe reports.
        return Watcher(
            name,
            lambda version: start(namespace, version, WATCH_SECONDS),
            cache.handle if cache is not None else handle,
            list_all=lambda: list_all(namespace),
            replace=(lambda items: cache.replace(namespace, items)) if cache is not None else None,
        )

    if not namespaces:
        return [watcher(kind, None)]
    return [watcher(f"{kind}/{ns}", ns) for ns in namespaces]


def pod_watchers(kube: Kube, namespaces: list[str], cache: PodCache) -> list[Watcher]:
    return _job_watchers("pods", kube.watch_pods, kube.list_all_pods, namespaces, cache.wake, cache)


def lease_watchers(
    kube: Kube, namespaces: list[str], wake: Callable[[str, str], None]
) -> list[Watcher]:
    """The progress Leases: a trainer's write wakes its job, so status.progress follows it and
    the hang deadline moves."""
    return _job_watchers("leases", kube.watch_leases, kube.list_all_leases, namespaces, wake)


def node_watcher(kube: Kube, readiness: NodeReadiness) -> Watcher:
    """Nodes are listed first: node-loss decisions wait for the whole list (`synced`)."""
    return Watcher(
        "nodes",
        lambda version: kube.watch_nodes(version, WATCH_SECONDS),
        readiness.handle,
        list_all=kube.list_nodes,
        on_synced=readiness.synced,
    )
