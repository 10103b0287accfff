"""Which spec changes are allowed on an existing job (pure). Mirrors cel.TRANSITION_RULES.

The operator calls this for updates that bypassed the apiserver's CEL (validation off, or an
older CRD), so the rules hold either way. See docs/api.md, "Changing a job".
"""

from __future__ import annotations

from typing import Any

from .errors import FieldError
from .spec import MegatronJobSpec

NEVER = (
    "model",
    "training.globalBatchSize",
    "checkpoint.volume",
    "checkpoint.path",
    "checkpoint.url",
)
# Set at creation: which controller runs the job (a job cannot move between controllers).
SET_AT_CREATION = ("managedBy",)
WHILE_SUSPENDED = (
    "image",
    "imagePullPolicy",
    "parallelism",
    "resources",
    "topology",
    "data",
    "env",
    "priorityClassName",
    "checkpoint.shardingType",
    "checkpoint.msc",
    "training.microBatchSize",
    "training.lr",
    "training.minLr",
    "training.warmupIters",
    "training.lrDecayStyle",
    "training.weightDecay",
    "training.clipGrad",
    "training.adamBeta1",
    "training.adamBeta2",
    "training.precision",
    "training.seed",
    "training.recompute",
)


def _get(doc: dict[str, Any], path: str) -> Any:
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def check_update(
    old: MegatronJobSpec, new: MegatronJobSpec, suspended: bool | None = None
) -> list[FieldError]:
    """Problems with changing `old` into `new` (empty when the change is allowed).

    `suspended` says whether the job stayed suspended in between; by default, as in the CEL rule,
    both specs must say `suspend: true`. The operator passes its own view (phase Suspended), since
    it may have missed the intermediate updates."""
    a, b = old.to_api(), new.to_api()
    if suspended is None:
        suspended = old.suspend and new.suspend
    errors = [
        FieldError(f"spec.{path}", "is immutable: delete and re-create the job to change it")
        for path in NEVER
        if _get(a, path) != _get(b, path)
    ]
    errors += [
        FieldError(
            f"spec.{path}",
            "is immutable: it names the controller that runs the job; delete and re-create the "
            "job to change it",
        )
        for path in SET_AT_CREATION
        if _get(a, path) != _get(b, path)
    ]
    if not suspended:
        errors += [
            FieldError(
                f"spec.{path}",
                "changes only while the job is suspended: set spec.suspend: true first, then "
                "change it, then resume",
            )
            for path in WHILE_SUSPENDED
            if _get(a, path) != _get(b, path)
        ]
    return errors
