"""A launcher with stand-in ranks, for tests/trainer/test_inplace_agent.py.

`python inplace_stub.py launcher DIR` runs the real InPlace launcher path (`agent.inplace.run`:
the coordinator on node rank 0, the agent, real rank processes, real signals) with the contract
env, but each rank runs `python inplace_stub.py rank DIR` instead of the trainer: it appends
what it was started with to DIR/ranks.jsonl, then sleeps until DIR/exit-<attempt>-<rank> holds
an exit code.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def rank(workdir: Path) -> int:
    r, attempt = os.environ["RANK"], os.environ["MEGATRON_RESTART_ATTEMPT"]
    record = {
        "rank": int(r),
        "attempt": int(attempt),
        "port": int(os.environ["MASTER_PORT"]),
        "pid": os.getpid(),
        "time": time.time(),
        "pod": os.environ.get("POD_NAME"),
        "master": os.environ.get("MASTER_ADDR"),
    }
    with open(workdir / "ranks.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    control = workdir / f"exit-{attempt}-{r}"
    while not control.exists():
        time.sleep(0.02)
    time.sleep(0.02)  # let the writer finish
    return int(control.read_text().strip() or "0")


def launcher(workdir: Path) -> int:
    from megatron_contract.env import runtime_env
    from megatron_trainer.agent import agent, inplace

    grace = os.environ.get("STUB_RECONNECT_GRACE")
    if grace:
        agent.RECONNECT_GRACE_SECONDS = float(grace)
    timeout = os.environ.get("STUB_DECISION_TIMEOUT")
    if timeout:
        agent.DECISION_TIMEOUT_SECONDS = float(timeout)
    env = runtime_env(os.environ)
    command = [sys.executable, __file__, "rank", str(workdir)]

    def env_for(local: int, attempt: int, port: int) -> dict[str, str]:
        return {
            **os.environ,
            "RANK": str(env.global_rank(local)),
            "LOCAL_RANK": str(local),
            "MEGATRON_RESTART_ATTEMPT": str(attempt),
            "MASTER_PORT": str(port),
        }

    return inplace.run(env, command, env_for)


if __name__ == "__main__":
    what, directory = sys.argv[1], Path(sys.argv[2])
    sys.exit(rank(directory) if what == "rank" else launcher(directory))
