"""API failures: how each is classified, how long the retry waits, and what the job shows."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from megatron_operator.api.status import ConditionType, EventType, Reason
from megatron_operator.cluster.errors import ErrorKind, classify
from megatron_operator.core.backoff import Backoff
from megatron_operator.core.reconcile import World, reconcile

from .specs import job_doc, spec_of


def _api(status: int, message: str = "nope", headers: dict[str, str] | None = None) -> ApiException:
    exc = ApiException(status=status, reason="Reason")
    exc.body = json.dumps({"kind": "Status", "message": message})
    exc.headers = headers
    return exc


@pytest.mark.parametrize(
    ("exc", "kind", "persistent", "transient"),
    [
        (_api(409), ErrorKind.CONFLICT, False, False),
        (_api(404), ErrorKind.NOT_FOUND, False, False),
        (_api(403, "exceeded quota: q"), ErrorKind.FORBIDDEN, True, False),
        (_api(422), ErrorKind.INVALID, True, False),
        (_api(400), ErrorKind.INVALID, True, False),
        (_api(429), ErrorKind.THROTTLED, False, True),
        (_api(500), ErrorKind.UNAVAILABLE, False, True),
        (_api(503), ErrorKind.UNAVAILABLE, False, True),
        (_api(418), ErrorKind.OTHER, False, False),
        (ApiException(status=0, reason="connection refused"), ErrorKind.NETWORK, False, True),
        (
            urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"),
            ErrorKind.NETWORK,
            False,
            True,
        ),  # type: ignore[arg-type]
        (urllib3.exceptions.ProtocolError("reset"), ErrorKind.NETWORK, False, True),
        (ConnectionResetError("reset"), ErrorKind.NETWORK, False, True),
    ],
)
def test_classify(exc: BaseException, kind: ErrorKind, persistent: bool, transient: bool) -> None:
    err = classify(exc)
    assert err is not None
    assert err.kind == kind
    assert err.persistent is persistent
    assert err.transient is transient


def test_classify_keeps_the_apiserver_message_and_retry_after() -> None:
    err = classify(_api(429, "too many requests", {"Retry-After": "7"}))
    assert err is not None and err.retry_after == 7.0
    assert "too many requests" in str(err) and str(err).startswith("429 Throttled")
    forbidden = classify(_api(403, 'pods "x" is forbidden: exceeded quota: gpu'))
    assert forbidden is not None and "exceeded quota: gpu" in forbidden.message
    # An absurd Retry-After is ignored rather than parking the job for a day.
    assert classify(_api(429, headers={"Retry-After": "86400"})).retry_after is None  # type: ignore[union-attr]


def test_a_bug_of_ours_is_not_an_api_error() -> None:
    assert classify(KeyError("spec")) is None
    assert classify(ValueError("x")) is None


def test_backoff_grows_exponentially_to_the_cap() -> None:
    b = Backoff(base=1.0, factor=2.0, cap=60.0, jitter=0.0)
    assert [b.delay(n, 0.0) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert b.delay(10**9, 0.0) == 60.0  # no overflow after a very long outage


def test_backoff_jitter_stays_in_its_band_and_spreads() -> None:
    b = Backoff(base=2.0, factor=2.0, cap=300.0, jitter=0.5)
    rng = random.Random(0)
    delays = [b.delay(4, rng.random()) for _ in range(200)]
    assert all(8.0 <= d <= 16.0 for d in delays)  # 16 s, scaled by [0.5, 1]
    assert max(delays) - min(delays) > 4.0  # retries of many jobs do not land together


def test_backoff_honours_retry_after_up_to_the_cap() -> None:
    b = Backoff(base=1.0, cap=30.0, jitter=0.0)
    assert b.delay(1, 0.0, at_least=12.0) == 12.0
    assert b.delay(1, 0.0, at_least=500.0) == 30.0


@pytest.mark.parametrize("bad", [dict(base=0.0), dict(base=10.0, cap=1.0), dict(jitter=1.0)])
def test_backoff_refuses_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**bad)


def _conditions(out_status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in out_status.get("conditions") or []}


def test_a_refusal_becomes_a_condition_and_one_event_then_clears() -> None:
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    job = job_doc(spec_of(), name="quota")
    message = "the apiserver refused the job's objects (403 Forbidden: exceeded quota: gpu)"
    out = reconcile(World(job=job, pods=[], now=now, refusal=message))
    cond = _conditions(out.status)[ConditionType.CREATE_FAILURE]
    assert cond["status"] == "True" and cond["reason"] == Reason.FAILED_CREATE
    assert cond["message"] == message
    warnings = [e for e in out.events if e.reason == Reason.FAILED_CREATE]
    assert len(warnings) == 1 and warnings[0].type == EventType.WARNING
    # The same refusal again: no second event.
    job2 = {**job, "status": out.status}
    again = reconcile(World(job=job2, pods=[], now=now, refusal=message))
    assert not [e for e in again.events if e.reason == Reason.FAILED_CREATE]
    # Accepted at last: the condition flips to False.
    cleared = reconcile(World(job={**job, "status": again.status}, pods=[], now=now))
    cond = _conditions(cleared.status)[ConditionType.CREATE_FAILURE]
    assert cond["status"] == "False" and cond["reason"] == Reason.CREATED


def test_no_refusal_no_condition() -> None:
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    out = reconcile(World(job=job_doc(spec_of(), name="fine"), pods=[], now=now))
    assert ConditionType.CREATE_FAILURE not in _conditions(out.status)
