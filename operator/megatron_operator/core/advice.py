"""Warnings about a valid spec (pure): what is allowed but will most likely not do what was meant.

`mjob validate` prints them after "is valid"; none of them stops a job, since each has a
legitimate exception (a tokenizer baked into the image, a BestEffort smoke test).
"""

from __future__ import annotations

from megatron_contract import paths
from megatron_operator.api import FieldError, MegatronJobSpec

# Suffixes of the indexed dataset's two files: a blend prefix names the pair without them.
_DATASET_SUFFIXES = (".bin", ".idx")


def mounts(spec: MegatronJobSpec) -> dict[str, str]:
    """Where the trainer container sees a volume → what the spec calls it."""
    out: dict[str, str] = {}
    data = spec.data
    if data is not None and data.volume is not None:
        out[paths.DATA_MOUNT] = "spec.data.volume"
    if spec.checkpoint.volume is not None:
        out[paths.CHECKPOINT_MOUNT] = "spec.checkpoint.volume"
    init = spec.checkpoint.init
    if init is not None and init.volume is not None:
        out[paths.INIT_MOUNT] = "spec.checkpoint.init.volume"
    tpl = spec.template.spec if spec.template is not None else None
    for c in (tpl.containers or []) if tpl is not None else []:
        if c.name == paths.CONTAINER_NAME:
            for m in c.volume_mounts or []:
                out[m.mount_path.rstrip("/") or "/"] = f"spec.template volume {m.name}"
    return out


def _under(path: str, mount: str) -> bool:
    return mount in ("/", path) or path.startswith(mount.rstrip("/") + "/")


def _data_paths(spec: MegatronJobSpec) -> list[tuple[str, str]]:
    data = spec.data
    if data is None:
        return []
    out = [(f"spec.data.blend[{i}].prefix", b.prefix) for i, b in enumerate(data.blend or [])]
    if data.tokenizer is not None:
        out.append(("spec.data.tokenizer.path", data.tokenizer.path))
    return out


def warnings(spec: MegatronJobSpec) -> list[FieldError]:
    """Every warning about `spec` (already valid, with the platform's defaults merged)."""
    found: list[FieldError] = []
    where = mounts(spec)
    shown = ", ".join(f"{m} ({what})" for m, what in sorted(where.items())) or "none"
    for field, value in _data_paths(spec):
        if field.endswith(".prefix") and value.endswith(_DATASET_SUFFIXES):
            found.append(
                FieldError(
                    field,
                    f"{value} names one file of the indexed dataset: give the prefix without "
                    f".bin or .idx (e.g. {value[:-4]})",
                )
            )
        if not value.startswith("/"):
            found.append(
                FieldError(
                    field,
                    f"{value} is relative: the trainer reads it from its working directory; "
                    f"give the path under a mounted volume (spec.data.volume mounts at "
                    f"{paths.DATA_MOUNT})",
                )
            )
        elif not any(_under(value, m) for m in where):
            found.append(
                FieldError(
                    field,
                    f"{value} is not under a volume the trainer mounts (mounted: {shown}): it "
                    "exists only if the image holds it; put the data on a claim and set "
                    f"spec.data.volume (mounted at {paths.DATA_MOUNT}), then use "
                    f"{paths.DATA_MOUNT}/...",
                )
            )
    requests = spec.resources.requests
    missing = [k for k in ("cpu", "memory") if k not in requests]
    if len(missing) == 2:
        why = "the pods are BestEffort, the first evicted under memory pressure"
    else:
        why = "the scheduler reserves none for the pods, and may pack them beside anything"
    if missing:
        found.append(
            FieldError(
                "spec.resources.requests",
                f"no {' or '.join(missing)} request: {why}; set resources.requests cpu and "
                "memory (or let a MegatronJobDefaults give them)",
            )
        )
    return found
