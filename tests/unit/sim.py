"""A tiny in-memory world for driving the pure state machine through whole lifecycles.

It applies an Outcome the way the operator's shell does (status, then deletes, then creates),
and lets a test play kubelet/kwok: run, fail or finish pods. Crash tests apply only part of an
Outcome. This is not a Kubernetes fake for the operator: the integration tests use a real
apiserver; this only feeds `reconcile`, which is pure.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from megatron_contract.ladder import REPORT_ANNOTATION, LostLauncher, RankFailure, Report
from megatron_contract.paths import PROGRESS_ANNOTATION as ANNOTATION_PROGRESS
from megatron_operator.core.defaults import Layer
from megatron_operator.core.observe import format_time, lease_view, pod_view
from megatron_operator.core.policy import MIN_BACKOFF_SECONDS
from megatron_operator.core.reconcile import Outcome, Settings, World, reconcile

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


@dataclass
class Sim:
    job: dict[str, Any]
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    now: datetime = T0
    not_ready: dict[str, datetime] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)
    created: int = 0
    settings: Settings = field(default_factory=Settings)
    last: Outcome | None = None
    lease: dict[str, Any] | None = None  # the job's progress Lease, once the shell made it
    # The platform's defaults the shell would look up (core/defaults.py): only while the job has
    # recorded none and not started, as the shell passes them.
    defaults: tuple[Layer, ...] | None = None
    # The shell's progress rate limit (World.progress_not_before): no copy of the Lease's record
    # into status.progress before it.
    progress_hold: datetime | None = None

    @classmethod
    def of_spec(cls, spec: dict[str, Any]) -> Sim:
        """A Sim of the job "job" (uid-1, generation 1) with this spec (tests/unit/specs.py)."""
        from .specs import job_doc

        doc = job_doc(spec, name="job")
        doc["metadata"].update(uid="uid-1", generation=1)
        return cls(job=doc)

    def start_running(self) -> None:
        """Create the gang, run every pod, and check the job reads Running."""
        self.settle()
        self.run_all()
        self.step()
        assert self.status["phase"] == "Running"

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.job.get("status") or {})

    def world(self) -> World:
        return World(
            job=copy.deepcopy(self.job),
            pods=[pod_view(p) for p in self.pods.values()],
            now=self.now,
            not_ready_nodes=dict(self.not_ready),
            lease=lease_view(copy.deepcopy(self.lease)),
            defaults=self._defaults(),
            progress_not_before=self.progress_hold,
        )

    def _defaults(self) -> tuple[Layer, ...] | None:
        status = self.status
        return None if "defaults" in status or "startTime" in status else self.defaults

    def step(self, *, write_status: bool = True, max_creates: int | None = None) -> Outcome:
        out = reconcile(self.world(), self.settings)
        self.last = out
        if write_status:
            self.job["status"] = copy.deepcopy(out.status)
            self.events += [(e.reason, e.message) for e in out.events]
        for name in out.delete_pods:
            pod = self.pods.get(name)
            if pod is not None:
                pod["metadata"]["deletionTimestamp"] = format_time(self.now)
        for name in out.force_delete:  # no grace period: the apiserver removes it at once
            self.pods.pop(name, None)
        lease = next((o for o in out.create if o["kind"] == "Lease"), None)
        if lease is not None and self.lease is None:  # get-or-create, never replaced
            self.lease = copy.deepcopy(lease)
        pods = out.create_pods if max_creates is None else out.create_pods[:max_creates]
        for obj in [copy.deepcopy(p) for p in pods]:
            name = obj["metadata"]["name"]
            assert name not in self.pods, f"duplicate create of {name}"
            obj["status"] = {"phase": "Pending"}
            obj["metadata"]["uid"] = f"pod-uid-{self.created}"  # as the apiserver assigns
            self.pods[name] = obj
            self.created += 1
        return out

    def settle(self, steps: int = 6) -> None:
        """Reconcile repeatedly, finishing deletions in between (kwok's pod-delete stage), a
        second apart: the restart-loop floor (core/policy.py) spaces attempts at least that."""
        for _ in range(steps):
            self.step()
            self.finish_deletions()
            self.tick(MIN_BACKOFF_SECONDS)

    def finish_deletions(self) -> None:
        for name in [n for n, p in self.pods.items() if p["metadata"].get("deletionTimestamp")]:
            del self.pods[name]

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    # --- playing kubelet
    def run_all(self) -> None:
        for i, p in enumerate(self.pods.values()):
            if p["status"]["phase"] == "Pending":
                p["spec"]["nodeName"] = f"node-{i}"
                p["status"] = {"phase": "Running", "podIP": f"10.0.0.{i + 1}"}

    def fail(self, name: str, exit_code: int = 1, reason: str = "Error") -> None:
        self.pods[name]["status"] = {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "state": {"terminated": {"exitCode": exit_code, "reason": reason}},
                }
            ],
        }

    def disrupt(self, name: str, reason: str = "EvictionByEvictionAPI") -> None:
        status = self.pods[name]["status"]
        status.setdefault("conditions", []).append(
            {"type": "DisruptionTarget", "status": "True", "reason": reason}
        )
        self.fail(name, 143)
        self.pods[name]["status"]["conditions"] = status["conditions"]

    def succeed_all(self) -> None:
        for p in self.pods.values():
            p["status"] = {
                "phase": "Succeeded",
                "containerStatuses": [
                    {
                        "name": "trainer",
                        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                    }
                ],
            }

    def report_progress(
        self, iteration: int, at: datetime | None = None, attempt: int | None = None
    ) -> None:
        """Write the Lease as rank 0 of `attempt` (default: the current one) would."""
        assert self.lease is not None, "the operator has not created the progress Lease yet"
        if attempt is None:
            attempt = int(self.status.get("restartAttempt", 0))
        when = format_time(at or self.now)
        self.lease["metadata"].setdefault("annotations", {})[ANNOTATION_PROGRESS] = json.dumps(
            {"attempt": attempt, "iteration": iteration, "loss": 2.5, "time": when}
        )
        self.lease["spec"] = {"holderIdentity": "job-0", "renewTime": when}

    def attempts(self) -> set[str]:
        """The attempts of the pods, but for the failed ones kept for their logs."""
        kept = set(self.status.get("keptPods") or [])
        return {
            p["metadata"]["labels"]["megatron.dev/restart-attempt"]
            for name, p in self.pods.items()
            if name not in kept
        }

    # --- playing the launchers (their coordinator's report in the progress Lease)
    def report_launchers(
        self,
        failures: list[tuple[int, int]] = (),  # type: ignore[assignment]
        lost: list[str] = (),  # type: ignore[assignment]
        attempt: int | None = None,
        started: int = 0,
        spares: list[str] | None = None,
        quorum: bool | None = None,
        coordinator: str | None = None,
        term: int = 0,
    ) -> None:
        """Write the launchers' report as the coordinator would: rank failures (node rank, exit
        code) of `attempt` (default: the current one) and the pods whose launcher dropped out;
        with spare nodes, the idle spares connected and whether the coordinator (`coordinator`
        in `term`) hears a majority (`spares` given: yes, unless `quorum` says otherwise)."""
        assert self.lease is not None, "the operator has not created the progress Lease yet"
        if attempt is None:  # the attempt the ranks run: a decided one is not started yet
            attempt = int(self.status.get("restartAttempt", 0))
            if self.status.get("phase") == "Restarting":
                attempt -= 1
        when = format_time(self.now)
        report = Report(
            attempt=attempt,
            nodes=len(self.pods),
            started=started,
            failures=tuple(RankFailure(n, 0, code, when) for n, code in failures),
            lost=tuple(
                LostLauncher(
                    int(self.pods[p]["metadata"]["labels"]["megatron.dev/node-rank"]), p, when
                )
                for p in lost
            ),
            coordinator=coordinator,
            term=term,
            quorum=quorum if quorum is not None else (True if spares is not None else None),
            spares=tuple(spares or ()),
        )
        self.lease["metadata"].setdefault("annotations", {})[REPORT_ANNOTATION] = report.dumps()
