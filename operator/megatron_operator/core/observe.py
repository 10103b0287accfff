"""What the operator sees of a pod, a node or the progress Lease, parsed from raw API JSON (pure).

Raw dicts (camelCase, as the apiserver sends them) go in; small frozen views come out. Parsing is
defensive: a pod written by someone else, or half-initialised, never raises.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from megatron_contract import tiers
from megatron_contract.bounds import INT64_MAX
from megatron_contract.ladder import REPORT_ANNOTATION, Report, parse_report
from megatron_contract.paths import (
    PROGRESS_ANNOTATION,
    PROGRESS_RECORD_MAX,
    TERMINATION_MESSAGE_MAX,
)
from megatron_contract.timeline import KEY as CLOCK_KEY
from megatron_contract.timeline import Clock, parse_clock
from megatron_operator.core.names import (
    ANNOTATION_RESTART_STRATEGY,
    CONTAINER_NAME,
    LABEL_JOB_UID,
    LABEL_NODE_RANK,
    LABEL_RESTART_ATTEMPT,
    LABEL_SPARE,
)


def parse_time(value: object) -> datetime | None:
    """RFC 3339 → aware datetime in UTC, or None when absent or malformed. Never raises: a
    trainer's pod writes some of these (year 1 with a +23:59 offset would overflow when
    converted later)."""
    if not isinstance(value, str) or not value or len(value) > 64:
        return None
    text = value.strip().replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(text)
        return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        return None


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ASCII digits only, and no more than an int64 holds: `str.isdigit` is true for "²" and for
# full-width digits, which `int()` then refuses or reads, and a 5,000-digit string makes `int()`
# raise (Python's limit on int-from-str conversions).
_INT_RE = re.compile(r"-?[0-9]{1,19}")


def _int(value: object, low: int = -INT64_MAX - 1, high: int = INT64_MAX) -> int | None:
    """An integer from JSON (or a label's text) within [low, high], else None. Never raises."""
    if isinstance(value, str):
        if not _INT_RE.fullmatch(value):
            return None
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    return None


def _count(value: object) -> int | None:
    """A non-negative integer that the apiserver can store (int64), else None."""
    return _int(value, 0, INT64_MAX)


@dataclass(frozen=True)
class Progress:
    """A parsed progress record (docs/contract.md §4), of restart attempt `attempt`."""

    attempt: int
    iteration: int
    loss: float | None
    tokens_per_second: float | None
    mfu: float | None
    checkpoint_iteration: int | None
    time: datetime
    clock: Clock | None = None  # the process's timeline (goodput ledger), when reported
    restored: tuple[str, int | None] | None = None  # the tier and step the attempt restored

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "attempt": self.attempt,
            "iteration": self.iteration,
            "time": format_time(self.time),
        }
        for key, value in (
            ("loss", self.loss),
            ("tokensPerSecond", self.tokens_per_second),
            ("mfu", self.mfu),
            ("checkpointIteration", self.checkpoint_iteration),
        ):
            if value is not None:
                out[key] = value
        return out


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def parse_progress(text: object) -> Progress | None:
    """The record's JSON, or None when missing or not in the contract's shape (a record without
    its attempt cannot be told from a late write of an old attempt, so it is not used).

    The trainer's pod writes it, so it is hostile input: never raises, and every number it
    yields fits an int64 (the apiserver refuses a status holding a larger one)."""
    if not isinstance(text, str) or len(text) > PROGRESS_RECORD_MAX:
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: deeply nested arrays
        return None
    if not isinstance(doc, dict):
        return None
    attempt = _count(doc.get("attempt"))
    iteration = _count(doc.get("iteration"))
    when = parse_time(doc.get("time"))
    if attempt is None or iteration is None or when is None:
        return None
    return Progress(
        attempt=attempt,
        iteration=iteration,
        loss=_float(doc.get("loss")),
        tokens_per_second=_float(doc.get("tokensPerSecond")),
        mfu=_float(doc.get("mfu")),
        checkpoint_iteration=_count(doc.get("checkpointIteration")),
        time=when,
        clock=parse_clock(doc.get(CLOCK_KEY)),
        restored=tiers.parse_restored(doc.get(tiers.KEY), INT64_MAX),
    )


