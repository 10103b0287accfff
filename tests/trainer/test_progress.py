"""Progress reports (contract §4): the JSON, the stdout line, the file, and the Lease write
against a local HTTP(S) server that answers as the apiserver does (resourceVersion, 409). A
failing API server must never stop training. tests/integration/test_operator_progress.py writes a
real Lease on the real apiserver, as the trainer's ServiceAccount."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from megatron_trainer.progress import STDOUT_PREFIX, LeaseWriter, ProgressReporter, Report

pytestmark = pytest.mark.trainer


class FakeApiServer:
    """Holds one Lease: GET returns it, PUT replaces it if its resourceVersion matches (else
    409, as the apiserver answers), and `status` other than 200 fails every request."""

    def __init__(self, status: int = 200, context: ssl.SSLContext | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = status
        self.lease: dict[str, Any] = {
            "metadata": {"name": "tiny-progress", "resourceVersion": "1", "labels": {"a": "b"}},
            "spec": {},
        }
        self.conflicts = 0  # the next N PUTs find the Lease changed by someone else
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                server.requests.append({"method": "GET", "path": self.path})
                if server.status != 200:
                    return self._answer(server.status, {})
                self._answer(200, server.lease)

            def do_PUT(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)
                server.requests.append(
                    {
                        "method": "PUT",
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": json.loads(raw),  # as sent, before the server changes it
                    }
                )
                if server.status != 200:
                    return self._answer(server.status, {})
                meta = server.lease["metadata"]
                if server.conflicts:
                    server.conflicts -= 1
                    meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
                if body["metadata"].get("resourceVersion") != meta["resourceVersion"]:
                    return self._answer(409, {"reason": "Conflict"})
                body["metadata"]["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
                server.lease = body
                self._answer(200, body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if context is not None:
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def record(self) -> dict[str, Any]:
        return dict(json.loads(self.lease["metadata"]["annotations"][ANNOTATION]))

    @property
    def puts(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == "PUT"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


ANNOTATION = "megatron.dev/progress"


def writer(port: int, token: Path, **kw: Any) -> LeaseWriter:
    return LeaseWriter(
        f"http://127.0.0.1:{port}", "team-a", "tiny-progress", "tiny-0", ANNOTATION, str(token),
        None, **kw
    )  # fmt: skip


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    yield server
    server.close()


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("secret-token\n")
    return path


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_report_json_matches_the_contract() -> None:
    now = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
    body = json.loads(Report(120, 3.21434, 51234.52, 0.41, 100).to_json(3, now))
    assert body == {
        "attempt": 3,
        "iteration": 120,
        "loss": 3.21434,
        "tokensPerSecond": 51234.5,
        "mfu": 0.41,
        "checkpointIteration": 100,
        "time": "2026-11-22T10:00:00Z",
    }
    diverged = json.loads(Report(1, float("nan"), float("inf"), None, None).to_json(0, now))
    assert diverged["loss"] is None and diverged["tokensPerSecond"] is None
    assert diverged["mfu"] is None and diverged["checkpointIteration"] is None


def test_stdout_line_and_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "progress.jsonl"
    reporter = ProgressReporter(True, str(path), None, 10.0, attempt=1)
    reporter.report(Report(1, 6.9, 100.0, None, None))
    reporter.report(Report(2, 6.8, 100.0, None, 2), force=True)
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert [json.loads(line.removeprefix(STDOUT_PREFIX))["iteration"] for line in lines] == [1, 2]
    assert all(line.startswith(STDOUT_PREFIX) for line in lines)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["checkpointIteration"] for r in records] == [None, 2]
    assert {r["attempt"] for r in records} == {1}


def test_other_ranks_report_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "progress.jsonl"
    ProgressReporter(False, str(path), None, 0.0, 0).report(Report(1, 6.9, 1.0, None, None))
    assert capsys.readouterr().out == "" and not path.exists()


def test_lease_update(api: FakeApiServer, token: Path) -> None:
    lease = writer(api.port, token)
    payload = Report(5, 6.5, 10.0, None, None).to_json(0)
    lease.submit(payload)
    lease.close()
    assert lease.sent == 1
    put = api.puts[0]
    assert put["path"] == "/apis/coordination.k8s.io/v1/namespaces/team-a/leases/tiny-progress"
    assert put["headers"]["Authorization"] == "Bearer secret-token"
    assert put["body"]["metadata"]["resourceVersion"] == "1"  # an update, not a blind write
    assert api.lease["metadata"]["annotations"] == {ANNOTATION: payload}
    assert api.lease["metadata"]["labels"] == {"a": "b"}  # the rest of the Lease is kept
    assert api.lease["spec"]["holderIdentity"] == "tiny-0"
    renew = datetime.strptime(api.lease["spec"]["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert abs(renew.replace(tzinfo=UTC) - datetime.now(UTC)).total_seconds() < 5


def test_a_conflict_reads_again(api: FakeApiServer, token: Path) -> None:
    api.conflicts = 2
    lease = writer(api.port, token)
    lease.submit(Report(7, 6.5, 10.0, None, None).to_json(0))
    lease.close()
    assert (lease.sent, lease.failed) == (1, 0)
    assert len(api.puts) == 3 and api.record["iteration"] == 7


def test_an_old_attempt_never_overwrites_a_newer_record(api: FakeApiServer, token: Path) -> None:
    newer = writer(api.port, token)
    newer.submit(Report(3, 6.5, 10.0, None, None).to_json(2))
    newer.close()
    late = writer(api.port, token)  # a pod of attempt 1 still stopping
    late.submit(Report(90, 6.5, 10.0, None, None).to_json(1))
    late.close()
    assert (late.sent, late.superseded, late.failed) == (0, 1, 0)
    assert (api.record["attempt"], api.record["iteration"]) == (2, 3)
    same = writer(api.port, token)  # the same attempt, or a later one, writes
    same.submit(Report(4, 6.5, 10.0, None, None).to_json(2))
    same.close()
    assert api.record["iteration"] == 4


def test_rate_limit_but_checkpoints_always_go_out(api: FakeApiServer, token: Path) -> None:
    lease = writer(api.port, token)
    reporter = ProgressReporter(True, None, lease, min_interval_seconds=3600, attempt=0)
    reporter.report(Report(1, 6.9, 1.0, None, None))  # first one goes out
    wait_for(lambda: len(api.puts) == 1)
    reporter.report(Report(2, 6.8, 1.0, None, None))  # within the interval: dropped
    reporter.report(Report(2, 6.8, 1.0, None, 2), force=True)  # a checkpoint report
    reporter.close()
    sent = [json.loads(r["body"]["metadata"]["annotations"][ANNOTATION]) for r in api.puts]
    assert [(s["iteration"], s["checkpointIteration"]) for s in sent] == [(1, None), (2, 2)]


def test_the_last_record_held_back_is_sent_at_close(api: FakeApiServer, token: Path) -> None:
    """A run whose last steps fall within the interval: close() sends the newest of them (the
    job's status would otherwise end at an older step)."""
    lease = writer(api.port, token)
    reporter = ProgressReporter(True, None, lease, min_interval_seconds=3600, attempt=1)
    reporter.report(Report(7, 6.9, 1.0, None, None))  # first one goes out
    wait_for(lambda: len(api.puts) == 1)
    for step in (8, 9, 10, 11, 12):
        reporter.report(Report(step, 6.8, 1.0, None, None))  # within the interval: held
    reporter.close()
    sent = [json.loads(r["body"]["metadata"]["annotations"][ANNOTATION]) for r in api.puts]
    assert [s["iteration"] for s in sent] == [7, 12]


def test_failing_api_server_never_raises(token: Path) -> None:
    server = FakeApiServer(status=500)
    try:
        lease = writer(server.port, token, timeout=1.0)
        reporter = ProgressReporter(True, None, lease, 0.0, 0)
        reporter.report(Report(1, 6.9, 1.0, None, None))
        wait_for(lambda: lease.failed == 1)
    finally:
        server.close()
    # Nobody listens any more: the connection is refused, and still nothing raises.
    reporter.report(Report(2, 6.8, 1.0, None, None))
    wait_for(lambda: lease.failed == 2)
    reporter.close()
    assert lease.sent == 0


def test_in_cluster_needs_the_service_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert LeaseWriter.in_cluster("ns", "pod", "job-progress", ANNOTATION) is None


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI for a test CA")
def test_https_with_the_service_account_ca(tmp_path: Path, token: Path) -> None:
    cert, key = tmp_path / "ca.crt", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = FakeApiServer(context=context)
    try:
        lease = LeaseWriter(
            f"https://127.0.0.1:{server.port}", "ns", "l", "pod", ANNOTATION, str(token), str(cert)
        )
        lease.submit(Report(1, 6.9, 1.0, None, None).to_json(0))
        lease.close()
        assert lease.sent == 1 and len(server.puts) == 1
    finally:
        server.close()


LOGGING_BESIDE = """
import logging, sys, threading
sys.setswitchinterval(1e-6)  # a thread switch at almost every chance
from megatron_trainer.progress import ProgressReporter, Report
logging.basicConfig(stream=sys.stdout, level=logging.INFO)
stop = threading.Event()
def writer():  # as the snapshot writer thread logs beside the step
    while not stop.is_set():
        logging.info("Saving to /mnt/memory-checkpoints/0/iter_0000001_0_local.dirty.pt")
thread = threading.Thread(target=writer)
thread.start()
reporter = ProgressReporter(True, None, None, 0.0, attempt=0)
for i in range(3000):
    reporter.report(Report(i, 1.5, 100.0, None, None))
stop.set()
thread.join()
"""


def test_a_record_is_one_line_whatever_another_thread_prints_beside_it() -> None:
    out = subprocess.run(
        [sys.executable, "-c", LOGGING_BESIDE], capture_output=True, text=True, timeout=120,
        check=True, cwd=Path(__file__).resolve().parents[2] / "trainer",
    ).stdout  # fmt: skip
    records = [line for line in out.splitlines() if line.startswith(STDOUT_PREFIX)]
    assert len(records) == 3000
    assert [json.loads(r[len(STDOUT_PREFIX) :])["iteration"] for r in records] == list(range(3000))
