"""Reading MegatronJobs from YAML or dicts, with field-naming errors and `--set` overrides."""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from .errors import FieldError, SpecError
from .job import API_VERSION, KIND, MegatronJob


def parse_yaml(text: str, source: str = "<input>") -> dict[str, Any]:
    """One YAML document holding a mapping, or a SpecError saying where it is malformed."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError([FieldError(where, f"malformed YAML: {problem}")]) from None
    if len(docs) != 1:
        raise SpecError(
            [FieldError(source, f"expected exactly one YAML document, found {len(docs)}")]
        )
    doc = docs[0]
    if not isinstance(doc, dict):
        raise SpecError(
            [FieldError(source, f"expected a MegatronJob mapping, got {type(doc).__name__}")]
        )
    return doc


def read_file(path: str | Path) -> dict[str, Any]:
    """Read a spec file, turning I/O problems into a SpecError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([FieldError(str(p), f"cannot read the file: {exc}")]) from None
    return parse_yaml(text, str(p))


def apply_overrides(doc: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply Hydra-style `path=value` overrides. Paths are relative to spec unless they start
    with `spec.` or `metadata.`; list items are addressed by index (`data.blend.0.weight`).
    Values are parsed as YAML scalars/flow collections, so `true`, `8` and `[1, 2]` work."""
    out = copy.deepcopy(doc)
    errors: list[FieldError] = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            errors.append(FieldError("--set", f"{item!r} is not of the form path=value"))
            continue
        parts = key.strip().split(".")
        if parts[0] not in ("spec", "metadata"):
            parts = ["spec", *parts]
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        problem = _set_path(out, parts, value)
        if problem:
            errors.append(FieldError("--set", f"{item!r}: {problem}"))
    if errors:
        raise SpecError(errors)
    return out


def _set_path(root: dict[str, Any], parts: list[str], value: Any) -> str | None:
    node: Any = root
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                return f"{'.'.join(parts[:i])} has no item {part}"
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
        else:
            return f"{'.'.join(parts[:i])} is a {type(node).__name__}, not an object"
    return None


def load_job(doc: dict[str, Any], source: str = "<input>") -> MegatronJob:
    """Validate a MegatronJob document. Raises SpecError listing every problem."""
    errors: list[FieldError] = []
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        errors.append(
            FieldError(
                "apiVersion/kind",
                f"expected apiVersion {API_VERSION} and kind {KIND}, got "
                f"{doc.get('apiVersion')!r} and {doc.get('kind')!r}",
            )
        )
        raise SpecError(errors)
    try:
        return MegatronJob.model_validate(doc)
    except ValidationError as exc:
        raise SpecError([_field_error(e) for e in exc.errors()]) from None


def load_file(path: str | Path, overrides: list[str] | None = None) -> MegatronJob:
    """Read, override and validate a spec file."""
    doc = read_file(path)
    if overrides:
        doc = apply_overrides(doc, overrides)
    return load_job(doc, str(path))


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<root>"


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class that holds the field at `loc`, for listing allowed field names."""
    model: Any = MegatronJob
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return None
        model = _inner_model(field.annotation)
        if model is None:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _field_error(err: ErrorDetails) -> FieldError:
    loc = tuple(err["loc"])
    path = _path(loc)
    kind = err["type"]
    if kind == "extra_forbidden":
        model = _model_at(loc)
        allowed = sorted(f.alias or n for n, f in model.model_fields.items()) if model else []
        name = str(loc[-1])
        hint = difflib.get_close_matches(name, allowed, n=1)
        msg = "unknown field"
        if hint:
            msg += f"; did you mean {hint[0]!r}?"
        if allowed:
            msg += f" Allowed here: {', '.join(allowed)}"
        return FieldError(path, msg)
    if kind == "missing":
        return FieldError(path, "required field is missing")
    msg = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    if kind not in ("value_error",) and isinstance(value, (str, int, float, bool)):
        msg += f" (got {value!r})"
    return FieldError(path, msg)