@dataclass(frozen=True)
class PodView:
    name: str
    job_uid: str | None
    attempt: int | None
    node_rank: int | None
    phase: str
    node: str | None
    deleting: bool
    exit_code: int | None  # of the trainer container, once terminated
    terminated_reason: str | None  # e.g. OOMKilled, Error, Completed
    status_reason: str | None  # pod.status.reason, e.g. Evicted
    disruption: str | None  # reason of a True DisruptionTarget condition
    unschedulable: str | None = None  # the scheduler's message while it cannot place the pod
    uid: str | None = None  # deletes carry it as a precondition
    owner_uid: str | None = None  # uid of the controller ownerReference: whose pod it is
    ready: bool = False  # the Ready condition is True (Kueue's PodsReady counts these)
    terminated_message: str | None = None  # the container's termination message (its why)
    trainer_exited: bool = False  # the trainer container terminated (sidecars may still run)
    # Every ordinary container terminated: the pod turns Failed or Succeeded by itself. The
    # kubelet reports the containers' exits first and the pod's phase only once it has torn
    # the pod down, seconds later on a loaded node.
    containers_done: bool = False
    finished_at: datetime | None = None  # when the trainer container terminated
    # A container that cannot start: (the kubelet's reason, "container: its message").
    waiting: tuple[str, str] | None = None
    scheduled_at: datetime | None = None  # when the scheduler bound it (PodScheduled True)
    unschedulable_since: datetime | None = None  # PodScheduled False, Unschedulable, since
    strategy: str | None = None  # how its launcher handles a failed rank (None: an older pod)
    spare: int | None = None  # a spare pod's number (its node_rank is then nodes + spare)
    ip: str | None = None  # status.podIP

    @property
    def active(self) -> bool:
        """Holds (or may still hold) resources: not terminated."""
        return self.phase not in ("Succeeded", "Failed")

    @property
    def failed(self) -> bool:
        """Failed for good and not being deleted: its phase says so, or its trainer exited
        non-zero with nothing else left running (the phase follows). Such a pod holds nothing
        once the kubelet is done, so it can be kept for its logs."""
        if self.deleting:
            return False
        return self.phase == "Failed" or (
            self.phase != "Succeeded"
            and self.containers_done
            and self.exit_code is not None
            and self.exit_code != 0
        )

    @property
    def succeeded(self) -> bool:
        """Its rank's work is done: the pod Succeeded, or its trainer exited 0 beside a sidecar
        that still runs (the operator then stops the pod, as it stops every active one)."""
        return self.phase == "Succeeded" or (self.trainer_exited and self.exit_code == 0)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _trainer_state(status: dict[str, Any]) -> tuple[int | None, str | None, str | None]:
    """Exit code, reason and message of the trainer container's termination."""
    cs = _trainer_status(status)
    for state in (cs.get("state"), cs.get("lastState")):
        term = (state or {}).get("terminated") if isinstance(state, dict) else None
        if isinstance(term, dict):
            return _int(term.get("exitCode")), term.get("reason"), _message(term)
    return None, None, None


def _trainer_status(status: dict[str, Any]) -> dict[str, Any]:
    """The trainer container's status ({} until the kubelet reports it)."""
    for cs in status.get("containerStatuses") or []:
        if isinstance(cs, dict) and cs.get("name") == CONTAINER_NAME:
            return cs
    return {}


def _message(term: dict[str, Any]) -> str | None:
    """The termination message, trimmed to its last lines (a log tail can be 80 lines long)."""
    text = term.get("message")
    if not isinstance(text, str) or not text.strip():
        return None
    text = text.strip()[-TERMINATION_MESSAGE_MAX:]
    return " | ".join(line.strip() for line in text.splitlines()[-3:] if line.strip())


