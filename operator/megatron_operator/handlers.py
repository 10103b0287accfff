"""kopf wiring (thin): one daemon per MegatronJob runs the reconcile loop; watch events only
wake it up. Decisions live in `reconcile`, API calls in `kube`.

Why a daemon per job rather than on.create/on.update handlers: the controller is level-triggered.
Events for the job, its pods and the nodes coalesce into one wake-up, and the daemon sleeps until
the next deadline (a backoff, a hang timeout, a TTL) or the next event, like a work queue.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf

from .api.job import GROUP, PLURAL, VERSION
from .controller import Controller
from .names import DOMAIN, FINALIZER
from .watch import NodeReadiness, Watcher, node_watcher, pod_watchers

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """Process-wide state, set by the CLI before kopf starts: one API client, one Controller."""

    controller: Controller | None = None
    namespaces: tuple[str, ...] = ()  # empty: the whole cluster
    nodes: NodeReadiness | None = None
    watchers: list[Watcher] = field(default_factory=list)


RUNTIME = Runtime()
# Reconciles run in threads (the API client is synchronous). asyncio's default pool has
# min(32, cores + 4) threads: far too few when hundreds of jobs are reconciled at once.
RECONCILE_WORKERS = 32
RECONCILE_POOL = ThreadPoolExecutor(max_workers=RECONCILE_WORKERS, thread_name_prefix="reconcile")
_wakeups: dict[tuple[str, str], asyncio.Event] = {}
DEBOUNCE_SECONDS = 0.05  # let a burst of pod events land before observing


def _wake(namespace: str | None, name: str | None) -> None:
    if namespace and name:
        event = _wakeups.get((namespace, name))
        if event is not None:
            event.set()


def _controller() -> Controller:
    if RUNTIME.controller is None:
        raise kopf.PermanentError("the operator was started without a controller")
    return RUNTIME.controller


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=DOMAIN)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=DOMAIN, key="last-handled-configuration"
    )
    settings.posting.enabled = False  # we post our own events, after each status write
    settings.execution.max_workers = 64
    settings.watching.server_timeout = 300
    # Our daemons exit as soon as they are told to stop; give them a moment to do so cleanly
    # rather than being cancelled mid-reconcile.
    settings.background.instant_exit_timeout = 2.0


@kopf.on.startup()
async def start_watches(**_: Any) -> None:
    """Pods and nodes are watched by light threads (watch.py), not through kopf."""
    controller = _controller()
    loop = asyncio.get_running_loop()

    def wake(namespace: str, name: str) -> None:
        loop.call_soon_threadsafe(_wake, namespace, name)

    def wake_all() -> None:
        loop.call_soon_threadsafe(_wake_all)

    RUNTIME.nodes = NodeReadiness(wake_all)
    RUNTIME.watchers = [
        *pod_watchers(controller.kube, list(RUNTIME.namespaces), wake),
        node_watcher(controller.kube, RUNTIME.nodes),
    ]
    for w in RUNTIME.watchers:
        w.start()


@kopf.on.cleanup()
def stop_watches(**_: Any) -> None:
    for w in RUNTIME.watchers:
        w.stop()


def _wake_all() -> None:
    for event in _wakeups.values():
        event.set()


_generations: dict[tuple[str, str], int | None] = {}


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_changed(
    type: str, namespace: str | None, name: str, meta: kopf.Meta, **_: Any
) -> None:
    # Wake only for a new spec (generation) or a deletion: our own status writes and kopf's
    # finalizer patches also arrive here, and reacting to them would double every reconcile.
    key = (namespace or "", name)
    generation = meta.get("generation")
    if type == "DELETED":
        _generations.pop(key, None)
        return
    if _generations.get(key) != generation:
        _generations[key] = generation
        _wake(namespace, name)


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
    stopped: kopf.DaemonStopped,
    **_: Any,
) -> None:
    controller = _controller()
    if namespace is None:
        raise kopf.PermanentError("MegatronJob is namespaced; got an object without a namespace")
    key = (namespace, name)
    wake = _wakeups.setdefault(key, asyncio.Event())
    loop = asyncio.get_running_loop()
    lookup = RUNTIME.nodes.lookup if RUNTIME.nodes is not None else None
    try:
        while not stopped:
            wake.clear()
            try:
                delay = await loop.run_in_executor(
                    RECONCILE_POOL,
                    functools.partial(controller.reconcile_job, namespace, name, lookup),
                )
            except Exception:  # never let one bad reconcile kill the loop; retry soon
                log.exception("reconcile of %s/%s failed; retrying", namespace, name)
                delay = 5.0
            if await _sleep(wake, stopped, max(delay, 0.05)):
                await asyncio.sleep(DEBOUNCE_SECONDS)
    finally:
        if _wakeups.get(key) is wake:
            del _wakeups[key]


@kopf.on.delete(GROUP, VERSION, PLURAL)
def cleanup(namespace: str | None, name: str, status: kopf.Status, **_: Any) -> None:
    """Delete every child now, rather than waiting for the garbage collector."""
    controller = _controller()
    controller.metrics.forget(namespace or "", name)
    if namespace is None or not status.get("startTime"):
        return  # never started (e.g. an invalid spec): it has no children
    controller.kube.delete_children(namespace, name)
