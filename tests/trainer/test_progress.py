"""Progress reports (contract §4): the JSON, the stdout line, the file, and the pod annotation
PATCH against a real local HTTP(S) server. A failing API server must never stop training."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from megatron_trainer.progress import STDOUT_PREFIX, PodAnnotator, ProgressReporter, Report

pytestmark = pytest.mark.trainer


class FakeApiServer:
    """Records PATCH requests; answers with `status`."""

    def __init__(self, status: int = 200, context: ssl.SSLContext | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = status
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_PATCH(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
                )
                self.send_response(server.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

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

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


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
    body = json.loads(Report(120, 3.21434, 51234.52, 0.41, 100).to_json(now))
    assert body == {
        "iteration": 120,
        "loss": 3.21434,
        "tokensPerSecond": 51234.5,
        "mfu": 0.41,
        "checkpointIteration": 100,
        "time": "2026-11-22T10:00:00Z",
    }
    diverged = json.loads(Report(1, float("nan"), float("inf"), None, None).to_json(now))
    assert diverged["loss"] is None and diverged["tokensPerSecond"] is None
    assert diverged["mfu"] is None and diverged["checkpointIteration"] is None


def test_stdout_line_and_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "progress.jsonl"
    reporter = ProgressReporter(True, str(path), None, 10.0)
    reporter.report(Report(1, 6.9, 100.0, None, None))
    reporter.report(Report(2, 6.8, 100.0, None, 2), force=True)
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert [json.loads(line.removeprefix(STDOUT_PREFIX))["iteration"] for line in lines] == [1, 2]
    assert all(line.startswith(STDOUT_PREFIX) for line in lines)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["checkpointIteration"] for r in records] == [None, 2]


def test_other_ranks_report_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "progress.jsonl"
    ProgressReporter(False, str(path), None, 0.0).report(Report(1, 6.9, 1.0, None, None))
    assert capsys.readouterr().out == "" and not path.exists()


def test_annotation_patch(api: FakeApiServer, token: Path) -> None:
    annotator = PodAnnotator(
        f"http://127.0.0.1:{api.port}",
        "team-a",
        "tiny-0",
        "megatron.dev/progress",
        str(token),
        None,
    )
    payload = Report(5, 6.5, 10.0, None, None).to_json()
    annotator.submit(payload)
    annotator.close()
    assert len(api.requests) == 1
    request = api.requests[0]
    assert request["path"] == "/api/v1/namespaces/team-a/pods/tiny-0"
    assert request["headers"]["Authorization"] == "Bearer secret-token"
    assert request["headers"]["Content-Type"] == "application/merge-patch+json"
    assert request["body"] == {"metadata": {"annotations": {"megatron.dev/progress": payload}}}


def test_rate_limit_but_checkpoints_always_go_out(api: FakeApiServer, token: Path) -> None:
    annotator = PodAnnotator(
        f"http://127.0.0.1:{api.port}", "ns", "pod", "megatron.dev/progress", str(token), None
    )
    reporter = ProgressReporter(True, None, annotator, min_interval_seconds=3600)
    reporter.report(Report(1, 6.9, 1.0, None, None))  # first one goes out
    wait_for(lambda: len(api.requests) == 1)
    reporter.report(Report(2, 6.8, 1.0, None, None))  # within the interval: dropped
    reporter.report(Report(2, 6.8, 1.0, None, 2), force=True)  # a checkpoint report
    reporter.close()
    sent = [
        json.loads(r["body"]["metadata"]["annotations"]["megatron.dev/progress"])
        for r in api.requests
    ]
    assert [(s["iteration"], s["checkpointIteration"]) for s in sent] == [(1, None), (2, 2)]


def test_failing_api_server_never_raises(token: Path) -> None:
    server = FakeApiServer(status=500)
    try:
        annotator = PodAnnotator(
            f"http://127.0.0.1:{server.port}", "ns", "pod", "a", str(token), None, timeout=1.0
        )
        reporter = ProgressReporter(True, None, annotator, 0.0)
        reporter.report(Report(1, 6.9, 1.0, None, None))
        wait_for(lambda: annotator.failed == 1)
    finally:
        server.close()
    # Nobody listens any more: the connection is refused, and still nothing raises.
    reporter.report(Report(2, 6.8, 1.0, None, None))
    wait_for(lambda: annotator.failed == 2)
    reporter.close()
    assert annotator.sent == 0


def test_in_cluster_needs_the_service_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert PodAnnotator.in_cluster("ns", "pod", "megatron.dev/progress") is None


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
        annotator = PodAnnotator(
            f"https://127.0.0.1:{server.port}", "ns", "pod", "a", str(token), str(cert)
        )
        annotator.submit("{}")
        annotator.close()
        assert annotator.sent == 1 and len(server.requests) == 1
    finally:
        server.close()
