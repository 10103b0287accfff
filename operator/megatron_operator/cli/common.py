"""What every `mjob` sub-command shares: the spec arguments, the error type, output formats.

Sub-commands import this module and the layers below (api, core, local), never each other or
`main`: the parser in `main` is the only place that knows them all.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from megatron_operator.api import load_file
from megatron_operator.api.job import MegatronJob
from megatron_operator.cli.yamlio import dump_yaml
from megatron_operator.core.planner import Plan, plan

EXIT_INVALID = 2  # an invalid spec or bad arguments
EXIT_FAILED = 1  # a failure while doing the work


class CliError(Exception):
    """A user-facing failure: printed as one message, exit code attached."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def add_spec_args(p: argparse.ArgumentParser) -> None:
    """FILE and the repeatable `--set path=value` override."""
    p.add_argument("file", help="MegatronJob YAML file")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a field, e.g. training.trainIters=1000 (repeatable; relative to spec)",
    )


def load_and_plan(path: str, overrides: list[str]) -> tuple[MegatronJob, Plan]:
    """Load a spec and plan it; every spec problem becomes a SpecError naming the fields."""
    job = load_file(path, overrides)
    return job, plan(job.spec)


def add_defaults_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--defaults",
        action="append",
        default=[],
        metavar="FILE",
        help="merge a MegatronJobDefaults (or the operator's --job-defaults file) under the "
        "spec, as the operator would (repeatable, least specific first)",
    )


def read_defaults(files: list[str]) -> dict[str, Any]:
    """The merged defaults of `--defaults` files (core/defaults.py), validated: a
    MegatronJobDefaults object or a bare spec of one."""
    from megatron_operator.api import SpecError, read_file
    from megatron_operator.core.defaults import Layer, resolve

    layers = []
    for name in files:
        doc = read_file(name)
        namespaced = doc.get("kind") == "MegatronJobDefaults"  # else the operator's bare spec
        spec = doc.get("spec", {}) if namespaced else doc
        layers.append(Layer(name, spec if isinstance(spec, dict) else {}, operator=not namespaced))
    record, errors = resolve(layers)
    if errors:
        raise SpecError(errors)
    return dict(record["spec"]) if record else {}


def load_resolved(
    path: str, overrides: list[str], defaults_files: list[str], note: Any = None
) -> tuple[MegatronJob, Plan, dict[str, Any]]:
    """Load a spec with the platform's defaults merged under it, as the operator would, and
    plan it; returns the merged defaults too. `note` (a print function) says where the image
    of a job that names none comes from."""
    from megatron_operator.api import read_file

    merged = read_defaults(defaults_files)
    return resolve_doc(read_file(path), path, overrides, merged, note)


def resolve_doc(
    doc: dict[str, Any],
    path: str,
    overrides: list[str],
    merged: dict[str, Any],
    note: Any = None,
) -> tuple[MegatronJob, Plan, dict[str, Any]]:
    """`load_resolved` of a document already read (`path` names where it came from)."""
    from megatron_operator.api import apply_overrides, load_job
    from megatron_operator.core.defaults import DEFAULT_TRAINER_IMAGE, apply

    if overrides:
        doc = apply_overrides(doc, overrides)
    if merged and isinstance(doc.get("spec"), dict):
        doc = {**doc, "spec": apply(doc["spec"], merged)}
    job = load_job(doc, path)
    if job.spec.image is None and note is not None:
        note(
            f"note: spec.image is unset: the pods run the platform's trainer image (the chart's "
            f"trainerImage, or a MegatronJobDefaults image; --defaults FILE shows yours), else "
            f"{DEFAULT_TRAINER_IMAGE}"
        )
    return job, plan(job.spec), merged


def dump(obj: Any, fmt: str) -> str:
    """`json` or `yaml` text of a document, ending in a newline."""
    if fmt == "json":
        return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
    return dump_yaml(obj)
