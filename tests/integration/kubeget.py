"""`kubectl get ... -o json` answered in-process, over one kept-alive HTTPS connection per thread.

The tests poll the apiserver several times a second (a job's status, its pods, a Lease). Each poll
was a kubectl process: a Go binary started, its client built, discovery read from disk, one GET
made. A CI run started over 12,000 of them, about 0.07 s of CPU each on the client side alone,
on 2 cores that the trainer tests need. Here the same GET is a request on an open connection.

Only what kubectl would answer the same way is answered here: `get` of one resource kind, at most
one name, `-n/--namespace`, `-A`, `-l/--selector`, `--field-selector` and `-o json`. Anything
else (another output, several names, a flag not listed) returns None and the caller runs kubectl.
The answer is shaped as kubectl's: a list is `kind: List` with `apiVersion` and `kind` on every
item; an error is kubectl's exit code 1 and its `Error from server (Reason): message` line.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.parse
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DISCOVERY_ACCEPT = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
)


@dataclass(frozen=True)
class Resource:
    group_version: str  # "v1" or "group/version"
    plural: str
    kind: str
    namespaced: bool

    def path(self, namespace: str | None, name: str | None) -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{urllib.parse.quote(namespace)}"
        base += f"/{self.plural}"
        return base + (f"/{urllib.parse.quote(name)}" if name else "")


@dataclass
class Query:
    resource: str  # as typed: "pods", "mj", "crd/NAME"'s "crd", "workloads.kueue.x-k8s.io"
    name: str | None
    namespace: str | None
    all_namespaces: bool
    label_selector: str | None
    field_selector: str | None


class Answer:
    """What subprocess.run would have returned for kubectl."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def parse(args: tuple[str, ...]) -> Query | None:
    """The kubectl arguments this reader answers; None for anything else."""
    if not args or args[0] != "get":
        return None
    positional: list[str] = []
    namespace = label = field = None
    all_ns = False
    output = None
    i = 1
    while i < len(args):
        a = args[i]
        value_flags = {
            "-n",
            "--namespace",
            "-l",
            "--selector",
            "--field-selector",
            "-o",
            "--output",
        }
        if a in value_flags:
            if i + 1 >= len(args):
                return None
            v = args[i + 1]
            i += 2
        elif a.startswith("--") and "=" in a and a.split("=", 1)[0] in value_flags:
            a, v = a.split("=", 1)
            i += 1
        elif a in ("-A", "--all-namespaces"):
            all_ns = True
            i += 1
            continue
        elif a.startswith("-"):
            return None
        else:
            positional.append(a)
            i += 1
            continue
        if a in ("-n", "--namespace"):
            namespace = v
        elif a in ("-l", "--selector"):
            label = v
        elif a == "--field-selector":
            field = v
        else:
            output = v
    if output != "json" or not positional or len(positional) > 2:
        return None
    resource, name = positional[0], (positional[1] if len(positional) == 2 else None)
    if "/" in resource:
        if name is not None:
            return None
        resource, name = resource.split("/", 1)
    if "," in resource or not resource:
        return None
    return Query(resource.lower(), name, namespace, all_ns, label, field)


def _close_all(conns: list[http.client.HTTPSConnection]) -> None:
    for conn in conns:
        conn.close()


