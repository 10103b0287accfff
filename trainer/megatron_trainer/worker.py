"""One rank: `python -m megatron_trainer.worker`, started by the launcher with LOCAL_RANK set.

Top-level imports are stdlib only on purpose. Megatron-Core's checkpoint writer starts a
spawn-context multiprocessing Manager, which re-imports this module as `__mp_main__`; heavy
imports here would cost that helper process seconds of start-up (and without the __main__
guard it would start training again).

`--zygote REQ REP`: the pod's zygote (agent/zygote.py). It imports torch and Megatron-Core once
(seconds, the bulk of a rank's start-up) and forks the pod's ranks, for every attempt, on the
launcher's requests. It opens no process group, touches no device and runs no torch operation:
every rank it forks starts as fresh as one started on its own.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import time
import traceback
import warnings

from megatron_contract.config import load_config
from megatron_contract.env import runtime_env
from megatron_contract.errors import ConfigError
from megatron_contract.exitcodes import ExitCode
from megatron_contract.procname import rank_comm

from .forksafe import fork_unsafe
from .numerics import NonFiniteLoss
from .signals import StopFlag

# When this rank's process began, for the goodput ledger: its start, or its fork by the zygote.
BEGAN = [time.time()]


def _quiet_warnings() -> None:
    # Expected on the CPU platform and without TE; not actionable, so not shown.
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
    warnings.filterwarnings("ignore", message=".*Apex is not installed.*")


def _configure_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    # Megatron-Core logs its whole config at INFO; keep its warnings and errors.
    logging.getLogger("megatron").setLevel(logging.WARNING)
    _quiet_warnings()


def _import_everything() -> None:
    from .imports import import_megatron_core

    import_megatron_core()
    from . import loop  # noqa: F401


def zygote(req_fd: int, rep_fd: int) -> int:
    """The pod's zygote (agent/zygote.py): import once, then fork a rank per request."""
    _quiet_warnings()
    _import_everything()
    reason = fork_unsafe()
    os.write(rep_fd, (f"unsafe {reason}\n" if reason else "ready\n").encode())
    if reason:
        return 0
    with os.fdopen(req_fd, "rb") as requests:
        for line in requests:
            request = json.loads(line)
            child = os.fork()
            if child == 0:
                try:
                    rank = os.fork()
                    if rank == 0:
                        _become_rank(request, requests.fileno(), rep_fd)
                    os.write(rep_fd, f"{rank}\n".encode())
                finally:
                    os._exit(0)
            os.waitpid(child, 0)
    return 0


def _become_rank(request: dict[str, object], *fds: int) -> None:
    """In a forked rank: become the launcher's child, take the rank's environment, train."""
    import ctypes
    import signal

    BEGAN[0] = time.time()  # the attempt's rank starts now: the zygote's imports were not its time
    for fd in fds:
        os.close(fd)
    launcher = int(str(request["launcher"]))
    env = {str(k): str(v) for k, v in dict(request["env"]).items()}  # type: ignore[call-overload]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, rank_comm(env.get("RANK", "")).encode(), 0, 0, 0)  # PR_SET_NAME
    # The child between us and the zygote exits at once; the launcher, a child subreaper, then
    # adopts this process. Only then may it ask to die with its parent (asked earlier, it would
    # die with the child).
    deadline = time.monotonic() + 10
    while os.getppid() != launcher:
        if time.monotonic() > deadline:
            os._exit(CRASH)
        time.sleep(0.0005)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != launcher:  # the launcher died in between
        os._exit(CRASH)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(env)  # OMP_NUM_THREADS included: platform.setup_platform applies it
    _exit(main())


def main() -> int:
    stop = StopFlag()
    stop.install()  # before the slow imports: a SIGTERM during start-up must not be lost
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    try:
        env = runtime_env(os.environ)
        rank = env.global_rank(local_rank)
        _configure_logging(rank)
        config = load_config(env.config_path)
        # torch and Megatron-Core take seconds to import: only in ranks, and as fast as we can.
        _import_everything()
        from .loop import Trainer

        return Trainer(config, env, local_rank, stop, began=BEGAN[0]).run()
    except ConfigError as err:
        _abort_writers()
        print(f"megatron_trainer: {err}", file=sys.stderr, flush=True)
        return ExitCode.CONFIG
    except NonFiniteLoss as err:
        _abort_writers()
        print(
            f"megatron_trainer: rank {local_rank}: {err}; exiting with {int(ExitCode.NON_FINITE)}",
            file=sys.stderr,
            flush=True,
        )
        return ExitCode.NON_FINITE
    except Exception:
        # Any other error (OOM, NCCL, a bug): the traceback, then exit 1 (a counted restart).
        _abort_writers()
        traceback.print_exc()
        return CRASH


CRASH = 1  # an uncaught exception, as Python's own exit status for one


def _abort_writers() -> None:
    """Kill any async checkpoint writer this process started (Trainer.run does so for errors
    raised while training; this covers the rest). Without it, multiprocessing's exit handler
    would wait for the writer forever."""
    module = sys.modules.get("megatron_trainer.async_save")
    if module is not None:
        module.abort_all()


def _exit(code: int) -> None:
    """Exit without the interpreter's teardown, which took seconds in torch's C++ destructors
    (gloo, the TCP store) after all our state was safely on disk; atexit handlers still run
    (multiprocessing's, which stop the checkpoint writer's helper processes)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--zygote"]:
        _exit(zygote(int(sys.argv[2]), int(sys.argv[3])))
    _exit(main())
