"""`python -m megatron_trainer`: validate, then start and supervise NPROC_PER_NODE local ranks.

Why our own launcher and not torchrun's elastic agent: restarts belong to the operator, which
decides every restart with its failure rules, budget and backoff. The elastic agent would restart
ranks inside the pod on its own count and hide failures from it. What a pod needs instead:
  - validate the config before any rank imports torch, so a bad job exits 78 in milliseconds;
  - when one local rank fails, kill the others at once (they would otherwise block in a
    collective until a timeout);
  - then, with `restartPolicy.strategy: InPlace` (agent/), keep the pod, report the failure and
    run the next attempt's ranks when the operator says so; with Recreate, exit with the failed
    rank's code so the pod fails fast;
  - forward SIGTERM to every rank, so they agree on one iteration, checkpoint it and exit 143;
  - leave no process behind: ranks die with the launcher (PR_SET_PDEATHSIG), and the launcher is a
    child subreaper, so it also kills orphaned checkpoint-writer processes of a killed rank.
What runs per rank (`rank_env`, the command) is kept apart from how ranks are supervised
(`Supervisor` for Recreate, `agent.Agent` for InPlace). Stdlib only: no torch import here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from megatron_contract import env as contract_env
from megatron_contract.choices import PROGRESS_MEGATRON_LOG, PROGRESS_NONE
from megatron_contract.config import (
    LaunchConfig,
    is_msc_url,
    parse_config,
    parse_launch_config,
    read_config,
)
from megatron_contract.env import (
    MASTER_PORT,
    RESTART_ATTEMPT,
    RuntimeEnv,
    runtime_env,
    usable_cores,
)
from megatron_contract.errors import ConfigError
from megatron_contract.exitcodes import ExitCode
from megatron_contract.expansion import expand_all
from megatron_contract.ladder import IN_PLACE
from megatron_contract.paths import TERMINATION_LOG, TERMINATION_MESSAGE_MAX

from . import early_signals, profilers
from .agent.output import RankOutput
from .agent.procs import (
    _PR_SET_CHILD_SUBREAPER,
    _die_with_parent,
    descendants,
    exit_code,
    prctl,
    send,
    wait_code,
)
from .agent.ranks import Forked
from .agent.zygote import Zygote
from .decisions import CUDA_DEVICE_MAX_CONNECTIONS, cuda_env_defaults
from .forward import Forwarder, LogProgress, Steps, progress_log_path, save_dir_of
from .profilers import nsys
from .progress import LeaseWriter, ProgressReporter
from .storage import profiles_dir, scratch_dir
from .validate import validate, validate_launch

# A rank's argv from its env: the built-in worker's is fixed, a trainer.command's is expanded.
if TYPE_CHECKING:  # for annotations only: `X[...]` of a builtin needs 3.9 at run time
    RankCommand = Callable[[Mapping[str, str]], list[str]]

__all__ = ["exit_code", "main", "rank_env"]

# After SIGTERM, ranks normally exit together once their checkpoint is written. If some rank
# finished (143) and another has not after this long, it is stuck: kill it.
STRAGGLER_SECONDS = 120.0


def rank_env(
    environ: Mapping[str, str],
    env: RuntimeEnv,
    local_rank: int,
    cpu: bool,
    parallel: tuple[int, int, bool] = (1, 1, False),
) -> dict[str, str]:
    """The environment of one local rank. `parallel` is (tensor size, context size, whether
    Megatron FSDP is on)."""
    e = contract_env
    child = dict(environ)
    child.update(
        {
            e.RANK: str(env.global_rank(local_rank)),
            e.LOCAL_RANK: str(local_rank),
            e.LOCAL_WORLD_SIZE: str(env.nproc_per_node),
            e.GROUP_RANK: str(env.node_rank),
            "PYTHONUNBUFFERED": "1",
            e.LAUNCHER_PID: str(os.getpid()),
        }
    )
    tensor, context, fsdp = parallel
    defaults = cuda_env_defaults(tensor, context, usable_cores(), env.nproc_per_node, fsdp)
    if cpu:
        defaults.pop(CUDA_DEVICE_MAX_CONNECTIONS, None)
    for name, value in defaults.items():
        # The pod's own env (spec.env) wins: these are defaults, as in Megatron-LM's scripts.
        child.setdefault(name, value)
    return child


class Supervisor:
    def __init__(
        self,
        env: RuntimeEnv,
        cpu: bool,
        command: Sequence[str] | RankCommand,
        parallel: tuple[int, int, bool] = (1, 1, False),
        wrap: Callable[[int, list[str]], list[str]] | None = None,
        zygote: Sequence[str] | None = None,
        output: RankOutput | None = None,
    ) -> None:
        self.output = output  # a trainer.command's output, read on its way to the log
        self.env = env
        self.cpu = cpu
        self.parallel = parallel
        self.command = command
        self.wrap = wrap  # a global rank's command, e.g. under nsys (profiling)
        self.zygote_command = zygote  # the built-in worker's: its ranks are forked (zygote.py)
        self.zygote: Zygote | None = None
        self.ranks: dict[int, subprocess.Popen[bytes] | Forked] = {}
        self.codes: dict[int, int] = {}
        self.first_failure: int | None = None
        self.terminating = False
        self.stopped: set[int] = set()  # the ranks sent SIGTERM

    def start(self) -> None:
        prctl(_PR_SET_CHILD_SUBREAPER, 1)
        # Before the first rank: a stop that comes while they start must reach them all, not
        # end this process by the default action with its ranks still running.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)
        early_signals.replay(self._forward)
        for local_rank in range(self.env.nproc_per_node):
            env = rank_env(os.environ, self.env, local_rank, self.cpu, self.parallel)
            plain = self.argv(env)
            command = plain
            if self.wrap is not None:
                command = self.wrap(self.env.global_rank(local_rank), plain)
            if self.zygote_command is not None and command == plain:
                if self.zygote is None:
                    self.zygote = Zygote(self.zygote_command, env)
                pid = self.zygote.fork(env) if self.zygote.usable else None
                if pid is not None:
                    self.ranks[pid] = Forked(pid)
                    continue
            proc = subprocess.Popen(
                command,
                env=env,
                # Only a pre-resolved prctl runs between fork and exec: no lock is taken there
                # (threads exist already when the output readers or the Lease writer run).
                preexec_fn=_die_with_parent,  # noqa: PLW1509
                stdout=subprocess.PIPE if self.output is not None else None,
                stderr=subprocess.PIPE if self.output is not None else None,
            )
            if self.output is not None:
                self.output.attach(local_rank, proc)
            self.ranks[proc.pid] = proc
        if self.terminating:  # the ranks started after the stop get it too
            self._forward(signal.SIGTERM, None)

    def argv(self, env: Mapping[str, str]) -> list[str]:
        return self.command(env) if callable(self.command) else list(self.command)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        self.terminating = True
        for pid in list(self.ranks):
            if pid not in self.codes and pid not in self.stopped:
                self.stopped.add(pid)  # once each: a second SIGTERM could cut a rank's save short
                send(pid, signal.SIGTERM)

    def wait(self) -> int:
        straggler_deadline: float | None = None
        while len(self.codes) < len(self.ranks):
            pid, status = self._reap(straggler_deadline)
            if pid == 0:  # deadline passed: the rest are stuck
                print(
                    "megatron_trainer: ranks did not exit after SIGTERM; killing them",
                    file=sys.stderr,
                )
                self._kill_all()
                continue
            if pid not in self.ranks:
                continue  # an orphan we adopted as subreaper
            code = wait_code(status)
            self.codes[pid] = code
            local = list(self.ranks).index(pid)
            if code not in (ExitCode.OK, ExitCode.SIGTERM) and self.first_failure is None:
                self.first_failure = code
                print(
                    f"megatron_trainer: local rank {local} exited with {code}; stopping the others",
                    file=sys.stderr,
                    flush=True,
                )
                self._kill_all()
            elif code == ExitCode.SIGTERM and straggler_deadline is None:
                straggler_deadline = time.monotonic() + STRAGGLER_SECONDS
        self._kill_all()  # leftovers such as checkpoint writers of a killed rank
        if self.zygote is not None:
            self.zygote.close()
        if self.first_failure is not None:
            return self.first_failure
        nonzero = [c for c in self.codes.values() if c != ExitCode.OK]
        return nonzero[0] if nonzero else ExitCode.OK

    def _reap(self, deadline: float | None) -> tuple[int, int]:
        while True:
            if deadline is None:
                return os.waitpid(-1, 0)
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid:
                return pid, status
            if time.monotonic() > deadline:
                return 0, 0
            time.sleep(0.05)

    def _kill_all(self) -> None:
        """SIGKILL every live descendant: ranks, their helpers, and adopted orphans."""
        for pid in descendants(os.getpid()):
            send(pid, signal.SIGKILL)


def write_termination_message(text: str, path: str = TERMINATION_LOG) -> bool:
    """Say why the pod stops: the kubelet copies this file into the container's terminated
    state, and the operator puts it in status.lastFailure. Only where the kubelet made the file
    (not under `mjob run --local`); a failure to write is not an error, since the log's tail is
    the fallback (FallbackToLogsOnError)."""
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[-TERMINATION_MESSAGE_MAX:])
    except OSError:
        return False
    return True


def _check_writable(directory: str) -> None:
    """Checkpoints, TensorBoard and data caches go here: fail now, not after minutes of start-up."""
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(
            [
                f"checkpoint.dir: cannot write to {directory} ({err.strerror}); mount a writable "
                "volume there (ReadWriteMany when the job has several pods)"
            ]
        ) from err


class NsysCaptures:
    """Megatron Bridge's nsys profiling: exactly the listed ranks run under `nsys profile` with
    the cudaProfilerApi capture range (the trainer opens and closes it at startStep/endStep), as
    plain processes, one report a rank in <checkpoint dir>/profiles/<attempt>/. nsys writes to a
    file, so with checkpoints on object storage it writes to local scratch and the launcher
    uploads each report once its rank has exited."""

    def __init__(self, config: LaunchConfig, attempt: int) -> None:
        prof = config.profiling
        self.ranks = set(prof.ranks) if prof is not None and prof.tool == nsys.NSYS else set()
        self.target_dir = profiles_dir(config.checkpoint.dir, attempt)
        self.remote = is_msc_url(config.checkpoint.dir)
        self.reports: dict[str, str] = {}  # local report -> its place in storage (object storage)

    def wrap(self, rank: int, command: list[str]) -> list[str]:
        if rank not in self.ranks:
            return command
        name = profilers.capture_name(rank, nsys.SUFFIX).removesuffix("." + nsys.SUFFIX)
        if self.remote:
            base = os.path.join(scratch_dir("profiles"), name)
            self.reports[f"{base}.{nsys.SUFFIX}"] = f"{self.target_dir}/{name}.{nsys.SUFFIX}"
        else:
            os.makedirs(self.target_dir, exist_ok=True)
            base = os.path.join(self.target_dir, name)
        return nsys.command(base, command)

    def upload(self) -> None:
        for local, target in self.reports.items():
            if os.path.exists(local):
                subprocess.run(
                    [sys.executable, "-m", "megatron_trainer.storage", "upload", local, target],
                    check=False,
                )


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:  # the launcher zipapp (megatron_operator/zipapp.py) carries the version it was built at
        from ._build import VERSION  # type: ignore[import-not-found]

        return str(VERSION)
    except ImportError:
        pass
    try:
        return package_version("megatron-operator")
    except PackageNotFoundError:  # a source tree without an install
        return "unknown"


def _run_in_place(
    env: RuntimeEnv,
    config: LaunchConfig,
    command: Sequence[str] | RankCommand,
    cpu: bool,
    parallel: tuple[int, int, bool],
    reading: Reading | None = None,
) -> int:
    """`restartPolicy.strategy: InPlace`: the pod outlives its ranks' attempts (agent/). The
    built-in worker's ranks are forked by the pod's zygote; a trainer.command's are its own
    processes, whose output `reading` reads."""
    from .agent import inplace

    captures: dict[int, NsysCaptures] = {}  # nsys reports go to profiles/<attempt>/

    def env_for(local_rank: int, attempt: int, port: int) -> dict[str, str]:
        if reading is not None:
            reading.steps.restart(attempt)  # the progress of this attempt starts over
        child = rank_env(os.environ, env, local_rank, cpu, parallel)
        child[RESTART_ATTEMPT] = str(attempt)  # the attempt the coordinator started
        child[MASTER_PORT] = str(port)  # a fresh rendezvous port each attempt
        return child

    def wrap(local_rank: int, attempt: int, argv: list[str]) -> list[str]:
        capture = captures.setdefault(attempt, NsysCaptures(config, attempt))
        return capture.wrap(env.global_rank(local_rank), argv)

    profiled = {
        local
        for local in range(env.nproc_per_node)
        if env.global_rank(local) in NsysCaptures(config, env.restart_attempt).ranks
    }
    # The built-in worker's ranks are forked by the pod's zygote (agent/zygote.py), which has
    # imported torch and Megatron-Core once; a rank under nsys cannot be (nsys must start it).
    zygote = None if callable(command) else command
    output = reading.output if reading is not None else None
    code = inplace.run(env, command, env_for, zygote, wrap, profiled, output)
    for capture in captures.values():
        capture.upload()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the container command. Returns the pod's exit code. The job comes from the
    environment (docs/contract.md); the only argument is --version."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:
        print(f"megatron_trainer {version()}")
        return ExitCode.OK
    if args:
        print(
            f"megatron_trainer: unexpected arguments {args}: the job is read from the "
            "environment (MEGATRON_CONFIG and the contract env); the only option is --version",
            file=sys.stderr,
        )
        return ExitCode.CONFIG
    try:
        env = runtime_env(os.environ)
        config = check(env)
    except ConfigError as err:
        print(f"megatron_trainer: {err}", file=sys.stderr, flush=True)
        write_termination_message(str(err))
        return ExitCode.CONFIG
    what = f"of {' '.join(config.trainer.command)}" if config.trainer else "on " + config.platform
    print(
        f"megatron_trainer: job {config.job.name} node {env.node_rank}/{env.nnodes}: starting "
        f"{env.nproc_per_node} rank(s) {what} (world size {env.world_size}, "
        f"restart attempt {env.restart_attempt}, restart strategy {env.restart_strategy})",
        file=sys.stderr,
        flush=True,
    )
    cpu = config.platform == "cpu"
    p = config.parallelism
    parallel = (p.tensor, p.context, p.fsdp)
    command = rank_command(config)
    in_place = env.restart_strategy == IN_PLACE
    if in_place:
        from .agent import inplace

        problem = inplace.usable_key(env)
        if problem is not None:
            # Only the job's pods hold the key; without it no coordinator may listen, so this
            # pod runs as with Recreate (a failed rank fails the pod), as every pod of the gang.
            print(
                f"megatron_trainer: restart strategy InPlace, but {problem}: running without "
                "in-place restarts (a failed rank ends the pod)",
                file=sys.stderr,
                flush=True,
            )
            in_place = False
    if not in_place and env.spare is not None:
        return _idle_spare(env)
    reading = read_progress(config, env, cpu, parallel) if config.trainer is not None else None
    try:
        if in_place:
            return _run_in_place(env, config, command, cpu, parallel, reading)
        # Recreate and ReplacePod: the ranks run once; a failure fails the pod.
        captures = NsysCaptures(config, env.restart_attempt)
        zygote = None if callable(command) else command
        supervisor = Supervisor(
            env,
            cpu,
            command,
            parallel,
            wrap=captures.wrap,
            zygote=zygote,
            output=reading.output if reading is not None else None,
        )
        supervisor.start()
        if reading is not None:
            reading.start()
        code = supervisor.wait()
        captures.upload()
        return code
    finally:
        if reading is not None:
            reading.close()


def _idle_spare(env: RuntimeEnv) -> int:
    """A spare pod that cannot restart in place (no usable coordinator key) can never be given
    a rank: it holds its place, running nothing, until it is stopped."""
    print(
        f"megatron_trainer: spare {env.spare} cannot run ranks in place here: idle until stopped",
        file=sys.stderr,
        flush=True,
    )
    stopped: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopped.append(signum))
    early_signals.replay(lambda signum, frame: stopped.append(signum))
    while not stopped:
        signal.pause()
    return int(ExitCode.SIGTERM)


def check(env: RuntimeEnv) -> LaunchConfig:
    """Everything checkable before a rank starts: the config against the env, the layout rules,
    the checkpoint directory, and a trainer.command's executable. Raises ConfigError."""
    data = read_config(env.config_path)
    config = parse_launch_config(data)
    if config.trainer is None:
        validate(parse_config(data), env)  # the built-in trainer: every section, every path
    else:
        validate_launch(config, env)
        _check_executable(rank_command(config), env)
    if not is_msc_url(config.checkpoint.dir):  # object storage: MSC reports its own errors
        _check_writable(config.checkpoint.dir)
    return config


