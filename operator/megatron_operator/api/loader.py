"""Reading MegatronJobs from YAML or dicts, with field-naming errors and `--set` overrides."""

from __future__ import annotations

import copy
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from megatron_contract.bounds import INT64_MAX

from .base import (
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN,
    ENV_NAME_PATTERN,
    LABEL_VALUE_PATTERN,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
)
from .errors import FieldError, SpecError
from .job import API_VERSION, KIND, NAME_PATTERN, MegatronJob
from .spec import CHECKPOINT_PATH_PATTERN

# --- YAML, read as kubectl and the apiserver read it -------------------------------------------
#
# kubectl and the apiserver turn YAML into JSON with sigs.k8s.io/yaml (go-yaml v2). PyYAML's
# YAML 1.1 resolver differs where it matters: it reads `3e-4` and `1E5` as strings, `1:30` as
# the integer 90, and `2024-01-01` as a date. Our loader resolves plain scalars the go-yaml way.
# It is also built for hostile input: one iterative pass over libyaml's events (no recursion, so
# no RecursionError), with caps on nesting and on values (counting what aliases expand to, so a
# "billion laughs" document stops early), and duplicate keys rejected instead of the last winning.

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_TAG + t for t in ("str", "int", "float", "bool", "null", "binary"))
_MAP_TAG, _SEQ_TAG, _MERGE_TAG = _TAG + "map", _TAG + "seq", _TAG + "merge"
_LOADER_BASE: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present

# Everything a MegatronJob (even as `kubectl get -o yaml` prints it) holds, many times over.
MAX_VALUES: Final = 20_000


