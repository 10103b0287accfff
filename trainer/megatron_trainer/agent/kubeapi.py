"""The few apiserver calls of the coordinator, with the pod's own service account (stdlib).

The trainer's Role allows exactly these: get, list and watch of its own MegatronJob, and get and
update of its progress Lease (core/render.py `trainer_rbac`).
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
JOBS = "/apis/megatron.dev/v1alpha1/namespaces/{ns}/megatronjobs"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}"


@dataclass(frozen=True)
class Api:
    url: str  # https://host:port
    token_path: str
    ca_path: str | None
    timeout: float = 10.0

    @classmethod
    def in_cluster(cls) -> Api | None:
        """The apiserver as a pod sees it, or None outside a cluster."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        token = f"{SERVICE_ACCOUNT_DIR}/token"
        if not host or not os.path.isfile(token):
            return None
        host = f"[{host}]" if ":" in host else host  # an IPv6 service address
        return cls(f"https://{host}:{port}", token, f"{SERVICE_ACCOUNT_DIR}/ca.crt")

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https"):
            return None
        return ssl.create_default_context(cafile=self.ca_path)

    def _request(
        self, method: str, path: str, body: bytes | None, timeout: float
    ) -> urllib.request.Request:
        with open(self.token_path, encoding="utf-8") as f:
            token = f.read().strip()  # re-read every time: projected tokens rotate
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        return urllib.request.Request(self.url + path, data=body, method=method, headers=headers)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = self._request(method, path, data, self.timeout)
        with urllib.request.urlopen(request, timeout=self.timeout, context=self._context()) as r:
            return json.loads(r.read())

    def watch(self, path: str, timeout_seconds: int) -> Iterator[dict[str, Any]]:
        """The events of a watch (`path` carries ?watch=1...), until the server ends it."""
        request = self._request("GET", path, None, timeout_seconds + 30)
        with urllib.request.urlopen(
            request, timeout=timeout_seconds + 30, context=self._context()
        ) as r:
            for line in r:
                if line.strip():
                    event = json.loads(line)
                    if isinstance(event, dict):
                        yield event


def job_list_path(namespace: str, job: str, **params: str) -> str:
    """The list (or, with watch=1, the watch) of exactly one job: RBAC's resourceNames allow a
    list or watch only with this field selector."""
    query = urllib.parse.urlencode({"fieldSelector": f"metadata.name={job}", **params})
    return f"{JOBS.format(ns=namespace)}?{query}"


def lease_path(namespace: str, name: str) -> str:
    return LEASE.format(ns=namespace, name=name)
