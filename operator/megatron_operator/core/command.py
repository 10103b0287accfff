"""Checks of a trainer.command and its arguments (pure): what Kubernetes and the launcher would
do with them, said before a pod starts.

- `$(NAME)` expands from the rank's env (megatron_contract.expansion): a name nobody sets stays
  `$(NAME)` as written, as Kubernetes leaves it, so the program gets the literal text. Refused,
  naming the variables that exist (unless the template's trainer container takes env from a
  ConfigMap or Secret with envFrom, whose names cannot be known here: then a warning).
- `${NAME}` and `$NAME` are shell syntax: nothing expands them (no shell runs the command).
- `torchrun` or `python -m torch.distributed.run` is a launcher inside the launcher: each rank
  would start its own ranks, with a world size the rendezvous does not know.
- `trainer.progress: None`: no hang rule and no NoProgress alert.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from megatron_contract import env as contract_env
from megatron_operator.api import FieldError, MegatronJobSpec

# What every rank's env holds: the pod's contract env, the launcher's per-rank names, and what
# the launcher sets for a trainer.command.
CONTRACT_NAMES = frozenset(
    {
        contract_env.MASTER_ADDR,
        contract_env.MASTER_PORT,
        contract_env.WORLD_SIZE,
        contract_env.NNODES,
        contract_env.NODE_RANK,
        contract_env.NPROC_PER_NODE,
        contract_env.CONFIG,
        contract_env.JOB_NAME,
        contract_env.RESTART_ATTEMPT,
        contract_env.PROGRESS_LEASE,
        contract_env.TP,
        contract_env.PP,
        contract_env.VPP,
        contract_env.CP,
        contract_env.EP,
        contract_env.ETP,
        contract_env.DP,
        contract_env.SEQUENCE_PARALLEL,
        contract_env.CHECKPOINT_DIR,
        contract_env.RESTART_STRATEGY,
        contract_env.COORDINATOR_PORT,
        contract_env.POD_NAME,
        contract_env.POD_NAMESPACE,
        contract_env.RANK,
        contract_env.LOCAL_RANK,
        contract_env.LOCAL_WORLD_SIZE,
        contract_env.GROUP_RANK,
        contract_env.LAUNCHER_PID,
        contract_env.PROGRESS_LOG,
    }
)
_REFERENCE = re.compile(r"\$\(([^)]*)\)")
_SHELL = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)[^}]*\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_TORCHRUN = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def _fields(spec: MegatronJobSpec) -> Iterator[tuple[str, str]]:
    t = spec.trainer
    if t is None:
        return
    for i, item in enumerate(t.command):
        yield f"spec.trainer.command[{i}]", item
    for i, item in enumerate(t.args):
        yield f"spec.trainer.args[{i}]", item


def _references(text: str) -> list[str]:
    """The names `$(NAME)` refers to, as the expansion reads them (`$$` escapes)."""
    return _REFERENCE.findall(text.replace("$$", ""))


def known_names(spec: MegatronJobSpec) -> tuple[set[str], bool]:
    """The variables a rank's env has, and whether more may come from envFrom."""
    names = set(CONTRACT_NAMES)
    if spec.data is not None and spec.data.volume is not None:
        names.add(contract_env.DATA_DIR)
    if spec.checkpoint.init is not None and spec.checkpoint.init.volume is not None:
        names.add(contract_env.INIT_DIR)
    if spec.checkpoint.url is not None and spec.checkpoint.msc is not None:
        names |= {contract_env.MSC_CONFIG, contract_env.SCRATCH}
    names |= {e.name for e in spec.env}
    open_ended = False
    template = spec.template.spec if spec.template is not None else None
    for c in (template.containers or []) if template is not None else []:
        if c.name == "trainer":
            names |= {e.name for e in c.env or []}
            open_ended = open_ended or bool(c.env_from)
    return names, open_ended


def problems(spec: MegatronJobSpec) -> list[FieldError]:
    """Refusals: a `$(NAME)` that nothing sets."""
    if spec.trainer is None:
        return []
    names, open_ended = known_names(spec)
    if open_ended:
        return []  # warnings() says it
    found = []
    for field, text in _fields(spec):
        for name in _references(text):
            if name not in names:
                found.append(FieldError(field, _unknown(name, names)))
    return found


def _unknown(name: str, names: set[str]) -> str:
    ours = sorted(n for n in names if n.startswith("MEGATRON_"))
    return (
        f"$({name}) is not set in a rank's environment: it would reach the program as the text "
        f"$({name}), as Kubernetes leaves an unknown reference. Set it in spec.env, or use one "
        f"that is set (RANK, LOCAL_RANK, WORLD_SIZE, {', '.join(ours)}); write $$({name}) for "
        "the literal text"
    )


def warnings(spec: MegatronJobSpec) -> list[FieldError]:
    """What is allowed but most likely not meant."""
    t = spec.trainer
    if t is None:
        return []
    found: list[FieldError] = []
    names, open_ended = known_names(spec)
    for field, text in _fields(spec):
        for m in _SHELL.finditer(text.replace("$$", "")):
            written = m.group(0)
            found.append(
                FieldError(
                    field,
                    f"{written} is shell syntax and is never expanded (no shell runs the "
                    f"command): the program gets the text {written}. Write $({m.group(1) or m.group(2)}) "
                    "to expand a variable, or make a shell the command: [bash, -c, '...']",
                )
            )
        if open_ended:
            unknown = [n for n in _references(text) if n not in names]
            if unknown:
                found.append(
                    FieldError(
                        field,
                        f"$({unknown[0]}) is set by no field the operator knows: it expands "
                        "only if the template's envFrom gives it",
                    )
                )
    argv = [*t.command, *t.args[:2]]
    launcher = next((a for a in argv if a.rsplit("/", 1)[-1] in _TORCHRUN), None)
    if launcher is not None:
        found.append(
            FieldError(
                "spec.trainer.command",
                f"{launcher} is a launcher inside the launcher: the operator's launcher already "
                "starts resources.procsPerNode ranks per pod with RANK, WORLD_SIZE, MASTER_ADDR "
                "and MASTER_PORT set, and restarts them itself; under torchrun each rank would "
                "start procsPerNode more. Run the training script itself: [python, train.py]",
            )
        )
    if t.progress == "None":
        found.append(
            FieldError(
                "spec.trainer.progress",
                "None: the job has no progress source, so the hang rule is off (restartPolicy."
                "hangTimeoutSeconds is not applied) and MegatronJobNoProgress never fires for "
                "it; a hung job runs until its activeDeadlineSeconds",
            )
        )
    return found