# Container states that do not pass by themselves, or not soon (the kubelet retries them with a
# backoff, and a gang holding GPUs meanwhile must say why). ContainerCreating and
# PodInitializing are normal steps and are not listed.
STUCK_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


def _waiting(status: dict[str, Any]) -> tuple[str, str] | None:
    """The first container (init containers first) waiting for a reason that will not pass."""
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            state = cs.get("state") if isinstance(cs, dict) else None
            waiting = state.get("waiting") if isinstance(state, dict) else None
            if not isinstance(waiting, dict):
                continue
            reason = waiting.get("reason")
            if isinstance(reason, str) and reason in STUCK_REASONS:
                message = str(waiting.get("message") or reason)[:TERMINATION_MESSAGE_MAX]
                return reason, f"container {cs.get('name')}: {message}"
    return None


def _condition_time(status: dict[str, Any], type_: str, value: str) -> datetime | None:
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == type_ and cond.get("status") == value:
            return parse_time(cond.get("lastTransitionTime"))
    return None


def _trainer_exited(status: dict[str, Any]) -> bool:
    """The trainer container has terminated: its rank's result is in, even while an ordinary
    sidecar of the template keeps the pod Running (and holding its GPUs)."""
    return _trainer_terminated(status) is not None


def _trainer_terminated(status: dict[str, Any]) -> dict[str, Any] | None:
    """The trainer container's current terminated state, if it has one."""
    state = _trainer_status(status).get("state")
    term = state.get("terminated") if isinstance(state, dict) else None
    return term if isinstance(term, dict) else None


def _trainer_finished(status: dict[str, Any]) -> datetime | None:
    term = _trainer_terminated(status)
    return parse_time(term.get("finishedAt")) if term is not None else None


def _containers_done(status: dict[str, Any]) -> bool:
    """Every ordinary container has terminated (native sidecars, being init containers, are
    stopped by the kubelet after them)."""
    statuses = [cs for cs in status.get("containerStatuses") or [] if isinstance(cs, dict)]
    return bool(statuses) and all(
        isinstance(cs.get("state"), dict) and isinstance(cs["state"].get("terminated"), dict)
        for cs in statuses
    )


