"""A table of adversarial MegatronJob files: what a careless user or an attacker might submit.

Each case is the YAML text of a whole MegatronJob and the field its error must name. Every one
must be refused by `mjob validate` (tests/unit/test_adversarial.py) and, when sent as the same
YAML, by the kube-apiserver with the generated CRD (tests/integration/test_crd_apiserver.py).
Most cases change one field of the small valid job in `specs.py`; a few are raw text, because
the problem is in the YAML itself (duplicate keys, nesting, aliases).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from megatron_contract.bounds import MAX_NODES

from .specs import job_doc, spec_of


@dataclass(frozen=True)
class Case:
    id: str
    text: str  # the whole file
    field: str  # the path the error message must name
    apiserver_fragment: str = ""  # text the apiserver's message must hold, when it matters


# The cases hardest on the YAML reader, also run through the installed entry point as a fresh
# process (the test and benchmarks/adversarial_specs.py).
WORST_YAML: frozenset[str] = frozenset(
    {"deep nesting in a known field", "billion laughs", "duplicate key lr", "lr .nan"}
)


def validate_in_new_process(path: Path) -> subprocess.CompletedProcess[str]:
    """`mjob validate PATH` as a fresh Python process (interpreter start and imports included)."""
    return subprocess.run(
        [sys.executable, "-m", "megatron_operator.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _file(changes: dict[str, Any], **meta: Any) -> str:
    return yaml.safe_dump(job_doc(spec_of(changes), **meta), sort_keys=False, width=10**9)


def _case(id: str, changes: dict[str, Any], field: str, fragment: str = "") -> Case:
    return Case(id, _file(changes), field, fragment)


INF, NAN = float("inf"), float("nan")


def _with_blend(key: str, value: Any) -> dict[str, Any]:
    """A blend dataset (instead of mock data) with one field changed."""
    item: dict[str, Any] = {"weight": 1.0, "prefix": "/data/a"}
    tokenizer = {"path": "/data/tok"}
    if key == "path":
        tokenizer["path"] = value
    else:
        item[key] = value
    return {"data": {"blend": [item], "tokenizer": tokenizer}}


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _before_data(text: str, lines: str) -> str:
    """`lines` (indented for spec's fields) inserted just before spec.data."""
    return _replace(text, "\n  data:\n", "\n" + lines + "  data:\n")


_BASE = _file({})
_BOMB = "bomb0: &b0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"bomb{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 10)}]\n" for i in range(1, 9)
)

