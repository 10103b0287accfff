"""Leader election over a coordination.k8s.io Lease: the decisions, as client-go makes them.

A replica may take the Lease when nobody holds it, when it holds it already, or when the record
has not changed for `leaseDurationSeconds` as measured on the replica's OWN clock since it last
saw the record change. Reading the holder's renewTime against our clock would make a skewed
clock steal a live leader's Lease.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Record:
    holder: str
    renew_time: str  # as written; compared for change only, never against our clock
    duration: float  # leaseDurationSeconds
    transitions: int


def read(lease: dict[str, Any] | None) -> Record | None:
    if not isinstance(lease, dict):
        return None
    spec = lease.get("spec")
    if not isinstance(spec, dict):
        return Record("", "", 0.0, 0)
    duration = spec.get("leaseDurationSeconds")
    transitions = spec.get("leaseTransitions")
    return Record(
        holder=str(spec.get("holderIdentity") or ""),
        renew_time=str(spec.get("renewTime") or ""),
        duration=float(duration) if isinstance(duration, int | float) else 0.0,
        transitions=int(transitions) if isinstance(transitions, int) else 0,
    )


def may_take(record: Record | None, me: str, observed_at: float, now: float) -> bool:
    """`observed_at`: our monotonic time when we first saw this exact record."""
    if record is None or not record.holder or record.holder == me:
        return True
    return now - observed_at > record.duration


def spec_for(me: str, record: Record | None, duration: float, now_rfc3339: str) -> dict[str, Any]:
    """The Lease spec a replica writes to take or renew the Lease."""
    taking = record is None or record.holder != me
    transitions = (record.transitions if record is not None else 0) + (1 if taking else 0)
    spec: dict[str, Any] = {
        "holderIdentity": me,
        "leaseDurationSeconds": int(duration),
        "renewTime": now_rfc3339,
        "leaseTransitions": transitions,
    }
    if taking:
        spec["acquireTime"] = now_rfc3339
    return spec


def released(record: Record | None, me: str, now_rfc3339: str) -> dict[str, Any] | None:
    """The spec that hands the Lease back at shutdown (so a standby takes over at once), or
    None when it is not ours to release."""
    if record is None or record.holder != me:
        return None
    return {
        "holderIdentity": "",
        "leaseDurationSeconds": 1,
        "renewTime": now_rfc3339,
        "leaseTransitions": record.transitions,
    }
