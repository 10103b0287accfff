"""The restart ladder between the operator and the launchers (docs/contract.md §5).

Two messages cross the boundary, and both are written here once:

- **the decision**, which the launchers read from their job's status: `restartAttempt` is the
  attempt the ranks must run; while `phase` is `Restarting` the ranks of older attempts stop and
  nothing starts; otherwise the ranks of `restartAttempt` may start;
- **the launchers' report**, which the coordinator (the launcher of node rank 0) writes into an
  annotation of the job's progress Lease (or, locally, a file): the rank failures of the attempt
  it runs, and the launchers whose connection dropped. The operator reads it as tenant data:
  `parse_report` never raises and bounds everything it keeps.

With spare nodes (`spec.resources.spareNodes`), the decision also says which pod holds each node
rank that moved onto a spare (`swaps`), and the launchers keep each other alive with heartbeats
and fence themselves when cut off (the liveness constants below; docs/architecture.md, "Spare
nodes").
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
# With spare nodes: the node ranks held by a pod other than the one created for them, as a map
# of the node rank (decimal text) to that pod's name; and the coordinator whose reports the
# operator follows ({"pod": name, "term": n}; unset: the launcher of node rank 0's pod).
STATUS_SWAPS: Final = "swaps"
STATUS_COORDINATOR: Final = "coordinator"

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

# Liveness with spare nodes. Every launcher pings its coordinator each HEARTBEAT_SECONDS; the
# coordinator answers every ping, granting a lease only while it hears a majority of the job's
# launchers (holders and spares). A launcher kills its ranks once no ping it sent in the last
# FENCE_SECONDS was granted; a coordinator that has not heard a launcher for SILENT_SECONDS
# reports it lost, and gives its node rank to another pod only FENCE_SECONDS + FENCE_MARGIN
# after the last ping it granted it: by then that launcher has fenced itself, wherever it is.
HEARTBEAT_SECONDS: Final = 0.5
SILENT_SECONDS: Final = 2.0
FENCE_SECONDS: Final = 3.0
FENCE_MARGIN_SECONDS: Final = 1.0

MAX_REPORT_CHARS: Final = 16384
MAX_FAILURES: Final = 16
MAX_LOST: Final = 64
MAX_SPARES: Final = 64  # spec.resources.spareNodes at most; the report lists as many
MAX_SWAPS: Final = 4096  # status.swaps entries read (one per node rank at most)
_MAX_NAME: Final = 253


@dataclass(frozen=True)
class Decision:
    """What the launchers read of their job's status: the attempt, its phase, and with spares
    which pod holds each node rank that moved (node rank → pod)."""

    attempt: int
    phase: str | None = None
    swaps: tuple[tuple[int, str], ...] = ()

    def holder(self, node_rank: int) -> str | None:
        """The pod that holds `node_rank`, when it is not the one created for it."""
        for rank, pod in self.swaps:
            if rank == node_rank:
                return pod
        return None


def parse_decision(status: object) -> Decision | None:
    """The decision in a job status, or None when it holds no attempt yet. Never raises."""
    if not isinstance(status, dict):
        return None
    attempt = status.get(STATUS_RESTART_ATTEMPT, 0)
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        return None
    phase = status.get(STATUS_PHASE)
    return Decision(attempt, phase if isinstance(phase, str) else None, parse_swaps(status))


def parse_swaps(status: object) -> tuple[tuple[int, str], ...]:
    """status.swaps as sorted (node rank, pod) pairs; what is not in that shape is left out."""
    raw = status.get(STATUS_SWAPS) if isinstance(status, dict) else None
    if not isinstance(raw, dict):
        return ()
    out = []
    for key, pod in list(raw.items())[:MAX_SWAPS]:
        if isinstance(key, str) and key.isdigit() and len(key) <= 6 and _text(pod, _MAX_NAME):
            out.append((int(key), str(pod)))
    return tuple(sorted(out))


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
    # With spare nodes: the reporting coordinator (its pod and term), whether it hears a
    # majority of the launchers (without one, it reports no lost launcher), and the spares'
    # pods whose launchers are connected, idle and usable.
    coordinator: str | None = None
    term: int = 0
    quorum: bool | None = None
    spares: tuple[str, ...] = ()

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
        if self.coordinator is not None:
            body["coordinator"] = self.coordinator
            body["term"] = self.term
        if self.quorum is not None:
            body["quorum"] = self.quorum
            body["spares"] = list(self.spares[:MAX_SPARES])
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
    quorum = doc.get("quorum")
    spares = doc.get("spares")
    spares = spares[:MAX_SPARES] if isinstance(spares, list) else []
    return Report(
        attempt=attempt,
        nodes=nodes,
        started=_count(doc.get("started")) or 0,
        started_at=_text(doc.get("startedAt")),
        seen_at=_text(doc.get("seenAt")),
        failures=tuple(f for f in map(_failure, failures) if f is not None),
        lost=tuple(x for x in map(_lost, lost) if x is not None),
        coordinator=_text(doc.get("coordinator"), _MAX_NAME),
        term=_count(doc.get("term")) or 0,
        quorum=quorum if isinstance(quorum, bool) else None,
        spares=tuple(p for p in spares if _text(p, _MAX_NAME)),
    )
