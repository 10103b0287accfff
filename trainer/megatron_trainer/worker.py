"""One rank: `python -m megatron_trainer.worker`, started by the launcher with LOCAL_RANK set.

Top-level imports are stdlib only on purpose. Megatron-Core's checkpoint writer starts a
spawn-context multiprocessing Manager, which re-imports this module as `__mp_main__`; heavy
imports here would cost that helper process seconds of start-up (and without the __main__
guard it would start training again).

`--standby`: the launcher (InPlace) keeps one such process per local rank ready for the next
attempt. It imports torch and Megatron-Core (seconds, the bulk of a rank's start-up) and waits;
the launcher releases it with one line of JSON on stdin, the variables that differ for the
attempt it then runs (its MEGATRON_RESTART_ATTEMPT and MASTER_PORT). It has opened no process
group and touched no device before that: the attempt still gets fresh ranks.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import sys
import time
import traceback
import warnings

from megatron_contract.config import load_config
from megatron_contract.env import runtime_env
from megatron_contract.errors import ConfigError
from megatron_contract.exitcodes import ExitCode

from .numerics import NonFiniteLoss
from .signals import StopFlag

# A standby waits this long before importing, so that a just-started attempt's ranks have the
# CPU to themselves while they set up; released earlier, it imports then, as a rank would.
STANDBY_DELAY_SECONDS = 10.0
# When this rank's process began, for the goodput ledger: its start, or a standby's release.
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


def standby(delay: float = STANDBY_DELAY_SECONDS) -> bool:
    """Import, then wait for the launcher's release (True) or for it to let go (False)."""
    _quiet_warnings()
    ready, _, _ = select.select([sys.stdin], [], [], delay)
    if not ready:
        _import_everything()
    line = sys.stdin.readline()
    if not line.strip():
        return False  # the launcher closed the pipe: not needed
    changes = json.loads(line)
    BEGAN[0] = time.time()  # the attempt's rank starts now: the import before was not its time
    os.environ.update({str(k): str(v) for k, v in changes.items()})
    # Released: stdin no longer the launcher's pipe, which is how a process that looks for this
    # rank (`mjob run --inject-failure`) tells it from a standby still waiting.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return True


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
    if sys.argv[1:] == ["--standby"] and not standby():
        _exit(0)
    _exit(main())
