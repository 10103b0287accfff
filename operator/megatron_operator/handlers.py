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
from datetime import UTC, datetime
from typing import Any

import kopf

from .api.job import GROUP, PLURAL, VERSION
from .controller import Controller
from .names import DOMAIN, FINALIZER, LABEL_JOB_NAME
from .observe import node_not_ready_since

log = logging.getLogger(__name__)

# Set by the CLI before kopf starts (one API client and one Controller per process).
CONTROLLER: Controller | None = None
# Reconciles run in threads (the API client is synchronous). asyncio's default pool has
# min(32, cores + 4) threads: far too few when hundreds of jobs are reconciled at once.
RECONCILE_POOL = ThreadPoolExecutor(max_workers=32, thread_name_prefix="reconcile")
_wakeups: dict[tuple[str, str], asyncio.Event] = {}
DEBOUNCE_SECONDS = 0.05  # let a burst of pod events land before observing


def _wake(namespace: str | None, name: str | None) -> None:
    if namespace and name:
        event = _wakeups.get((namespace, name))
        if event is not None:
            event.set()


def _controller() -> Controller:
    if CONTROLLER is None:
        raise kopf.PermanentError("the operator was started without a controller")
    return CONTROLLER


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


@kopf.index("", "v1", "nodes")
def node_readiness(name: str, body: kopf.Body, **_: Any) -> dict[str, str | None]:
    """Node name → since when it is NotReady (None while Ready). Kept in memory by kopf."""
    since = node_not_ready_since(dict(body), datetime.now(UTC))
    return {name: since.isoformat() if since else None}


@kopf.on.event("", "v1", "nodes")
async def node_changed(type: str, body: kopf.Body, **_: Any) -> None:
    # A node that turns NotReady or disappears may hold pods of any job: wake them all.
    ready = node_not_ready_since(dict(body), datetime.now(UTC)) is None
    if type == "DELETED" or not ready:
        for event in _wakeups.values():
            event.set()


@kopf.on.event("", "v1", "pods", labels={LABEL_JOB_NAME: kopf.PRESENT})
async def pod_changed(namespace: str | None, labels: kopf.Labels, **_: Any) -> None:
    _wake(namespace, labels.get(LABEL_JOB_NAME))


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


def _node_lookup(index: kopf.Index[str, str | None]) -> Any:
    def lookup(node: str) -> tuple[bool, datetime | None]:
        store = index.get(node)
        if store is None:
            return False, None
        values = list(store)
        since = values[0] if values else None
        return True, datetime.fromisoformat(since) if since else None

    return lookup


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
    **kwargs: Any,
) -> None:
    node_readiness: kopf.Index[str, str | None] = kwargs["node_readiness"]
    controller = _controller()
    if namespace is None:
        raise kopf.PermanentError("MegatronJob is namespaced; got an object without a namespace")
    key = (namespace, name)
    wake = _wakeups.setdefault(key, asyncio.Event())
    loop = asyncio.get_running_loop()
    lookup = _node_lookup(node_readiness)
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
