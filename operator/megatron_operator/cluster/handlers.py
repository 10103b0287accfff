"""kopf wiring (thin): kopf watches the MegatronJobs and hands each event to `job_changed`,
which starts or wakes the job's reconcile loop (cluster/jobloops.py). Decisions live in
`reconcile`, API calls in `kube`.

kopf keeps no per-job body here: there is no daemon (kopf keeps a daemon's object for its life)
and no change handler, and the initial list is read in chunks. The pods, Leases and nodes are
watched by watch.py's light threads.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf

from megatron_operator.api.job import GROUP, PLURAL, VERSION
from megatron_operator.api.managedby import Manager, manager_of
from megatron_operator.cluster.controller import Controller, NodeLookup
from megatron_operator.cluster.health import Health
from megatron_operator.cluster.jobloops import JobLoops
from megatron_operator.cluster.leader import LeaderElector
from megatron_operator.cluster.ratelimit import WakeThrottle
from megatron_operator.cluster.watch import (
    NodeReadiness,
    PodCache,
    Watcher,
    lease_watchers,
    node_watcher,
    pod_watchers,
)
from megatron_operator.core.kueue import LABEL_QUEUE_NAME
from megatron_operator.core.names import DOMAIN, FINALIZER

log = logging.getLogger(__name__)


# Reconciles run in threads (the API client is synchronous). asyncio's default pool has
# min(32, cores + 4) threads: far too few when hundreds of jobs are reconciled at once.
RECONCILE_WORKERS = 32
LIST_CHUNK = 50  # MegatronJobs per page of kopf's initial list: a page of 1.5 MB jobs is 75 MB
HEARTBEAT_SECONDS = 5.0  # how often the loop and the reconcile pool report to /livez


@dataclass
class Runtime:
    """The operator's process-wide state, handed to every handler through kopf's `memo`
    (`memo.runtime`): one API client and Controller, the watches, the job loops' wake-ups and
    the reconcile pool. Made by `run`; its pools start and stop with the operator."""

    controller: Controller
    namespaces: tuple[str, ...] = ()  # empty: the whole cluster
    nodes: NodeReadiness | None = None
    watchers: list[Watcher] = field(default_factory=list)
    pool: ThreadPoolExecutor | None = None
    loops: JobLoops | None = None  # made at start-up, on kopf's asyncio loop
    # Per job, what wakes its loop when it changes: the spec's generation and the queue label (a
    # job held for its label, core/reconcile.py, starts when the label changes).
    generations: dict[tuple[str, str], tuple[int | None, str | None]] = field(default_factory=dict)
    health: Health = field(default_factory=Health)
    elector: LeaderElector | None = None  # None: no leader election (one replica)
    heartbeat: asyncio.Task[None] | None = None
    # A trainer's Lease writes wake its job at most this often (cluster/ratelimit.py).
    lease_wakes: WakeThrottle = field(default_factory=WakeThrottle)

    def synced(self) -> tuple[bool, str]:
        """Ready once every watch has listed what exists (the readiness probe)."""
        if not self.watchers:
            return False, "watches not started"
        waiting = [w.name for w in self.watchers if not w.synced.is_set()]
        if waiting:
            return False, f"waiting for the initial list of: {', '.join(waiting)}"
        return True, "ok: leading" if self.elector is not None else "ok"

    def wake(self, namespace: str | None, name: str | None) -> None:
        if namespace and name and self.loops is not None:
            self.loops.wake(namespace, name)

    def wake_all(self) -> None:
        if self.loops is not None:
            self.loops.wake_all()

    def wake_for_lease(self, namespace: str, name: str) -> None:
        """A Lease event: wake now, or once at the end of the job's throttle window."""
        key = (namespace, name)
        if self.loops is None or key not in self.loops:
            return
        delay = self.lease_wakes.admit(key)
        if delay == 0.0:
            self.wake(namespace, name)
        elif delay is not None:
            asyncio.get_running_loop().call_later(delay, self._wake_later, namespace, name)

    def _wake_later(self, namespace: str, name: str) -> None:
        self.lease_wakes.fired((namespace, name))
        self.wake(namespace, name)


