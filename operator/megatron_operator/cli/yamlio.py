"""YAML output that stays readable, and that kubectl reads back as the same values.

Multi-line strings (the trainer config) are literal blocks. A string that kubectl's YAML (1.2)
would read as something else, such as `3e-4`, `1e5` or `y`, is quoted: PyYAML's own YAML 1.1
rules would leave it plain.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from megatron_operator.api.loader import load_yaml

# Only strings that start like a number, or are a short word, can be read as a non-string.
_MAYBE_NOT_TEXT = re.compile(r"^[-+.0-9]|^[A-Za-z~]{1,5}$")


def _reads_back(value: str) -> bool:
    """kubectl reads `value`, written plain, as this same string."""
    if not _MAYBE_NOT_TEXT.match(value):
        return True
    try:
        return load_yaml(value) == [value]
    except Exception:  # not valid plain YAML at all: quote it
        return False


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # objects shared in memory print in full: no &id001 anchors for readers


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None if _reads_back(value) else "'"
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
