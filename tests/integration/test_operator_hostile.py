"""What a tenant's pods write at runtime is hostile input, and bugs of ours must not cost a job:
on the real apiserver, with the operator running (or its Controller in this process, where a
test drives one reconcile at a time).

- Hostile progress records on a running job's Lease: the job still obeys spec.suspend within
  30 s, its status stays writable, and the operator logs no traceback.
- A storm of 200 Lease writes in 10 s costs at most 10 status writes of that job.
- 500 idle connections to the metrics port (and to the health port) leave /readyz answering
  within 2 s, with a bounded thread count.

Through the Controller in this process, one reconcile at a time: test_controller_hostile.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes

from megatron_contract.bounds import INT64_MAX
from megatron_contract.paths import PROGRESS_ANNOTATION
from tests.unit.test_hostile_trainer_data import HOSTILE_RECORDS

from .conftest import Cluster
from .operator_support import (
    Op,
    operator,  # noqa: F401 - fixture
    pods,
    status,
    tiny_gpu_job,
    wait_phase,
)

GROUP, VERSION, PLURAL = "megatron.dev", "v1alpha1", "megatronjobs"
# Lease annotations are limited to 256 KiB in all: the biggest record a trainer can write.
RECORDS = {k: v for k, v in HOSTILE_RECORDS.items() if len(v) < 200_000 and k != "a megabyte"} | {
    "200 KB": json.dumps({"attempt": 0, "iteration": 1, "x": "y" * 200_000})
}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_CLIENTS: dict[str, Any] = {}


def _patch_lease(cluster: Cluster, ns: str, job_name: str, record: str) -> None:
    """Write a record as the trainer does (one client per cluster: a new one per call costs a
    kubeconfig read and a TLS handshake)."""
    coordination = _CLIENTS.get(str(cluster.kubeconfig))
    if coordination is None:
        coordination = kubernetes.client.CoordinationV1Api(cluster.api_client())
        _CLIENTS[str(cluster.kubeconfig)] = coordination
    body = {
        "metadata": {"annotations": {PROGRESS_ANNOTATION: record}},
        "spec": {"renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
    }
    coordination.patch_namespaced_lease(f"{job_name}-progress", ns, body)


def _bounded(value: Any, where: str = "status") -> None:
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return
    if isinstance(value, int):
        assert -INT64_MAX - 1 <= value <= INT64_MAX, where
    elif isinstance(value, str):
        assert len(value) <= 4096, (where, len(value))
    elif isinstance(value, dict):
        for k, v in value.items():
            _bounded(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _bounded(v, f"{where}[{i}]")


def _status_writable(cluster: Cluster, ns: str, name: str) -> None:
    """The stored status, written back unchanged, is accepted: nothing in it (an int64
    overflow, say) makes the apiserver refuse every later status write."""
    custom = kubernetes.client.CustomObjectsApi(cluster.api_client())
    for _ in range(5):  # the operator may write in between: read again on a conflict
        doc = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        try:
            custom.replace_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name, doc)
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status == 409:
                continue
            raise
        _bounded(doc.get("status") or {})
        return
    raise AssertionError("the status kept changing")


def test_hostile_progress_records_do_not_wedge_the_job(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    ns = namespace
    cluster.apply(tiny_gpu_job("target", nodes=2), ns)
    wait_phase(cluster, ns, "target", "Running")
    before = len(operator.logs())
    for case, record in RECORDS.items():
        _patch_lease(cluster, ns, "target", record)
        time.sleep(0.3)
        assert status(cluster, ns, "target")["phase"] == "Running", case
    time.sleep(6)  # past the Lease-wake window: the last record is read
    _status_writable(cluster, ns, "target")
    started = time.monotonic()
    cluster.kubectl(
        "patch", "mj", "target", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    wait_phase(cluster, ns, "target", "Suspended", timeout=30)
    assert time.monotonic() - started < 30
    cluster.wait(lambda: not pods(cluster, ns, "target"), 30, what="the suspended job's pods gone")
    _status_writable(cluster, ns, "target")
    logs = operator.logs()[before:]
    assert "Traceback" not in logs, logs[-3000:]
    assert "reconcile failed" not in logs, logs[-3000:]


def _watch_writes(cluster: Cluster, ns: str, name: str, stop: threading.Event) -> list[float]:
    """Times of the job's MODIFIED events (each a write of the object or its status)."""
    seen: list[float] = []
    custom = kubernetes.client.CustomObjectsApi(cluster.api_client())
    version = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)["metadata"][
        "resourceVersion"
    ]

    def run() -> None:
        w = kubernetes.watch.Watch()
        for event in w.stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            PLURAL,
            field_selector=f"metadata.name={name}",
            resource_version=version,
            timeout_seconds=60,
        ):
            if event["type"] == "MODIFIED":
                seen.append(time.monotonic())
            if stop.is_set():
                w.stop()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return seen


def test_a_lease_write_storm_costs_at_most_ten_status_writes(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    ns = namespace
    cluster.apply(tiny_gpu_job("storm", nodes=2), ns)
    wait_phase(cluster, ns, "storm", "Running")
    time.sleep(2)  # the job settles: nothing else to write
    stop = threading.Event()
    writes = _watch_writes(cluster, ns, "storm", stop)
    time.sleep(1)
    start = time.monotonic()
    with ThreadPoolExecutor(4) as pool:  # 200 patches in 10 s, each a newer record
        for i in range(200):
            time.sleep(max(0.0, start + i * 0.05 - time.monotonic()))
            record = json.dumps({"attempt": 0, "iteration": i + 1, "loss": 3.0, "time": _now()})
            pool.submit(_patch_lease, cluster, ns, "storm", record)
    took = time.monotonic() - start
    time.sleep(1)
    stop.set()
    window = [t for t in writes if start <= t <= start + took + 1]
    # 200 patches in 10 s as sent; a loaded machine (CI runs three workers on two cores) may
    # take longer to finish them, which is still a storm: the bound on writes is the point.
    assert took <= 30, took
    assert len(window) <= 10, f"{len(window)} writes of the job during 200 Lease patches"
    assert len(window) >= 1  # progress was copied, only less often
    assert status(cluster, ns, "storm")["progress"]["iteration"] >= 1


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_idle_connections_leave_readyz_answering(operator: Op) -> None:
    assert operator.proc is not None
    before = _threads(operator.proc.pid)
    idle: list[socket.socket] = []
    try:
        for port in (operator.metrics_port, operator.health_port):
            for _ in range(500):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n")  # never finished
                idle.append(s)
            started = time.monotonic()
            assert operator.probe("/readyz") == 200
            assert time.monotonic() - started < 2.0
        assert _threads(operator.proc.pid) <= before + 4
    finally:
        for s in idle:
            s.close()
