"""Leader election decisions (client-go's rules): who may take the Lease, and what is written."""

from __future__ import annotations

from megatron_operator.core.election import Record, may_take, read, released, spec_for

T = "2026-11-23T12:00:00.000000Z"


def test_read_tolerates_missing_and_odd_fields() -> None:
    assert read(None) is None
    assert read({"spec": None}) == Record("", "", 0.0, 0)
    rec = read({"spec": {"holderIdentity": "a", "renewTime": T, "leaseDurationSeconds": 15}})
    assert rec == Record("a", T, 15.0, 0)
    assert read({"spec": {"leaseDurationSeconds": "15"}}) == Record("", "", 0.0, 0)


def test_free_own_or_expired_by_our_own_clock() -> None:
    held = Record("other", T, 15.0, 3)
    assert may_take(None, "me", 0.0, 0.0)
    assert may_take(Record("", T, 15.0, 3), "me", 0.0, 0.0)  # released
    assert may_take(Record("me", T, 15.0, 3), "me", 0.0, 0.0)  # ours: renew
    # Held by another: only once the record has not changed for a lease duration, measured
    # from when WE first saw it, whatever its renewTime says.
    assert not may_take(held, "me", observed_at=100.0, now=114.0)
    assert may_take(held, "me", observed_at=100.0, now=115.5)


def test_taking_counts_a_transition_and_renewing_does_not() -> None:
    taken = spec_for("me", Record("other", T, 15.0, 3), 15.0, T)
    assert taken["holderIdentity"] == "me" and taken["leaseTransitions"] == 4
    assert taken["acquireTime"] == T
    renewed = spec_for("me", Record("me", T, 15.0, 4), 15.0, "later")
    assert renewed["leaseTransitions"] == 4 and "acquireTime" not in renewed
    assert renewed["renewTime"] == "later"
    assert spec_for("me", None, 15.0, T)["leaseTransitions"] == 1


def test_release_only_our_own_lease() -> None:
    assert released(Record("other", T, 15.0, 2), "me", T) is None
    assert released(None, "me", T) is None
    spec = released(Record("me", T, 15.0, 2), "me", T)
    assert spec is not None and spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
