"""The true timeline of a run, for checking its goodput ledger: the trainer's own step records
(every step's record, with its process's clock: a local run's progress.jsonl, or rank 0's log on
real kubelets) and the injector's log (a local run's summary.json `injections`, each with the
time its signal was sent and the time the rank's process was gone, which can be seconds later for
a rank in the middle of a write; or the time a test killed a container).

Truth, with the definitions of docs/metrics.md: a step's time is the stretch between its record
and the one before it in the same process (the first from the loop's start), less the blocking
saves in between; it is productive the first time the run reaches the step and recomputed when a
later attempt trains it again; and the work in flight when a rank is killed (from the process's
last record to the kill) is recomputed. The ledger sees only what the operator sees (the newest
record at each poll or Lease write, the launchers' report, the pods, its own decisions) and must
agree.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Truth:
    productive: float
    recomputed: float
    save: float


def truth(
    records: list[dict[str, Any]], kills: list[float], unseen_after: float | None = None
) -> Truth:
    """The true split. `unseen_after`: the operator's view instead, had it last seen the failed
    attempt's record of that time (docs/metrics.md, "What it cannot see"): that attempt's later
    steps count as lost in flight, and their replay as new."""
    records = sorted(
        (r for r in records if isinstance(r.get("clock"), dict)), key=lambda r: r["clock"]["now"]
    )
    productive = recomputed = save = 0.0
    high = 0
    # One process per (attempt, began): its records in time order.
    processes: dict[tuple[int, float], list[dict[str, Any]]] = {}
    for r in records:
        processes.setdefault((r["attempt"], r["clock"]["began"]), []).append(r)
    blind_attempt = _attempt_at(records, unseen_after) if unseen_after is not None else None
    for recs in sorted(processes.values(), key=lambda rs: rs[0]["clock"]["now"]):
        clock = recs[0]["clock"]
        at, step, saved = clock["loop"], clock["start"], 0.0
        for r in recs:
            c = r["clock"]
            if (
                unseen_after is not None
                and r["attempt"] == blind_attempt
                and c["now"] > unseen_after
            ):
                recomputed += c["now"] - at  # not seen before the failure: all in flight
                at, step, saved = c["now"], max(step, r["iteration"]), c["save"]
                continue
            stall = c["save"] - saved
            rest = c["now"] - at - stall
            steps = r["iteration"] - step
            again = max(min(r["iteration"], high) - step, 0)
            if steps > 0:
                recomputed += rest * again / steps
                productive += rest * (steps - again) / steps
            elif step < high:
                recomputed += rest
            else:
                productive += rest
            save += stall
            at, step, saved = c["now"], max(step, r["iteration"]), c["save"]
            high = max(high, r["iteration"])
    for kill in kills:  # the work in flight: from the killed process's last record to the kill
        last = max(r["clock"]["now"] for r in records if r["clock"]["now"] <= kill)
        recomputed += kill - last
    return Truth(productive, recomputed, save)


def _attempt_at(records: list[dict[str, Any]], when: float) -> int:
    last = max((r for r in records if r["clock"]["now"] <= when), key=lambda r: r["clock"]["now"])
    return int(last["attempt"])


def compare(
    ledger: dict[str, Any],
    records: list[dict[str, Any]],
    kills: list[float],
    slack: float = 0.0,
    kill_spread: float = 0.0,
    view_lag: float = 0.0,
) -> dict[str, float]:
    """The acceptance: ≥ 99 % of the wall time attributed to named causes, the goodput within
    ±1 percentage point of the truth, recomputed seconds within ±5 % (or `slack` seconds, the
    resolution of a failure time the ledger reads from the kubelet; plus `kill_spread`, the
    seconds between the kills' signals and the deaths the `kills` times are). Returns the figures.

    `view_lag` > 0 (real kubelets, where the operator sees rank 0's records through a Lease
    written at most every so many seconds): when the failed attempt's last records never reached
    the operator (their node lost), the ledger is held to the truth as the operator could have
    seen it: the truth with the failed attempt's records after one of its records within
    `view_lag` seconds before the kill unseen. It must match one such view, exactly as above."""
    views: list[float | None] = [None]
    if view_lag > 0 and kills:
        kill = kills[-1]
        times = [r["clock"]["now"] for r in records if isinstance(r.get("clock"), dict)]
        views += sorted((x for x in times if kill - view_lag <= x <= kill), reverse=True)
    failures: list[AssertionError] = []
    for view in views:
        try:
            return _compare(ledger, truth(records, kills, view), slack, kill_spread, view)
        except AssertionError as err:
            failures.append(err)
    raise failures[0]


def _compare(
    ledger: dict[str, Any], t: Truth, slack: float, spread: float, view: float | None
) -> dict[str, float]:
    seconds, wall = ledger["seconds"], ledger["wallSeconds"]
    figures = {
        "wall": wall,
        "attributed": 1 - seconds.get("unattributed", 0.0) / wall,
        "goodput": ledger["goodput"],
        "true goodput": t.productive / wall,
        "recomputed": seconds.get("recomputed", 0.0),
        "true recomputed": t.recomputed,
        "save": seconds.get("checkpointSave", 0.0),
        "true save": t.save,
    }
    if view is not None:
        figures["seen until"] = view
    assert figures["attributed"] >= 0.99, figures
    assert abs(figures["goodput"] - figures["true goodput"]) <= 0.01, figures
    if t.recomputed > 0:
        bound = max(0.05 * t.recomputed, slack) + spread
        assert abs(figures["recomputed"] - t.recomputed) <= bound, figures
    return figures


def check_ledger(
    workdir: Path, kills: list[float] | None = None, spread: float = 0.0
) -> dict[str, float]:
    """A local run's ledger (summary.json) against the truth, and its wall time against the
    runner's own stopwatch. `spread`: how late after `kills` the runner may have seen them."""
    summary = json.loads((workdir / "summary.json").read_text())
    lines = (workdir / "progress.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines if x.strip()]
    # A hang (SIGSTOP): from the gang's last record before it to the stopped rank's death (the
    # Hang restart's kill), the ledger's hangDetection; the in-flight work is in it, so it is not
    # a kill's recomputed work.
    hangs = [i for i in summary["injections"] if i["signal"] == signal.SIGSTOP]
    if kills is None:
        died = [i for i in summary["injections"] if i not in hangs]
        kills = [i["diedAt"] or i["at"] for i in died]
        # A death is seen by polling (a killed rank is not the runner's child): the failure
        # happened somewhere between the signal and that sighting.
        spread = sum((i["diedAt"] or i["at"]) - i["at"] for i in died)
    figures = compare(summary["ledger"], records, kills, kill_spread=spread)
    if hangs:
        times = [r["clock"]["now"] for r in records if isinstance(r.get("clock"), dict)]
        waited = sum(i["diedAt"] - max(t for t in times if t <= i["at"]) for i in hangs)
        figures["hangDetection"] = summary["ledger"]["seconds"].get("hangDetection", 0.0)
        figures["true hangDetection"] = waited
        # The decision comes one poll (0.1 s) after the deadline, the kill one stop after that.
        assert 0 <= waited - figures["hangDetection"] <= 1.0 + 0.5 * len(hangs), figures
    figures["elapsed"] = summary["elapsedSeconds"]
    # The wall time itself: from the run's start to its end, within the runner's own stopwatch.
    assert figures["elapsed"] - 5 <= figures["wall"] <= figures["elapsed"] + 0.1, figures
    return figures
