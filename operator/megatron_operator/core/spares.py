"""Spare nodes (pure): the gang's pods with spares, and which spare takes a lost node rank.

A job with `resources.spareNodes: k` keeps k pods beside its gang (`<job>-a<attempt>-s<n>`,
core/render.py): scheduled, image pulled, launcher connected to the coordinator with its
zygote's imports done, running no rank. When a node rank's pod is lost, the restart gives that
node rank to a spare (`status.swaps[rank] = spare pod`) and every launcher, the spare's among
them, starts the next attempt in place: no pod is created or scheduled on the way. The lost pod
is deleted but never waited for: its launcher fenced itself (killed its ranks) before the
coordinator starts the rank anywhere else (docs/architecture.md, "Spare nodes"). A new spare
is made afterwards, once the next attempt trains.

`status.swaps` only grows within a gang (a rank's holder is named explicitly from its first
move on, even when a later ReplacePod puts it back on a pod made for it) and is cleared when
the gang is recreated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from megatron_contract.ladder import Report
from megatron_operator.core.names import MASTER_NODE_RANK
from megatron_operator.core.observe import PodView

# A spare is made again this long after its job runs the attempt that used it, at the latest,
# even when no training step is reported (a trainer.command without a progress source).
REPLENISH_AFTER_SECONDS = 30.0
# With spares, a pod on a NotReady node is lost after this long (the operator's
# --node-lost-grace-seconds otherwise): moving its rank is safe at once (fencing).
NOT_READY_SECONDS = 0.0


@dataclass(frozen=True)
class Gang:
    """The job's pods, sorted: `current` holds one pod per node rank (its `node_rank` is the
    rank it holds, a spare's included), `spares` the idle spares (newest per number), and
    `displaced` the pods whose node rank moved onto another pod (deleted, not waited for).
    Everything else is `stale`."""

    current: list[PodView]
    spares: list[PodView] = field(default_factory=list)
    displaced: list[PodView] = field(default_factory=list)
    stale: list[PodView] = field(default_factory=list)


def sort_gang(
    pods: list[PodView],
    gang: int,
    attempt: int,
    nodes: int,
    spares: int = 0,
    swaps: Mapping[int, str] | None = None,
) -> Gang:
    """Per node rank in [0, nodes): the pod `swaps` names for it, else the newest pod made for
    it of an attempt in [gang, attempt]; per spare number in [0, spares): the newest spare pod
    of such an attempt that holds no rank. A pod made for a rank that `swaps` gave to another
    pod is displaced; every other pod is stale (an older gang's, a superseded one, or one this
    job's layout no longer has)."""
    swaps = {r: p for r, p in (swaps or {}).items() if 0 <= r < nodes}
    holding = {p: r for r, p in swaps.items()}
    best: dict[int, PodView] = {}
    spare: dict[int, PodView] = {}
    displaced: list[PodView] = []
    stale: list[PodView] = []

    def newest(table: dict[int, PodView], key: int, x: PodView) -> None:
        other = table.get(key)
        if other is None:
            table[key] = x
        elif ((x.attempt or 0), x.name) > ((other.attempt or 0), other.name):
            stale.append(other)
            table[key] = x
        else:
            stale.append(x)

    for x in pods:
        rank, made = x.node_rank, x.attempt
        if rank is None or made is None or not gang <= made <= attempt:
            stale.append(x)
        elif x.name in holding:
            best[holding[x.name]] = replace(x, node_rank=holding[x.name])
        elif 0 <= rank < nodes and x.spare is None:
            if rank in swaps:
                displaced.append(x)
            else:
                newest(best, rank, x)
        elif x.spare is not None and x.spare < spares and rank == nodes + x.spare:
            newest(spare, x.spare, x)
        else:
            stale.append(x)
    # A pod named in swaps whose node rank another pod also claims (never, but for a status
    # written by hand): the named one holds it, the other was kept as stale above.
    return Gang(
        current=[best[r] for r in sorted(best)],
        spares=[spare[i] for i in sorted(spare)],
        displaced=displaced,
        stale=stale,
    )


def ready(spares: list[PodView], report: Report | None) -> list[PodView]:
    """The spares that can take a node rank now: Running, not deleting, and connected to the
    coordinator as an idle spare, by its own report (a report of a coordinator that hears a
    majority of the launchers: without one, no rank may move)."""
    if report is None or report.quorum is not True:
        return []
    connected = set(report.spares)
    return [
        x
        for x in spares
        if x.phase == "Running" and not x.deleting and x.name in connected and x.ip is not None
    ]


def assign(lost_ranks: list[int], spares: Sequence[PodView]) -> dict[int, str]:
    """Which spare takes which lost node rank: node rank 0 first (its pod hosts the
    coordinator and the rendezvous), then the others in order, each onto the lowest-numbered
    ready spare. Ranks left without a spare are not in the result."""
    order = sorted(set(lost_ranks), key=lambda r: (r != MASTER_NODE_RANK, r))
    free = sorted(spares, key=lambda x: (x.spare if x.spare is not None else 0, x.name))
    return {rank: x.name for rank, x in zip(order, free, strict=False)}


def missing(gang: Gang, spares: int) -> list[int]:
    """The spare numbers that have no pod."""
    have = {x.spare for x in gang.spares}
    return [i for i in range(spares) if i not in have]


def coordinator_pod(report: Report | None, record: Mapping[str, object] | None) -> str | None:
    """The pod whose launcher coordinates, when it is not node rank 0's: the recorded one, or a
    newer one that reported with a majority (its term is higher)."""
    pod = record.get("pod") if record else None
    term = record.get("term") if record else None
    if (
        report is not None
        and report.quorum is True
        and report.coordinator is not None
        and report.term > (term if isinstance(term, int) else 0)
    ):
        return report.coordinator
    return pod if isinstance(pod, str) else None


def trusted(report: Report | None, record: Mapping[str, object] | None) -> bool:
    """Whether the report comes from the coordinator the operator follows, or a newer one: a
    coordinator that lost its place (cut off, then back) may still write an older term."""
    if report is None or record is None or report.coordinator is None:
        return True  # no coordinator recorded: node rank 0's, whatever it reports
    term = record.get("term")
    recorded = (term if isinstance(term, int) else 0, str(record.get("pod") or ""))
    return (report.term, report.coordinator) >= recorded