def _runtime(memo: Any) -> Runtime:
    runtime = getattr(memo, "runtime", None)
    if not isinstance(runtime, Runtime):
        raise kopf.PermanentError("the operator was started without its runtime (use `run`)")
    return runtime


def run(runtime: Runtime) -> bool:
    """Run the operator in the foreground until it is stopped (SIGTERM, SIGINT). With leader
    election, wait for the Lease first. Returns False when leadership was lost (the caller exits
    non-zero, and Kubernetes restarts the process as a standby)."""
    stop = threading.Event()
    elector = runtime.elector
    metrics = runtime.controller.metrics
    metrics.leader.set(0 if elector is not None else 1)
    if elector is not None:
        runtime.health.readiness = lambda: (True, "standby: waiting for the leader Lease")
        metrics.ready.set(1)  # a healthy standby is ready, as /readyz says
        signals = _stop_on_signals(stop)
        try:
            if not elector.acquire(stop):
                return True  # stopped while standing by
        finally:
            _restore(signals)
        metrics.leader.set(1)
        # Losing the Lease stops kopf the way SIGTERM does. (kopf's `stop_flag` would do it
        # too, but a threading.Event flag parks a thread in asyncio's default executor, and
        # the loop's shutdown then waits for it forever.)
        elector.keep(stop, on_lost=lambda: os.kill(os.getpid(), signal.SIGTERM))
    try:
        kopf.run(
            clusterwide=not runtime.namespaces,
            namespaces=list(runtime.namespaces),
            standalone=True,
            memo=kopf.Memo(runtime=runtime),
        )
    finally:
        stop.set()  # ends the renewal thread before the Lease is handed back
        if elector is not None and not elector.lost.is_set():
            elector.release()
    return elector is None or not elector.lost.is_set()