class Reader:
    """GETs against one apiserver as the cluster's admin (its client certificate)."""

    def __init__(self, server: str, ca: Path, cert: Path, key: Path) -> None:
        url = urllib.parse.urlsplit(server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.ctx.load_cert_chain(str(cert), str(key))
        self.local = threading.local()
        self.lock = threading.Lock()
        self.resources: dict[str, list[Resource]] | None = None
        # Every connection made, each thread's included: closed by close(), not left to the
        # garbage collector (an unclosed socket is a ResourceWarning, an error in this suite).
        self.conns: list[http.client.HTTPSConnection] = []
        self.conns_lock = threading.Lock()  # not self.lock: discovery makes connections under it
        # A Reader dropped without close() (a Cluster object a test let go of) closes its
        # connections when it is collected, before the sockets themselves would warn.
        weakref.finalize(self, _close_all, self.conns)

    def close(self) -> None:
        with self.conns_lock:
            conns = list(self.conns)
            self.conns.clear()
        _close_all(conns)

    # --- HTTP
    def _request(self, path: str, accept: str = "application/json") -> tuple[int, Any]:
        for attempt in (0, 1):
            conn: http.client.HTTPSConnection | None = getattr(self.local, "conn", None)
            if conn is None:
                conn = http.client.HTTPSConnection(
                    self.host, self.port, context=self.ctx, timeout=30
                )
                self.local.conn = conn
                with self.conns_lock:
                    self.conns.append(conn)
            try:
                conn.request("GET", path, headers={"Accept": accept})
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
                continue
            try:
                return resp.status, json.loads(raw) if raw else None
            except ValueError:
                return resp.status, {"message": raw.decode(errors="replace")}
        raise AssertionError("unreachable")

    # --- discovery (aggregated, one request per root; again when a name is not found)
    def _discover(self) -> dict[str, list[Resource]]:
        names: dict[str, list[Resource]] = {}
        for root in ("/api", "/apis"):
            status, body = self._request(root, DISCOVERY_ACCEPT)
            if status != 200 or not isinstance(body, dict):
                raise AssertionError(f"discovery of {root} failed: HTTP {status}")
            for group in body.get("items") or []:
                gname = group.get("metadata", {}).get("name", "")
                versions = group.get("versions") or []
                if not versions:
                    continue
                version = versions[0]  # the preferred one comes first
                gv = f"{gname}/{version['version']}" if gname else version["version"]
                for r in version.get("resources") or []:
                    plural = r["resource"]
                    res = Resource(
                        gv, plural, r["responseKind"]["kind"], r.get("scope") == "Namespaced"
                    )
                    keys = {
                        plural,
                        r.get("singularResource", ""),
                        r["responseKind"]["kind"].lower(),
                    }
                    keys |= set(r.get("shortNames") or [])
                    if gname:
                        keys |= {f"{k}.{gname}" for k in list(keys) if k}
                    for k in keys:
                        if k:
                            names.setdefault(k, []).append(res)
        return names

    def resolve(self, typed: str) -> Resource | None:
        for fresh in (False, True):
            with self.lock:
                if self.resources is None or fresh:
                    self.resources = self._discover()
                found = self.resources.get(typed)
            if found:
                return found[0]  # core first, then the apiserver's group order (kubectl's)
        return None

    # --- kubectl get
    def get(self, args: tuple[str, ...]) -> Answer | None:
        q = parse(args)
        if q is None:
            return None
        res = self.resolve(q.resource)
        if res is None:
            return None  # let kubectl say what it says about an unknown kind
        ns = None if (q.all_namespaces or not res.namespaced) else (q.namespace or "default")
        if q.name is not None and ns is None and res.namespaced:
            return None
        path = res.path(ns, q.name)
        params = {}
        if q.name is None:
            if q.label_selector:
                params["labelSelector"] = q.label_selector
            if q.field_selector:
                params["fieldSelector"] = q.field_selector
        elif q.label_selector or q.field_selector:
            return None
        if params:
            path += "?" + urllib.parse.urlencode(params)
        status, body = self._request(path)
        if status != 200:
            body = body if isinstance(body, dict) else {}
            reason = body.get("reason") or http.client.responses.get(status, "Unknown")
            message = body.get("message") or f"HTTP {status}"
            return Answer(1, "", f"Error from server ({reason}): {message}\n")
        if q.name is None:
            kind = res.kind
            items = []
            for item in body.get("items") or []:
                items.append({"apiVersion": res.group_version, "kind": kind, **item})
            body = {
                "apiVersion": "v1",
                "items": items,
                "kind": "List",
                "metadata": {"resourceVersion": ""},
            }
        return Answer(0, json.dumps(body), "")