CASES: list[Case] = [
    # --- sizes that would make the operator render, plan or allocate without bound
    _case(
        "a million nodes", {"resources.nodes": 1_000_000}, "spec.resources.nodes", str(MAX_NODES)
    ),
    _case("nodes above the cap", {"resources.nodes": MAX_NODES + 1}, "spec.resources.nodes"),
    _case("nodes 2**63", {"resources.nodes": 2**63}, "spec.resources.nodes"),
    _case("nodes negative", {"resources.nodes": -1}, "spec.resources.nodes"),
    _case("nodes a float", {"resources.nodes": 2.5}, "spec.resources.nodes"),
    _case(
        "world size above the cap",
        {"resources.nodes": 4096, "resources.procsPerNode": 256, "training.globalBatchSize": 2**20},
        "spec.resources",
    ),
    _case(
        "nodes and spares above the pod cap",
        {"resources.nodes": 4090, "resources.procsPerNode": 1, "resources.spareNodes": 8},
        "spec.resources",
    ),
    _case("spareNodes huge", {"resources.spareNodes": 2**40}, "spec.resources.spareNodes"),
    _case("procsPerNode huge", {"resources.procsPerNode": 100_000}, "spec.resources.procsPerNode"),
    _case("procsPerNode 2**64", {"resources.procsPerNode": 2**64}, "spec.resources.procsPerNode"),
    _case("tensor 2**31", {"parallelism.tensor": 2**31}, "spec.parallelism.tensor"),
    _case("data 2**63", {"parallelism.data": 2**63}, "spec.parallelism.data"),
    _case("numLayers 1e9", {"model.numLayers": 10**9}, "spec.model.numLayers"),
    _case("heads 1e12", {"model.numAttentionHeads": 10**12}, "spec.model.numAttentionHeads"),
    _case("hiddenSize 2**40", {"model.hiddenSize": 2**40}, "spec.model.hiddenSize"),
    _case("seqLength 2**40", {"model.seqLength": 2**40}, "spec.model.seqLength"),
    _case("vocabSize 1e12", {"model.vocabSize": 10**12}, "spec.model.vocabSize"),
    _case("trainIters 1e18", {"training.trainIters": 10**18}, "spec.training.trainIters"),
    _case(
        "globalBatchSize 2**50",
        {"training.globalBatchSize": 2**50},
        "spec.training.globalBatchSize",
    ),
    _case("seed 2**40", {"training.seed": 2**40}, "spec.training.seed"),
    _case(
        "maxRestarts 1e9", {"restartPolicy.maxRestarts": 10**9}, "spec.restartPolicy.maxRestarts"
    ),
    _case(
        "exit code 256",
        {"restartPolicy.rules": [{"action": "Fail", "exitCodes": [256]}]},
        "spec.restartPolicy.rules[0].exitCodes[0]",
    ),
    _case(
        "profiling rank 2**40",
        {"profiling": {"startStep": 1, "endStep": 2, "ranks": [2**40]}},
        "spec.profiling.ranks[0]",
    ),
    _case("split with huge weights", {"data.split": "99999999999999999999,0,0"}, "spec.data.split"),
    # --- durations: any of these used to overflow datetime arithmetic in the reconcile loop
    _case(
        "backoffSeconds 2.5e11",
        {"restartPolicy.backoffSeconds": 250_000_000_000},
        "spec.restartPolicy.backoffSeconds",
    ),
    _case(
        "backoffSeconds negative",
        {"restartPolicy.backoffSeconds": -5},
        "spec.restartPolicy.backoffSeconds",
    ),
    _case(
        "maxBackoffSeconds 1e12",
        {"restartPolicy.maxBackoffSeconds": 10**12},
        "spec.restartPolicy.maxBackoffSeconds",
    ),
    _case(
        "hangTimeoutSeconds 2**62",
        {"restartPolicy.hangTimeoutSeconds": 2**62},
        "spec.restartPolicy.hangTimeoutSeconds",
    ),
    _case(
        "ttlSecondsAfterFinished 1e15",
        {"ttlSecondsAfterFinished": 10**15},
        "spec.ttlSecondsAfterFinished",
    ),
    _case(
        "gracePeriodSeconds 1e10",
        {"checkpoint.gracePeriodSeconds": 10**10},
        "spec.checkpoint.gracePeriodSeconds",
    ),
    _case(
        "tolerationSeconds int64 max",
        {
            "resources.tolerations": [
                {"key": "k", "operator": "Exists", "tolerationSeconds": 2**63 - 1}
            ]
        },
        "spec.resources.tolerations[0].tolerationSeconds",
    ),
    # --- floats: infinity, NaN and absurd magnitudes
    _case("lr .inf", {"training.lr": INF}, "spec.training.lr"),
    _case("lr -.inf", {"training.lr": -INF}, "spec.training.lr"),
    _case("lr .nan", {"training.lr": NAN}, "spec.training.lr"),
    _case("lr 1e308", {"training.lr": 1e308}, "spec.training.lr"),
    _case("minLr .nan", {"training.minLr": NAN}, "spec.training.minLr"),
    _case("weightDecay .inf", {"training.weightDecay": INF}, "spec.training.weightDecay"),
    _case("clipGrad 1e300", {"training.clipGrad": 1e300}, "spec.training.clipGrad"),
    _case("adamBeta1 .nan", {"training.adamBeta1": NAN}, "spec.training.adamBeta1"),
    _case("gpuMemoryGiB .inf", {"resources.gpuMemoryGiB": INF}, "spec.resources.gpuMemoryGiB"),
    _case(
        "gpuMemoryGiB negative", {"resources.gpuMemoryGiB": -80.0}, "spec.resources.gpuMemoryGiB"
    ),
    _case("gpuMemoryGiB 1e9", {"resources.gpuMemoryGiB": 1e9}, "spec.resources.gpuMemoryGiB"),
    _case("ropeTheta .inf", {"model.ropeTheta": INF}, "spec.model.ropeTheta"),
    _case("normEpsilon .nan", {"model.normEpsilon": NAN}, "spec.model.normEpsilon"),
    _case("blend weight .inf", _with_blend("weight", INF), "spec.data.blend[0].weight"),
    # --- quantities: negative, or too large for the kubelet
    _case(
        "memory request negative",
        {"resources.requests": {"memory": "-1Gi"}},
        "spec.resources.requests.memory",
    ),
    _case(
        "cpu limit 23 digits",
        {"resources.limits": {"cpu": "99999999999999999999999"}},
        "spec.resources.limits.cpu",
    ),
    _case(
        "cpu request int negative",
        {"resources.requests": {"cpu": -4}},
        "spec.resources.requests.cpu",
    ),
    _case("shmSize 1e999", {"resources.shmSize": "1e999"}, "spec.resources.shmSize"),
    _case(
        "pvc size negative",
        {"checkpoint.volume": {"create": {"size": "-500Gi"}}},
        "spec.checkpoint.volume.create.size",
    ),
    # --- paths that climb out of the volume or the data directory
    _case(
        "checkpoint path ../../../tmp", {"checkpoint.path": "../../../tmp"}, "spec.checkpoint.path"
    ),
    _case("checkpoint path a/../../b", {"checkpoint.path": "a/../../b"}, "spec.checkpoint.path"),
    _case("checkpoint path ./x", {"checkpoint.path": "./x"}, "spec.checkpoint.path"),
    _case("checkpoint path absolute", {"checkpoint.path": "/etc"}, "spec.checkpoint.path"),
    _case(
        "tokenizer path with ..", _with_blend("path", "/data/../../etc"), "spec.data.tokenizer.path"
    ),
    _case("blend prefix with ..", _with_blend("prefix", "/data/../x"), "spec.data.blend[0].prefix"),
    # --- names Kubernetes would refuse later, in the middle of a reconcile
    _case(
        "claimName with underscore",
        {"checkpoint.volume.claimName": "Bad_Claim"},
        "spec.checkpoint.volume.claimName",
    ),
    _case(
        "claimName leading dash",
        {"checkpoint.volume.claimName": "-x"},
        "spec.checkpoint.volume.claimName",
    ),
    _case(
        "storageClassName upper case",
        {"checkpoint.volume": {"create": {"size": "1Gi", "storageClassName": "FAST"}}},
        "spec.checkpoint.volume.create.storageClassName",
    ),
    _case(
        "priorityClassName with space", {"priorityClassName": "high prio"}, "spec.priorityClassName"
    ),
    _case(
        "env name starts with a digit",
        {"env": [{"name": "1BAD", "value": "x"}]},
        "spec.env[0].name",
    ),
    _case("env name with =", {"env": [{"name": "A=B", "value": "x"}]}, "spec.env[0].name"),
    _case("env name empty", {"env": [{"name": "", "value": "x"}]}, "spec.env[0].name"),
    _case(
        "nodeSelector key with space",
        {"resources.nodeSelector": {"bad key": "x"}},
        "spec.resources.nodeSelector",
    ),
    # Python's `$` matches before a trailing newline and `\d` matches full-width digits; the
    # apiserver's RE2 does neither: `mjob validate` must refuse what the apiserver refuses.
    _case(
        "nodeSelector key ending in a newline",
        {"resources.nodeSelector": {"pool\n": "x"}},
        "spec.resources.nodeSelector",
    ),
    _case(
        "topology key ending in a newline",
        {"topology": {"key": "example.com/rack\n", "mode": "required"}},
        "spec.topology.key",
    ),
    _case("split in full-width digits", {"data.split": "１,0,0"}, "spec.data.split"),
    _case("split ending in a newline", {"data.split": "1,0,0\n"}, "spec.data.split"),
    _case("shmSize ending in a newline", {"resources.shmSize": "1Gi\n"}, "spec.resources.shmSize"),
    # The apiserver refuses a pod whose request is above its limit: refuse the job first.
    _case(
        "cpu request above its limit",
        {"resources.requests": {"cpu": "1"}, "resources.limits": {"cpu": "500m"}},
        "spec.resources",
    ),
    _case(
        "extended resource request without a limit",
        {"resources.requests": {"example.com/fpga": 1}},
        "spec.resources",
    ),
    _case(
        "memory request above its limit",
        {"resources.requests": {"memory": "2Gi"}, "resources.limits": {"memory": 2000000000}},
        "spec.resources",
    ),
    _case(
        "toleration key ending in a newline",
        {"resources.tolerations": [{"key": "gpu\n", "operator": "Exists"}]},
        "spec.resources.tolerations[0].key",
    ),
    _case(
        "nodeSelector key bad prefix",
        {"resources.nodeSelector": {"-bad.example.com/x": "x"}},
        "spec.resources.nodeSelector",
    ),
    _case(
        "nodeSelector key prefix too long",
        {"resources.nodeSelector": {"a" * 254 + "/x": "x"}},
        "spec.resources.nodeSelector",
    ),
    _case(
        "nodeSelector value too long",
        {"resources.nodeSelector": {"pool": "x" * 64}},
        "spec.resources.nodeSelector.pool",
    ),
    _case(
        "topology key upper-case prefix",
        {"topology": {"key": "Example.com/rack", "mode": "required"}},
        "spec.topology.key",
    ),
    _case(
        "toleration key with !",
        {"resources.tolerations": [{"key": "bad key!", "operator": "Exists"}]},
        "spec.resources.tolerations[0].key",
    ),
    _case(
        "toleration value with space",
        {"resources.tolerations": [{"key": "k", "operator": "Equal", "value": "x y"}]},
        "spec.resources.tolerations[0].value",
    ),
    Case("namespace not a DNS label", _file({}, namespace="Bad_NS"), "metadata.namespace"),
    Case("name too long", _file({}, name="x" * 51), "metadata.name"),
    # --- huge lists and strings
    _case(
        "env list of 200",
        {"env": [{"name": f"V{i}", "value": "x"} for i in range(200)]},
        "spec.env",
    ),
    Case(
        "a list of 150,000 values",
        _before_data(_BASE, "  extra: [" + "1, " * 150_000 + "1]\n"),
        "spec.extra",
    ),
    _case("image of a megabyte", {"image": "x" * 1_000_000}, "spec.image"),
    _case(
        "env value of 100 KB",
        {"env": [{"name": "BIG", "value": "x" * 100_000}]},
        "spec.env[0].value",
    ),
    # --- the YAML itself
    Case(
        "duplicate key lr",
        _replace(_BASE, "  training:\n", "  training:\n    lr: 0.1\n    lr: 100.0\n"),
        "spec.training.lr",
    ),
    Case(
        "duplicate key spec",
        _BASE + "spec:\n  image: other\n",
        "spec",
    ),
    Case(
        "deep nesting in a known field",
        _replace(_BASE, "  training:\n", f"  training:\n    lr: {_nested(10_000)}\n"),
        "spec.training.lr",
    ),
    Case(
        "deep nesting in an unknown field",
        _replace(
            _BASE, "  training:\n", "  training:\n    x: " + "{a: " * 200 + "1" + "}" * 200 + "\n"
        ),
        "spec.training.x",
    ),
    Case(
        "deep block nesting",
        _replace(
            _BASE,
            "  training:\n",
            "  training:\n    x:\n" + "".join(" " * (6 + 2 * i) + "- \n" for i in range(300)),
        ),
        "spec.training.x",
    ),
    Case(
        "billion laughs",
        _before_data(_BASE, "  extra:\n" + "".join(f"    {line}\n" for line in _BOMB.splitlines())),
        "spec.extra",
    ),
    Case(
        "int tag on text",
        _replace(_BASE, "image: trainer:test", "image: !!int trainer"),
        "spec.image",
    ),
]