def _stop_on_signals(stop: threading.Event) -> dict[int, Any]:
    """While standing by (before kopf installs its own handlers), SIGTERM/SIGINT end the wait."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, lambda *_: stop.set())
    return previous


def _restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # No MegatronJob gets a finalizer: no handler needs one, so deleting a job (or its
    # namespace) completes while the operator is down, and the garbage collector removes the
    # children. Naming the one older versions added lets kopf remove it from existing jobs.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=DOMAIN)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=DOMAIN, key="last-handled-configuration"
    )
    settings.posting.enabled = False  # we post our own events, after each status write
    settings.execution.max_workers = 64
    settings.watching.server_timeout = 300
    settings.watching.chunk_size = LIST_CHUNK
    # Client-side timeouts: a watch or a call on a half-open connection must fail, not hang.
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.connect_timeout = 10
    settings.networking.request_timeout = 60


@kopf.on.startup()
async def start(memo: kopf.Memo, **_: Any) -> None:
    """Start the reconcile pool, and the pod, Lease and node watches (light threads, watch.py)."""
    runtime = _runtime(memo)
    runtime.pool = ThreadPoolExecutor(max_workers=RECONCILE_WORKERS, thread_name_prefix="reconcile")
    runtime.loops = JobLoops(functools.partial(_step, runtime))
    loop = asyncio.get_running_loop()

    def wake(namespace: str, name: str) -> None:
        loop.call_soon_threadsafe(runtime.wake, namespace, name)

    def wake_all() -> None:
        loop.call_soon_threadsafe(runtime.wake_all)

    def wake_for_lease(namespace: str, name: str) -> None:
        loop.call_soon_threadsafe(runtime.wake_for_lease, namespace, name)

    kube = runtime.controller.kube
    runtime.nodes = NodeReadiness(wake_all)
    runtime.controller.pods = PodCache(wake)
    runtime.watchers = [
        *pod_watchers(kube, list(runtime.namespaces), runtime.controller.pods),
        *lease_watchers(kube, list(runtime.namespaces), wake_for_lease),
        node_watcher(kube, runtime.nodes),
    ]
    if runtime.controller.queues is not None:  # Kueue's admissions and evictions wake the job
        runtime.watchers += runtime.controller.queues.watchers(list(runtime.namespaces), wake)
    for w in runtime.watchers:
        w.start()
    runtime.health.readiness = runtime.synced
    runtime.health.expect("event-loop", "reconcile-pool")
    runtime.heartbeat = asyncio.create_task(_heartbeat(runtime))


async def _heartbeat(runtime: Runtime) -> None:
    """Report to /livez that the asyncio loop runs and that the reconcile pool takes work (a
    pool whose threads are all stuck would starve every job without any error)."""
    health = runtime.health
    metrics = runtime.controller.metrics
    while True:
        health.beat("event-loop")
        metrics.ready.set(1 if runtime.synced()[0] else 0)  # what /readyz says, for alerts
        if runtime.pool is not None:
            runtime.pool.submit(health.beat, "reconcile-pool")
        await asyncio.sleep(HEARTBEAT_SECONDS)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    runtime = _runtime(memo)
    if runtime.loops is not None:
        await runtime.loops.stop()
    if runtime.heartbeat is not None:
        runtime.heartbeat.cancel()
    for w in runtime.watchers:
        w.stop()
    if runtime.pool is not None:
        runtime.pool.shutdown(wait=False, cancel_futures=True)
    runtime.controller.kube.pool.shutdown(wait=False, cancel_futures=True)
    runtime.controller.kube.gang.shutdown()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_changed(
    type: str | None,
    namespace: str | None,
    name: str,
    uid: str | None,
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Start or wake the job's loop for a job seen for the first time (the initial list, a new
    job) or with a new spec (generation), and end it when the job is deleted. Our own status
    writes and kopf's finalizer patches also arrive here; reacting to them would double every
    reconcile, so they do not. A MultiKueue job is the exception: its status is the worker's,
    copied here by Kueue, and its Workload's PodsReady follows it."""
    runtime = _runtime(memo)
    if namespace is None or runtime.loops is None:
        return  # MegatronJob is namespaced; the loops exist once start-up ran
    key = (namespace, name)
    if type == "DELETED":
        runtime.generations.pop(key, None)
        runtime.lease_wakes.forget(key)
        runtime.loops.gone(namespace, name, uid)
        await cleanup(runtime, namespace, name, uid, status)
        return
    seen = (meta.get("generation"), (meta.get("labels") or {}).get(LABEL_QUEUE_NAME))
    mirrored = manager_of(spec.get("managedBy")) is Manager.MULTIKUEUE
    if key not in runtime.generations or runtime.generations[key] != seen or mirrored:
        runtime.generations[key] = seen
        runtime.loops.ensure(namespace, name, uid)


def _lookup(runtime: Runtime) -> NodeLookup | None:
    """Node readiness, but only once the node list is complete: before that, a pod's node
    missing from the cache says nothing (an operator restart must not restart jobs)."""
    node_watches = [w for w in runtime.watchers if w.name == "nodes"]
    synced = bool(node_watches) and all(w.synced.is_set() for w in node_watches)
    return runtime.nodes.lookup if runtime.nodes is not None and synced else None


async def _step(runtime: Runtime, namespace: str, name: str, uid: str | None) -> float:
    """One reconcile in the reconcile pool (the API client is synchronous)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        runtime.pool,
        functools.partial(runtime.controller.reconcile_job, namespace, name, _lookup(runtime), uid),
    )


async def cleanup(
    runtime: Runtime, namespace: str | None, name: str, uid: str | None, status: kopf.Status
) -> None:
    """After a job is deleted: delete the children it controlled now, rather than when the
    garbage collector gets to them (it discovers a new CRD kind only every 30 s). Only a
    speed-up; nothing depends on it."""
    controller = runtime.controller
    controller.forget(namespace or "", name)
    workload = status.get("workload")
    if controller.queues is not None and namespace and workload:
        # Not waiting for the GC; only if its controller is the deleted job.
        controller.queues.delete(namespace, str(workload), owner=uid or "")
    if namespace is None or not uid or not status.get("startTime"):
        return  # never started (e.g. an invalid spec): it has no children
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(
            runtime.pool, controller.kube.delete_children, namespace, name, uid
        )
    except Exception as exc:  # the garbage collector does it anyway
        log.warning("cleanup of %s/%s: %s; the garbage collector will do it", namespace, name, exc)
