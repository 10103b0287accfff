"""The ranks' output: copied to the pod's log unchanged, and read line by line on the way.

A trainer.command's ranks write to pipes the launcher holds; one thread per stream copies each
chunk as it comes to the launcher's own stdout or stderr (so `kubectl logs` shows what it always
showed, in the same stream) and hands each complete line to `on_line(local rank, line)`: this is
how Megatron-LM's own `iteration N/ M | ... | lm loss: X |` lines become the job's progress
(forward.py). The lines are the tenant's: a line longer than MAX_LINE is cut for the reader (the
copy is whole), a reader that raises is switched off, and the copy never waits on the reader's
judgement. Stdlib only, Python 3.8+.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    OnLine = Callable[[int, str], None]  # (local rank, line without its newline)

log = logging.getLogger(__name__)

MAX_LINE = 8192  # bytes of a line the reader sees (megatron_contract.megatron_log reads 8192)
CHUNK = 65536


def _write_all(fd: int, data: bytes) -> bool:
    """Write `data` to `fd`; False once the fd is gone (a closed log must not block a rank)."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return False
        view = view[n:]
    return True


class RankOutput:
    """Pumps the stdout and stderr pipes of each rank process it is given."""

    def __init__(self, on_line: OnLine | None = None, out_fd: int = 1, err_fd: int = 2) -> None:
        self.on_line = on_line
        self.targets = (out_fd, err_fd)
        self.threads: list[threading.Thread] = []
        self.broken = False  # the reader raised once: it sees no more lines

    def attach(self, local: int, proc: subprocess.Popen[bytes]) -> None:
        """Start pumping `proc`'s pipes (its stdout and stderr are `subprocess.PIPE`)."""
        for stream, target in ((proc.stdout, self.targets[0]), (proc.stderr, self.targets[1])):
            if stream is None:
                continue
            fd = os.dup(stream.fileno())
            stream.close()  # the thread owns the duplicate; Popen must not read or close it
            thread = threading.Thread(
                target=self._pump, args=(fd, target, local), name=f"rank-{local}-out", daemon=True
            )
            thread.start()
            self.threads = [t for t in self.threads if t.is_alive()] + [thread]

    def join(self, timeout: float = 2.0) -> None:
        """Wait briefly for the pipes of ended ranks to drain (their last lines)."""
        for thread in list(self.threads):
            thread.join(timeout)

    def _pump(self, fd: int, target: int, local: int) -> None:
        partial = b""
        overlong = False  # the current line passed MAX_LINE: the rest of it is not read
        writable = True
        try:
            while True:
                try:
                    chunk = os.read(fd, CHUNK)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                if writable:
                    writable = _write_all(target, chunk)
                if self.on_line is None or self.broken:
                    continue
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                for raw in lines:
                    if not overlong:
                        self._line(local, raw)
                    overlong = False
                if len(partial) > MAX_LINE:
                    if not overlong:
                        self._line(local, partial)
                    partial, overlong = b"", True
        finally:
            if partial and not overlong and not self.broken:
                self._line(local, partial)
            os.close(fd)

    def _line(self, local: int, raw: bytes) -> None:
        assert self.on_line is not None
        try:
            self.on_line(local, raw[:MAX_LINE].decode("utf-8", errors="replace").rstrip("\r"))
        except Exception:  # the tenant's output must never stop the copy
            self.broken = True
            log.exception("reading the ranks' output failed; progress from it is off")
