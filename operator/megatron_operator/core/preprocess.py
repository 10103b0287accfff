"""`mjob preprocess` as a Kubernetes Job (pure): the data claim mounted read-write at
/mnt/data, the same command in the trainer image, as the trainer pods run (non-root, no
capabilities, the platform's identity and pull secrets).

Megatron's data are preprocessed "as a Job before training": the jsonl and the tokenizer are on
the data claim, the `.bin`/`.idx` pair is written back to it, and the training job then names the
written prefix in `data.blend` (under the same mount).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from megatron_contract import paths
from megatron_operator.api import FieldError
from megatron_operator.core.defaults import DEFAULT_TRAINER_IMAGE, Platform

Obj = dict[str, Any]
PATH_FLAGS = ("--input", "--tokenizer", "--output-prefix")


def _paths(args: Sequence[str]) -> list[tuple[str, str]]:
    """(flag, path) for every path the preprocess arguments name."""
    out: list[tuple[str, str]] = []
    flag: str | None = None
    for arg in args:
        if arg.startswith("--"):
            name, _, value = arg.partition("=")
            flag = name if name in PATH_FLAGS else None
            if flag and value:
                out.append((flag, value))
                flag = flag if flag == "--input" else None
            continue
        if flag is not None:
            out.append((flag, arg))
            if flag != "--input":
                flag = None
    return out


def problems(args: Sequence[str]) -> list[FieldError]:
    """What would make the Job fail or write where nothing reads it: a path off the claim, or
    an output prefix naming one of the two files."""
    found = []
    named = _paths(args)
    for flag in PATH_FLAGS:
        if not any(f == flag for f, _ in named):
            found.append(FieldError(flag, "required: the Job runs `mjob preprocess` with it"))
    mount = paths.DATA_MOUNT
    for flag, path in named:
        if not (path == mount or path.startswith(f"{mount}/")):
            found.append(
                FieldError(
                    flag,
                    f"{path} is not on the data claim: the Job mounts it at {mount}, so give "
                    f"{mount}/...",
                )
            )
        if flag == "--output-prefix" and path.endswith((".bin", ".idx")):
            found.append(
                FieldError(flag, f"{path}: give the prefix; the Job writes PREFIX.bin and .idx")
            )
    return found


def preprocess_job(
    name: str,
    claim: str,
    args: Sequence[str],
    *,
    image: str | None = None,
    requests: Mapping[str, str] | None = None,
    sub_path: str | None = None,
    platform: Platform | None = None,
    pull_secrets: Sequence[str] = (),
) -> Obj:
    """The batch/v1 Job (check `problems(args)` first)."""
    platform = platform or Platform()
    ids = {
        "runAsUser": platform.run_as_user,
        "runAsGroup": platform.run_as_group,
        "fsGroup": platform.fs_group,
    }
    security: Obj = {"runAsNonRoot": True, **{k: v for k, v in ids.items() if v is not None}}
    security["seccompProfile"] = {"type": "RuntimeDefault"}
    mount: Obj = {"name": "data", "mountPath": paths.DATA_MOUNT}
    if sub_path:
        mount["subPath"] = sub_path
    resources = dict(requests or {"cpu": "8", "memory": "32Gi"})
    pod: Obj = {
        "restartPolicy": "Never",
        "securityContext": security,
        "containers": [
            {
                "name": "preprocess",
                "image": image or DEFAULT_TRAINER_IMAGE,
                # The module `mjob preprocess` runs: the trainer image has the trainer's
                # packages, not the CLI's.
                "command": ["python", "-m", "megatron_trainer.preprocess", *args],
                "resources": {"requests": resources},
                "volumeMounts": [mount],
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "runAsNonRoot": True,
                },
            }
        ],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
    }
    if pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    labels = {"app.kubernetes.io/name": "mjob-preprocess", "app.kubernetes.io/instance": name}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            # The output is rewritten whole on a retry: two tries cover a lost node.
            "backoffLimit": 2,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
