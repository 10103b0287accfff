"""Rank 0's progress reports (contract §4): a stdout line, a JSON-lines file, the job's Lease.

Reporting must never stop or slow training: the Lease write runs on a background thread with a
short timeout, only the newest pending report is sent, and every failure is logged and dropped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from megatron_contract import tiers
from megatron_contract.timeline import KEY as CLOCK_KEY
from megatron_contract.timeline import Clock

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
STDOUT_PREFIX = "MEGATRON_PROGRESS "


@dataclass(frozen=True)
class Report:
    iteration: int
    loss: float | None
    tokens_per_second: float | None
    mfu: float | None
    checkpoint_iteration: int | None
    clock: Clock | None = None  # where this process's time went (the goodput ledger's facts)
    restored: tuple[str, int | None] | None = None  # the tier and step this attempt resumed from

    def to_json(self, attempt: int, now: datetime | None = None) -> str:
        """The record; `attempt` (the restart attempt) lets the operator ignore late writes of
        an older attempt's pods."""
        stamp = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
        body: dict[str, Any] = {
            "attempt": attempt,
            "iteration": self.iteration,
            "loss": _finite(self.loss),
            "tokensPerSecond": _rounded(self.tokens_per_second, 1),
            "mfu": _rounded(self.mfu, 4),
            "checkpointIteration": self.checkpoint_iteration,
            "time": stamp,
        }
        if self.clock is not None:
            body[CLOCK_KEY] = self.clock.to_json()
        if self.restored is not None:
            body[tiers.KEY] = tiers.restored_json(*self.restored)
        return json.dumps(body, separators=(",", ":"))


def _finite(value: float | None) -> float | None:
    # JSON has no NaN/Infinity; a diverged loss is reported as null rather than breaking parsers.
    return value if value is not None and math.isfinite(value) else None


def _rounded(value: float | None, digits: int) -> float | None:
    value = _finite(value)
    return None if value is None else round(value, digits)


def _micro_time(now: datetime) -> str:
    """A Kubernetes MicroTime, the format of a Lease's renewTime."""
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record_attempt(text: object) -> int | None:
    try:
        attempt = json.loads(text).get("attempt") if isinstance(text, str) else None
    except (ValueError, AttributeError):
        return None
    return attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None


