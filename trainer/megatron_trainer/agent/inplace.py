"""Wiring of the InPlace launcher: the coordinator (node rank 0 only), the agent, the signals.

`run` is what `python -m megatron_trainer` does with `MEGATRON_RESTART_STRATEGY=InPlace`; what
each rank runs comes from the caller (`launcher.py`), as a command and an environment per rank.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from types import FrameType
from typing import TYPE_CHECKING

from megatron_contract.env import RuntimeEnv
from megatron_trainer import early_signals

from .agent import Agent
from .coordinator import Coordinator
from .kubeapi import Api
from .procs import become_subreaper
from .ranks import RankProcesses
from .sources import FileSink, JobWatch, LeaseSink, Sink, Source, StatusFile
from .wire import read_key

if TYPE_CHECKING:
    from .output import RankOutput
    from .ranks import Command, EnvFor, Wrap

COORDINATOR_NODE_RANK = 0  # the pod behind MASTER_ADDR (with spares, the first coordinator)


def say(text: str) -> None:
    """A line of the pod's log, with the time (a restart's steps are seconds apart)."""
    now = datetime.now(timezone.utc).strftime("%H:%M:%S.%f")[:-3]
    print(f"megatron_trainer: {now} {text}", file=sys.stderr, flush=True)


def loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def listen_address(env: RuntimeEnv) -> str:
    """Where the coordinator listens: loopback locally, the pod's own IP in a cluster (not a
    secondary network's interface), every interface only where the pod IP is unknown."""
    if loopback(env.master_addr):
        return env.master_addr
    return env.pod_ip or ""


def usable_key(env: RuntimeEnv) -> str | None:
    """Why the job's coordinator key cannot be used (None: it can)."""
    if env.coordinator_key_file is None:
        return "no coordinator key file is given"
    try:
        read_key(env.coordinator_key_file)
    except (OSError, ValueError) as err:
        return f"the coordinator key cannot be read ({err})"
    return None


def decisions(env: RuntimeEnv) -> tuple[Source | None, Sink | None, str]:
    """Where the coordinator hears the operator, and where it reports; with a description."""
    if env.status_file:
        sink = FileSink(env.report_file) if env.report_file else None
        return StatusFile(env.status_file), sink, f"the status file {env.status_file}"
    api = Api.in_cluster()
    if api is not None and env.job_name and env.pod_namespace and env.progress_lease:
        return (
            JobWatch(api, env.pod_namespace, env.job_name),
            LeaseSink(api, env.pod_namespace, env.progress_lease),
            f"a watch of MegatronJob {env.pod_namespace}/{env.job_name}",
        )
    return None, None, "nothing (no apiserver and no status file)"


class _NoSink:
    def submit(self, report: object) -> None:
        pass

    def close(self) -> None:
        pass


def standby_listener(env: RuntimeEnv) -> socket.socket | None:
    """With spare nodes, every launcher but the first coordinator binds the port where it would
    coordinate were the coordinator lost (bound now, listening only then: a connection before
    that is refused at once). In a pod the coordinator port on the pod's IP; locally a free
    port on loopback (the pods share one address there)."""
    bind = listen_address(env)
    port = 0 if loopback(env.master_addr) else env.coordinator_port
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind, port))
    except OSError as err:
        sock.close()
        say(f"cannot bind the standby coordinator port ({err}): this pod will not coordinate")
        return None
    return sock


def run(
    env: RuntimeEnv,
    command: Command,
    env_for: EnvFor,
    zygote: Sequence[str] | None = None,
    wrap: Wrap | None = None,
    cold: set[int] | None = None,
    output: RankOutput | None = None,
) -> int:
    if env.coordinator_key_file is None:
        raise ValueError("the InPlace launcher needs the job's coordinator key file")
    key = read_key(env.coordinator_key_file)
    become_subreaper()
    fencing = env.spare_nodes > 0
    address = (env.coordinator_addr or env.master_addr, env.coordinator_port)
    coordinators: list[Coordinator] = []
    pod = env.pod_name or f"node-{env.node_rank}"

    def coordinate(
        term: int, listener: socket.socket | None, predecessor: tuple[int, str] | None
    ) -> tuple[str, int]:
        source, sink, where = decisions(env)
        bind = listen_address(env)
        coordinator = Coordinator(
            env.nnodes,
            env.restart_attempt,
            env.master_port,
            bind,
            env.coordinator_port,
            source,
            sink or _NoSink(),
            say,
            key=key,
            spares=env.spare_nodes,
            pod=pod,
            term=term,
            listener=listener,
            predecessor=predecessor,
        )
        coordinator.start()
        coordinators.append(coordinator)
        say(
            f"coordinating {env.nnodes} launcher(s)"
            + (f" and {env.spare_nodes} spare(s), term {term}," if fencing else "")
            + f" on port {coordinator.port}; decisions from {where}"
            + ("" if source else ": a failed rank will end its pod")
        )
        return (bind or "127.0.0.1", coordinator.port)

    standby: socket.socket | None = None
    if env.node_rank == COORDINATOR_NODE_RANK and env.spare is None:
        address = coordinate(0, None, None)
    elif fencing:
        standby = standby_listener(env)
    take_over = None
    if standby is not None:
        held = standby

        def take_over(term: int, predecessor: tuple[int, str] | None) -> tuple[str, int]:
            return coordinate(term, held, predecessor)

    ranks = RankProcesses(env.nproc_per_node, command, env_for, zygote, wrap, cold, output)
    # The zygote imports while this launcher connects and waits for the gang's first start.
    ranks.prepare(env.restart_attempt, env.master_port)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    agent = Agent(
        node=env.node_rank,
        pod=pod,
        nproc=env.nproc_per_node,
        address=address,
        ranks=ranks,
        key=key,
        wake_fd=wake_r,
        say=say,
        fencing=fencing,
        spare=env.spare,
        ip=env.pod_ip,
        standby=standby.getsockname()[1] if standby is not None else None,
        take_over=take_over,
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        agent.request_stop(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    early_signals.replay(stop)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # only to wake the loop
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    try:
        return agent.run()
    finally:
        signal.set_wakeup_fd(-1)
        ranks.close()
        ranks.kill()
        for coordinator in coordinators:
            coordinator.stop()
        if standby is not None and not coordinators:
            standby.close()