def rank_command(config: LaunchConfig) -> Sequence[str] | RankCommand:
    """The built-in worker, or spec.trainer.command with its args, $(VAR) expanded per rank."""
    if config.trainer is None:
        return [sys.executable, "-m", "megatron_trainer.worker"]
    argv = (*config.trainer.command, *config.trainer.args)
    return lambda rank_env: expand_all(argv, rank_env)


def _check_executable(command: Sequence[str] | RankCommand, env: RuntimeEnv) -> None:
    argv = command(rank_env(os.environ, env, 0, True)) if callable(command) else list(command)
    program = argv[0]
    found = os.access(program, os.X_OK) if "/" in program else shutil.which(program) is not None
    if not found:
        raise ConfigError(
            [
                f"trainer.command: {program!r} is not an executable in this image (PATH "
                f"{os.environ.get('PATH', '')!r}, working directory {os.getcwd()!r})"
            ]
        )


def set_progress_log(config: LaunchConfig) -> str | None:
    """For a trainer.command: the file every rank gets as MEGATRON_PROGRESS_LOG (rank_env copies
    the launcher's env). None for the built-in trainer, which reports its own progress."""
    if config.trainer is None:
        return None
    path = progress_log_path()
    os.environ[contract_env.PROGRESS_LOG] = path
    return path