class LeaseWriter:
    """Writes rank 0's record to the job's progress Lease, from a background thread.

    Each write reads the Lease and updates it with its resourceVersion: the record goes into an
    annotation, `spec.holderIdentity` names this pod and `spec.renewTime` is the heartbeat. A
    Lease already holding a record of a later restart attempt is left alone, so a pod of an old
    attempt that is still stopping cannot overwrite the new attempt's progress. The trainer's
    Role allows get/update/patch on this one Lease only."""

    CONFLICT_RETRIES = 3

    def __init__(
        self,
        api_url: str,
        namespace: str,
        lease: str,
        holder: str,
        annotation: str,
        token_path: str = f"{SERVICE_ACCOUNT_DIR}/token",
        ca_path: str | None = f"{SERVICE_ACCOUNT_DIR}/ca.crt",
        timeout: float = 5.0,
    ) -> None:
        self.url = (
            f"{api_url.rstrip('/')}/apis/coordination.k8s.io/v1/namespaces/{namespace}"
            f"/leases/{lease}"
        )
        self.holder = holder
        self.annotation = annotation
        self.token_path = token_path
        self.timeout = timeout
        self.context = (
            ssl.create_default_context(cafile=ca_path) if api_url.startswith("https") else None
        )
        self.pending: queue.Queue[str | None] = queue.Queue(maxsize=1)
        self.sent = 0
        self.failed = 0
        self.superseded = 0  # writes dropped: the Lease holds a later attempt's record
        self.thread = threading.Thread(target=self._run, name="progress-lease", daemon=True)
        self.thread.start()

    @classmethod
    def in_cluster(
        cls, namespace: str | None, pod: str | None, lease: str, annotation: str
    ) -> LeaseWriter | None:
        """The writer for this job's Lease, or None (logged) when not running in a cluster."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if namespace is None:
            try:
                with open(f"{SERVICE_ACCOUNT_DIR}/namespace", encoding="utf-8") as f:
                    namespace = f.read().strip()
            except OSError:
                namespace = None
        missing = [
            name
            for name, value in (
                ("KUBERNETES_SERVICE_HOST", host),
                ("POD_NAME", pod),
                ("POD_NAMESPACE", namespace),
            )
            if not value
        ]
        if missing:
            log.warning(
                "MEGATRON_PROGRESS_LEASE is set but %s is not set: progress goes to stdout only",
                ", ".join(missing),
            )
            return None
        assert host and pod and namespace
        host = f"[{host}]" if ":" in host else host  # IPv6 service address
        return cls(f"https://{host}:{port}", namespace, lease, pod, annotation)

    def submit(self, payload: str) -> None:
        """Queue a record; an older one still waiting is replaced (only the newest matters)."""
        while True:
            try:
                self.pending.put_nowait(payload)
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self.pending.get_nowait()

    def close(self, timeout: float = 3.0) -> None:
        """Send what is pending (bounded by `timeout`), then stop the thread."""
        deadline = time.monotonic() + timeout
        while not self.pending.empty() and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            self.pending.put(None, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            return
        self.thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while True:
            payload = self.pending.get()
            if payload is None:
                return
            try:
                if self._write(payload):
                    self.sent += 1
                else:
                    self.superseded += 1
                    if self.superseded == 1:
                        log.warning(
                            "the progress Lease holds a later attempt's record: not written"
                        )
            except Exception as err:  # never let reporting kill the trainer
                self.failed += 1
                if self.failed <= 3 or self.failed % 100 == 0:
                    log.warning("progress Lease write failed (%d so far): %s", self.failed, err)

    def _write(self, payload: str) -> bool:
        """Read-modify-update; False when a later attempt's record is there."""
        mine = _record_attempt(payload)
        for tries in range(self.CONFLICT_RETRIES):
            lease = json.loads(self._request("GET"))
            meta = lease.setdefault("metadata", {})
            annotations = meta.get("annotations") or {}
            theirs = _record_attempt(annotations.get(self.annotation))
            if theirs is not None and (mine is None or theirs > mine):
                return False
            meta["annotations"] = {**annotations, self.annotation: payload}
            spec = lease.setdefault("spec", {})
            spec["holderIdentity"] = self.holder
            spec["renewTime"] = _micro_time(datetime.now(timezone.utc))
            try:
                self._request("PUT", json.dumps(lease).encode())  # carries its resourceVersion
                return True
            except urllib.error.HTTPError as err:
                if err.code != 409 or tries == self.CONFLICT_RETRIES - 1:
                    raise  # 409: someone wrote in between; read again
        return False

    def _request(self, method: str, body: bytes | None = None) -> bytes:
        with open(self.token_path, encoding="utf-8") as f:
            token = f.read().strip()  # re-read: projected tokens rotate
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url, data=body, method=method, headers=headers)
        with urllib.request.urlopen(
            request, timeout=self.timeout, context=self.context
        ) as response:
            return bytes(response.read())


class ProgressReporter:
    """What rank 0 calls; other ranks get a reporter with `enabled=False`."""

    def __init__(
        self,
        enabled: bool,
        progress_file: str | None,
        lease: LeaseWriter | None,
        min_interval_seconds: float,
        attempt: int,
    ) -> None:
        self.enabled = enabled
        self.progress_file = progress_file
        self.lease = lease
        self.min_interval = min_interval_seconds
        self.attempt = attempt
        self.last_write = float("-inf")
        self.unsent: str | None = None  # the newest record the rate limit held back

    def report(self, report: Report, force: bool = False) -> None:
        """Print, append and (rate-limited unless `force`) write the Lease. Never raises."""
        if not self.enabled:
            return
        payload = report.to_json(self.attempt)
        # One write, the newline in it: print() writes the line and its newline apart, and a
        # line another thread logs in between (the snapshot writer's) lands inside the record.
        sys.stdout.write(f"{STDOUT_PREFIX}{payload}\n")
        sys.stdout.flush()
        if self.progress_file:
            try:
                with open(self.progress_file, "a", encoding="utf-8") as f:
                    f.write(payload + "\n")
            except OSError as err:
                log.warning("cannot append progress to %s: %s", self.progress_file, err)
        now = time.monotonic()
        if self.lease and (force or now - self.last_write >= self.min_interval):
            self.last_write = now
            self.unsent = None
            self.lease.submit(payload)
        elif self.lease:
            self.unsent = payload

    def close(self, timeout: float = 3.0) -> None:
        """Send the newest record the rate limit held back (the last steps of a run that ends
        within the interval, or that a failure ends: the goodput ledger counts the steps it
        shows as new work, not work in flight), then stop the writer."""
        if self.lease:
            if self.unsent is not None:
                self.lease.submit(self.unsent)
                self.unsent = None
            self.lease.close(timeout)
