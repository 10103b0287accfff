"""docs/install.md's values table is generated from the chart's schema and values, and current;
the generator's check catches an undocumented or unknown value."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from types import ModuleType

import yaml

from .chartkit import CHART, ROOT


def values_doc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("values_doc", ROOT / "charts" / "values_doc.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_values_table_is_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "charts" / "values_doc.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_check_catches_undocumented_and_unknown_values() -> None:
    vd = values_doc()
    schema = json.loads((CHART / "values.schema.json").read_text())
    text = (CHART / "values.yaml").read_text()
    assert vd.problems(schema, yaml.safe_load(text), text) == []

    # A value without a comment.
    bare = text.replace("# A node NotReady this long counts as lost: its jobs restart.\n", "")
    assert bare != text
    assert vd.problems(schema, yaml.safe_load(bare), bare) == [
        "values.yaml: nodeLostGraceSeconds has no comment (add one on its line or above it)"
    ]
    # A value the schema does not know.
    extra = text + "# A stray value.\nstray: 1\n"
    assert vd.problems(schema, yaml.safe_load(extra), extra) == [
        "values.yaml: stray is not in values.schema.json"
    ]
    # A schema value without a default.
    del schema["properties"]["alerts"]  # keep the schema consistent with itself
    schema["properties"]["newValue"] = {"type": "string", "description": "New."}
    out = vd.problems(schema, yaml.safe_load(text), text)
    assert "values.yaml: newValue is in the schema but has no default" in out


def test_table_lists_every_value_with_its_default() -> None:
    vd = values_doc()
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    table = vd.table(schema, values)
    assert "| `replicas` | integer | `1` |" in table
    assert "| `admissionPolicy.maxNodes` | integer | `0` |" in table
    assert table.count("\n") == len(vd.leaves(schema)) + 1
