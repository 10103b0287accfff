"""The restart ladder (pure): which pods are the gang's, and which rung recovers a failure.

The failure rules (`policy.decide`) say *whether* to restart; this module says *how*, taking the
lowest rung that can recover (docs/architecture.md, "The restart ladder"):

1. InPlace: every launcher restarts its ranks inside its running pod;
2. SpareSwap: a lost pod's node rank moves onto a warm spare (core/spares.py), and every
   launcher restarts its ranks in place;
3. ReplacePod: the lost pods are recreated, the other pods restart their ranks in place;
4. Recreate: every pod is recreated.

A pod keeps the attempt it was created in; `status.gangAttempt` is the attempt the gang was last
created in. For each node rank, the gang's pod is the newest one of an attempt between the two;
everything else of the job is stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from megatron_contract.ladder import IN_PLACE, RECREATE
from megatron_operator.api.spec import RestartStrategy
from megatron_operator.api.status import Rung
from megatron_operator.core import spares as spare_nodes
from megatron_operator.core.jobstatus import JobStatus
from megatron_operator.core.names import MASTER_NODE_RANK
from megatron_operator.core.observe import PodView
from megatron_operator.core.policy import Failure

MAX_FAILED_NODES = 64  # status.failedNodes keeps the newest this many
# Reasons whose node says nothing about that node: a hang is blamed on rank 0's pod, and a
# restart that timed out waited on every rank.
NODE_AGNOSTIC = ("Hang", "RestartTimeout")


def partition(
    pods: list[PodView], gang: int, attempt: int, nodes: int
) -> tuple[list[PodView], list[PodView]]:
    """(current, stale): per node rank in [0, nodes), the newest pod of an attempt in
    [gang, attempt]; every other pod is stale (an older gang's, a superseded one of its rank, or
    one this job's layout no longer has)."""
    best: dict[int, PodView] = {}
    stale: list[PodView] = []
    for x in pods:
        rank, made = x.node_rank, x.attempt
        if rank is None or made is None or not 0 <= rank < nodes or not gang <= made <= attempt:
            stale.append(x)
            continue
        other = best.get(rank)
        if other is None:
            best[rank] = x
        elif (made, x.name) > (other.attempt or 0, other.name):
            stale.append(other)
            best[rank] = x
        else:
            stale.append(x)
    return [best[r] for r in sorted(best)], stale


@dataclass(frozen=True)
class Choice:
    rung: Rung
    why: str | None = None  # why not a lower rung (None: it is the lowest that can)
    swaps: dict[int, str] = field(default_factory=dict)  # node rank → the spare taking it


def choose(
    strategy: RestartStrategy,
    failures: list[Failure],
    cause: Failure,
    st: JobStatus,
    stepped: bool,
    current: list[PodView],
    spares: Sequence[PodView] | None = None,
    repeated_recreates: bool = True,
) -> Choice:
    """The rung of the restart that `failures` (with `cause` to blame) call for, before the
    status moves to the next attempt. `stepped`: the current attempt reported a training step;
    `current`: the gang's pods; `spares`: the spares ready to take a lost pod's node rank (None:
    the job keeps none); `repeated_recreates`: a node failing again recreates the gang
    (restartPolicy.recreateOnRepeatedNodeFailure)."""
    if strategy == RECREATE:
        return Choice(Rung.RECREATE, "spec.restartPolicy.strategy is Recreate")
    plain = next((x for x in current if x.strategy != IN_PLACE), None)
    if plain is not None:
        return Choice(
            Rung.RECREATE,
            f"pod {plain.name} was created to be recreated (strategy "
            f"{plain.strategy or 'Recreate, by an older operator'}): its launcher restarts nothing "
            "in place",
        )
    lost = [f for f in failures if f.pod_lost]
    swaps = spare_nodes.assign([f.node_rank for f in lost if f.node_rank is not None], spares or ())
    host = next(
        (f for f in lost if f.node_rank == MASTER_NODE_RANK and MASTER_NODE_RANK not in swaps),
        None,
    )
    if host is not None:
        return Choice(
            Rung.RECREATE,
            f"the pod of node rank {MASTER_NODE_RANK} ({host.pod}), which hosts the rendezvous, "
            "was lost"
            + (" and no spare was ready to take its node rank" if spares is not None else ""),
        )
    if st.gang < st.restart_attempt and not stepped:
        return Choice(
            Rung.RECREATE,
            f"attempt {st.restart_attempt}, restarted in place, failed before its first "
            "training step",
        )
    node = repeated_node(cause, st) if repeated_recreates else None
    if node is not None and not (cause.pod_lost and cause.node_rank in swaps):
        return Choice(Rung.RECREATE, f"node {node} failed a second time in this gang")
    if lost and all(f.node_rank in swaps for f in lost):
        return Choice(Rung.SPARE_SWAP, swaps=swaps)
    if lost:
        return Choice(Rung.REPLACE_POD, swaps=swaps)
    return Choice(Rung.IN_PLACE)


def repeated_node(cause: Failure, st: JobStatus) -> str | None:
    if cause.node is None or cause.reason in NODE_AGNOSTIC:
        return None
    return cause.node if cause.node in (st.failed_nodes or []) else None


def remember_node(cause: Failure, st: JobStatus) -> None:
    """Record where the cause of an in-place restart or a replacement ran."""
    if cause.node is None or cause.reason in NODE_AGNOSTIC:
        return
    nodes = [n for n in st.failed_nodes or [] if n != cause.node] + [cause.node]
    st.failed_nodes = nodes[-MAX_FAILED_NODES:]


def describe(
    rung: Rung,
    attempt: int,
    replaced: list[str],
    why: str | None,
    swaps: dict[int, str] | None = None,
) -> str:
    """The tail of the restart's event: what this rung does."""
    moved = "; ".join(
        f"node rank {r} moves onto spare {p}" for r, p in sorted((swaps or {}).items())
    )
    if rung == Rung.IN_PLACE:
        text = f"restarting every rank in place as attempt {attempt}"
    elif rung == Rung.SPARE_SWAP:
        text = f"{moved}, every pod restarts its ranks in place as attempt {attempt}"
    elif rung == Rung.REPLACE_POD:
        pods = ", ".join(replaced[:5]) + (
            f" and {len(replaced) - 5} more" if len(replaced) > 5 else ""
        )
        text = f"replacing pod {pods}, the other pods restart their ranks in place as attempt {attempt}"
        if moved:
            text = f"{moved}; {text}"
    else:
        text = f"recreating every pod as attempt {attempt}"
    return f"{text} ({why})" if why else text