def _unschedulable(status: dict[str, Any]) -> str | None:
    for cond in status.get("conditions") or []:
        if (
            isinstance(cond, dict)
            and cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return str(cond.get("message") or "unschedulable")
    return None


def _ready(status: dict[str, Any]) -> bool:
    return any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _disruption(status: dict[str, Any]) -> str | None:
    for cond in status.get("conditions") or []:
        if (
            isinstance(cond, dict)
            and cond.get("type") == "DisruptionTarget"
            and cond.get("status") == "True"
        ):
            return str(cond.get("reason") or "DisruptionTarget")
    return None


def pod_view(raw: dict[str, Any]) -> PodView:
    meta = raw.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = raw.get("status") or {}
    spec = raw.get("spec") or {}
    exit_code, term_reason, term_message = _trainer_state(status)
    return PodView(
        name=str(meta.get("name", "")),
        job_uid=labels.get(LABEL_JOB_UID),
        attempt=_int(labels.get(LABEL_RESTART_ATTEMPT)),
        node_rank=_int(labels.get(LABEL_NODE_RANK)),
        phase=str(status.get("phase") or "Pending"),
        node=spec.get("nodeName"),
        deleting=meta.get("deletionTimestamp") is not None,
        exit_code=exit_code,
        terminated_reason=term_reason,
        terminated_message=term_message,
        status_reason=status.get("reason"),
        disruption=_disruption(status),
        unschedulable=_unschedulable(status),
        uid=meta.get("uid"),
        owner_uid=controller_uid(meta),
        ready=_ready(status),
        trainer_exited=_trainer_exited(status),
        containers_done=_containers_done(status),
        finished_at=_trainer_finished(status),
        waiting=_waiting(status),
        scheduled_at=_condition_time(status, "PodScheduled", "True"),
        unschedulable_since=_condition_time(status, "PodScheduled", "False")
        if _unschedulable(status)
        else None,
        strategy=_text((meta.get("annotations") or {}).get(ANNOTATION_RESTART_STRATEGY)),
        spare=_int(labels.get(LABEL_SPARE), 0, 4095),
        ip=_ip(status.get("podIP")),
    )


def _ip(value: object) -> str | None:
    """A pod IP as the kubelet reports it (v4 or v6 text), or None. Rendered into other pods'
    env, so only what an address can hold."""
    if not isinstance(value, str) or not 2 <= len(value) <= 45:
        return None
    return value if all(c in "0123456789abcdefABCDEF.:" for c in value) else None


_VIEWED_META = ("name", "namespace", "labels", "uid", "deletionTimestamp", "ownerReferences")


def slim_pod(raw: dict[str, Any]) -> dict[str, Any]:
    """The parts of a pod that pod_view and the caches read: a list of a whole gang keeps this
    instead of every pod's spec (its template, its sidecars)."""
    meta = raw.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    kept = {k: meta[k] for k in _VIEWED_META if k in meta}
    if ANNOTATION_RESTART_STRATEGY in annotations:
        kept["annotations"] = {
            ANNOTATION_RESTART_STRATEGY: annotations[ANNOTATION_RESTART_STRATEGY]
        }
    node = (raw.get("spec") or {}).get("nodeName")
    return {
        "metadata": kept,
        "spec": {"nodeName": node} if node else {},
        "status": raw.get("status") or {},
    }


def controller_uid(meta: Any) -> str | None:
    """The uid of an object's controller ownerReference (metadata), or None."""
    refs = meta.get("ownerReferences") if isinstance(meta, dict) else None
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            uid = ref.get("uid")
            return uid if isinstance(uid, str) else None
    return None


@dataclass(frozen=True)
class LeaseView:
    """The job's progress Lease: rank 0's latest record and its heartbeat (spec.renewTime), and
    the launchers' report of the restart ladder (docs/contract.md §5)."""

    holder: str | None  # the pod that wrote last (spec.holderIdentity)
    renew_time: datetime | None
    progress: Progress | None
    report: Report | None = None

    def for_attempt(self, attempt: int) -> LeaseView | None:
        """This view if its record belongs to `attempt`: a late write of an older attempt (a
        pod still stopping) is neither progress nor a heartbeat of the current one."""
        if self.progress is None or self.progress.attempt != attempt:
            return None
        return self


def lease_view(raw: dict[str, Any] | None, job_uid: str | None = None) -> LeaseView | None:
    """The Lease as the state machine sees it, or None when it does not exist yet, or (given
    the job's uid) when it is not the job's own child: a Lease someone else made under that
    name must not feed the job progress or heartbeats."""
    if not isinstance(raw, dict):
        return None
    meta = raw.get("metadata") or {}
    if job_uid is not None and not any(
        isinstance(ref, dict) and ref.get("controller") is True and ref.get("uid") == job_uid
        for ref in meta.get("ownerReferences") or []
    ):
        return None
    spec = raw.get("spec") or {}
    annotations = meta.get("annotations") or {}
    holder = spec.get("holderIdentity")
    return LeaseView(
        holder=holder if isinstance(holder, str) else None,
        renew_time=parse_time(spec.get("renewTime")),
        progress=parse_progress(annotations.get(PROGRESS_ANNOTATION)),
        report=parse_report(annotations.get(REPORT_ANNOTATION)),
    )


def node_not_ready_since(raw: dict[str, Any], now: datetime) -> datetime | None:
    """When the node stopped being Ready, or None while it is Ready."""
    for cond in (raw.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            if cond.get("status") == "True":
                return None
            since = parse_time(cond.get("lastTransitionTime"))
            # A transition in the future means nothing (and would overflow a deadline).
            return min(since, now) if since is not None else now
    return now  # no Ready condition at all: not ready
