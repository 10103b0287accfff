"""Where the coordinator reads the operator's decision, and where it writes the launchers' report.

In a pod: one watch of its own MegatronJob (the decision is the job's status), and an annotation
of the job's progress Lease (the operator watches Leases already). Locally (`mjob run --local`):
the status file the runner writes after each reconcile, and a report file it reads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import random
import threading
import time
import urllib.error
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from megatron_contract.ladder import REPORT_ANNOTATION, Decision, Report, parse_decision

from .kubeapi import Api, job_list_path, lease_path

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # for annotations only (the launcher runs on Python 3.8 too)
    Deliver = Callable[[Decision], None]  # status.restartAttempt, status.phase, status.swaps
WATCH_SECONDS = 300


def decision(status: object) -> Decision | None:
    """The decision in a job status, or None when it holds no attempt yet."""
    return parse_decision(status)


class Source(Protocol):
    def start(self, deliver: Deliver) -> None: ...

    def stop(self) -> None: ...


class Sink(Protocol):
    def submit(self, report: Report) -> None: ...

    def close(self) -> None: ...


def _backoff(failures: int) -> float:
    return float(min(0.2 * 2 ** min(failures, 6), 10.0) * (0.5 + random.random()))


class JobWatch:
    """One list-then-watch of the job (`fieldSelector=metadata.name=<job>`), relisting after a
    410 or a broken stream; every version of the job's status is delivered in order."""

    def __init__(self, api: Api, namespace: str, job: str) -> None:
        self.api, self.namespace, self.job = api, namespace, job
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="job-watch", daemon=True)
        self.deliver: Deliver | None = None

    def start(self, deliver: Deliver) -> None:
        self.deliver = deliver
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _emit(self, obj: object) -> None:
        if isinstance(obj, dict) and self.deliver is not None:
            d = decision(obj.get("status"))
            if d is not None:
                self.deliver(d)

    def _run(self) -> None:
        failures = 0
        version: str | None = None
        while not self.stopping.is_set():
            try:
                if version is None:
                    listed = self.api.call("GET", job_list_path(self.namespace, self.job))
                    for item in listed.get("items") or []:
                        self._emit(item)
                    version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
                path = job_list_path(
                    self.namespace,
                    self.job,
                    watch="1",
                    resourceVersion=version,
                    allowWatchBookmarks="true",
                    timeoutSeconds=str(WATCH_SECONDS),
                )
                for event in self.api.watch(path, WATCH_SECONDS):
                    if self.stopping.is_set():
                        return
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        version = None  # 410 Gone (too old) or worse: list again
                        break
                    meta = (obj.get("metadata") or {}) if isinstance(obj, dict) else {}
                    version = str(meta.get("resourceVersion") or version)
                    if kind in ("ADDED", "MODIFIED"):
                        self._emit(obj)
                failures = 0
            except (OSError, ValueError, urllib.error.URLError) as err:
                failures += 1
                level = logging.WARNING if failures <= 3 or failures % 20 == 0 else logging.DEBUG
                log.log(level, "watch of job %s failed (%s); retrying", self.job, err)
                version = None
                self.stopping.wait(_backoff(failures))


class StatusFile:
    """The job status `mjob run --local` writes (atomically) after each reconcile, polled."""

    POLL_SECONDS = 0.02

    def __init__(self, path: str) -> None:
        self.path = path
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="status-file", daemon=True)
        self.deliver: Deliver | None = None

    def start(self, deliver: Deliver) -> None:
        self.deliver = deliver
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self) -> None:
        seen: tuple[int, int] | None = None
        while not self.stopping.wait(self.POLL_SECONDS):
            try:
                st = os.stat(self.path)
                stamp = (st.st_mtime_ns, st.st_ino)
                if stamp == seen:
                    continue
                with open(self.path, encoding="utf-8") as f:
                    doc = json.load(f)
                seen = stamp
            except (OSError, ValueError):
                continue
            d = decision(doc)
            if d is not None and self.deliver is not None:
                self.deliver(d)


class LeaseSink:
    """Writes the newest report into the progress Lease's annotation from a background thread:
    read, change the annotation, update with the version read (a 409 reads again). A report
    that cannot be written is retried until a newer one replaces it: the operator decides on
    what reaches it."""

    def __init__(self, api: Api, namespace: str, lease: str) -> None:
        self.api = api
        self.path = lease_path(namespace, lease)
        self.pending: queue.Queue[Report | None] = queue.Queue(maxsize=1)
        self.written = 0
        self.thread = threading.Thread(target=self._run, name="report-lease", daemon=True)
        self.thread.start()

    def submit(self, report: Report) -> None:
        while True:
            try:
                self.pending.put_nowait(report)
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self.pending.get_nowait()

    def close(self) -> None:
        with contextlib.suppress(queue.Full):
            self.pending.put_nowait(None)

    def _run(self) -> None:
        failures = 0
        current: Report | None = None
        while True:
            try:
                newer = self.pending.get(timeout=None if current is None else _backoff(failures))
                if newer is None:
                    return
                current = newer
            except queue.Empty:
                pass  # retry `current`
            assert current is not None
            try:
                self._write(current.dumps())
                self.written += 1
                failures = 0
                current = None
            except (OSError, ValueError, urllib.error.URLError) as err:
                failures += 1
                if failures <= 3 or failures % 20 == 0:
                    log.warning("cannot write the launchers' report (%s); retrying", err)

    def _write(self, text: str) -> None:
        for _ in range(5):
            lease: dict[str, Any] = self.api.call("GET", self.path)
            meta = lease.setdefault("metadata", {})
            annotations = meta.get("annotations") or {}
            meta["annotations"] = {**annotations, REPORT_ANNOTATION: text}
            try:
                self.api.call("PUT", self.path, lease)  # carries the resourceVersion read
                return
            except urllib.error.HTTPError as err:
                if err.code != 409:
                    raise
        raise OSError("the Lease kept changing under the report (5 conflicts)")


class FileSink:
    """The report as a file, replaced atomically (`mjob run --local` reads it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.written = 0

    def submit(self, report: Report) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(report.dumps())
            os.replace(tmp, self.path)
            self.written += 1
        except OSError as err:
            log.warning("cannot write the launchers' report to %s: %s", self.path, err)

    def close(self) -> None:
        pass


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll `predicate` every 10 ms up to `timeout` (tests and benchmarks)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
