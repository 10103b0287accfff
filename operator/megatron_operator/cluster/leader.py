"""Leader election for running more than one operator replica (`mjob operator --leader-elect`).

One replica leads and reconciles; the others wait until its Lease expires. The leader renews
every `renew` seconds; if it cannot renew for `deadline` seconds it stops leading (another
replica may already have taken over), and the process exits so that Kubernetes restarts it as a
standby. At a clean shutdown the leader hands the Lease back, so the next replica takes over in
about `retry` seconds instead of a whole lease duration: a rolling upgrade moves leadership fast.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from megatron_operator.cluster.errors import classify
from megatron_operator.cluster.kube import call, call_json
from megatron_operator.core.election import Record, may_take, read, released, spec_for

log = logging.getLogger(__name__)


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        duration: float = 15.0,
        deadline: float = 10.0,
        retry: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry < deadline < duration:
            raise ValueError("leader election needs retry < renew deadline < lease duration")
        self.api = kubernetes.client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration, self.deadline, self.retry = duration, deadline, retry
        self.clock = clock
        self.leading = threading.Event()
        self.lost = threading.Event()
        self._seen: tuple[Record | None, float] | None = None  # record, when first seen

    # --- one attempt
    def _get(self) -> dict[str, Any] | None:
        try:
            lease = call_json(self.api.read_namespaced_lease, self.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return lease if isinstance(lease, dict) else None

    def try_acquire_or_renew(self) -> bool:
        """One round: True when we hold the Lease afterwards."""
        lease = self._get()
        record = read(lease)
        now = self.clock()
        if self._seen is None or self._seen[0] != record:
            self._seen = (record, now)
        if not may_take(record, self.identity, self._seen[1], now):
            return False
        spec = spec_for(self.identity, record, self.duration, _stamp())
        try:
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": spec,
                }
                call(self.api.create_namespaced_lease, self.namespace, body)
            else:
                # Optimistic concurrency: the resourceVersion we read makes two replicas taking
                # an expired Lease at once end with one winner (the other gets a 409).
                lease["spec"] = {**(lease.get("spec") or {}), **spec}
                call(self.api.replace_namespaced_lease, self.name, self.namespace, lease)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    # --- the loops
    def acquire(self, stop: threading.Event) -> bool:
        """Block until we lead (True) or `stop` is set (False)."""
        announced = False
        while not stop.is_set():
            try:
                if self.try_acquire_or_renew():
                    log.info("leading (Lease %s/%s)", self.namespace, self.name)
                    self.leading.set()
                    return True
            except Exception as exc:
                err = classify(exc)
                if err is None:
                    raise
                log.warning("leader election: %s", err)
            if not announced:
                holder = read(self._get_quietly())
                log.info("standing by: %s leads", holder.holder if holder else "nobody")
                announced = True
            stop.wait(self.retry)
        return False

    def _get_quietly(self) -> dict[str, Any] | None:
        try:
            return self._get()
        except Exception:
            return None

    def keep(self, stop: threading.Event, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew in a daemon thread until `stop`; call `on_lost` if a renewal deadline passes."""

        def loop() -> None:
            last_ok = self.clock()
            while not stop.wait(self.retry):
                try:
                    if self.try_acquire_or_renew():
                        last_ok = self.clock()
                        continue
                    log.error("leader election: another replica took the Lease")
                except Exception as exc:
                    log.warning("leader election: renewal failed: %s", classify(exc) or exc)
                    if self.clock() - last_ok <= self.deadline:
                        continue
                    log.error("leader election: no renewal for %gs", self.deadline)
                self.leading.clear()
                self.lost.set()
                on_lost()
                return

        thread = threading.Thread(target=loop, name="leader-election", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Hand the Lease back (best effort) so that a standby takes over at once."""
        if not self.leading.is_set():
            return
        self.leading.clear()
        try:
            lease = self._get()
            spec = released(read(lease), self.identity, _stamp())
            if lease is None or spec is None:
                return
            lease["spec"] = {**(lease.get("spec") or {}), **spec}
            call(self.api.replace_namespaced_lease, self.name, self.namespace, lease)
            log.info("released the Lease %s/%s", self.namespace, self.name)
        except Exception as exc:
            log.warning("could not release the Lease: %s", classify(exc) or exc)
