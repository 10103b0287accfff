"""What a trainer's pod writes is hostile input: its progress record (the Lease annotation) and
its termination message. Whatever they hold, reading them never raises, the status the state
machine writes holds only integers the apiserver stores (int64) and bounded strings, and the
job still obeys spec.suspend. (The same, through the real controller and apiserver:
tests/integration/test_operator_hostile.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_contract.bounds import INT64_MAX
from megatron_contract.paths import PROGRESS_ANNOTATION
from megatron_contract.timeline import parse_clock
from megatron_operator.core.observe import lease_view, parse_progress, pod_view

from .sim import Sim
from .specs import spec_of

NOW = "2026-11-22T12:00:05Z"
# The records the review reproduced, and their relatives.
HOSTILE_RECORDS: dict[str, str] = {
    "superscript digit": json.dumps({"attempt": "²", "iteration": 1, "time": NOW}),
    "superscript iteration": json.dumps({"attempt": 0, "iteration": "²", "time": NOW}),
    "full-width digits": json.dumps({"attempt": "０", "iteration": "１２", "time": NOW}),
    "5,000-digit string": json.dumps({"attempt": 0, "iteration": "9" * 5000, "time": NOW}),
    "5,000-digit number": '{"attempt":0,"iteration":' + "9" * 5000 + f',"time":"{NOW}"}}',
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "deep nesting in a field": '{"attempt":0,"iteration":1,"loss":'
    + "[" * 5000
    + "]" * 5000
    + f',"time":"{NOW}"}}',
    "iteration 2**64": json.dumps({"attempt": 0, "iteration": 2**64, "time": NOW}),
    "negative iteration": json.dumps({"attempt": 0, "iteration": -1, "time": NOW}),
    "checkpoint 2**63": json.dumps(
        {"attempt": 0, "iteration": 3, "checkpointIteration": 2**63, "time": NOW}
    ),
    "year 1 with an offset": json.dumps(
        {"attempt": 0, "iteration": 3, "time": "0001-01-01T00:00:00+23:59"}
    ),
    "year 9999 with an offset": json.dumps(
        {"attempt": 0, "iteration": 3, "time": "9999-12-31T23:59:59-23:59"}
    ),
    "huge float": '{"attempt":0,"iteration":3,"loss":1e400,"time":"' + NOW + '"}',
    "a megabyte": json.dumps({"attempt": 0, "iteration": 3, "time": NOW, "x": "y" * 1_000_000}),
    "not an object": json.dumps("attempt"),
    "lone surrogate": '{"attempt":0,"iteration":3,"time":"\\ud800"}',
}
HOSTILE_MESSAGES: dict[str, str] = {
    "long": "x" * 100_000,
    "many lines": "\n".join(f"line {i}" for i in range(10_000)),
    "control characters": "\x00\x1b[31m\r\x7f" * 100,
    "unicode": "²" * 2000 + "\U0001f4a5" * 2000,
    "json": HOSTILE_RECORDS["deep nesting"][:4000],
}


def _sim() -> Sim:
    return Sim.of_spec(spec_of({"resources.nodes": 2, "training.globalBatchSize": 64}))


def _write(sim: Sim, record: str) -> None:
    assert sim.lease is not None
    sim.lease["metadata"].setdefault("annotations", {})[PROGRESS_ANNOTATION] = record
    sim.lease["spec"] = {"holderIdentity": "job-0", "renewTime": NOW}


def _bounded(value: Any, where: str = "status") -> None:
    """Every integer fits an int64, every string is short: the apiserver stores the status."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return
    if isinstance(value, int):
        assert -INT64_MAX - 1 <= value <= INT64_MAX, where
    elif isinstance(value, str):
        assert len(value) <= 4096, (where, len(value))
        value.encode("utf-8")  # no lone surrogate: the apiserver's JSON is UTF-8
    elif isinstance(value, dict):
        for k, v in value.items():
            _bounded(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _bounded(v, f"{where}[{i}]")
    else:
        raise AssertionError(f"{where}: unexpected {type(value).__name__}")


@pytest.mark.parametrize("case", sorted(HOSTILE_RECORDS))
def test_a_hostile_record_is_ignored_and_the_status_stays_writable(case: str) -> None:
    sim = _sim()
    sim.start_running()
    _write(sim, HOSTILE_RECORDS[case])
    sim.step()  # must not raise
    _bounded(sim.status)
    assert sim.status["phase"] == "Running"
    progress = sim.status.get("progress")
    if progress is not None:  # only a record in the contract's shape is copied
        assert 0 <= progress["iteration"] <= INT64_MAX
    sim.job["spec"]["suspend"] = True
    sim.step()
    assert sim.status["phase"] == "Suspended"
    assert sim.last is not None and len(sim.last.delete_pods) == 2


def test_numbers_past_int64_are_not_progress() -> None:
    assert parse_progress(HOSTILE_RECORDS["iteration 2**64"]) is None
    assert parse_progress(HOSTILE_RECORDS["superscript digit"]) is None
    assert parse_progress(HOSTILE_RECORDS["deep nesting"]) is None
    ok = parse_progress(json.dumps({"attempt": 0, "iteration": INT64_MAX, "time": NOW}))
    assert ok is not None and ok.iteration == INT64_MAX


@pytest.mark.parametrize("case", sorted(HOSTILE_MESSAGES))
def test_a_hostile_termination_message_fails_the_rank_with_a_bounded_status(case: str) -> None:
    sim = _sim()
    sim.start_running()
    sim.fail("job-a0-1", exit_code=1)
    term = sim.pods["job-a0-1"]["status"]["containerStatuses"][0]["state"]["terminated"]
    term["message"] = HOSTILE_MESSAGES[case]
    sim.step()
    _bounded(sim.status)
    assert sim.status["phase"] == "Restarting"
    assert len(sim.status["lastFailure"]["message"]) <= 1100


_JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["²", "１２", "9" * 30, NOW, "9999-12-31T23:59:59-23:59", "-0", "+1"]),
)
_JSON = st.recursive(
    _JSON_LEAF,
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=5), c)),
    max_leaves=8,
)
_FIELDS = [
    "attempt",
    "iteration",
    "loss",
    "tokensPerSecond",
    "mfu",
    "checkpointIteration",
    "time",
    "clock",  # the goodput ledger's timeline (megatron_contract/timeline.py)
]


