"""Liveness and fencing between the launchers and their coordinator (jobs with spare nodes).

With spares a node rank can move to another pod without its old pod being deleted first, so the
old pod's ranks must stop by themselves before the rank starts anywhere else. The argument
(docs/architecture.md, "Spare nodes") rests on two local clocks and one rule each:

- a launcher pings its coordinator every HEARTBEAT_SECONDS; the coordinator answers every ping,
  granting it only while it hears a majority of the job's launchers (`Quorum`). The launcher
  holds a `Lease` until FENCE_SECONDS after *sending* the newest granted ping, and kills its
  ranks (fences) when the lease ends. A grant that arrives late extends nothing past its ping's
  send time, so however slow the network, the launcher's ranks are dead by FENCE_SECONDS after
  the coordinator's last grant to it;
- the coordinator gives a node rank to another pod only FENCE_SECONDS + FENCE_MARGIN_SECONDS
  after its last grant to the launcher that held it (`Fences`); a coordinator that took over
  from a lost one waits SILENT + FENCE + MARGIN after it first hears a majority, by which time
  the old one has heard no majority for FENCE + MARGIN and every launcher it kept alive fenced.

Two majorities of the same launchers cannot both be heard for longer than SILENT_SECONDS (a
launcher talks to one coordinator at a time), which is what the successor's wait covers. The
argument assumes that clocks tick at the same rate (they do to within parts per million) and that
a launcher is scheduled (a launcher frozen for seconds cannot fence; its ranks then wait in a
collective whose peers are gone).

Standard library only, Python 3.8+.
"""

from __future__ import annotations

from megatron_contract.ladder import FENCE_MARGIN_SECONDS, FENCE_SECONDS, SILENT_SECONDS


class Lease:
    """A launcher's right to run ranks: until FENCE_SECONDS after sending the newest ping its
    coordinator granted."""

    def __init__(self, fence_seconds: float = FENCE_SECONDS) -> None:
        self.fence_seconds = fence_seconds
        self.seq = 0
        self.sent: dict[int, float] = {}  # seq → when it was sent (monotonic)
        self.until: float | None = None
        self.heard: float | None = None  # the last answer of any kind

    def ping(self, now: float) -> int:
        """The sequence number of a ping sent now."""
        self.seq += 1
        self.sent[self.seq] = now
        for old in [s for s, t in self.sent.items() if t < now - self.fence_seconds]:
            del self.sent[old]  # too old to extend anything
        return self.seq

    def answer(self, seq: int, granted: bool, now: float) -> None:
        """The coordinator answered ping `seq`: it is alive, and granted the lease or not."""
        self.heard = now
        sent = self.sent.get(seq)
        if sent is None:
            return
        if granted:
            end = sent + self.fence_seconds
            self.until = end if self.until is None else max(self.until, end)
        for old in [s for s in self.sent if s <= seq]:
            del self.sent[old]

    def valid(self, now: float) -> bool:
        return self.until is not None and now < self.until


def majority(present: int, members: int) -> bool:
    """More than half of the job's launchers (its node ranks and its spares)."""
    return members > 0 and 2 * present > members


class Fences:
    """The coordinator's record of launchers that went away while their ranks may have run:
    no attempt starts before each one's ranks have surely fenced themselves."""

    def __init__(self) -> None:
        self.until: dict[str, float] = {}  # pod → when its ranks are surely gone

    def lost(self, pod: str, granted: float | None) -> None:
        """`pod`'s launcher is gone; `granted`: when it was last granted a lease (None: never)."""
        if granted is not None:
            end = granted + FENCE_SECONDS + FENCE_MARGIN_SECONDS
            self.until[pod] = max(self.until.get(pod, end), end)

    def back(self, pod: str) -> None:
        """`pod`'s launcher connected again and runs no rank: nothing to wait for."""
        self.until.pop(pod, None)

    def wait(self, now: float) -> float | None:
        """When the last lost launcher's ranks are surely gone (None: already)."""
        for pod in [p for p, t in self.until.items() if t <= now]:
            del self.until[pod]
        return max(self.until.values()) if self.until else None


def successor_wait(quorum_at: float) -> float:
    """When a coordinator that took over may start ranks: every launcher the lost coordinator
    kept alive has fenced by then (see the module's argument)."""
    return quorum_at + SILENT_SECONDS + FENCE_SECONDS + FENCE_MARGIN_SECONDS
