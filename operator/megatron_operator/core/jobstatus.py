"""The job's status as the state machine works on it: typed fields, read defensively.

The apiserver stores whatever the status subresource was given, and a status written by someone
else (or an older operator) may hold garbage: reading never raises, and what cannot be read is
dropped. Keys this operator does not know are kept as they were, so a write never loses them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from megatron_operator.api.status import Phase


class BadJobData(ValueError):
    """The job's own data (its status, or a duration in its spec) cannot be processed: the only
    error that may fail a job. Anything else the state machine raises is a bug of ours, which
    the operator retries, loudly, without touching the job's pods."""


def shift(when: datetime, seconds: float, what: str) -> datetime:
    """`when` + `seconds`, or BadJobData naming `what` when the result is out of datetime's
    range (a hand-written status.runningSince in year 9999, say)."""
    try:
        return when + timedelta(seconds=seconds)
    except OverflowError:
        raise BadJobData(f"{what} ({when.isoformat()}) plus {seconds:g}s is out of range") from None


def _count(value: object, default: int = 0) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else default  # type: ignore[return-value]


def _optional_count(value: object) -> int | None:
    count = _count(value, -1)
    return count if count >= 0 else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@dataclass
class JobStatus:
    phase: Phase | None = None
    conditions: list[dict[str, Any]] = field(default_factory=list)
    observed_generation: int | None = None
    restart_attempt: int = 0  # the attempt the ranks run (the restart generation)
    gang_attempt: int | None = None  # the attempt the gang's pods were created in (None: the same)
    launched_attempt: int | None = None  # the latest attempt whose pods were all created
    restarts: int = 0
    restarts_counted: int = 0  # toward maxRestarts
    last_failure: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    progress_summary: str | None = None
    restores: list[dict[str, Any]] | None = None  # where the newest attempts restored from
    layout: str | None = None
    parallelism: dict[str, Any] | None = None  # the planned degrees (parallelism.auto's choice)
    gpus: int | None = None
    world_size: int | None = None
    start_time: str | None = None
    running_since: str | None = None
    completion_time: str | None = None
    restart_at: str | None = None
    workload: str | None = None
    uncounted_restart_times: list[str] | None = None  # restarts not counted, in the last hour
    attempt_times: list[str] | None = None  # attempts started in the last hour (core/churn.py)
    resume_times: list[str] | None = None  # resumes (spec.suspend back to false), last hour
    failed_nodes: list[str] | None = None  # where restarts' causes ran, since the gang was created
    local_queue: str | None = None
    cluster_queue: str | None = None
    flavors: list[str] | None = None
    kept_pods: list[str] | None = None  # failed pods kept for their logs, oldest first
    defaults: dict[str, Any] | None = None  # the merged defaults, resolved once (core/defaults)
    ledger: dict[str, Any] | None = None  # the goodput ledger (core/ledger.py, accounting.py)
    forecast: dict[str, Any] | None = None  # the remaining time (core/forecast.py)
    swaps: dict[str, str] | None = None  # node rank → the pod holding it (spares, core/spares.py)
    coordinator: dict[str, Any] | None = None  # {"pod", "term"}: the coordinator it follows
    ready_spares: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys we do not know, kept as they were

    @classmethod
    def read(cls, raw: object) -> JobStatus:
        doc: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        known = {_camel(f.name) for f in fields(cls) if f.name != "extra"}
        conds = doc.get("conditions")
        phase = doc.get("phase")
        launched = _count(doc.get("launchedAttempt"), -1)
        generation = doc.get("observedGeneration")
        return cls(
            phase=Phase(phase) if phase in tuple(Phase) else None,
            conditions=[copy.deepcopy(c) for c in conds if isinstance(c, dict)]
            if isinstance(conds, list)
            else [],
            observed_generation=generation if isinstance(generation, int) else None,
            restart_attempt=_count(doc.get("restartAttempt")),
            gang_attempt=_optional_count(doc.get("gangAttempt")),
            launched_attempt=launched if launched >= 0 else None,
            restarts=_count(doc.get("restarts")),
            restarts_counted=_count(doc.get("restartsCounted")),
            last_failure=_dict(doc.get("lastFailure")),
            progress=_dict(doc.get("progress")),
            progress_summary=_text(doc.get("progressSummary")),
            restores=_dicts(doc.get("restores")),
            layout=_text(doc.get("layout")),
            parallelism=_dict(doc.get("parallelism")),
            gpus=_optional_count(doc.get("gpus")),
            world_size=_optional_count(doc.get("worldSize")),
            start_time=_text(doc.get("startTime")),
            running_since=_text(doc.get("runningSince")),
            completion_time=_text(doc.get("completionTime")),
            restart_at=_text(doc.get("restartAt")),
            workload=_text(doc.get("workload")),
            uncounted_restart_times=_texts(doc.get("uncountedRestartTimes")),
            attempt_times=_texts(doc.get("attemptTimes")),
            resume_times=_texts(doc.get("resumeTimes")),
            failed_nodes=_texts(doc.get("failedNodes")),
            local_queue=_text(doc.get("localQueue")),
            cluster_queue=_text(doc.get("clusterQueue")),
            flavors=_texts(doc.get("flavors")),
            kept_pods=_texts(doc.get("keptPods")),
            defaults=_dict(doc.get("defaults")),
            ledger=_dict(doc.get("ledger")),
            forecast=_dict(doc.get("forecast")),
            swaps=_swaps(doc.get("swaps")),
            coordinator=_coordinator(doc.get("coordinator")),
            ready_spares=_optional_count(doc.get("readySpares")),
            extra={k: copy.deepcopy(v) for k, v in doc.items() if k not in known},
        )

    @property
    def gang(self) -> int:
        """The oldest attempt whose pods still belong to the gang (pods of older attempts are
        stale). An unreadable or future value means the current attempt: a fresh gang."""
        g = self.gang_attempt
        return g if g is not None and g <= self.restart_attempt else self.restart_attempt

    def next_gang(self) -> None:
        """A new attempt on new pods (a Recreate, a resume, a re-admission): every pod of an
        older attempt is stale, and no node has failed in this gang yet."""
        self.restart_attempt += 1
        self.gang_attempt = None
        self.failed_nodes = None
        self.swaps = None  # every rank on the pod created for it again
        self.coordinator = None  # node rank 0's launcher again

    def swapped(self) -> dict[int, str]:
        """status.swaps as node rank → pod."""
        return {int(k): v for k, v in (self.swaps or {}).items()}

    def next_in_place(self) -> None:
        """A new attempt on the gang's pods (InPlace, ReplacePod): the pods stay current."""
        self.gang_attempt = self.gang
        self.restart_attempt += 1

    def to_raw(self) -> dict[str, Any]:
        """The status document to write (unset fields omitted)."""
        out: dict[str, Any] = dict(self.extra)
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if value is None:
                continue
            out[_camel(f.name)] = str(value) if isinstance(value, Phase) else value
        return out


def _texts(value: object) -> list[str] | None:
    if not isinstance(value, list):
        return None
    return [v for v in value if isinstance(v, str) and v] or None


def _dicts(value: object) -> list[dict[str, Any]] | None:
    if not isinstance(value, list):
        return None
    return [copy.deepcopy(v) for v in value if isinstance(v, dict)] or None


def _swaps(value: object) -> dict[str, str] | None:
    """node rank (decimal text) → pod name; other entries dropped."""
    if not isinstance(value, dict):
        return None
    out = {
        k: v
        for k, v in list(value.items())[:4096]
        if isinstance(k, str) and k.isdigit() and len(k) <= 6 and isinstance(v, str) and v
    }
    return out or None


def _coordinator(value: object) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    pod, term = _text(value.get("pod")), _count(value.get("term"), -1)
    return {"pod": pod, "term": term} if pod is not None and term >= 0 else None


def _dict(value: object) -> dict[str, Any] | None:
    return copy.deepcopy(value) if isinstance(value, dict) else None
