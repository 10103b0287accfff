"""Rank 0's progress reports (contract §4): a stdout line, a JSON-lines file, a pod annotation.

Reporting must never stop or slow training: the pod patch runs on a background thread with a
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
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

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

    def to_json(self, now: datetime | None = None) -> str:
        stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
        body: dict[str, Any] = {
            "iteration": self.iteration,
            "loss": _finite(self.loss),
            "tokensPerSecond": _rounded(self.tokens_per_second, 1),
            "mfu": _rounded(self.mfu, 4),
            "checkpointIteration": self.checkpoint_iteration,
            "time": stamp,
        }
        return json.dumps(body, separators=(",", ":"))


def _finite(value: float | None) -> float | None:
    # JSON has no NaN/Infinity; a diverged loss is reported as null rather than breaking parsers.
    return value if value is not None and math.isfinite(value) else None


def _rounded(value: float | None, digits: int) -> float | None:
    value = _finite(value)
    return None if value is None else round(value, digits)


class PodAnnotator:
    """PATCHes one pod's annotation through the API server, from a background thread."""

    def __init__(
        self,
        api_url: str,
        namespace: str,
        pod: str,
        annotation: str,
        token_path: str = f"{SERVICE_ACCOUNT_DIR}/token",
        ca_path: str | None = f"{SERVICE_ACCOUNT_DIR}/ca.crt",
        timeout: float = 5.0,
    ) -> None:
        self.url = f"{api_url.rstrip('/')}/api/v1/namespaces/{namespace}/pods/{pod}"
        self.annotation = annotation
        self.token_path = token_path
        self.timeout = timeout
        self.context = (
            ssl.create_default_context(cafile=ca_path) if api_url.startswith("https") else None
        )
        self.pending: queue.Queue[str | None] = queue.Queue(maxsize=1)
        self.sent = 0
        self.failed = 0
        self.thread = threading.Thread(target=self._run, name="progress-annotator", daemon=True)
        self.thread.start()

    @classmethod
    def in_cluster(
        cls, namespace: str | None, pod: str | None, annotation: str
    ) -> PodAnnotator | None:
        """The annotator for this pod, or None (logged) when not running in a cluster."""
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
                "MEGATRON_REPORT_TO_POD is true but %s is not set: progress goes to stdout only",
                ", ".join(missing),
            )
            return None
        assert host and pod and namespace
        host = f"[{host}]" if ":" in host else host  # IPv6 service address
        return cls(f"https://{host}:{port}", namespace, pod, annotation)

    def submit(self, payload: str) -> None:
        """Queue a report; an older one still waiting is replaced (only the newest matters)."""
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
                self._patch(payload)
                self.sent += 1
            except Exception as err:  # never let reporting kill the trainer
                self.failed += 1
                if self.failed <= 3 or self.failed % 100 == 0:
                    log.warning(
                        "progress annotation patch failed (%d so far): %s", self.failed, err
                    )

    def _patch(self, payload: str) -> None:
        with open(self.token_path, encoding="utf-8") as f:
            token = f.read().strip()  # re-read: projected tokens rotate
        body = json.dumps({"metadata": {"annotations": {self.annotation: payload}}}).encode()
        request = urllib.request.Request(
            self.url,
            data=body,
            method="PATCH",
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/merge-patch+json",
                "Accept": "application/json",
            },
        )
        with urllib.request.urlopen(
            request, timeout=self.timeout, context=self.context
        ) as response:
            response.read()


class ProgressReporter:
    """What rank 0 calls; other ranks get a reporter with `enabled=False`."""

    def __init__(
        self,
        enabled: bool,
        progress_file: str | None,
        annotator: PodAnnotator | None,
        min_interval_seconds: float,
    ) -> None:
        self.enabled = enabled
        self.progress_file = progress_file
        self.annotator = annotator
        self.min_interval = min_interval_seconds
        self.last_patch = float("-inf")

    def report(self, report: Report, force: bool = False) -> None:
        """Print, append and (rate-limited unless `force`) annotate. Never raises."""
        if not self.enabled:
            return
        payload = report.to_json()
        print(STDOUT_PREFIX + payload, flush=True)
        if self.progress_file:
            try:
                with open(self.progress_file, "a", encoding="utf-8") as f:
                    f.write(payload + "\n")
            except OSError as err:
                log.warning("cannot append progress to %s: %s", self.progress_file, err)
        now = time.monotonic()
        if self.annotator and (force or now - self.last_patch >= self.min_interval):
            self.last_patch = now
            self.annotator.submit(payload)

    def close(self) -> None:
        if self.annotator:
            self.annotator.close()
