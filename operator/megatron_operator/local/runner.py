"""Supervise a job's pods as local process groups, with the operator's restart semantics.

Any pod process exiting non-zero restarts the whole gang, decided by the operator's own failure
policy (`policy.decide`, `policy.backoff_seconds`): the same rules, backoff and maxRestarts.
Ctrl-C or SIGTERM stops every pod with SIGTERM, so the trainer saves a checkpoint, and escalates to
SIGKILL after the pods' grace period.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import IO, Any

from megatron_operator.api.job import MegatronJob
from megatron_operator.core.planner import Plan
from megatron_operator.core.policy import Failure, backoff_seconds, decide, first_failure
from megatron_operator.core.render import render

from .display import Display
from .inject import Injection, fire
from .pods import Layout, LocalPod, local_config, local_pods
from .summary import ProgressLog, complete_checkpoints, plot_losses, write_summary

POLL_SECONDS = 0.1
EXIT_FAILED = 1
EXIT_INTERRUPTED = {signal.SIGINT: 130, signal.SIGTERM: 143}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Running:
    pod: LocalPod
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    code: int | None = None


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
        self.python = python
        self.policy = job.spec.restart_policy
        self.grace = float(job.spec.checkpoint.grace_period_seconds)
        self.progress = ProgressLog(layout.progress)
        self.stop_signal: int | None = None
        self.started = time.monotonic()

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

    def _run(self) -> Result:
        self.layout.checkpoints.mkdir(parents=True, exist_ok=True)
        self.progress.read_new()  # skip reports of an earlier run in this workdir
        restarts = counted = 0
        restart_iters: list[int] = []
        attempt = 0
        while True:
            self.display.set_attempt(attempt)
            outcome = self._attempt(attempt)
            if isinstance(outcome, Result):
                outcome.restarts, outcome.restart_iterations = restarts, restart_iters
                return outcome
            decision = decide(outcome, self.policy, counted)
            self.display.event(f"[attempt {attempt}] {decision.message}")
            if outcome.message:
                self.display.event(f"  {outcome.pod}: {outcome.message}")
            if decision.action == "Fail":
                why = decision.message
                if outcome.message:
                    why += f". Last output of {outcome.pod}: {outcome.message}"
                return Result("Failed", outcome.reason, why, EXIT_FAILED, restarts, restart_iters)
            restarts += 1
            counted += int(decision.counted)
            restart_iters.append(int((self.progress.latest or {}).get("iteration", 0)))
            delay = backoff_seconds(self.policy, restarts - 1)
            self.display.event(f"restarting all pods in {delay:g}s (restart {restarts})")
            if not self._sleep(delay):
                return self._interrupted(restarts, restart_iters)
            attempt += 1

    def _sleep(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.stop_signal is not None:
                return False
            time.sleep(min(POLL_SECONDS, end - time.monotonic()))
        return self.stop_signal is None

    def _interrupted(self, restarts: int = 0, restart_iters: list[int] | None = None) -> Result:
        sig = self.stop_signal or signal.SIGINT
        return Result(
            "Failed",
            "Interrupted",
            f"stopped by {signal.Signals(sig).name}; the trainer checkpointed on SIGTERM",
            EXIT_INTERRUPTED.get(signal.Signals(sig), 130),
            restarts,
            restart_iters or [],
        )

    # --- one attempt
    def _start(self, attempt: int) -> list[Running]:
        objs = render(self.job, self.plan, attempt)
        config = local_config(objs, self.layout)
        self.layout.config.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        logs = self.layout.logs(attempt)
        logs.mkdir(parents=True, exist_ok=True)
        running = []
        for pod in local_pods(objs, self.layout, self.python, free_port()):
            log = (logs / f"{pod.name}.log").open("wb")
            proc = subprocess.Popen(
                pod.argv,
                env={**os.environ, **pod.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: Ctrl-C reaches us, not it
            )
            running.append(Running(pod, proc, log))
        return running

    def _attempt(self, attempt: int) -> Failure | Result:
        running = self._start(attempt)
        hang = self.policy.hang_timeout_seconds
        last_progress = time.monotonic()
        try:
            while True:
                for rec in self.progress.read_new():
                    last_progress = time.monotonic()
                    self.display.progress(rec)
                    self._maybe_inject(rec, running)
                if self.stop_signal is not None:
                    self._stop(running)
                    self._drain()
                    return self._interrupted()
                for r in running:
                    if r.code is None:
                        r.code = r.proc.poll()
                failed = [r for r in running if r.code not in (None, 0)]
                if failed:
                    self._stop(running)
                    self._drain()
                    return first_failure([self._failure(r) for r in failed]) or self._failure(
                        failed[0]
                    )
                if all(r.code == 0 for r in running):
                    self._drain()
                    return Result("Succeeded", "Completed", f"all {len(running)} pods exited 0", 0)
                if hang and time.monotonic() - last_progress > hang:
                    self._stop(running)
                    return Failure(
                        "Hang", None, running[0].pod.name, None, f"no progress for {hang}s"
                    )
                time.sleep(POLL_SECONDS)
        finally:
            for r in running:
                r.log.close()

    def _drain(self) -> None:
        for rec in self.progress.read_new():
            self.display.progress(rec)

    def _failure(self, r: Running) -> Failure:
        return Failure("Error", r.code, r.pod.name, "localhost", self._log_tail(r))

    @staticmethod
    def _log_tail(r: Running, lines: int = 3) -> str:
        try:
            with open(r.log.name, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            return ""
        tail = [ln for ln in text.splitlines() if ln.strip()][-lines:]
        return " | ".join(tail)[-500:]

    def _maybe_inject(self, rec: dict[str, Any], running: list[Running]) -> None:
        step = rec.get("iteration")
        if not isinstance(step, int):
            return
        for inj in self.injections:
            if not inj.fired and step >= inj.step and fire(inj, [r.proc.pid for r in running]):
                self.display.event(f"injected failure: {inj.describe()} (reached step {step})")

    def _stop(self, running: list[Running]) -> None:
        """SIGTERM every pod's process group, wait up to the grace period, then SIGKILL."""
        live = [r for r in running if r.proc.poll() is None]
        for r in live:
            _killpg(r.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and any(r.proc.poll() is None for r in live):
            for rec in self.progress.read_new():
                self.display.progress(rec)
            time.sleep(POLL_SECONDS)
        for r in running:
            _killpg(r.proc.pid, signal.SIGKILL)  # also reaps helpers left in the group
            r.code = r.proc.wait()

    # --- the record
    def summarize(self, result: Result) -> dict[str, Any]:
        losses = self.progress.losses
        latest = max(losses) if losses else int((self.progress.latest or {}).get("iteration", 0))
        ckpt_dir = self.layout.checkpoints / (self.job.spec.checkpoint.path or self.job.name)
        summary: dict[str, Any] = {
            "status": result.status,
            "restarts": result.restarts,
            "iterations": latest,
            "finalLoss": losses.get(latest),
            "losses": [[i, losses[i]] for i in sorted(losses)],
            "checkpoints": complete_checkpoints(ckpt_dir),
            "reason": result.reason,
            "message": result.message,
            "job": self.job.name,
            "workdir": str(self.layout.workdir),
            "elapsedSeconds": round(time.monotonic() - self.started, 1),
            "checkpointDir": str(ckpt_dir),
            "tensorboardDir": str(ckpt_dir / "tensorboard"),
            "finishedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if plot_losses(
            self.layout.loss_plot, losses, result.restart_iterations, f"{self.job.name} (local)"
        ):
            summary["lossCurve"] = str(self.layout.loss_plot)
        write_summary(self.layout.summary, summary)
        return summary


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
