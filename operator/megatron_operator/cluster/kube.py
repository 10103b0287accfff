"""The only module that talks to the Kubernetes API (besides kopf's own watching).

It moves raw JSON: reads skip the client's model deserialisation (slow for thousand-pod lists)
and writes send plain dicts. Creation is get-or-create: a 409 is success only when the existing
object's controller ownerReference is the job (core/ownership.py; ChildConflict otherwise).
Deletion carries the object's uid as a precondition and treats 404 and 409 as done, so every
call is idempotent and never removes an object other than the one observed. Pods are created and deleted from a thread pool: a gang of
1,024 pods goes out concurrently rather than one request at a time.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from megatron_contract.paths import COORDINATOR_KEY
from megatron_operator.api.defaults import PLURAL as DEFAULTS_PLURAL
from megatron_operator.api.job import GROUP, KIND, PLURAL, VERSION
from megatron_operator.cluster.gangcalls import FairPool, slow_start
from megatron_operator.core.names import LABEL_JOB_NAME, MANAGED_BY, SPEC_KEY, config_map_name
from megatron_operator.core.observe import controller_uid, format_time, slim_pod
from megatron_operator.core.ownership import UPDATED_KINDS, conflict, sealed

log = logging.getLogger(__name__)
Obj = dict[str, Any]


class Conflict(Exception):
    """The object changed since it was read (resourceVersion mismatch): observe again."""


class Rejected(Exception):
    """The apiserver refused an object rendered from the spec as invalid (422): retrying the
    same spec cannot help."""


class ChildConflict(Exception):
    """An object with a child's name exists and is not the job's (core/ownership.py): the
    message names it and what to do."""


def _rejected(exc: ApiException) -> Rejected:
    try:
        message = str(json.loads(exc.body or "").get("message", exc.reason))
    except (TypeError, ValueError, AttributeError):
        message = str(exc.reason)
    return Rejected(message[:2000])


# Client-side timeouts (connect, read) of every call: without them a half-open connection (an
# apiserver that died mid-request, a dropped packet) hangs a reconcile thread forever, and with
# 32 of them the operator stops without any error.
CALL_TIMEOUT = (5.0, 30.0)
# A watch's read timeout: the server ends a watch after `timeout` seconds, and bookmarks arrive
# about once a minute, so a stream silent for longer than this is dead.
WATCH_READ_SLACK = 90.0
# `mjob logs -f`: a training log may stay silent for long (a checkpoint, a slow step).
FOLLOW_READ_TIMEOUT = 24 * 3600.0


def call(method: Any, *args: Any, **kwargs: Any) -> bytes:
    """Call an API method for its raw bytes, and give the connection back to the pool.

    Raw bytes skip the client's model deserialisation. With `_preload_content=False` urllib3
    keeps the connection checked out until released: without the release every call opened a
    new TLS connection, and the handshakes capped pod creation at ~30 pods/s."""
    kwargs.setdefault("_request_timeout", CALL_TIMEOUT)
    resp = method(*args, _preload_content=False, **kwargs)
    try:
        return bytes(resp.data)
    finally:
        resp.release_conn()


def call_json(method: Any, *args: Any, **kwargs: Any) -> Any:
    return json.loads(call(method, *args, **kwargs))


LIST_PAGE = 10  # pods per page: a pod at the template budget is ~1 MB of Python objects


def _pages(method: Any, *args: Any, **kwargs: Any) -> Iterator[tuple[list[Obj], str | None]]:
    """A LIST in pages of LIST_PAGE, each with the list's resourceVersion (every page of one
    list is the same snapshot). An expired continue token raises 410, as a stale watch does:
    the caller lists again."""
    token: str | None = None
    while True:
        extra: dict[str, Any] = {"limit": LIST_PAGE}
        if token:
            extra["_continue"] = token
        doc = call_json(method, *args, **kwargs, **extra)
        meta = doc.get("metadata") or {}
        version = meta.get("resourceVersion")
        yield list(doc.get("items") or []), str(version) if version else None
        token = meta.get("continue")
        if not token:
            return


def with_coordinator_key(obj: Obj) -> Obj:
    """The job's coordinator Secret with a fresh random key (the renderer leaves it out: the
    core is deterministic). Used only when the Secret is created; an existing one of the job
    keeps its key, which its running pods mount."""
    if obj.get("kind") != "Secret" or (obj.get("data") or {}).get(COORDINATOR_KEY):
        return obj
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    return {**obj, "data": {**(obj.get("data") or {}), COORDINATOR_KEY: key}}


def _retained(obj: Obj) -> bool:
    """A claim rendered without a controller: kept after its job, and reused by a job of the
    same name only with the seal we put on it."""
    meta = obj.get("metadata") or {}
    return obj.get("kind") == "PersistentVolumeClaim" and controller_uid(meta) is None


class Kube:
    def __init__(self, api_client: kubernetes.client.ApiClient, workers: int = 32) -> None:
        self.client = api_client
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.rbac = kubernetes.client.RbacAuthorizationV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.networking = kubernetes.client.NetworkingV1Api(api_client)
        self.coordination = kubernetes.client.CoordinationV1Api(api_client)
        # Background calls (events). Pods go through `gang`: slow start per job, fair across
        # jobs (cluster/gangcalls.py).
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")
        self.gang = FairPool(workers)
        # Seals the checkpoint claims we create without a controller (core/ownership.py).
        self.claim_key: bytes | None = None
        self._defaults_unreadable = False  # warned once that MegatronJobDefaults are unreadable

    @classmethod
    def connect(cls, workers: int = 32) -> Kube:
        """In-cluster config when running in a pod, else the current kubeconfig."""
        config = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call,unused-ignore]
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(client_configuration=config)  # type: ignore[no-untyped-call,unused-ignore]
        # Enough pooled connections for every thread that may call at once: the pod-gang pool,
        # the reconcile pool (handlers.RECONCILE_WORKERS) and the watches. A request beyond the
        # pool opens a new TLS connection and throws it away: the handshakes alone capped pod
        # creation at ~30 pods/s on 2 cores.
        config.connection_pool_maxsize = workers + 64
        return cls(kubernetes.client.ApiClient(config), workers)

    @staticmethod
    def default_namespace() -> str:
        """The namespace `kubectl` would use: the pod's own in a cluster, else the current
        kubeconfig context's, else default."""
        try:
            with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
                return f.read().strip() or "default"
        except OSError:
            pass
        try:
            _, current = kubernetes.config.list_kube_config_contexts()
        except (kubernetes.config.ConfigException, OSError):
            return "default"
        return str((current or {}).get("context", {}).get("namespace") or "default")

    # --- MegatronJobs
    def get_job(self, namespace: str, name: str) -> Obj | None:
        try:
            return dict(
                call_json(
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
            call(
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

    def delete_job(self, namespace: str, name: str, uid: str | None) -> None:
        """Delete the job (ttlSecondsAfterFinished) we observed, by its uid: a job re-created
        under the same name in between is not touched (409, done)."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            call(
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body=body,
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    # --- MegatronJobDefaults
    def list_job_defaults(self, namespace: str) -> list[Obj]:
        """The namespace's MegatronJobDefaults, by name; none where the cluster has no such CRD
        or the operator may not read them (an older chart's RBAC): jobs then run on their own
        spec and the operator's defaults, as before the kind existed."""
        try:
            doc = call_json(
                self.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                DEFAULTS_PLURAL,
            )
        except ApiException as exc:
            if exc.status in (403, 404):
                if not self._defaults_unreadable:
                    log.warning(
                        "cannot list %s (%s %s): jobs get only the operator's defaults",
                        DEFAULTS_PLURAL,
                        exc.status,
                        exc.reason,
                    )
                self._defaults_unreadable = True
                return []
            raise
        items = [i for i in doc.get("items") or [] if isinstance(i, dict)]
        return sorted(items, key=lambda i: str((i.get("metadata") or {}).get("name", "")))

    # --- pods
    def list_pods(self, namespace: str, job: str, slim: bool = False) -> list[Obj]:
        """The job's pods, listed in pages; with `slim`, as much of each as pod_view reads."""
        items: list[Obj] = []
        selector = f"{LABEL_JOB_NAME}={job}"
        for page, _ in _pages(self.core.list_namespaced_pod, namespace, label_selector=selector):
            items += [slim_pod(p) for p in page] if slim else page
        return items

    def create_pods(self, pods: Sequence[Obj], job_uid: str | None = None) -> int:
        """Create in slow-start batches, fairly with other jobs' calls; a pod that already
        exists counts as done when it is the job's own (ChildConflict otherwise). Returns how
        many this call created. Each pod is read from `pods` by the worker that creates it: a
        lazy sequence (core/render.Pods) renders it then, so at most a worker's share of a
        gang is rendered at once."""
        if not pods:
            return 0
        first = pods[0]
        meta = first["metadata"]
        key = (str(meta["namespace"]), str((meta.get("labels") or {}).get(LABEL_JOB_NAME, "")))

        def create(i: int) -> int:
            return self._create_pod(first if i == 0 else pods[i], job_uid)

        return sum(slow_start(self.gang, key, create, range(len(pods))))

    def _create_pod(self, pod: Obj, job_uid: str | None) -> int:
        try:
            call(self.core.create_namespaced_pod, pod["metadata"]["namespace"], pod)
            return 1
        except ApiException as exc:
            if exc.status == 409:
                self._check_owner(pod, job_uid)
                return 0
            if exc.status == 422:
                raise _rejected(exc) from None
            raise

    def delete_pods(
        self,
        namespace: str,
        names: Iterable[str],
        uids: dict[str, str] | None = None,
        force: bool = False,
        job: str = "",
    ) -> None:
        """Delete with each pod's own grace period (the trainer checkpoints on SIGTERM), and
        with its uid as a precondition, so only the very pod that was observed goes. `force`:
        no grace period (a pod on a lost node, whose kubelet cannot confirm the delete). In
        slow-start batches, fairly with other jobs' calls (`job` names whose turn it is)."""
        uids = uids or {}
        slow_start(
            self.gang,
            (namespace, job),
            lambda n: self._delete_pod(namespace, n, uids.get(n), force),
            list(names),
        )

    def _delete_pod(self, namespace: str, name: str, uid: str | None, force: bool) -> None:
        self._delete(self.core.delete_namespaced_pod, namespace, name, uid, force)

    def _delete(
        self, method: Any, namespace: str, name: str, uid: str | None, force: bool = False
    ) -> None:
        """Delete one object; with a uid, only that object. 404 (gone) and 409 (the uid
        precondition failed: that object is gone, and another has the name) are done."""
        body: dict[str, Any] | None = {"preconditions": {"uid": uid}} if uid else None
        if force:
            body = {**(body or {}), "gracePeriodSeconds": 0}
        try:
            call(method, name, namespace, body=body)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    # --- watches (raw streams; watch.py parses them)
    def watch_pods(self, namespace: str | None, version: str | None, timeout: int) -> Any:
        """A watch stream of pods with our job label, in one namespace or all."""
        kw = self._watch_args(version, timeout)
        kw["label_selector"] = LABEL_JOB_NAME
        if namespace is None:
            return self.core.list_pod_for_all_namespaces(**kw)
        return self.core.list_namespaced_pod(namespace, **kw)

    def list_all_pods(self, namespace: str | None) -> tuple[list[Obj], str | None]:
        """Every pod with our job label (in one namespace or all), as much of each as the pod
        cache reads (core/observe.slim_pod), and the version to watch from. Listed in pages: a
        relist of every gang in the cluster, each pod carrying its job's template, was once
        parsed whole."""
        selector = LABEL_JOB_NAME
        if namespace is None:
            pages = _pages(self.core.list_pod_for_all_namespaces, label_selector=selector)
        else:
            pages = _pages(self.core.list_namespaced_pod, namespace, label_selector=selector)
        items: list[Obj] = []
        version: str | None = None
        for page, page_version in pages:
            items += [slim_pod(p) for p in page]
            version = page_version
        return items, version

    def list_nodes(self) -> tuple[list[Obj], str | None]:
        """Every node, and the resourceVersion to watch from."""
        doc = call_json(self.core.list_node)
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
            "_request_timeout": (CALL_TIMEOUT[0], WATCH_READ_SLACK),
        }
        if version:
            kw["resource_version"] = version
        return kw

    # --- the other children
    def _methods(self, kind: str) -> tuple[Any, Any, Any, Any]:
        """create, read, replace and delete of a child kind (namespace, then name/body)."""
        core, rbac, net = self.core, self.rbac, self.networking
        return {
            "Secret": (
                core.create_namespaced_secret,
                core.read_namespaced_secret,
                core.replace_namespaced_secret,
                core.delete_namespaced_secret,
            ),
            "ConfigMap": (
                core.create_namespaced_config_map,
                core.read_namespaced_config_map,
                core.replace_namespaced_config_map,
                core.delete_namespaced_config_map,
            ),
            "Role": (
                rbac.create_namespaced_role,
                rbac.read_namespaced_role,
                rbac.replace_namespaced_role,
                rbac.delete_namespaced_role,
            ),
            "RoleBinding": (
                rbac.create_namespaced_role_binding,
                rbac.read_namespaced_role_binding,
                rbac.replace_namespaced_role_binding,
                rbac.delete_namespaced_role_binding,
            ),
            "ServiceAccount": (
                core.create_namespaced_service_account,
                core.read_namespaced_service_account,
                core.replace_namespaced_service_account,
                core.delete_namespaced_service_account,
            ),
            "Service": (
                core.create_namespaced_service,
                core.read_namespaced_service,
                core.replace_namespaced_service,
                core.delete_namespaced_service,
            ),
            "PersistentVolumeClaim": (
                core.create_namespaced_persistent_volume_claim,
                core.read_namespaced_persistent_volume_claim,
                core.replace_namespaced_persistent_volume_claim,
                core.delete_namespaced_persistent_volume_claim,
            ),
            "NetworkPolicy": (
                net.create_namespaced_network_policy,
                net.read_namespaced_network_policy,
                net.replace_namespaced_network_policy,
                net.delete_namespaced_network_policy,
            ),
            # Created, never replaced: it holds the trainer's latest progress record.
            "Lease": (
                self.coordination.create_namespaced_lease,
                self.coordination.read_namespaced_lease,
                self.coordination.replace_namespaced_lease,
                self.coordination.delete_namespaced_lease,
            ),
            "Pod": (
                core.create_namespaced_pod,
                core.read_namespaced_pod,
                core.replace_namespaced_pod,
                core.delete_namespaced_pod,
            ),
        }[kind]

    def _check_owner(self, obj: Obj, job_uid: str | None) -> Obj:
        """The existing object under `obj`'s name, if it is the job's; ChildConflict if not."""
        _, read, _, _ = self._methods(obj["kind"])
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        try:
            existing = dict(call_json(read, name, ns))
        except ApiException as exc:
            if exc.status == 404:  # deleted since the 409: observe again
                raise Conflict(f"{obj['kind']} {ns}/{name} went away") from None
            raise
        problem = conflict(obj, existing, job_uid, self.claim_key)
        if problem is not None:
            raise ChildConflict(problem)
        return existing

    def ensure_children(self, objs: list[Obj], job_uid: str | None = None) -> None:
        """Get-or-create the non-pod children. An existing object is used only when it is the
        job's own (ChildConflict otherwise); the ConfigMap and the Role are then replaced, since
        a new attempt may run a changed spec (e.g. a resize while suspended) and new pods."""
        key = self.claim_key
        objs = [with_coordinator_key(o) for o in objs]
        for obj in [sealed(o, key) if _retained(o) and key is not None else o for o in objs]:
            create, _, replace, _ = self._methods(obj["kind"])
            ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
            try:
                call(create, ns, obj)
            except ApiException as exc:
                if exc.status == 422:
                    raise _rejected(exc) from None
                if exc.status != 409:
                    raise
                existing = self._check_owner(obj, job_uid)
                if obj["kind"] in UPDATED_KINDS:
                    # With the version read: if it changed since, the replace fails (409).
                    version = (existing.get("metadata") or {}).get("resourceVersion")
                    body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}
                    try:
                        call(replace, name, ns, body)
                    except ApiException as exc2:
                        if exc2.status == 409:
                            raise Conflict(f"{obj['kind']} {ns}/{name} changed") from None
                        raise

    def accepted_spec(self, namespace: str, job: str) -> Obj | None:
        """The spec the running attempt was started from (kept in the job's ConfigMap)."""
        try:
            doc = call_json(self.core.read_namespaced_config_map, config_map_name(job), namespace)
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
            return dict(call_json(self.coordination.read_namespaced_lease, name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list_all_leases(self, namespace: str | None) -> tuple[list[Obj], str | None]:
        """Every Lease with our job label (in one namespace or all), and the version to watch
        from."""
        co, selector = self.coordination, LABEL_JOB_NAME
        if namespace is None:
            doc = call_json(co.list_lease_for_all_namespaces, label_selector=selector)
        else:
            doc = call_json(co.list_namespaced_lease, namespace, label_selector=selector)
        version = (doc.get("metadata") or {}).get("resourceVersion")
        return list(doc.get("items") or []), str(version) if version else None

    def watch_leases(self, namespace: str | None, version: str | None, timeout: int) -> Any:
        """A watch stream of Leases with our job label, in one namespace or all."""
        kw = self._watch_args(version, timeout)
        kw["label_selector"] = LABEL_JOB_NAME
        if namespace is None:
            return self.coordination.list_lease_for_all_namespaces(**kw)
        return self.coordination.list_namespaced_lease(namespace, **kw)

    def delete_children(self, namespace: str, job: str, uid: str) -> None:
        """Delete the children a deleted job controlled (its uid in their controller
        ownerReference), each by uid, without waiting for the garbage collector to discover
        the CRD kind (up to 30 s after it is installed). Only a speed-up: the collector does
        the same. Retained claims have no ownerReference and stay; foreign objects are kept."""
        selector = f"{LABEL_JOB_NAME}={job},app.kubernetes.io/managed-by={MANAGED_BY}"
        core, rbac, net = self.core, self.rbac, self.networking
        for kind, list_ in (
            ("Pod", core.list_namespaced_pod),
            ("ServiceAccount", core.list_namespaced_service_account),
            ("ConfigMap", core.list_namespaced_config_map),
            ("Secret", core.list_namespaced_secret),
            ("PersistentVolumeClaim", core.list_namespaced_persistent_volume_claim),
            ("Role", rbac.list_namespaced_role),
            ("RoleBinding", rbac.list_namespaced_role_binding),
            ("Service", core.list_namespaced_service),
            ("NetworkPolicy", net.list_namespaced_network_policy),
        ):  # not the progress Lease: the garbage collector removes it (no delete right)
            try:
                items = call_json(list_, namespace, label_selector=selector).get("items") or []
            except ApiException as exc:
                if exc.status == 403:  # e.g. NetworkPolicies without --network-policy's RBAC
                    continue
                raise
            delete = self._methods(kind)[3]
            for item in items:
                meta = item.get("metadata") or {}
                if controller_uid(meta) == uid:
                    self._delete(delete, namespace, meta["name"], uid=meta.get("uid"))

    # --- what `mjob status` and `mjob logs` read
    def job_events(self, namespace: str, name: str) -> list[Obj]:
        """The events about a MegatronJob (the operator's own, and anyone else's)."""
        selector = f"involvedObject.kind={KIND},involvedObject.name={name}"
        doc = call_json(self.core.list_namespaced_event, namespace, field_selector=selector)
        return list(doc.get("items") or [])

    def pod_log(self, namespace: str, pod: str, tail_lines: int | None = None) -> str:
        kw: dict[str, Any] = {"tail_lines": tail_lines} if tail_lines else {}
        return call(self.core.read_namespaced_pod_log, pod, namespace, **kw).decode(
            "utf-8", errors="replace"
        )

    def follow_pod_log(self, namespace: str, pod: str) -> Iterable[bytes]:
        """The pod's log as it is written, until the container ends (kubectl logs -f)."""
        resp: Any = self.core.read_namespaced_pod_log(
            pod,
            namespace,
            follow=True,
            _preload_content=False,
            _request_timeout=(CALL_TIMEOUT[0], FOLLOW_READ_TIMEOUT),
        )
        try:
            yield from resp.stream(4096)
        finally:
            resp.release_conn()

    # --- events
    def event(self, job: Obj, type_: str, reason: str, message: str, now: datetime) -> str | None:
        """Post an Event on the job; its name, or None when it could not be posted."""
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
            made = json.loads(call(self.core.create_namespaced_event, meta["namespace"], body))
        except ApiException as exc:  # events are best effort; never block a reconcile on them
            log.warning("could not post event %s for %s: %s", reason, meta["name"], exc.reason)
            return None
        name = (made.get("metadata") or {}).get("name") if isinstance(made, dict) else None
        return str(name) if name else None

    def bump_event(self, namespace: str, name: str, count: int, now: datetime) -> None:
        """An event seen again: its count and lastTimestamp, not a new Event object."""
        body = {"count": count, "lastTimestamp": format_time(now)}
        try:
            call(self.core.patch_namespaced_event, name, namespace, body)
        except ApiException as exc:  # best effort, as above
            log.warning("could not update event %s/%s: %s", namespace, name, exc.reason)
