"""docs/kueue.md's MultiKueue configuration is the one `cluster up --multikueue-workers` uses,
which tests/integration/test_multikueue.py runs against real Kueue v0.19.2."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CLUSTER_DIR = REPO / "tests" / "cluster"


def _driver() -> tuple[ModuleType, ModuleType]:
    """The `cluster` script and its multikueue module (standard library only)."""
    if str(CLUSTER_DIR) not in sys.path:
        sys.path.insert(0, str(CLUSTER_DIR))
    import multikueue

    loader = importlib.machinery.SourceFileLoader("cluster_driver", str(CLUSTER_DIR / "cluster"))
    spec = importlib.util.spec_from_loader("cluster_driver", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["cluster_driver"] = module
    loader.exec_module(module)
    return module, multikueue


def _section_yaml() -> list[list[dict[str, Any]]]:
    text = (REPO / "docs" / "kueue.md").read_text()
    section = text.split("## 8. MultiKueue", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    return [[d for d in yaml.safe_load_all(b) if d] for b in blocks]


def test_the_documented_kueue_configuration_is_the_managers(tmp_path: Path) -> None:
    driver, multikueue = _driver()
    opts = driver.UpOptions(
        state=tmp_path,
        nodes=2,
        gpus_per_node=8,
        nodes_per_rack=2,
        cpu_per_node="96",
        memory_per_node="1536Gi",
        pods_per_node=110,
        pvs=0,
        kueue=True,
        external_frameworks=["MegatronJob.v1alpha1.megatron.dev"],
        not_ready_toleration=30,
        kueue_pods_ready_timeout=None,
        timeout=180,
    )
    manager = multikueue.manager_kueue(opts)
    ports = {"kueue_health": 1, "kueue_metrics": 2, "kueue_webhook": 3}
    written = yaml.safe_load(
        driver.kueue_config(
            tmp_path,
            ports,
            manager.external_frameworks,
            None,
            manager.kueue_feature_gates,
            manager.kueue_multikueue_frameworks,
        ).read_text()
    )
    documented = _section_yaml()[0][0]
    for key in ("apiVersion", "kind", "integrations", "multiKueue"):
        assert documented[key] == written[key], key
    for gate, value in documented["featureGates"].items():
        assert written["featureGates"][gate] == value, gate


def test_the_documented_objects_are_the_ones_up_creates() -> None:
    _, multikueue = _driver()
    created = [obj for _, obj in multikueue.objects([("worker-1", "kubeconfig text")])]
    documented = _section_yaml()[1]
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in created}
    assert [(o["kind"], o["metadata"]["name"]) for o in documented] == list(by_kind)
    for doc in documented:
        made = by_kind[(doc["kind"], doc["metadata"]["name"])]
        assert doc["metadata"] == made["metadata"]
        if doc["kind"] == "Secret":
            assert set(doc["data"]) == set(made["data"]) == {"kubeconfig"}
        elif doc["kind"] == "MultiKueueConfig":
            assert made["spec"]["clusters"] == ["worker-1"]  # the doc lists two workers
        else:
            assert doc["spec"] == made["spec"], doc["kind"]