def _record_text(doc: Any, raw: str | None) -> str:
    if raw is not None:
        return raw
    try:
        return json.dumps(doc)
    except ValueError:  # NaN and friends: what a careless trainer would write
        return json.dumps(doc, allow_nan=True)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    fields=st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=7),
    valid_base=st.booleans(),
    raw=st.one_of(
        st.none(), st.text(max_size=200), st.sampled_from(list(HOSTILE_RECORDS.values()))
    ),
    message=st.one_of(
        st.none(), st.text(max_size=5000), st.sampled_from(list(HOSTILE_MESSAGES.values()))
    ),
    renew=st.one_of(
        st.none(), st.text(max_size=40), st.sampled_from([NOW, "9999-12-31T23:59:59Z"])
    ),
)
def test_fuzzed_trainer_writes_never_break_the_reconcile(
    fields: dict[str, Any],
    valid_base: bool,
    raw: str | None,
    message: str | None,
    renew: str | None,
) -> None:
    doc: dict[str, Any] = {"attempt": 0, "iteration": 5, "time": NOW} if valid_base else {}
    doc.update(fields)
    record = _record_text(doc, raw)
    lease = {
        "metadata": {"annotations": {PROGRESS_ANNOTATION: record}},
        "spec": {"renewTime": renew},
    }
    lease_view(lease)  # never raises
    sim = _sim()
    sim.start_running()
    _write(sim, record)
    assert sim.lease is not None
    sim.lease["spec"]["renewTime"] = renew
    if message is not None:
        sim.fail("job-a0-1")
        term = sim.pods["job-a0-1"]["status"]["containerStatuses"][0]["state"]["terminated"]
        term["message"] = message
        pod_view(sim.pods["job-a0-1"])
    sim.step()
    _bounded(sim.status)
    sim.job["spec"]["suspend"] = True
    sim.step()
    _bounded(sim.status)
    assert sim.status["phase"] == "Suspended"


_CLOCK_KEYS = ["now", "began", "loop", "start", "rdzv", "load", "save"]
_CLOCKS = st.one_of(_JSON, st.dictionaries(st.sampled_from(_CLOCK_KEYS), _JSON, max_size=7))


@settings(max_examples=300, deadline=None)
@given(clock=_CLOCKS)
def test_a_hostile_clock_parses_to_bounded_numbers_or_nothing(clock: Any) -> None:
    """The record's `clock` (the goodput ledger's facts): any value parses to in-range numbers
    or to nothing, and never raises."""
    parsed = parse_clock(clock)
    if parsed is not None:
        assert 946_684_800 <= parsed.now < 7_258_118_400
        for value in (parsed.rendezvous, parsed.load, parsed.save):
            assert value is None or 0 <= value <= 1e8


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(clock=_CLOCKS)
def test_a_hostile_clock_leaves_the_ledger_exact(clock: Any) -> None:
    """Whatever the clock, the ledger the reconcile writes still sums to its wall time (the
    fuzz test above also draws `clock` among a record's fields)."""
    sim = _sim()
    sim.start_running()
    _write(sim, json.dumps({"attempt": 0, "iteration": 5, "time": NOW, "clock": clock}))
    sim.tick(40)  # past the ledger's own write interval
    sim.step()
    _bounded(sim.status)
    ledger = sim.status["ledger"]
    assert abs(sum(ledger["seconds"].values()) - ledger["wallSeconds"]) < 1e-6