class _Loader(_LOADER_BASE):  # type: ignore[misc]
    """libyaml's parser, PyYAML's scalar constructors, go-yaml v2's implicit types."""

    bool_values: ClassVar[dict[str, bool]] = {
        **yaml.SafeLoader.bool_values,
        "y": True,
        "n": False,
    }
    yaml_implicit_resolvers: ClassVar[dict[Any, list[tuple[str, Any]]]] = {
        first: [(tag, rx) for tag, rx in resolvers if tag == _TAG + "null" or tag == _MERGE_TAG]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


_Loader.add_implicit_resolver(
    _TAG + "bool",
    re.compile(
        r"^(?:[yYnN]|yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"
    ),
    list("yYnNtTfFoO"),
)
_Loader.add_implicit_resolver(
    _TAG + "int",
    re.compile(
        r"^[-+]?(?:0b[01][01_]*|0o?[0-7][0-7_]*|0x[0-9a-fA-F][0-9a-fA-F_]*|[1-9][0-9_]*|0)$"
    ),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    _TAG + "float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


class _Invalid(Exception):
    """A problem at a field path, found while building the document."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = _clip(path) or "<root>"
        self.message = message


@dataclass
class _Frame:
    """An open mapping or sequence, while its events arrive."""

    path: str
    value: dict[str, Any] | list[Any]
    anchor: str | None
    start_total: int
    key: str | None = None  # a mapping's key awaiting its value
    merge: bool = False  # the awaited value is a `<<` merge source
    merged: list[dict[str, Any]] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)  # key → line, for duplicate messages

    def child_path(self) -> str:
        if isinstance(self.value, list):
            return f"{self.path}[{len(self.value)}]"
        return f"{self.path}.{self.key}" if self.path else str(self.key)


def _key_text(key: Any) -> str:
    """A scalar key as JSON sees it after go-yaml (true, null, 8, ...)."""
    if isinstance(key, bool):
        return "true" if key else "false"
    return "null" if key is None else str(key)


def _scalar(loader: Any, event: Any, path: str) -> Any:
    tag = event.tag
    if tag is None or tag == "!":
        tag = loader.resolve(yaml.ScalarNode, event.value, event.implicit)
    if not tag.startswith(_TAG):
        tag = _TAG + "str"  # an application tag (`!custom x`): go-yaml keeps the text
    if tag not in _SCALAR_TAGS:
        raise _Invalid(path, f"the YAML tag {tag} is not supported: remove it")
    node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
    try:
        value = loader.yaml_constructors[tag](loader, node)
    except (ValueError, KeyError, TypeError):
        raise _Invalid(
            path,
            f"{event.value[:40]!r} is not a valid !!{tag.removeprefix(_TAG)}: fix the value or "
            "remove the tag",
        ) from None
    if isinstance(value, bytes):  # !!binary: go-yaml decodes it to a string
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise _Invalid(path, "this !!binary value is not UTF-8 text: give the text") from None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
        raise _Invalid(
            path,
            f"{event.value[:40]} does not fit a 64-bit integer, the largest Kubernetes stores: "
            "use a smaller number",
        )
    return value


class _Builder:
    """Turns libyaml events into Python values, checking the limits as it goes."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.stack: list[_Frame] = []
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.total = 0
        self.docs: list[Any] = []

    def path(self) -> str:
        """Where the next value goes ('' for the document itself)."""
        return self.stack[-1].child_path() if self.stack else ""

    def count(self, n: int) -> None:
        self.total += n
        if self.total > MAX_VALUES:
            # Name the open container with the most items: that is the runaway list or map.
            big = max(self.stack, key=lambda f: len(f.value), default=None)
            raise _Invalid(
                big.path if big else "",
                f"the document holds more than {MAX_VALUES} values (aliases counted as "
                "expanded); a MegatronJob needs a few hundred: shorten this list or map",
            )

    def add(self, value: Any, line: int) -> None:
        if not self.stack:
            self.docs.append(value)
            return
        top = self.stack[-1]
        if isinstance(top.value, list):
            top.value.append(value)
        elif top.key is None:
            self.set_key(top, value, line)
        else:
            if top.merge:
                self.add_merge(top, value)
            else:
                top.value[top.key] = value
            top.key, top.merge = None, False

    def set_key(self, top: _Frame, key: Any, line: int) -> None:
        if isinstance(key, (dict, list)):
            raise _Invalid(top.path, "mapping keys must be plain strings")
        if key is _MERGE:
            top.key, top.merge = "<<", True
            return
        text = _key_text(key)
        if text in top.lines:
            where = f"{top.path}.{text}" if top.path else text
            raise _Invalid(
                where,
                f"duplicate key {text!r} on lines {top.lines[text]} and {line} of "
                f"{self.source}: keep only one",
            )
        top.lines[text] = line
        top.key = text

    def add_merge(self, top: _Frame, value: Any) -> None:
        sources = value if isinstance(value, list) else [value]
        if not all(isinstance(v, dict) for v in sources):
            raise _Invalid(top.path, "a '<<' merge needs a mapping or a list of them")
        top.merged.extend(sources)

    def start(self, event: Any, value: dict[str, Any] | list[Any], default_tag: str) -> None:
        path = self.path()
        if event.tag not in (None, "!", default_tag) and event.tag.startswith(_TAG):
            raise _Invalid(path, f"the YAML tag {event.tag} is not supported: remove it")
        if len(self.stack) >= MAX_DEPTH:
            raise _Invalid(
                path,
                f"nested deeper than {MAX_DEPTH} levels; a MegatronJob needs about 8: remove "
                "the extra nesting",
            )
        self.count(1)
        self.stack.append(_Frame(path, value, event.anchor, self.total))

    def end(self) -> None:
        frame = self.stack.pop()
        if isinstance(frame.value, dict):
            for source in frame.merged:  # explicit keys win, then earlier merge sources
                for k, v in source.items():
                    frame.value.setdefault(k, v)
        if frame.anchor is not None:
            self.anchors[frame.anchor] = (frame.value, self.total - frame.start_total + 1)
        self.add(frame.value, 0)

    def feed(self, loader: Any, event: Any) -> None:
        if isinstance(event, yaml.ScalarEvent):
            self.count(1)
            line = _line(event)
            top = self.stack[-1] if self.stack else None
            if top is not None and isinstance(top.value, dict) and top.key is None:
                tag = event.tag
                if (tag is None or tag == "!") and event.implicit[0]:
                    tag = loader.resolve(yaml.ScalarNode, event.value, event.implicit)
                if tag == _MERGE_TAG:
                    self.add(_MERGE, line)
                    return
            value = _scalar(loader, event, self.path())
            if event.anchor is not None:
                self.anchors[event.anchor] = (value, 1)
            self.add(value, line)
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor not in self.anchors:
                raise _Invalid(self.path(), f"unknown or recursive alias *{event.anchor}")
            value, size = self.anchors[event.anchor]
            self.count(size)
            self.add(value, _line(event))
        elif isinstance(event, yaml.MappingStartEvent):
            self.start(event, {}, _MAP_TAG)
        elif isinstance(event, yaml.SequenceStartEvent):
            self.start(event, [], _SEQ_TAG)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            self.end()


_MERGE = object()  # marks a `<<` key


def _line(event: yaml.Event) -> int:
    mark = event.start_mark
    return mark.line + 1 if mark is not None else 0


def load_yaml(text: str, source: str = "<input>") -> list[Any]:
    """Every document in `text`, as kubectl would read them. SpecError on any problem."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise SpecError(
            [
                FieldError(
                    source,
                    f"{len(text)} characters is above the {MAX_DOCUMENT_BYTES}-byte limit of a "
                    "Kubernetes request: a MegatronJob is a few kilobytes",
                )
            ]
        )
    try:
        return _load(text, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError([FieldError(where, f"malformed YAML: {problem}")]) from None
    except _Invalid as exc:
        raise SpecError([FieldError(exc.path, exc.message)]) from None


def _load(text: str, source: str) -> list[Any]:
    """The documents of `text`; raises yaml.YAMLError or _Invalid."""
    builder = _Builder(source)
    loader = _Loader(text)
    try:
        while loader.check_event():
            builder.feed(loader, loader.get_event())
    except (ValueError, KeyError, TypeError, RecursionError, MemoryError) as exc:
        # A scalar PyYAML's constructors refuse (none should get past the resolvers above).
        raise _Invalid(builder.path(), f"unreadable value ({type(exc).__name__})") from None
    finally:
        loader.dispose()
    return [d for d in builder.docs if d is not None]


def parse_yaml(text: str, source: str = "<input>") -> dict[str, Any]:
    """One YAML document holding a mapping, or a SpecError saying where it is malformed."""
    docs = load_yaml(text, source)
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
        if p.stat().st_size > MAX_DOCUMENT_BYTES * 4:
            # Do not even read it (utf-8 is at most 4 bytes a character).
            raise SpecError(
                [FieldError(str(p), f"the file is above the {MAX_DOCUMENT_BYTES}-byte limit")]
            )
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([FieldError(str(p), f"cannot read the file: {exc}")]) from None
    return parse_yaml(text, str(p))


def read_documents(path: str, stdin: Any = None) -> list[tuple[str, dict[str, Any]]]:
    """Every document of a file, or of standard input when `path` is `-`, each with where it
    came from (`FILE`, or `FILE (document N)` when there are several). Empty documents (a
    leading or trailing `---`) are skipped; SpecError for anything that is not a mapping."""
    if path == "-":
        import sys

        source = "<stdin>"
        text = (stdin or sys.stdin).read(MAX_DOCUMENT_BYTES + 1)
    else:
        source = str(path)
        p = Path(path)
        try:
            if p.stat().st_size > MAX_DOCUMENT_BYTES * 4:
                raise SpecError(
                    [FieldError(source, f"the file is above the {MAX_DOCUMENT_BYTES}-byte limit")]
                )
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError([FieldError(source, f"cannot read the file: {exc}")]) from None
    docs = [d for d in load_yaml(text, source) if d is not None]
    if not docs:
        raise SpecError([FieldError(source, "no YAML document")])
    out = []
    for i, doc in enumerate(docs):
        where = source if len(docs) == 1 else f"{source} (document {i + 1})"
        if not isinstance(doc, dict):
            raise SpecError(
                [FieldError(where, f"expected a MegatronJob mapping, got {type(doc).__name__}")]
            )
        out.append((where, doc))
    return out


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
        if len(parts) > MAX_DEPTH:
            errors.append(
                FieldError(
                    "--set",
                    f"{_short(item)}: the path is nested deeper than {MAX_DEPTH} levels; a "
                    "MegatronJob needs about 8",
                )
            )
            continue
        try:
            docs = _load(raw, "--set") if raw.strip() else [""]
        except yaml.YAMLError:
            docs = [raw]  # not YAML: the text itself
        except _Invalid as exc:
            errors.append(FieldError("--set", f"{item!r}: {exc.message}"))
            continue
        value = docs[0] if len(docs) == 1 else raw
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
            if not (part.isascii() and part.isdigit()) or len(part) > 9 or int(part) >= len(node):
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


def _too_deep(doc: Any) -> str | None:
    """The path of the first value nested deeper than MAX_DEPTH, or None. Iterative: the
    document may come from `--set` or a dict, not only from the YAML reader, which has its own
    cap (a `--set metadata.x.x...=1` of 60,000 levels must not pass, nor blow the stack)."""
    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if depth >= MAX_DEPTH:
            return path or "<root>"
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            where = (
                f"{path}[{key}]"
                if isinstance(node, list)
                else f"{path}.{key}"
                if path
                else str(key)
            )
            stack.append((value, where, depth + 1))
    return None


def load_job(doc: dict[str, Any], source: str = "<input>") -> MegatronJob:
    """Validate a MegatronJob document. Raises SpecError listing every problem."""
    errors: list[FieldError] = []
    deep = _too_deep(doc)
    if deep is not None:
        raise SpecError(
            [
                FieldError(
                    _clip(deep),
                    f"nested deeper than {MAX_DEPTH} levels; a MegatronJob needs about 8: "
                    "remove the extra nesting",
                )
            ]
        )
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        errors.append(
            FieldError(
                "apiVersion/kind",
                f"expected apiVersion {API_VERSION} and kind {KIND}, got "
                f"{doc.get('apiVersion')!r} and {doc.get('kind')!r}",
            )
        )
        raise SpecError(errors)
    metadata = doc.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    if namespace is not None and not (
        isinstance(namespace, str) and len(namespace) <= 63 and _NAMESPACE_RE.fullmatch(namespace)
    ):
        errors.append(
            FieldError(
                "metadata.namespace",
                "must be a DNS label: at most 63 lowercase letters, digits and '-', starting "
                f"and ending with a letter or digit (got {_short(namespace)})",
            )
        )
    job = None
    try:
        job = MegatronJob.model_validate(doc)
    except ValidationError as exc:
        details = exc.errors()
        errors += [_field_error(e) for e in details[:MAX_REPORTED]]
        if len(details) > MAX_REPORTED:
            errors.append(
                FieldError("<more>", f"{len(details) - MAX_REPORTED} more problems not shown")
            )
    except RecursionError:
        errors.append(FieldError("<root>", f"nested too deeply: keep it under {MAX_DEPTH} levels"))
    if errors or job is None:
        raise SpecError(errors)
    return job


_NAMESPACE_RE = re.compile(DNS1123_LABEL_PATTERN)
MAX_REPORTED: Final = (
    50  # field errors printed for one spec; a list of 100,000 bad items stops here
)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _clip(path: str) -> str:
    """A field path short enough to read (deep nesting and long keys make huge ones)."""
    return path if len(path) <= 120 else path[:117] + "..."


def load_file(path: str | Path, overrides: list[str] | None = None) -> MegatronJob:
    """Read, override and validate a spec file."""
    doc = read_file(path)
    if overrides:
        doc = apply_overrides(doc, overrides)
    return load_job(doc, str(path))


def field_errors(
    exc: ValidationError, model: type[BaseModel], prefix: str = ""
) -> list[FieldError]:
    """The errors of validating `model` as FieldErrors (at most MAX_REPORTED), under `prefix`."""
    out = [_field_error(e, model) for e in exc.errors()[:MAX_REPORTED]]
    return [FieldError(f"{prefix}{e.path}", e.message) for e in out] if prefix else out


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return _clip(out) or "<root>"


def _model_at(
    loc: tuple[int | str, ...], root: type[BaseModel] = MegatronJob
) -> type[BaseModel] | None:
    """The model class that holds the field at `loc`, for listing allowed field names."""
    model: Any = root
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


def _field_error(err: ErrorDetails, root: type[BaseModel] = MegatronJob) -> FieldError:
    loc = tuple(err["loc"])
    path = _path(loc)
    kind = err["type"]
    if kind == "extra_forbidden":
        model = _model_at(loc, root)
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
    ctx = err.get("ctx", {})
    fix = _PATTERN_FIXES.get(ctx.get("pattern", "")) or _FIXES.get(kind)
    if fix is not None:
        msg = fix.format(**ctx)
    value = err.get("input")
    if kind not in ("value_error",) and isinstance(value, (str, int, float, bool)):
        msg += f" (got {_short(value)})"
    return FieldError(path, msg)


_PATTERN_FIXES: Final = {
    DNS1123_SUBDOMAIN_PATTERN: "must be a DNS-1123 name: at most 253 lowercase letters, digits, "
    "'-' and '.', starting and ending with a letter or digit",
    ENV_NAME_PATTERN: "must be an environment variable name: letters, digits and '_', not "
    "starting with a digit (e.g. MY_SETTING)",
    LABEL_VALUE_PATTERN: "must be a label value: at most 63 letters, digits, '-', '_' or '.', "
    "starting and ending with a letter or digit",
    NAME_PATTERN: "must be a DNS label: lowercase letters, digits and '-', starting with a "
    "letter and ending with a letter or digit",
    CHECKPOINT_PATH_PATTERN: "must be a relative path of segments made of letters, digits, "
    "'.', '_' and '-', none of them '.' or '..' (e.g. runs/llama)",
}

# Pydantic's wording for the bounds, turned into a fix.
_FIXES: Final = {
    "less_than_equal": "must be at most {le}: use a smaller value",
    "less_than": "must be below {lt}: use a smaller value",
    "greater_than_equal": "must be at least {ge}: use a larger value",
    "greater_than": "must be greater than {gt}: use a larger value",
    "finite_number": "must be a finite number (not .inf or .nan): use a number",
    "too_long": "has more than the {max_length} items or characters allowed: shorten it",
    "string_too_long": "is longer than the {max_length} characters allowed: shorten it",
    "string_pattern_mismatch": "does not match the pattern {pattern}: fix its characters",
    "string_too_short": "must have at least {min_length} character(s)",
    "too_short": "must have at least {min_length} item(s)",
    "int_type": "must be an integer, unquoted (e.g. 8)",
    "int_parsing": "must be an integer, unquoted (e.g. 8)",
    "int_from_float": "must be a whole number (e.g. 8)",
    "float_type": "must be a number, unquoted (e.g. 3e-4)",
    "float_parsing": "must be a number, unquoted (e.g. 3e-4)",
    "string_type": "must be a string: quote it",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping of fields",
}
