"""Run a job's pods as local process groups, driven by the operator's own state machine.

Each poll observes the process groups as pods (Running, Succeeded, or Failed with the exit code),
rank 0's latest record in the trainer's progress file and the launchers' report file as the
job's progress Lease, and hands them to `core.reconcile`, exactly as the operator hands it the
pods and the Lease it watches. The Outcome is applied the same way too: write the status (to
`status.json`, where the coordinator of the launchers reads the decisions, as it watches the job
in a cluster), delete pods (SIGTERM to the process group, SIGKILL after the grace period), then
create pods (start processes with the rendered pod's command and env). Failure rules, the
restart ladder (in place, one pod replaced, every pod recreated), backoff, maxRestarts and hang
detection therefore cannot differ between a laptop and a cluster. Ctrl-C or SIGTERM stops every
pod with SIGTERM, so the trainer saves a checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any

from megatron_contract.env import usable_cores
from megatron_contract.ladder import parse_report
from megatron_contract.ports import free_port
from megatron_operator import zipapp
from megatron_operator.api.job import API_VERSION, KIND, MegatronJob
from megatron_operator.api.status import Phase
from megatron_operator.core.observe import LeaseView, PodView, parse_progress
from megatron_operator.core.planner import Plan
from megatron_operator.core.reconcile import Outcome, World, reconcile

from .display import Display
from .inject import Injection, due, fire
from .pods import Layout, local_config, local_pods
from .summary import ProgressLog, complete_checkpoints, plot_losses, write_summary

POLL_SECONDS = 0.1
EXIT_FAILED = 1
EXIT_INTERRUPTED = {signal.SIGINT: 130, signal.SIGTERM: 143}


@dataclass
class Running:
    """One pod as a process group."""

    name: str
    node_rank: int
    attempt: int
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    code: int | None = None
    strategy: str | None = None
    spare: int | None = None
    # When the process group's leader (the launcher) ended, as the kubelet's finishedAt: timed by
    # a thread blocked in waitpid, not by the next poll, which a loaded machine can run late.
    ended_at: datetime | None = None

    def __post_init__(self) -> None:
        threading.Thread(target=self._reap, name=f"reap-{self.name}", daemon=True).start()

    def _reap(self) -> None:
        self.proc.wait()  # Popen's lock makes the main thread's poll() wait for this reap
        self.ended_at = datetime.now(UTC)

    def view(self, uid: str | None) -> PodView:
        """The pod as the state machine sees pods: a phase, an exit code and when it ended."""
        if self.code is None and self.ended_at is not None:  # its end is timed before it shows
            self.code = self.proc.returncode
        phase = "Running" if self.code is None else "Succeeded" if self.code == 0 else "Failed"
        return PodView(
            name=self.name,
            job_uid=uid,
            owner_uid=uid,  # every process group is the job's own
            attempt=self.attempt,
            node_rank=self.node_rank,
            phase=phase,
            node=None,
            deleting=False,
            exit_code=self.code if self.code is not None and self.code >= 0 else None,
            terminated_reason=None
            if self.code is None
            else "Completed"
            if self.code == 0
            else "Error",
            status_reason=None,
            disruption=None,
            strategy=self.strategy,
            spare=self.spare,
            ip="127.0.0.1",
            finished_at=self.ended_at if self.code is not None else None,
        )


def file_lease(latest: dict[str, Any] | None, report: str | None = None) -> LeaseView | None:
    """The progress file's newest record and the launchers' report file as the cluster's
    progress Lease: the record, its time as the heartbeat (renewTime) of the hang rule, and the
    report of the restart ladder."""
    record = parse_progress(json.dumps(latest)) if latest else None
    launchers = parse_report(report)
    if record is None and launchers is None:
        return None
    return LeaseView(
        holder=None,
        renew_time=record.time if record is not None else None,
        progress=record,
        report=launchers,
    )


@dataclass
class Result:
    status: str  # Succeeded | Failed
    reason: str
    message: str
    exit_code: int
    restarts: int = 0
    restart_iterations: list[int] = field(default_factory=list)


class LocalRunner:
    def __init__(
        self,
        job: MegatronJob,
        plan: Plan,
        layout: Layout,
        display: Display,
        injections: list[Injection],
        python: str,
    ) -> None:
        self.job = job
        self.plan = plan
        self.layout = layout
        self.display = display
        self.injections = injections
        self.injected_attempt = -1  # the last attempt an injection failed
        self.python = python
        self.grace = float(job.spec.checkpoint.grace_period_seconds)
        self.progress = ProgressLog(layout.progress)
        self.stop_signal: int | None = None
        self.started = time.monotonic()
        # The job's creation, as the apiserver would stamp it: the start of its wall time (the
        # goodput ledger's), to the microsecond here.
        self.created = datetime.now(UTC)
        self.pods: dict[str, Running] = {}
        self.restart_iterations: list[int] = []
        self.master_port = 0  # the gang's first rendezvous port and its coordinator's port
        self.coordinator_port = 0
        # The job as the apiserver would hold it; its status is the state machine's.
        self.doc: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": job.name,
                "namespace": job.namespace,
                "uid": job.metadata.uid,
                "generation": 1,
                "creationTimestamp": self.created.isoformat().replace("+00:00", "Z"),
            },
            "spec": job.spec.to_api(),
            "status": {},
        }

    # --- signals
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
            self.display.event(
                f"received {signal.Signals(signum).name}: stopping the pods with SIGTERM so the "
                "trainer saves a checkpoint"
            )

    def run(self) -> Result:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._run()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            for r in self.pods.values():
                r.log.close()
            shutil.rmtree(self.layout.workdir / "memory", ignore_errors=True)  # the pods' memory

    def _run(self) -> Result:
        self.layout.checkpoints.mkdir(parents=True, exist_ok=True)
        # An earlier run's pods are gone, and their memory with them.
        shutil.rmtree(self.layout.workdir / "memory", ignore_errors=True)
        write_key(self.layout.coordinator_key)
        self.progress.read_new()  # skip reports of an earlier run in this workdir
        for stale in (self.layout.status, self.layout.report):  # an earlier run's decisions
            stale.unlink(missing_ok=True)
        while True:
            for rec in self.progress.read_new():
                self.display.progress(rec)
                self._maybe_inject(rec)
            if self.stop_signal is not None:
                self._stop(list(self.pods.values()))
                return self._interrupted()
            uid = self.job.metadata.uid
            views = [r.view(uid) for r in self.pods.values()]
            lease = file_lease(self.progress.latest, _read(self.layout.report))
            out = reconcile(World(job=self.doc, pods=views, now=datetime.now(UTC), lease=lease))
            self._apply(out)
            status = self.doc["status"]
            if status.get("phase") in (Phase.SUCCEEDED, Phase.FAILED):
                return self._result(status)
            self._sleep(min(out.requeue_after, POLL_SECONDS))

    def _apply(self, out: Outcome) -> None:
        """The operator's order: status (and its events), deletes, creates."""
        before = self.doc["status"]
        self.doc["status"] = out.status
        if out.status != before:
            _write_atomically(self.layout.status, json.dumps(out.status))
        if out.status.get("phase") != Phase.RESTARTING:
            self.display.set_attempt(int(out.status.get("restartAttempt", 0)))
        attempt = int(out.status.get("restartAttempt", 0))
        for event in out.events:
            self.display.event(f"[attempt {before.get('restartAttempt', 0)}] {event.message}")
        if out.status.get("restarts", 0) > before.get("restarts", 0):
            self.restart_iterations.append(int((self.progress.latest or {}).get("iteration", 0)))
            failed = self.pods.get(str((out.status.get("lastFailure") or {}).get("pod")))
            if failed is not None:
                tail = _log_tail(failed)
                if tail:
                    self.display.event(f"  {failed.name}: {tail}")
        restart_at = out.status.get("restartAt")
        if restart_at and restart_at != before.get("restartAt"):
            rung = (out.status.get("lastFailure") or {}).get("rung", "")
            self.display.event(
                f"restart {out.status.get('restarts')} ({rung}) after the backoff, at {restart_at}"
            )
        doomed = [self.pods[n] for n in out.delete_pods if n in self.pods]
        if doomed:
            self._stop(doomed)
            for r in doomed:
                r.log.close()
                del self.pods[r.name]
                # A deleted pod's memory volume goes with it.
                shutil.rmtree(self.layout.memory(r.name), ignore_errors=True)
        if out.create_pods:
            self._start([*out.create, *out.create_pods], attempt)
        elif any(o["kind"] == "ConfigMap" for o in out.create):  # released in place
            self._write_config(out.create)

    def _result(self, status: dict[str, Any]) -> Result:
        self._stop(list(self.pods.values()))
        for rec in self.progress.read_new():
            self.display.progress(rec)
        for inj in self.injections:
            if not inj.fired:
                self.display.event(
                    f"injected failure not fired: {inj.describe()} (the job ended first)"
                )
        cond: dict[str, Any] = next(
            (c for c in status.get("conditions", []) if c.get("type") == status["phase"]), {}
        )
        restarts = int(status.get("restarts", 0))
        if status["phase"] == Phase.SUCCEEDED:
            return Result(
                "Succeeded",
                str(cond.get("reason", "Completed")),
                str(cond.get("message", "")),
                0,
                restarts,
                self.restart_iterations,
            )
        message = str(cond.get("message", ""))
        last = status.get("lastFailure") or {}
        failed = self.pods.get(str(last.get("pod")))
        tail = _log_tail(failed) if failed is not None else ""
        if tail:
            message += f". Last output of {failed.name if failed else ''}: {tail}"
        reason = str(last.get("reason") or cond.get("reason", "Failed"))
        return Result("Failed", reason, message, EXIT_FAILED, restarts, self.restart_iterations)

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + max(seconds, 0.0)
        while time.monotonic() < end and self.stop_signal is None:
            time.sleep(min(POLL_SECONDS, max(end - time.monotonic(), 0.0)))

    def _interrupted(self) -> Result:
        sig = self.stop_signal or signal.SIGINT
        return Result(
            "Failed",
            "Interrupted",
            f"stopped by {signal.Signals(sig).name}; the trainer checkpointed on SIGTERM",
            EXIT_INTERRUPTED.get(signal.Signals(sig), 130),
            int(self.doc["status"].get("restarts", 0)),
            self.restart_iterations,
        )

    # --- pods as process groups
    def _start(self, objs: list[dict[str, Any]], attempt: int) -> None:
        self._write_config(objs)
        logs = self.layout.logs(attempt)
        logs.mkdir(parents=True, exist_ok=True)
        self.display.set_attempt(attempt)
        ranks = {
            int(o["metadata"]["labels"]["megatron.dev/node-rank"])
            for o in objs
            if o["kind"] == "Pod"
        }
        if 0 in ranks or not self.coordinator_port:
            # A new gang: fresh ports (the last gang's may linger). A pod replaced alone joins
            # its gang's coordinator; later attempts' rendezvous ports are the coordinator's.
            self.master_port, self.coordinator_port = free_port(), free_port()
        for pod in local_pods(
            objs, self.layout, self.python, self.master_port, self.coordinator_port, usable_cores()
        ):
            if str(self.layout.launcher) in pod.argv and not self.layout.launcher.exists():
                # What the init container copies in a cluster: built from this checkout.
                zipapp.build(self.layout.launcher, "local")
            log = (logs / f"{pod.name}.log").open("wb")
            proc = subprocess.Popen(
                pod.argv,
                env={**os.environ, **pod.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: Ctrl-C reaches us, not it
            )
            self.pods[pod.name] = Running(
                pod.name, pod.node_rank, attempt, proc, log, strategy=pod.strategy, spare=pod.spare
            )

    def _write_config(self, objs: list[dict[str, Any]]) -> None:
        if any(o["kind"] == "ConfigMap" for o in objs):
            config = local_config(objs, self.layout)
            text = json.dumps(config, indent=2) + "\n"
            _write_atomically(self.layout.config, text)

    def _maybe_inject(self, rec: dict[str, Any]) -> None:
        step, attempt = rec.get("iteration"), rec.get("attempt")
        if not isinstance(step, int) or not isinstance(attempt, int):
            return
        pids = [r.proc.pid for r in self.pods.values() if r.code is None]
        for inj in due(self.injections, step, attempt, self.injected_attempt):
            fired = self._kill_pod(inj) if inj.pod is not None else fire(inj, pids)
            if fired:
                self.injected_attempt = attempt
                self.display.event(f"injected failure: {inj.describe()} (reached step {step})")

    def _kill_pod(self, inj: Injection) -> bool:
        """SIGKILL a whole pod's process group (launcher, zygote, ranks): a lost node."""
        pod = next(
            (r for r in self.pods.values() if r.node_rank == inj.pod and r.proc.poll() is None),
            None,
        )
        if pod is None:
            return False
        _killpg(pod.proc.pid, signal.SIGKILL)
        inj.fired, inj.fired_at = True, time.time()
        pod.proc.wait()
        inj.died_at = time.time()
        return True

    def _stop(self, pods: list[Running]) -> None:
        """SIGTERM each pod's process group, wait up to the grace period, then SIGKILL."""
        live = [r for r in pods if r.proc.poll() is None]
        for r in live:
            _killpg(r.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and any(r.proc.poll() is None for r in live):
            for rec in self.progress.read_new():
                self.display.progress(rec)
            time.sleep(POLL_SECONDS)
        for r in pods:
            _killpg(r.proc.pid, signal.SIGKILL)  # also reaps helpers left in the group
            r.code = r.proc.wait()

    # --- the record
    def summarize(self, result: Result) -> dict[str, Any]:
        losses = self.progress.losses
        latest = max(losses) if losses else int((self.progress.latest or {}).get("iteration", 0))
        url = self.job.spec.checkpoint.url
        ckpt_dir: Path | str = (
            url
            if url
            else self.layout.checkpoints / (self.job.spec.checkpoint.path or self.job.name)
        )
        summary: dict[str, Any] = {
            "status": result.status,
            "restarts": result.restarts,
            "iterations": latest,
            "finalLoss": losses.get(latest),
            "losses": [[i, losses[i]] for i in sorted(losses)],
            # Megatron-LM layout directories; for a trainer.command, the steps it reported.
            "checkpoints": complete_checkpoints(ckpt_dir) or sorted(self.progress.checkpoints),
            "reason": result.reason,
            "message": result.message,
            "job": self.job.name,
            "workdir": str(self.layout.workdir),
            "elapsedSeconds": round(time.monotonic() - self.started, 1),
            "checkpointDir": str(ckpt_dir),
            "tensorboardDir": f"{ckpt_dir}/tensorboard",
            "finishedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            # Where the wall time went (the operator's goodput ledger, as in status.ledger),
            # and the failures injected, with when they were sent.
            "ledger": self.doc["status"].get("ledger"),
            "injections": [
                {
                    "step": i.step,
                    "rank": i.rank,
                    "pod": i.pod,
                    "signal": i.signal,
                    "at": i.fired_at,
                    "diedAt": i.died_at,
                }
                for i in self.injections
                if i.fired
            ],
        }
        if plot_losses(
            self.layout.loss_plot, losses, result.restart_iterations, f"{self.job.name} (local)"
        ):
            summary["lossCurve"] = str(self.layout.loss_plot)
        write_summary(self.layout.summary, summary)
        return summary


def _log_tail(r: Running, lines: int = 3) -> str:
    try:
        with open(r.log.name, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    tail = [ln for ln in text.splitlines() if ln.strip()][-lines:]
    return " | ".join(tail)[-500:]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def write_key(path: Path) -> None:
    """A fresh coordinator key for this run, readable by this user only (created so: never a
    moment with wider permissions)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