class Reading:
    """A trainer.command's progress sources in this pod (forward.py): the progress file on node
    0 (rank 0 appends to it), Megatron-LM's log lines in the pod that holds the last rank (which
    prints them), every rank's output copied to the pod's log (agent/output.py)."""

    def __init__(
        self,
        steps: Steps,
        output: RankOutput,
        forwarder: Forwarder | None,
        logs: LogProgress | None,
    ) -> None:
        self.steps, self.output, self.forwarder, self.logs = steps, output, forwarder, logs
        self.started = False

    def start(self) -> None:
        if self.forwarder is not None and not self.started:
            self.forwarder.start()
        self.started = True

    def close(self) -> None:
        self.output.join()
        if self.forwarder is not None:
            self.forwarder.close()
        self.steps.close()


def read_progress(
    config: LaunchConfig, env: RuntimeEnv, cpu: bool, parallel: tuple[int, int, bool]
) -> Reading:
    """The progress sources of a trainer.command job, as `trainer.progress` names them."""
    assert config.trainer is not None
    source = config.trainer.progress
    path = set_progress_log(config)
    lease = None
    if env.progress_lease and source != PROGRESS_NONE:
        lease = LeaseWriter.in_cluster(
            env.pod_namespace, env.pod_name, env.progress_lease, config.progress.annotation
        )
    reporter = ProgressReporter(
        True, env.progress_file, lease, config.progress.min_interval_seconds, env.restart_attempt
    )
    steps = Steps(reporter)
    forwarder = None
    if path is not None and env.node_rank == 0 and source != PROGRESS_NONE:
        forwarder = Forwarder(path, steps)
    logs = None
    last = env.world_size - 1  # Megatron-LM prints its training log on the last rank only
    if source == PROGRESS_MEGATRON_LOG and last // env.nproc_per_node == env.node_rank:
        local = last % env.nproc_per_node
        argv = rank_command(config)
        if callable(argv):
            argv = argv(rank_env(os.environ, env, local, cpu, parallel))
        logs = LogProgress(steps, local, save_dir_of(list(argv)))
    output = RankOutput(logs.line if logs is not None else None)
    reading = Reading(steps, output, forwarder, logs)
    if forwarder is not None:
        reading.start()  # a thread: InPlace starts its ranks after it, as it does anyway
    return reading
