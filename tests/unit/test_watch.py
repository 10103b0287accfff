"""The node cache's sync rule: nothing is concluded about nodes before the whole list is in.

An operator restart used to read every pod's node as gone (the node watch had not delivered it
yet) and gang-restart every running job. The Watcher now lists first, then watches from the
list's resourceVersion, and says `synced` only after the list was handled.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from megatron_operator.cluster.watch import NodeReadiness, PodCache, Watcher


class _Stream:
    def __init__(self, events: list[dict[str, Any]], stop: threading.Event) -> None:
        self.body = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.stop = stop

    def stream(self, amt: Any = None, decode_content: bool = True) -> Any:
        yield self.body
        self.stop.set()

    def release_conn(self) -> None:
        pass


def _node(name: str, ready: bool, version: str = "1") -> dict[str, Any]:
    cond = {"type": "Ready", "status": "True" if ready else "False"}
    cond["lastTransitionTime"] = "2026-11-23T12:00:00Z"
    meta = {"name": name, "resourceVersion": version}
    return {"metadata": meta, "status": {"conditions": [cond]}}


def test_nodes_are_listed_before_the_watch_and_synced_only_then() -> None:
    wakes: list[int] = []
    readiness = NodeReadiness(lambda: wakes.append(1))
    watched_from: list[str | None] = []
    seen_at_watch: list[bool] = []

    watcher: Watcher

    def start_watch(version: str | None) -> _Stream:
        watched_from.append(version)
        seen_at_watch.append(watcher.synced.is_set())
        event = {"type": "MODIFIED", "object": _node("gpu-node-1", False, "11")}
        return _Stream([event], watcher.stopping)

    listed = [_node(f"gpu-node-{i}", True) for i in range(1024)]
    watcher = Watcher(
        "nodes",
        start_watch,
        readiness.handle,
        list_all=lambda: (listed, "10"),
        on_synced=readiness.synced,
    )
    assert not watcher.synced.is_set()
    assert readiness.lookup("gpu-node-5") == (False, None)  # unknown, not yet "gone"
    watcher.run()  # in this thread: list, one watch stream, then the stream stops it
    assert watched_from == ["10"]  # watched from the list's resourceVersion, not from scratch
    assert seen_at_watch == [True]
    assert readiness.lookup("gpu-node-5") == (True, None)
    exists, since = readiness.lookup("gpu-node-1")
    assert exists and since is not None  # the watch's NotReady change arrived
    # One wake for the whole list (not 1,024), one for the readiness change.
    assert len(wakes) == 2


def test_a_heartbeat_does_not_wake_the_jobs() -> None:
    wakes: list[int] = []
    readiness = NodeReadiness(lambda: wakes.append(1))
    readiness.synced()
    readiness.handle("ADDED", _node("a", True))
    readiness.handle("MODIFIED", _node("a", True, "2"))
    assert len(wakes) == 2  # synced, then "a" appeared; the heartbeat changed nothing


def test_a_refused_watch_backs_off_instead_of_retrying_every_second() -> None:
    from kubernetes.client.exceptions import ApiException

    calls: list[int] = []
    delays: list[float] = []

    def refused(version: str | None) -> Any:
        calls.append(1)
        raise ApiException(status=403, reason="Forbidden")

    watcher = Watcher("workloads/ns", refused, lambda kind, obj: None)

    def wait(seconds: float | None = None) -> bool:
        delays.append(float(seconds or 0))
        if len(delays) >= 8:
            watcher.stopping.set()
        return watcher.stopping.is_set()

    watcher.stopping.wait = wait  # type: ignore[method-assign]
    watcher.run()
    assert len(calls) == 8
    # 0.5 s doubling, jittered down to half at most, capped at 30 s.
    assert delays[0] <= 0.5 and delays[-1] >= 15.0
    assert all(d <= 30.0 for d in delays)
    assert sum(delays) > 30.0  # a flat 1 s retry would have waited 8 s in all


def _pod(name: str, job: str, ns: str = "team", phase: str = "Running") -> dict[str, Any]:
    meta = {
        "name": name,
        "namespace": ns,
        "uid": f"uid-{name}",
        "resourceVersion": "5",
        "labels": {"megatron.dev/job-name": job},
    }
    return {"metadata": meta, "spec": {"nodeName": "n1"}, "status": {"phase": phase}}


def test_the_pod_cache_answers_only_after_its_list_and_follows_the_watch() -> None:
    """Reconciles read pods from here instead of LISTing them; an incomplete cache answers None
    (the caller LISTs), since a pod it lacks would read as deleted."""
    wakes: list[tuple[str, str]] = []
    cache = PodCache(lambda ns, job: wakes.append((ns, job)))
    assert cache.pods("team", "a") is None
    watcher: Watcher

    def start_watch(version: str | None) -> _Stream:
        assert cache.pods("team", "a") is not None  # the list is in before the watch starts
        events = [
            {"type": "MODIFIED", "object": _pod("a-a0-0", "a", phase="Failed")},
            {"type": "DELETED", "object": _pod("a-a0-1", "a")},
            {"type": "ADDED", "object": _pod("b-a0-0", "b")},
            {"type": "MODIFIED", "object": _pod("c-a0-0", "b")},  # relabelled from c to b
        ]
        return _Stream(events, watcher.stopping)

    listed = [_pod("a-a0-0", "a"), _pod("a-a0-1", "a"), _pod("c-a0-0", "c")]
    watcher = Watcher(
        "pods",
        start_watch,
        cache.handle,
        list_all=lambda: (listed, "4"),
        replace=lambda items: cache.replace(None, items),
    )
    watcher.run()
    a = cache.pods("team", "a")
    assert a is not None and [(p.name, p.phase) for p in a] == [("a-a0-0", "Failed")]
    b = cache.pods("team", "b")
    assert b is not None and sorted(p.name for p in b) == ["b-a0-0", "c-a0-0"]
    assert cache.pods("team", "c") == []  # moved, not left behind under its old job
    assert cache.pods("other", "a") == []  # listed cluster-wide: every namespace is known
    assert ("team", "c") in wakes and ("team", "b") in wakes


def test_a_relist_replaces_its_scope_at_once() -> None:
    """After a 410 the watch lists again: pods deleted meanwhile must go, and only in the
    relisted namespace."""
    cache = PodCache(lambda ns, job: None)
    cache.replace("x", [_pod("a-a0-0", "a", "x"), _pod("a-a0-1", "a", "x")])
    assert cache.pods("y", "a") is None  # namespace y not listed yet
    cache.replace("y", [_pod("a-a0-0", "a", "y")])
    cache.replace("x", [_pod("a-a0-1", "a", "x")])
    x, y = cache.pods("x", "a"), cache.pods("y", "a")
    assert x is not None and [p.name for p in x] == ["a-a0-1"]
    assert y is not None and [p.name for p in y] == ["a-a0-0"]


def test_the_pod_list_is_read_in_pages_and_keeps_only_what_the_cache_reads() -> None:
    from types import SimpleNamespace

    from megatron_operator.cluster import kube as kube_module
    from megatron_operator.core.observe import pod_view

    def pod(i: int) -> dict[str, Any]:
        return {
            "metadata": {
                "name": f"j-a0-{i}",
                "namespace": "ns",
                "labels": {"megatron.dev/job-name": "j", "megatron.dev/node-rank": str(i)},
                "annotations": {"big": "x" * 10_000, "megatron.dev/restart-strategy": "InPlace"},
                "managedFields": [{"manager": "x" * 1000}],
            },
            "spec": {"nodeName": f"n{i}", "containers": [{"name": "s", "env": ["e"] * 1000}]},
            "status": {"phase": "Running"},
        }

    calls: list[dict[str, Any]] = []
    pages = {None: ([pod(0), pod(1)], "t1"), "t1": ([pod(2)], None)}

    class Resp:
        def __init__(self, body: bytes) -> None:
            self.data = body

        def release_conn(self) -> None:
            pass

    def list_namespaced_pod(namespace: str, **kw: Any) -> Resp:
        calls.append(kw)
        items, token = pages[kw.get("_continue")]
        meta = {"resourceVersion": "42", **({"continue": token} if token else {})}
        return Resp(json.dumps({"items": items, "metadata": meta}).encode())

    fake = SimpleNamespace(core=SimpleNamespace(list_namespaced_pod=list_namespaced_pod))
    items, version = kube_module.Kube.list_all_pods(fake, "ns")  # type: ignore[arg-type]
    assert version == "42" and [c.get("limit") for c in calls] == [kube_module.LIST_PAGE] * 2
    assert [i["metadata"]["name"] for i in items] == ["j-a0-0", "j-a0-1", "j-a0-2"]
    assert len(json.dumps(items)) < 2000  # no spec, no template annotation, no managedFields
    assert pod_view(items[2]) == pod_view(pod(2))
