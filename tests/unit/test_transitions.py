"""Which spec changes are allowed: the Python check and the CEL transition rules agree."""

from __future__ import annotations

from typing import Any

import pytest

from megatron_operator.api import MegatronJobSpec
from megatron_operator.api.transitions import check_update

from .celcheck import check_spec
from .specs import spec_of

MK = "kueue.x-k8s.io/multikueue"

CASES: list[tuple[str, dict[str, Any], dict[str, Any], bool]] = [
    ("trainIters any time", {}, {"training.trainIters": 500}, True),
    ("suspend any time", {}, {"suspend": True}, True),
    ("restart policy any time", {}, {"restartPolicy": {"maxRestarts": 9}}, True),
    ("checkpoint schedule any time", {}, {"checkpoint.saveInterval": 7}, True),
    ("model never", {}, {"model.numLayers": 8}, False),
    (
        "model never, even suspended",
        {"suspend": True},
        {"suspend": True, "model.numLayers": 8},
        False,
    ),
    (
        "global batch never",
        {"suspend": True},
        {"suspend": True, "training.globalBatchSize": 128},
        False,
    ),
    (
        "volume never",
        {"suspend": True},
        {"suspend": True, "checkpoint.volume": {"claimName": "other"}},
        False,
    ),
    ("resize while running", {}, {"resources.nodes": 1}, False),
    ("resize while suspended", {"suspend": True}, {"suspend": True, "resources.nodes": 1}, True),
    ("resize while resuming", {"suspend": True}, {"suspend": False, "resources.nodes": 1}, False),
    ("image while suspended", {"suspend": True}, {"suspend": True, "image": "trainer:v2"}, True),
    ("lr while running", {}, {"training.lr": 0.01}, False),
    ("precision added while running", {}, {"training.precision": "fp16"}, False),
    ("managedBy set later", {}, {"managedBy": MK}, False),
    ("managedBy removed", {"managedBy": MK}, {}, False),
    ("managedBy changed", {"managedBy": MK}, {"managedBy": "example.com/other"}, False),
    (
        "managedBy changed while suspended",
        {"suspend": True, "managedBy": MK},
        {"suspend": True, "managedBy": "example.com/other"},
        False,
    ),
    ("managedBy kept", {"managedBy": MK}, {"managedBy": MK, "training.trainIters": 500}, True),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_transition(case: tuple[str, dict[str, Any], dict[str, Any], bool]) -> None:
    _, old_changes, new_changes, allowed = case
    old, new = spec_of(old_changes), spec_of(new_changes)
    python_errors = check_update(
        MegatronJobSpec.model_validate(old), MegatronJobSpec.model_validate(new)
    )
    cel_errors = [v for v in check_spec(new, old=old) if v.path == "spec"]
    assert (python_errors == []) is allowed, python_errors
    assert (cel_errors == []) is allowed, cel_errors
