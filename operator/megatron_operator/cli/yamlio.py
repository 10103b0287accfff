"""YAML output that stays readable, and that kubectl reads back as the same values.

Multi-line strings (the trainer config) are literal blocks. A string that kubectl's YAML (1.2)
would read as something else, such as `3e-4`, `1e5` or `y`, is quoted: PyYAML's own YAML 1.1
rules would leave it plain.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

import yaml

from megatron_operator.api.loader import load_yaml

# Only strings that start like a number, or are a short word, can be read as a non-string.
_MAYBE_NOT_TEXT = re.compile(r"^[-+.0-9]|^[A-Za-z~]{1,5}$")


@functools.lru_cache(maxsize=4096)
def _reads_back(value: str) -> bool:
    """kubectl reads `value`, written plain, as this same string."""
    if not _MAYBE_NOT_TEXT.match(value):
        return True
    try:
        return load_yaml(value) == [value]
    except Exception:  # not valid plain YAML at all: quote it
        return False


# libyaml's emitter when PyYAML has it: the pure-Python one took most of the 35 s `mjob render`
# spent on a 4,096-pod job. The representers (ours below) run in Python either way.
_BASE_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_BASE_DUMPER):  # type: ignore[misc]
    def ignore_aliases(self, data: Any) -> bool:
        return True  # objects shared in memory print in full: no &id001 anchors for readers


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None if _reads_back(value) else "'"
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def write_list(objs: Iterable[Any], fmt: str, write: Callable[[str], Any]) -> None:
    """A `v1/List` of `objs`, written one item at a time: the same text as dumping the whole
    List (`yaml`, or `json` with indent 2), without holding every item in memory."""
    if fmt == "json":
        write('{\n  "apiVersion": "v1",\n  "kind": "List",\n  "items": [')
        first = True
        for obj in objs:
            text = json.dumps(obj, indent=2, ensure_ascii=False).replace("\n", "\n    ")
            write(("\n    " if first else ",\n    ") + text)
            first = False
        write("]\n}\n" if first else "\n  ]\n}\n")
        return
    write("apiVersion: v1\nkind: List\nitems:")
    empty = True
    for obj in objs:
        write("\n" if empty else "")
        write(dump_yaml([obj]))  # an indentless item, as PyYAML writes a list in a mapping
        empty = False
    write(" []\n" if empty else "")
