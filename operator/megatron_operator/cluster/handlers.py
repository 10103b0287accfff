"""kopf wiring (thin): one daemon per MegatronJob runs the reconcile loop; watch events only
wake it up. Decisions live in `reconcile`, API calls in `kube`.

Why a daemon per job rather than on.create/on.update handlers: the controller is level-triggered.
Events for the job, its pods and the nodes coalesce into one wake-up, and the daemon sleeps until
the next deadline (a backoff, a hang timeout, a TTL) or the next event, like a work queue.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
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
from megatron_operator.cluster.leader import LeaderElector
from megatron_operator.cluster.watch import (
    NodeReadiness,
    PodCache,
    Watcher,
    lease_watchers,
    node_watcher,
    pod_watchers,
)
from megatron_operator.core.names import DOMAIN, FINALIZER

log = logging.getLogger(__name__)


# Reconciles run in threads (the API client is synchronous). asyncio's default pool has
# min(32, cores + 4) threads: far too few when hundreds of jobs are reconciled at once.
RECONCILE_WORKERS = 32
DEBOUNCE_SECONDS = 0.05  # let a burst of pod events land before observing
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
    wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)  # uids of deleted jobs: their loops end
    generations: dict[tuple[str, str], int | None] = field(default_factory=dict)
    health: Health = field(default_factory=Health)
    elector: LeaderElector | None = None  # None: no leader election (one replica)
    heartbeat: asyncio.Task[None] | None = None

    def synced(self) -> tuple[bool, str]:
        """Ready once every watch has listed what exists (the readiness probe)."""
        if not self.watchers:
            return False, "watches not started"
        waiting = [w.name for w in self.watchers if not w.synced.is_set()]
        if waiting:
            return False, f"waiting for the initial list of: {', '.join(waiting)}"
        return True, "ok: leading" if self.elector is not None else "ok"

    def wake(self, namespace: str | None, name: str | None) -> None:
        if namespace and name:
            event = self.wakeups.get((namespace, name))
            if event is not None:
                event.set()

    def wake_all(self) -> None:
        for event in self.wakeups.values():
            event.set()


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
    # No MegatronJob gets a finalizer (see _without_finalizers); naming the one older versions
    # added lets kopf remove it from existing jobs, so their deletion no longer needs us.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=DOMAIN)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=DOMAIN, key="last-handled-configuration"
    )
    settings.posting.enabled = False  # we post our own events, after each status write
    settings.execution.max_workers = 64
    settings.watching.server_timeout = 300
    # Client-side timeouts: a watch or a call on a half-open connection must fail, not hang.
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.connect_timeout = 10
    settings.networking.request_timeout = 60
    # Our daemons exit as soon as they are told to stop; give them a moment to do so cleanly
    # rather than being cancelled mid-reconcile.
    settings.background.instant_exit_timeout = 2.0


@kopf.on.startup()
async def start(memo: kopf.Memo, **_: Any) -> None:
    """Start the reconcile pool, and the pod, Lease and node watches (light threads, watch.py)."""
    runtime = _runtime(memo)
    runtime.pool = ThreadPoolExecutor(max_workers=RECONCILE_WORKERS, thread_name_prefix="reconcile")
    loop = asyncio.get_running_loop()

    def wake(namespace: str, name: str) -> None:
        loop.call_soon_threadsafe(runtime.wake, namespace, name)

    def wake_all() -> None:
        loop.call_soon_threadsafe(runtime.wake_all)

    kube = runtime.controller.kube
    runtime.nodes = NodeReadiness(wake_all)
    runtime.controller.pods = PodCache(wake)
    runtime.watchers = [
        *pod_watchers(kube, list(runtime.namespaces), runtime.controller.pods),
        *lease_watchers(kube, list(runtime.namespaces), wake),
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
def stop(memo: kopf.Memo, **_: Any) -> None:
    runtime = _runtime(memo)
    if runtime.heartbeat is not None:
        runtime.heartbeat.cancel()
    for w in runtime.watchers:
        w.stop()
    if runtime.pool is not None:
        runtime.pool.shutdown(wait=False, cancel_futures=True)
    runtime.controller.kube.pool.shutdown(wait=False, cancel_futures=True)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_changed(
    type: str,
    namespace: str | None,
    name: str,
    uid: str | None,
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    # Wake only for a new spec (generation) or a deletion: our own status writes and kopf's
    # finalizer patches also arrive here, and reacting to them would double every reconcile.
    # A MultiKueue job is the exception: its status is the worker's, copied here by Kueue, and
    # its Workload's PodsReady follows it.
    runtime = _runtime(memo)
    key = (namespace or "", name)
    generation = meta.get("generation")
    if type == "DELETED":
        runtime.generations.pop(key, None)
        if uid and key in runtime.wakeups:  # its loop still runs (it discards the uid)
            runtime.gone.add(uid)
        runtime.wake(namespace, name)  # its loop sees the uid gone and ends
        await cleanup(runtime, namespace, name, uid, status)
        return
    mirrored = manager_of(spec.get("managedBy")) is Manager.MULTIKUEUE
    if runtime.generations.get(key) != generation or mirrored:
        runtime.generations[key] = generation
        runtime.wake(namespace, name)


async def _sleep(wake: asyncio.Event, stopped: kopf.DaemonStopped, seconds: float) -> bool:
    """Sleep until woken (True), stopped or timed out (False)."""

    async def until_stopped() -> None:
        await stopped.wait()

    woken = asyncio.ensure_future(wake.wait())
    stopping = asyncio.ensure_future(until_stopped())
    done, pending = await asyncio.wait(
        {woken, stopping}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
    )
    for task in pending:
        task.cancel()
    return woken in done


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_backoff=5.0, cancellation_timeout=10.0)
async def run_job(
    namespace: str | None,
    name: str,
    uid: str | None,
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    runtime = _runtime(memo)
    controller = runtime.controller
    if namespace is None:
        raise kopf.PermanentError("MegatronJob is namespaced; got an object without a namespace")
    key = (namespace, name)
    wake = runtime.wakeups.setdefault(key, asyncio.Event())
    loop = asyncio.get_running_loop()

    def lookup() -> NodeLookup | None:
        """Node readiness, but only once the node list is complete: before that, a pod's node
        missing from the cache says nothing (an operator restart must not restart jobs)."""
        node_watches = [w for w in runtime.watchers if w.name == "nodes"]
        synced = bool(node_watches) and all(w.synced.is_set() for w in node_watches)
        return runtime.nodes.lookup if runtime.nodes is not None and synced else None

    try:
        while not stopped and uid not in runtime.gone:
            wake.clear()
            try:
                delay = await loop.run_in_executor(
                    runtime.pool,
                    functools.partial(controller.reconcile_job, namespace, name, lookup(), uid),
                )
                if math.isinf(delay):
                    return  # the job is gone: without a finalizer, kopf does not stop us
            except Exception:  # never let one bad reconcile kill the loop; retry soon
                log.exception("reconcile of %s/%s failed; retrying", namespace, name)
                delay = 5.0
            if await _sleep(wake, stopped, max(delay, 0.05)):
                await asyncio.sleep(DEBOUNCE_SECONDS)
    finally:
        if runtime.wakeups.get(key) is wake:
            del runtime.wakeups[key]
        runtime.gone.discard(uid or "")


def _without_finalizers(registry: Any) -> None:
    """No finalizer on MegatronJobs: deleting a job, or its namespace, completes while the
    operator is down, and the garbage collector removes the children through their
    ownerReferences. kopf puts a finalizer on every object that has a daemon, to stop the
    daemon before the object goes; ours ends by itself when its job is gone (run_job)."""
    spawning = registry._spawning
    spawning._handlers = [
        dataclasses.replace(h, requires_finalizer=False) for h in spawning._handlers
    ]


_without_finalizers(kopf.get_default_registry())


async def cleanup(
    runtime: Runtime, namespace: str | None, name: str, uid: str | None, status: kopf.Status
) -> None:
    """After a job is deleted: delete the children it controlled now, rather than when the
    garbage collector gets to them (it discovers a new CRD kind only every 30 s). Only a
    speed-up; nothing depends on it."""
    controller = runtime.controller
    controller.metrics.forget(namespace or "", name)
    workload = status.get("workload")
    if controller.queues is not None and namespace and workload:
        controller.queues.delete(namespace, str(workload))  # not waiting for the GC
    if namespace is None or not uid or not status.get("startTime"):
        return  # never started (e.g. an invalid spec): it has no children
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(
            runtime.pool, controller.kube.delete_children, namespace, name, uid
        )
    except Exception as exc:  # the garbage collector does it anyway
        log.warning("cleanup of %s/%s: %s; the garbage collector will do it", namespace, name, exc)
