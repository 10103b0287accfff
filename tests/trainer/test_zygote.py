"""The pod's zygote (agent/zygote.py, worker.py --zygote) with the real fork path: the worker's
own zygote loop, with its imports and its rank's `main` replaced by stand-ins, under a
RankProcesses in a stand-in launcher process. No torch: these run in about a second each.

Every trainer test that runs a rank also runs the real thing (its ranks are forked)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from megatron_contract.procname import rank_of_comm

# A zygote whose imports are nothing and whose rank sleeps STUB_SLEEP seconds, writes what it
# sees to STUB_OUT (its ppid, its command name, its RANK, that it has no stdin) and exits with
# STUB_EXIT. UNSAFE, if set, is what fork_unsafe() answers.
ZYGOTE = textwrap.dedent(
    """
    import json, os, sys, time
    import megatron_trainer.worker as w
    w._import_everything = lambda: None
    if os.environ.get("UNSAFE"):
        w.fork_unsafe = lambda: os.environ["UNSAFE"]
    def main():
        time.sleep(float(os.environ.get("STUB_SLEEP", "0")))
        with open(os.environ["STUB_OUT"], "a") as out:
            out.write(json.dumps({
                "pid": os.getpid(), "ppid": os.getppid(), "rank": os.environ.get("RANK"),
                "comm": open("/proc/self/comm").read().strip(),
                "stdin": os.readlink("/proc/self/fd/0"),
            }) + "\\n")
        return int(os.environ.get("STUB_EXIT", "0"))
    w.main = main
    w._exit(w.zygote(int(sys.argv[-2]), int(sys.argv[-1])))
    """
)

# The launcher: a RankProcesses with that zygote (or a plain stand-in rank when the zygote cannot
# fork), as agent/inplace.py makes it; it starts one attempt and prints what it reaped.
LAUNCHER = textwrap.dedent(
    """
    import json, os, sys, time
    from megatron_trainer.agent.procs import become_subreaper
    from megatron_trainer.agent.ranks import RankProcesses
    become_subreaper()
    nproc, exits = int(sys.argv[1]), json.loads(sys.argv[2])
    cold = [sys.executable, "-c", "import sys; sys.exit(7)"]
    def env_for(local, attempt, port):
        env = dict(os.environ, RANK=str(10 + local), STUB_EXIT=str(exits[local]))
        return env
    ranks = RankProcesses(nproc, cold, env_for, zygote=[sys.executable, "-c", os.environ["ZYGOTE"]])
    ranks.start(0, 1)
    print(json.dumps({"warm": ranks.warm, "zygote": ranks.zygote and ranks.zygote.pid}), flush=True)
    ended = []
    while len(ended) < nproc:
        ended += ranks.reap()
        time.sleep(0.01)
    print(json.dumps(sorted(ended)), flush=True)
    ranks.close()
    """
)


def launcher(tmp_path: Path, nproc: int, exits: list[int], **env: str) -> subprocess.Popen[str]:
    full = dict(os.environ, ZYGOTE=ZYGOTE, STUB_OUT=str(tmp_path / "out.jsonl"), **env)
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(nproc), json.dumps(exits)],
        env=full,
        stdout=subprocess.PIPE,
        text=True,
    )


def records(tmp_path: Path) -> list[dict[str, object]]:
    path = tmp_path / "out.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_forked_ranks_are_the_launchers_children_named_by_rank(tmp_path: Path) -> None:
    proc = launcher(tmp_path, 2, [0, 3])
    out, _ = proc.communicate(timeout=60)
    first, ended = (json.loads(line) for line in out.splitlines())
    assert first["warm"] == 2  # both ranks forked, none started on its own
    assert ended == [[0, 0], [1, 3]]  # the launcher reaped both, with their exit codes
    seen = {r["rank"]: r for r in records(tmp_path)}
    assert set(seen) == {"10", "11"}  # each with its own environment
    for rank, r in seen.items():
        assert r["ppid"] == proc.pid  # re-parented to the launcher, not the zygote
        assert rank_of_comm(str(r["comm"])) == int(rank)
        assert r["stdin"] == "/dev/null"


def test_a_rank_that_ends_before_its_pid_is_known_is_still_reported(tmp_path: Path) -> None:
    # STUB_SLEEP 0: the ranks exit at once, often before the zygote's answer is read.
    for _ in range(5):
        proc = launcher(tmp_path, 4, [0, 1, 2, 3], STUB_SLEEP="0")
        out, _ = proc.communicate(timeout=60)
        assert json.loads(out.splitlines()[1]) == [[0, 0], [1, 1], [2, 2], [3, 3]]


def test_an_unsafe_zygote_leaves_the_ranks_to_start_on_their_own(tmp_path: Path) -> None:
    proc = launcher(tmp_path, 2, [0, 0], UNSAFE="the imports initialised the CUDA driver")
    out, _ = proc.communicate(timeout=60)
    first, ended = (json.loads(line) for line in out.splitlines())
    assert first == {"warm": 0, "zygote": None}
    assert ended == [[0, 7], [1, 7]]  # the cold command ran instead
    assert records(tmp_path) == []


def test_forked_ranks_and_the_zygote_die_with_the_launcher(tmp_path: Path) -> None:
    proc = launcher(tmp_path, 2, [0, 0], STUB_SLEEP="60")
    assert proc.stdout is not None
    zygote = json.loads(proc.stdout.readline())["zygote"]
    ranks = [p for p in map(int, filter(str.isdigit, os.listdir("/proc"))) if _ppid(p) == proc.pid]
    assert zygote in ranks and len(ranks) == 3  # the zygote and two ranks, all the launcher's
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    proc.stdout.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(map(_alive, ranks)):
        time.sleep(0.05)
    assert not any(map(_alive, ranks))


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("threads", [0, 2])
def test_fork_unsafe_reads_the_process(threads: int) -> None:
    code = (
        "import threading; from megatron_trainer.worker import fork_unsafe; "
        f"e = threading.Event(); [threading.Thread(target=e.wait, daemon=True).start() for _ in range({threads})]; "
        "print(fork_unsafe())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (f"the imports started {threads} thread(s)" if threads else "")
