"""The pod's zygote: one process that imports what a built-in rank needs, once, and forks ranks.

A rank of the built-in trainer spends most of its start-up importing torch and Megatron-Core
(seconds of CPU each; most of what a short CPU run costs). Without the zygote every rank of
every attempt imported them, and the in-place launcher kept one more importing process per
local rank ready for the next attempt. With it a pod imports once: the zygote (`python -m
megatron_trainer.worker --zygote REQ REP`) imports, says `ready`, and forks a rank per request,
for this attempt and every later one.

Each rank is fresh: the zygote never opens a process group, touches a device or runs a torch
operation, and the worker checks before it says `ready` that no CUDA driver was initialised and
that it runs one thread, the two things that make a fork unsafe (it says `unsafe REASON`
otherwise, and the launcher starts its ranks the old way, one process each). A rank is forked
twice (zygote → child → rank, the child exiting at once), so that it is re-parented to the
launcher, a child subreaper: the launcher reaps it, signals it and kills it like any other rank,
and the rank dies with the launcher (it sets PR_SET_PDEATHSIG once it is the launcher's).

The wire: one JSON object a line on REQ, {"launcher": PID, "env": {...}} (the rank's whole
environment), answered by the rank's PID on REP. A forked rank's /proc/PID/environ is the
zygote's, so a rank names itself in its command name instead (megatron_contract/procname.py).

Standard library only: the launcher imports this.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

from .procs import _die_with_parent, send

READY_TIMEOUT_SECONDS = 600.0  # the imports, on a loaded machine; a cold rank would wait as long
FORK_TIMEOUT_SECONDS = 30.0
ZYGOTE_FLAG = "--zygote"
# A rank's own per-process variables: the zygote must not hold them, or a tool reading a forked
# rank's /proc/PID/environ would take the zygote's values for the rank's (procname.py).
PER_RANK = ("RANK", "LOCAL_RANK", "MASTER_PORT", "MEGATRON_RESTART_ATTEMPT")


class Zygote:
    """The launcher's handle on its zygote process."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str]) -> None:
        req_r, self.req = os.pipe()
        self.rep, rep_w = os.pipe()
        zygote_env = {k: v for k, v in env.items() if k not in PER_RANK}
        # torch.cuda.is_available() then asks NVML, which leaves the CUDA driver uninitialised
        # (a driver initialised before a fork is unusable in the child).
        zygote_env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [*command, ZYGOTE_FLAG, str(req_r), str(rep_w)],
                env=zygote_env,
                stdin=subprocess.DEVNULL,
                pass_fds=(req_r, rep_w),
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only a pre-resolved prctl
            )
        finally:
            os.close(req_r)
            os.close(rep_w)
        self.buffer = b""
        self.born = time.monotonic()
        self.state = "starting"  # → ready | unsafe | gone
        self.reason = ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def usable(self) -> bool:
        return self.state in ("starting", "ready")

    def _line(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.rep], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.rep, 4096)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode(errors="replace").strip()

    def poll_ready(self) -> bool:
        """Whether `wait_ready` would answer at once: the imports are over (or failed), or the
        zygote is gone. Never waits; past READY_TIMEOUT_SECONDS it is True (the wait then
        gives up as it always did)."""
        if self.state != "starting" or b"\n" in self.buffer or self.rep < 0:
            return True
        if time.monotonic() - self.born > READY_TIMEOUT_SECONDS:
            return True
        ready, _, _ = select.select([self.rep], [], [], 0)
        return bool(ready)

    def wait_ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> bool:
        if self.state == "starting":
            line = self._line(timeout)
            if line == "ready":
                self.state = "ready"
            else:
                text = line or "no answer"
                self.reason = text[len("unsafe ") :] if text.startswith("unsafe ") else text
                self.close("unsafe" if line and line.startswith("unsafe ") else "gone")
        return self.state == "ready"

    def fork(self, env: Mapping[str, str]) -> int | None:
        """A new rank with this environment; its PID, or None (start it another way)."""
        if not self.wait_ready():
            return None
        request = json.dumps({"launcher": os.getpid(), "env": dict(env)}) + "\n"
        try:
            os.write(self.req, request.encode())
        except OSError:
            self.close("gone")
            return None
        line = self._line(FORK_TIMEOUT_SECONDS)
        if line is None or not line.isdigit():
            self.reason = f"no PID for a fork request ({line!r})"
            self.close("gone")
            return None
        return int(line)

    def close(self, state: str = "gone") -> None:
        self.state = state
        if self.proc is not None:
            send(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                self.proc.wait()
            self.proc = None
        for fd in (self.req, self.rep):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.req = self.rep = -1
