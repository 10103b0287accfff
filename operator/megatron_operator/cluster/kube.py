"""The only module that talks to the Kubernetes API (besides kopf's own watching).

It moves raw JSON: reads skip the client's model deserialisation (slow for thousand-pod lists)
and writes send plain dicts. Creation is get-or-create (409 is success) and deletion treats 404 as
done, so every call is idempotent. Pods are created and deleted from a thread pool: a gang of
1,024 pods goes out concurrently rather than one request at a time.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from megatron_operator.api.job import GROUP, PLURAL, VERSION
from megatron_operator.core.names import LABEL_JOB_NAME, MANAGED_BY, SPEC_KEY, config_map_name
from megatron_operator.core.observe import format_time

log = logging.getLogger(__name__)
Obj = dict[str, Any]


class Conflict(Exception):
    """The object changed since it was read (resourceVersion mismatch): observe again."""


class Rejected(Exception):
    """The apiserver refused an object rendered from the spec as invalid (422): retrying the
    same spec cannot help."""


def _rejected(exc: ApiException) -> Rejected:
    try:
        message = str(json.loads(exc.body or "").get("message", exc.reason))
    except (TypeError, ValueError, AttributeError):
        message = str(exc.reason)
    return Rejected(message[:2000])


def _call(method: Any, *args: Any, **kwargs: Any) -> bytes:
    """Call an API method for its raw bytes, and give the connection back to the pool.

    Raw bytes skip the client's model deserialisation. With `_preload_content=False` urllib3
    keeps the connection checked out until released: without the release every call opened a
    new TLS connection, and the handshakes capped pod creation at ~30 pods/s."""
    resp = method(*args, _preload_content=False, **kwargs)
    try:
        return bytes(resp.data)
    finally:
        resp.release_conn()


def _json(method: Any, *args: Any, **kwargs: Any) -> Any:
    return json.loads(_call(method, *args, **kwargs))


class Kube:
    def __init__(self, api_client: kubernetes.client.ApiClient, workers: int = 32) -> None:
        self.client = api_client
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.rbac = kubernetes.client.RbacAuthorizationV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.coordination = kubernetes.client.CoordinationV1Api(api_client)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")

    @classmethod
    def connect(cls, workers: int = 32) -> Kube:
        """In-cluster config when running in a pod, else the current kubeconfig."""
        config = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(client_configuration=config)  # type: ignore[no-untyped-call]
        # Enough pooled connections for every thread that may call at once: the pod-gang pool,
        # the reconcile pool (handlers.RECONCILE_WORKERS) and the watches. A request beyond the
        # pool opens a new TLS connection and throws it away: the handshakes alone capped pod
        # creation at ~30 pods/s on 2 cores.
        config.connection_pool_maxsize = workers + 64
        return cls(kubernetes.client.ApiClient(config), workers)

    # --- MegatronJobs
    def get_job(self, namespace: str, name: str) -> Obj | None:
        try:
            return dict(
                _json(
                    self.custom.get_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    name,
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def replace_status(self, job: Obj, status: Obj) -> None:
        """Write the whole status (PUT with resourceVersion): stale removed keys cannot linger,
        and a concurrent change of the job makes this fail rather than overwrite."""
        body = {**job, "status": status}
        meta = job["metadata"]
        try:
            _call(
                self.custom.replace_namespaced_custom_object_status,
                GROUP,
                VERSION,
                meta["namespace"],
                PLURAL,
                meta["name"],
                body,
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                raise Conflict(f"{meta['namespace']}/{meta['name']}: {exc.reason}") from None
            raise

    def delete_job(self, namespace: str, name: str) -> None:
        self._ignore_404(
            lambda: _call(
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body={"propagationPolicy": "Background"},
            )
        )

    # --- pods
    def list_pods(self, namespace: str, job: str) -> list[Obj]:
        doc = _json(
            self.core.list_namespaced_pod, namespace, label_selector=f"{LABEL_JOB_NAME}={job}"
        )
        return list(doc.get("items") or [])

    def create_pods(self, pods: list[Obj]) -> int:
        """Create concurrently; a pod that already exists counts as done. Returns how many
        this call created."""
        return sum(self.pool.map(self._create_pod, pods))

    def _create_pod(self, pod: Obj) -> int:
        try:
            _call(self.core.create_namespaced_pod, pod["metadata"]["namespace"], pod)
            return 1
        except ApiException as exc:
            if exc.status == 409:
                return 0
            if exc.status == 422:
                raise _rejected(exc) from None
            raise

    def delete_pods(self, namespace: str, names: Iterable[str]) -> None:
        """Delete with each pod's own grace period (the trainer checkpoints on SIGTERM)."""
        list(self.pool.map(lambda n: self._delete_pod(namespace, n), names))

    def _delete_pod(self, namespace: str, name: str) -> None:
        self._ignore_404(lambda: _call(self.core.delete_namespaced_pod, name, namespace))

    # --- watches (raw streams; watch.py parses them)
    def watch_pods(self, namespace: str | None, version: str | None, timeout: int) -> Any:
        """A watch stream of pods with our job label, in one namespace or all."""
        kw = self._watch_args(version, timeout)
        kw["label_selector"] = LABEL_JOB_NAME
        if namespace is None:
            return self.core.list_pod_for_all_namespaces(**kw)
        return self.core.list_namespaced_pod(namespace, **kw)

    def list_nodes(self) -> tuple[list[Obj], str | None]:
        """Every node, and the resourceVersion to watch from."""
        doc = _json(self.core.list_node)
        version = (doc.get("metadata") or {}).get("resourceVersion")
        return list(doc.get("items") or []), str(version) if version else None

    def watch_nodes(self, version: str | None, timeout: int) -> Any:
        return self.core.list_node(**self._watch_args(version, timeout))

    @staticmethod
    def _watch_args(version: str | None, timeout: int) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "watch": True,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout,
            "_preload_content": False,
        }
        if version:
            kw["resource_version"] = version
        return kw

    # --- the other children
    def ensure_children(self, objs: list[Obj]) -> None:
        """Get-or-create the non-pod children. The ConfigMap and the Role are replaced when they
        exist, since a new attempt may run a changed spec (e.g. a resize while suspended)."""
        core, rbac = self.core, self.rbac
        methods: dict[str, tuple[Any, Any]] = {
            "ConfigMap": (core.create_namespaced_config_map, core.replace_namespaced_config_map),
            "Role": (rbac.create_namespaced_role, rbac.replace_namespaced_role),
            "ServiceAccount": (core.create_namespaced_service_account, None),
            "Service": (core.create_namespaced_service, None),
            "PersistentVolumeClaim": (core.create_namespaced_persistent_volume_claim, None),
            "RoleBinding": (rbac.create_namespaced_role_binding, None),
            # Never replaced: it holds the trainer's latest progress record.
            "Lease": (self.coordination.create_namespaced_lease, None),
        }
        for obj in objs:
            create, replace = methods[obj["kind"]]
            ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
            try:
                _call(create, ns, obj)
            except ApiException as exc:
                if exc.status == 422:
                    raise _rejected(exc) from None
                if exc.status != 409:
                    raise
                if replace is not None:
                    _call(replace, name, ns, obj)

    def accepted_spec(self, namespace: str, job: str) -> Obj | None:
        """The spec the running attempt was started from (kept in the job's ConfigMap)."""
        try:
            doc = _json(self.core.read_namespaced_config_map, config_map_name(job), namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        text = (doc.get("data") or {}).get(SPEC_KEY)
        try:
            spec = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            return None
        return spec if isinstance(spec, dict) else None

    # --- the progress Lease (the trainer writes it; see core/observe.lease_view)
    def get_lease(self, namespace: str, name: str) -> Obj | None:
        try:
            return dict(_json(self.coordination.read_namespaced_lease, name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def watch_leases(self, namespace: str | None, version: str | None, timeout: int) -> Any:
        """A watch stream of Leases with our job label, in one namespace or all."""
        kw = self._watch_args(version, timeout)
        kw["label_selector"] = LABEL_JOB_NAME
        if namespace is None:
            return self.coordination.list_lease_for_all_namespaces(**kw)
        return self.coordination.list_namespaced_lease(namespace, **kw)

    def delete_children(self, namespace: str, job: str) -> None:
        """Delete everything labelled with the job, without waiting for the garbage collector
        to discover the CRD kind (up to 30 s after it is installed)."""
        selector = f"{LABEL_JOB_NAME}={job},app.kubernetes.io/managed-by={MANAGED_BY}"
        pods = [p["metadata"]["name"] for p in self.list_pods(namespace, job)]
        self.delete_pods(namespace, pods)
        for delete in (
            self.core.delete_collection_namespaced_service_account,
            self.core.delete_collection_namespaced_config_map,
            self.core.delete_collection_namespaced_persistent_volume_claim,
            self.rbac.delete_collection_namespaced_role,
            self.rbac.delete_collection_namespaced_role_binding,
            self.coordination.delete_collection_namespaced_lease,
        ):
            _call(delete, namespace, label_selector=selector)
        # Services have no delete-collection endpoint.
        services = _json(self.core.list_namespaced_service, namespace, label_selector=selector)
        for svc in services.get("items") or []:
            name = svc["metadata"]["name"]
            self._ignore_404(
                lambda n=name: _call(self.core.delete_namespaced_service, n, namespace)
            )

    # --- events
    def event(self, job: Obj, type_: str, reason: str, message: str, now: datetime) -> None:
        meta = job["metadata"]
        stamp = format_time(now)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": job.get("apiVersion"),
                "kind": job.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": "megatron-operator"},
            "reportingComponent": "megatron-operator",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            _call(self.core.create_namespaced_event, meta["namespace"], body)
        except ApiException as exc:  # events are best effort; never block a reconcile on them
            log.warning("could not post event %s for %s: %s", reason, meta["name"], exc.reason)

    @staticmethod
    def _ignore_404(call: Any) -> None:
        try:
            call()
        except ApiException as exc:
            if exc.status != 404:
                raise
