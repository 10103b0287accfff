"""`mjob render`'s YAML reads back, through kubectl's YAML rules, as the values it holds."""

from __future__ import annotations

import pytest

from megatron_operator.api.loader import load_yaml
from megatron_operator.cli.yamlio import dump_yaml


@pytest.mark.parametrize(
    "value", ["3e-4", "1E5", "y", "n", "yes", "off", "null", "~", "8", "-1", ".5", "1:30", "x"]
)
def test_strings_stay_strings(value: str) -> None:
    doc = {"env": [{"name": "V", "value": value}], "text": "line one\nline two\n"}
    assert load_yaml(dump_yaml(doc)) == [doc]
