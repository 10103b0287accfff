"""spec.template cases shared by the unit parity test (the models against the CRD's CEL,
tests/unit/test_template.py) and the real apiserver (tests/integration/test_operator_open_pods.py).

Each refused case sets one operator-owned field through the template; `field` is the path both
`mjob validate` and the apiserver must name (the apiserver's path may go deeper, e.g. into a
list item), and `why` a word of the reason both give.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.unit.specs import spec_of

# Everything a platform team puts in a template, accepted by both: a data claim, a Multus
# annotation, an image pull secret, an env var from a Secret, a native sidecar and a plain one.
FULL_TEMPLATE: dict[str, Any] = {
    "metadata": {
        "labels": {"team": "pretraining"},
        "annotations": {"k8s.v1.cni.cncf.io/networks": "ib-sriov"},
    },
    "spec": {
        "volumes": [
            {
                "name": "datasets",
                "persistentVolumeClaim": {"claimName": "lustre", "readOnly": True},
            },
            {"name": "scratch", "emptyDir": {}},
        ],
        "initContainers": [
            {
                "name": "log-shipper",
                "image": "fluent/fluent-bit:3.1",
                "restartPolicy": "Always",
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }
        ],
        "containers": [
            {
                "name": "trainer",
                "env": [
                    {
                        "name": "WANDB_API_KEY",
                        "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}},
                    },
                    {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                ],
                "envFrom": [{"configMapRef": {"name": "team-settings"}}],
                "volumeMounts": [
                    {"name": "datasets", "mountPath": "/datasets", "readOnly": True},
                    {"name": "scratch", "mountPath": "/scratch"},
                ],
                # (the apiserver wants a memory or cpu entry beside hugepages)
                "resources": {
                    "requests": {"hugepages-2Mi": "1Gi", "memory": "8Gi"},
                    "limits": {"hugepages-2Mi": "1Gi", "memory": "8Gi"},
                },
            },
            {
                "name": "metrics-exporter",
                "image": "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5",
                "ports": [{"containerPort": 9400, "name": "metrics"}],
            },
        ],
        "imagePullSecrets": [{"name": "registry-creds"}],
        "nodeSelector": {"example.com/pool": "h100"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "example.com/healthy", "operator": "In", "values": ["true"]}
                            ]
                        }
                    ]
                }
            }
        },
        "tolerations": [{"key": "example.com/reserved", "operator": "Exists"}],
        "schedulerName": "default-scheduler",
        "runtimeClassName": "nvidia",
        "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
        "securityContext": {"supplementalGroups": [4242]},
    },
}


@dataclass(frozen=True)
class Refused:
    id: str
    template: dict[str, Any]
    field: str  # the path both name (a prefix of the apiserver's)
    why: str  # a word of the reason both give

    def spec(self) -> dict[str, Any]:
        return spec_of({"template": self.template})


def _trainer(**fields: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "trainer", **fields}]}}


REFUSED: list[Refused] = [
    *[
        Refused(f"pod {f}", {"spec": {f: v}}, f"spec.template.spec.{f}", "operator")
        for f, v in (
            ("restartPolicy", "OnFailure"),
            ("hostname", "mine"),
            ("subdomain", "mine"),
            ("serviceAccountName", "admin"),
            ("serviceAccount", "admin"),
            ("nodeName", "node-1"),
            ("terminationGracePeriodSeconds", 5),
            ("priorityClassName", "high"),
        )
    ],
    *[
        Refused(
            f"volume {v}",
            {"spec": {"volumes": [{"name": v, "emptyDir": {}}]}},
            "spec.template.spec.volumes[0]",
            "operator",
        )
        for v in ("config", "checkpoints", "dshm", "megatron-data", "megatron-init")
    ],
    *[
        Refused(
            f"mount path {p}",
            _trainer(volumeMounts=[{"name": "x", "mountPath": p}]),
            "spec.template.spec.containers[0]",
            "mounts",
        )
        for p in (
            "/etc/megatron",
            "/mnt/checkpoints",
            "/mnt/checkpoints/sub",
            "/dev/shm",
            "/mnt/data",
            "/mnt/init/",
        )
    ],
    Refused(
        "mount of an owned volume",
        _trainer(volumeMounts=[{"name": "checkpoints", "mountPath": "/elsewhere"}]),
        "spec.template.spec.containers[0]",
        "mounts",
    ),
    *[
        Refused(
            f"env {name}",
            _trainer(env=[{"name": name, "value": "1"}]),
            "spec.template.spec.containers[0]",
            "operator",
        )
        for name in (
            "RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "LOCAL_RANK",
            "NODE_RANK",
            "MEGATRON_CONFIG",
            "MEGATRON_ANYTHING",
        )
    ],
    *[
        Refused(
            f"trainer {f}",
            _trainer(**{f: v}),
            "spec.template.spec.containers[0]",
            why,
        )
        for f, v, why in (
            ("command", ["bash"], "trainer.command"),
            ("args", ["--x"], "trainer.args"),
            ("image", "evil:1", "spec.image"),
            ("imagePullPolicy", "Always", "spec.imagePullPolicy"),
            ("securityContext", {"privileged": True}, "operator"),
            ("ports", [{"containerPort": 1}], "operator"),
            ("workingDir", "/tmp", "operator"),
        )
    ],
    Refused(
        "trainer GPU count",
        _trainer(resources={"limits": {"nvidia.com/gpu": "16"}}),
        "spec.template.spec.containers[0]",
        "procsPerNode",
    ),
    *[
        Refused(
            f"label {k}",
            {"metadata": {"labels": {k: "x"}}},
            "spec.template.metadata.labels",
            "operator",
        )
        for k in ("megatron.dev/job-name", "megatron.dev/node-rank", "kueue.x-k8s.io/queue-name")
    ],
    Refused(
        "annotation megatron.dev/layout",
        {"metadata": {"annotations": {"megatron.dev/layout": "TP1"}}},
        "spec.template.metadata.annotations",
        "operator",
    ),
    Refused(
        "trainer as an init container",
        {"spec": {"initContainers": [{"name": "trainer", "image": "x:1"}]}},
        "spec.template.spec.initContainers",
        "trainer",
    ),
    Refused(
        "sidecar without an image",
        {"spec": {"containers": [{"name": "helper"}]}},
        "spec.template.spec.containers[0]",
        "image",
    ),
    Refused(
        "env with a value and valueFrom",
        _trainer(
            env=[
                {
                    "name": "X",
                    "value": "1",
                    "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                }
            ]
        ),
        "spec.template.spec.containers[0].env[0]",
        "valueFrom",
    ),
]
