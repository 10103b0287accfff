"""The restart ladder between the operator and the launchers (docs/contract.md §5).

Two messages cross the boundary, and both are written here once:

- **the decision**, which the launchers read from their job's status: `restartAttempt` is the
  attempt the ranks must run; while `phase` is `Restarting` the ranks of older attempts stop and
  nothing starts; otherwise the ranks of `restartAttempt` may start;
- **the launchers' report**, which the coordinator (the launcher of node rank 0) writes into an
  annotation of the job's progress Lease (or, locally, a file): the rank failures of the attempt
  it runs, and the launchers whose connection dropped. The operator reads it as tenant data:
  `parse_report` never raises and bounds everything it keeps.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Final

# The job status keys and the one phase the launchers act on (the operator's api.status.Phase
# must agree: tests/contract checks it).
STATUS_RESTART_ATTEMPT: Final = "restartAttempt"
STATUS_PHASE: Final = "phase"
PHASE_RESTARTING: Final = "Restarting"
PHASES_ENDED: Final = ("Succeeded", "Failed")

# spec.restartPolicy.strategy, and the launcher's mode (env RESTART_STRATEGY).
IN_PLACE: Final = "InPlace"
RECREATE: Final = "Recreate"
STRATEGIES: Final = (IN_PLACE, RECREATE)

# The annotation of the progress Lease that holds the launchers' report.
REPORT_ANNOTATION: Final = "megatron.dev/launchers"
# Every launcher connects to the coordinator on this port of MASTER_ADDR.
DEFAULT_COORDINATOR_PORT: Final = 29400
# A launcher whose rank failed and that sees no decision this long after it reported exits with
# the rank's code, so that its pod fails and the kubelet tells the operator instead.
DECISION_TIMEOUT_SECONDS: Final = 120.0

MAX_REPORT_CHARS: Final = 16384
MAX_FAILURES: Final = 16
MAX_LOST: Final = 64
_MAX_NAME: Final = 253


@dataclass(frozen=True)
class RankFailure:
    """A rank of the reported attempt exited on its own (not stopped by its launcher)."""

    node_rank: int
    local_rank: int
    exit_code: int
    time: str  # RFC 3339 with microseconds, the launcher's clock


@dataclass(frozen=True)
class LostLauncher:
    """A launcher that had connected to the coordinator and whose connection dropped."""

    node_rank: int
    pod: str
    time: str


@dataclass(frozen=True)
class Report:
    """The coordinator's view: what the operator needs to decide, and what a benchmark reads."""

    attempt: int  # the attempt the failures belong to (the one the ranks run or last ran)
    nodes: int  # launchers in the gang
    started: int = 0  # launchers that started their ranks for `attempt`
    started_at: str | None = None  # when the last of them did
    seen_at: str | None = None  # when the coordinator saw the operator release `attempt`
    failures: tuple[RankFailure, ...] = ()
    lost: tuple[LostLauncher, ...] = ()

    def dumps(self) -> str:
        body: dict[str, Any] = {
            "attempt": self.attempt,
            "nodes": self.nodes,
            "started": self.started,
            "startedAt": self.started_at,
            "seenAt": self.seen_at,
            "failures": [_camel(asdict(f)) for f in self.failures[:MAX_FAILURES]],
            "lost": [_camel(asdict(x)) for x in self.lost[:MAX_LOST]],
        }
        return json.dumps(body, separators=(",", ":"))


def _camel(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in d.items():
        head, *rest = key.split("_")
        out[head + "".join(p.title() for p in rest)] = value
    return out


def _count(value: object, upper: int = 2**31 - 1) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= upper
    return value if ok else None  # type: ignore[return-value]


def _text(value: object, limit: int = 64) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= limit else None


def _failure(item: object) -> RankFailure | None:
    if not isinstance(item, dict):
        return None
    node, local = _count(item.get("nodeRank")), _count(item.get("localRank"))
    code, when = _count(item.get("exitCode"), 255), _text(item.get("time"))
    if node is None or local is None or code is None or when is None:
        return None
    return RankFailure(node, local, code, when)


def _lost(item: object) -> LostLauncher | None:
    if not isinstance(item, dict):
        return None
    node, pod = _count(item.get("nodeRank")), _text(item.get("pod"), _MAX_NAME)
    when = _text(item.get("time"))
    if node is None or pod is None or when is None:
        return None
    return LostLauncher(node, pod, when)


def parse_report(text: object) -> Report | None:
    """The report, or None when it is absent or not in this shape. Never raises: a tenant's code
    can write this annotation (the trainer's identity may update the Lease)."""
    if not isinstance(text, str) or len(text) > MAX_REPORT_CHARS:
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    attempt, nodes = _count(doc.get("attempt")), _count(doc.get("nodes"))
    if attempt is None or nodes is None:
        return None
    failures = doc.get("failures")
    lost = doc.get("lost")
    failures = failures[:MAX_FAILURES] if isinstance(failures, list) else []
    lost = lost[:MAX_LOST] if isinstance(lost, list) else []
    return Report(
        attempt=attempt,
        nodes=nodes,
        started=_count(doc.get("started")) or 0,
        started_at=_text(doc.get("startedAt")),
        seen_at=_text(doc.get("seenAt")),
        failures=tuple(f for f in map(_failure, failures) if f is not None),
        lost=tuple(x for x in map(_lost, lost) if x is not None),
    )
